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

__all__ = [
    "EMPTY_HEADERS",
    "UNLIMITED",
    "DiscardPolicy",
    "StoreLimits",
    "StoredMsg",
    "StreamState",
    "StreamStore",
]

UNLIMITED = -1
EMPTY_HEADERS: Mapping[str, str] = MappingProxyType({})


class DiscardPolicy(enum.StrEnum):
    OLD = "old"
    NEW = "new"


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """Limits enforced on append; -1 (``UNLIMITED``) means no limit."""

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
        return (
            len(self.subject.encode())
            + sum(len(k.encode()) + len(v.encode()) for k, v in self.headers.items())
            + len(self.data)
        )


@dataclass(frozen=True, slots=True)
class StreamState:
    first_seq: int
    last_seq: int
    msgs: int
    bytes: int
    first_ts: int = 0
    last_ts: int = 0
    num_deleted: int = 0  # interior sequences missing between first_seq and last_seq
    num_subjects: int = 0
    subjects: Mapping[str, int] = field(default_factory=dict)  # only when asked for


class StreamStore(Protocol):
    """A single stream's messages on one node.

    Failure contract: ``LimitError`` when a discard-new limit refuses an append (nothing
    changes); ``NotFoundError`` for a sequence that was never stored or was removed;
    ``DataLossError`` when a stored record fails its checksum (never wrong data).
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
        ``keep``); returns how many were removed."""

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count."""

    def state(self, *, subjects_filter: str | None = None) -> StreamState: ...

    def subjects_state(self, subject_filter: str = ">") -> dict[str, int]:
        """Message count per subject matching the filter."""

    def close(self) -> None: ...
