"""Push subscriptions: one ``ConsumeService.Consume`` call at a time, with ADR-15's automatic
status management.

A ``PushSubscription`` belongs to the event loop of the client that made it; nothing here is
thread-safe. It runs one reader task that attaches a ``Consume`` call to the consumer's
stream leader (following NOT_LEADER hints), reads it and fills a bounded buffer; with a
callback, a dispatcher task hands the buffered messages to it in order.

Automatic status management (ADR-15, "Automatic Status Management"):

- idle heartbeats: when the consumer has ``idle_heartbeat``, a read that sees nothing (no
  message, no heartbeat) for ``HEARTBEAT_MISSES_MAX`` (3) intervals reports
  ``MissedHeartbeatError`` to the error callback and gives up the call: the leader may hang
  (paused, cut off with its connection open) while another node leads the stream. The next
  calls avoid that node when the router would send them there again, trying each other
  seed server once (a NOT_LEADER hint naming it is still followed); if it hangs again,
  that is reported again, every 3 intervals;
- gaps: a consumer sequence that jumps (in a message's ack token, or a heartbeat's
  ``last_consumer_seq`` ahead of what arrived) reports ``SequenceGapError``; never for queue
  subscriptions, whose members each see part of the sequence;
- flow control: a request is queued in order with the messages and answered when the
  application reaches it (``next_msg``, iteration or the callback); a heartbeat's
  ``stalled`` token is answered at once; each token is answered once per call. A new call
  (a new leader, whose plan may ask with a token an older leader used: servers before
  unique tokens did) answers whatever it is asked; a request that came on an earlier call
  is still answered on the current one when reached (its leader, if it still leads, may
  still wait for it), but does not count as answered for this call;
- ``409 Leadership Change`` (and a broken call, NOT_LEADER...) reattaches to the new leader,
  with backoff (tenacity); unacked deliveries come again after their ack wait. Any other
  status (``409 Consumer Deleted``, an unknown code) ends the subscription: the error goes to
  the error callback and is raised by ``next_msg`` once the buffer is empty.

The buffer holds at most ``pending_msgs_max`` messages and ``pending_bytes_max`` bytes, plus
one server response (at most ``PUSH_RESPONSE_MSGS_MAX`` messages) beyond: when it is full the
reader stops reading, gRPC flow control holds the server's sender, and the server's own
bounded queue then slows the consumer's delivery. Nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Self

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from raftstream import errors
from raftstream._conn import Router
from raftstream.models import ConsumerInfo
from raftstream.msg import AckSender, Msg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import from_error_message, from_rpc_error

__all__ = [
    "PENDING_BYTES_MAX",
    "PENDING_MSGS_MAX",
    "ErrorCallback",
    "MsgCallback",
    "PushSubscription",
    "PushTarget",
]

log = logging.getLogger("raftstream.push")

PENDING_MSGS_MAX = 8192
PENDING_BYTES_MAX = 64 * 1024 * 1024
PUSH_RESPONSE_MSGS_MAX = 256  # the server's deliveries per response (cluster/services/push.py)
REQUESTS_QUEUED_MAX = 64  # flow-control replies waiting to be sent on the call
FC_ANSWERED_REMEMBERED_MAX = 16  # per call
HEARTBEAT_MISSES_MAX = 3
REATTACH_WAIT_INITIAL_S = 0.05
REATTACH_WAIT_MAX_S = 1.0
MSG_OVERHEAD_BYTES = 64
STATUS_CONFLICT = 409
LEADERSHIP_CHANGE = "Leadership Change"
NS_PER_S = 1_000_000_000

ErrorCallback = Callable[[errors.RaftStreamError], None]
MsgCallback = Callable[[Msg], Awaitable[None]]


# The subscription whose callback the running code is in (the dispatcher sets it around each
# call; tasks the callback starts inherit it): ``unsubscribe``/``drain`` called from there
# must not wait for or cancel that callback.
_CALLBACK_OF: contextvars.ContextVar[PushSubscription | None] = contextvars.ContextVar(
    "raftstream_push_callback_of", default=None
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PushTarget:
    """What a push subscription attaches to. ``idle_heartbeat_ns`` and ``flow_control`` are
    the consumer's (they say what to expect); ``ack_none``: ack policy none."""

    stream: str
    consumer: str
    queue: str | None = None
    ack_none: bool = False
    idle_heartbeat_ns: int = 0
    flow_control: bool = False

    @property
    def check_gaps(self) -> bool:
        return self.queue is None


