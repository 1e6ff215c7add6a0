"""A consumer's replicated state, the operations that change it, and their byte encoding.

Everything a replica must agree on lives in ``ConsumerState``; it changes only through
``apply_op(state, config, op)``, a pure function of the state, the consumer's config and the
op. Ops carry every time they need (``now_ns`` stamped by the leader), so the same ops in
the same order give the same state on every replica; nothing here reads the clock.

Sequences: ``stream_seq`` numbers messages in the stream; every delivery (first or
redelivery) takes the next ``consumer_seq``. The ack floor is the pair below which every
delivered message is settled (acked, terminated, or past max_deliver).

Encoding (the replication entry format; integers little-endian, ``u64``/``i64``; a
``seqs`` list is a ``u64`` count then that many ``u64``; text is a ``u64`` length then UTF-8):

====  ============  ==============================================================
tag   op            fields after the tag byte
====  ============  ==============================================================
1     Start         start_seq u64, lps_end u64, lps seqs
2     Deliver       now_ns i64, stream_seqs seqs
3     Ack           now_ns i64, stream_seqs seqs
4     Nak           stream_seq u64, now_ns i64, delay_ns i64, consumer_seq u64
5     Progress      stream_seq u64, now_ns i64, consumer_seq u64
6     Term          stream_seq u64, reason text
7     MaxDelivered  stream_seq u64
8     Gone          stream_seqs seqs
9     Pause         until_ns i64
10    Reset         stream_seq u64
====  ============  ==============================================================

A snapshot (``encode_state``) is the meta record (version byte 1, delivered consumer and
stream sequences, lps_end, paused_until_ns, started flag, lps seqs) then the pending rows
(stream_seq, consumer_seq, deliveries, deadline_ns, delivered_ns). ``decode_op`` and
``decode_state`` reject unknown tags/versions, truncation and trailing bytes with
``InvariantError``.
"""

from __future__ import annotations

import bisect
import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.errors import invariant

__all__ = [
    "Ack",
    "ConsumerOp",
    "ConsumerState",
    "Deliver",
    "Event",
    "EventKind",
    "Gone",
    "MaxDelivered",
    "Nak",
    "Pause",
    "Pending",
    "Progress",
    "Reset",
    "Start",
    "Term",
    "apply_op",
    "decode_op",
    "decode_state",
    "encode_op",
    "encode_state",
    "fresh_deliveries",
]


@dataclass(slots=True)
class Pending:
    """One delivered, unsettled message: its latest delivery and when it may go again."""

    consumer_seq: int
    deliveries: int
    deadline_ns: int
    delivered_ns: int


@dataclass(slots=True)
class ConsumerState:
    """The replicated state of one consumer. Owned by its ``Consumer``; not thread-safe.

    ``delivered_stream_seq`` is the cursor: the highest stream sequence handed out as new.
    ``lps_queue`` holds the stream sequences a last_per_subject consumer still owes from its
    start; while it is non-empty new messages come from it, and the cursor then jumps to
    ``lps_end`` (the stream's last sequence when the consumer started).
    """

    delivered_consumer_seq: int = 0
    delivered_stream_seq: int = 0
    # Ordered by stream sequence: a new entry is always above every other (it is past the
    # cursor), so insertion order is sequence order and the oldest entry is the first.
    pending: dict[int, Pending] = field(default_factory=dict)
    lps_queue: list[int] = field(default_factory=list)
    lps_end: int = 0
    paused_until_ns: int = 0
    started: bool = False

    @property
    def ack_floor_stream_seq(self) -> int:
        """Every delivered stream sequence at or below this is settled.

        Derived, never stored: just below the oldest pending message, or the cursor when
        nothing is pending. It never moves backwards between resets: pending entries only
        leave, and new ones are above the cursor.
        """
        if self.pending:
            return next(iter(self.pending)) - 1
        return self.delivered_stream_seq

    @property
    def ack_floor_consumer_seq(self) -> int:
        """Every delivery with a consumer sequence at or below this is settled or superseded
        by a redelivery (O(pending); for info, not hot paths)."""
        if self.pending:
            return min(p.consumer_seq for p in self.pending.values()) - 1
        return self.delivered_consumer_seq

    def num_redelivered(self) -> int:
        return sum(1 for p in self.pending.values() if p.deliveries > 1)

    def will_deliver(self, stream_seq: int) -> bool:
        """True when ``stream_seq`` is still ahead of the cursor (would be delivered new).
        O(log n) in the last_per_subject queue (sorted): it runs for every acked sequence."""
        queue = self.lps_queue
        if queue:
            i = bisect.bisect_left(queue, stream_seq)
            return (i < len(queue) and queue[i] == stream_seq) or stream_seq > self.lps_end
        return stream_seq > self.delivered_stream_seq

    def needs_ack(self, stream_seq: int) -> bool:
        """True while this consumer still holds ``stream_seq`` (for interest retention).

        A held message is either pending (delivered, unsettled) or not delivered yet; one
        at or below the ack floor, settled, or skipped before the start is not held.
        """
        if stream_seq <= self.ack_floor_stream_seq:
            return False
        return stream_seq in self.pending or self.will_deliver(stream_seq)


