"""MemoryStreamStore: the in-memory twin of the LMDB stream store.

Same Protocol (``engine/store.py``) and same test suite as ``LmdbStreamStore``; used for
``storage: memory`` streams and as the fast store in tests of the layers above. Nothing is
durable: a closed store is gone.

The deduplication records are a composed ``MemoryDedup`` (``engine/memdedup.py``, moved out
for issue 34); this class opens the transaction around their changes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from functools import lru_cache

from raftstream.engine.memdedup import MemoryDedup
from raftstream.engine.store import (
    DEDUP_EXPIRE_RECORDS_MAX,
    EMPTY_HEADERS,
    TS_NS_MAX,
    DedupRecord,
    DiscardPolicy,
    PurgeRequest,
    StoredMsg,
    StoreLimits,
    StreamState,
    check_dedup_args,
    headers_size,
    limit_set,
    missing_seqs,
    msg_size,
    normalize_purge,
)
from raftstream.engine.subjects import (
    FWC,
    has_wildcards,
    subject_matches,
    validate_filter,
    validate_subject,
)
from raftstream.errors import (
    InvalidArgumentError,
    InvariantError,
    LimitError,
    NotFoundError,
    invariant,
)

__all__ = ["TS_NS_MAX", "MemoryStreamStore", "check_append_args"]

NEXT_WALK_SEQS_MAX = 64  # sequences load_next walks before scanning a subject's own list
# Valid subjects are cached so the append path validates a hot subject once (bounded).
_SUBJECT_CACHE_ENTRIES_MAX = 4096
valid_subject = lru_cache(maxsize=_SUBJECT_CACHE_ENTRIES_MAX)(validate_subject)
valid_filter = lru_cache(maxsize=_SUBJECT_CACHE_ENTRIES_MAX)(validate_filter)
# What ``transaction()`` returns inside an open transaction: joining needs no work.
_JOINED: AbstractContextManager[None] = nullcontext()


def check_append_args(now_ns: int, ttl_ns: int) -> None:
    """Reject a negative timestamp or TTL, or a deadline past 64 bits (shared by both stores)."""
    if now_ns < 0:
        raise InvalidArgumentError("now_ns", "must not be negative")
    if ttl_ns < 0:
        raise InvalidArgumentError("ttl_ns", "must not be negative")
    if now_ns + ttl_ns > TS_NS_MAX:
        raise InvalidArgumentError("ttl_ns", "now_ns + ttl_ns must fit in 63 bits")


@dataclass(slots=True)
class _Counters:
    """The scalar state a transaction rollback restores."""

    first_seq: int = 0
    last_seq: int = 0
    bytes: int = 0
    last_ts: int = 0


class MemoryStreamStore:
    """A stream's messages in memory.

    Not thread-safe: one thread at a time uses a store (the caller serialises access).
    Returned ``StoredMsg`` values are immutable and shared; callers must not mutate headers.
    """

    def __init__(self, *, limits: StoreLimits | None = None) -> None:
        self._limits = limits or StoreLimits()
        self._msgs: dict[int, StoredMsg] = {}  # insertion order == sequence order
        self._subjects: dict[str, dict[int, None]] = {}  # subject -> its seqs, in order
        self._ttl_heap: list[tuple[int, int]] = []  # (expires_at_ns, seq), lazily pruned
        self._c = _Counters()
        self._txn_depth = 0
        self._undo: list[tuple[bool, StoredMsg]] | None = None  # (was_added, msg)
        self._saved: tuple[_Counters, StoreLimits] | None = None
        self._dedup = MemoryDedup()
        self._closed = False

    # -- Protocol: configuration and transactions ------------------------------------------

    @property
    def limits(self) -> StoreLimits:
        return self._limits

    def update_limits(self, limits: StoreLimits, now_ns: int) -> None:
        """Change limits and enforce them at once, removing the oldest messages as needed."""
        self._open()
        with self.transaction():
            self._limits = limits
            for subject in list(self._subjects):
                self._enforce_per_subject(subject)
            self._enforce_totals()
            self._expire_age(now_ns)

    @property
    def last_seq(self) -> int:
        """``state().last_seq`` without building a ``StreamState``."""
        self._open()
        return self._c.last_seq

    @property
    def last_ts(self) -> int:
        """``state().last_ts`` without building a ``StreamState``."""
        self._open()
        return self._c.last_ts

    def transaction(self) -> AbstractContextManager[None]:
        """Group mutations; an exception leaving the outermost block rolls all of them back.

        Nested blocks join the outermost one (at no cost: nothing to set up or undo).
        """
        self._open()
        if self._txn_depth:
            return _JOINED
        return self._outermost_transaction()

    @contextmanager
    def _outermost_transaction(self) -> Iterator[None]:
        self._undo = []
        self._dedup.begin()
        self._saved = (replace(self._c), self._limits)
        self._txn_depth = 1
        try:
            yield
        except BaseException:
            self._txn_depth = 0
            self._rollback()
            raise
        self._txn_depth = 0
        self._undo = None
        self._dedup.end()
        self._saved = None

    # -- Protocol: writes ------------------------------------------------------------------

    def append(
        self,
        subject: str,
        data: bytes,
        *,
        headers: Mapping[str, str] = EMPTY_HEADERS,
        now_ns: int,
        ttl_ns: int = 0,
    ) -> int:
        """Store a message at the next sequence and return it; then enforce limits.

        Raises ``LimitError`` (nothing stored) when ``max_msg_size`` or a discard-new limit
        refuses it.
        """
        self._open()
        valid_subject(subject)
        check_append_args(now_ns, ttl_ns)
        self._check_admission(subject, data, headers)
        with self.transaction():
            seq = self._c.last_seq + 1
            hdrs = dict(headers) if headers else EMPTY_HEADERS
            msg = StoredMsg(seq, subject, bytes(data), now_ns, hdrs, ttl_ns)
            self._add(msg)
            self._c.last_seq = seq
            self._c.last_ts = now_ns
            self._enforce_per_subject(subject)
            self._enforce_totals()
            self._expire_age(now_ns)
        return seq

    def skip(self, seq: int) -> None:
        """Make ``seq`` the next sequence; ``seq`` must be above ``last_seq``."""
        self._open()
        if seq <= self._c.last_seq:
            raise InvalidArgumentError("seq", f"must be above last_seq {self._c.last_seq}")
        with self.transaction():
            self._c.last_seq = seq - 1
            if not self._msgs:
                self._c.first_seq = seq

    def delete(self, seq: int, *, erase: bool = False) -> bool:
        """Remove one message; False when absent. ``erase`` has nothing to overwrite here:
        the only reference to the payload is dropped."""
        self._open()
        msg = self._msgs.get(seq)
        if msg is None:
            return False
        with self.transaction():
            self._remove(msg)
        return True

    def purge(
        self, *, subject: str | None = None, seq: int | None = None, keep: int | None = None
    ) -> int:
        """Remove messages as JetStream's purge request does (see the Protocol)."""
        self._open()
        req = normalize_purge(subject, seq, keep)
        with self.transaction():
            return self._purge(req)

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count.
        Returns at once when nothing can be due (called for every applied entry)."""
        self._open()
        if not self._expiry_due(now_ns):
            return 0
        with self.transaction():
            removed = self._expire_age(now_ns)
            while self._ttl_heap and self._ttl_heap[0][0] <= now_ns:
                _, seq = heapq.heappop(self._ttl_heap)
                msg = self._msgs.get(seq)
                if msg is not None and msg.ttl_ns and msg.ts + msg.ttl_ns <= now_ns:
                    self._remove(msg)
                    removed += 1
        return removed

    def _expiry_due(self, now_ns: int) -> bool:
        """False only when ``expire(now_ns)`` certainly removes nothing."""
        if self._ttl_heap and self._ttl_heap[0][0] <= now_ns:
            return True
        max_age = self._limits.max_age_ns
        if max_age <= 0 or not self._msgs:
            return False
        return self._msgs[self._c.first_seq].ts + max_age <= now_ns

    # -- Protocol: deduplication records ---------------------------------------------------

    def dedup_put(self, msg_id: str, seq: int, ts_ns: int) -> None:
        """Record ``msg_id`` -> (``seq``, ``ts_ns``), replacing its record (see the Protocol)."""
        self._open()
        check_dedup_args(msg_id, seq, ts_ns)
        with self.transaction():
            self._dedup.put(msg_id, seq, ts_ns)

    def dedup_get(self, msg_id: str) -> DedupRecord | None:
        self._open()
        return self._dedup.get(msg_id)

    def dedup_expire(self, before_ts_ns: int, *, limit: int = DEDUP_EXPIRE_RECORDS_MAX) -> int:
        """Remove up to ``limit`` records older than ``before_ts_ns``, oldest first."""
        self._open()
        if not self._dedup.due(before_ts_ns):
            return 0  # none is due: the common case, once per applied entry
        with self.transaction():
            return self._dedup.expire(before_ts_ns, limit)

    def dedup_iter(self) -> Iterator[DedupRecord]:
        """Every record in expiry order (a snapshot taken now: O(records log records))."""
        self._open()
        return self._dedup.iter()

    # -- Protocol: reads -------------------------------------------------------------------

    def load(self, seq: int) -> StoredMsg:
        self._open()
        msg = self._msgs.get(seq)
        if msg is None:
            raise NotFoundError(f"no message at sequence {seq}", seq=seq)
        return msg

    def load_last(self, subject_filter: str) -> StoredMsg:
        """The newest message matching the filter; ``NotFoundError`` when none does."""
        self._open()
        valid_filter(subject_filter, "subject_filter")
        best = 0
        for subject in self._matching_subjects(subject_filter):
            best = max(best, next(reversed(self._subjects[subject])))
        if best == 0:
            raise NotFoundError(f"no message matches {subject_filter!r}")
        return self._msgs[best]

    def load_next(self, subject_filter: str, start_seq: int) -> StoredMsg | None:
        """The first message at or after ``start_seq`` matching the filter, or None."""
        self._open()
        valid_filter(subject_filter, "subject_filter")
        start_seq = max(start_seq, self._c.first_seq, 1)
        if subject_filter == FWC:
            return next(self._iter(start_seq, FWC), None)
        found = [
            self._next_of_subject(s, start_seq) for s in self._matching_subjects(subject_filter)
        ]
        best = min((s for s in found if s is not None), default=None)
        return None if best is None else self._msgs[best]

    def iter_from(
        self, start_seq: int, subject_filter: str = ">", *, expect: int = 0
    ) -> Iterator[StoredMsg]:
        """Messages at or after ``start_seq`` matching the filter, in sequence order.

        A snapshot of the sequence range is taken lazily; messages removed while iterating
        are skipped, messages appended while iterating may or may not be seen.
        """
        self._open()
        valid_filter(subject_filter, "subject_filter")
        return self._iter(max(start_seq, self._c.first_seq, 1), subject_filter)

    def num_pending(self, start_seq: int, subject_filter: str = ">") -> int:
        """How many messages at or after ``start_seq`` match the filter."""
        self._open()
        valid_filter(subject_filter, "subject_filter")
        if subject_filter == FWC and start_seq <= self._c.first_seq:
            return len(self._msgs)
        total = 0
        for subject in self._matching_subjects(subject_filter):
            seqs = self._subjects[subject]
            if start_seq <= next(iter(seqs)):
                total += len(seqs)
            else:  # count from the newest: O(pending), small for a caught-up consumer
                for s in reversed(seqs):
                    if s < start_seq:
                        break
                    total += 1
        return total

    def state(self, *, subjects_filter: str | None = None) -> StreamState:
        """Counters; per-subject counts only when ``subjects_filter`` is given."""
        self._open()
        c = self._c
        msgs = len(self._msgs)
        first_ts = self._msgs[c.first_seq].ts if msgs else 0
        return StreamState(
            first_seq=c.first_seq,
            last_seq=c.last_seq,
            msgs=msgs,
            bytes=c.bytes,
            first_ts=first_ts,
            last_ts=c.last_ts,
            num_deleted=(c.last_seq - c.first_seq + 1 - msgs) if msgs else 0,
            num_subjects=len(self._subjects),
            subjects={} if subjects_filter is None else self.subjects_state(subjects_filter),
        )

    def subjects_state(self, subject_filter: str = ">") -> dict[str, int]:
        self._open()
        valid_filter(subject_filter, "subject_filter")
        return {s: len(self._subjects[s]) for s in self._matching_subjects(subject_filter)}

    def deleted(self, limit: int, *, scan_msgs_max: int) -> list[int]:
        """The sequences missing between first and last, the lowest ``limit`` (Protocol)."""
        self._open()
        c, msgs = self._c, len(self._msgs)
        missing = (c.last_seq - c.first_seq + 1 - msgs) if msgs else 0
        if missing <= 0 or limit <= 0:
            return []
        # Insertion order is sequence order: the keys are the stored sequences, ascending.
        return missing_seqs(
            self._msgs,
            first_seq=c.first_seq,
            last_seq=c.last_seq,
            missing=missing,
            limit=limit,
            scan_max=scan_msgs_max,
        )

    def close(self) -> None:
        """Drop everything; any later call raises ``InvariantError``."""
        invariant(self._txn_depth == 0, "close() inside a transaction")
        self._closed = True
        self._msgs.clear()
        self._subjects.clear()
        self._ttl_heap.clear()
        self._dedup.clear()

    # -- internals -------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise InvariantError("stream store used after close()")

    def _check_admission(self, subject: str, data: bytes, headers: Mapping[str, str]) -> None:
        lim = self._limits
        if limit_set(lim.max_msg_size) and len(data) + headers_size(headers) > lim.max_msg_size:
            raise LimitError("message size exceeds maximum allowed", limit="max_msg_size")
        if lim.discard is not DiscardPolicy.NEW:
            return
        if limit_set(lim.max_msgs) and len(self._msgs) >= lim.max_msgs:
            raise LimitError("maximum messages exceeded", limit="max_msgs")
        if limit_set(lim.max_bytes) and (
            self._c.bytes + msg_size(subject, data, headers) > lim.max_bytes
        ):
            raise LimitError("maximum bytes exceeded", limit="max_bytes")
        per = lim.max_msgs_per_subject
        if (
            lim.discard_new_per_subject
            and limit_set(per)
            and len(self._subjects.get(subject, ())) >= per
        ):
            raise LimitError("maximum messages per subject exceeded", limit="max_msgs_per_subject")

    def _add(self, msg: StoredMsg) -> None:
        invariant(msg.seq > self._c.last_seq, "append below last_seq")
        if not self._msgs:
            self._c.first_seq = msg.seq
        self._msgs[msg.seq] = msg
        self._subjects.setdefault(msg.subject, {})[msg.seq] = None
        self._c.bytes += msg.size
        if msg.ttl_ns:
            heapq.heappush(self._ttl_heap, (msg.ts + msg.ttl_ns, msg.seq))
        if self._undo is not None:
            self._undo.append((True, msg))

    def _remove(self, msg: StoredMsg) -> None:
        del self._msgs[msg.seq]
        seqs = self._subjects[msg.subject]
        del seqs[msg.seq]
        if not seqs:
            del self._subjects[msg.subject]
        self._c.bytes -= msg.size
        invariant(self._c.bytes >= 0, "negative byte count")
        if msg.seq == self._c.first_seq:
            self._c.first_seq = self._next_first()
        if self._undo is not None:
            self._undo.append((False, msg))

    def _next_first(self) -> int:
        """The new first_seq: the lowest stored sequence, or last_seq + 1 when empty."""
        if not self._msgs:
            return self._c.last_seq + 1
        # Insertion order is sequence order, so the first key is the lowest.
        return next(iter(self._msgs))

    def _remove_first(self) -> None:
        self._remove(self._msgs[next(iter(self._msgs))])

    def _enforce_per_subject(self, subject: str) -> None:
        per = self._limits.max_msgs_per_subject
        if not limit_set(per):
            return
        seqs = self._subjects.get(subject)
        while seqs and len(seqs) > per:
            self._remove(self._msgs[next(iter(seqs))])

    def _enforce_totals(self) -> None:
        lim = self._limits
        if limit_set(lim.max_msgs):
            while len(self._msgs) > lim.max_msgs:
                self._remove_first()
        if limit_set(lim.max_bytes):
            while self._msgs and self._c.bytes > lim.max_bytes:
                self._remove_first()

    def _expire_age(self, now_ns: int) -> int:
        max_age = self._limits.max_age_ns
        if max_age <= 0:
            return 0
        removed = 0
        while self._msgs:
            first = self._msgs[next(iter(self._msgs))]
            if first.ts + max_age > now_ns:
                break
            self._remove(first)
            removed += 1
        return removed

    def _purge(self, req: PurgeRequest) -> int:
        if req.is_full:
            removed = len(self._msgs)
            while self._msgs:
                self._remove_first()
            self._c.first_seq = self._c.last_seq + 1
            return removed
        if req.subject is None:
            victims = [s for s in self._msgs if req.before_seq is None or s < req.before_seq]
        else:
            victims = sorted(
                s
                for subj in self._matching_subjects(req.subject)
                for s in self._subjects[subj]
                if req.before_seq is None or s < req.before_seq
            )
        if req.keep is not None:
            victims = victims[: max(0, len(victims) - req.keep)]
        for seq in victims:
            self._remove(self._msgs[seq])
        if req.subject is None and req.before_seq is not None:
            self._compact_to(req.before_seq)
        return len(victims)

    def _compact_to(self, seq: int) -> None:
        """JetStream's Compact: sequences below ``seq`` are gone, even past the end."""
        if seq > self._c.last_seq + 1:
            self._c.last_seq = seq - 1
        if not self._msgs:
            self._c.first_seq = self._c.last_seq + 1

    def _matching_subjects(self, subject_filter: str) -> list[str]:
        if not has_wildcards(subject_filter):
            return [subject_filter] if subject_filter in self._subjects else []
        return [s for s in self._subjects if subject_matches(subject_filter, s)]

    def _iter(self, seq: int, subject_filter: str) -> Iterator[StoredMsg]:
        if subject_filter == FWC:
            while seq <= self._c.last_seq:
                msg = self._msgs.get(seq)
                if msg is not None:
                    yield msg
                seq += 1
            return
        # A filtered walk snapshots the matching sequences (O(matching messages)).
        subjects = self._matching_subjects(subject_filter)
        seqs = sorted(s for subj in subjects for s in self._subjects[subj] if s >= seq)
        for s in seqs:
            msg = self._msgs.get(s)
            if msg is not None:
                yield msg

    def _next_of_subject(self, subject: str, seq: int) -> int | None:
        """The first sequence >= ``seq`` of ``subject``.

        A consumer walking a subject finds its next message a few sequences on, so the
        stream is walked first (up to ``NEXT_WALK_SEQS_MAX`` sequences); a sparse subject
        then falls back to scanning its own sequences.
        """
        seqs = self._subjects.get(subject)
        if not seqs:
            return None
        first, last = next(iter(seqs)), next(reversed(seqs))
        if last < seq:
            return None
        if first >= seq:
            return first
        for s in range(seq, min(last, seq + NEXT_WALK_SEQS_MAX) + 1):
            msg = self._msgs.get(s)
            if msg is not None and msg.subject == subject:
                return s
        return next(s for s in seqs if s >= seq)

    def _rollback(self) -> None:
        undo, saved = self._undo, self._saved
        if undo is None or saved is None or not self._dedup.in_transaction:
            raise InvariantError("rollback outside a transaction")
        self._undo = None
        self._saved = None
        self._dedup.rollback()
        for was_added, msg in reversed(undo):
            if was_added:
                del self._msgs[msg.seq]
                seqs = self._subjects[msg.subject]
                del seqs[msg.seq]
                if not seqs:
                    del self._subjects[msg.subject]
            else:
                self._msgs[msg.seq] = msg
                self._subjects.setdefault(msg.subject, {})[msg.seq] = None
        # Re-inserted messages landed at the end of the dicts: restore sequence order. A
        # rollback is rare (an exception escaped a transaction), so the sort is affordable.
        self._msgs = dict(sorted(self._msgs.items()))
        self._subjects = {s: dict.fromkeys(sorted(q)) for s, q in self._subjects.items()}
        self._ttl_heap = [(m.ts + m.ttl_ns, m.seq) for m in self._msgs.values() if m.ttl_ns]
        heapq.heapify(self._ttl_heap)
        self._c, self._limits = saved
