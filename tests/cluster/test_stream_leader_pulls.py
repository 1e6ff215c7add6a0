"""The stream leader's pull requests and consumer reaping, on one in-process node.

- A pull whose call ended unfinished (the client cancelled, went away, or its deadline cut
  the call) leaves the consumer at once, as JetStream drops a request whose requester is
  gone: it holds no ``max_waiting`` place and takes no message. Dropping it proposes
  nothing (waiting requests are leader-local).
- ``inactive_threshold`` on a durable consumer is applied (JetStream 2.9+): idle that long,
  it is deleted through the meta leader; a durable without one is kept.
- A filter edit recounts num_pending at once, on the leader copy and on the replica.

A single in-process node (``tests/cluster/one_node.py``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from raftstream.cluster.stream.group import PullHandle, StreamGroup
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.errors import NoLeaderError, NotLeaderError
from tests.support.polling import until
from tests.support.raft_hosts import run, run_simulated

from .one_node import assignment, one_node

WAIT_NS = 60 * NS_PER_S  # a pull's expiry: far beyond the test, so only a cancel ends it


async def taken(handle: PullHandle, n: int) -> list[int]:
    """The stream sequences of the next ``n`` deliveries on ``handle``."""
    out: list[int] = []
    while len(out) < n:
        out.extend(e.delivery.stream_seq for e in await handle.take() if e.delivery)
    return out


def test_abandoned_pulls_leave_max_waiting_and_take_no_messages(tmp_path: Path) -> None:
    """Two pulls fill max_waiting=2 and their calls end (the Fetch handler closes the
    handle when its call is cancelled): they leave the consumer at once, proposing
    nothing, and a live pull then gets the three messages published next."""

    async def scenario() -> None:
        cfg = ConsumerConfig(durable_name="C", max_waiting=2)
        async with one_node(tmp_path, cfg) as node:
            g = node.g
            c = g.leader_consumer("C")
            dead = [await g.open_pull("C", {"batch": 100, "expires": WAIT_NS}, 30.0)]
            dead.append(await g.open_pull("C", {"batch": 100, "expires": WAIT_NS}, 30.0))
            assert c.num_waiting == 2
            for h in dead:
                h.close()
            assert c.num_waiting == 0 and c.take_ops() == []
            live = await g.open_pull("C", {"batch": 3, "expires": WAIT_NS}, 30.0)
            for i in range(3):
                await g.submit_plain("q.v", str(i).encode())
            assert await taken(live, 3) == [1, 2, 3]
            live.close()
            await until(lambda: g.replica.consumers["C"].state.delivered_stream_seq == 3)

    run(scenario)


def test_a_pull_closed_after_its_deliveries_leaves_them_pending(tmp_path: Path) -> None:
    """The race: a pull was handed messages (their Deliver op proposed) as its client
    left. Closing it drops the request, not the deliveries: the replica applies them, they
    stay pending and go to the next pull after ack_wait."""

    async def scenario() -> None:
        cfg = ConsumerConfig(durable_name="C", ack_wait=NS_PER_S // 5)
        async with one_node(tmp_path, cfg) as node:
            g = node.g
            for i in range(2):
                await g.submit_plain("q.v", str(i).encode())
            gone = await g.open_pull("C", {"batch": 10, "expires": WAIT_NS}, 30.0)
            gone.close()  # before the client read anything
            c = g.leader_consumer("C")
            assert c.num_waiting == 0 and sorted(c.state.pending) == [1, 2]
            replica = g.replica.consumers["C"]
            await until(lambda: replica.state.delivered_stream_seq == 2)
            assert sorted(replica.state.pending) == [1, 2]
            again = await g.open_pull("C", {"batch": 2, "expires": WAIT_NS}, 30.0)
            assert await taken(again, 2) == [1, 2]
            again.close()
            await until(lambda: replica.state.num_redelivered() == 2)
            assert g.ready

    run(scenario)


def test_a_durable_with_inactive_threshold_is_reaped(tmp_path: Path) -> None:
    """JetStream 2.9+: a durable that sets inactive_threshold is deleted once idle that
    long; a durable without one (0) never is."""

    async def scenario() -> None:
        reaped = ConsumerConfig(durable_name="IDLE", inactive_threshold=NS_PER_S // 5)
        kept = ConsumerConfig(durable_name="KEEP")
        async with one_node(tmp_path, reaped, kept) as node:
            await until(lambda: bool(node.deleted))
            assert node.deleted == ["IDLE"]

    run(scenario)


def test_a_waiting_pull_keeps_a_durable_with_inactive_threshold(tmp_path: Path) -> None:
    """A waiting pull is interest: the durable is not reaped while it waits (poller turns
    pass meanwhile, five thresholds); once its call ends, the threshold runs again. On
    simulated time: its waits take no real time, and a loaded machine cannot stretch them."""

    async def scenario() -> None:
        cfg = ConsumerConfig(durable_name="IDLE", inactive_threshold=NS_PER_S // 5)
        async with one_node(tmp_path, cfg, simulated=True) as node:
            g = node.g
            handle = await g.open_pull("IDLE", {"batch": 1, "expires": WAIT_NS}, 30.0)
            await asyncio.sleep(0.1)  # a reap decided before the pull came in lands
            node.deleted.clear()
            await asyncio.sleep(1.5)  # at least one poller turn: it wakes once a second
            assert node.deleted == []
            handle.close()
            await until(lambda: bool(node.deleted))
            assert set(node.deleted) == {"IDLE"}

    run_simulated(scenario)


def test_deleted_consumers_are_forgotten_by_the_inactivity_watch(tmp_path: Path) -> None:
    """The leader's last-activity record of a consumer goes with the consumer (a soak review:
    one entry per ephemeral consumer ever created stayed until the next leader change)."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            for i in range(20):
                name = f"E{i}"
                node.consumers.append(assignment(ConsumerConfig(durable_name=name)))
                g.reconcile()
                await until(lambda n=name: n in g.replica.consumers)
                handle = await g.open_pull(name, {"batch": 1, "no_wait": True}, None)
                handle.close()
                del node.consumers[-1]
                g.reconcile()
                await until(lambda n=name: n not in g.replica.consumers)
            g._poller.reap_inactive()
            assert set(g._consumers.active_ns) <= {"C"}

    run(scenario)


