"""Pull subscriptions: ``fetch(batch, timeout)`` over the ``Fetch`` server stream.

Pull requests are served by the consumer's leader (the stream's leader).

What a fetch waits for (as nats.py's ``fetch``). ``fetch(batch, timeout)`` first asks for
what is there now: a ``no_wait`` request, which the node answers at once with up to
``batch`` messages (ending it with 404 when it had none, 408 after part of the batch). Any
message it brought is returned at once, so a fetch of 100 with 3 messages waiting returns
those 3 without waiting out its timeout. Only when nothing was there does it wait: a
request that waits up to ``timeout`` seconds for up to ``batch`` messages and returns what
arrived (the whole batch, or what came before the request expired). That request's
``expires`` is set a little inside the timeout so the server ends it with
``408 Request Timeout`` before the RPC deadline cuts it. A fetch of one message skips the
first request: its first message is its whole batch.

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

Prefetch (``fetch(..., prefetch=True)``). A fetch costs a call and the node's work of
deciding and sending its batch, so a loop of fetch, process, ack pays that latency once per
batch while the caller works and the server idles. With ``prefetch``, the fetch returns as
usual and then sends the NEXT pull request (same batch size; like a fetch's first request,
``no_wait``: what is there then) without waiting for it: its messages travel while the
caller processes this batch, and the next ``fetch`` (with or without ``prefetch``) takes
them first, waiting only for that request to end; when it brought nothing, that fetch makes
its own requests. At most one prefetched request is outstanding, so the subscription holds
at most one batch beyond what the caller has; the consumer's ``max_ack_pending`` still
bounds everything. The price: prefetched messages are delivered to this subscription
(pending on the server) before the caller asks for them. If the caller stops fetching, call
``cancel_prefetch()``: it ends the request and -NAKs the messages it brought, so they are
redelivered at once; otherwise (or for those still in flight when it is called) they are
redelivered after their ack wait, as for any client that goes away mid-fetch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftstream import errors
from raftstream._args import check_seconds
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
# One pull request waits at most this long: a node refuses a longer expiry (its
# limits.call_timeout_max_ms, 60 s by default), so a longer fetch is a series of requests.
REQUEST_WAIT_MAX_S = 30.0
# A node's limits.pull_batch_msgs_max by default (docs/configuration.md): a fetch asks for at
# most that many messages unless the node was configured otherwise (the SDK cannot know).
PULL_BATCH_MSGS_MAX_DEFAULT = 10_000
UINT32_MAX = 2**32 - 1  # FetchRequest.batch
# The shortest idle heartbeat a node sends a pull request (cluster/security/limits.py
# PULL_HEARTBEAT_MIN_NS: at most 100 per second).
PULL_HEARTBEAT_MIN_NS = 10_000_000
PULL_HEARTBEAT_MIN_S = PULL_HEARTBEAT_MIN_NS / NS_PER_S
# A prefetching fetch returns once its next request is on its way, waiting this long at most
# (a server that cannot be reached must not hold up messages already received).
PREFETCH_ISSUE_WAIT_S = 0.05


class _Outcome:
    """What one Fetch call produced: messages, and the error that ended it (if any).
    ``arrived`` is set whenever messages are added (a prefetch's reader waits on it);
    ``issued`` once the Fetch call is made (a prefetching fetch waits for that)."""

    __slots__ = ("arrived", "error", "issued", "msgs")

    def __init__(self) -> None:
        self.msgs: list[Msg] = []
        self.error: errors.RaftStreamError | None = None
        self.arrived = asyncio.Event()
        self.issued = asyncio.Event()


class _Ahead:
    """The pull request a prefetching ``fetch`` left outstanding: its messages collect in
    ``out.msgs`` as they arrive and are handed out, oldest first, by the next fetches.
    ``taken``: how many were handed out (the request brings at most ``batch``)."""

    __slots__ = ("batch", "out", "taken", "task")

    def __init__(self, batch: int, out: _Outcome, task: asyncio.Task[list[Msg]]) -> None:
        self.batch = batch
        self.out = out
        self.task = task
        self.taken = 0

    @property
    def spent(self) -> bool:
        """Nothing more will come from it: it ended, or its whole batch was handed out."""
        return self.taken >= self.batch or self.task.done()

    def take(self, batch: int) -> list[Msg]:
        msgs = self.out.msgs[:batch]
        del self.out.msgs[:batch]
        self.taken += len(msgs)
        return msgs

    async def wait(self, batch: int, left_s: float) -> None:
        """Until ``batch`` messages are here, the request ended, or ``left_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + left_s
        while len(self.out.msgs) < batch and not self.task.done():
            left = deadline - loop.time()
            if left <= 0:
                return
            self.out.arrived.clear()
            arrived = loop.create_task(self.out.arrived.wait())
            try:
                await asyncio.wait(
                    (self.task, arrived), timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                arrived.cancel()


def _check_batch(batch: object) -> None:
    """``batch`` as the SDK can check it: the upper bound is the node's setting."""
    rule = (
        "must be an integer of at least 1 (a node takes at most its "
        f"limits.pull_batch_msgs_max, {PULL_BATCH_MSGS_MAX_DEFAULT} by default)"
    )
    if isinstance(batch, bool) or not isinstance(batch, int):
        raise errors.InvalidArgumentError("batch", f"{rule}, not {type(batch).__name__}")
    if not 1 <= batch <= UINT32_MAX:  # above: no node's limit, and no proto uint32
        raise errors.InvalidArgumentError("batch", f"{rule}, not {batch}")


def _check_heartbeat(heartbeat: object, timeout_s: float) -> None:
    """A fetch's ``heartbeat`` (seconds), named as the caller named it (the node's refusal
    would name the proto field ``idle_heartbeat_ns``)."""
    heartbeat = check_seconds("heartbeat", heartbeat, zero_ok=True)
    if 0 < heartbeat < PULL_HEARTBEAT_MIN_S:
        raise errors.InvalidArgumentError(
            "heartbeat",
            f"must be 0 (none) or at least {PULL_HEARTBEAT_MIN_S:g} seconds, not {heartbeat!r}",
        )
    if heartbeat * 2 > timeout_s:
        raise errors.InvalidArgumentError(
            "heartbeat", f"must be at most half the timeout ({timeout_s:g} s), not {heartbeat!r}"
        )


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Done-callback of a prefetch: its failure is seen by the next fetch's own request (or
    does not matter), never reported as an unretrieved task exception."""
    if not task.cancelled():
        task.exception()


def _heartbeat_ns(heartbeat: float | None, expires_ns: int) -> int:
    """The request's idle heartbeat: at most half its expiry (JetStream's rule). A retry
    has less time left, so the interval shrinks with it; one that would shrink below the
    node's minimum is left out (0), as the node would refuse it: the request then ends
    (408) before the client's missed-heartbeat wait (twice ``heartbeat``) would."""
    hb_ns = min(int((heartbeat or 0) * NS_PER_S), expires_ns // 2)
    return hb_ns if hb_ns >= PULL_HEARTBEAT_MIN_NS else 0


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
        delete: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._router = router
        self._delete = delete  # deletes the consumer at unsubscribe (an ephemeral we made)
        self._closed = False
        self._acker = acker
        self._stream = stream
        self._consumer = consumer
        self._timeout_s = timeout_s
        self._consumer_info = consumer_info
        self._ahead: _Ahead | None = None  # the prefetched request, if any (module docstring)

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
        self,
        batch: int = 1,
        timeout: float | None = 5.0,
        *,
        heartbeat: float | None = None,
        prefetch: bool = False,
    ) -> list[Msg]:
        """Up to ``batch`` messages within ``timeout`` seconds (None: the client's timeout):
        the messages there now, at once, else those that come while it waits (module
        docstring, "What a fetch waits for").

        A ``timeout`` above ``REQUEST_WAIT_MAX_S`` (30 s) is a series of pull requests, each
        within a node's call cap. Messages a previous ``prefetch`` brought come first.
        ``prefetch``: leave the next pull request outstanding when returning (see the module
        docstring).

        Raises ``DeadlineExceededError`` when none arrived, and the typed error of a status
        or a failure when nothing was received (see the module docstring).

        Arguments are checked before anything is sent (``InvalidArgumentError`` naming
        the argument): ``batch`` an int of at least 1 (a node takes at most its
        ``limits.pull_batch_msgs_max``, 10000 by default, and refuses more naming
        ``batch``); ``timeout`` a finite number of seconds above 0; ``heartbeat`` None or 0
        (none), or a finite number of seconds from ``PULL_HEARTBEAT_MIN_S`` (10 ms) to half
        the timeout.
        """
        _check_batch(batch)
        timeout_s = check_seconds("timeout", timeout if timeout is not None else self._timeout_s)
        if self._closed:
            raise errors.SubscriptionClosedError("the subscription was unsubscribed")
        if heartbeat is not None:
            _check_heartbeat(heartbeat, timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        msgs = await self._from_ahead(batch, timeout_s)
        left_s = deadline - loop.time()
        if not msgs and batch > 1 and left_s > 0:
            # What is there now, at once (module docstring, "What a fetch waits for").
            msgs = await self._request(batch, left_s, None, no_wait=True)
            left_s = deadline - loop.time()
        while not msgs and left_s > 0:
            wait_s = min(left_s, REQUEST_WAIT_MAX_S)
            if wait_s == left_s:
                msgs = await self._request(batch, wait_s, heartbeat)
                break
            with contextlib.suppress(errors.DeadlineExceededError):  # time is left: ask again
                msgs = await self._request(batch, wait_s, heartbeat)
            left_s = deadline - loop.time()
        if prefetch:
            await self._prefetch(batch, min(timeout_s, REQUEST_WAIT_MAX_S), heartbeat)
        if not msgs:
            raise errors.DeadlineExceededError(
                f"fetch: no messages within {timeout_s:.3f}s", stream=self._stream
            )
        return msgs

    async def _request(
        self,
        batch: int,
        timeout_s: float,
        heartbeat: float | None,
        out: _Outcome | None = None,
        *,
        no_wait: bool = False,
    ) -> list[Msg]:
        """One pull request, retried (tenacity, in the router) until its first message.
        ``no_wait``: the node answers with what it has now and ends the request (404 when
        nothing, 408 after part of the batch), rather than waiting for the batch."""

        async def invoke(stubs: Stubs, left_s: float) -> list[Msg]:
            fresh = out if out is not None else _Outcome()
            return await self._one_request(stubs, batch, left_s, heartbeat, fresh, no_wait)

        msgs: list[Msg] = await self._router.call(
            self._stream, invoke, timeout_s=timeout_s, idempotent=True
        )
        return msgs

    async def _from_ahead(self, batch: int, timeout_s: float) -> list[Msg]:
        """Up to ``batch`` messages of the prefetched request, waiting for them at most
        ``timeout_s``; [] when there is none or it brought nothing (then the caller makes
        its own request, which reports any failure)."""
        ahead = self._ahead
        if ahead is None:
            return []
        await ahead.wait(batch, timeout_s)
        msgs = ahead.take(batch)
        if ahead.spent and not ahead.out.msgs and self._ahead is ahead:
            self._ahead = None
        return msgs

    async def _prefetch(self, batch: int, timeout_s: float, heartbeat: float | None) -> None:
        """Start the next pull request unless one is still outstanding, and return once it
        is on its way: a caller that works without yielding to the loop (acks only queue)
        would otherwise hold it back until its next fetch, and nothing would overlap."""
        if self._ahead is not None:
            return
        out = _Outcome()
        loop = asyncio.get_running_loop()
        # Like a fetch's first request: what is there now (a batch of one: the first to come).
        request = self._request(batch, timeout_s, heartbeat, out, no_wait=batch > 1)
        task = loop.create_task(request, name=f"prefetch-{self._consumer}")
        task.add_done_callback(_retrieve)
        self._ahead = _Ahead(batch, out, task)
        issued = loop.create_task(out.issued.wait())
        try:
            await asyncio.wait(
                (task, issued), timeout=PREFETCH_ISSUE_WAIT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            issued.cancel()
        await asyncio.sleep(0)  # gRPC sends the request from a task of its own

    async def cancel_prefetch(self) -> None:
        """End the prefetched request, if any, and -NAK the messages it brought that no
        fetch returned, so the server redelivers them at once (module docstring)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return
        ahead.task.cancel()
        await asyncio.gather(ahead.task, return_exceptions=True)
        for m in ahead.out.msgs:
            await m.nak()
        ahead.out.msgs.clear()

    async def unsubscribe(self) -> None:
        """End the subscription: the prefetched request is cancelled as by
        ``cancel_prefetch``, and an ephemeral consumer that ``pull_subscribe`` created is
        deleted (at once, rather than after its ``inactive_threshold``). A durable
        consumer is kept, even one this subscription created: other workers may share it
        (delete it with ``delete_consumer``). Later fetches raise
        ``SubscriptionClosedError``. Raises the delete's error (the subscription is closed
        either way); a consumer already gone is no error. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.cancel_prefetch()
        if self._delete is not None:
            with contextlib.suppress(errors.NotFoundError):
                await self._delete()

    def _request_pb(
        self, batch: int, left_s: float, heartbeat: float | None, no_wait: bool
    ) -> pb.FetchRequest:
        if no_wait:  # answered at once: no expiry, no heartbeat
            return pb.FetchRequest(
                stream=self._stream, consumer=self._consumer, batch=batch, no_wait=True
            )
        margin_s = min(left_s * EXPIRES_MARGIN_FRACTION, EXPIRES_MARGIN_MAX_S)
        expires_ns = int((left_s - margin_s) * NS_PER_S)
        return pb.FetchRequest(
            stream=self._stream,
            consumer=self._consumer,
            batch=batch,
            expires_ns=expires_ns,
            idle_heartbeat_ns=_heartbeat_ns(heartbeat, expires_ns),
        )

    async def _one_request(
        self,
        stubs: Stubs,
        batch: int,
        left_s: float,
        heartbeat: float | None,
        out: _Outcome,
        no_wait: bool,
    ) -> list[Msg]:
        """One Fetch call, its messages collected in ``out`` as they arrive (a retry after a
        failure before the first message reuses it); raises only when it failed before any
        message."""
        request = self._request_pb(batch, left_s, heartbeat, no_wait)
        call = stubs.consume.Fetch(request, timeout=left_s)
        out.issued.set()
        out.error = None
        try:
            await self._read(call, out, None if no_wait else heartbeat)
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
                if idle_s is None:
                    resp = await call.read()
                else:
                    async with asyncio.timeout(idle_s):
                        resp = await call.read()
            except TimeoutError:
                out.error = errors.UnavailableError(
                    f"fetch: no heartbeat for {idle_s:.3f}s", stream=self._stream
                )
                return
            if resp is grpc.aio.EOF:
                return
            if resp.messages:
                out.msgs.extend(self._msg(m) for m in resp.messages)
                out.arrived.set()
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
            consumer=self._consumer,  # ack() goes as a sequence of an AckRun
            stream_seq=m.seq,
        )
