"""The stream store contract: what a stream keeps on one node, and the limits it enforces.

Two implementations share this Protocol and one test suite: ``LmdbStreamStore``
(``engine/lmdbstore.py``) and ``MemoryStreamStore`` (``engine/memstore.py``). A store is
owned by one thread at a time (the caller serialises access); it never reads the clock:
every time it needs (``max_age``, per-message TTL) comes in as ``now_ns`` from the caller,
which in a cluster is the leader's stamp carried by the Raft entry.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from raftstream.engine.subjects import FWC, validate_filter
from raftstream.errors import InvalidArgumentError

__all__ = [
    "EMPTY_HEADERS",
    "UNLIMITED",
    "DiscardPolicy",
    "PurgeRequest",
    "StoreLimits",
    "StoredMsg",
    "StreamState",
    "StreamStore",
    "headers_size",
    "limit_set",
    "msg_size",
    "normalize_purge",
]

UNLIMITED = -1
EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})


class DiscardPolicy(enum.StrEnum):
    OLD = "old"
    NEW = "new"


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
    """

    @property
    def limits(self) -> StoreLimits: ...

    def update_limits(self, limits: StoreLimits, now_ns: int) -> None:
        """Change limits; enforces them at once (may remove old messages)."""

    def transaction(self) -> AbstractContextManager[None]:
        """Group appends/deletes/purges into one write transaction (one fsync)."""

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

    def iter_from(self, start_seq: int, subject_filter: str = ">") -> Iterator[StoredMsg]: ...

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
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count."""

    def state(self, *, subjects_filter: str | None = None) -> StreamState: ...

    def subjects_state(self, subject_filter: str = ">") -> dict[str, int]:
        """Message count per subject matching the filter."""

    def close(self) -> None: ...
