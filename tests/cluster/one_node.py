"""One in-process node for stream-leader tests: a RaftHost over memory storage and
transport leading stream Q (R1), with a real StreamGroup and a real LMDB store.

``one_node(tmp_path, *configs)`` yields a ``Node`` once the group leads with the consumer
copies of ``configs`` built; ``Node.consumers`` is the meta state's consumer list (editable)
and ``Node.deleted`` the consumers the group asked the meta leader to delete."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from raftstream.cluster.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.config import Limits
from raftstream.cluster.meta_entries import stream_group_id
from raftstream.cluster.metrics import NodeMetrics
from raftstream.cluster.stream_leader import GroupDeps, StreamGroup
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.lmdbstore import open_node_env
from raftstream.engine.stream_config import StreamConfig
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.storage import MemoryLogStorage
from raftstream.raft.transport import MemoryNetwork, MemoryTransport
from tests.raft.test_host import until

__all__ = ["Node", "assignment", "one_node"]


class Node:
    """The host, its group of stream Q, the meta state's consumers and the deletions asked."""

    def __init__(self, host: RaftHost, group: StreamGroup, consumers: list[ConsumerAssignment]):
        self.host = host
        self.g = group
        self.consumers = consumers
        self.deleted: list[str] = []

    def leading(self) -> bool:
        """Whether the group leads with every consumer copy built (driving its barrier)."""
        self.g.check_leadership()
        self.g.reconcile()
        names = {ca.name for ca in self.consumers}
        return self.g.ready and names <= self.g.replica.consumers.keys()


def assignment(config: ConsumerConfig) -> ConsumerAssignment:
    return ConsumerAssignment(account="$G", stream="Q", config=config, created_ns=time.time_ns())


@contextlib.asynccontextmanager
async def one_node(tmp_path: Path, *configs: ConsumerConfig) -> AsyncIterator[Node]:
    host = RaftHost(
        "n1",
        storage=MemoryLogStorage(),
        transport=MemoryTransport("n1", MemoryNetwork()),
        config=HostConfig(tick_ms=10),
    )
    env = open_node_env(tmp_path / "store", sync=False)
    cfg = StreamConfig(name="Q", subjects=("q.>",), num_replicas=1)
    sa = StreamAssignment(
        account="$G",
        config=cfg,
        peers=("n1",),
        group=stream_group_id("$G", "Q"),
        created_ns=time.time_ns(),
    )
    consumers = [assignment(c) for c in configs]
    node: Node | None = None

    async def delete(account: str, stream: str, name: str) -> None:
        assert node is not None
        node.deleted.append(name)

    deps = GroupDeps(
        node_id="n1",
        host=host,
        env=env,
        limits=Limits(),
        metrics=NodeMetrics("n1"),
        proposal_timeout_ms=5_000,
        client_addr=lambda _: None,
        consumers_of=lambda *_: tuple(consumers),
        stream_of=lambda *_: sa,
        delete_consumer=delete,
    )
    g = StreamGroup(deps, sa)
    node = Node(host, g, consumers)
    host.start()
    try:
        await host.create_group(sa.group, voters=("n1",), state_machine=g.replica)
        await until(node.leading)
        yield node
    finally:
        await host.stop()  # first: nothing may apply to the store once it is closed
        await g.close(drop=True)
        env.close()
