"""publish and publish_async against fake servers.

docs/architecture.md "Publish, end to end" and issue 5 "The SDK core": publish returns a PubAck and
carries msg_id, headers and the expected-* preconditions; publish_async pipelines batches
over PublishStream with one ack per message, correlated by id, with a bounded number pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import raftstream
from raftstream import errors
from raftstream._conn import NotConnectedError
from raftstream._pipeline import Entry, Pipeline
from raftstream.proto import calls
from raftstream.proto import errors as pe
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import Nodes, RpcError
from tests.support.polling import until


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_publish_sends_msg_id_headers_and_every_precondition():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def publish(req: Any, ctx: Any) -> pb.PubAck:
                return pb.PubAck(stream="ORDERS", seq=42, duplicate=bool(req.msg_id))

            node.on("Publish", publish)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                ack = await rs.publish(
                    "orders.1",
                    b"hello",
                    headers={"a": "1"},
                    msg_id="m-1",
                    expected_stream="ORDERS",
                    expected_last_seq=0,
                    expected_last_subject_seq=5,
                    expected_last_subject_seq_subject="orders.*",
                    expected_last_msg_id="m-0",
                    ttl_ns=10**9,
                )
                plain = await rs.publish("orders.2")
            assert (ack.stream, ack.seq, ack.duplicate) == ("ORDERS", 42, True)
            assert not plain.duplicate
            req, bare = (c.request for c in node.calls_to("Publish"))
            assert (req.subject, req.data, dict(req.headers)) == ("orders.1", b"hello", {"a": "1"})
            assert req.msg_id == "m-1" and req.ttl_ns == 10**9
            # expected_last_seq=0 ("the stream is empty") must travel, not read as unset.
            assert req.HasField("expected_last_seq") and req.expected_last_seq == 0
            assert req.expected_stream == "ORDERS" and req.expected_last_subject_seq == 5
            assert req.expected_last_subject_seq_subject == "orders.*"
            assert req.expected_last_msg_id == "m-0"
            for name in ("expected_stream", "expected_last_seq", "expected_last_msg_id"):
                assert not bare.HasField(name)

    run(main())


def test_a_failed_precondition_is_typed_and_not_retried():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def refuse(req: Any, ctx: Any) -> Any:
                raise errors.ExpectedLastSeqError("wrong last sequence: 3", last_seq=3)

            node.on("Publish", refuse)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.ExpectedLastSeqError) as raised:
                    await rs.publish("orders.1", b"", expected_last_seq=1, msg_id="m")
            assert raised.value.details["last_seq"] == "3"
            assert len(node.calls_to("Publish")) == 1

    run(main())


def test_an_ambiguous_failure_is_retried_only_with_a_msg_id():
    """Without msg_id a mid-call UNAVAILABLE may hide a stored message: it is raised. With
    msg_id the duplicate window makes the retry safe, so the SDK retries."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            fail_next = [True]

            async def flaky(req: Any, ctx: Any) -> pb.PubAck:
                if fail_next[0]:
                    fail_next[0] = False
                    raise errors.UnavailableError("connection reset")
                return pb.PubAck(stream="S", seq=1)

            node.on("Publish", flaky)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.UnavailableError):
                    await rs.publish("a", b"1")
                fail_next[0] = True
                ack = await rs.publish("a", b"2", msg_id="id-2")
            assert ack.seq == 1
            assert [c.request.data for c in node.calls_to("Publish")] == [b"1", b"2", b"2"]

    run(main())


