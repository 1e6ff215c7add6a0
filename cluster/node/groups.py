"""The stream groups a node runs: started, joined and dropped as the meta state assigns them.

``NodeGroups.reconcile`` (called by the meta group's reconciler, ``cluster/meta/group.py``)
starts the stream groups the meta state assigns here, stops the others once they left the
group's Raft membership, and lets leaders sequence consumer and config changes. A group
that fails to start is tried again every ``GROUP_START_RETRY_S`` while the others run. A
replica this node no longer hosts lingers until it is out of the membership.

``NodeGroups`` is also the stream groups' ``MetaView`` (``cluster/stream/deps.py``): the
meta state's streams and consumers, and the consumer deletions asked of the meta leader.
Owned by the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.group import META_GROUP, MetaGroup
from raftstream.cluster.node.peers import NodePeers
from raftstream.cluster.node.repair import NodeRepair
from raftstream.cluster.node.storage import NodeStorage
from raftstream.cluster.security.auth import acting_as, node_caller
from raftstream.cluster.services.context import ServiceContext
from raftstream.cluster.stream.deps import GroupDeps
from raftstream.cluster.stream.group import StreamGroup
from raftstream.cluster.stream.membership import MembershipDriver
from raftstream.errors import DataLossError, RaftStreamError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.host import RaftHost
from raftstream.raft.transport.tls import PeerTls

__all__ = ["GROUP_START_RETRY_S", "HAND_OVER_WAIT_S", "LINGER_NO_LEADER_S", "NodeGroups"]

log = logging.getLogger(__name__)

# A replica this node no longer hosts (per the meta state) is dropped once it has applied
# its own removal, or once it has known no leader for this long (the leader stops talking
# to a removed member, which may never learn the removal committed).
LINGER_NO_LEADER_S = 5.0
GROUP_START_RETRY_S = 1.0  # a stream group that failed to start is tried again this often
HAND_OVER_WAIT_S = 2.0  # a planned stop waits this long at most for its leaderships to move


class NodeGroups:
    """The node's stream groups (module docstring). ``groups`` is the node's map of them by
    group id, shared with the servicers (``ServiceContext.groups``); only this part changes
    it. ``repair`` says whether the node runs under a repair (its groups wait)."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        host: RaftHost,
        meta: MetaGroup,
        metrics: NodeMetrics,
        groups: dict[str, StreamGroup],
        ctx: ServiceContext,
        membership: MembershipDriver,
        repair: NodeRepair,
        storage: NodeStorage,
        peers: NodePeers,
        tls: PeerTls | None,
    ) -> None:
        self._config = config
        self._host = host
        self._meta = meta
        self._metrics = metrics
        self.groups = groups
        self._ctx = ctx
        self._membership = membership
        self._repair = repair
        self._peers = peers
        self._lock = asyncio.Lock()
        self._lingering: dict[str, float | None] = {}  # group -> since when leaderless
        self._start_errors: dict[str, str] = {}  # group -> the error its start last raised
        self._deps = GroupDeps(
            node_id=config.name,
            host=host,
            env=storage.env,
            limits=config.limits,
            metrics=metrics,
            proposal_timeout_ms=config.raft.proposal_timeout_ms,
            meta=self,
            links=peers,
            client_tls=tls,
            rooms=storage,
            features=peers,
        )

    # -- MetaView (cluster/stream/deps.py) ---------------------------------------------------

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        return self._meta.consumers_of(account, stream)

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        return self._meta.stream_of(account, stream)

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        """Through the meta leader, as a client of ``account`` would: the node acts for the
        account with its node token when ``[auth]`` is configured (cluster/security/auth.py)."""
        req = pb.DeleteConsumerRequest(stream=stream, consumer=name)
        with acting_as(node_caller(self._config.auth, account)):
            await self._ctx.to_meta_leader(
                "/raftstream.v1.ConsumerService/DeleteConsumer",
                req,
                pb.DeleteConsumerResponse.FromString,
                self._config.limits.request_timeout_ms / 1000,
            )

    # -- the node's monitor -----------------------------------------------------------------

    def check_leadership(self, *, observe: bool) -> None:
        """Each tick: every group looks whether its leadership changed, and a group this
        node leads moves its membership toward the meta state's peers
        (``cluster/stream/membership.py``); a removed replica waiting to be dropped pokes the
        reconciler."""
        for g in list(self.groups.values()):
            try:
                g.check_leadership(observe=observe)
                sa = self.stream_of(g.account, g.name)
                if sa is not None and sa.group == g.group:
                    self._membership.step(sa)
            except RaftStreamError as exc:
                log.warning("leadership check failed: %r", exc, extra={"group": g.group})
        if self._lingering:
            self._meta.poke()  # a removed replica waits to be dropped

    # -- reconcile --------------------------------------------------------------------------

    async def reconcile(self, wanted_streams: tuple[StreamAssignment, ...]) -> None:
        """Start the stream groups assigned here, stop the others once they left the
        group's Raft membership, let leaders sequence consumer and config changes (called
        by the meta group's reconciler)."""
        async with self._lock:
            wanted = {sa.group: sa for sa in wanted_streams}
            existing = {sa.group for sa in self._meta.state.all_streams()}
            for group in [g for g in self.groups if g not in wanted]:
                if self._may_drop(group, group in existing):
                    await self._drop_group(group)
            failed = False
            for group, sa in wanted.items():
                self._lingering.pop(group, None)
                if group not in self.groups:
                    try:
                        await self.start_group(sa)
                    except Exception as exc:  # one bad assignment: the others still start
                        self._start_failed(group, exc)
                        failed = True
                    else:
                        self._start_errors.pop(group, None)
            for g in self.groups.values():
                g.reconcile()
            if failed:
                asyncio.get_running_loop().call_later(GROUP_START_RETRY_S, self._meta.poke)

    def _start_failed(self, group: str, exc: Exception) -> None:
        """A stream group that could not start here: said once per distinct error (a bug,
        or data this version cannot read: an ERROR with its traceback), and tried again
        every ``GROUP_START_RETRY_S`` while every other group runs."""
        said = repr(exc)
        if self._start_errors.get(group) == said:
            return
        self._start_errors[group] = said
        if isinstance(exc, DataLossError):
            log.error("stream group cannot start here: %s", exc, extra={"group": group})
        elif isinstance(exc, RaftStreamError):
            log.warning("stream group cannot start yet: %s", exc, extra={"group": group})
        else:
            log.error(
                "stream group cannot start here: %s", said, exc_info=exc, extra={"group": group}
            )

    async def start_group(self, sa: StreamAssignment) -> None:
        """Create the group as one of its initial members (a stream just added here), or
        join it empty (added later, or unknown: a joiner never campaigns and learns the
        membership from the leader's snapshot; see ``RaftHost.create_group``)."""
        group = sa.group
        repair_id = self._repair.repair_id
        rec = self._meta.state.repairs.get(self._config.name)
        rejoin_term = rec.may_rejoin(group) if rec is not None else None
        if repair_id is not None and (
            rec is None or rec.repair_id != repair_id or rejoin_term is None
        ):
            return  # under repair and still a member there: it must not run the group yet
        if rejoin_term is not None:
            # Rejoining after data loss: never at a term older than the group's leader that
            # dropped this node from the membership (cluster/repair/repair.py).
            await self._host.raise_term(group, rejoin_term)
        g = StreamGroup(self._deps, sa)
        g.replica.starting = True
        try:
            if group in self._meta.fresh_groups and repair_id is None:
                await self._host.create_group(group, voters=sa.peers, state_machine=g.replica)
            else:
                self._host.join_group(group, state_machine=g.replica)
        finally:
            g.replica.starting = False
        self.groups[group] = g
        log.info("stream group started", extra={"group": group})

    def _may_drop(self, group: str, stream_exists: bool) -> bool:
        """A replica the meta state no longer places here: drop it at once when the stream
        is gone, else only once the group's membership no longer names this node, or it
        has had no leader for ``LINGER_NO_LEADER_S`` (it was removed; a voter that left
        early could cost the group its quorum before the leader removed it)."""
        if not stream_exists:
            return True
        host, me = self._host, self._config.name
        if me not in (*host.voters(group), *host.learners(group)):
            return True
        now = self._ctx.clock.monotonic()
        if host.leader(group) is not None:
            self._lingering[group] = None
            return False
        since = self._lingering.get(group) or now
        self._lingering[group] = since
        return now - since >= LINGER_NO_LEADER_S

    async def _drop_group(self, group: str) -> None:
        g = self.groups.pop(group)
        self._lingering.pop(group, None)
        # Out of the host first: nothing may apply to the store once it is dropped.
        await self._host.remove_group(group)
        await g.close(drop=True)
        self._metrics.forget_group(group)
        log.info("stream group removed", extra={"group": group})

    async def hand_over(self, *, meta_too: bool) -> None:
        """Before a planned stop, move every leadership held here to a live voter, the one
        furthest along, as NATS's lame-duck mode and etcd do: clients then follow a
        redirect instead of waiting out an election timeout. Bounded by
        ``HAND_OVER_WAIT_S``: what has not moved by then is left to an election. ``meta_too``:
        the meta group's leadership too (when this node runs the meta group)."""
        me, host = self._config.name, self._host
        held = [g.group for g in self.groups.values() if host.leader(g.group) == me]
        if meta_too and host.leader(META_GROUP) == me:
            held.append(META_GROUP)
        asked = []
        for group in held:
            with contextlib.suppress(RaftStreamError):  # removed, or no longer led here
                lags = host.peer_lags(group)
                live = [p for p in host.voters(group) if p in lags and not self._peers.down(p)]
                if live:
                    host.transfer_leadership(group, min(live, key=lambda p: lags[p]))
                    asked.append(group)
        if not asked:
            return
        log.info("stopping: handing %d leaderships over to peers", len(asked))
        loop = asyncio.get_running_loop()
        start = loop.time()

        def still_held() -> list[str]:
            out = []
            for group in asked:
                with contextlib.suppress(RaftStreamError):
                    if host.leader(group) == me:
                        out.append(group)
            return out

        left = still_held()
        while left and loop.time() - start < HAND_OVER_WAIT_S:
            await asyncio.sleep(0.02)
            left = still_held()
        log.info(
            "handed %d of %d leaderships over in %.2f s%s",
            len(asked) - len(left),
            len(asked),
            loop.time() - start,
            f" (left to an election: {', '.join(left)})" if left else "",
        )

    async def close(self) -> None:
        """Close every group's store, keeping its data (the host stopped first: until then
        it may apply a commit to a group, whose store must not be closed under it)."""
        # Together: each waits up to LINK_CLOSE_WAIT_S for its mirror links to end (an origin
        # in this cluster stops too, and answers nothing), so the waits overlap.
        await asyncio.gather(*(g.close(drop=False) for g in list(self.groups.values())))
