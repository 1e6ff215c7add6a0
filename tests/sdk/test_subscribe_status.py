"""Automatic status management on a scripted server, and the message's ack rules.

ADR-15 "Automatic Status Management": the real server offers no deterministic way to skip a
consumer sequence, to repeat a flow-control request in a heartbeat's ``stalled``, or to send
an unknown status, so a fake node (``tests/support/fakes.py``) plays exact ``Consume``
responses here and records what the client answers. The real-cluster counterparts (flow
control, leadership change, deleted consumer, missed heartbeats) are in
``test_subscribe_delivery.py`` and ``test_ordered.py``. ADR-15 "JSAck" and "Ack Handling":
token forms, terminal acks, ack policy none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import raftstream
from raftstream import errors
from raftstream._push import PushSubscription
from raftstream.models import ConsumerInfo, MsgMetadata
from raftstream.msg import ACK_DELAY_NS_MAX, ACK_REASON_BYTES_MAX, Msg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.subscribe import PushOptions, attach
from tests.support.fakes import AckRecorder, FakeNode, Nodes, ack_token
from tests.support.polling import until

NS = 1_000_000_000


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def msg(seq: int, cseq: int | None = None) -> pb.Msg:
    token = ack_token(seq).split(".")
    token[8] = str(cseq if cseq is not None else seq)  # the consumer sequence
    return pb.Msg(subject="orders.x", seq=seq, data=b"%d" % seq, reply=".".join(token))


def heartbeat(last_cseq: int, stalled: str = "") -> pb.ConsumeResponse:
    return pb.ConsumeResponse(
        heartbeat=pb.Heartbeat(
            last_consumer_seq=last_cseq, last_stream_seq=last_cseq, stalled=stalled
        )
    )


class Script:
    """A Consume handler: plays ``responses`` (then waits), records the requests."""

    def __init__(self, *responses: pb.ConsumeResponse) -> None:
        self.responses = list(responses)
        self.starts: list[pb.ConsumeStart] = []
        self.fc_replies: list[str] = []

    async def __call__(self, requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
        async def read() -> None:
            async for req in requests:
                if req.HasField("start"):
                    self.starts.append(req.start)
                self.fc_replies.extend(r.token for r in req.flow_control_replies)

        reader = asyncio.ensure_future(read())
        try:
            for resp in self.responses:
                yield resp
            await asyncio.Event().wait()  # the call stays open until the client ends it
        finally:
            reader.cancel()


def info(queue: str | None = None, heartbeat_ns: int = 0) -> ConsumerInfo:
    cfg: dict[str, Any] = {"durable_name": "C", "deliver_subject": "_INBOX.x"}
    if queue:
        cfg["deliver_group"] = queue
    if heartbeat_ns:
        cfg["idle_heartbeat"] = heartbeat_ns
    return ConsumerInfo.from_pb(
        pb.ConsumerInfo(stream="ORDERS", name="C", config_json=json.dumps(cfg))
    )


async def subscribed(
    node: FakeNode, script: Script, errs: list[errors.RaftStreamError], **kw: Any
) -> tuple[raftstream.Client, PushSubscription]:
    node.on("Consume", script)
    rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
    queue = kw.pop("queue", None)
    sub = attach(
        rs, info(queue, **kw), subject="orders.x", queue=queue, created=False, options=PushOptions()
    )
    return rs, sub


def test_a_gap_in_the_consumer_sequence_is_reported():
    """ADR-15 "Messages Gaps": from a message's ack token and from a heartbeat's
    ``last_consumer_seq``; every message is still handed over."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(
            pb.ConsumeResponse(messages=[msg(1), msg(2)]),
            pb.ConsumeResponse(messages=[msg(5)]),
            heartbeat(7),
        )
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs)
            got = [(await sub.next_msg(5)).metadata.consumer_seq for _ in range(3)]
            assert got == [1, 2, 5]
            await until(lambda: len(errs) == 2, what="two gaps reported")
            gaps = [(e.details["expected"], e.details["got"]) for e in errs]
            assert all(isinstance(e, errors.SequenceGapError) for e in errs)
            assert gaps == [(3, 5), (6, 7)]
            assert script.starts[0].consumer == "C" and script.starts[0].queue == ""
            await rs.close()

    run(main())


