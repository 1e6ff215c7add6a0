"""The stream leader's consumer copies, which run ahead of the log (docs/cluster-design.md:
"The stream leader keeps an in-memory copy of each consumer that runs ahead of the log").

- A consumer decision whose caller is cancelled still reaches the log. Regression (chaos
  bridge nemesis, 5 nodes): a pull whose gRPC call was cancelled while its Deliver op was
  being proposed cancelled the host's proposal future, and the host skips a proposal whose
  future is done, so the op never reached the log while the leader copy had applied it.
  The copy later redelivered those messages; every replica took the redelivery for a new
  delivery behind its cursor and halted ("new delivery N is behind the cursor").
- A pull's deliveries leave before its Deliver op commits; when that op is lost, the
  rebuilt copy delivers the messages again and refuses an ack of the lost delivery.

A single in-process node (RaftHost over memory storage and transport, a real StreamGroup).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from raftstream.cluster.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.config import Limits
from raftstream.cluster.meta_entries import stream_group_id
from raftstream.cluster.metrics import NodeMetrics
from raftstream.cluster.services_consume import undelivered
from raftstream.cluster.stream_leader import GroupDeps, PullHandle, StreamGroup
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.engine.lmdbstore import open_node_env
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import NotLeaderError
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.storage import MemoryLogStorage
from raftstream.raft.transport import MemoryNetwork, MemoryTransport
from tests.raft.test_host import run, until

MSGS = 5


@contextlib.asynccontextmanager
async def single_node(tmp_path: Path) -> AsyncIterator[tuple[RaftHost, StreamGroup]]:
    """A running host leading stream Q (R1) with the explicit-ack pull consumer C, and
    ``MSGS`` messages published on ``q.v``."""
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
    ca = ConsumerAssignment(
        account="$G",
        stream="Q",
        config=ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT),
        created_ns=time.time_ns(),
    )

    async def no_delete(*_: Any) -> None:
        return None

    deps = GroupDeps(
        node_id="n1",
        host=host,
        env=env,
        limits=Limits(),
        metrics=NodeMetrics("n1"),
        proposal_timeout_ms=5_000,
        client_addr=lambda _: None,
        consumers_of=lambda *_: (ca,),
        stream_of=lambda *_: sa,
        delete_consumer=no_delete,
    )
    g = StreamGroup(deps, sa)
    host.start()
    try:
        await host.create_group(sa.group, voters=("n1",), state_machine=g.replica)
        await until(lambda: leading(g))
        for i in range(MSGS):
            await g.submit_plain("q.v", str(i).encode())
        yield host, g
    finally:
        await host.stop()  # first: nothing may apply to the store once it is closed
        await g.close(drop=True)
        env.close()


def leading(g: StreamGroup) -> bool:
    """Whether ``g`` leads with its consumer copies built (driving its barrier)."""
    g.check_leadership()
    g.reconcile()
    return g.ready and "C" in g.replica.consumers


async def delivered(handle: PullHandle) -> list[tuple[int, int]]:
    """(stream sequence, delivery count) of the deliveries queued on ``handle``."""
    return [
        (e.delivery.stream_seq, e.delivery.deliveries)
        for e in await handle.take()
        if e.delivery is not None
    ]


def test_a_cancelled_pull_still_replicates_what_the_leader_copy_decided(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (_, g):
            c = g.leader_consumer("C")
            pull = asyncio.create_task(g.open_pull("C", {"batch": MSGS, "no_wait": True}, 5.0))
            # Let the pull decide and propose, then cancel it before the host's next round
            # (a client that went away).
            while not c.state.pending:
                await asyncio.sleep(0)
            pull.cancel()
            await asyncio.gather(pull, return_exceptions=True)
            replica = g.replica.consumers["C"]
            # The Deliver op still commits and applies: the replica agrees with the copy.
            await until(lambda: replica.state.delivered_stream_seq == MSGS)
            assert sorted(replica.state.pending) == sorted(c.state.pending)
            assert g.ready

    run(scenario)


def test_a_lost_deliver_op_means_delivered_again_and_a_late_ack_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with single_node(tmp_path) as (host, g):
            held: list[asyncio.Future[Any]] = []
            real = host.propose

            def hold(group: str, data: bytes, *, timeout_ms: int | None = None) -> Any:
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                held.append(fut)
                return fut

            host.propose = hold  # type: ignore[method-assign]
            c = g.leader_consumer("C")
            handle = await g.open_pull("C", {"batch": MSGS, "no_wait": True}, 5.0)
            # Delivered while the Deliver op is still uncommitted.
            assert await delivered(handle) == [(s, 1) for s in range(1, MSGS + 1)]
            assert len(held) == 1 and not held[0].done()
            handle.close()
            host.propose = real  # type: ignore[method-assign]
            held[0].set_exception(NotLeaderError("lost with a leader change"))
            # The copies are dropped and rebuilt from the replica, which never saw the op.
            await until(lambda: leading(g) and g.leader_consumer("C") is not c)
            again = g.leader_consumer("C")
            assert again.state.delivered_stream_seq == 0
            assert undelivered(again, 1) is not None  # the client's late ack is refused
            handle = await g.open_pull("C", {"batch": MSGS, "no_wait": True}, 5.0)
            assert await delivered(handle) == [(s, 1) for s in range(1, MSGS + 1)]
            handle.close()
            assert undelivered(again, 1) is None

    run(scenario)
