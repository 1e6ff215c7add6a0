"""Push delivery: one ``ConsumeService.Consume`` call (a bidirectional stream).

The client's first request names a push consumer (``ConsumeStart``; its ``queue`` must be
the consumer's ``deliver_group``); the call must reach the stream leader (NOT_LEADER
otherwise, before any response). An attached call is the consumer's interest: only attached
calls drive delivery. Several calls on one consumer (a queue group's members) share its
deliveries one message at a time in turn (``PushMembers``): the call that takes a step
deals its deliveries round robin to every attached call, itself included, and each call
sends what was dealt to it, in the order dealt. Every apply wakes every attached call and
the first to run takes all there is, so without dealing one member of a queue group got a
whole burst (smaller steps only split bursts larger than a step). A member whose client
reads slowly holds what was dealt to it; with ``DEALT_MSGS_MAX`` unsent it is passed over
until it catches up. What a call holds when it ends is not sent: like any unacked
delivery, it is redelivered (to a member still attached) after ack wait. With one call
attached a step is sent as it is, nothing dealt.

A ``PushSession`` runs two tasks on the node's loop: the driver, which asks the leader copy
for a push step (deliveries, a flow-control request when the window is used up, an idle
heartbeat) whenever the stream applies something, a flow-control reply arrives, or the
step's wake-up time comes; and the reader, which takes flow-control replies and acks
(acked through the stream leader; a failed or sync ack answers with an ``AckResult``).
Responses wait in a bounded queue (``PUSH_QUEUE_RESPONSES_MAX``): when the client reads
slowly, the driver waits, so a slow client slows its own delivery.

A step's deliveries are sent as soon as its Deliver ops are proposed, as a pull's are
(cluster/stream/group.py says what happens when such an op is lost): the next step is
decided while they commit. At most ``PUSH_STEPS_UNCOMMITTED_MAX`` steps of a call are
uncommitted at once; the driver waits for the oldest before deciding another. That bound is
what keeps an AckNone consumer (no ``max_ack_pending``) from running ahead of Raft.

The call ends with a terminal 409 status when the consumer is deleted or this node stops
leading the stream (the client reattaches; unacked deliveries are redelivered).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from raftstream.cluster.services.context import ServiceContext, account_of, caller_of
from raftstream.cluster.services.convert import add_bounded
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import Delivery
from raftstream.engine.consumer_push import PushStep
from raftstream.errors import (
    InvalidArgumentError,
    PreconditionError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import to_error_message

__all__ = ["PushMembers", "PushSession"]

PUSH_QUEUE_RESPONSES_MAX = 64  # responses waiting for a slow client, per call
PUSH_STEP_MSGS_MAX = 256  # deliveries per step (at most per response)
# Deliveries dealt to a queue group's member and not yet sent: one this far behind is
# passed over (a slow client slows its own share, not the group's).
DEALT_MSGS_MAX = PUSH_STEP_MSGS_MAX
PUSH_STEPS_UNCOMMITTED_MAX = 2  # steps sent before their Deliver ops committed, per call
IDLE_WAIT_S_MAX = 1.0  # the driver looks at leadership at least this often
STATUS_CONFLICT = 409

AckOne = Callable[[pb.AckItem, str, float | None, bool], Awaitable[Any]]


class PushMembers:
    """The Consume calls attached to one leader copy of a push consumer (a queue group's
    members), in the order they attached, and whose turn the next delivery is. Owned by the
    node's loop; a rebuilt copy starts a new one (its old calls end: module docstring)."""

    def __init__(self) -> None:
        self._calls: list[PushSession] = []
        self._turn = 0  # index in _calls of the call the next delivery goes to

    def __len__(self) -> int:
        return len(self._calls)

    def join(self, call: PushSession) -> None:
        self._calls.append(call)

    def leave(self, call: PushSession) -> None:
        """Idempotent. What was dealt to ``call`` stays with it (unsent, redelivered after
        ack wait); the turn stays with the call that was next."""
        with contextlib.suppress(ValueError):
            i = self._calls.index(call)
            del self._calls[i]
            if i < self._turn:
                self._turn -= 1
            if self._turn >= len(self._calls):
                self._turn = 0

    def deal(self, deliveries: Sequence[Delivery], dealer: PushSession) -> None:
        """Deal ``deliveries`` (in order) one at a time in turn onto the calls' ``_dealt``,
        passing over a call holding ``DEALT_MSGS_MAX`` unsent but never ``dealer`` (it sends
        its share right away; it also takes what no call has room for: these are handed out
        already), and wake the calls dealt to."""
        calls = self._calls
        n = len(calls)
        for d in deliveries:
            to = dealer
            for _ in range(n):
                call = calls[self._turn]
                self._turn = (self._turn + 1) % n
                if call is dealer or len(call._dealt) < DEALT_MSGS_MAX:
                    to = call
                    break
            to._dealt.append(d)
        for call in calls:
            if call is not dealer and call._dealt:
                call._nudge.set()