def test_next_msg_takes_a_buffered_message_without_a_loop_turn():
    """A buffered message is handed over at once, with no turn of the event loop (so a
    ``next_msg``/``ack`` loop queues its acks together: they leave in one stream write, not
    one each; ``asyncio.wait_for`` took a turn per message and made push delivery with acks
    four times slower). An empty buffer still waits, and times out as before."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(pb.ConsumeResponse(messages=[msg(1), msg(2), msg(3)]))
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs)
            await until(lambda: sub.pending == 3, what="three messages buffered")
            turned = asyncio.Event()
            asyncio.get_running_loop().call_soon(turned.set)
            got = [(await sub.next_msg(5)).metadata.stream_seq for _ in range(3)]
            assert got == [1, 2, 3]
            assert not turned.is_set()
            with pytest.raises(errors.DeadlineExceededError):
                await sub.next_msg(0.05)
            assert turned.is_set()
            await rs.close()

    run(main())


def test_queue_subscriptions_do_not_check_gaps():
    """ADR-15: "Gap checking should be disabled on queue / deliver group subscriptions"."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(
            pb.ConsumeResponse(messages=[msg(1), msg(4), msg(9)]),
            heartbeat(12),
            pb.ConsumeResponse(messages=[msg(15)]),  # read after the heartbeat was handled
        )
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs, queue="q")
            got = [(await sub.next_msg(5)).metadata.consumer_seq for _ in range(4)]
            assert got == [1, 4, 9, 15]
            assert script.starts[0].queue == "q"
            assert errs == []
            await rs.close()

    run(main())


def test_flow_control_is_answered_when_reached_and_once_per_token():
    """ADR-15 "Flow Control": a request is answered when the application reaches it in
    the message order; a heartbeat's ``stalled`` token is answered at once; each token
    is answered once however often it comes."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(
            pb.ConsumeResponse(messages=[msg(1)], flow_control=pb.FlowControlRequest(token="fc.1")),
            heartbeat(1, stalled="fc.1"),
            heartbeat(1, stalled="fc.1"),
            pb.ConsumeResponse(messages=[msg(2)], flow_control=pb.FlowControlRequest(token="fc.2")),
            heartbeat(2, stalled="fc.2"),
            heartbeat(2, stalled="fc.3"),
            pb.ConsumeResponse(messages=[msg(3)]),
        )
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs)
            assert (await sub.next_msg(5)).data == b"1"
            assert (await sub.next_msg(5)).data == b"2"
            assert (await sub.next_msg(5)).data == b"3"
            await until(lambda: "fc.3" in script.fc_replies, what="fc.3 answered")
            assert sorted(script.fc_replies) == ["fc.1", "fc.2", "fc.3"]
            assert errs == []
            await rs.close()

    run(main())


def test_a_flow_control_request_waits_for_the_application():
    """The answer is the application's pace: an unread message before the request holds
    it back (no heartbeat asks for it here)."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(
            pb.ConsumeResponse(messages=[msg(1)], flow_control=pb.FlowControlRequest(token="fc.9")),
            pb.ConsumeResponse(messages=[msg(2)]),
        )
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs)
            await until(lambda: sub.pending == 2, what="both messages buffered")
            assert script.fc_replies == []
            assert (await sub.next_msg(5)).data == b"1"
            assert (await sub.next_msg(5)).data == b"2"  # passes the request: answered
            await until(lambda: script.fc_replies == ["fc.9"], what="fc.9 answered")
            await rs.close()

    run(main())


