"""Delivered messages and their acknowledgements.

A ``Msg`` belongs to the event loop of the client that received it. Its ack methods send the
JetStream ack kinds for its ack token (``reply``):

- ``ack()`` (+ACK), ``nak(delay)`` (-NAK), ``in_progress()`` (+WPI) and ``term(reason)``
  (+TERM) are fire-and-forget: they return once the ack is queued on the client's pipelined
  ``AckStream`` (waiting for room when ``ack_pending_msgs_max`` acks are queued). A failure
  the server reports later goes to the client's ``error_cb``; a lost ack only means the
  message is delivered again after its ack wait (at-least-once, as in JetStream). An ack
  nothing of which reached a server (its ``AckStream`` was refused as a whole, or never
  connected) is sent again, within the client's timeout: to the peer a NOT_LEADER refusal
  names, or as a unary ``Ack`` when the node refused the call for ``streaming_calls_max``.
- ``ack_sync()`` answers once the ack is replicated: after it returns, the message is never
  redelivered, not even after a leader failover. It raises the typed error otherwise; in
  particular ``PreconditionError`` when the leader has not delivered this message: a
  leader change lost the delivery (deliveries leave before they are replicated, as in
  JetStream), and the message will be delivered again.

A message the SDK received from its consumer (fetched, or pushed) knows its consumer and
stream sequence: its ``ack()`` goes as that sequence in an ``AckRun`` (proto), which the
acks of the same consumer queued meanwhile join, rather than as an item with its token
(docs/cluster-design.md, "Acks as runs"). The other kinds, and ``ack_sync``, keep the token.

After a terminal ack (ack, ack_sync, nak, term) further acks on the same message are ignored,
as ADR-15 asks; ``in_progress`` may be sent any number of times before one. One exception:
``ack_sync`` is always sent, because what it promises is the server's answer (a
fire-and-forget ack before it may have been refused, or lost with a leader change). A message
of a consumer with ack policy none (``acks_ignored``) ignores every ack.

Arguments are checked before anything is sent or marked: a ``nak`` delay that is no number
of seconds from 0 to ``ACK_DELAY_NS_MAX`` (a str, NaN, a negative number) or a ``term``
reason that is no str or is over ``ACK_REASON_BYTES_MAX`` bytes raises
``InvalidArgumentError`` and the message can still be acked (the node refuses the same, and
a refusal of a fire-and-forget ack only reaches ``error_cb``, later).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from raftstream import errors
from raftstream._conn import NotConnectedError, Router, Stubs
from raftstream._pipeline import Entry, Pipeline, streaming_refused, wait_to_send_again
from raftstream._places import Places
from raftstream.models import MsgMetadata
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import from_error_message

__all__ = ["ACK_DELAY_NS_MAX", "ACK_REASON_BYTES_MAX", "ACK_RUN_SEQS_MAX", "Acker", "Msg"]

_EMPTY: Mapping[str, str] = MappingProxyType({})
NS_PER_S = 1_000_000_000
# The API's bounds on an ack item (proto AckItem), checked here and by the node
# (cluster/security/limits.py check_ack): a NAK's redelivery delay, and a TERM's reason.
ACK_DELAY_NS_MAX = 365 * 24 * 3600 * NS_PER_S  # a year
ACK_REASON_BYTES_MAX = 4096
ACK_BATCH_MSGS_MAX = 4096
ACK_BATCH_BYTES_MAX = 1024 * 1024
ACK_OVERHEAD_BYTES = 16
RUN_SEQ_BYTES = 10  # a sequence in an AckRun: a varint of at most 9 bytes, and a tag's share
# The most sequences one AckRun may carry: a node refuses a longer run (INVALID_ARGUMENT,
# cluster/security/limits.py check_ack_run), so a run that reaches it is closed and the next ack
# starts another. The acks in flight of one AckStream call are 4096 too.
ACK_RUN_SEQS_MAX = 4096
# How long closing a client waits for queued fire-and-forget acks to reach the server.
ACK_FLUSH_TIMEOUT_S = 2.0


class AckSender(Protocol):
    async def send(self, item: pb.AckItem, stream: str) -> None: ...

    async def send_run(self, stream: str, consumer: str, stream_seq: int) -> None: ...

    async def send_sync(
        self, item: pb.AckItem, stream: str, *, timeout_s: float | None
    ) -> None: ...


class Msg:
    """A message delivered by a consumer (see the module docstring)."""

    __slots__ = (
        "_acked",
        "_acks_ignored",
        "_consumer",
        "_metadata",
        "_sender",
        "_seq",
        "_stream",
        "data",
        "headers",
        "reply",
        "subject",
    )

    def __init__(
        self,
        *,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        reply: str,
        sender: AckSender,
        acks_ignored: bool = False,
        stream: str | None = None,
        consumer: str | None = None,
        stream_seq: int = 0,
    ) -> None:
        """``acks_ignored``: the consumer's ack policy is none, so every ack method is a
        no-op (ADR-15: with ack policy none the client ignores requests to ack).
        ``stream``: the stream the message came from, when the receiver knows it (acks are
        routed by it; None: read from the ack token, which costs a parse per ack).
        ``consumer`` and ``stream_seq`` (with ``stream``): the delivery's consumer and
        stream sequence, when the receiver knows them: ``ack()`` then goes as a sequence
        in an ``AckRun`` (proto) rather than an item with the token."""
        self.subject = subject
        self.data = data
        self.headers: Mapping[str, str] = headers or _EMPTY
        self.reply = reply
        self._sender = sender
        self._metadata: MsgMetadata | None = None
        self._acked = False
        self._acks_ignored = acks_ignored
        self._stream = stream
        self._consumer = consumer if stream is not None and stream_seq > 0 else None
        self._seq = stream_seq

    def __repr__(self) -> str:
        return f"Msg(subject={self.subject!r}, reply={self.reply!r}, data={len(self.data)} bytes)"

    @property
    def metadata(self) -> MsgMetadata:
        """Parsed from the ack token (stream and consumer sequences, deliveries, pending)."""
        if self._metadata is None:
            self._metadata = MsgMetadata.from_reply(self.reply)
        return self._metadata

    @property
    def acked(self) -> bool:
        """True once a terminal ack was sent."""
        return self._acked

    def _ack_stream(self) -> str:
        """The stream acks are routed by (given at construction, else the token's)."""
        return self._stream if self._stream is not None else self.metadata.stream

    async def _send(self, item: pb.AckItem, *, terminal: bool) -> None:
        """Send ``item`` (made with this message's ``reply``) unless acks are over."""
        if self._acked or self._acks_ignored:
            return
        if terminal:
            self._acked = True
        await self._sender.send(item, self._ack_stream())

    async def ack(self) -> None:
        """+ACK, fire-and-forget."""
        if self._acked or self._acks_ignored:  # the common no-op, before making an item
            return
        stream, consumer = self._stream, self._consumer
        if consumer is not None and stream is not None:
            self._acked = True
            await self._sender.send_run(stream, consumer, self._seq)
            return
        await self._send(pb.AckItem(kind=pb.ACK_KIND_ACK, reply=self.reply), terminal=True)

    async def ack_sync(self, timeout: float | None = None) -> None:
        """+ACK, answered once replicated; raises the typed error otherwise (the message may
        then be redelivered). ``timeout`` in seconds (None: the client's). Sent even after
        another terminal ack (module docstring)."""
        if self._acks_ignored:
            return
        item = pb.AckItem(kind=pb.ACK_KIND_ACK, reply=self.reply, sync=True)
        await self._sender.send_sync(item, self._ack_stream(), timeout_s=timeout)
        self._acked = True

    async def nak(self, delay: float | None = None) -> None:
        """-NAK: redeliver after ``delay`` seconds (None or 0: at once), as nats.py's
        ``nak(delay)`` takes it. ``delay`` is an int or float from 0 to a year
        (``ACK_DELAY_NS_MAX``); anything else (a str, a bool, NaN, a negative number) is
        ``InvalidArgumentError`` naming ``delay``, and nothing is sent."""
        delay_ns = _delay_ns(delay)
        item = pb.AckItem(kind=pb.ACK_KIND_NAK, reply=self.reply, delay_ns=delay_ns)
        await self._send(item, terminal=True)

    async def in_progress(self) -> None:
        """+WPI: still working on it; resets the ack wait."""
        await self._send(pb.AckItem(kind=pb.ACK_KIND_PROGRESS, reply=self.reply), terminal=False)

    async def term(self, reason: str = "") -> None:
        """+TERM: never redeliver; ``reason`` (at most ``ACK_REASON_BYTES_MAX`` bytes of
        UTF-8) is recorded by the server."""
        if not isinstance(reason, str):
            raise errors.InvalidArgumentError(
                "reason", f"must be a string, not {type(reason).__name__}"
            )
        if len(reason.encode("utf-8", "surrogatepass")) > ACK_REASON_BYTES_MAX:
            raise errors.InvalidArgumentError(
                "reason", f"must be at most {ACK_REASON_BYTES_MAX} bytes (UTF-8)"
            )
        item = pb.AckItem(kind=pb.ACK_KIND_TERM, reply=self.reply, reason=reason)
        await self._send(item, terminal=True)


def _delay_ns(delay: object) -> int:
    """A NAK's ``delay`` (seconds; None: 0) as ns, checked before it is multiplied: a str
    times 10**9 is a string of a billion characters, and NaN has no int."""
    rule = f"must be 0 to {ACK_DELAY_NS_MAX // NS_PER_S} seconds (a year)"
    if delay is None:
        return 0
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise errors.InvalidArgumentError("delay", f"{rule}, not {type(delay).__name__}")
    if isinstance(delay, float) and not math.isfinite(delay):  # an int has no NaN
        raise errors.InvalidArgumentError("delay", f"{rule}, not {delay!r}")
    if not 0 <= delay * NS_PER_S <= ACK_DELAY_NS_MAX:
        raise errors.InvalidArgumentError("delay", f"{rule}, not {delay!r:.40}")
    return int(delay * NS_PER_S)


async def _connected(stubs: Stubs, left_s: float) -> Stubs:
    return stubs


def _results(batch: pb.AckResultBatch) -> list[tuple[int, pb.AckResult]]:
    return [(r.id, r) for r in batch.results]


class _Run:
    """The request of a run entry: plain +ACKs of one consumer by stream sequence (an
    ``AckRun`` once written; ``id`` is the pipeline's, which the proto does not carry:
    a refusal of a run comes back with id 0, to ``error_cb``)."""

    __slots__ = ("consumer", "id", "stream", "stream_seqs")

    def __init__(self, stream: str, consumer: str, stream_seqs: list[int]) -> None:
        self.stream = stream
        self.consumer = consumer
        self.stream_seqs = stream_seqs
        self.id = 0

    def proto(self) -> pb.AckRun:
        return pb.AckRun(stream=self.stream, consumer=self.consumer, stream_seqs=self.stream_seqs)


def _ack_batch(items: list[pb.AckItem | _Run]) -> pb.AckBatch:
    """One ``AckBatch`` of a write's entries: the items as they are, the runs as ``AckRun``s."""
    acks: list[pb.AckItem] = []
    runs: list[pb.AckRun] = []
    for item in items:
        if isinstance(item, _Run):
            runs.append(item.proto())
        else:
            acks.append(item)
    return pb.AckBatch(acks=acks, runs=runs)


class Acker:
    """The ack path of one client: pipelined fire-and-forget acks and unary sync acks.

    One ``AckStream`` per leader address (the stream's hinted leader, else the current
    server), opened on first use and replaced when it breaks. Belongs to the client's loop.
    """

    def __init__(
        self,
        router: Router,
        *,
        timeout_s: float,
        pending_msgs_max: int,
        error_cb: ErrorCallback,
    ) -> None:
        self._closing = False
        self._again: set[asyncio.Task[None]] = set()  # unsent acks waiting to be sent again
        self._router = router
        self._timeout_s = timeout_s
        self._pending_msgs_max = pending_msgs_max
        self._room = Places(pending_msgs_max)
        self._error_cb = error_cb
        self._pipes: dict[str, Pipeline] = {}
        self._opening = asyncio.Lock()
        self._last_reported: errors.RaftStreamError | None = None
        # Per (stream, consumer): the run entry still queued, which further acks join.
        self._open_runs: dict[tuple[str, str], Entry] = {}

    async def send(self, item: pb.AckItem, stream: str) -> None:
        """Queue a fire-and-forget ack (waits for room; see the module docstring)."""
        await self._take_room()
        await self._queue(item, item.ByteSize() + ACK_OVERHEAD_BYTES, stream)

    async def send_run(self, stream: str, consumer: str, stream_seq: int) -> None:
        """Queue a fire-and-forget +ACK of ``consumer``'s delivery of ``stream_seq``, as a
        sequence of an ``AckRun``: it joins the run of that consumer still queued, if any
        (not handed to a write yet) and holding fewer than ``ACK_RUN_SEQS_MAX``, else starts
        one. Each sequence takes its own room."""
        await self._take_room()
        key = (stream, consumer)
        entry = self._open_runs.get(key)
        if (
            entry is not None
            and not entry.written
            and len(entry.request.stream_seqs) < ACK_RUN_SEQS_MAX
        ):
            entry.request.stream_seqs.append(stream_seq)
            entry.size_bytes += RUN_SEQ_BYTES
            return
        run = _Run(stream, consumer, [stream_seq])
        size = len(stream) + len(consumer) + RUN_SEQ_BYTES + ACK_OVERHEAD_BYTES
        entry = await self._queue(run, size, stream)
        if entry is not None:
            self._open_runs[key] = entry

    async def _take_room(self) -> None:
        """A place under ``pending_msgs_max`` (waiting behind earlier acks for one)."""
        if not self._room.take_now():
            await self._room.take(None)

    async def _queue(
        self, request: pb.AckItem | _Run, size_bytes: int, stream: str
    ) -> Entry | None:
        """Queue ``request`` (its room taken) on the ``AckStream`` to ``stream``'s leader;
        the entry, or None when it could not be (the failure to ``error_cb``, its room
        given back). Its context is what sending it again needs (its stream and deadline;
        an ``_Unsent`` once it failed)."""
        loop = asyncio.get_running_loop()
        entry = Entry(
            request,
            size_bytes,
            False,
            loop.create_future(),
            (stream, loop.time() + self._timeout_s),
        )
        try:
            pipe = self._pipes.get(self._router.target(stream))
            if pipe is None or pipe.dead:  # else the open one, without a coroutine per ack
                pipe = await self._pipeline(stream)
            pipe.submit(entry)
        except errors.ClientClosedError:
            self._settle(entry, None)
            raise  # the caller's mistake, told at once (nats.py raises too), not logged later
        except errors.RaftStreamError as exc:
            self._settle(entry, None)
            self._error_cb(exc)
            return None
        return entry

    async def send_sync(self, item: pb.AckItem, stream: str, *, timeout_s: float | None) -> None:
        """One ack, answered once replicated; retried (an ack is idempotent) and
        hint-following within ``timeout_s``. Raises the typed error."""

        async def invoke(stubs: Stubs, left_s: float) -> None:
            await stubs.consume.Ack(pb.AckRequest(ack=item), timeout=left_s)

        await self._router.call(
            stream,
            invoke,
            timeout_s=self._timeout_s if timeout_s is None else timeout_s,
            idempotent=True,
        )

    def _settle(self, entry: Entry, result: object) -> None:
        self._give_room(entry)

    def _give_room(self, entry: Entry) -> None:
        """Give back the room of ``entry``'s acks (one, or a run's sequences)."""
        request = entry.request
        if isinstance(request, _Run):
            self._close_run(entry)
            for _ in request.stream_seqs:
                self._room.give()
        else:
            self._room.give()

    def _close_run(self, entry: Entry) -> None:
        """No more acks join run ``entry`` (settled or failed)."""
        run: _Run = entry.request
        key = (run.stream, run.consumer)
        if self._open_runs.get(key) is entry:
            del self._open_runs[key]

    def _failed(self, entry: Entry, exc: errors.RaftStreamError) -> None:
        if isinstance(entry.request, _Run):
            self._close_run(entry)
        unsent = not entry.written or isinstance(exc, NotConnectedError)
        if unsent and not self._closing and _worth_sending_again(exc):
            if not isinstance(entry.context, _Unsent):  # its first failure
                entry.context = _Unsent(*entry.context)
            task = asyncio.get_running_loop().create_task(self._send_again(entry, exc))
            self._again.add(task)
            task.add_done_callback(self._again.discard)
            return
        self._given_up(entry, exc)

    def _given_up(self, entry: Entry, exc: errors.RaftStreamError) -> None:
        """An ack (or a run's) is lost (its message comes again after its ack wait):
        ``error_cb``."""
        self._give_room(entry)
        if exc is not self._last_reported:  # one report per broken pipeline, not per ack
            self._last_reported = exc
            self._error_cb(exc)

    async def _send_again(self, entry: Entry, exc: errors.RaftStreamError) -> None:
        """Send an ack that cannot have reached the server (its call was refused as a
        whole, or never connected) again, after a wait that doubles with each try, until the
        client's timeout from when it was queued: on a new call to the peer a NOT_LEADER
        refusal named (learned for its stream), or as a unary ``Ack`` when the node refused
        the call for its ``streaming_calls_max`` (that limit does not count unary calls)."""
        unsent: _Unsent = entry.context
        unsent.tries += 1
        try:
            await wait_to_send_again(unsent.tries - 1, unsent.deadline, exc)
            self._router.learn(unsent.stream, exc)
            if streaming_refused(exc):
                await self._send_unary(entry.request, unsent)
                self._settle(entry, None)
                return
            pipe = await self._pipeline(unsent.stream)
            entry.sent_at = 0.0
            pipe.submit(entry)
        except errors.RaftStreamError as failure:
            self._given_up(entry, failure)
        except asyncio.CancelledError:
            self._give_room(entry)  # the client is closing
            raise

    async def _send_unary(self, item: pb.AckItem | _Run, unsent: _Unsent) -> None:
        if isinstance(item, _Run):
            request = pb.AckRequest(run=item.proto())
        else:
            request = pb.AckRequest(ack=item)

        async def invoke(stubs: Stubs, left_s: float) -> None:
            await stubs.consume.Ack(request, timeout=left_s)

        left_s = unsent.deadline - asyncio.get_running_loop().time()
        await self._router.call(unsent.stream, invoke, timeout_s=left_s, idempotent=True)

    def _orphan(self, result: pb.AckResult) -> None:
        if result.HasField("error"):
            self._error_cb(from_error_message(result.error))

    async def _pipeline(self, stream: str) -> Pipeline:
        """The live AckStream to the address acks for ``stream`` go to (opened if needed)."""
        pipe = self._pipes.get(self._router.target(stream))
        if pipe is not None and not pipe.dead:
            return pipe
        async with self._opening:
            # Through call(): a server that cannot be reached is skipped for the next.
            stubs = await self._router.call(
                stream, _connected, timeout_s=self._timeout_s, idempotent=True
            )
            pipe = self._pipes.get(stubs.addr)
            if pipe is None or pipe.dead:
                pipe = Pipeline(
                    stubs.consume.AckStream(),
                    batch_of=_ack_batch,
                    results_of=_results,
                    on_result=self._settle,
                    on_failed=self._failed,
                    on_orphan=self._orphan,
                    queue_msgs_max=self._pending_msgs_max,
                    batch_msgs_max=ACK_BATCH_MSGS_MAX,
                    batch_bytes_max=ACK_BATCH_BYTES_MAX,
                    result_timeout_s=self._timeout_s,
                    name="ack",
                    addr=stubs.addr,
                )
                self._pipes[stubs.addr] = pipe
            return pipe

    async def close(self, *, flush_timeout_s: float = ACK_FLUSH_TIMEOUT_S) -> None:
        """Send the acks still queued (waiting at most ``flush_timeout_s`` in all), then close.
        An ack that could not be sent in time fails to ``error_cb``; its message will be
        redelivered after its ack wait, as for any lost ack."""
        self._closing = True  # what the pipelines' close fails is not sent again
        for task in list(self._again):
            task.cancel()
        pipes, self._pipes = list(self._pipes.values()), {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout_s
        for pipe in pipes:
            await pipe.drain(timeout_s=max(0.0, deadline - loop.time()))


@dataclass(slots=True, eq=False)
class _Unsent:
    """A fire-and-forget ack's way again while nothing of it reached a server: its stream
    (the route), until when it may be sent, and how often it was."""

    stream: str
    deadline: float
    tries: int = 0


def _worth_sending_again(exc: errors.RaftStreamError) -> bool:
    """Whether an unsent ack refused with ``exc`` may fare better elsewhere or later: not
    after a refusal for its credentials, or a closed client."""
    return exc.retriable or streaming_refused(exc)


class ErrorCallback(Protocol):
    def __call__(self, exc: errors.RaftStreamError, /) -> None: ...