# The members of each leader copy attached to on this node (gone with the copy).
_MEMBERS: weakref.WeakKeyDictionary[Consumer, PushMembers] = weakref.WeakKeyDictionary()


class PushSession:
    """One attached Consume call (see the module docstring)."""

    def __init__(self, ctx: ServiceContext, ack_one: AckOne) -> None:
        self._ctx = ctx
        self._ack_one = ack_one
        self._out: asyncio.Queue[pb.ConsumeResponse] = asyncio.Queue(PUSH_QUEUE_RESPONSES_MAX)
        self._nudge = asyncio.Event()
        # Deliveries dealt to this call by any member's step (its own too), sent in order.
        self._dealt: collections.deque[Delivery] = collections.deque()

    async def run(
        self, requests: AsyncIterator[pb.ConsumeRequest], context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        first = await anext(requests, None)
        if first is None or not first.HasField("start"):
            raise InvalidArgumentError("start", "the first request must be a ConsumeStart")
        start = first.start
        caller_of(context).check_read(start.stream)
        account = account_of(context)
        g = await self._ctx.leader_group(account, start.stream)
        c = g.leader_consumer(start.consumer)
        if c.config.is_pull:
            raise PreconditionError(f"consumer {c.name!r} is a pull consumer")
        if (start.queue or None) != c.config.deliver_group:
            raise InvalidArgumentError("queue", "must be the consumer's deliver_group")
        waker = g.push_waker(c.name)
        timeout_s = self._ctx.config.limits.request_timeout_ms / 1000
        reader = asyncio.ensure_future(self._read(first, requests, c, account, timeout_s))
        driver = asyncio.ensure_future(self._drive(g, c, waker, timeout_s))
        try:
            while True:
                resp = await self._out.get()
                yield resp
                if resp.HasField("status"):
                    return
        finally:
            g.drop_push_waker(c.name, waker)
            for t in (reader, driver):
                t.cancel()
            await asyncio.gather(reader, driver, return_exceptions=True)

    # -- delivering ----------------------------------------------------------------------

    async def _drive(
        self, g: StreamGroup, c: Consumer, waker: asyncio.Event, timeout_s: float
    ) -> None:
        members = _MEMBERS.setdefault(c, PushMembers())
        members.join(self)
        try:
            await self._steps(g, c, waker, timeout_s, members)
        except RaftStreamError as exc:
            members.leave(self)  # before the terminal status: nothing more is dealt to it
            reason = "Consumer Deleted" if c.deleted else f"Leadership Change ({exc.reason})"
            await self._out.put(
                pb.ConsumeResponse(status=pb.PullStatus(code=STATUS_CONFLICT, description=reason))
            )
        finally:
            members.leave(self)

    async def _steps(
        self,
        g: StreamGroup,
        c: Consumer,
        waker: asyncio.Event,
        timeout_s: float,
        members: PushMembers,
    ) -> None:
        uncommitted: collections.deque[asyncio.Future[Any]] = collections.deque()
        while True:
            await self._committed(uncommitted, PUSH_STEPS_UNCOMMITTED_MAX - 1)
            if c.deleted or not g.ready or g.leader_consumer(c.name) is not c:
                raise PreconditionError("leadership changed or consumer deleted")
            waker.clear()
            self._nudge.clear()
            step, commit = await g.push_step(c, PUSH_STEP_MSGS_MAX, timeout_s)
            if commit is not None:
                uncommitted.append(commit)
            taken = len(step.deliveries)
            if len(members) > 1 or self._dealt:  # one call alone sends its step as it is
                members.deal(step.deliveries, self)
                step = dataclasses.replace(step, deliveries=tuple(self._dealt))
                self._dealt.clear()
            await self._send(step)
            if taken < PUSH_STEP_MSGS_MAX:
                await self._wait(waker, step.wake_at_ns)
            else:  # a full step: there may be more now (no apply will say so)
                await asyncio.sleep(0)

    @staticmethod
    async def _committed(uncommitted: collections.deque[asyncio.Future[Any]], left: int) -> None:
        """Wait until at most ``left`` steps are uncommitted (oldest first); a step whose
        ops failed to commit raises its error (the group has dropped its copies: the call
        ends, the client reattaches). Never cancels a proposal: the group watches each."""
        while uncommitted and (len(uncommitted) > left or uncommitted[0].done()):
            fut = uncommitted[0]
            await asyncio.wait((fut,))
            uncommitted.popleft()
            exc = None if fut.cancelled() else fut.exception()
            if isinstance(exc, RaftStreamError):
                raise exc
            if fut.cancelled() or exc is not None:
                raise UnavailableError(f"a push step's ops did not commit: {exc!r}")

    async def _send(self, step: PushStep) -> None:
        """The step's deliveries, as many responses as keep each within one largest message
        in bytes (so each fits the gRPC message limit, as fetch responses), the last one
        with the flow-control request and the heartbeat."""
        bound_bytes = self._ctx.config.limits.message_bytes_max
        resp = pb.ConsumeResponse()
        size_bytes = 0
        for d in step.deliveries:
            size_bytes = add_bounded(resp.messages, d, size_bytes, bound_bytes)
            if size_bytes < 0:
                await self._out.put(resp)  # waits while the client is slow: bounded
                resp = pb.ConsumeResponse()
                size_bytes = add_bounded(resp.messages, d, 0, bound_bytes)
        if step.flow_control:
            resp.flow_control.CopyFrom(pb.FlowControlRequest(token=step.flow_control))
        if step.heartbeat is not None:
            hb = step.heartbeat
            resp.heartbeat.CopyFrom(
                pb.Heartbeat(
                    last_consumer_seq=hb.last_consumer_seq,
                    last_stream_seq=hb.last_stream_seq,
                    stalled=hb.stalled or "",
                )
            )
        if resp.messages or step.flow_control or step.heartbeat is not None:
            await self._out.put(resp)  # waits while the client is slow: bounded

    async def _wait(self, waker: asyncio.Event, wake_at_ns: int) -> None:
        timeout = IDLE_WAIT_S_MAX
        if wake_at_ns:
            timeout = max(0.0, min(timeout, (wake_at_ns - self._ctx.clock.time_ns()) / 1e9))
        waits = [asyncio.ensure_future(waker.wait()), asyncio.ensure_future(self._nudge.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    # -- reading -------------------------------------------------------------------------

    async def _read(
        self,
        first: pb.ConsumeRequest,
        requests: AsyncIterator[pb.ConsumeRequest],
        c: Consumer,
        account: str,
        timeout_s: float,
    ) -> None:
        await self._handle(first, c, account, timeout_s)
        async for req in requests:
            await self._handle(req, c, account, timeout_s)

    async def _handle(
        self, req: pb.ConsumeRequest, c: Consumer, account: str, timeout_s: float
    ) -> None:
        for reply in req.flow_control_replies:
            if c.flow_control_reply(reply.token):
                self._nudge.set()
        for item in req.acks:
            result = await self._ack(item, account, timeout_s)
            if result is not None:
                await self._out.put(pb.ConsumeResponse(ack_results=[result]))
        if req.acks:
            self._nudge.set()  # room under max_ack_pending, maybe

    async def _ack(self, item: pb.AckItem, account: str, timeout_s: float) -> pb.AckResult | None:
        try:
            await self._ack_one(item, account, timeout_s, False)
        except RaftStreamError as exc:
            return pb.AckResult(id=item.id, error=to_error_message(exc))
        return pb.AckResult(id=item.id) if item.sync else None