@pytest.mark.parametrize("code", [503, 999, 409])
def test_conflicts_and_unknown_statuses_raise(code: int):
    """ADR-15 "Miscellaneous/Unknown Error Statuses": raised, never a message; the error
    callback hears it too; messages before it are handed over first."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(
            pb.ConsumeResponse(
                messages=[msg(1)], status=pb.PullStatus(code=code, description="Something")
            )
        )
        async with Nodes(1) as (node,):
            rs, sub = await subscribed(node, script, errs)
            assert (await sub.next_msg(5)).data == b"1"
            with pytest.raises(errors.ConflictError) as e:
                await sub.next_msg(5)
            assert e.value.details["status"] == code
            assert [type(x) for x in errs] == [errors.ConflictError]
            await rs.close()

    run(main())


def test_a_leadership_change_reattaches():
    """``409 Leadership Change`` is not an error: the client opens a new call."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        calls: list[int] = []
        first = Script(
            pb.ConsumeResponse(
                messages=[msg(1)],
                status=pb.PullStatus(code=409, description="Leadership Change (NOT_LEADER)"),
            )
        )
        second = Script(pb.ConsumeResponse(messages=[msg(2, cseq=2)]))

        async def consume(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
            calls.append(1)
            script = first if len(calls) == 1 else second
            async for resp in script(requests, context):
                yield resp

        async with Nodes(1) as (node,):
            node.on("Consume", consume)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = attach(
                rs, info(), subject="orders.x", queue=None, created=False, options=PushOptions()
            )
            assert [(await sub.next_msg(5)).data for _ in range(2)] == [b"1", b"2"]
            assert len(calls) == 2 and errs == []
            await rs.close()

    run(main())


def test_missing_heartbeats_are_reported():
    """ADR-15 "Heartbeats": nothing for 3x the interval goes to the error callback; the
    subscription goes on (a later message still arrives)."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        gate = asyncio.Event()

        async def consume(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
            await gate.wait()
            yield pb.ConsumeResponse(messages=[msg(1)])
            await asyncio.Event().wait()

        async with Nodes(1) as (node,):
            node.on("Consume", consume)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = attach(
                rs,
                info(heartbeat_ns=NS // 10),
                subject="orders.x",
                queue=None,
                created=False,
                options=PushOptions(),
            )
            await until(lambda: len(errs) >= 1, what="a missed heartbeat reported")
            assert isinstance(errs[0], errors.MissedHeartbeatError)
            gate.set()
            assert (await sub.next_msg(5)).data == b"1"
            await rs.close()

    run(main())


# -- messages (ADR-15 "JSAck", "Ack Handling") ------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[int, bool]] = []

    async def send(self, item: pb.AckItem, stream: str) -> None:
        self.sent.append((item.kind, False))

    async def send_sync(self, item: pb.AckItem, stream: str, *, timeout_s: float | None) -> None:
        self.sent.append((item.kind, True))


def test_after_a_terminal_ack_further_acks_are_ignored_but_ack_sync():
    """ADR-15: acks after a terminal one are ignored. ack_sync is sent all the same: it
    promises the server's answer, which a fire-and-forget ack before it never gave."""

    async def main() -> None:
        for terminal in ("ack", "nak", "term", "ack_sync"):
            rec = Recorder()
            m = Msg(subject="s", data=b"", headers=None, reply=ack_token(1), sender=rec)
            await m.in_progress()
            await getattr(m, terminal)()
            await m.ack()
            await m.nak(1.0)
            await m.term("x")
            await m.in_progress()
            assert len(rec.sent) == 2, terminal
            assert m.acked
            await m.ack_sync()
            assert rec.sent[-1] == (pb.ACK_KIND_ACK, True), terminal

    run(main())


def test_a_nak_or_term_with_a_bad_argument_raises_and_leaves_the_message_ackable():
    """The node refuses a NAK delay over a year (or negative) and a TERM reason over 4096
    bytes; refused fire-and-forget, the refusal would reach only error_cb, later, while the
    message counted as acked here. So they raise at once, send nothing and mark nothing."""

    async def main() -> None:
        rec = Recorder()
        m = Msg(subject="s", data=b"", headers=None, reply=ack_token(1), sender=rec)
        year_s = ACK_DELAY_NS_MAX // NS
        for delay in (-1.0, year_s + 1.0):
            with pytest.raises(errors.InvalidArgumentError) as err:
                await m.nak(delay)
            assert err.value.field == "delay"
        with pytest.raises(errors.InvalidArgumentError) as err:
            await m.term("r" * (ACK_REASON_BYTES_MAX + 1))
        assert err.value.field == "reason"
        assert rec.sent == [] and not m.acked
        await m.nak(year_s)  # the bounds themselves are fine
        assert rec.sent == [(pb.ACK_KIND_NAK, False)] and m.acked
        m2 = Msg(subject="s", data=b"", headers=None, reply=ack_token(2), sender=rec)
        await m2.term("r" * ACK_REASON_BYTES_MAX)
        assert rec.sent[-1] == (pb.ACK_KIND_TERM, False)

    run(main())


def test_with_ack_policy_none_acks_are_ignored():
    async def main() -> None:
        rec = Recorder()
        m = Msg(
            subject="s", data=b"", headers=None, reply=ack_token(1), sender=rec, acks_ignored=True
        )
        await m.ack()
        await m.ack_sync()
        await m.nak()
        await m.in_progress()
        await m.term()
        assert rec.sent == []

    run(main())


def test_metadata_from_both_ack_token_forms():
    v1 = MsgMetadata.from_reply("$JS.ACK.ORDERS.C.2.10.7.1700000000.3")
    assert (v1.stream, v1.consumer, v1.num_delivered, v1.stream_seq, v1.consumer_seq) == (
        "ORDERS",
        "C",
        2,
        10,
        7,
    )
    assert (v1.timestamp_ns, v1.num_pending, v1.domain, v1.account) == (1700000000, 3, None, None)
    v2 = MsgMetadata.from_reply("$JS.ACK._.ACC.ORDERS.C.2.10.7.1700000000.3")
    assert (v2.domain, v2.account, v2.stream_seq) == (None, "ACC", 10)
    v2d = MsgMetadata.from_reply("$JS.ACK.hub.ACC.ORDERS.C.1.1.1.5.0.random-token")
    assert (v2d.domain, v2d.stream, v2d.num_pending) == ("hub", "ORDERS", 0)
    for bad in (
        "$JS.ACK.ORDERS.C.2.10.7.1700000000",  # 8 tokens
        "$JS.ACK._.ACC.ORDERS.C.2.10.7.1700000000",  # 10 tokens
        "$JS.NAK.ORDERS.C.2.10.7.1700000000.3",
        "$JS.ACK.ORDERS.C.two.10.7.1700000000.3",
    ):
        with pytest.raises(errors.InvalidArgumentError):
            MsgMetadata.from_reply(bad)


def test_the_buffer_is_bounded_and_nothing_is_dropped():
    """At most ``pending_msgs_max`` messages wait (plus one response): the reader stops
    reading instead of dropping, and every message still arrives in order."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        total = 60
        script = Script(*(pb.ConsumeResponse(messages=[msg(i)]) for i in range(1, total + 1)))
        async with Nodes(1) as (node,):
            node.on("Consume", script)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = attach(
                rs,
                info(),
                subject="orders.x",
                queue=None,
                created=False,
                options=PushOptions(pending_msgs_max=5),
            )
            await until(lambda: sub.pending == 5, what="the buffer filled")
            got = []
            for _ in range(total):
                assert sub.pending <= 5 + 1
                got.append((await sub.next_msg(5)).metadata.stream_seq)
            assert got == list(range(1, total + 1)) and errs == []
            await rs.close()

    run(main())


def test_drain_hands_over_the_buffer_or_gives_up_after_its_timeout():
    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        script = Script(pb.ConsumeResponse(messages=[msg(1), msg(2), msg(3)]))
        async with Nodes(1) as (node,):
            node.on("Consume", script)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = attach(
                rs, info(), subject="orders.x", queue=None, created=False, options=PushOptions()
            )
            await until(lambda: sub.pending == 3, what="three buffered")
            reader = asyncio.ensure_future(sub.next_msg(5))
            with pytest.raises(errors.DeadlineExceededError, match="2 messages"):
                await sub.drain(timeout=0.2)  # one is taken, nobody takes the other two
            assert (await reader).data == b"1"
            assert sub.is_closed and sub.pending == 0
            with pytest.raises(errors.SubscriptionClosedError):
                await sub.next_msg(0.1)
            await rs.close()

    run(main())


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL]
)
def test_a_call_ended_by_the_server_reattaches_unless_the_error_is_final(code):
    """A call the server or the transport ends (CANCELLED by a shutting-down node,
    UNAVAILABLE) is opened again; a final error (INTERNAL) ends the subscription."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        calls: list[int] = []

        async def consume(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
            calls.append(1)
            if len(calls) == 1:
                yield pb.ConsumeResponse(messages=[msg(1)])
                await context.abort(code, "ended by the server")
            yield pb.ConsumeResponse(messages=[msg(2)])
            await asyncio.Event().wait()

        async with Nodes(1) as (node,):
            node.on("Consume", consume)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = attach(
                rs, info(), subject="orders.x", queue=None, created=False, options=PushOptions()
            )
            assert (await sub.next_msg(5)).data == b"1"
            if code is grpc.StatusCode.INTERNAL:
                with pytest.raises(errors.RaftStreamError) as e:
                    await sub.next_msg(5)
                assert "ended by the server" in str(e.value)  # the final error itself
                assert len(calls) == 1 and errs == [e.value]
            else:
                assert (await sub.next_msg(5)).data == b"2"
                assert len(calls) == 2 and errs == []
            await rs.close()

    run(main())


def test_a_callback_that_raises_goes_to_error_cb_and_the_subscription_goes_on():
    """nats.py gives a subscription callback's exception to error_cb; here it was only
    logged, so an app alerting through error_cb never saw it (a user review). Now it is a
    CallbackError whose cause is the exception; that message is not acked, the next one is."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        seen: list[int] = []

        async def cb(m: Msg) -> None:
            seen.append(m.metadata.stream_seq)
            if m.metadata.stream_seq == 1:
                raise ValueError("bad order")

        script = Script(pb.ConsumeResponse(messages=[msg(1), msg(2)]))
        async with Nodes(1) as (node,):
            node.on("Consume", script)
            acks = AckRecorder()
            node.on("AckStream", acks.handler)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            attach(
                rs,
                info(),
                subject="orders.x",
                queue=None,
                created=False,
                options=PushOptions(cb=cb),
            )
            await until(lambda: seen == [1, 2], what="both messages handed to the callback")
            (err,) = errs
            assert isinstance(err, errors.CallbackError) and isinstance(err.__cause__, ValueError)
            assert "bad order" in str(err) and err.details["consumer"] == "C"
            await until(lambda: len(acks.items) == 1, what="the second message acked")
            assert acks.items[0].reply == msg(2).reply
            await rs.close()

    run(main())
