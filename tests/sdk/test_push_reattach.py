"""A push subscription across new Consume calls, on scripted servers: flow-control answers
are per call, and missed heartbeats give up the call.

Pins JetStream behaviour the SDK must keep over gRPC (ADR-15, "Flow Control" and
"Heartbeats"): a flow-control request is answered and delivery carries on after a leader
change, even when the new leader asks with a token an older one used (servers before unique
tokens did: ``$JS.FC.S.c.1`` again); and when the leader hangs (no heartbeat for 3
intervals), the subscription reports ``MissedHeartbeatError`` and moves to the node that
leads now, as a JetStream consumer's new leader pushes to the deliver subject. The
real-cluster counterparts are in ``tests/cluster/test_push_failover_fc.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import raftstream
from raftstream import errors
from raftstream.models import ConsumerInfo
from raftstream.proto import raftstream_pb2 as pb
from raftstream.subscribe import PushOptions, attach
from tests.support.fakes import Nodes, ack_token
from tests.support.polling import until

NS = 1_000_000_000
LEADERSHIP_CHANGE = pb.PullStatus(code=409, description="Leadership Change (NOT_LEADER)")


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def msg(seq: int) -> pb.Msg:
    return pb.Msg(subject="orders.x", seq=seq, data=b"%d" % seq, reply=ack_token(seq))


def info(heartbeat_ns: int = NS) -> ConsumerInfo:
    cfg = {"durable_name": "C", "deliver_subject": "_INBOX.x", "idle_heartbeat": heartbeat_ns}
    return ConsumerInfo.from_pb(
        pb.ConsumerInfo(stream="ORDERS", name="C", config_json=json.dumps(cfg))
    )


class Calls:
    """A Consume handler whose n-th call runs ``plays[n]`` (the last one for any later call)
    with the call's recorded flow-control replies; each call's replies are kept apart."""

    def __init__(self, *plays: Any) -> None:
        self.plays = plays
        self.replies: list[list[str]] = []

    async def __call__(self, requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
        replies: list[str] = []
        self.replies.append(replies)
        play = self.plays[min(len(self.replies), len(self.plays)) - 1]

        async def read() -> None:
            async for req in requests:
                replies.extend(r.token for r in req.flow_control_replies)

        reader = asyncio.ensure_future(read())
        try:
            async for resp in play(replies):
                yield resp
            await asyncio.Event().wait()  # the call stays open until the client ends it
        finally:
            reader.cancel()


def subscribe(rs: raftstream.Client, heartbeat_ns: int = NS) -> Any:
    return attach(
        rs,
        info(heartbeat_ns),
        subject="orders.x",
        queue=None,
        created=False,
        options=PushOptions(),
    )


async def answered(replies: list[str], token: str, count: int = 1) -> None:
    await until(lambda: replies.count(token) >= count, what=f"{token} answered")


def test_a_new_call_answers_a_token_an_earlier_call_answered():
    """A new leader (an older server) asks with the token the old leader asked with: the new
    call answers it (it did not, and delivery stopped for good after any failover), both
    when it comes in order with the messages and in a heartbeat's ``stalled``."""

    async def first(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(
            messages=[msg(1)], flow_control=pb.FlowControlRequest(token="fc.1")
        )
        await answered(replies, "fc.1")
        yield pb.ConsumeResponse(status=LEADERSHIP_CHANGE)

    async def second(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(
            messages=[msg(2)], flow_control=pb.FlowControlRequest(token="fc.1")
        )
        await answered(replies, "fc.1")
        yield pb.ConsumeResponse(status=LEADERSHIP_CHANGE)

    async def third(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(
            heartbeat=pb.Heartbeat(last_consumer_seq=2, last_stream_seq=2, stalled="fc.1")
        )

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        calls = Calls(first, second, third)
        async with Nodes(1) as (node,):
            node.on("Consume", calls)
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=errs.append)
            sub = subscribe(rs)
            assert (await sub.next_msg(10)).data == b"1"
            assert (await sub.next_msg(10)).data == b"2"  # answers fc.1 on the first call
            assert calls.replies[0] == ["fc.1"]
            # Reaching the second call's request answers it on that call; that call then
            # ends, and a third (another leader) asks again, in a heartbeat only.
            with pytest.raises(errors.DeadlineExceededError):
                await sub.next_msg(0.1)
            await answered(calls.replies[1], "fc.1")
            await until(lambda: len(calls.replies) == 3, what="a third call")
            await answered(calls.replies[2], "fc.1")
            assert errs == []
            await rs.close()

    run(main())


def test_a_request_of_an_earlier_call_is_answered_on_the_current_one_once_reached():
    """The request came on a call that has ended (its leader may still lead and wait for
    it): reached, it is answered on the current call, without counting as answered there,
    so the current leader's own request with that token is answered too."""

    async def first(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(
            messages=[msg(1)],
            flow_control=pb.FlowControlRequest(token="fc.7"),
            status=LEADERSHIP_CHANGE,
        )

    async def second(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(messages=[msg(2)])
        await answered(replies, "fc.7")
        yield pb.ConsumeResponse(
            messages=[msg(3)], flow_control=pb.FlowControlRequest(token="fc.7")
        )

    async def main() -> None:
        calls = Calls(first, second)
        async with Nodes(1) as (node,):
            node.on("Consume", calls)
            rs = await raftstream.connect([node.addr], timeout=5)
            sub = subscribe(rs)
            await until(lambda: sub.pending == 2, what="both calls' first messages")
            got = [(await sub.next_msg(10)).data for _ in range(3)]
            assert got == [b"1", b"2", b"3"]
            with pytest.raises(errors.DeadlineExceededError):
                await sub.next_msg(0.1)  # reaches the second call's own fc.7
            await answered(calls.replies[1], "fc.7", count=2)
            assert calls.replies[0] == []
            await rs.close()

    run(main())


def test_missed_heartbeats_give_up_the_call_and_attach_elsewhere():
    """The first server hangs (SIGSTOP, a partition with the connection open: it accepts the
    call and sends nothing). After 3 intervals the subscription reports
    ``MissedHeartbeatError`` and opens a new call on another server, which delivers; it
    reported and then waited on the same call for good before."""

    async def hang(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
        await asyncio.Event().wait()
        yield pb.ConsumeResponse()  # pragma: no cover

    async def deliver(replies: list[str]) -> AsyncIterator[pb.ConsumeResponse]:
        yield pb.ConsumeResponse(messages=[msg(1)])

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        async with Nodes(2) as (hung, live):
            hung.on("Consume", hang)
            live.on("Consume", Calls(deliver))
            rs = await raftstream.connect([hung.addr, live.addr], timeout=5, error_cb=errs.append)
            sub = subscribe(rs, heartbeat_ns=NS // 10)
            assert (await sub.next_msg(20)).data == b"1"
            assert any(isinstance(e, errors.MissedHeartbeatError) for e in errs)
            assert len(hung.calls_to("Consume")) >= 1 and len(live.calls_to("Consume")) == 1
            await rs.close()

    run(main())


def hang_first_call(attempts: list[int]) -> Any:
    """A Consume handler that hangs on its first call (a node paused with its connection
    open) and delivers message 1 on the next; ``attempts`` counts the calls."""

    async def handler(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
        attempts.append(1)
        if len(attempts) == 1:
            await asyncio.Event().wait()
        yield pb.ConsumeResponse(messages=[msg(1)])
        await asyncio.Event().wait()

    return handler


def test_a_not_leader_hint_naming_the_node_that_hung_is_followed():
    """The node that missed heartbeats is avoided only by the subscription's own choice: a
    NOT_LEADER hint naming it (it is back, and leads) is followed, and delivery resumes
    there."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        async with Nodes(2) as (back, follower):
            attempts: list[int] = []
            hang_once = hang_first_call(attempts)

            async def refuse(requests: Any, context: Any) -> AsyncIterator[pb.ConsumeResponse]:
                raise errors.NotLeaderError(leader="n1", leader_addr=back.addr)
                yield pb.ConsumeResponse()  # pragma: no cover

            back.on("Consume", hang_once)
            follower.on("Consume", refuse)
            rs = await raftstream.connect(
                [back.addr, follower.addr], timeout=5, error_cb=errs.append
            )
            sub = subscribe(rs, heartbeat_ns=NS // 10)
            assert (await sub.next_msg(20)).data == b"1"
            assert len(attempts) >= 2 and len(follower.calls_to("Consume")) >= 1
            assert any(isinstance(e, errors.MissedHeartbeatError) for e in errs)
            await rs.close()

    run(main())


def test_the_node_that_hung_is_tried_again_once_the_others_failed():
    """The other seed is down and the node that hung is back: avoiding it must not last
    (each other seed is tried once, then the router's choice is taken again)."""

    async def main() -> None:
        errs: list[errors.RaftStreamError] = []
        async with Nodes(2) as (back, dead):
            attempts: list[int] = []
            hang_once = hang_first_call(attempts)

            back.on("Consume", hang_once)
            await dead.stop()
            rs = await raftstream.connect([back.addr, dead.addr], timeout=5, error_cb=errs.append)
            sub = subscribe(rs, heartbeat_ns=NS // 10)
            assert (await sub.next_msg(20)).data == b"1"
            assert len(attempts) == 2
            assert any(isinstance(e, errors.MissedHeartbeatError) for e in errs)
            await rs.close()

    run(main())
