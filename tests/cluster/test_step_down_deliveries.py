"""Integration: planned leader changes under consumer traffic lose no delivery (operator
review, finding 2; docs/cluster-design.md, "The stream leader's consumer copies and
deliveries": while a leadership transfer of the stream's group is in progress, the leader
decides no delivery, so none leaves whose Deliver op the transfer refuses).

A real 3-node cluster (``cluster3``): publishers, and a pull consumer whose workers each
fetch ``FETCH_BATCH`` and ``ack_sync`` each message, while the stream's leadership is moved
``STEP_DOWNS`` times with the consumer step-down (``raftstream cluster step-down --stream S
--consumer C``, the review's command). Checked:

- no ``ack_sync`` fails: before the fix, a delivery decided during a transfer had its
  Deliver op refused (``TransferInProgressError``), the new leader did not know it, and the
  client's ack was refused with FAILED_PRECONDITION ("has not delivered");
- every message is delivered and acked (at-least-once; nothing lost);
- a message delivered again carries ``num_delivered`` >= 2: before the fix, the forgotten
  delivery came back as a first one (``num_delivered`` 1), so ``max_deliver`` undercounted.

On the code before the fix this failed 8 runs of 8 (an ack_sync refused, or a message back
with num_delivered 1); the review saw 2 of 6 consumer step-downs under lighter traffic. The
stream step-down (no ``handing_over``) is covered too: it relies on
``RaftHost.transfer_leadership`` putting the proposals queued at that instant into the log
before the transfer. The in-process tests (test_stream_leader_transfers.py) pin the parts
of the fix that do not depend on timing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig, errors
from tests.support.cluster import LocalCluster, run
from tests.support.polling import NeverHappened, retry_async, until

pytestmark = pytest.mark.integration

TOTAL_MSGS = 600
PUBLISHERS = 3  # concurrent: entries are in flight when a transfer starts, and commit in it
WORKERS = 3  # fetch loops on the one consumer: a pull is nearly always waiting
FETCH_BATCH = 10  # small: fetches arrive often, each deciding at once what is stored
STEP_DOWNS = 24
# Long beside a batch's acks: a message comes again mostly when a delivery was lost (or a
# response never reached the client, then with num_delivered 2).
ACK_WAIT_NS = 10 * 1_000_000_000
DONE_WAIT_S = 120.0  # liveness bound for the whole run (not a timed assertion)


async def _publish(js: raftstream.Client, first: int, published: list[int]) -> None:
    """Messages ``first``, ``first + PUBLISHERS``... below TOTAL_MSGS, each with a msg_id,
    each retried with the SAME id until acknowledged (transfers refuse publishes for a
    moment; the dedup window makes the retry safe)."""
    for i in range(first, TOTAL_MSGS, PUBLISHERS):
        ack = await retry_async(lambda i=i: js.publish(f"sd.{i % 5}", b"%d" % i, msg_id=f"m{i}"))
        published.append(ack.seq)
        await asyncio.sleep(0.005)  # a steady stream, interleaved with the transfers


async def _consume(
    sub: raftstream.PullSubscription,
    deliveries: dict[int, list[int]],
    acked: set[int],
    failed: list[tuple[int, int, BaseException]],
) -> None:
    """``fetch(FETCH_BATCH)``, then ``ack_sync`` each message, until every message is
    acked; records each delivery's num_delivered by stream sequence, and every failed
    ack_sync."""
    while len(acked) < TOTAL_MSGS:
        try:
            msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
        except (errors.DeadlineExceededError, errors.ConflictError, errors.UnavailableError):
            continue  # nothing yet, or the pull ended with 409 Leadership Change
        for m in msgs:
            seq, nd = m.metadata.stream_seq, m.metadata.num_delivered
            deliveries[seq].append(nd)
            try:
                await m.ack_sync()
            except errors.RaftStreamError as exc:
                failed.append((seq, nd, exc))
            else:
                acked.add(seq)


async def _step_downs(
    js: raftstream.Client, acked: set[int], done: asyncio.Event, by: str
) -> list[str]:
    """STEP_DOWNS transfers of the stream's leadership, each once the consumer has made
    progress since the previous one (so every transfer lands among fetches and acks); ``by``
    the consumer step-down or the stream's."""
    leaders = []
    step = TOTAL_MSGS // (STEP_DOWNS + 2)
    for i in range(STEP_DOWNS):
        while len(acked) < step * (i + 1) and not done.is_set():
            await asyncio.sleep(0.01)
        if done.is_set():
            break
        if by == "consumer":
            leader = await js.consumer_leader_stepdown("SD", "C", timeout=10)
        else:
            leader = await js.stream_leader_stepdown("SD", timeout=10)
        leaders.append(leader or "?")
    return leaders