class PipelineServer:
    """A PublishStream that records every batch and, once released, answers everything
    received (held until then), in reverse order."""

    def __init__(self) -> None:
        self.batches: list[list[pb.PublishRequest]] = []
        self.received: list[pb.PublishRequest] = []
        self.held = True
        self.answer_error: dict[int, errors.RaftStreamError] = {}
        self.refusals_left: dict[int, int] = {}  # answer_error this many times, then ack
        self._wake: asyncio.Queue[bool] = asyncio.Queue()

    def release(self) -> None:
        self.held = False
        self._wake.put_nowait(True)

    async def _pump(self, requests: AsyncIterator[pb.PublishBatch]) -> None:
        async for batch in requests:
            self.batches.append(list(batch.requests))
            self.received.extend(batch.requests)
            self._wake.put_nowait(True)
        self._wake.put_nowait(False)

    async def handler(
        self, requests: AsyncIterator[pb.PublishBatch], ctx: Any
    ) -> AsyncIterator[pb.PublishResultBatch]:
        pump = asyncio.ensure_future(self._pump(requests))
        try:
            while await self._wake.get():
                if not self.held and self.received:
                    reqs, self.received = self.received, []
                    yield self._answer(reqs)
        finally:
            pump.cancel()

    def _answer(self, reqs: list[pb.PublishRequest]) -> pb.PublishResultBatch:
        out = pb.PublishResultBatch()
        for req in reversed(reqs):  # answered out of order: correlation is by id only
            seq = int(req.data.decode())
            err = self.answer_error.get(seq)
            if err is not None and seq in self.refusals_left:
                self.refusals_left[seq] -= 1
                if self.refusals_left[seq] < 0:
                    err = None
            if err is not None:
                out.results.add(id=req.id, error=pe.to_error_message(err))
            else:
                out.results.add(id=req.id, ack=pb.PubAck(stream="S", seq=seq))
        return out


