"""The stream store contract: what a stream keeps on one node, and the limits it enforces.

Two implementations share this Protocol and one test suite: ``LmdbStreamStore``
(``engine/lmdbstore.py``) and ``MemoryStreamStore`` (``engine/memstore.py``). A store is
owned by one thread at a time (the caller serialises access); it never reads the clock:
every time it needs (``max_age``, per-message TTL) comes in as ``now_ns`` from the caller,
which in a cluster is the leader's stamp carried by the Raft entry.

Besides messages, a store keeps the stream's deduplication records (msg id -> the sequence
and time it was first stored as), written in the same transaction as the append they belong
to. They live apart from the messages: removing a message (delete, purge, limits, acks)
leaves its record, as JetStream keeps an id for the whole duplicate window.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from raftstream.engine.subjects import FWC, validate_filter
from raftstream.errors import InvalidArgumentError
from raftstream.model.policies import UNLIMITED, DiscardPolicy

__all__ = [
    "DEDUP_EXPIRE_RECORDS_MAX",
    "DEDUP_KEY_BYTES",
    "EMPTY_HEADERS",
    "TS_NS_MAX",
    "UNLIMITED",
    "DedupRecord",
    "DiscardPolicy",
    "PurgeRequest",
    "StoreLimits",
    "StoredMsg",
    "StreamState",
    "StreamStore",
    "check_dedup_args",
    "dedup_key",
    "headers_size",
    "limit_set",
    "missing_seqs",
    "msg_size",
    "normalize_purge",
]

EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})
TS_NS_MAX = 2**63 - 1  # timestamps and TTL deadlines are signed 64-bit nanoseconds
DEDUP_KEY_BYTES = 16
# Records one ``dedup_expire`` call removes by default: a publish adds at most one record, so
# an apply that expires up to this many drains any backlog (a window's worth of ids after a
# quiet spell) without one entry paying for all of it.
DEDUP_EXPIRE_RECORDS_MAX = 1024


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Limits enforced on append; -1 (``UNLIMITED``) means no limit.

    As in JetStream, any value <= 0 is treated as "no limit" (JetStream's stores test
    ``limit > 0``), so a zero from a config that forgot to normalise never blocks a stream.
    ``max_msg_size`` counts header keys/values and payload (not the subject), as JetStream's
    ``max_msg_size`` does; ``max_bytes`` counts ``StoredMsg.size``.
    """

    max_msgs: int = UNLIMITED
    max_bytes: int = UNLIMITED
    max_msgs_per_subject: int = UNLIMITED
    max_msg_size: int = UNLIMITED
    max_age_ns: int = 0  # 0: no age limit
    discard: DiscardPolicy = DiscardPolicy.OLD
    discard_new_per_subject: bool = False


@dataclass(frozen=True, slots=True)
class StoredMsg:
    """One stored message. ``ts`` is nanoseconds since the epoch, stamped by the leader."""

    seq: int
    subject: str
    data: bytes
    ts: int
    headers: Mapping[str, str] = field(default_factory=lambda: EMPTY_HEADERS)
    ttl_ns: int = 0  # per-message TTL (0: none); expires at ts + ttl_ns

    @property
    def size(self) -> int:
        """Bytes counted against ``max_bytes``: subject + header keys/values + payload."""
        return msg_size(self.subject, self.data, self.headers)


@dataclass(frozen=True, slots=True)
class StreamState:
    """A stream's counters, as JetStream reports them.

    A stream that never stored anything has ``first_seq == last_seq == 0``. Once a sequence
    was used, an empty stream has ``first_seq == last_seq + 1`` (JetStream after a purge).
    ``last_seq``/``last_ts`` are those of the last append and do not move back when that
    message is removed; ``first_ts`` is the timestamp of the first stored message (0 if none).
    """

    first_seq: int
    last_seq: int
    msgs: int
    bytes: int
    first_ts: int = 0
    last_ts: int = 0
    num_deleted: int = 0  # interior sequences missing between first_seq and last_seq
    num_subjects: int = 0
    subjects: Mapping[str, int] = field(default_factory=dict)  # only when asked for


@dataclass(frozen=True, slots=True)
class DedupRecord:
    """A msg id's deduplication record: the sequence its publish was answered with and the
    (leader-stamped) time it was recorded at, which the duplicate window is measured from."""

    msg_id: str
    seq: int
    ts_ns: int


def dedup_key(msg_id: str) -> bytes:
    """The fixed-size key of a msg id (a 16-byte blake2b digest of its UTF-8 bytes).

    Ids may be long and LMDB keys are short, so the LMDB store keys records by this digest
    (keeping the id in the value); records of equal ``ts_ns`` expire in the order of this
    key on both stores, so bounded expiry removes the same records everywhere.
    """
    return hashlib.blake2b(msg_id.encode(), digest_size=DEDUP_KEY_BYTES).digest()


