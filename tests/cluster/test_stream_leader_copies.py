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
- A push call's steps leave the same way, at most ``PUSH_STEPS_UNCOMMITTED_MAX`` of them
  uncommitted; when one's op is lost, the call ends (409) and the rebuilt copy starts over.

A single in-process node (RaftHost over memory storage and transport, a real StreamGroup).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raftstream.cluster.common.clock import SYSTEM_CLOCK
from raftstream.cluster.config import Limits
from raftstream.cluster.services import push as services_push
from raftstream.cluster.services.consume import ConsumeServicer, fire_and_forget, undelivered
from raftstream.cluster.services.push import PUSH_STEPS_UNCOMMITTED_MAX, PushSession
from raftstream.cluster.stream.group import PullHandle, StreamGroup
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.errors import NotLeaderError, UnavailableError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.host import RaftHost
from tests.support.polling import until
from tests.support.raft_hosts import run

from .one_node import one_node

MSGS = 5


@contextlib.asynccontextmanager
async def single_node(tmp_path: Path) -> AsyncIterator[tuple[RaftHost, StreamGroup]]:
    """A running host leading stream Q (R1) with the explicit-ack pull consumer C and the
    AckNone push consumer P, and ``MSGS`` messages published on ``q.v``."""
    pull = ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT)
    push = ConsumerConfig(durable_name="P", deliver_subject="d.p", ack_policy=AckPolicy.NONE)
    async with one_node(tmp_path, pull, push) as node:
        for i in range(MSGS):
            await node.g.submit_plain("q.v", str(i).encode())
        yield node.host, node.g


def leading(g: StreamGroup) -> bool:
    """Whether ``g`` leads with its consumer copies built (driving its barrier)."""
    g.check_leadership()
    g.reconcile()
    return g.ready and {"C", "P"} <= g.replica.consumers.keys()


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
            real = host.propose
            held = held_proposals(host)
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


def test_fire_and_forget_acks_are_proposed_lazily_and_sync_ones_at_once(tmp_path: Path) -> None:
    """docs/cluster-design.md, "Acks go with the next entry": an ``AckStream`` batch of
    fire-and-forget +ACKs is one lazy proposal (it waits for the next round, at most
    ``lazy_linger_ms``), a batch holding an ``ack_sync`` an eager one; both commit."""

    async def scenario() -> None:
        async with single_node(tmp_path) as (host, g):
            real = host.propose
            lazies: list[bool] = []

            def noting(
                group: str, data: bytes, *, timeout_ms: int | None = None, lazy: bool = False
            ) -> Any:
                lazies.append(lazy)
                return real(group, data, timeout_ms=timeout_ms, lazy=lazy)

            handle = await g.open_pull("C", {"batch": MSGS, "no_wait": True}, 5.0)
            assert len(await delivered(handle)) == MSGS
            handle.close()
            host.propose = noting  # type: ignore[method-assign]
            servicer = ConsumeServicer(SimpleNamespace())  # type: ignore[arg-type]
            replica = g.replica.consumers["C"]
            for seqs, sync in (([1, 2], False), ([3, 4], True)):
                items = [pb.AckItem(kind=pb.ACK_KIND_ACK, sync=sync) for _ in seqs]
                lazy = fire_and_forget(items)
                assert await servicer._ack_many(g, "C", items, seqs, 5.0, lazy=lazy) == []
                assert lazies[-1] is not sync
                assert not {*seqs} & replica.state.pending.keys()  # committed, applied
            host.propose = real  # type: ignore[method-assign]

    run(scenario)


def held_proposals(host: RaftHost) -> list[asyncio.Future[Any]]:
    """Make ``host.propose`` hold every proposal: the futures, never in the log, are the
    test's to settle."""
    held: list[asyncio.Future[Any]] = []

    def hold(group: str, data: bytes, *, timeout_ms: int | None = None, lazy: bool = False) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        held.append(fut)
        return fut

    host.propose = hold  # type: ignore[method-assign]
    return held


def sent_seqs(session: PushSession) -> list[list[int]]:
    """The stream sequences of each response the session queued, taking them."""
    out = []
    while not session._out.empty():
        out.append([m.seq for m in session._out.get_nowait().messages])
    return out


