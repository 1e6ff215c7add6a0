"""raftstream.proto.errors: every error class survives the trip through a real gRPC status.

docs/cluster-design.md "Errors": the one hierarchy maps to gRPC codes in one place, with
grpcio-status ErrorInfo details (domain ``raftstream``, ``reason``, metadata ``field``,
``rule``, ``leader``, ``leader_addr``); the client rebuilds the typed exception from the
details, never from the message text.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from raftstream import errors as e
from raftstream.proto import errors as pe
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

ERROR_CLASSES = sorted(
    (
        getattr(e, name)
        for name in e.__all__
        if isinstance(getattr(e, name), type) and issubclass(getattr(e, name), e.RaftStreamError)
    ),
    key=lambda c: c.__name__,
)


def make_error(cls: type[e.RaftStreamError]) -> e.RaftStreamError:
    """One instance of ``cls`` with every structured detail it can carry."""
    if issubclass(cls, e.InvalidArgumentError):
        return cls("max_age", "must not be negative", "max_age: must not be negative (ns)")
    if issubclass(cls, e.NotLeaderError):
        return cls("not the stream leader", leader="n2", leader_addr="127.0.0.1:7102")
    return cls(f"boom from {cls.__name__}", stream="ORDERS")


class RaisingStreams(pbg.StreamServiceServicer):
    """DeleteStream raises what ``make`` returns for the requested name; GetStreamInfo aborts
    with a plain status (no raftstream details), as a proxy or a bare grpc server would."""

    def __init__(self, raises: dict[str, Callable[[], BaseException]]) -> None:
        self.raises = raises

    @pe.map_errors
    async def DeleteStream(self, request: Any, context: Any) -> pb.DeleteStreamResponse:
        raise self.raises[request.name]()

    async def GetStreamInfo(self, request: Any, context: Any) -> pb.StreamInfo:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "connection to peer lost")
        raise AssertionError("unreachable")

    async def PurgeStream(self, request: Any, context: Any) -> pb.PurgeStreamResponse:
        try:
            raise self.raises[request.name]()
        except BaseException as exc:
            await pe.abort(context, exc)


class RaisingConsume(pbg.ConsumeServiceServicer):
    """Fetch yields one message, then raises NotLeaderError mid-stream."""

    @pe.map_errors
    async def Fetch(self, request: Any, context: Any) -> AsyncIterator[pb.FetchResponse]:
        yield pb.FetchResponse(messages=[pb.Msg(subject="a", seq=1)])
        raise e.NotLeaderError(leader="n3", leader_addr="127.0.0.1:7103")


@asynccontextmanager
async def serve(raises: dict[str, Callable[[], BaseException]]) -> AsyncIterator[str]:
    server = grpc.aio.server()
    pbg.add_StreamServiceServicer_to_server(RaisingStreams(raises), server)
    pbg.add_ConsumeServiceServicer_to_server(RaisingConsume(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def call_delete(addr: str, name: str) -> e.RaftStreamError:
    async with grpc.aio.insecure_channel(addr) as channel:
        stub = pbg.StreamServiceStub(channel)
        try:
            await stub.DeleteStream(pb.DeleteStreamRequest(name=name), timeout=10)
        except grpc.aio.AioRpcError as err:
            return pe.from_rpc_error(err)
    raise AssertionError("the call succeeded")


def assert_same(got: e.RaftStreamError, sent: e.RaftStreamError) -> None:
    assert type(got) is type(sent)
    assert got.code == sent.code
    assert got.retriable == sent.retriable
    assert got.message == sent.message
    for key, value in sent.details.items():
        if value is not None:
            assert got.details[key] == str(value)
    if isinstance(sent, e.InvalidArgumentError):
        assert isinstance(got, e.InvalidArgumentError)
        assert (got.field, got.rule) == (sent.field, sent.rule)
    if isinstance(sent, e.NotLeaderError):
        assert isinstance(got, e.NotLeaderError)
        assert (got.leader, got.leader_addr) == (sent.leader, sent.leader_addr)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_round_trips_through_a_grpc_status(cls: type[e.RaftStreamError]):
    """Each class keeps its type, code, retriable flag, message and details."""
    sent = make_error(cls)

    async def run() -> e.RaftStreamError:
        async with serve({"x": lambda: sent}) as addr:
            return await call_delete(addr, "x")

    got = asyncio.run(run())
    assert_same(got, sent)
    assert got.details["grpc_code"] == sent.code.name


def test_the_status_code_and_error_info_are_what_the_design_names():
    """NOT_LEADER is UNAVAILABLE with the leader hint in ErrorInfo metadata; a validation
    error is INVALID_ARGUMENT naming the field; the domain is raftstream."""
    sent = e.NotLeaderError(leader="n2", leader_addr="127.0.0.1:7102")
    checked: dict[str, Any] = {}

    async def run() -> None:
        async with serve({"x": lambda: sent}) as addr, grpc.aio.insecure_channel(addr) as ch:
            try:
                await pbg.StreamServiceStub(ch).DeleteStream(
                    pb.DeleteStreamRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                checked["code"] = err.code()
                checked["info"] = pe._error_info(err)

    asyncio.run(run())
    assert checked["code"] == grpc.StatusCode.UNAVAILABLE
    info = checked["info"]
    assert (info.domain, info.reason) == ("raftstream", "NOT_LEADER")
    assert dict(info.metadata) == {"leader": "n2", "leader_addr": "127.0.0.1:7102"}
    status = pe.to_rich_status(e.InvalidArgumentError("subjects", "duplicate subject 'a'"))
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_abort_maps_like_the_decorator():
    """``abort(context, exc)`` (for handlers that catch themselves) sends the same status."""
    sent = e.ExpectedLastSeqError("wrong last sequence: 7", last_seq=7)

    async def run() -> e.RaftStreamError:
        async with serve({"x": lambda: sent}) as addr, grpc.aio.insecure_channel(addr) as ch:
            try:
                await pbg.StreamServiceStub(ch).PurgeStream(
                    pb.PurgeStreamRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                return pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    assert_same(asyncio.run(run()), sent)


def test_a_bug_becomes_internal_without_leaking_its_text():
    bug = {"x": lambda: KeyError("secret-key")}

    async def run() -> tuple[grpc.StatusCode, e.RaftStreamError]:
        async with serve(bug) as addr, grpc.aio.insecure_channel(addr) as ch:
            try:
                await pbg.StreamServiceStub(ch).PurgeStream(
                    pb.PurgeStreamRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                return err.code(), pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    code, got = asyncio.run(run())
    assert code == grpc.StatusCode.INTERNAL
    assert "secret-key" not in got.message
    assert "KeyError" in got.message
    assert got.details["grpc_code"] == "INTERNAL"
    assert not got.retriable


def test_map_errors_sends_a_bug_as_internal_and_logs_it(caplog: pytest.LogCaptureFixture):
    bug = {"x": lambda: ZeroDivisionError("secret-divisor")}

    async def run() -> tuple[grpc.StatusCode, e.RaftStreamError]:
        async with serve(bug) as addr, grpc.aio.insecure_channel(addr) as ch:
            try:
                await pbg.StreamServiceStub(ch).DeleteStream(
                    pb.DeleteStreamRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                return err.code(), pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    with caplog.at_level("ERROR", logger="raftstream.proto.errors"):
        code, got = asyncio.run(run())
    assert code == grpc.StatusCode.INTERNAL
    assert "secret-divisor" not in got.message
    assert "ZeroDivisionError" in got.message
    assert any("DeleteStream" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_status_without_details_maps_by_code():
    """A plain UNAVAILABLE (no ErrorInfo) is a retriable UnavailableError, which says the
    connection broke before gRPC's words ("Stream removed" read as a deleted stream)."""

    async def run() -> e.RaftStreamError:
        async with serve({}) as addr, grpc.aio.insecure_channel(addr) as ch:
            try:
                await pbg.StreamServiceStub(ch).GetStreamInfo(
                    pb.StreamInfoRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                return pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    got = asyncio.run(run())
    assert type(got) is e.UnavailableError
    assert got.retriable
    assert got.message == "the connection to the server broke (connection to peer lost)"


def test_a_streamed_response_that_fails_midway_carries_the_leader_hint():
    async def run() -> tuple[list[int], e.RaftStreamError]:
        seen: list[int] = []
        async with serve({}) as addr, grpc.aio.insecure_channel(addr) as ch:
            call = pbg.ConsumeServiceStub(ch).Fetch(pb.FetchRequest(batch=2), timeout=10)
            try:
                async for resp in call:
                    seen.extend(m.seq for m in resp.messages)
            except grpc.aio.AioRpcError as err:
                return seen, pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    seen, got = asyncio.run(run())
    assert seen == [1]
    assert isinstance(got, e.NotLeaderError)
    assert (got.leader, got.leader_addr) == ("n3", "127.0.0.1:7103")


def test_a_refused_connection_is_retriable_unavailable():
    async def run() -> e.RaftStreamError:
        with socket.socket() as sock:  # a free port nobody listens on once closed
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            try:
                await pbg.StreamServiceStub(ch).DeleteStream(
                    pb.DeleteStreamRequest(name="x"), timeout=10
                )
            except grpc.aio.AioRpcError as err:
                return pe.from_rpc_error(err)
        raise AssertionError("the call succeeded")

    got = asyncio.run(run())
    assert type(got) is e.UnavailableError
    assert got.retriable


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_round_trips_through_the_error_message(cls: type[e.RaftStreamError]):
    """The per-item Error of PublishStream/AckStream carries the same content."""
    sent = make_error(cls)
    wire = pb.Error.FromString(pe.to_error_message(sent).SerializeToString())
    assert wire.code == int(sent.code)
    assert wire.reason == sent.reason
    assert_same(pe.from_error_message(wire), sent)


def test_an_unknown_reason_falls_back_to_the_class_of_its_code():
    wire = pb.Error(code=int(e.Code.FAILED_PRECONDITION), reason="SOMETHING_NEW", message="m")
    got = pe.from_error_message(wire)
    assert type(got) is e.PreconditionError
    assert got.message == "m"


def test_a_second_abort_while_the_first_is_sent_keeps_the_first_status():
    """gRPC awaits the status's send inside ``abort_with_status``; a node's time cap that
    fires meanwhile aborted the call again, which grpc refuses with UsageError ("Abort
    already called!", logged as a servicer bug; found by a user review during a failover).
    The second ``abort`` now sends nothing and ends the handler as cancelled: a new
    AbortError was logged as a bug too ("Abort error has been replaced!"), seen in a node's
    log when 300 streams were created at once under load."""

    class SlowContext:
        def __init__(self) -> None:
            self.sent: list[grpc.Status] = []

        async def abort_with_status(self, status: grpc.Status) -> None:
            self.sent.append(status)
            await asyncio.sleep(1)  # the send, interrupted by the cap below
            raise grpc.aio.AbortError("sent")

    async def body() -> None:
        ctx: Any = SlowContext()
        try:
            async with asyncio.timeout(0.01):
                await pe.abort(ctx, e.NoLeaderError("no leader yet", group="S:$G:A"))
        except TimeoutError:
            with pytest.raises(asyncio.CancelledError):
                await pe.abort(ctx, e.DeadlineExceededError("past the cap"))
        assert [s.code for s in ctx.sent] == [grpc.StatusCode.UNAVAILABLE]

    asyncio.run(body())