class EventKind(enum.StrEnum):
    """Advisories a consumer records as it applies ops (JetStream advisory names)."""

    MAX_DELIVERIES = "max_deliver"
    TERMINATED = "terminated"
    ACK_SAMPLE = "metric_consumer_ack"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: EventKind
    stream_seq: int
    consumer_seq: int
    deliveries: int
    reason: str = ""
    ack_latency_ns: int = 0


# -- ops --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    """Set the starting point: deliver from ``start_seq`` (or from ``lps`` first)."""

    start_seq: int
    lps: tuple[int, ...] = ()
    lps_end: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Deliver:
    """Hand out ``stream_seqs`` in order at ``now_ns`` (new ones and redeliveries)."""

    stream_seqs: tuple[int, ...]
    now_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """+ACK of each sequence (with ack policy all: of everything at or below it)."""

    stream_seqs: tuple[int, ...]
    now_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Nak:
    """-NAK: eligible again at ``now_ns + delay_ns``. ``consumer_seq`` 0 matches any delivery."""

    stream_seq: int
    now_ns: int
    delay_ns: int = 0
    consumer_seq: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """+WPI: the ack deadline starts again from ``now_ns``."""

    stream_seq: int
    now_ns: int
    consumer_seq: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """+TERM: never deliver again; settled for the ack floor and retention."""

    stream_seq: int
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MaxDelivered:
    """The message's last allowed delivery expired: give it up, record MAX_DELIVERIES."""

    stream_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Gone:
    """The stream no longer has the message (deleted, purged, aged out): stop tracking it."""

    stream_seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause:
    """Pause deliveries until ``until_ns`` (0 resumes)."""

    until_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Reset:
    """Start over from ``stream_seq``: pending is dropped, cursor and floor at seq - 1."""

    stream_seq: int


ConsumerOp = Start | Deliver | Ack | Nak | Progress | Term | MaxDelivered | Gone | Pause | Reset


# -- apply ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Changes:
    """What an apply touched, for persistence and retention (filled in by ``apply_op``)."""

    events: list[Event] = field(default_factory=list)
    dirty: set[int] = field(default_factory=set)  # pending keys written or removed
    settled: list[int] = field(default_factory=list)  # stream seqs no longer held
    reset: bool = False  # the whole pending table was replaced


def fresh_deliveries(state: ConsumerState, op: ConsumerOp) -> int | None:
    """New deliveries in ``op`` applied to ``state`` (0 for ops that leave num_pending
    alone); None when the op may move the cursor otherwise, so a cached num_pending must go
    (``Consumer._apply``; moved here from ``consumer.py``)."""
    if state.lps_queue:
        return None
    if isinstance(op, Deliver):
        pending = state.pending
        return sum(1 for s in op.stream_seqs if s not in pending)
    if isinstance(op, Ack | Nak | Progress | Term | MaxDelivered):
        return 0
    return None


