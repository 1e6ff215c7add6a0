"""In-process nodes for stream-leader tests: RaftHosts over memory storage and transport
hosting stream Q, each with a real StreamGroup and a real LMDB store.

``one_node(tmp_path, *configs)`` yields a ``Node`` once the group (R1) leads with the
consumer copies of ``configs`` built; ``Node.consumers`` is the meta state's consumer list
(editable) and ``Node.deleted`` the consumers the group asked the meta leader to delete.

``stream_nodes(tmp_path, names, *configs)`` does the same for an R``len(names)`` group on
that many nodes of one ``MemoryNetwork`` (``Node.net``: cut a node off with ``set_down``),
yielding the nodes by name once one leads; a monitor calls every group's
``check_leadership`` each tick, as the node's monitor does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from raftstream.cluster.common.clock import SYSTEM_CLOCK
from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.common.raft_errors import app_error
from raftstream.cluster.config import Limits
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.stream.deps import GroupDeps
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.lmdbstore import open_node_env
from raftstream.engine.stream_config import StreamConfig
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.lanes import InlineLane
from raftstream.raft.storage import MemoryLogStorage
from raftstream.raft.transport import MemoryNetwork, MemoryTransport
from tests.support.polling import until
from tests.support.simloop import LoopNodeClock

__all__ = ["GROUP", "Node", "assignment", "leader_of", "one_node", "stream_nodes"]

GROUP = stream_group_id("$G", "Q")
# Several nodes in one loaded process: elections slow enough not to start spuriously.
MULTI_HOST_CONFIG = HostConfig(tick_ms=10, election_tick=30)


class Node:
    """The host, its group of stream Q, the meta state's consumers and the deletions asked."""

    def __init__(
        self,
        host: RaftHost,
        group: StreamGroup,
        consumers: list[ConsumerAssignment],
        net: MemoryNetwork | None = None,
    ):
        self.host = host
        self.g = group
        self.consumers = consumers
        self.net = net
        self.deleted: list[str] = []

    @property
    def name(self) -> str:
        return self.host.node_id

    def leading(self) -> bool:
        """Whether the group leads with every consumer copy built (driving its barrier)."""
        self.g.check_leadership()
        self.g.reconcile()
        names = {ca.name for ca in self.consumers}
        return self.g.ready and names <= self.g.replica.consumers.keys()


class _Meta:
    """The meta state of these tests (``MetaView``, cluster/stream/deps.py): stream Q, the
    node's editable consumer list, and the deletions the group asks recorded on the node."""

    def __init__(self, sa: StreamAssignment, consumers: list[ConsumerAssignment]) -> None:
        self.sa = sa
        self.consumers = consumers
        self.node: Node | None = None  # set once the node is made

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        return tuple(self.consumers)

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        return self.sa

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        if self.node is not None:
            self.node.deleted.append(name)


def assignment(config: ConsumerConfig) -> ConsumerAssignment:
    return ConsumerAssignment(account="$G", stream="Q", config=config, created_ns=time.time_ns())


def leader_of(nodes: dict[str, Node]) -> Node | None:
    """The one node leading with its copies built, if exactly one does."""
    leading = [n for n in nodes.values() if n.leading()]
    return leading[0] if len(leading) == 1 else None


@contextlib.asynccontextmanager
async def one_node(
    tmp_path: Path, *configs: ConsumerConfig, simulated: bool = False
) -> AsyncIterator[Node]:
    """One node leading stream Q. ``simulated``: for a scenario run on simulated time
    (``tests.support.raft_hosts.run_simulated``): the host writes on the loop and the group
    reads the loop's clock, so waiting out a consumer's inactivity takes no real time."""
    hc = HostConfig(tick_ms=10)
    async with _nodes(tmp_path, ("n1",), configs, hc, simulated=simulated) as nodes:
        node = nodes["n1"]
        await until(node.leading)
        yield node


@contextlib.asynccontextmanager
async def stream_nodes(
    tmp_path: Path, names: Sequence[str], *configs: ConsumerConfig
) -> AsyncIterator[dict[str, Node]]:
    async with _nodes(tmp_path, names, configs, MULTI_HOST_CONFIG) as nodes:

        async def monitor() -> None:
            while True:
                for n in nodes.values():
                    n.g.check_leadership()
                await asyncio.sleep(MULTI_HOST_CONFIG.tick_ms / 1000)

        task = asyncio.get_running_loop().create_task(monitor())
        try:
            await until(lambda: leader_of(nodes) is not None)
            yield nodes
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def _nodes(
    tmp_path: Path,
    names: Sequence[str],
    configs: Sequence[ConsumerConfig],
    hc: HostConfig,
    *,
    simulated: bool = False,
) -> AsyncIterator[dict[str, Node]]:
    net = MemoryNetwork()
    cfg = StreamConfig(name="Q", subjects=("q.>",), num_replicas=len(names))
    sa = StreamAssignment(
        account="$G", config=cfg, peers=tuple(names), group=GROUP, created_ns=time.time_ns()
    )
    consumers = [assignment(c) for c in configs]
    nodes: dict[str, Node] = {}
    envs = []
    for name in names:
        transport = MemoryTransport(name, net)
        host = RaftHost(
            name,
            storage=MemoryLogStorage(),
            transport=transport,
            config=hc,
            map_error=app_error,
            lane=InlineLane() if simulated else None,
        )
        env = open_node_env(tmp_path / name / "store", sync=False)
        envs.append(env)

        meta = _Meta(sa, consumers)
        deps = GroupDeps(
            node_id=name,
            host=host,
            env=env,
            limits=Limits(),
            metrics=NodeMetrics(name),
            proposal_timeout_ms=5_000,
            meta=meta,
            clock=LoopNodeClock() if simulated else SYSTEM_CLOCK,
        )
        nodes[name] = meta.node = Node(host, StreamGroup(deps, sa), consumers, net)
    for n in nodes.values():
        n.host.start()
    try:
        for n in nodes.values():
            await n.host.create_group(GROUP, voters=tuple(names), state_machine=n.g.replica)
        yield nodes
    finally:
        for n in nodes.values():
            await n.host.stop()  # first: nothing may apply to the store once it is closed
        for n in nodes.values():
            await n.g.close(drop=True)
        for env in envs:
            env.close()