def test_publish_async_pipelines_and_correlates_acks_by_id():
    """Many messages are in flight before the first ack; each future gets its own ack even
    when the server answers a batch in reverse order."""
    count = 50

    async def main() -> None:
        async with Nodes(1) as (node,):
            server = PipelineServer()
            node.on("PublishStream", server.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                futures = [await rs.publish_async("s", str(i).encode()) for i in range(count)]
                await until(lambda: len(server.received) == count, what="all sent")
                assert rs.publish_async_pending() == count
                server.release()
                futures.append(await rs.publish_async("s", str(count).encode()))
                await rs.publish_async_completed()
                acks = [await f for f in futures]
            assert [a.seq for a in acks] == list(range(count + 1))
            ids = [r.id for b in server.batches for r in b]
            assert len(set(ids)) == len(ids) == count + 1

    run(main())


def test_a_stalled_publish_async_names_the_outage_it_waits_out():
    """The window stays full while the stream has no leader (its messages are sent again
    after each NO_LEADER): the stall's LimitError says so, not only "4 publishes pending"
    (a user review read an outage as a limit)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            server = PipelineServer()
            for seq in range(4):
                server.answer_error[seq] = errors.NoLeaderError("stream 'S' has no leader yet")
                server.refusals_left[seq] = 10_000
            server.release()
            node.on("PublishStream", server.handler)
            rs = await raftstream.connect([node.addr], timeout=5, publish_async_pending_msgs_max=4)
            async with rs:
                for i in range(4):
                    await rs.publish_async("s", str(i).encode())
                await until(lambda: len(server.batches) > 4, what="refused and sent again")
                with pytest.raises(errors.LimitError) as err:
                    await rs.publish_async("s", b"99", wait_stall=0.05)
                assert "NO_LEADER: stream 'S' has no leader yet" in str(err.value)
                assert err.value.details["cause"] == "NO_LEADER"
                for seq in range(4):
                    server.refusals_left[seq] = 0  # a leader again: the next resend is acked
                await rs.publish_async_completed()

    run(main())


def test_publish_async_pending_is_bounded():
    """With publish_async_pending_msgs_max unanswered, the next publish_async waits for room
    and, after wait_stall, raises LimitError without sending anything."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            server = PipelineServer()
            node.on("PublishStream", server.handler)
            rs = await raftstream.connect([node.addr], timeout=5, publish_async_pending_msgs_max=4)
            async with rs:
                futures = [await rs.publish_async("s", str(i).encode()) for i in range(4)]
                with pytest.raises(errors.LimitError):
                    await rs.publish_async("s", b"99", wait_stall=0.05)
                await until(lambda: len(server.received) == 4, what="4 sent")
                # Room comes only from answers: this one waits while the server holds them.
                waiting = asyncio.ensure_future(rs.publish_async("s", b"4"))
                for _ in range(20):
                    await asyncio.sleep(0)
                assert not waiting.done()
                assert rs.publish_async_pending() == 4
                server.release()
                futures.append(await waiting)
                await rs.publish_async_completed()
                assert sorted([(await f).seq for f in futures]) == [0, 1, 2, 3, 4]
            sent = [int(r.data) for b in server.batches for r in b]
            assert sorted(sent) == [0, 1, 2, 3, 4]

    run(main())


def test_publish_async_sends_a_refusal_again_on_the_stream_until_it_is_stored():
    """NOT_LEADER/NO_LEADER: nothing was applied, so the message goes again on the stream
    (the node relays it to the leader it has learned meanwhile), after a wait that grows;
    not as a unary call per message, which after a failover meant thousands of them."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            server = PipelineServer()
            server.release()
            server.answer_error[1] = errors.NotLeaderError(leader="n2", leader_addr="")
            server.refusals_left[1] = 2
            node.on("PublishStream", server.handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                f0 = await rs.publish_async("s", b"0")
                f1 = await rs.publish_async("s", b"1")
                assert (await f0).seq == 0
                assert (await f1).seq == 1
            sent = [r.data for b in server.batches for r in b]
            assert sent.count(b"1") == 3 and sent.count(b"0") == 1
            assert node.calls_to("Publish") == []

    run(main())


def test_publish_async_fails_with_the_last_refusal_when_its_time_is_spent():
    async def main() -> None:
        async with Nodes(1) as (node,):
            server = PipelineServer()
            server.release()
            server.answer_error[1] = errors.NoLeaderError("stream S has no leader")
            node.on("PublishStream", server.handler)
            async with await raftstream.connect([node.addr], timeout=0.5) as rs:
                f1 = await rs.publish_async("s", b"1")
                with pytest.raises(errors.NoLeaderError):
                    await f1
                assert rs.publish_async_pending() == 0
            sent = [r.data for b in server.batches for r in b]
            assert len(sent) >= 3  # sent again while there was time

    run(main())


def test_a_broken_stream_sends_again_what_is_safe_and_fails_the_rest():
    """The call breaks with messages in flight: one with a msg_id goes again on a new call
    (the duplicate window makes it safe), one without fails (it may have been stored)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            calls = [0]
            seen: list[bytes] = []

            async def handler(
                requests: AsyncIterator[pb.PublishBatch], ctx: Any
            ) -> AsyncIterator[pb.PublishResultBatch]:
                calls[0] += 1
                first_call = calls[0] == 1
                got = 0
                async for batch in requests:
                    seen.extend(r.data for r in batch.requests)
                    got += len(batch.requests)
                    if first_call:
                        if got >= 2:  # both read: the call breaks, unanswered
                            raise errors.UnavailableError("node shutting down")
                        continue
                    yield _acked(batch, 9)

            node.on("PublishStream", handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with_id = await rs.publish_async("s", b"a", msg_id="a-1")
                without = await rs.publish_async("s", b"b")
                assert (await with_id).seq == 9
                with pytest.raises(errors.UnavailableError):
                    await without
            assert seen.count(b"a") == 2 and seen.count(b"b") == 1
            assert calls[0] == 2

    run(main())


def test_publish_async_futures_fail_typed_when_the_stream_breaks():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def broken(
                requests: AsyncIterator[pb.PublishBatch], ctx: Any
            ) -> AsyncIterator[pb.PublishResultBatch]:
                async for batch in requests:
                    first = batch.requests[0]
                    yield pb.PublishResultBatch(
                        results=[pb.PublishResult(id=first.id, ack=pb.PubAck(stream="S", seq=1))]
                    )
                    raise errors.DataLossError("store checksum mismatch")

            node.on("PublishStream", broken)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                futures = [await rs.publish_async("s", b"x") for _ in range(3)]
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                assert rs.publish_async_pending() == 0
            # The first batch may hold one to three messages; the first of it was acked and
            # every other one failed with the stream's error.
            assert isinstance(outcomes[0], raftstream.PubAck)
            assert all(isinstance(o, errors.DataLossError) for o in outcomes[1:])

    run(main())


def test_after_the_stream_breaks_the_next_publish_async_opens_a_new_one():
    async def main() -> None:
        async with Nodes(1) as (node,):
            opened = [0]

            async def handler(
                requests: AsyncIterator[pb.PublishBatch], ctx: Any
            ) -> AsyncIterator[pb.PublishResultBatch]:
                opened[0] += 1
                async for batch in requests:
                    if opened[0] == 1:  # breaks once it has the publish: outcome unknown
                        raise errors.UnavailableError("node shutting down")
                    yield _acked(batch, 7)

            node.on("PublishStream", handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.UnavailableError):
                    await (await rs.publish_async("s", b"lost"))
                ack = await (await rs.publish_async("s", b"kept"))
            assert ack.seq == 7
            assert opened[0] == 2

    run(main())


def _acked(batch: pb.PublishBatch, seq: int) -> pb.PublishResultBatch:
    """Every request of ``batch`` acked as stream S's ``seq``."""
    return pb.PublishResultBatch(
        results=[
            pb.PublishResult(id=r.id, ack=pb.PubAck(stream="S", seq=seq)) for r in batch.requests
        ]
    )


class _NeverConnectedCall:
    """A stream call gRPC could not start: its reads fail "failed to connect to all
    addresses" (nothing it was given was sent)."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    async def write(self, request: Any) -> None:
        self.written.append(request)

    async def initial_metadata(self) -> Any:  # never: as from a server that sends none
        await asyncio.Event().wait()

    def done(self) -> bool:
        return False

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0.01)
        raise RpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")

    def cancel(self) -> bool:
        return True


def test_a_pipeline_whose_call_never_connected_fails_its_entries_as_not_sent(
    monkeypatch: pytest.MonkeyPatch,
):
    """Written or not, nothing of such a call reached a server: the entries fail with
    NotConnectedError, which the publisher takes as safe to send again. (Written: the
    pipeline writes once ``ACCEPT_WAIT_S`` passed without the server accepting the call.)"""
    monkeypatch.setattr(calls, "ACCEPT_WAIT_S", 0.001)

    async def main() -> None:
        failed: list[tuple[Entry, errors.RaftStreamError]] = []
        pipe = Pipeline(
            _NeverConnectedCall(),
            batch_of=lambda items: pb.PublishBatch(requests=items),
            results_of=lambda batch: [],
            on_result=lambda entry, result: None,
            on_failed=lambda entry, exc: failed.append((entry, exc)),
            on_orphan=lambda result: None,
            queue_msgs_max=8,
            batch_msgs_max=8,
            batch_bytes_max=1 << 20,
            result_timeout_s=5,
            name="t",
            addr="127.0.0.1:1",
        )
        loop = asyncio.get_running_loop()
        entries = [
            Entry(
                request=pb.PublishRequest(subject="s"),
                size_bytes=1,
                expects_result=True,
                future=loop.create_future(),
            )
            for _ in range(2)
        ]
        for entry in entries:
            pipe.submit(entry)
        await until(lambda: len(failed) == 2, what="both failed")
        assert all(isinstance(exc, NotConnectedError) for _, exc in failed)
        assert all(entry.written for entry, _ in failed)  # written, and still not sent
        await pipe.close()

    run(main())