def apply_op(
    state: ConsumerState, config: ConsumerConfig, op: ConsumerOp, changes: Changes
) -> None:
    """Apply one op to ``state`` (in place) and record what changed in ``changes``.

    Ops that name unknown or already-settled sequences are harmless no-ops, as JetStream
    treats duplicate and late acks. Invariants (a new delivery ahead of the cursor) raise
    ``InvariantError``: they mean the leader and the state disagree, a bug.
    """
    if isinstance(op, Deliver):
        _deliver(state, config, op, changes)
    elif isinstance(op, Ack):
        _ack(state, config, op, changes)
    elif isinstance(op, Nak | Progress):
        _renew(state, config, op, changes)
    elif isinstance(op, Term | MaxDelivered):
        _give_up(state, op, changes)
    elif isinstance(op, Gone):
        for seq in op.stream_seqs:
            _drop(state, seq, changes)
            if seq in state.lps_queue:
                state.lps_queue.remove(seq)
                changes.settled.append(seq)
    elif isinstance(op, Pause):
        state.paused_until_ns = op.until_ns
    elif isinstance(op, Start | Reset):
        _restart(state, op, changes)


def _restart(state: ConsumerState, op: Start | Reset, changes: Changes) -> None:
    if isinstance(op, Start):
        invariant(not state.started, "a consumer starts once")
        state.lps_queue = sorted(op.lps)
        state.lps_end = op.lps_end
        seq = op.start_seq
    else:
        seq = op.stream_seq
        state.lps_queue = []
        changes.settled.extend(state.pending)
    invariant(seq >= 1, "a start sequence is at least 1")
    state.started = True
    state.pending.clear()
    changes.reset = True
    state.delivered_stream_seq = seq - 1


def _deliver(state: ConsumerState, config: ConsumerConfig, op: Deliver, changes: Changes) -> None:
    track = config.acks_required
    pending = state.pending
    now = op.now_ns
    first_deadline = now + config.ack_wait_for(1)  # of every first delivery in the op
    # The highest pending sequence: new entries only ever go above it (checked below).
    top = next(reversed(pending)) if pending else 0
    for seq in op.stream_seqs:
        state.delivered_consumer_seq += 1
        dseq = state.delivered_consumer_seq
        p = pending.get(seq)
        if p is not None:
            p.deliveries += 1
            p.consumer_seq = dseq
            p.delivered_ns = now
            p.deadline_ns = now + config.ack_wait_for(p.deliveries)
            changes.dirty.add(seq)
            continue
        _advance_cursor(state, seq)
        if track:
            invariant(seq > top, "pending stays in stream sequence order")
            pending[seq] = Pending(dseq, 1, first_deadline, now)
            top = seq
            changes.dirty.add(seq)
        else:
            changes.settled.append(seq)


def _advance_cursor(state: ConsumerState, seq: int) -> None:
    if state.lps_queue:
        invariant(seq == state.lps_queue[0], f"delivery {seq} out of last_per_subject order")
        state.lps_queue.pop(0)
        state.delivered_stream_seq = max(seq, state.lps_end) if not state.lps_queue else seq
        return
    invariant(seq > state.delivered_stream_seq, f"new delivery {seq} is behind the cursor")
    state.delivered_stream_seq = seq


def _ack(state: ConsumerState, config: ConsumerConfig, op: Ack, changes: Changes) -> None:
    if config.ack_policy is AckPolicy.ALL:
        # Ack-all settles everything pending at or below the highest sequence named.
        top = max(op.stream_seqs, default=0)
        seqs: Iterable[int] = sorted(s for s in state.pending if s <= top)
    else:
        seqs = op.stream_seqs
    pending = state.pending
    sampling = bool(config.sample_freq)
    dirty, settled = changes.dirty, changes.settled
    for seq in seqs:
        p = pending.pop(seq, None)  # ``_drop``, inlined: this runs for every ack
        if p is None:
            continue
        dirty.add(seq)
        settled.append(seq)
        if sampling and _sampled(config, p.consumer_seq):
            changes.events.append(
                Event(
                    kind=EventKind.ACK_SAMPLE,
                    stream_seq=seq,
                    consumer_seq=p.consumer_seq,
                    deliveries=p.deliveries,
                    ack_latency_ns=max(0, op.now_ns - p.delivered_ns),
                )
            )


