"""The node's input-limit interceptor: request checks, deadline caps, streaming call bounds.

Every unary and server-streaming call of the client API runs under a deadline: the
client's, capped at ``limits.call_timeout_max_ms``; a call without one gets
``limits.request_timeout_ms`` (``Fetch``, a long poll: ``call_timeout_max_ms``). The cap is
enforced here (DEADLINE_EXCEEDED when it passes) and visible to the servicers through
``capped_time_left``, so the work inside (forwards, proposals, pull expiry) ends before it.
Bidirectional streams are sessions bounded by their windows, not by a deadline; how many
streaming calls a node has open at once is bounded by ``limits.streaming_calls_max``.
Also the gRPC server options the limits imply (``server_options``).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from raftstream.cluster.common.handlers import rewrap
from raftstream.cluster.config import Limits
from raftstream.cluster.security.limits_requests import CLIENT_API_PREFIX, check_request
from raftstream.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LimitError,
    RaftStreamError,
)
from raftstream.proto.errors import abort

__all__ = ["LimitsInterceptor", "capped_time_left", "server_options"]

_LONG_POLLS = frozenset({"/raftstream.v1.ConsumeService/Fetch"})

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("raftstream_call_deadline")


# -- gRPC -------------------------------------------------------------------------------------


def server_options(limits: Limits, *, raft_message_bytes_max: int) -> list[tuple[str, int]]:
    """The gRPC server (and node-to-node channel) options the limits imply: messages up to
    ``grpc_message_bytes_max`` (or the Raft transport's, when larger) in and out; larger
    ones fail RESOURCE_EXHAUSTED in gRPC itself, before any of their bytes is parsed."""
    msg_max = max(limits.grpc_message_bytes_max, raft_message_bytes_max)
    return [
        ("grpc.max_send_message_length", msg_max),
        ("grpc.max_receive_message_length", msg_max),
    ]


def capped_time_left(left_s: float | None) -> float | None:
    """Seconds left of the call: the client's ``left_s`` (None: no deadline), within the
    server's cap when ``LimitsInterceptor`` set one for the running call."""
    deadline = _DEADLINE.get(None)
    if deadline is None:
        return left_s
    cap = max(0.001, deadline - time.monotonic())
    return cap if left_s is None else min(left_s, cap)


class LimitsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks every client API request (``check_request``) before its servicer runs, puts
    unary and server-streaming calls under the server's deadline cap and counts streaming
    calls against ``streaming_calls_max`` (see the module docstring). The node-to-node
    services, health and reflection are left alone. Owned by the server's event loop."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._streaming = 0  # streaming calls open now (limits.streaming_calls_max)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(CLIENT_API_PREFIX):
            return handler
        return rewrap(
            handler,
            unary_unary=lambda behavior: self._unary(method, behavior),
            unary_stream=lambda behavior: self._server_stream(method, behavior),
            stream_stream=lambda behavior: self._bidi(method, behavior),
            request_deserializer=_tolerant,
        )

    def _cap_s(self, method: str, context: Any) -> tuple[float, bool]:
        """The call's time on this node, and whether the client's deadline set it."""
        lim = self._limits
        cap_s = lim.call_timeout_max_ms / 1000
        left = context.time_remaining()
        if left is None:
            return (cap_s if method in _LONG_POLLS else lim.request_timeout_ms / 1000), False
        left_s = max(0.001, float(left))
        return min(cap_s, left_s), left_s < cap_s

    async def _check(self, method: str, request: Any, context: Any) -> None:
        try:
            if isinstance(request, _Malformed):
                raise request.error()
            check_request(method, request, self._limits)
        except RaftStreamError as exc:
            await abort(context, exc)

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Any:
        async def capped(request: Any, context: Any) -> Any:
            await self._check(method, request, context)
            cap_s, by_client = self._cap_s(method, context)
            _DEADLINE.set(time.monotonic() + cap_s)
            try:
                async with asyncio.timeout(cap_s):
                    return await behavior(request, context)
            except DeadlineExceededError:  # the handler's own answer, not the cap
                raise
            except TimeoutError:
                await abort(context, _past_cap(cap_s, by_client))

        return capped

    async def _open_stream(self, context: Any) -> None:
        """Count a streaming call in, or refuse it RESOURCE_EXHAUSTED when
        ``streaming_calls_max`` are open (the caller counts it out when it ends)."""
        bound = self._limits.streaming_calls_max
        if self._streaming >= bound:
            exc = LimitError(
                f"this node has streaming_calls_max ({bound}) streaming calls open; retry later",
                limit="streaming_calls_max",
            )
            await abort(context, exc)
        self._streaming += 1

    def _server_stream(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Any:
        async def capped(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._check(method, request, context)
            cap_s, by_client = self._cap_s(method, context)
            deadline = time.monotonic() + cap_s
            _DEADLINE.set(deadline)
            responses = aiter(behavior(request, context))
            await self._open_stream(context)  # counted out in the finally below
            # Only our own awaits are under the timeout, never a yield: a timeout must not
            # fire inside gRPC's write of a response.
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(_loop_time(deadline)):
                            item = await anext(responses)
                    except StopAsyncIteration:
                        return
                    yield item
            except TimeoutError:
                await abort(context, _past_cap(cap_s, by_client))
            finally:
                self._streaming -= 1
                await responses.aclose()  # type: ignore[attr-defined]

        return capped

    def _bidi(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Any:
        """A bidirectional stream: its first ``Consume`` message is checked; a message that
        is not a valid protobuf of the request type ends the input, and the call ends
        INVALID_ARGUMENT once the servicer has answered what came before it (a servicer that
        keeps the call open without input, a push session, ends when its client ends it)."""
        limits = self._limits

        async def checked(request_iterator: Any, context: Any) -> AsyncIterator[Any]:
            refused: list[RaftStreamError] = []

            async def requests() -> AsyncIterator[Any]:
                first = True
                async for req in request_iterator:
                    if isinstance(req, _Malformed):
                        refused.append(req.error())
                        raise refused[-1]
                    if first:
                        check_request(method, req, limits)
                        first = False
                    yield req

            await self._open_stream(context)
            try:
                async for item in behavior(requests(), context):
                    yield item
            finally:
                self._streaming -= 1
            if refused:
                await abort(context, refused[0])

        return checked


class _Malformed:
    """What a request that is not a valid protobuf of its type deserializes to: refused
    INVALID_ARGUMENT by the interceptor (gRPC would answer UNKNOWN, naming nothing)."""

    __slots__ = ()

    @staticmethod
    def error() -> InvalidArgumentError:
        return InvalidArgumentError("request", "is not a valid protobuf message of its type")


_MALFORMED = _Malformed()


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserialize``, with a malformed message turned into ``_MALFORMED``."""
    if deserialize is None:
        return None

    def tolerant(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return _MALFORMED

    return tolerant


def _loop_time(deadline_monotonic: float) -> float:
    """``deadline_monotonic`` (``time.monotonic``) on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline_monotonic - time.monotonic())


def _past_cap(cap_s: float, by_client: bool) -> DeadlineExceededError:
    """The call's time ran out on this node: ``cap_s`` was what the client's deadline left
    it (``by_client``), else the node's own cap (no client deadline, or a longer one)."""
    if by_client:
        return DeadlineExceededError(
            f"no answer within the {cap_s:.3f} s the client's deadline left the call"
        )
    return DeadlineExceededError(
        f"the call ran past the server's deadline of {cap_s:.3f} s "
        "(limits.request_timeout_ms without a client deadline, at most "
        "limits.call_timeout_max_ms)",
        limit="call_timeout_max_ms",
    )