def check_dedup_args(msg_id: str, seq: int, ts_ns: int) -> None:
    """Refuse (``InvalidArgumentError``) what no dedup record can hold (shared by both stores):
    an empty or non-UTF-8 id, a sequence below 1, a time outside 0..``TS_NS_MAX``."""
    if not msg_id:
        raise InvalidArgumentError("msg_id", "must not be empty")
    try:
        msg_id.encode()
    except UnicodeEncodeError:
        raise InvalidArgumentError("msg_id", "must be valid UTF-8") from None
    if seq < 1:
        raise InvalidArgumentError("seq", "must be positive")
    if not 0 <= ts_ns <= TS_NS_MAX:
        raise InvalidArgumentError("ts_ns", f"must be in 0..{TS_NS_MAX}")


def limit_set(value: int) -> bool:
    """True when a ``StoreLimits`` count/size is an actual limit (JetStream: ``> 0``)."""
    return value > 0


def headers_size(headers: Mapping[str, str]) -> int:
    """Bytes of header keys and values, as counted by ``StoredMsg.size``."""
    if not headers:
        return 0
    return sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())


def msg_size(subject: str, data: bytes, headers: Mapping[str, str]) -> int:
    """``StoredMsg.size`` computed before the message exists (for discard-new checks)."""
    return len(subject.encode()) + headers_size(headers) + len(data)


@dataclass(frozen=True, slots=True)
class PurgeRequest:
    """A validated purge: what ``StreamStore.purge`` removes.

    ``subject`` None means every subject; ``before_seq`` None means no upper bound (it is
    exclusive, as JetStream's purge ``seq``); ``keep`` None means keep nothing.
    """

    subject: str | None
    before_seq: int | None
    keep: int | None

    @property
    def is_full(self) -> bool:
        return self.subject is None and self.before_seq is None and self.keep is None


def missing_seqs(
    stored: Iterable[int],
    *,
    first_seq: int,
    last_seq: int,
    missing: int,
    limit: int,
    scan_max: int,
) -> list[int]:
    """The sequences of ``first_seq..last_seq`` not in ``stored`` (ascending stored
    sequences from ``first_seq`` on), in order: the lowest ones, at most ``limit``. Stops
    reading ``stored`` once it has them, or all ``missing`` (the state's ``num_deleted``),
    so a stream whose gaps are all near its start is not walked to its end; and after
    ``scan_max`` stored sequences (what is found below them is returned: still the lowest)."""
    want = min(missing, limit)
    out: list[int] = []
    expected = first_seq
    for scanned, seq in enumerate(stored):
        if len(out) >= want or scanned >= scan_max:
            return out
        if seq > expected:
            out.extend(range(expected, min(seq, expected + want - len(out))))
        expected = seq + 1
    # After the last stored message: sequences removed from the end (last_seq stays).
    if len(out) < want and expected <= last_seq:
        out.extend(range(expected, min(last_seq + 1, expected + want - len(out))))
    return out


def normalize_purge(subject: str | None, seq: int | None, keep: int | None) -> PurgeRequest:
    """Validate purge arguments the way JetStream's purge request does.

    ``subject`` ``">"`` is the same as no filter; ``seq`` and ``keep`` of 0 mean unset;
    ``seq`` and ``keep`` together are refused (JetStream: "sequence and keep are mutually
    exclusive"). Raises ``InvalidArgumentError`` naming the field.
    """
    if subject is not None:
        validate_filter(subject, "subject")
        if subject == FWC:
            subject = None
    if seq is not None and seq < 0:
        raise InvalidArgumentError("seq", "must not be negative")
    if keep is not None and keep < 0:
        raise InvalidArgumentError("keep", "must not be negative")
    seq = seq or None
    keep = keep or None
    if seq is not None and keep is not None:
        raise InvalidArgumentError("seq", "seq and keep are mutually exclusive")
    return PurgeRequest(subject=subject, before_seq=seq, keep=keep)


