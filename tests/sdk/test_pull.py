"""pull_subscribe, fetch and acks against fake servers.

Issue 5 "The SDK core" and the consumer issue's pull statuses (engine/consumer_pull.py):
a fetch returns messages; 100 Idle Heartbeat is never surfaced; 404/408 end the request
(an empty fetch raises a timeout, as JetStream clients do); 409 raises when nothing came.
Messages carry ack, ack_sync, nak(delay), in_progress, term(reason) and metadata parsed
from the ack token (ADR-15).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import raftstream
from raftstream import errors
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import AckRecorder, FakeNode, Nodes, ack_token, consumer_info_pb
from tests.support.polling import until

NS = 1_000_000_000


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def msg(seq: int) -> pb.Msg:
    return pb.Msg(subject=f"orders.{seq}", seq=seq, data=b"d%d" % seq, reply=ack_token(seq))


def status(code: int, description: str) -> pb.FetchResponse:
    return pb.FetchResponse(status=pb.PullStatus(code=code, description=description))


def serve_fetch(
    node: FakeNode, *responses: pb.FetchResponse, now: tuple[pb.FetchResponse, ...] = ()
) -> None:
    """Serve a waiting request ``responses``; a no_wait one (a fetch's first request for
    more than one message) ``now``, else 404 (nothing there yet), as a node would."""

    async def fetch(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
        for resp in (now or (status(404, "No Messages"),)) if req.no_wait else responses:
            yield resp

    node.on("Fetch", fetch)


async def bound(rs: Any) -> Any:
    """A PullSubscription on ORDERS/C without a lookup (stream given, consumer exists)."""
    return rs._pull_subscription("ORDERS", "C")


def test_fetch_returns_messages_skipping_heartbeats_and_sends_the_request():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(
                node,
                status(100, "Idle Heartbeat"),
                pb.FetchResponse(messages=[msg(1), msg(2)]),
                status(100, "Idle Heartbeat"),
                pb.FetchResponse(messages=[msg(3)], status=pb.PullStatus(code=408)),
            )
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await bound(rs)
                got = await sub.fetch(10, timeout=2.0, heartbeat=0.5)
            assert [m.subject for m in got] == ["orders.1", "orders.2", "orders.3"]
            assert got[1].data == b"d2"
            meta = got[1].metadata
            assert (meta.stream, meta.consumer, meta.stream_seq, meta.consumer_seq) == (
                "ORDERS",
                "C",
                2,
                2,
            )
            assert meta.account == "$G" and meta.domain is None
            first, req = (c.request for c in node.calls_to("Fetch"))
            # First what is there now (nothing), then a request that waits.
            assert (first.batch, first.no_wait, first.expires_ns, first.idle_heartbeat_ns) == (
                10,
                True,
                0,
                0,
            )
            assert (req.stream, req.consumer, req.batch, req.no_wait) == ("ORDERS", "C", 10, False)
            assert req.idle_heartbeat_ns == NS // 2
            # The server must end the request (408) before the RPC deadline does.
            assert 0 < req.expires_ns < 2 * NS

    run(main())


@pytest.mark.parametrize("code", [404, 408])
def test_an_empty_fetch_raises_a_timeout(code: int):
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(node, status(code, "No Messages" if code == 404 else "Request Timeout"))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.DeadlineExceededError):
                    await (await bound(rs)).fetch(5, timeout=1.0)
                with pytest.raises(TimeoutError):  # as nats.py's fetch timeout is
                    await (await bound(rs)).fetch(5, timeout=1.0)
            # A status is an answer, so no retry: each fetch is its no_wait request, then
            # the request that waited.
            assert [c.request.no_wait for c in node.calls_to("Fetch")] == [True, False] * 2

    run(main())


def test_messages_there_now_are_returned_at_once_without_a_request_that_waits():
    """pull.py "What a fetch waits for": a fetch of 10 with 3 messages there gets those 3
    from its no_wait request (ended by 408) and returns; it makes no request that waits."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            there = pb.FetchResponse(messages=[msg(1), msg(2), msg(3)])
            serve_fetch(node, status(408, "never asked"), now=(there, status(408, "partial")))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(10, timeout=30.0)
            assert [m.metadata.stream_seq for m in got] == [1, 2, 3]
            assert [c.request.no_wait for c in node.calls_to("Fetch")] == [True]

    run(main())