def _sampled(config: ConsumerConfig, consumer_seq: int) -> bool:
    """Deterministic sampling: exactly ``pct`` of every 100 consumer sequences, spread evenly."""
    if not config.sample_freq:
        return False
    pct = int(config.sample_freq.rstrip("%"))
    return (consumer_seq * pct) // 100 != ((consumer_seq - 1) * pct) // 100


def _renew(
    state: ConsumerState, config: ConsumerConfig, op: Nak | Progress, changes: Changes
) -> None:
    p = state.pending.get(op.stream_seq)
    if p is None or (op.consumer_seq and op.consumer_seq != p.consumer_seq):
        return  # unknown, settled, or about an earlier delivery: harmless
    if isinstance(op, Nak):
        p.deadline_ns = op.now_ns + op.delay_ns
    else:
        p.deadline_ns = op.now_ns + config.ack_wait_for(p.deliveries)
    changes.dirty.add(op.stream_seq)


def _give_up(state: ConsumerState, op: Term | MaxDelivered, changes: Changes) -> None:
    p = state.pending.get(op.stream_seq)
    if p is None:
        return
    kind = EventKind.TERMINATED if isinstance(op, Term) else EventKind.MAX_DELIVERIES
    reason = op.reason if isinstance(op, Term) else ""
    changes.events.append(
        Event(
            kind=kind,
            stream_seq=op.stream_seq,
            consumer_seq=p.consumer_seq,
            deliveries=p.deliveries,
            reason=reason,
        )
    )
    _drop(state, op.stream_seq, changes)


def _drop(state: ConsumerState, seq: int, changes: Changes) -> None:
    if state.pending.pop(seq, None) is not None:
        changes.dirty.add(seq)
        changes.settled.append(seq)


# -- encoding ---------------------------------------------------------------------------------

_STATE_VERSION = 1
_Q = struct.Struct("<Q")
_QQ = struct.Struct("<QQ")
_PENDING = struct.Struct("<QQQqq")  # stream_seq, consumer_seq, deliveries, deadline, delivered
_HEAD = struct.Struct("<BQQQqB")
_TAGS: dict[type, int] = {
    Start: 1,
    Deliver: 2,
    Ack: 3,
    Nak: 4,
    Progress: 5,
    Term: 6,
    MaxDelivered: 7,
    Gone: 8,
    Pause: 9,
    Reset: 10,
}


def _seqs(values: Iterable[int]) -> bytes:
    vals = tuple(values)
    return _Q.pack(len(vals)) + struct.pack(f"<{len(vals)}Q", *vals)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, fmt: struct.Struct) -> tuple[int, ...]:
        invariant(self.pos + fmt.size <= len(self.buf), "consumer record truncated")
        out = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return tuple(out)

    def uint(self) -> int:
        return self.take(_Q)[0]

    def sint(self) -> int:
        return self.take(_SQ)[0]

    def seqs(self) -> tuple[int, ...]:
        n = self.uint()
        invariant(self.pos + 8 * n <= len(self.buf), "consumer record truncated")
        return self.take(struct.Struct(f"<{n}Q"))

    def text(self) -> str:
        n = self.uint()
        invariant(self.pos + n <= len(self.buf), "consumer record truncated")
        out = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return out

    def done(self) -> None:
        invariant(self.pos == len(self.buf), "trailing bytes in consumer record")


_SQ = struct.Struct("<q")


def _text(value: str) -> bytes:
    raw = value.encode()
    return _Q.pack(len(raw)) + raw


def encode_op(op: ConsumerOp) -> bytes:
    """The op as bytes: a tag byte then its fields (see the module docstring)."""
    tag = bytes([_TAGS[type(op)]])
    if isinstance(op, Start):
        return tag + _QQ.pack(op.start_seq, op.lps_end) + _seqs(op.lps)
    if isinstance(op, Deliver | Ack):
        return tag + _SQ.pack(op.now_ns) + _seqs(op.stream_seqs)
    if isinstance(op, Nak):
        return tag + struct.pack("<QqqQ", op.stream_seq, op.now_ns, op.delay_ns, op.consumer_seq)
    if isinstance(op, Progress):
        return tag + struct.pack("<QqQ", op.stream_seq, op.now_ns, op.consumer_seq)
    if isinstance(op, Term):
        return tag + _Q.pack(op.stream_seq) + _text(op.reason)
    if isinstance(op, MaxDelivered | Reset):
        return tag + _Q.pack(op.stream_seq)
    if isinstance(op, Gone):
        return tag + _seqs(op.stream_seqs)
    return tag + _SQ.pack(op.until_ns)


