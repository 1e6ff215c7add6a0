"""A call that gRPC's own core fails mid-way ("Internal error from Core") is a broken call.

raftstream/publisher.py: "a leader failover under ``publish_async`` costs time, not errors,
for messages with a ``msg_id``; without one, a message in flight when its call broke fails
with the (retriable) error, outcome unknown". When a node is killed while the client writes
to its ``PublishStream``, grpc.aio fails the call with INTERNAL "Internal error from Core"
(the core's failed send, no status from the server). It mapped to a bare, non-retriable
``RaftStreamError`` (code UNKNOWN), so messages with a msg_id failed instead of going again
(review: 2048 of 60k publishes failed, 1024 of them stored). A status a server sent, even
with the same words, keeps its meaning.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

import raftstream
from raftstream import errors
from raftstream.proto import errors as pe
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.support.fakes import Nodes
from tests.support.polling import until

CORE_TEXT = "Internal error from Core"
# What grpc.aio gives as the debug string of a call its core failed (seen with grpc 1.85
# when a node was killed under a PublishStream write).
CORE_DEBUG = 'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object>,)'


def core_error() -> grpc.aio.AioRpcError:
    """The error grpc.aio raises for a call whose connection broke under a send."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details=CORE_TEXT,
        debug_error_string=CORE_DEBUG,
    )


def test_the_core_failing_a_call_is_a_retriable_broken_connection():
    got = pe.from_rpc_error(core_error())
    assert type(got) is errors.UnavailableError
    assert got.retriable
    assert got.code == errors.Code.UNAVAILABLE
    # The words of the other broken-call path (UNAVAILABLE "Socket closed"): outcome unknown.
    assert got.message == f"the connection to the server broke ({CORE_TEXT})"
    assert got.details["grpc_code"] == "INTERNAL"


class _Aborting(pbg.StreamServiceServicer):
    """Statuses a server sends without raftstream details (a proxy, a bare gRPC server)."""

    async def GetStreamInfo(self, request: Any, context: Any) -> pb.StreamInfo:
        await context.abort(grpc.StatusCode.INTERNAL, CORE_TEXT)
        raise AssertionError("unreachable")

    async def DeleteStream(self, request: Any, context: Any) -> pb.DeleteStreamResponse:
        raise ValueError("a handler bug")  # grpc answers UNKNOWN "Unexpected <class ...>"


def _server_sent() -> list[errors.RaftStreamError]:
    async def main() -> list[errors.RaftStreamError]:
        server = grpc.aio.server()
        pbg.add_StreamServiceServicer_to_server(_Aborting(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        got: list[errors.RaftStreamError] = []
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.StreamServiceStub(ch)
                for call in (
                    stub.GetStreamInfo(pb.StreamInfoRequest(name="x"), timeout=10),
                    stub.DeleteStream(pb.DeleteStreamRequest(name="x"), timeout=10),
                ):
                    try:
                        await call
                    except grpc.aio.AioRpcError as err:
                        got.append(pe.from_rpc_error(err))
        finally:
            await server.stop(None)
        return got

    return asyncio.run(main())


def test_a_server_sent_internal_or_unknown_status_is_not_reclassified():
    """The same words sent by a server are its answer, not a broken connection; nor is a
    handler's UNKNOWN; nor the INTERNAL a raftstream node sends for a bug (with details)."""
    internal, unknown = _server_sent()
    assert type(internal) is errors.RaftStreamError and not internal.retriable
    assert internal.message == CORE_TEXT
    assert internal.details["grpc_code"] == "INTERNAL"
    assert type(unknown) is errors.RaftStreamError and not unknown.retriable
    assert unknown.details["grpc_code"] == "UNKNOWN"
    bug = pe.to_rich_status(KeyError("x"))
    assert bug.code == grpc.StatusCode.INTERNAL.value[0] and bug.details  # has ErrorInfo


class _CoreBreaks:
    """A PublishStream call that forwards its writes, then fails as grpc.aio's core fails a
    call whose connection died: every read raises INTERNAL "Internal error from Core" once
    ``broken`` is set (what was written may have been stored)."""

    def __init__(self, call: Any, broken: asyncio.Event) -> None:
        self._call = call
        self._broken = broken

    async def write(self, request: Any) -> None:
        await self._call.write(request)

    async def initial_metadata(self) -> Any:  # the server accepts the call
        return await self._call.initial_metadata()

    def done(self) -> bool:
        return bool(self._call.done())

    def __aiter__(self) -> _CoreBreaks:
        return self

    async def __anext__(self) -> Any:
        await self._broken.wait()
        self._call.cancel()
        raise core_error()

    def cancel(self) -> bool:
        return bool(self._call.cancel())


def test_publish_async_sends_a_msg_id_again_after_the_core_broke_its_call(
    monkeypatch: pytest.MonkeyPatch,
):
    """The first call breaks in the core with both messages written (and read by the
    server): the one with a msg_id goes again on a new call and is acked; the one without
    fails UNAVAILABLE (it may have been stored), not with an opaque UNKNOWN."""
    broken = asyncio.Event()
    opened = [0]
    real_stub = pbg.PublishServiceStub

    class Stub(real_stub):  # type: ignore[misc,valid-type]
        def __init__(self, channel: Any) -> None:
            super().__init__(channel)
            real_open = self.PublishStream

            def open_call(*args: Any, **kwargs: Any) -> Any:
                opened[0] += 1
                call = real_open(*args, **kwargs)
                return _CoreBreaks(call, broken) if opened[0] == 1 else call

            self.PublishStream = open_call

    monkeypatch.setattr(pbg, "PublishServiceStub", Stub)

    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[bytes] = []

            async def handler(
                requests: AsyncIterator[pb.PublishBatch], ctx: Any
            ) -> AsyncIterator[pb.PublishResultBatch]:
                first_call = len(seen) == 0
                async for batch in requests:
                    seen.extend(r.data for r in batch.requests)
                    if first_call:
                        if len(seen) >= 2:
                            broken.set()  # both read: the client's core fails the call
                        continue
                    yield pb.PublishResultBatch(
                        results=[
                            pb.PublishResult(id=r.id, ack=pb.PubAck(stream="S", seq=9))
                            for r in batch.requests
                        ]
                    )

            node.on("PublishStream", handler)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with_id = await rs.publish_async("s", b"a", msg_id="a-1")
                without = await rs.publish_async("s", b"b")
                assert (await with_id).seq == 9
                with pytest.raises(errors.UnavailableError) as failed:
                    await without
                assert CORE_TEXT in failed.value.message
                await until(lambda: rs.publish_async_pending() == 0, what="settled")
            assert seen.count(b"a") == 2 and seen.count(b"b") == 1
            assert opened[0] == 2

    asyncio.run(main())
