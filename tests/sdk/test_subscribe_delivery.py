"""Push delivery, acks and status handling against a real 3-node cluster.

ADR-15 "Ack Handling" (ack, ack_sync, nak with delay, in_progress, term), "Automatic Status
Management" (flow control answered, a leadership change survived, a deleted consumer raised,
pull 404/408 never surfaced as messages), and ``drain``/``unsubscribe``.
"""

from __future__ import annotations

import asyncio

import pytest

from raftstream import errors
from raftstream.config import ConsumerConfig
from raftstream.msg import Msg
from tests.support.cluster import LocalCluster
from tests.support.polling import until

from .live import connected, run, stream

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("tails")]

NS = 1_000_000_000
FLOW_WINDOW_MSGS = 512  # the server's flow-control window (engine/consumer_push.py)


def test_acks_ack_sync_nak_in_progress_and_term(cluster: LocalCluster) -> None:
    """ADR-15 "Ack Handling": each kind reaches the consumer; nak redelivers (delivered
    count 2), term and ack settle for good."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "DL_ACK", "dlack.>")
            for i in range(3):
                await rs.publish("dlack.x", b"%d" % i)
            sub = await rs.subscribe("dlack.x", config=ConsumerConfig(ack_wait=30 * NS))
            first, second, third = [await sub.next_msg(10) for _ in range(3)]
            await first.in_progress()
            await first.ack_sync()
            await second.term("poison")
            await third.nak(delay=0.05)
            again = await sub.next_msg(10)
            assert again.data == b"2" and again.metadata.num_delivered == 2
            assert third.metadata.num_delivered == 1
            await again.ack_sync()

            async def settled() -> bool | None:
                ci = await sub.consumer_info()
                return True if ci.num_ack_pending == 0 else None

            await until(settled, what="every delivery settled")
            ci = await sub.consumer_info()
            assert ci.delivered.stream_seq == 3 and ci.ack_floor.stream_seq == 3
            await sub.unsubscribe()

    run(body())


def test_callback_auto_acks_unless_manual_ack(cluster: LocalCluster) -> None:
    """With a callback, messages are acked after it returns; ``manual_ack`` leaves acks to
    the application."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "DL_CB", "dlcb.>")
            for i in range(10):
                await rs.publish("dlcb.a", b"%d" % i)
            auto_got: list[bytes] = []
            manual: list[Msg] = []

            async def auto_cb(msg: Msg) -> None:
                auto_got.append(msg.data)

            async def manual_cb(msg: Msg) -> None:
                manual.append(msg)

            auto = await rs.subscribe("dlcb.a", cb=auto_cb)
            by_hand = await rs.subscribe("dlcb.a", cb=manual_cb, manual_ack=True)

            async def delivered() -> bool | None:
                a = await auto.consumer_info()
                m = await by_hand.consumer_info()
                done = a.num_ack_pending == 0 and len(auto_got) == 10 and len(manual) == 10
                return True if done and m.delivered.stream_seq == 10 else None

            await until(delivered, what="both subscriptions got everything")
            assert auto_got == [b"%d" % i for i in range(10)]
            assert (await by_hand.consumer_info()).num_ack_pending == 10
            for msg in manual:
                await msg.ack_sync()
            assert (await by_hand.consumer_info()).num_ack_pending == 0
            with pytest.raises(errors.InvalidArgumentError):
                await auto.next_msg(0.1)  # not with a callback
            await auto.unsubscribe()
            await by_hand.unsubscribe()

    run(body())


def test_flow_control_requests_are_answered(cluster: LocalCluster) -> None:
    """ADR-15 "Flow Control": the server stalls after its window until the client answers;
    more than a window arrives only if the subscription answers."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(cluster, errs) as rs:
            await stream(rs, "DL_FC", "dlfc.>")
            total = FLOW_WINDOW_MSGS * 2 + 10
            for i in range(total):
                await rs.publish_async("dlfc.x", b"%d" % i)
            await rs.publish_async_completed()
            sub = await rs.subscribe("dlfc.x", flow_control=True, idle_heartbeat=1.0)
            got = []
            async for msg in sub:
                got.append(msg.data)
                await msg.ack()
                if len(got) == total:
                    break
            assert got == [b"%d" % i for i in range(total)]
            await sub.unsubscribe()
            assert not errs

    run(body())


def test_a_leadership_change_is_survived(cluster: LocalCluster) -> None:
    """``409 Leadership Change`` ends the call; the subscription reattaches to the new
    leader and keeps delivering (unacked deliveries come again: at least once)."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(cluster, errs) as rs:
            await stream(rs, "DL_LC", "dllc.>")
            sub = await rs.subscribe("dllc.x", durable="LC")
            await rs.publish("dllc.x", b"before")
            msg = await sub.next_msg(10)
            await msg.ack_sync()
            old = (await rs.stream_info("DL_LC")).cluster
            assert old is not None
            await rs.stream_leader_stepdown("DL_LC")

            async def new_leader() -> str | None:
                info = (await rs.stream_info("DL_LC")).cluster
                leader = info.leader if info is not None else None
                return leader if leader and leader != old.leader else None

            await until(new_leader, what="a new stream leader")
            await rs.publish("dllc.x", b"after")
            msg = await sub.next_msg(30)
            assert msg.data == b"after"
            await msg.ack_sync()
            await sub.unsubscribe()
            assert not [e for e in errs if not isinstance(e, errors.SequenceGapError)]

    run(body())


