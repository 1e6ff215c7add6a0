"""The contract of Raft log storage: one store per node holding the logs of many groups.

The write side takes the Ready of every group of a round in one call (one transaction, one
fsync); the read side is a per-group view that the core reads through (its ``LogView``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from raftstream.raft.core.log import CompactedError
from raftstream.raft.errors import PreconditionError
from raftstream.raft.types import ConfState, Entry, HardState, Snapshot, SnapshotMeta

__all__ = [
    "GroupLog",
    "GroupWrite",
    "LogCompactedError",
    "LogStorage",
    "LogUnavailableError",
]


# The core's error for "below the first index": storage raises it so the core can react
# (send a snapshot instead of entries).
LogCompactedError = CompactedError


class LogUnavailableError(PreconditionError):
    """The requested index is beyond the last stored entry."""

    reason = "LOG_UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class GroupWrite:
    """What one group persists in a round: the durable part of its Ready.

    Applied in this order within the write: ``snapshot`` (one received from the leader: it
    replaces the whole log, Raft §7, as the core restores from it alone), ``compaction`` (a
    snapshot the state machine took at an applied index: entries up to it are dropped, those
    after it kept), then ``entries`` (a suffix that conflicts with them is truncated first,
    §5.3), then ``hard_state``.
    """

    group: str
    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    compaction: Snapshot | None = None


class GroupLog(Protocol):
    """Read-only view of one group's stable log (what the core reads through).

    Reflects every ``write_batch`` that has returned; safe to call from any thread, but the
    host calls it from its event loop only while no write of the same group is in flight.
    """

    def first_index(self) -> int:
        """Index of the first stored entry: the snapshot's index + 1."""
        ...

    def last_index(self) -> int:
        """Index of the last stored entry, or the snapshot's index when the log is empty."""
        ...

    def term(self, index: int) -> int:
        """Term of entry ``index``: the snapshot's term at its index, 0 beyond the last index.

        Raises LogCompactedError below the snapshot's index, DataLossError if the stored
        record fails its checksum.
        """
        ...

    def entries(self, lo: int, hi: int, bytes_max: int | None = None) -> list[Entry]:
        """Entries ``[lo, hi)``; at least one when ``lo < hi``, then stop before the payload
        exceeds ``bytes_max``. LogCompactedError if ``lo < first_index()``,
        LogUnavailableError if ``hi > last_index() + 1``; DataLossError means never apply."""
        ...

    def hard_state(self) -> HardState: ...

    def conf_state(self) -> ConfState:
        """The configuration of the latest snapshot (later changes live in the log)."""
        ...

    def snapshot_meta(self) -> SnapshotMeta: ...

    def snapshot(self) -> Snapshot:
        """The latest snapshot, data included (verified against its checksum)."""
        ...


class LogStorage(Protocol):
    """The Raft logs of every group of one node.

    Threading: ``write_batch`` and ``remove_group`` must be called from one thread at a time
    (the host's single writer thread; LMDB write transactions are bound to their thread). The
    read side (``log``, ``groups``) may be called from any thread.
    """

    def groups(self) -> list[str]:
        """Every group with durable state, sorted."""
        ...

    def log(self, group: str) -> GroupLog:
        """The read view of ``group`` (empty if the group has never been written)."""
        ...

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        """Persist every write atomically and durably (one transaction, one fsync).

        When it returns, all of it survives a crash; when it raises, none of it was applied
        and the views are unchanged. At most one write per group per batch.
        """
        ...

    def remove_group(self, group: str) -> None:
        """Delete everything of ``group`` durably. Idempotent."""
        ...

    def close(self) -> None: ...