class Reattach(Exception):
    """The call ended in a way a new call may cure (a leader change, a broken connection);
    ``cause`` says why, ``leader_addr`` where to go next (None: the router's choice)."""

    def __init__(self, cause: BaseException, leader_addr: str | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.leader_addr = leader_addr


@dataclass(frozen=True, slots=True)
class _FlowControl:
    token: str
    call_no: int  # the call it came on (``PushSubscription._call_no``)


def msg_size_bytes(m: pb.Msg) -> int:
    headers = sum(len(k) + len(v) for k, v in m.headers.items())
    return len(m.data) + len(m.subject) + headers + MSG_OVERHEAD_BYTES


class _Buffer:
    """Messages (with their sizes) and flow-control requests, in arrival order. Bounded by
    the reader, which waits on ``room`` (see the module docstring)."""

    def __init__(self, *, msgs_max: int, bytes_max: int) -> None:
        self._items: deque[tuple[Msg | _FlowControl, int]] = deque()
        self.msgs = 0
        self.bytes = 0
        self._msgs_max = msgs_max
        self._bytes_max = bytes_max
        self.changed = asyncio.Event()

    def full(self) -> bool:
        return self.msgs >= self._msgs_max or self.bytes >= self._bytes_max

    def put(self, item: Msg | _FlowControl, size_bytes: int) -> None:
        self._items.append((item, size_bytes))
        if isinstance(item, Msg):
            self.msgs += 1
            self.bytes += size_bytes
        self.changed.set()

    def pop(self) -> Msg | _FlowControl | None:
        if not self._items:
            return None
        item, size = self._items.popleft()
        if isinstance(item, Msg):
            self.msgs -= 1
            self.bytes -= size
        self.changed.set()
        return item

    def clear(self) -> None:
        self._items.clear()
        self.msgs = self.bytes = 0
        self.changed.set()

    def __len__(self) -> int:
        return len(self._items)

    async def wait_changed(self) -> None:
        self.changed.clear()
        await self.changed.wait()


class _HungNode:
    """The node that last missed heartbeats (``addr``: None once a call delivers, or once
    every other seed server was tried), and where the next call goes instead."""

    def __init__(self) -> None:
        self.addr: str | None = None
        self._turn = 0

    def missed(self, addr: str) -> None:
        self.addr = addr
        self._turn = 0

    def elsewhere(self, router: Router, stream: str) -> str | None:
        """Where the next call goes after a node missed heartbeats (None: the router's
        choice). The router would send it back to that node while its leader hint or its
        current server names it (a hung node refuses no connection): then each other seed
        server once, in turn, before the router's choice is taken again (the other seeds may
        be down while that node is back). Only this choice avoids the node: a NOT_LEADER
        hint naming it is followed (the servers know best; it may lead again)."""
        avoid = self.addr
        if avoid is None or router.target(stream) != avoid:
            return None
        others = [s for s in router.servers if s != avoid]
        self._turn += 1
        if self._turn > len(others):
            self.addr = None  # every other one tried: the router's choice
            return None
        return others[self._turn - 1]


def _reattach_wait(quick_failures: int) -> float:
    """The wait before a new call: backoff by failures since the last call that delivered
    anything (a long-lived call that ends resets it), not by tenacity's attempt count."""
    doublings = min(quick_failures, 16)
    base = min(REATTACH_WAIT_MAX_S, math.ldexp(REATTACH_WAIT_INITIAL_S, doublings))
    return base + random.uniform(0, REATTACH_WAIT_INITIAL_S)


class PushSubscription:
    """A push subscription (see the module docstring). Made by ``Client.subscribe``.

    ``on_close`` runs once when the subscription ends by ``unsubscribe``/``drain``: it
    deletes the consumer when the SDK created it, and releases the client's bookkeeping.
    """

    def __init__(
        self,
        *,
        router: Router,
        acker: AckSender,
        target: PushTarget,
        subject: str,
        error_cb: ErrorCallback,
        cb: MsgCallback | None = None,
        manual_ack: bool = False,
        pending_msgs_max: int = PENDING_MSGS_MAX,
        pending_bytes_max: int = PENDING_BYTES_MAX,
        connect_timeout_s: float = 5.0,
        on_close: Callable[[], Awaitable[None]] | None = None,
        consumer_info: Callable[[str, str], Awaitable[ConsumerInfo]] | None = None,
    ) -> None:
        if pending_msgs_max < 1 or pending_bytes_max < 1:
            raise errors.InvalidArgumentError("pending_msgs_max", "limits must be positive")
        self._router = router
        self._acker = acker
        self._target = target
        self.subject = subject
        self._error_cb = error_cb
        self._cb = cb
        self._manual_ack = manual_ack
        self._buffer = _Buffer(msgs_max=pending_msgs_max, bytes_max=pending_bytes_max)
        self._connect_timeout_s = connect_timeout_s
        self._on_close = on_close
        self._consumer_info = consumer_info
        self._requests: asyncio.Queue[pb.ConsumeRequest | None] | None = None
        self._call_no = 0  # counts the Consume calls opened
        # Flow-control tokens answered lately on the current call (a request may come again
        # in heartbeats). Per call: another leader may ask with a token answered before.
        self._answered: deque[str] = deque(maxlen=FC_ANSWERED_REMEMBERED_MAX)
        # A node that missed heartbeats: the next call goes elsewhere if routed to it again.
        self._hung = _HungNode()
        self._last_cseq = 0
        self._last_sseq = 0
        self._quick_failures = 0
        self._error: errors.RaftStreamError | None = None
        self._intake_done = False  # no more messages will be buffered
        self._closed = False
        self._reader: asyncio.Task[None] | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None  # a drain called from the callback
        self._in_cb = False

    # -- public surface ---------------------------------------------------------------------

    @property
    def stream(self) -> str:
        return self._target.stream

    @property
    def consumer(self) -> str:
        return self._target.consumer

    @property
    def queue(self) -> str | None:
        return self._target.queue

    @property
    def pending(self) -> int:
        """Messages buffered and not yet handed to the application."""
        return self._buffer.msgs

    @property
    def pending_bytes(self) -> int:
        return self._buffer.bytes

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def consumer_info(self) -> ConsumerInfo:
        """The current consumer's ``ConsumerInfo``."""
        if self._consumer_info is None:
            raise errors.InvariantError("no consumer_info callback")
        return await self._consumer_info(self.stream, self.consumer)

    def start(self) -> None:
        """Start the reader (and the dispatcher with a callback) on the running loop."""
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._run(), name=f"push:{self.stream}/{self.consumer}")
        if self._cb is not None:
            self._dispatcher = loop.create_task(self._dispatch(), name="push-dispatch")

    async def next_msg(self, timeout: float | None = 1.0) -> Msg:
        """The next message, waiting up to ``timeout`` seconds (None: forever).

        Raises ``DeadlineExceededError`` when none came, the subscription's terminal error
        (``ConflictError``...) once the buffer is empty after it ended with one, and
        ``SubscriptionClosedError`` once it is closed (or drained and empty). Not with a
        callback (``InvalidArgumentError``).
        """
        if self._cb is not None:
            raise errors.InvalidArgumentError("next_msg", "not with a message callback")
        # A buffered message is handed over without a turn of the loop or a timer (not
        # wait_for: on 3.11 it runs a task per call), so a next_msg/ack loop queues its acks
        # together and they leave in one stream write instead of one each.
        msg = self._take()
        if msg is not None:
            return msg
        try:
            async with asyncio.timeout(timeout):
                return await self._next()
        except TimeoutError:
            raise errors.DeadlineExceededError(
                f"no message within {timeout}s", stream=self.stream
            ) from None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Msg:
        """Messages until the subscription is closed (or drained and empty); its terminal
        error is raised."""
        try:
            return await self.next_msg(timeout=None)
        except errors.SubscriptionClosedError:
            raise StopAsyncIteration from None

    async def unsubscribe(self) -> None:
        """Stop at once: buffered messages are dropped (unacked ones are redelivered after
        their ack wait), then the consumer is deleted if the SDK created it (never a queue
        group's: ``raftstream/subscribe.py``). Raises the delete's error (the subscription
        is closed either way). May be called from the subscription's own callback."""
        if self._closed:
            return
        await self._stop_intake()
        self._buffer.clear()
        await self._finish()

    async def drain(self, timeout: float | None = None) -> None:
        """Stop receiving, let the application (callback, ``next_msg`` or iteration) take what
        is buffered, then close and delete the consumer if the SDK created it.

        Waits up to ``timeout`` seconds (None: no limit) for the buffer to empty; if it does
        not, the rest is dropped, the consumer is still deleted, and ``DeadlineExceededError``
        is raised. A delete failure raises its error. Called from the subscription's own
        callback, it returns at once: the buffered messages go to the callback after it
        returns, then the subscription closes (a failure then goes to the error callback).
        """
        if self._closed:
            return
        await self._stop_intake()
        if _CALLBACK_OF.get() is self:
            # Called from this subscription's own callback: what is buffered can only be
            # handed out once that callback returns, so the rest of the drain goes on in a
            # task of its own (its failure goes to the error callback), and this returns.
            self._draining = asyncio.get_running_loop().create_task(self._drain_later(timeout))
            return
        await self._drain_rest(timeout)

    async def _drain_rest(self, timeout: float | None) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self._drained()
        except TimeoutError:
            left = self._buffer.msgs
            self._buffer.clear()
            await self._finish()
            raise errors.DeadlineExceededError(
                f"drain: {left} messages still buffered after {timeout}s", stream=self.stream
            ) from None
        await self._finish()

    async def _drain_later(self, timeout: float | None) -> None:
        try:
            await self._drain_rest(timeout)
        except errors.RaftStreamError as exc:
            self._error_cb(exc)

    # -- closing ----------------------------------------------------------------------------

    async def _stop_intake(self) -> None:
        self._intake_done = True
        self._buffer.changed.set()
        task, self._reader = self._reader, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._end_call()

    async def _drained(self) -> None:
        while len(self._buffer) or self._busy:
            await self._buffer.wait_changed()

    @property
    def _busy(self) -> bool:
        return self._cb is not None and self._in_cb

    async def _finish(self) -> None:
        self._closed = True
        self._buffer.changed.set()
        task, self._dispatcher = self._dispatcher, None
        # From the callback itself (``unsubscribe`` in it, maybe under ``wait_for``) the
        # dispatcher is awaiting the caller: cancelled, it would stop the caller before the
        # consumer is deleted. It ends on its own once the callback returns (closed).
        if task is not None and _CALLBACK_OF.get() is not self:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            await on_close()

    async def shutdown(self) -> None:
        """Stop without deleting anything (the client is closing)."""
        await self._stop_intake()
        self._buffer.clear()
        self._on_close = None
        await self._finish()

    # -- handing messages out ---------------------------------------------------------------

    def _take(self) -> Msg | None:
        """The next buffered message (None: none), answering the flow-control requests
        before it."""
        while True:
            item = self._buffer.pop()
            if not isinstance(item, _FlowControl):
                return item
            self._answer(item.token, remember=item.call_no == self._call_no)

    async def _next(self) -> Msg:
        while True:
            msg = self._take()
            if msg is not None:
                return msg
            if self._error is not None:
                raise self._error
            if self._closed or self._intake_done:
                raise errors.SubscriptionClosedError("the subscription is closed")
            await self._buffer.wait_changed()

    async def _dispatch(self) -> None:
        """The callback loop: one message at a time, in order; auto-ack after the callback
        returns unless ``manual_ack`` (or ack policy none). A callback that raises goes to the
        error callback as ``CallbackError`` (its exception the cause) and its message is not
        acked (it comes again after the ack wait)."""
        cb = self._cb
        if cb is None:
            return
        while True:
            try:
                msg = await self._next()
            except errors.RaftStreamError:
                return
            self._in_cb = True
            token = _CALLBACK_OF.set(self)  # seen by tasks the callback starts, too
            try:
                await cb(msg)
                if not self._manual_ack:
                    await msg.ack()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                err = errors.CallbackError(
                    f"push {self.stream}/{self.consumer}: the callback raised {exc!r}; the "
                    "message is not acked (it comes again after its ack wait)",
                    stream=self.stream,
                    consumer=self.consumer,
                )
                err.__cause__ = exc
                self._error_cb(err)
            finally:
                _CALLBACK_OF.reset(token)
                self._in_cb = False
                self._buffer.changed.set()

    # -- the Consume call -------------------------------------------------------------------

    async def _run(self) -> None:
        """The reader: sessions until closed; a terminal error ends the subscription."""

        def wait(state: RetryCallState) -> float:
            return _reattach_wait(self._quick_failures)

        addr: list[str | None] = [None]
        retrying = AsyncRetrying(retry=retry_if_exception_type(Reattach), wait=wait, reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    try:
                        await self._session(addr[0])
                    except Reattach as r:
                        self._quick_failures += 1
                        addr[0] = r.leader_addr
                        log.info("raftstream: push %s reattaching: %s", self.consumer, r.cause)
                        raise
        except errors.RaftStreamError as exc:
            self._fail(exc)

    def _fail(self, exc: errors.RaftStreamError) -> None:
        self._error = exc
        self._intake_done = True
        self._buffer.changed.set()
        self._error_cb(exc)

    async def _session(self, addr: str | None) -> None:
        """One Consume call, read until it ends. Raises ``Reattach`` for what a new call may
        cure and a ``RaftStreamError`` for what it cannot."""
        await self._before_attach()
        try:
            stubs = await self._router.connect(
                self.stream,
                timeout_s=self._connect_timeout_s,
                addr=addr or self._hung.elsewhere(self._router, self.stream),
            )
        except errors.UnavailableError as exc:
            raise Reattach(exc) from None
        requests: asyncio.Queue[pb.ConsumeRequest | None] = asyncio.Queue(REQUESTS_QUEUED_MAX)
        start = pb.ConsumeStart(
            stream=self.stream, consumer=self.consumer, queue=self._target.queue or ""
        )
        requests.put_nowait(pb.ConsumeRequest(start=start))
        self._requests = requests
        self._call_no += 1
        self._answered.clear()  # answers are per call (module docstring)
        call = stubs.consume.Consume(_request_iter(requests))
        try:
            await self._read(call)
        except grpc.RpcError as err:
            raise self._classify(from_rpc_error(err)) from None
        except Reattach as r:
            if isinstance(r.cause, errors.MissedHeartbeatError):
                self._hung.missed(stubs.addr)
            raise
        finally:
            call.cancel()
            self._end_call()

    def _end_call(self) -> None:
        requests, self._requests = self._requests, None
        if requests is not None:
            with contextlib.suppress(asyncio.QueueFull):  # the call is cancelled anyway
                requests.put_nowait(None)

    def _classify(self, exc: errors.RaftStreamError) -> BaseException:
        """A failed call: reattach (retriable) or end the subscription. CANCELLED counts as
        retriable here: this side cancels a call only while stopping, so one seen while
        reading came from the server or the transport (a node shutting down)."""
        if isinstance(exc, errors.NotLeaderError):
            return Reattach(exc, exc.leader_addr)
        if exc.retriable or exc.code == errors.Code.CANCELLED:
            return Reattach(exc)
        return exc

    async def _read(self, call: Any) -> None:
        hb_ns = self._target.idle_heartbeat_ns
        idle_s = hb_ns * HEARTBEAT_MISSES_MAX / NS_PER_S if hb_ns else None
        reading: asyncio.Future[Any] | None = None
        try:
            while True:
                while self._buffer.full():
                    await self._buffer.wait_changed()  # backpressure: stop reading
                # The read outlives a heartbeat timeout: cancelling it would end the call.
                reading = reading or asyncio.ensure_future(call.read())
                done, _ = await asyncio.wait({reading}, timeout=idle_s)
                if not done:
                    # The node may hang with its connection open while another leads the
                    # stream: report it, then try a new call (module docstring).
                    await self._missed_heartbeat(idle_s or 0.0)
                    raise Reattach(self._missed_error(idle_s or 0.0))
                resp, reading = reading.result(), None
                if resp is grpc.aio.EOF:
                    raise Reattach(errors.UnavailableError("the server ended the push call"))
                self._quick_failures = 0
                self._hung.addr = None
                await self._handle(resp)
        finally:
            if reading is not None:
                reading.cancel()

    async def _handle(self, resp: pb.ConsumeResponse) -> None:
        """One response, in the proto's order: messages, flow control, heartbeat, ack
        results, status."""
        for m in resp.messages:
            await self._on_msg(m)
        if resp.HasField("flow_control"):
            self._buffer.put(_FlowControl(resp.flow_control.token, self._call_no), 0)
        if resp.HasField("heartbeat"):
            await self._on_heartbeat(resp.heartbeat)
        for r in resp.ack_results:
            if r.HasField("error"):
                self._error_cb(from_error_message(r.error))
        if resp.HasField("status"):
            self._on_status(resp.status)

    def _on_status(self, status: pb.PullStatus) -> None:
        text = f"{status.code} {status.description}".strip()
        if status.code == STATUS_CONFLICT and status.description.startswith(LEADERSHIP_CHANGE):
            raise Reattach(errors.UnavailableError(text, stream=self.stream))
        raise errors.ConflictError(
            f"push {self.stream}/{self.consumer}: {text}",
            status=status.code,
            description=status.description,
        )

    # -- hooks (the ordered consumer overrides them) ----------------------------------------

    async def _before_attach(self) -> None:
        """Called before each call is opened."""

    async def _on_msg(self, m: pb.Msg) -> None:
        msg = self._make_msg(m)
        if self._target.check_gaps:
            cseq = msg.metadata.consumer_seq
            if self._last_cseq and cseq > self._last_cseq + 1:
                await self._gap(self._last_cseq + 1, cseq)
            self._last_cseq = max(self._last_cseq, cseq)
        self._last_sseq = max(self._last_sseq, m.seq)
        self._buffer.put(msg, msg_size_bytes(m))

    async def _on_heartbeat(self, hb: pb.Heartbeat) -> None:
        if hb.stalled:
            self._answer(hb.stalled)
        if self._target.check_gaps and hb.last_consumer_seq > self._last_cseq:
            await self._gap(self._last_cseq + 1, hb.last_consumer_seq)
            self._last_cseq = hb.last_consumer_seq

    async def _gap(self, expected: int, got: int) -> None:
        self._error_cb(
            errors.SequenceGapError(
                f"push {self.stream}/{self.consumer}: consumer sequence gap, "
                f"expected {expected}, got {got}",
                expected=expected,
                got=got,
            )
        )

    async def _missed_heartbeat(self, idle_s: float) -> None:
        """Report missed heartbeats to the error callback; the reader then gives up the
        call (``Reattach``)."""
        self._error_cb(self._missed_error(idle_s))

    def _missed_error(self, idle_s: float) -> errors.MissedHeartbeatError:
        return errors.MissedHeartbeatError(
            f"push {self.stream}/{self.consumer}: no heartbeat for {idle_s:.3f}s",
            stream=self.stream,
            consumer=self.consumer,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _make_msg(self, m: pb.Msg) -> Msg:
        return Msg(
            subject=m.subject,
            data=m.data,
            headers=dict(m.headers) if m.headers else None,
            reply=m.reply,
            sender=self._acker,
            acks_ignored=self._target.ack_none,
            stream=self._target.stream,
            consumer=self._target.consumer,  # ack() goes as a sequence of an AckRun
            stream_seq=m.seq,
        )

    def _answer(self, token: str, *, remember: bool = True) -> None:
        """Answer a flow-control request once per call (on the current call; the server
        ignores an answer to a request it no longer waits for). ``remember=False``: a
        request that came on an earlier call, answered without counting as answered on
        this one (this call's leader may ask with the same token). A full request queue
        drops the answer: the server asks again in its next heartbeat's ``stalled``."""
        if not token or token in self._answered or self._requests is None:
            return
        reply = pb.ConsumeRequest(flow_control_replies=[pb.FlowControlReply(token=token)])
        try:
            self._requests.put_nowait(reply)
        except asyncio.QueueFull:
            return
        if remember:
            self._answered.append(token)


async def _request_iter(
    requests: asyncio.Queue[pb.ConsumeRequest | None],
) -> AsyncIterator[pb.ConsumeRequest]:
    while (req := await requests.get()) is not None:
        yield req