def test_push_steps_leave_before_their_deliver_ops_commit_two_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps of 2 deliveries (5 messages): the first two are sent while their ops are
    uncommitted, the third waits for the first's commit; a lost op ends the call with a
    409 and the rebuilt copy has delivered nothing."""
    monkeypatch.setattr(services_push, "PUSH_STEP_MSGS_MAX", 2)

    async def scenario() -> None:
        async with single_node(tmp_path) as (host, g):
            real = host.propose
            held = held_proposals(host)
            c = g.leader_consumer("P")
            ctx: Any = SimpleNamespace(config=SimpleNamespace(limits=Limits()), clock=SYSTEM_CLOCK)
            session = PushSession(ctx, lambda *_: asyncio.sleep(0))
            waker = g.push_waker("P")
            driver = asyncio.ensure_future(session._drive(g, c, waker, 5.0))
            try:
                await until(lambda: len(held) == 2)
                for _ in range(20):  # room for a third step, were it allowed
                    await asyncio.sleep(0)
                assert len(held) == PUSH_STEPS_UNCOMMITTED_MAX == 2
                assert sent_seqs(session) == [[1, 2], [3, 4]]
                held[0].set_result([])
                await until(lambda: len(held) == 3)
                assert sent_seqs(session) == [[5]]
                host.propose = real  # type: ignore[method-assign]
                held[1].set_exception(NotLeaderError("lost with a leader change"))
                end = await asyncio.wait_for(session._out.get(), 5.0)
                assert end.status.code == 409
                assert end.status.description.startswith("Leadership Change")
                await until(lambda: leading(g) and g.leader_consumer("P") is not c)
                assert g.leader_consumer("P").state.delivered_stream_seq == 0
            finally:
                driver.cancel()
                await asyncio.gather(driver, return_exceptions=True)
                g.drop_push_waker("P", waker)

    run(scenario)


def test_a_dropped_copy_decides_nothing_while_the_new_one_is_being_built(
    tmp_path: Path,
) -> None:
    """Regression (the soak, ``make soak``: every replica halted on "new delivery N is
    behind the cursor" after 28 minutes). A push call holds its leader copy across awaits.
    After a failed proposal dropped the copies, and before the new barrier applied, the
    stale copy still counted as current (no copies at all then), so its next step decided
    and proposed deliveries after the new barrier; the copy built at that barrier never
    saw them, delivered the same messages again, and applying that halted the group."""

    async def scenario() -> None:
        async with single_node(tmp_path) as (host, g):
            real = host.propose
            held = held_proposals(host)
            stale = g.leader_consumer("P")
            pull = await g.open_pull("C", {"batch": 1, "no_wait": True}, 5.0)
            pull.close()
            host.propose = real  # type: ignore[method-assign]
            held[0].set_exception(NotLeaderError("lost with a leader change"))
            await until(lambda: not g.ready)  # the copies are dropped
            g.check_leadership()  # the new barrier is proposed; it has not applied yet
            with pytest.raises(UnavailableError):
                await g.push_step(stale, 2, 5.0)
            await until(lambda: leading(g))
            fresh = g.leader_consumer("P")
            replica = g.replica.consumers["P"]
            assert fresh is not stale
            assert replica.state.delivered_stream_seq == fresh.state.delivered_stream_seq == 0
            step, commit = await g.push_step(fresh, 2, 5.0)
            assert [d.stream_seq for d in step.deliveries] == [1, 2]
            assert commit is not None
            await commit
            assert replica.state.delivered_stream_seq == 2
            assert not host.status(g.group).halted

    run(scenario)


def test_a_barrier_that_commits_after_its_proposal_failed_builds_the_copies_once(
    tmp_path: Path,
) -> None:
    """Regression (the soak: two barriers of one term in the log, a push step's deliveries
    between them, then every replica halted on "new delivery N is behind the cursor"). A
    barrier whose proposal failed ambiguously (a timeout) still committed and built the
    copies; the leader, counting it failed, proposed another, and that one built them again
    from a replica that had not applied the ops the first copies had proposed meanwhile."""

    async def scenario() -> None:
        async with single_node(tmp_path) as (host, g):
            real = host.propose
            held = held_proposals(host)
            pull = await g.open_pull("C", {"batch": 1, "no_wait": True}, 5.0)
            pull.close()

            def timed_out(
                group: str, data: bytes, *, timeout_ms: int | None = None, lazy: bool = False
            ) -> Any:
                real(group, data, timeout_ms=timeout_ms, lazy=lazy)  # in the log all the same
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                fut.set_exception(UnavailableError("not committed in time"))
                return fut

            host.propose = timed_out  # type: ignore[method-assign]
            held[0].set_exception(NotLeaderError("lost with a leader change"))
            await until(lambda: not g.ready)  # the copies are dropped
            g.check_leadership()  # a barrier, in the log, its proposal "failed"
            host.propose = real  # type: ignore[method-assign]
            await until(lambda: g.ready)  # built when it applied
            c = g.leader_consumer("P")
            for _ in range(3):  # what the node's monitor does every tick
                g.check_leadership()
                await asyncio.sleep(0.01)
            step, commit = await g.push_step(c, 2, 5.0)
            assert [d.stream_seq for d in step.deliveries] == [1, 2]
            assert commit is not None
            await commit
            for _ in range(3):
                g.check_leadership()
                await asyncio.sleep(0.01)
            assert g.leader_consumer("P") is c  # not built a second time
            step, commit = await g.push_step(c, 2, 5.0)
            assert [d.stream_seq for d in step.deliveries] == [3, 4]
            assert commit is not None
            await commit
            assert g.replica.consumers["P"].state.delivered_stream_seq == 4
            assert not host.status(g.group).halted

    run(scenario)
