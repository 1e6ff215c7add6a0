"""``raftstream.v1.ConsumeService``: pull ``Fetch``, ``Ack`` and ``AckStream``.

Fetch is served by the stream leader (consumers replicate through their stream's group, so
the stream leader is the consumer leader); elsewhere it fails NOT_LEADER with the leader's
address before any response, and the SDK follows the hint. Deliveries reach the client once
their Deliver op is proposed (``cluster/stream/group.py``).

Acks go to the stream leader as well: served here when this node leads, else forwarded one
hop. An ack is answered after its op committed (a sync ack, and every unary ``Ack``), so an
acknowledged ack survives the loss of any one node and an acked message is never
redelivered after a failover. An ack (or nak, progress, term) of a sequence the consumer
has not delivered is refused with FAILED_PRECONDITION and changes nothing: that is a
delivery whose Deliver op a leader change lost, and the message will be delivered again,
so confirming the ack would be a lie (JetStream answers such an AckSync as if it were
acked; ``ack_sync`` promises more: a message it confirmed is never delivered again). A
planned leader change loses no delivery (``cluster/stream/group.py``, "Leadership
transfers"): an ack that arrives during one waits for its end, then is decided here or
fails NOT_LEADER with nothing decided (``ack_sync``'s unary ``Ack`` is then retried at the
new leader; the acks of an ``AckStream`` batch are sent on to the new leader from here, as
a node that does not lead forwards them). ``AckStream`` answers only failures and sync
acks (proto).

An ``AckRun`` (proto) is plain +ACKs of one consumer by stream sequence, the SDK's compact
form for the messages it fetched: no token per ack to send, read and parse. A run in an
``AckStream`` batch is decided as one op (proposed lazily, as the batch's plain acks are);
its refusals come back as one ``AckResult`` with id 0; on a node that does not lead it is
sent on to the leader as a unary ``Ack`` carrying the run.

``Consume`` (push delivery) runs a ``PushSession`` (``cluster/services/push.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

from raftstream.cluster.config import Limits
from raftstream.cluster.security.auth_values import caller
from raftstream.cluster.security.limits_fields import check_ack, check_ack_run
from raftstream.cluster.security.limits_interceptor import capped_time_left
from raftstream.cluster.services.context import ServiceContext, account_of, time_left
from raftstream.cluster.services.convert import add_bounded, pull_status_pb
from raftstream.cluster.services.push import PushSession
from raftstream.cluster.stream.group import PullHandle, StreamGroup
from raftstream.engine.ack import AckMetadata
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import PullEvent
from raftstream.errors import (
    InvalidArgumentError,
    NoLeaderError,
    NotLeaderError,
    PreconditionError,
    RaftStreamError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import map_errors, to_error_message

__all__ = ["ConsumeServicer"]

_ACK = "/raftstream.v1.ConsumeService/Ack"
ACKS_INFLIGHT_MAX = 4096  # per AckStream call: reading stops while this many are unanswered
FETCH_MSGS_PER_RESPONSE_MAX = 256
RUN_REFUSED_SEQS_NAMED = 5  # a refusal of a run's acks names at most this many sequences
# Ack items refused as not delivered (``undelivered``), each with its error.
_Refused = list[tuple[pb.AckItem, Exception]]
_K = TypeVar("_K")
# A +NXT ack's messages count their subjects too (JetStream's max_bytes): room for the
# subject of one largest message, which the answer must still hold.
NEXT_SUBJECT_BYTES = 32 * 1024
EXPIRES_MARGIN_S = 0.05  # a request without expiry ends this long before the deadline


def _fetch_request(request: pb.FetchRequest, left_s: float | None) -> dict[str, Any]:
    if request.batch < 1:
        raise InvalidArgumentError("batch", "must be at least 1")
    expires = request.expires_ns
    if expires <= 0 and left_s is not None and not request.no_wait:
        expires = int(max(0.001, left_s - EXPIRES_MARGIN_S) * 1e9)
    return {
        "batch": request.batch,
        "expires": max(0, expires),
        "no_wait": request.no_wait,
        "max_bytes": request.max_bytes,
        "idle_heartbeat": max(0, request.idle_heartbeat_ns),
    }


def undelivered(c: Consumer, seq: int) -> PreconditionError | None:
    """The error for an ack of ``seq`` when the leader copy ``c`` has not delivered it
    (it is still ahead of the cursor), else None (module docstring). Consumers without acks
    take any ack as a no-op, as before."""
    if not c.config.acks_required or not c.state.will_deliver(seq):
        return None
    return _undelivered_error(c.name, seq)


def _undelivered_error(consumer: str, seq: int) -> PreconditionError:
    return PreconditionError(
        f"ack: consumer {consumer!r} has not delivered stream sequence {seq} (a delivery lost"
        " with a leader change is delivered again; ack that one)"
    )


def fire_and_forget(items: Sequence[pb.AckItem]) -> bool:
    """Whether nobody waits for the answer to ``items`` but a failure (no ``sync`` one):
    their op is then proposed lazily (docs/cluster-design.md, "Acks go with the next
    entry")."""
    return not any(item.sync for item in items)


def _run_refusal(run: pb.AckRun, refused: Sequence[int]) -> RaftStreamError:
    """One error for the stream sequences of ``run`` refused as not delivered (made once
    per run, never per sequence: a run of never-delivered ones costs one error)."""
    if len(refused) == 1:
        return _undelivered_error(run.consumer, refused[0])
    seqs = ", ".join(str(seq) for seq in refused[:RUN_REFUSED_SEQS_NAMED])
    more = ", ..." if len(refused) > RUN_REFUSED_SEQS_NAMED else ""
    return PreconditionError(
        f"ack: consumer {run.consumer!r} has not delivered {len(refused)} of the stream "
        f"sequences acked ({seqs}{more}; a delivery lost with a leader change is delivered "
        "again; ack that one)"
    )


def _decide_ack(c: Consumer, item: pb.AckItem, seq: int, cseq: int) -> Any:
    """The leader copy's decision for one ack item, as a ``run`` callback; raises
    ``undelivered``'s error, deciding nothing."""

    def decide(now: int) -> list[PullEvent]:
        refused = undelivered(c, seq)
        if refused is not None:
            raise refused
        if item.kind == pb.ACK_KIND_NAK:
            c.nak(seq, now, delay_ns=max(0, item.delay_ns), consumer_seq=cseq)
        elif item.kind == pb.ACK_KIND_PROGRESS:
            c.progress(seq, now, consumer_seq=cseq)
        elif item.kind == pb.ACK_KIND_TERM:
            c.term(seq, now, reason=item.reason)
        else:
            c.ack(seq, now)
        return []

    return decide


class ConsumeServicer(pbg.ConsumeServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    # -- fetch -------------------------------------------------------------------------------

    @map_errors
    async def Fetch(
        self, request: pb.FetchRequest, context: Any
    ) -> AsyncIterator[pb.FetchResponse]:
        # Within the server's cap (cluster/security/limits.py): a pull without expires ends with
        # 408 before it, never with the cap's DEADLINE_EXCEEDED.
        left = capped_time_left(time_left(context))
        caller().check_read(request.stream)
        g = await self._ctx.leader_group(account_of(context), request.stream)
        req = _fetch_request(request, left)
        handle = await g.open_pull(request.consumer, req, left)
        try:
            async for resp in _responses(handle, request.batch, self._ctx.config.limits):
                yield resp
        finally:
            handle.close()

    @map_errors
    async def Consume(
        self, request_iterator: AsyncIterator[pb.ConsumeRequest], context: Any
    ) -> AsyncIterator[pb.ConsumeResponse]:
        """Push delivery (``cluster/services/push.py``)."""
        session = PushSession(self._ctx, self.ack_one)
        async for resp in session.run(request_iterator, context):
            yield resp

    # -- acks --------------------------------------------------------------------------------

    async def ack_one(
        self,
        item: pb.AckItem,
        account: str,
        timeout_s: float | None,
        forwarded: bool,
        *,
        patient: bool = True,
        lazy: bool = False,
    ) -> pb.AckResponse:
        """Apply one ack through the stream leader; answered once the op committed.
        ``patient``: forwarded to a group without a leader, it waits for the next one
        (``ServiceContext.to_stream_leader``): a fire-and-forget ack (AckStream, push) has
        no sender to retry it; a unary ``Ack``'s sender retries itself. ``lazy``: nobody
        waits for its answer but a failure (an ``AckStream``'s fire-and-forget ack): its op
        goes with the group's next Raft round (``StreamGroup.run``)."""
        meta = check_ack(item, self._ctx.config.limits)
        caller().check_read(meta.stream)
        sa = await self._ctx.caught_up(lambda: self._ctx.stream(account, meta.stream))
        g = self._ctx.local_group(sa)
        if g is not None and g.ready:
            try:
                c = g.leader_consumer(meta.consumer)
                decide = _decide_ack(c, item, meta.stream_seq, meta.consumer_seq)
                await g.run(c, decide, timeout_s, lazy=lazy and item.kind != pb.ACK_KIND_NEXT)
            except (NotLeaderError, NoLeaderError):
                if forwarded:
                    raise  # the forwarding node follows the hint
                # The leadership moved before the ack was decided (a transfer: nothing of it
                # was): on to the new leader, as from a node that does not lead.
            else:
                return await self._after_ack(g, item, meta.consumer, timeout_s)
        elif forwarded:
            raise self._ctx.hint_for(sa)
        req = pb.AckRequest(ack=item)
        return await self._ctx.to_stream_leader(
            sa, _ACK, req, pb.AckResponse.FromString, timeout_s, patient=patient
        )

    async def _after_ack(
        self, g: StreamGroup, item: pb.AckItem, consumer: str, timeout_s: float | None
    ) -> pb.AckResponse:
        """The answer to an ack decided here: empty, or for +NXT the next messages."""
        if item.kind != pb.ACK_KIND_NEXT:
            return pb.AckResponse()
        # The answer is one gRPC message: a batch and bytes a fetch response would hold.
        limits = self._ctx.config.limits
        req = {
            "batch": min(max(1, item.next_batch), FETCH_MSGS_PER_RESPONSE_MAX),
            "no_wait": True,
            "max_bytes": limits.message_bytes_max + NEXT_SUBJECT_BYTES,
        }
        handle = await g.open_pull(consumer, req, timeout_s)
        out = pb.AckResponse()
        try:
            async for resp in _responses(handle, req["batch"], limits):
                out.messages.extend(resp.messages)
                if resp.HasField("status"):
                    out.status.CopyFrom(resp.status)
        finally:
            handle.close()
        return out

    @map_errors
    async def Ack(self, request: pb.AckRequest, context: Any) -> pb.AckResponse:
        forwarded = self._ctx.forwarded(context)
        if request.HasField("run"):
            refused = await self.ack_run(
                request.run, account_of(context), time_left(context), forwarded, patient=False
            )
            if refused:
                raise _run_refusal(request.run, refused)
            return pb.AckResponse()
        return await self.ack_one(
            request.ack, account_of(context), time_left(context), forwarded, patient=False
        )

    async def ack_run(
        self,
        run: pb.AckRun,
        account: str,
        timeout_s: float | None,
        forwarded: bool,
        *,
        patient: bool = True,
        lazy: bool = False,
    ) -> list[int]:
        """Apply a run of plain acks through the stream leader, answered once its op
        committed; returns the sequences refused as not delivered (``undelivered``), which
        it left out. ``patient`` and ``lazy`` as for ``ack_one``. A node that does not lead
        sends the run on as a unary ``Ack``, whose refusal then raises here.

        The run is checked here (``check_ack_run``: at most ``ACK_RUN_SEQS_MAX`` sequences)
        whichever way it came, and its sequences taken once each in their order: the work
        is O(len) and its op holds no duplicate, so no replica repeats it per copy."""
        check_ack_run(run)
        caller().check_read(run.stream)
        sa = await self._ctx.caught_up(lambda: self._ctx.stream(account, run.stream))
        g = self._ctx.local_group(sa)
        if g is not None and g.ready:
            seqs = list(dict.fromkeys(run.stream_seqs))
            try:
                return await self._ack_many(g, run.consumer, seqs, seqs, timeout_s, lazy=lazy)
            except (NotLeaderError, NoLeaderError):
                if forwarded:
                    raise  # the forwarding node follows the hint
                # A transfer moved the leadership before the run was decided: on to the new
                # leader, as from a node that does not lead.
        elif forwarded:
            raise self._ctx.hint_for(sa)
        req = pb.AckRequest(run=run)
        await self._ctx.to_stream_leader(
            sa, _ACK, req, pb.AckResponse.FromString, timeout_s, patient=patient
        )
        return []

    def _group_acks(
        self, items: Sequence[pb.AckItem], account: str
    ) -> tuple[list[pb.AckItem], dict[tuple[StreamGroup, str], tuple[list[pb.AckItem], list[int]]]]:
        """Split a batch: plain +ACKs for consumers this node leads, grouped per consumer
        (one op, one Raft entry per group: the ack hot path), and everything else."""
        plain: list[pb.AckItem] = []
        grouped: dict[tuple[StreamGroup, str], tuple[list[pb.AckItem], list[int]]] = {}
        groups: dict[str, StreamGroup | None] = {}  # a batch's acks share a stream or few
        for item in items:
            g, meta = self._local_ack(item, account, groups)
            if g is None or meta is None or item.kind != pb.ACK_KIND_ACK:
                plain.append(item)
                continue
            key = (g, meta.consumer)
            found = grouped.get(key)
            if found is None:
                found = grouped[key] = ([], [])
            found[0].append(item)
            found[1].append(meta.stream_seq)
        return plain, grouped

    def _local_ack(
        self, item: pb.AckItem, account: str, groups: dict[str, StreamGroup | None]
    ) -> tuple[StreamGroup | None, AckMetadata | None]:
        """The ack's metadata and its stream's group when this node leads it (ready), else
        (None, None). ``groups`` memoises the answer per stream within one batch."""
        try:
            meta = check_ack(item, self._ctx.config.limits)  # refused: ack_one reports it
        except RaftStreamError:
            return None, None
        if meta.stream not in groups:
            if not caller().permissions.may_read(meta.stream):
                return None, None  # ack_one refuses it, per item
            try:
                g = self._ctx.local_group(self._ctx.stream(account, meta.stream))
            except RaftStreamError:
                g = None
            groups[meta.stream] = g if g is not None and g.ready else None
        g = groups[meta.stream]
        return (g, meta) if g is not None else (None, None)

    async def _ack_many(
        self,
        g: StreamGroup,
        consumer: str,
        items: Sequence[_K],
        seqs: list[int],
        timeout_s: float | None,
        *,
        lazy: bool,
    ) -> list[_K]:
        """+ACK ``seqs`` (of ``items``, what a refusal names) as one op, answered once it
        committed (``lazy``: proposed with the next round, ``StreamGroup.run``); returns
        the items refused as not delivered (``undelivered``), which it left out. O(len):
        one cursor test per sequence, nothing made per refused one (the caller makes the
        errors it reports)."""
        c = g.leader_consumer(consumer)
        refused: list[_K] = []

        def decide(now: int) -> list[PullEvent]:
            known = seqs
            if c.config.acks_required:
                known = []
                ahead = c.state.will_deliver
                for item, seq in zip(items, seqs, strict=True):
                    if ahead(seq):
                        refused.append(item)
                    else:
                        known.append(seq)
            c.ack_many(known, now)
            return []

        await g.run(c, decide, timeout_s, lazy=lazy)
        return refused

    @map_errors
    async def AckStream(
        self, request_iterator: AsyncIterator[pb.AckBatch], context: Any
    ) -> AsyncIterator[pb.AckResultBatch]:
        # Accepted: the client writes nothing before this (raftstream/proto/calls.py).
        await context.send_initial_metadata(())
        session = _AckSession(
            self,
            account_of(context),
            timeout_s=self._ctx.config.limits.request_timeout_ms / 1000,
            forwarded=self._ctx.forwarded(context),
        )
        async with contextlib.aclosing(session.responses(request_iterator)) as responses:
            async for batch in responses:
                yield batch


class _AckSession:
    """One ``AckStream`` call: its acks read and not yet answered (at most
    ``ACKS_INFLIGHT_MAX``), the results waiting to be sent, and the tasks deciding its acks.
    Belongs to the call's task; ``responses`` cancels its reader and tasks when it ends."""

    def __init__(
        self, servicer: ConsumeServicer, account: str, *, timeout_s: float, forwarded: bool
    ) -> None:
        self._svc = servicer
        self._account = account
        self._timeout_s = timeout_s
        self._forwarded = forwarded
        # Acks read and not answered yet: reading waits while a batch would take this past
        # ACKS_INFLIGHT_MAX (a count, not a semaphore: a batch takes its room at once).
        self._inflight = 0
        self._room = asyncio.Event()
        self._results: collections.deque[pb.AckResult | None] = collections.deque()
        self._ready = asyncio.Event()
        self._tasks: set[asyncio.Future[None]] = set()

    async def responses(
        self, request_iterator: AsyncIterator[pb.AckBatch]
    ) -> AsyncGenerator[pb.AckResultBatch, None]:
        """The call's answers: failures and sync acks, in batches as they are decided; ends
        once the client's batches ended and every ack read was answered."""
        rt = asyncio.get_running_loop().create_task(self._read(request_iterator))
        try:
            while True:
                await self._ready.wait()
                self._ready.clear()
                batch = []
                done = False
                while self._results:
                    r = self._results.popleft()
                    if r is None:
                        done = True
                        break
                    batch.append(r)
                if batch:
                    yield pb.AckResultBatch(results=batch)
                if done:
                    return
        finally:
            rt.cancel()
            for t in list(self._tasks):
                t.cancel()

    async def _read(self, request_iterator: AsyncIterator[pb.AckBatch]) -> None:
        try:
            async for batch in request_iterator:
                n = len(batch.acks) + sum(len(run.stream_seqs) for run in batch.runs)
                # An oversized batch still goes once nothing else is in flight.
                while self._inflight and self._inflight + n > ACKS_INFLIGHT_MAX:
                    self._room.clear()
                    await self._room.wait()
                self._inflight += n
                plain, grouped = self._svc._group_acks(batch.acks, self._account)
                for (g, consumer), (items, seqs) in grouped.items():
                    self._spawn(items, self._ack_grouped(g, consumer, items, seqs))
                for item in plain:
                    self._spawn([item], self._one(item))
                for run in batch.runs:
                    self._keep(asyncio.ensure_future(self._settle_run(run)))
        finally:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            self._results.append(None)
            self._ready.set()

    def _report(self, items: list[pb.AckItem], exc: BaseException | None) -> None:
        for item in items:
            if exc is not None:  # reported as the item's result; the call goes on
                self._results.append(pb.AckResult(id=item.id, error=to_error_message(exc)))
            elif item.sync:
                self._results.append(pb.AckResult(id=item.id))
        self._answered(len(items))

    def _answered(self, acks: int) -> None:
        """``acks`` are settled: their room back, their results (if any) to send."""
        self._inflight -= acks
        self._room.set()
        self._ready.set()

    async def _settle(self, items: list[pb.AckItem], work: Awaitable[_Refused]) -> None:
        """Report ``items``: each one ``work`` refused with its error, the rest with
        ``work``'s outcome."""
        try:
            refused = await work
        except Exception as exc:
            self._report(items, exc)
            return
        if not refused:
            self._report(items, None)
            return
        out = {id(item) for item, _ in refused}
        self._report([item for item in items if id(item) not in out], None)
        for item, why in refused:
            self._report([item], why)

    def _spawn(self, items: list[pb.AckItem], work: Awaitable[_Refused]) -> None:
        self._keep(asyncio.ensure_future(self._settle(items, work)))

    def _keep(self, t: asyncio.Future[None]) -> None:
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _settle_run(self, run: pb.AckRun) -> None:
        """Apply ``run``; report its refusals, if any, as one result (id 0)."""
        failure: Exception | None = None
        try:
            refused = await self._svc.ack_run(
                run, self._account, self._timeout_s, self._forwarded, lazy=True
            )
            if refused:
                failure = _run_refusal(run, refused)
        except Exception as exc:
            failure = exc
        if failure is not None:
            self._results.append(pb.AckResult(id=0, error=to_error_message(failure)))
        self._answered(len(run.stream_seqs))

    async def _one(self, item: pb.AckItem) -> _Refused:
        # Refusals raise here. Lazy: only a failure is answered (docs/cluster-design.md).
        await self._svc.ack_one(
            item, self._account, self._timeout_s, self._forwarded, lazy=not item.sync
        )
        return []

    async def _ack_grouped(
        self, g: StreamGroup, consumer: str, items: list[pb.AckItem], seqs: list[int]
    ) -> _Refused:
        lazy = fire_and_forget(items)
        pairs = list(zip(items, seqs, strict=True))  # what a refusal names
        try:
            out = await self._svc._ack_many(g, consumer, pairs, seqs, self._timeout_s, lazy=lazy)
        except (NotLeaderError, NoLeaderError):
            if self._forwarded:
                raise  # the forwarding node follows the hint
        else:
            return [(item, _undelivered_error(consumer, seq)) for item, seq in out]
        # The leadership moved (a transfer) before these acks were decided: nothing of
        # them was, so each goes to the new leader, as from a node that does not lead.
        outcomes = await asyncio.gather(*map(self._one, items), return_exceptions=True)
        refused: _Refused = []
        for item, outcome in zip(items, outcomes, strict=True):
            if isinstance(outcome, Exception):
                refused.append((item, outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
        return refused


async def _responses(
    handle: PullHandle, batch: int, limits: Limits
) -> AsyncIterator[pb.FetchResponse]:
    """The FetchResponses of one pull: messages as they come (grouped when several are
    queued, each filled in place in its response, up to one largest message's bytes per
    response, so every response fits the gRPC message limit), heartbeats, and the terminal
    status; ends when the batch is complete."""
    bound_bytes = limits.message_bytes_max
    got = 0
    queued: collections.deque[PullEvent] = collections.deque()
    while got < batch:
        if not queued:
            queued.extend(await handle.take())
        resp = pb.FetchResponse()
        msgs = resp.messages
        terminal = False
        size_bytes = 0
        while queued:
            ev = queued[0]
            d = ev.delivery
            if d is None:
                queued.popleft()
                if ev.status is not None:
                    resp.status.CopyFrom(pull_status_pb(ev.status))
                    terminal = ev.status.terminal
                break
            if len(msgs) >= FETCH_MSGS_PER_RESPONSE_MAX:
                break
            size_bytes = add_bounded(msgs, d, size_bytes, bound_bytes)
            if size_bytes < 0:
                break  # the first of the next response
            queued.popleft()
            got += 1
            if got >= batch:
                break
        yield resp
        if terminal:
            return
