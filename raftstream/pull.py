"""Pull subscriptions: ``fetch(batch, timeout)`` over the ``Fetch`` server stream.

One ``fetch`` is one pull request, served by the consumer's leader (the stream's leader):
it waits up to ``timeout`` seconds for up to ``batch`` messages and returns what arrived.
The request's ``expires`` is set a little inside the timeout so the server ends it with
``408 Request Timeout`` before the RPC deadline cuts it.

Statuses (JetStream's pull outcomes): ``100 Idle Heartbeat`` keeps the request alive and is
never surfaced; ``404``/``408`` end the request; with no message received they raise
``DeadlineExceededError`` (as JetStream clients raise a timeout on an empty fetch).
``409`` (Consumer Deleted, Leadership Change, Exceeded Max...) and unknown statuses raise
``ConflictError`` (``details["status"]``, ``details["description"]``) when no message was
received; ``400`` raises ``InvalidArgumentError``. Messages received before a failure are
returned, never dropped: they are delivered and pending on the server, so the caller must
get the chance to ack them; the next ``fetch`` reports the failure again if it persists.

With ``heartbeat`` (seconds), the server sends idle heartbeats that often while it waits; if
nothing arrives for twice that, the request is abandoned with ``UnavailableError`` (or the
messages received so far are returned).

A failure before the first message (NOT_LEADER with a hint, a server that cannot be
reached) is retried within the timeout: no message was delivered, so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftstream import errors
from raftstream._conn import Router, Stubs
from raftstream.models import ConsumerInfo
from raftstream.msg import AckSender, Msg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import from_rpc_error

__all__ = ["PullSubscription"]

NS_PER_S = 1_000_000_000
STATUS_IDLE_HEARTBEAT = 100
STATUS_BAD_REQUEST = 400
STATUS_NO_MESSAGES = 404
STATUS_REQUEST_TIMEOUT = 408
# The server ends the request this much before the caller's timeout (at most), so its 408
# arrives before the deadline: 10% of the timeout, capped.
EXPIRES_MARGIN_FRACTION = 0.1
EXPIRES_MARGIN_MAX_S = 0.25
HEARTBEAT_MISSES_MAX = 2


class _Outcome:
    """What one Fetch call produced: messages, and the error that ended it (if any)."""

    __slots__ = ("error", "msgs")

    def __init__(self) -> None:
        self.msgs: list[Msg] = []
        self.error: errors.RaftStreamError | None = None


def _status_error(status: pb.PullStatus) -> errors.RaftStreamError | None:
    """The error a terminal status means when nothing was received; None for 404/408."""
    if status.code in (STATUS_NO_MESSAGES, STATUS_REQUEST_TIMEOUT):
        return None
    if status.code == STATUS_BAD_REQUEST:
        return errors.InvalidArgumentError("fetch", status.description or "bad request")
    return errors.ConflictError(
        f"{status.code} {status.description}",
        status=status.code,
        description=status.description,
    )


class PullSubscription:
    """A bound pull consumer. Belongs to the client's event loop; several fetches may run
    at once (each is its own pull request)."""

    def __init__(
        self,
        *,
        router: Router,
        acker: AckSender,
        stream: str,
        consumer: str,
        timeout_s: float,
        consumer_info: Callable[[], Awaitable[ConsumerInfo]],
    ) -> None:
        self._router = router
        self._acker = acker
        self._stream = stream
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._consumer_info = consumer_info

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def consumer(self) -> str:
        return self._consumer

    async def consumer_info(self) -> ConsumerInfo:
        """The consumer's current ``ConsumerInfo``."""
        return await self._consumer_info()

    async def fetch(
        self, batch: int = 1, timeout: float | None = 5.0, *, heartbeat: float | None = None
    ) -> list[Msg]:
        """Up to ``batch`` messages within ``timeout`` seconds (None: the client's timeout).

        Raises ``DeadlineExceededError`` when none arrived, and the typed error of a status
        or a failure when nothing was received (see the module docstring).
        """
        if batch < 1:
            raise errors.InvalidArgumentError("batch", "must be at least 1")
        timeout_s = timeout if timeout is not None else self._timeout_s
        if heartbeat is not None and heartbeat * 2 > timeout_s:
            raise errors.InvalidArgumentError("heartbeat", "must be at most half the timeout")

        async def invoke(stubs: Stubs, left_s: float) -> list[Msg]:
            return await self._one_request(stubs, batch, left_s, heartbeat)

        msgs = await self._router.call(self._stream, invoke, timeout_s=timeout_s, idempotent=True)
        if not msgs:
            raise errors.DeadlineExceededError(
                f"fetch: no messages within {timeout_s:.3f}s", stream=self._stream
            )
        return msgs

    def _request(self, batch: int, left_s: float, heartbeat: float | None) -> pb.FetchRequest:
        margin_s = min(left_s * EXPIRES_MARGIN_FRACTION, EXPIRES_MARGIN_MAX_S)
        expires_ns = int((left_s - margin_s) * NS_PER_S)
        return pb.FetchRequest(
            stream=self._stream,
            consumer=self._consumer,
            batch=batch,
            expires_ns=expires_ns,
            # A pull request's heartbeat may be at most half its expiry (JetStream's rule);
            # a retry has less time left, so the interval shrinks with it.
            idle_heartbeat_ns=min(int((heartbeat or 0) * NS_PER_S), expires_ns // 2),
        )

    async def _one_request(
        self, stubs: Stubs, batch: int, left_s: float, heartbeat: float | None
    ) -> list[Msg]:
        """One Fetch call: its messages; raises only when it failed before any message."""
        call = stubs.consume.Fetch(self._request(batch, left_s, heartbeat), timeout=left_s)
        out = _Outcome()
        try:
            await self._read(call, out, heartbeat)
        except grpc.RpcError as err:
            out.error = from_rpc_error(err)
        finally:
            call.cancel()  # no-op when finished; frees the call when we stopped early
        if out.error is not None and not out.msgs:
            raise out.error
        return out.msgs

    async def _read(self, call: Any, out: _Outcome, heartbeat: float | None) -> None:
        idle_s = heartbeat * HEARTBEAT_MISSES_MAX if heartbeat else None
        while True:
            try:
                resp = await asyncio.wait_for(call.read(), timeout=idle_s)
            except TimeoutError:
                out.error = errors.UnavailableError(
                    f"fetch: no heartbeat for {idle_s:.3f}s", stream=self._stream
                )
                return
            if resp is grpc.aio.EOF:
                return
            for m in resp.messages:
                out.msgs.append(self._msg(m))
            if resp.HasField("status") and resp.status.code != STATUS_IDLE_HEARTBEAT:
                out.error = _status_error(resp.status)
                return

    def _msg(self, m: pb.Msg) -> Msg:
        return Msg(
            subject=m.subject,
            data=m.data,
            headers=dict(m.headers) if m.headers else None,
            reply=m.reply,
            sender=self._acker,
            stream=self._stream,  # the fetch's: acks route without parsing the token
        )