def test_a_filter_edit_recounts_num_pending_at_once(tmp_path: Path) -> None:
    """Filter q.a (5 of 10), edited to q.a and q.b: info says 10 as soon as the edit
    applied, on the leader copy and on the replica, with no publish after it."""

    async def scenario() -> None:
        cfg = ConsumerConfig(durable_name="C", filter_subject="q.a")
        async with one_node(tmp_path, cfg) as node:
            g = node.g
            for i in range(10):
                await g.submit_plain("q.a" if i < 5 else "q.b", b"x")
            replica = g.replica.consumers["C"]
            assert g.leader_consumer("C").info(time.time_ns()).num_pending == 5
            assert replica.num_pending() == 5
            edited = replace(cfg, filter_subject=None, filter_subjects=("q.a", "q.b"))
            node.consumers[0] = assignment(edited)
            g.reconcile()
            await until(lambda: g.leader_consumer("C").config == edited)
            assert replica.config == edited
            assert g.leader_consumer("C").info(time.time_ns()).num_pending == 10
            assert replica.num_pending() == 10

    run(scenario)


def test_a_cancelled_open_pull_is_not_left_waiting(tmp_path: Path) -> None:
    """A Fetch call cancelled while its pull is opened, then closed by the handler's
    ``finally``: nothing stays waiting."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            started = asyncio.Event()
            task = asyncio.ensure_future(fetch_like(g, {"batch": 5, "expires": WAIT_NS}, started))
            await started.wait()
            assert g.leader_consumer("C").num_waiting == 1
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert g.leader_consumer("C").num_waiting == 0

    run(scenario)


async def fetch_like(g: StreamGroup, request: dict[str, Any], started: asyncio.Event) -> None:
    """What ``ConsumeServicer.Fetch`` does with a handle: take until done, close always."""
    handle = await g.open_pull("C", request, 30.0)
    started.set()
    try:
        while True:
            await handle.take()
    finally:
        handle.close()


def test_a_leader_that_cannot_confirm_its_leadership_hands_nothing_out(tmp_path: Path) -> None:
    """A decision's deliveries leave only once a quorum confirmed this node still leads
    (docs/cluster-design.md, "Only a confirmed leader hands deliveries out"): a deposed
    leader, not yet aware of the new term, would deliver messages the new leader saw acked.
    Here the confirmation fails as a deposed leader's does: the pull answers NOT_LEADER with
    nothing delivered, the copies are dropped, and the messages are delivered once the
    leadership is confirmed again."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            for i in range(3):
                await g.submit_plain("q.v", str(i).encode())
            host = node.host
            real = host.read_index

            def deposed(group: str, *, timeout_ms: int | None = None) -> Any:
                raise NotLeaderError("raft read not confirmed", leader="elsewhere")

            host.read_index = deposed  # type: ignore[method-assign]
            try:
                with pytest.raises((NotLeaderError, NoLeaderError)):
                    await g.open_pull("C", {"batch": 3, "no_wait": True}, 5.0)
            finally:
                host.read_index = real  # type: ignore[method-assign]
            assert not g.ready  # the copies went, as after a failed proposal
            g.check_leadership()  # the node's monitor does it every tick: a new barrier
            await until(lambda: g.ready)
            handle = await g.open_pull("C", {"batch": 3, "expires": WAIT_NS}, 30.0)
            assert await taken(handle, 3) == [1, 2, 3]  # first deliveries: none went out
            handle.close()

    run(scenario)