@pytest.mark.parametrize("by", ["consumer", "stream"])
def test_planned_leader_changes_lose_no_delivery(cluster3: LocalCluster, by: str) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=15)
        try:
            await js.add_stream(StreamConfig(name="SD", subjects=("sd.>",), num_replicas=3))
            await js.add_consumer("SD", ConsumerConfig(durable_name="C", ack_wait=ACK_WAIT_NS))
            sub = await js.pull_subscribe_bind("SD", "C")
            deliveries: dict[int, list[int]] = collections.defaultdict(list)
            acked: set[int] = set()
            failed: list[tuple[int, int, BaseException]] = []
            published: list[int] = []
            done = asyncio.Event()
            tasks = [
                *(
                    asyncio.create_task(_consume(sub, deliveries, acked, failed))
                    for _ in range(WORKERS)
                ),
                *(asyncio.create_task(_publish(js, i, published)) for i in range(PUBLISHERS)),
            ]
            stepper = asyncio.create_task(_step_downs(js, acked, done, by))
            try:
                await asyncio.wait_for(asyncio.gather(*tasks), DONE_WAIT_S)
            finally:
                done.set()
                for t in tasks:
                    t.cancel()
            leaders = await stepper
            assert len(leaders) == STEP_DOWNS, leaders
            assert failed == [], failed[:5]
            assert sorted(published) == list(range(1, TOTAL_MSGS + 1))
            assert acked == set(published)
            again = {s: nds for s, nds in deliveries.items() if len(nds) > 1}
            assert all(nd >= 2 for nds in again.values() for nd in nds[1:]), again
            ci = await js.consumer_info("SD", "C")
            assert (ci.num_ack_pending, ci.num_pending) == (0, 0)
        finally:
            await js.close()

    run(body())


ACKED_MSGS = 900
ACK_STEP_DOWNS = 12
# Far longer than the run: an ack that was lost leaves its message pending to the end.
LONG_ACK_WAIT_NS = 120 * 1_000_000_000
ACKS_APPLIED_WAIT_S = 30.0  # liveness bound for the last acks to apply (not a timed assertion)


def test_fire_and_forget_acks_are_kept_across_stream_step_downs(cluster3: LocalCluster) -> None:
    """Fire-and-forget acks (``ack()``, the AckStream) that reach the stream leader while
    it hands its leadership over are sent on to the new leader, not refused NOT_LEADER
    (which only warned through ``error_cb``, and left each message to come back after its
    ack wait): every ack applies, and no error is reported."""

    async def body() -> None:
        reported: list[errors.RaftStreamError] = []
        js = await raftstream.connect(
            servers=cluster3.servers, timeout=15, error_cb=reported.append
        )
        try:
            await js.add_stream(StreamConfig(name="SA", subjects=("sa.>",), num_replicas=3))
            await js.add_consumer("SA", ConsumerConfig(durable_name="C", ack_wait=LONG_ACK_WAIT_NS))
            for i in range(ACKED_MSGS):
                await js.publish_async(f"sa.{i % 5}", b"%d" % i)
            await js.publish_async_completed(timeout=30)
            sub = await js.pull_subscribe_bind("SA", "C")
            seen: set[int] = set()
            done = asyncio.Event()
            step = ACKED_MSGS // (ACK_STEP_DOWNS + 2)
            stepped = [0]

            async def consume() -> None:
                while len(seen) < ACKED_MSGS:
                    # At most a step ahead of the step-downs, which then all come while
                    # acks are in flight, however fast this loop is.
                    while len(seen) >= step * (stepped[0] + 2) and stepped[0] < ACK_STEP_DOWNS:
                        await asyncio.sleep(0.005)
                    try:
                        msgs = await sub.fetch(FETCH_BATCH, timeout=1.0)
                    except (errors.DeadlineExceededError, errors.ConflictError):
                        continue
                    for m in msgs:
                        seen.add(m.metadata.stream_seq)
                        await m.ack()

            async def step_downs() -> int:
                for i in range(ACK_STEP_DOWNS):
                    while len(seen) < step * (i + 1) and not done.is_set():
                        await asyncio.sleep(0.005)
                    if done.is_set():
                        return i
                    await js.stream_leader_stepdown("SA", timeout=10)
                    stepped[0] += 1
                return ACK_STEP_DOWNS

            stepper = asyncio.create_task(step_downs())
            try:
                await asyncio.wait_for(consume(), DONE_WAIT_S)
            finally:
                done.set()
            assert await stepper == ACK_STEP_DOWNS
            with contextlib.suppress(NeverHappened):  # the asserts below say what is left
                await until(
                    lambda: retry_async(lambda: js.consumer_info("SA", "C")),
                    what="every ack applied",
                    accept=lambda ci: not ci.num_ack_pending,
                    timeout_s=ACKS_APPLIED_WAIT_S,
                    interval_s=0.2,
                )
            ci = await retry_async(lambda: js.consumer_info("SA", "C"))
            # What error_cb got, if anything, says why an ack did not apply.
            assert (ci.num_ack_pending, ci.num_pending) == (0, 0), reported[:5]
            assert ci.ack_floor.stream_seq == ACKED_MSGS
            assert reported == [], reported[:5]
        finally:
            await js.close()

    run(body())