def test_a_fetch_of_one_message_makes_only_the_request_that_waits():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(node, pb.FetchResponse(messages=[msg(1)]))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(1, timeout=2.0)
            assert [m.metadata.stream_seq for m in got] == [1]
            (req,) = (c.request for c in node.calls_to("Fetch"))
            assert (req.batch, req.no_wait) == (1, False)
            assert 0 < req.expires_ns < 2 * NS

    run(main())


def test_a_409_raises_conflict_when_nothing_came_and_returns_messages_otherwise():
    async def main() -> None:
        async with Nodes(2) as (a, b):
            serve_fetch(a, status(409, "Consumer Deleted"))
            serve_fetch(b, pb.FetchResponse(messages=[msg(7)]), status(409, "Leadership Change"))
            async with await raftstream.connect([a.addr], timeout=5) as rs:
                with pytest.raises(errors.ConflictError) as raised:
                    await (await bound(rs)).fetch(5, timeout=1.0)
            assert raised.value.details["status"] == 409
            assert raised.value.details["description"] == "Consumer Deleted"
            async with await raftstream.connect([b.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(5, timeout=1.0)
            assert [m.metadata.stream_seq for m in got] == [7]

    run(main())


def test_fetch_follows_a_not_leader_hint_before_the_first_message():
    async def main() -> None:
        async with Nodes(2) as (follower, leader):

            async def refuse(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
                raise errors.NotLeaderError(leader="n2", leader_addr=leader.addr)
                yield pb.FetchResponse()  # pragma: no cover - makes this a generator

            follower.on("Fetch", refuse)
            serve_fetch(leader, pb.FetchResponse(messages=[msg(1)]))
            async with await raftstream.connect([follower.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(1, timeout=2.0)
            assert [m.metadata.stream_seq for m in got] == [1]
            assert len(leader.calls_to("Fetch")) == 1

    run(main())


def test_messages_received_before_a_failure_are_returned():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def fail_midway(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
                yield pb.FetchResponse(messages=[msg(1), msg(2)])
                raise errors.NoLeaderError("leader lost")

            node.on("Fetch", fail_midway)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(5, timeout=2.0)
            assert [m.metadata.stream_seq for m in got] == [1, 2]
            assert len(node.calls_to("Fetch")) == 1  # not retried: messages were delivered

    run(main())


def test_ack_kinds_travel_with_their_arguments_and_terminal_acks_happen_once():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(node, pb.FetchResponse(messages=[msg(i) for i in range(1, 6)]))
            recorder = AckRecorder()
            node.on("AckStream", recorder.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                m1, m2, m3, m4, m5 = await (await bound(rs)).fetch(5, timeout=2.0)
                await m1.ack()
                await m1.ack()  # ignored: already acked
                await m1.nak()  # ignored too
                await m2.nak(1.5)
                await m3.in_progress()
                await m3.in_progress()
                await m3.term("poison")
                await m4.term()
                await until(lambda: len(recorder.items) == 6, what="6 acks sent")
            got = [(a.reply, a.kind, a.delay_ns, a.reason, a.sync) for a in recorder.items]
            # m1's +ACK went as a run's sequence (proto AckRun), which a batch does not
            # order against its items: once, anywhere.
            assert got.count((m1.reply, pb.ACK_KIND_ACK, 0, "", False)) == 1
            assert [a for a in got if a[0] != m1.reply] == [
                (m2.reply, pb.ACK_KIND_NAK, int(1.5 * NS), "", False),
                (m3.reply, pb.ACK_KIND_PROGRESS, 0, "", False),
                (m3.reply, pb.ACK_KIND_PROGRESS, 0, "", False),
                (m3.reply, pb.ACK_KIND_TERM, 0, "poison", False),
                (m4.reply, pb.ACK_KIND_TERM, 0, "", False),
            ]
            assert m1.acked and m3.acked and not m5.acked

    run(main())


def test_ack_sync_waits_for_the_server_and_raises_its_error():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(node, pb.FetchResponse(messages=[msg(1), msg(2)]))

            async def ack(req: Any, ctx: Any) -> pb.AckResponse:
                if req.ack.reply == ack_token(2):
                    raise errors.NotFoundError("consumer C not found")
                return pb.AckResponse()

            node.on("Ack", ack)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                m1, m2 = await (await bound(rs)).fetch(2, timeout=2.0)
                await m1.ack_sync()
                with pytest.raises(errors.NotFoundError):
                    await m2.ack_sync()
                assert m1.acked and not m2.acked
            sent = [c.request.ack for c in node.calls_to("Ack")]
            assert [(a.reply, a.kind, a.sync) for a in sent] == [
                (m1.reply, pb.ACK_KIND_ACK, True),
                (m2.reply, pb.ACK_KIND_ACK, True),
            ]

    run(main())


def test_a_failed_fire_and_forget_ack_reaches_the_error_callback():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_fetch(node, pb.FetchResponse(messages=[msg(1), msg(2)]))
            recorder = AckRecorder()
            recorder.fail[ack_token(2)] = errors.NotFoundError("consumer C not found")
            node.on("AckStream", recorder.handler)
            reported: list[errors.RaftStreamError] = []
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=reported.append)
            async with rs:
                m1, m2 = await (await bound(rs)).fetch(2, timeout=2.0)
                await m1.ack()
                await m2.ack()
                await until(lambda: bool(reported), what="error reported")
            assert len(reported) == 1 and isinstance(reported[0], errors.NotFoundError)

    run(main())


def test_pull_subscribe_finds_the_stream_and_creates_a_durable_pull_consumer():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def names(req: Any, ctx: Any) -> pb.StreamNamesResponse:
                found = ["ORDERS"] if req.subject == "orders.new" else []
                return pb.StreamNamesResponse(names=found, page=pb.Page(total=len(found)))

            async def info(req: Any, ctx: Any) -> Any:
                raise errors.NotFoundError(f"consumer {req.consumer} not found")

            async def create(req: Any, ctx: Any) -> pb.ConsumerInfo:
                return consumer_info_pb(req.stream, "worker", json.loads(req.config_json))

            node.on("StreamNames", names)
            node.on("GetConsumerInfo", info)
            node.on("CreateConsumer", create)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await rs.pull_subscribe("orders.new", "worker")
                assert (sub.stream, sub.consumer) == ("ORDERS", "worker")
                with pytest.raises(errors.NotFoundError, match="no stream matches"):
                    await rs.pull_subscribe("nowhere", "worker")
            created = json.loads(node.calls_to("CreateConsumer")[0].request.config_json)
            assert created["durable_name"] == "worker"
            assert created["filter_subject"] == "orders.new"
            assert created["ack_policy"] == "explicit"

    run(main())


def test_pull_subscribe_refuses_a_push_consumer_and_non_explicit_acks():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def info(req: Any, ctx: Any) -> pb.ConsumerInfo:
                return consumer_info_pb("ORDERS", "pusher", {"deliver_subject": "push.x"})

            node.on("GetConsumerInfo", info)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.InvalidArgumentError, match="push consumer"):
                    await rs.pull_subscribe("orders.x", "pusher", stream="ORDERS")
                cfg = raftstream.ConsumerConfig(ack_policy="none")
                with pytest.raises(errors.InvalidArgumentError) as raised:
                    await rs.pull_subscribe("orders.x", "w", stream="ORDERS", config=cfg)
                assert raised.value.field == "ack_policy"
            assert node.calls_to("CreateConsumer") == []

    run(main())


def test_a_fetch_whose_heartbeats_stop_is_abandoned_with_unavailable():
    """With a heartbeat, silence for twice the interval means the server is gone: the
    request is abandoned (and retried while time is left), never left hanging."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            silence = asyncio.Event()  # never set: the server says nothing until cancelled

            async def silent(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
                await silence.wait()
                yield pb.FetchResponse()

            node.on("Fetch", silent)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                # The last retry may end on the caller's deadline rather than on silence.
                with pytest.raises((errors.UnavailableError, errors.DeadlineExceededError)):
                    await (await bound(rs)).fetch(1, timeout=1.0, heartbeat=0.1)
            # Abandoned and retried: a request left hanging would be the only call.
            assert len(node.calls_to("Fetch")) >= 2

    run(main())


class FetchSequence:
    """A Fetch handler serving each call its own list of messages (1-based seqs), then,
    when the list is shorter than the batch, ending a no_wait call (404 or 408, as the
    server does) and holding any other open until cancelled (as the server does while it
    waits for messages); a call whose batch is complete ends."""

    def __init__(self, *batches: list[int]) -> None:
        self.batches = list(batches)
        self.requests: list[pb.FetchRequest] = []
        self.ended = 0  # calls that ended: completed, or cancelled by the client

    async def handler(self, req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
        self.requests.append(req)
        seqs = self.batches.pop(0) if self.batches else []
        try:
            if seqs:
                yield pb.FetchResponse(messages=[msg(s) for s in seqs])
            if len(seqs) < req.batch:
                if req.no_wait:
                    yield status(408, "Request Timeout") if seqs else status(404, "No Messages")
                    return
                await asyncio.Event().wait()  # until the client cancels the call
        finally:
            self.ended += 1


def test_prefetch_leaves_the_next_request_outstanding_and_the_next_fetch_takes_it():
    """pull.py "Prefetch": one request ahead, same batch, taken first by the next fetch."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            fetches = FetchSequence([1, 2], [3, 4], [5, 6])
            node.on("Fetch", fetches.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await bound(rs)
                first = await sub.fetch(2, timeout=2.0, prefetch=True)
                await until(lambda: len(fetches.requests) == 2, what="prefetch sent")
                second = await sub.fetch(2, timeout=2.0)  # no prefetch: nothing new is asked
                await asyncio.sleep(0.05)
                assert len(fetches.requests) == 2
                third = await sub.fetch(2, timeout=2.0)
            got = [[m.metadata.stream_seq for m in b] for b in (first, second, third)]
            assert got == [[1, 2], [3, 4], [5, 6]]
            assert [r.batch for r in fetches.requests] == [2, 2, 2]
            # Each asks for what is there (the prefetch too), as a fetch's first request.
            assert [r.no_wait for r in fetches.requests] == [True, True, True]

    run(main())


def test_a_smaller_fetch_takes_part_of_the_prefetched_batch_and_the_rest_comes_next():
    async def main() -> None:
        async with Nodes(1) as (node,):
            fetches = FetchSequence([1, 2, 3], [4, 5, 6])
            node.on("Fetch", fetches.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await bound(rs)
                await sub.fetch(3, timeout=2.0, prefetch=True)
                await until(lambda: len(fetches.requests) == 2, what="prefetch sent")
                part = await sub.fetch(2, timeout=2.0, prefetch=True)
                # Messages of the prefetched request are still held: no new request yet.
                assert len(fetches.requests) == 2
                rest = await sub.fetch(2, timeout=2.0)
            assert [m.metadata.stream_seq for m in part] == [4, 5]
            assert [m.metadata.stream_seq for m in rest] == [6]

    run(main())


def test_cancel_prefetch_ends_the_request_and_naks_what_no_fetch_returned():
    """pull.py "Prefetch": messages a prefetch brought are redelivered at once, not after
    their ack wait, when the caller stops."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            fetches = FetchSequence([1, 2], [3])  # the prefetch gets 3, and ends (no_wait)
            node.on("Fetch", fetches.handler)
            recorder = AckRecorder()
            node.on("AckStream", recorder.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await bound(rs)
                await sub.fetch(2, timeout=5.0, prefetch=True)
                await until(lambda: len(fetches.requests) == 2, what="prefetch sent")
                await asyncio.sleep(0.1)  # message 3 arrives on the outstanding request
                await sub.cancel_prefetch()
                await until(lambda: len(recorder.items) == 1, what="nak sent")
                await until(lambda: fetches.ended == 2, what="request ended")
                # Nothing is left over: a later fetch makes its own request.
                fetches.batches.append([4, 5])
                again = await sub.fetch(2, timeout=2.0)
            assert [(a.reply, a.kind) for a in recorder.items] == [(ack_token(3), pb.ACK_KIND_NAK)]
            assert [m.metadata.stream_seq for m in again] == [4, 5]

    run(main())


def test_a_prefetch_that_brought_nothing_leaves_the_next_fetch_its_own_request():
    async def main() -> None:
        async with Nodes(1) as (node,):
            calls: list[int] = []

            async def fetch(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
                calls.append(req.batch)
                if len(calls) == 2:  # the prefetch: nothing, then the request expires
                    yield status(408, "Request Timeout")
                else:
                    yield pb.FetchResponse(messages=[msg(len(calls))])

            node.on("Fetch", fetch)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await bound(rs)
                await sub.fetch(1, timeout=2.0, prefetch=True)
                await until(lambda: len(calls) == 2, what="prefetch sent")
                got = await sub.fetch(1, timeout=2.0)
            assert [m.metadata.stream_seq for m in got] == [3]
            assert calls == [1, 1, 1]

    run(main())


def test_a_fetch_longer_than_one_request_may_wait_is_a_series_of_requests(
    monkeypatch: pytest.MonkeyPatch,
):
    """A node refuses a pull expiry above its call cap (limits.call_timeout_max_ms), so a
    long fetch asks again and again, each request within the cap, until a message comes."""
    monkeypatch.setattr("raftstream.pull.REQUEST_WAIT_MAX_S", 0.3)

    async def main() -> None:
        async with Nodes(1) as (node,):
            requests: list[Any] = []

            async def fetch(req: Any, ctx: Any) -> AsyncIterator[pb.FetchResponse]:
                requests.append(req)
                if len(requests) == 1:
                    await asyncio.sleep(req.expires_ns / NS / 2)
                    yield status(408, "Request Timeout")
                elif len(requests) == 2:
                    await asyncio.sleep(1)  # no answer: the request's deadline ends it
                else:
                    yield pb.FetchResponse(messages=[msg(1)])

            node.on("Fetch", fetch)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                got = await (await bound(rs)).fetch(1, timeout=10)
            assert [m.metadata.stream_seq for m in got] == [1]
            assert len(requests) == 3
            assert all(0 < r.expires_ns <= 0.3 * NS for r in requests)

    run(main())


def _subscribe_node(node: FakeNode, *, missing: bool = False) -> None:
    """ORDERS captures orders.new; CreateConsumer answers with the config it got (an
    ephemeral gets the name "eph1"); DeleteConsumer answers NOT_FOUND when ``missing``."""

    async def names(req: Any, ctx: Any) -> pb.StreamNamesResponse:
        return pb.StreamNamesResponse(names=["ORDERS"], page=pb.Page(total=1))

    async def info(req: Any, ctx: Any) -> Any:
        raise errors.NotFoundError(f"consumer {req.consumer} not found")

    async def create(req: Any, ctx: Any) -> pb.ConsumerInfo:
        cfg = json.loads(req.config_json)
        return consumer_info_pb(req.stream, cfg.get("durable_name") or "eph1", cfg)

    async def delete(req: Any, ctx: Any) -> pb.DeleteConsumerResponse:
        if missing:
            raise errors.NotFoundError(f"consumer {req.consumer} not found")
        return pb.DeleteConsumerResponse()

    node.on("StreamNames", names)
    node.on("GetConsumerInfo", info)
    node.on("CreateConsumer", create)
    node.on("DeleteConsumer", delete)


def test_unsubscribe_deletes_the_ephemeral_consumer_it_created_and_closes():
    async def main() -> None:
        async with Nodes(1) as (node,):
            _subscribe_node(node)
            fetches = FetchSequence([1], [2])
            node.on("Fetch", fetches.handler)
            recorder = AckRecorder()
            node.on("AckStream", recorder.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = await rs.pull_subscribe("orders.new")
                assert sub.consumer == "eph1"
                await sub.fetch(1, timeout=5.0, prefetch=True)
                await until(lambda: len(fetches.requests) == 2, what="prefetch sent")
                await asyncio.sleep(0.1)  # message 2 arrives on the outstanding request
                await sub.unsubscribe()
                await sub.unsubscribe()  # idempotent: one delete
                with pytest.raises(errors.SubscriptionClosedError):
                    await sub.fetch(1, timeout=1.0)
                await until(lambda: len(recorder.items) == 1, what="nak sent")
            deletes = [
                (c.request.stream, c.request.consumer) for c in node.calls_to("DeleteConsumer")
            ]
            assert deletes == [("ORDERS", "eph1")]
            # What the prefetch brought goes back at once, as with cancel_prefetch.
            assert [(a.reply, a.kind) for a in recorder.items] == [(ack_token(2), pb.ACK_KIND_NAK)]

    run(main())


def test_unsubscribe_keeps_a_durable_and_a_consumer_already_gone_is_no_error():
    async def main() -> None:
        async with Nodes(1) as (node,):
            _subscribe_node(node, missing=True)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                durable = await rs.pull_subscribe("orders.new", "worker")
                await durable.unsubscribe()  # created here, but others may share it
                assert node.calls_to("DeleteConsumer") == []
                with pytest.raises(errors.SubscriptionClosedError):
                    await durable.fetch(1, timeout=1.0)
                ephemeral = await rs.pull_subscribe("orders.new")
                await ephemeral.unsubscribe()  # NOT_FOUND: removed meanwhile (inactivity)
            assert len(node.calls_to("DeleteConsumer")) == 1

    run(main())