def decode_op(data: bytes) -> ConsumerOp:
    """Inverse of ``encode_op``; raises ``InvariantError`` on a malformed record."""
    invariant(len(data) >= 1, "empty consumer op")
    r = _Reader(data)
    r.pos = 1
    tag = data[0]
    op: ConsumerOp
    if tag == 1:
        start, end = r.take(_QQ)
        op = Start(start_seq=start, lps_end=end, lps=r.seqs())
    elif tag in (2, 3):
        now = r.sint()
        op = (Deliver if tag == 2 else Ack)(stream_seqs=r.seqs(), now_ns=now)
    elif tag == 4:
        seq, now, delay, cseq = r.take(struct.Struct("<QqqQ"))
        op = Nak(stream_seq=seq, now_ns=now, delay_ns=delay, consumer_seq=cseq)
    elif tag == 5:
        seq, now, cseq = r.take(struct.Struct("<QqQ"))
        op = Progress(stream_seq=seq, now_ns=now, consumer_seq=cseq)
    elif tag == 6:
        op = Term(stream_seq=r.uint(), reason=r.text())
    elif tag in (7, 10):
        op = (MaxDelivered if tag == 7 else Reset)(stream_seq=r.uint())
    elif tag == 8:
        op = Gone(stream_seqs=r.seqs())
    else:
        invariant(tag == 9, f"unknown consumer op tag {tag}")
        op = Pause(until_ns=r.sint())
    r.done()
    return op


def encode_meta(state: ConsumerState) -> bytes:
    """Everything but the pending table (stored per entry by the LMDB store)."""
    head = _HEAD.pack(
        _STATE_VERSION,
        state.delivered_consumer_seq,
        state.delivered_stream_seq,
        state.lps_end,
        state.paused_until_ns,
        int(state.started),
    )
    return head + _seqs(state.lps_queue)


def decode_meta(data: bytes) -> ConsumerState:
    """Inverse of ``encode_meta``: a state with an empty pending table."""
    r = _Reader(data)
    version, dc, ds, lps_end, paused, started = r.take(_HEAD)
    invariant(version == _STATE_VERSION, f"unknown consumer state version {version}")
    lps = list(r.seqs())
    r.done()
    return ConsumerState(
        delivered_consumer_seq=dc,
        delivered_stream_seq=ds,
        lps_queue=lps,
        lps_end=lps_end,
        paused_until_ns=paused,
        started=bool(started),
    )


def encode_pending(seq: int, p: Pending) -> bytes:
    return _PENDING.pack(seq, p.consumer_seq, p.deliveries, p.deadline_ns, p.delivered_ns)


def decode_pending(data: bytes) -> tuple[int, Pending]:
    invariant(len(data) == _PENDING.size, "bad pending record size")
    seq, cseq, n, deadline, delivered = _PENDING.unpack(data)
    return seq, Pending(cseq, n, deadline, delivered)


def encode_state(state: ConsumerState) -> bytes:
    """A whole-state snapshot (for Raft snapshots and the memory store)."""
    meta = encode_meta(state)
    rows = b"".join(encode_pending(s, state.pending[s]) for s in sorted(state.pending))
    return _Q.pack(len(meta)) + meta + _Q.pack(len(state.pending)) + rows


def decode_state(data: bytes) -> ConsumerState:
    """Inverse of ``encode_state``; raises ``InvariantError`` on a malformed snapshot."""
    r = _Reader(data)
    n = r.uint()
    invariant(r.pos + n <= len(data), "consumer snapshot truncated")
    state = decode_meta(data[r.pos : r.pos + n])
    r.pos += n
    for _ in range(r.uint()):
        invariant(r.pos + _PENDING.size <= len(data), "consumer snapshot truncated")
        seq, p = decode_pending(data[r.pos : r.pos + _PENDING.size])
        r.pos += _PENDING.size
        invariant(not state.pending or seq > next(reversed(state.pending)), "pending order")
        state.pending[seq] = p
    r.done()
    return state