class StreamStore(Protocol):
    """A single stream's messages on one node.

    Failure contract: ``LimitError`` when a discard-new limit refuses an append (nothing
    changes); ``NotFoundError`` for a sequence that was never stored or was removed;
    ``DataLossError`` when a stored record fails its checksum (never wrong data);
    ``InvalidArgumentError`` for a malformed subject, filter or purge request (nothing
    changes). An exception that leaves ``transaction()`` rolls the whole group back.

    Limits on append, in JetStream's order: ``max_msg_size`` and (with discard new)
    ``max_msgs``, ``max_bytes`` and ``discard_new_per_subject`` refuse the message before
    anything is written; otherwise the message is stored and then ``max_msgs_per_subject``,
    ``max_msgs``, ``max_bytes`` and ``max_age`` remove the oldest messages until they hold.
    Age expiry walks from the first message and stops at the first young one (timestamps are
    the leader's and grow with the sequence).

    Deduplication records (``dedup_*``) join the open transaction like every write, so a
    publish and its record commit or roll back together. No message operation touches them
    (delete, purge, limits and expiry of messages leave them, as JetStream keeps ids for the
    whole duplicate window); ``dedup_expire`` removes them, and dropping the stream does.
    """

    @property
    def limits(self) -> StoreLimits: ...

    @property
    def last_seq(self) -> int:
        """``state().last_seq``, cheaply: the stream state machine reads it per entry."""
        ...

    @property
    def last_ts(self) -> int:
        """``state().last_ts``, cheaply: the stream state machine reads it per entry."""
        ...

    def update_limits(self, limits: StoreLimits, now_ns: int) -> None:
        """Change limits; enforces them at once (may remove old messages)."""

    def transaction(self) -> AbstractContextManager[None]:
        """Group appends/deletes/purges into one write transaction (one fsync). A block
        opened inside another joins it (cheaply: callers nest them per applied entry)."""

    def append(
        self,
        subject: str,
        data: bytes,
        *,
        headers: Mapping[str, str] = EMPTY_HEADERS,
        now_ns: int,
        ttl_ns: int = 0,
    ) -> int:
        """Store a message at the next sequence and return it; then enforce limits."""

    def skip(self, seq: int) -> None:
        """Move the next sequence to ``seq`` (first_seq, mirrors); nothing is stored."""

    def load(self, seq: int) -> StoredMsg: ...

    def load_last(self, subject_filter: str) -> StoredMsg:
        """The newest message whose subject matches the filter (wildcards allowed)."""

    def load_next(self, subject_filter: str, start_seq: int) -> StoredMsg | None:
        """The first message at or after ``start_seq`` matching the filter, or None."""

    def iter_from(
        self, start_seq: int, subject_filter: str = ">", *, expect: int = 0
    ) -> Iterator[StoredMsg]:
        """Messages at or after ``start_seq`` matching the filter, in sequence order;
        ``expect``: about how many the caller will take (0: unknown), so a store that reads
        ahead reads no more than that at first."""

    def num_pending(self, start_seq: int, subject_filter: str = ">") -> int:
        """How many messages at or after ``start_seq`` match the filter."""

    def delete(self, seq: int, *, erase: bool = False) -> bool:
        """Remove one message (``erase`` overwrites its bytes first). False if absent."""

    def purge(
        self, *, subject: str | None = None, seq: int | None = None, keep: int | None = None
    ) -> int:
        """Remove messages (all, matching ``subject``, below ``seq``, or all but the newest
        ``keep``); returns how many were removed.

        As JetStream's purge request: ``subject`` narrows any form; ``seq`` is exclusive and
        cannot be combined with ``keep``; ``keep`` keeps the newest N matching messages. A
        purge below ``seq`` without a subject compacts: ``first_seq`` becomes at least
        ``seq`` (and ``last_seq`` moves up to ``seq - 1`` if it was lower)."""

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count.
        Called for every applied entry, so it must be cheap when nothing is due: no I/O,
        and (LMDB) no write of the transaction's buffered appends."""

    def state(self, *, subjects_filter: str | None = None) -> StreamState: ...

    def subjects_state(self, subject_filter: str = ">") -> dict[str, int]:
        """Message count per subject matching the filter."""

    def deleted(self, limit: int, *, scan_msgs_max: int) -> list[int]:
        """The sequences between ``first_seq`` and ``last_seq`` that hold no message (the
        state's ``num_deleted`` of them: deleted, or removed by a limit, an ack, a TTL or a
        purge of some subjects), ascending (JetStream's ``deleted_details``). Cut short, to
        the lowest ones, at ``limit`` sequences or once ``scan_msgs_max`` stored messages
        were walked (keys only) looking for them; nothing is walked when none is deleted."""

    def dedup_put(self, msg_id: str, seq: int, ts_ns: int) -> None:
        """Record ``msg_id`` as published at ``seq`` at ``ts_ns``, replacing its record if it
        has one. ``InvalidArgumentError`` (nothing written) as ``check_dedup_args``."""

    def dedup_get(self, msg_id: str) -> DedupRecord | None:
        """The record of ``msg_id``, or None; it may be older than the caller's window (the
        caller measures the window; ``dedup_expire`` only bounds how long records stay)."""

    def dedup_expire(self, before_ts_ns: int, *, limit: int = DEDUP_EXPIRE_RECORDS_MAX) -> int:
        """Remove up to ``limit`` records with ``ts_ns < before_ts_ns``, in ``dedup_iter``
        order; returns how many. Deterministic: the same calls leave the same records."""

    def dedup_iter(self) -> Iterator[DedupRecord]:
        """Every record, ordered by (``ts_ns``, ``dedup_key(msg_id)``): the expiry order."""

    def close(self) -> None: ...
