"""Small in-test gRPC servers for the SDK's unit tests (no node process exists yet).

A ``FakeNode`` serves every ``raftstream.v1`` service on a free 127.0.0.1 port. Each RPC runs
the handler the test installed for it (``node.on("Publish", fn)``), and every call is
recorded with the deadline the client sent (``time_remaining``). A handler that raises a
``RaftStreamError`` ends the call with the mapped status, as the node will. RPCs without a
handler fail UNIMPLEMENTED. A bidirectional RPC is accepted (initial metadata sent) before its
handler's generator runs, as the node does; a handler that raises when called (not from its
generator) refuses the call before that, as the node's interceptors do. These servers
exercise the SDK's own logic (hints, retries, pipelining, statuses); they model no stream
semantics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from raftstream import errors
from raftstream.proto import errors as pe
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

SERVICES = {
    "StreamService": pbg.add_StreamServiceServicer_to_server,
    "ConsumerService": pbg.add_ConsumerServiceServicer_to_server,
    "PublishService": pbg.add_PublishServiceServicer_to_server,
    "ConsumeService": pbg.add_ConsumeServiceServicer_to_server,
    "ClusterService": pbg.add_ClusterServiceServicer_to_server,
}


@dataclass
class Call:
    rpc: str
    request: Any  # the request message; for client-streaming RPCs, None
    time_remaining: float | None


def _unary(node: FakeNode, name: str) -> Callable[..., Any]:
    async def method(self: Any, request: Any, context: Any) -> Any:
        node.calls.append(Call(name, request, context.time_remaining()))
        handler = node.handlers.get(name)
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} not faked")
        try:
            return await handler(request, context)
        except errors.RaftStreamError as exc:
            await pe.abort(context, exc)

    return method


def _streaming(node: FakeNode, name: str, client_streaming: bool) -> Callable[..., Any]:
    async def method(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
        node.calls.append(
            Call(name, None if client_streaming else request, context.time_remaining())
        )
        handler = node.handlers.get(name)
        if handler is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} not faked")
        try:
            items = handler(request, context)  # raising here: refused as a whole, unaccepted
            if client_streaming:  # accepted first, as the node's servicers do
                await context.send_initial_metadata(())
            async for item in items:
                yield item
        except errors.RaftStreamError as exc:
            await pe.abort(context, exc)

    return method


def _servicer(node: FakeNode, service: str) -> Any:
    base = getattr(pbg, f"{service}Servicer")
    methods: dict[str, Any] = {}
    for m in pb.DESCRIPTOR.services_by_name[service].methods:
        if m.server_streaming:
            methods[m.name] = _streaming(node, m.name, m.client_streaming)
        elif m.client_streaming:
            raise AssertionError("no client-streaming unary RPCs in the API")
        else:
            methods[m.name] = _unary(node, m.name)
    return type(f"Fake{service}", (base,), methods)()


class FakeNode:
    """One fake server; ``addr`` once started. Handlers: ``async def (request, context)``
    returning the response, or async generators for streamed responses."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[..., Any]] = {}
        self.calls: list[Call] = []
        self.addr = ""
        self._server: grpc.aio.Server | None = None

    def on(self, rpc: str, handler: Callable[..., Any]) -> None:
        self.handlers[rpc] = handler

    def calls_to(self, rpc: str) -> list[Call]:
        return [c for c in self.calls if c.rpc == rpc]

    async def start(self) -> str:
        server = grpc.aio.server()
        for service, add in SERVICES.items():
            add(_servicer(self, service), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        self.addr = f"127.0.0.1:{port}"
        return self.addr

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None


class Nodes:
    """Start ``count`` fake nodes; stop them all on exit."""

    def __init__(self, count: int) -> None:
        self.nodes = [FakeNode() for _ in range(count)]

    async def __aenter__(self) -> list[FakeNode]:
        for node in self.nodes:
            await node.start()
        return self.nodes

    async def __aexit__(self, *exc: object) -> None:
        for node in self.nodes:
            await node.stop()


class AckRecorder:
    """AckStream that records acks and reports a failure for replies listed in ``fail``.
    A run's sequences are recorded as the +ACK items of the tokens ``ack_token`` makes for
    them (a run refused as one result, id 0, as the node does)."""

    def __init__(self) -> None:
        self.items: list[pb.AckItem] = []
        self.fail: dict[str, errors.RaftStreamError] = {}

    async def handler(
        self, batches: AsyncIterator[pb.AckBatch], ctx: Any
    ) -> AsyncIterator[pb.AckResultBatch]:
        async for batch in batches:
            self.items.extend(batch.acks)
            failed = [
                pb.AckResult(id=a.id, error=pe.to_error_message(self.fail[a.reply]))
                for a in batch.acks
                if a.reply in self.fail
            ]
            for run in batch.runs:
                tokens = [
                    ack_token(s, stream=run.stream, consumer=run.consumer) for s in run.stream_seqs
                ]
                self.items.extend(pb.AckItem(reply=t) for t in tokens)
                refused = [self.fail[t] for t in tokens if t in self.fail]
                if refused:
                    failed.append(pb.AckResult(id=0, error=pe.to_error_message(refused[0])))
            if failed:
                yield pb.AckResultBatch(results=failed)


Answer = Callable[[pb.PublishRequest], Any]  # a PubAck, a RaftStreamError, or an awaitable


def lane_handler(answer: Answer, seen: list[pb.PublishRequest] | None = None) -> Any:
    """A PublishStream handler that answers each request with ``answer(req)`` at once
    (a coroutine result is awaited first; raising ends the call with that status); each
    request is appended to ``seen`` first, when given."""

    async def handler(
        requests: AsyncIterator[pb.PublishBatch], ctx: Any
    ) -> AsyncIterator[pb.PublishResultBatch]:
        async for batch in requests:
            out = pb.PublishResultBatch()
            for req in batch.requests:
                if seen is not None:
                    seen.append(req)
                outcome = answer(req)
                if asyncio.iscoroutine(outcome):
                    outcome = await outcome
                if isinstance(outcome, errors.RaftStreamError):
                    out.results.add(id=req.id, error=pe.to_error_message(outcome))
                else:
                    out.results.add(id=req.id, ack=outcome)
            yield out

    return handler


def ack_each(req: pb.PublishRequest) -> pb.PubAck:
    """An ``Answer``: stream S's sequence = the request's id."""
    return pb.PubAck(stream="S", seq=req.id)


def ack_token(seq: int, *, stream: str = "ORDERS", consumer: str = "C", delivered: int = 1) -> str:
    return f"$JS.ACK._.$G.{stream}.{consumer}.{delivered}.{seq}.{seq}.{1_700_000_000 + seq}.0"


def stream_info_pb(name: str, subjects: list[str] | None = None) -> pb.StreamInfo:
    return pb.StreamInfo(
        config_json=json.dumps({"name": name, "subjects": subjects or [name]}),
        state=pb.StreamState(messages=0),
        created_ns=1,
    )


def consumer_info_pb(stream: str, name: str, config: dict[str, Any]) -> pb.ConsumerInfo:
    return pb.ConsumerInfo(stream=stream, name=name, config_json=json.dumps(config))


class RpcError(grpc.RpcError):
    """A ``grpc.RpcError`` with a code and details, as gRPC raises them for a failed call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details
