"""A node's way into its meta group: started from its own data, or after a repair or join.

A node whose Raft data is healthy starts the meta group at once (``start_meta``). One under
repair or joining (``cluster/repair/repair.py``) is out of the meta group's membership: it starts
the group empty at the term the meta leader names (``rejoin_meta``), runs no stream group
it is still a member of, and answers no client (``refusing``: nor while it checks whether
it lost its data, ``cluster/repair/known_peers.py``) until the meta leader closes the repair
(``done``). Owned by the node's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.group import META_GROUP, MetaGroup
from raftstream.cluster.node.peers import NodePeers
from raftstream.cluster.node.server import NodeServer
from raftstream.cluster.node.storage import NodeStorage
from raftstream.cluster.repair.repair import finish
from raftstream.cluster.services.node_book import NodeBook
from raftstream.proto import repair_pb2 as rpb
from raftstream.raft.host import RaftHost

__all__ = ["REPAIR_APPLY_POLL_S", "NodeRepair"]

log = logging.getLogger(__name__)

REPAIR_APPLY_POLL_S = 0.05  # how often a repaired node looks whether it applied RepairDone


class NodeRepair:
    """The meta group's start and this node's own repair (module docstring). ``repair_id``:
    the repair the node started under (``cluster/repair/repair.py``'s ``prepare``), None: none."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        repair_id: str | None,
        host: RaftHost,
        meta: MetaGroup,
        nodes: NodeBook,
        storage: NodeStorage,
        peers: NodePeers,
        server: NodeServer,
    ) -> None:
        self._config = config
        self.repair_id = repair_id
        self._host = host
        self._meta = meta
        self._nodes = nodes
        self._storage = storage
        self._peers = peers
        self._server = server
        self.checking = False  # started without Raft data, asking its peers (known_peers)
        self.meta_started = False

    def refusing(self) -> bool:
        """Whether client calls are refused: under repair, or checking whether this node
        lost its data (``RepairGate``)."""
        return self.repair_id is not None or self.checking

    def outsider(self, asker: str) -> bool:
        """Whether ``asker`` did not found the cluster this node runs (False before this
        node started the meta group: it knows no founders then)."""
        founders = self._nodes.known_founders
        return self.meta_started and founders is not None and asker not in founders

    def meta_leader(self) -> str | None:
        """The meta leader this node knows (None before it started the meta group)."""
        return self._meta.leader if self.meta_started else None

    def start_meta(self) -> None:
        replay_to = self._storage.log.log(META_GROUP).hard_state().commit
        # From the founding membership, the same on every replica (cluster/services/node_book.py).
        self._meta.start(self._nodes.founders(), self._config.meta_voters_max, replay_to)
        self.meta_started = True

    async def rejoin_meta(self, resp: rpb.RepairNodeResponse) -> None:
        """Under repair or joining, out of the meta group's membership: record the founders
        and the nodes the meta leader named, then start the group empty at its term (no
        older leader's message is then accepted), to be added as a learner."""
        if resp.meta_founders:  # (an older meta leader names none: the configured peers)
            await asyncio.to_thread(self._nodes.record, resp.meta_founders, dict(resp.addresses))
            state = self._meta.state
            self._peers.learn_nodes(state.added_nodes, state.forgotten_nodes)
        await self._host.raise_term(META_GROUP, int(resp.meta_term))
        self.start_meta()

    async def done(self) -> None:
        """The meta leader closed the repair: once this replica has applied that too, the
        groups it replayed while under repair are joined, never created, from now on."""
        me, repair_id = self._config.name, self.repair_id
        while True:
            rec = self._meta.state.repairs.get(me)
            if rec is not None and rec.repair_id == repair_id and rec.done:
                break
            await asyncio.sleep(REPAIR_APPLY_POLL_S)
        self._meta.fresh_groups.clear()
        self.repair_id = None
        finish(Path(self._config.data))
        await self._server.set_health("", True)
        log.info("repaired: serving again")