def test_a_deleted_consumer_ends_the_subscription_with_its_error(cluster: LocalCluster) -> None:
    """ADR-15 "Miscellaneous Error Statuses": ``409 Consumer Deleted`` is raised, not
    passed on as a message; buffered messages are still handed over first."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(cluster, errs) as rs:
            await stream(rs, "DL_CD", "dlcd.>")
            sub = await rs.subscribe("dlcd.x", durable="GONE")
            await rs.publish("dlcd.x", b"one")
            await until(lambda: _ready(sub.pending == 1), what="one message buffered")
            await rs.delete_consumer("DL_CD", "GONE")
            assert (await sub.next_msg(10)).data == b"one"
            with pytest.raises(errors.ConflictError) as e:
                await sub.next_msg(30)
            assert e.value.details["status"] == 409
            assert any(isinstance(x, errors.ConflictError) for x in errs)
            with pytest.raises(errors.ConflictError):
                async for _ in sub:
                    pass
            await sub.unsubscribe()  # the consumer is gone already: fine

    run(body())


def test_pull_no_messages_and_expiry_are_not_surfaced(cluster: LocalCluster) -> None:
    """ADR-15 "Pull Mode Statuses": 404/408 are neither messages nor counted; an empty
    fetch is a timeout."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "DL_PULL", "dlpull.>")
            psub = await rs.pull_subscribe("dlpull.x", "W")
            with pytest.raises(errors.DeadlineExceededError):
                await psub.fetch(5, timeout=0.5)
            await rs.publish("dlpull.x", b"a")
            await rs.publish("dlpull.x", b"b")
            got = await psub.fetch(10, timeout=2)
            assert [m.data for m in got] == [b"a", b"b"]
            for m in got:
                await m.ack_sync()
            bound = await rs.pull_subscribe_bind("DL_PULL", "W")
            with pytest.raises(errors.DeadlineExceededError):
                await bound.fetch(1, timeout=0.5)

    run(body())


def test_unsubscribe_ends_iteration_and_next_msg(cluster: LocalCluster) -> None:
    """After ``unsubscribe`` iteration stops and ``next_msg`` raises
    ``SubscriptionClosedError``; a waiting reader is woken."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "DL_UN", "dlun.>")
            sub = await rs.subscribe("dlun.x")
            seen: list[bytes] = []

            async def read_all() -> None:
                async for msg in sub:
                    seen.append(msg.data)

            reader = asyncio.ensure_future(read_all())
            await rs.publish("dlun.x", b"x")
            await until(lambda: _ready(seen == [b"x"]), what="the message read")
            await sub.unsubscribe()
            await asyncio.wait_for(reader, 10)
            with pytest.raises(errors.SubscriptionClosedError):
                await sub.next_msg(0.1)

    run(body())


async def _ready(cond: bool) -> bool | None:
    return True if cond else None


def test_close_sends_queued_fire_and_forget_acks(cluster: LocalCluster) -> None:
    """``ack()`` only queues the ack; closing the client right after must still deliver it,
    so an application that acks and exits does not see its messages redelivered."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "DL_FLUSH", "dlflush.>")
            for i in range(50):
                await rs.publish("dlflush.x", b"%d" % i)
            await rs.add_consumer("DL_FLUSH", durable_name="flusher", ack_wait=60 * NS)
            sub = await rs.pull_subscribe("dlflush.x", durable="flusher")
            msgs = await sub.fetch(50, timeout=10)
            assert len(msgs) == 50
            for msg in msgs:
                await msg.ack()  # queued; the client closes right after
        async with connected(cluster) as rs:

            async def all_acked() -> bool | None:
                ci = await rs.consumer_info("DL_FLUSH", "flusher")
                return True if ci.ack_floor.stream_seq == 50 else None

            await until(all_acked, what="every queued ack applied")
            ci = await rs.consumer_info("DL_FLUSH", "flusher")
            assert ci.num_ack_pending == 0

    run(body())
