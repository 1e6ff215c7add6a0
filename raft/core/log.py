"""The replica's log: a read-only view of what storage holds, plus what is not yet stable.

``LogView`` is the read side that every storage implements (raft/storage's LMDB log, and its
in-memory twin's group view ``MemoryGroupLog`` that the core's tests and the core-only
simulator use). The core never writes to it: new
entries stay in ``Unstable`` until the driver has persisted them from a ``Ready`` and called
``advance``. ``RaftLog`` joins the two and keeps the commit and apply positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from raftstream.raft.errors import PreconditionError, invariant
from raftstream.raft.types import Entry, HardState, Snapshot

__all__ = [
    "CompactedError",
    "LogView",
    "RaftLog",
    "Unstable",
    "entries_size",
    "limit_size",
]


class CompactedError(PreconditionError):
    """The requested index is below the first index: it lives only in the snapshot."""

    reason = "LOG_COMPACTED"


class LogView(Protocol):
    """Read side of a group's durable log, as the core sees it.

    Contract (the LMDB log and the in-memory one both keep it):

    - ``snapshot()`` is the latest durable snapshot (index 0 when none); entries up to its
      index are gone. ``first_index() == snapshot().meta.index + 1``.
    - ``last_index() >= first_index() - 1``; entries ``first_index()..last_index()`` exist.
    - ``term(i)`` is defined for ``first_index() - 1 <= i <= last_index()`` (the lower end is
      the snapshot's term); below, it raises ``CompactedError``; above, it returns 0.
    - ``entries(lo, hi, bytes_max)`` returns entries ``[lo, hi)`` (``lo >= first_index()``,
      else ``CompactedError``), stopping once ``bytes_max`` payload bytes are reached but
      always returning at least one entry when ``lo < hi``.
    - A stored entry failing its checksum raises ``raftstream.raft.errors.DataLossError``; the core
      lets it propagate and the replica must stop: it never applies or sends that entry.
    """

    def hard_state(self) -> HardState: ...

    def snapshot(self) -> Snapshot: ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term(self, index: int) -> int: ...

    def entries(self, lo: int, hi: int, bytes_max: int) -> Sequence[Entry]: ...


def entries_size(entries: Sequence[Entry]) -> int:
    """Payload bytes of ``entries``: what the byte limits count."""
    return sum(len(e.data) for e in entries)


def limit_size(entries: Sequence[Entry], bytes_max: int) -> Sequence[Entry]:
    """The longest prefix within ``bytes_max`` payload bytes, never fewer than one entry."""
    total = 0
    for n, e in enumerate(entries):
        total += len(e.data)
        if total > bytes_max and n > 0:
            return entries[:n]
    return entries


class Unstable:
    """Entries (and maybe a snapshot) the core has accepted but storage has not persisted.

    ``offset`` is the index of ``entries[0]``. Everything here is handed out in the next
    ``Ready`` and only becomes stable when the driver reports it persisted.
    """

    __slots__ = ("entries", "offset", "snapshot")

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset

    def maybe_first_index(self) -> int | None:
        return self.snapshot.meta.index + 1 if self.snapshot is not None else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        return self.snapshot.meta.index if self.snapshot is not None else None

    def maybe_term(self, index: int) -> int | None:
        if index < self.offset:
            snap = self.snapshot
            return snap.meta.term if snap is not None and snap.meta.index == index else None
        last = self.maybe_last_index()
        if last is None or index > last:
            return None
        return self.entries[index - self.offset].term

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to ``index`` (if still of ``term``) are now durable."""
        t = self.maybe_term(index)
        if t is None or t != term or index < self.offset:
            return  # replaced by a newer append since the Ready was taken
        del self.entries[: index + 1 - self.offset]
        self.offset = index + 1

    def stable_snap_to(self, index: int) -> None:
        if self.snapshot is not None and self.snapshot.meta.index == index:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.meta.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, entries: Sequence[Entry]) -> None:
        after = entries[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(entries)
        elif after <= self.offset:
            # Replaces everything unstable (storage keeps the prefix below ``after``).
            self.offset = after
            self.entries = list(entries)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(entries)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        invariant(self.offset <= lo <= hi <= self.offset + len(self.entries), "bad unstable slice")
        return self.entries[lo - self.offset : hi - self.offset]


class RaftLog:
    """Stable view + unstable tail, with ``committed`` and ``applied`` positions.

    ``applying`` is the highest index handed to the driver for application (in a Ready not
    yet advanced); ``applied`` the highest the driver has reported applied.
    """

    __slots__ = ("applied", "applying", "committed", "storage", "unstable")

    def __init__(self, storage: LogView, applied: int) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = Unstable(last + 1)
        self.committed = first - 1
        self.applied = max(first - 1, applied)
        self.applying = self.applied

    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def last_term(self) -> int:
        return self.term(self.last_index())

    def term(self, index: int) -> int:
        """Term at ``index``; 0 beyond the last index; CompactedError below the first - 1."""
        t = self.unstable.maybe_term(index)
        if t is not None:
            return t
        if index > self.last_index():
            return 0
        if index < self.first_index() - 1:
            raise CompactedError(f"index {index} compacted")
        return self.storage.term(index)

    def zero_term(self, index: int) -> int:
        """Like ``term``, but 0 for a compacted index (for comparisons only)."""
        try:
            return self.term(index)
        except CompactedError:
            return 0

    def match_term(self, index: int, term: int) -> bool:
        return self.zero_term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a candidate's log is at least as up-to-date as ours (§5.4.1)."""
        ours = self.last_term()
        return last_term > ours or (last_term == ours and last_index >= self.last_index())

    def maybe_append(
        self, index: int, log_term: int, committed: int, entries: Sequence[Entry]
    ) -> int | None:
        """Follower side of AppendEntries: None when the log does not contain (index,
        log_term) (§5.3 consistency check), else the index of the last new entry."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        conflict = self.find_conflict(entries)
        if conflict:
            invariant(conflict > self.committed, f"conflict {conflict} with committed entry")
            self.append(entries[conflict - entries[0].index :])
        self.commit_to(min(committed, last_new))
        return last_new

    def find_conflict(self, entries: Sequence[Entry]) -> int:
        """Index of the first entry absent from or conflicting with our log, or 0."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest ``i <= index`` whose term is ``<= term``, with that term: the fast
        backtracking hint. Stops at the first index we can still read."""
        lo = self.first_index() - 1
        while index > lo:
            t = self.zero_term(index)
            if t <= term:
                return index, t
            index -= 1
        return index, self.zero_term(index)

    def append(self, entries: Sequence[Entry]) -> int:
        if not entries:
            return self.last_index()
        invariant(entries[0].index - 1 >= self.committed, "append would overwrite committed")
        self.unstable.truncate_and_append(entries)
        return self.last_index()

    def unstable_entries(self) -> list[Entry]:
        return list(self.unstable.entries)

    def has_next_committed(self) -> bool:
        return self.committed > self.applying and self.unstable.snapshot is None

    def next_committed(self, bytes_max: int) -> list[Entry]:
        """Committed entries not yet handed out for application (at most ``bytes_max``)."""
        if not self.has_next_committed():
            return []
        lo = max(self.applying + 1, self.first_index())
        return self.slice(lo, self.committed + 1, bytes_max)

    def entries_from(self, lo: int, bytes_max: int) -> list[Entry]:
        last = self.last_index()
        if lo > last:
            return []
        return self.slice(lo, last + 1, bytes_max)

    def slice(self, lo: int, hi: int, bytes_max: int) -> list[Entry]:
        """Entries ``[lo, hi)`` within ``bytes_max`` bytes (at least one); CompactedError if
        ``lo`` is below the first index."""
        if lo >= hi:
            return []
        if lo < self.first_index():
            raise CompactedError(f"index {lo} compacted")
        invariant(hi <= self.last_index() + 1, f"slice [{lo}, {hi}) beyond last index")
        off = self.unstable.offset
        out: list[Entry] = []
        if lo < off:
            out = list(self.storage.entries(lo, min(hi, off), bytes_max))
            if len(out) < min(hi, off) - lo:
                return out  # the byte limit stopped the stable part
        if hi > off:
            out.extend(self.unstable.slice(max(lo, off), hi))
        return list(limit_size(out, bytes_max))

    def maybe_commit(self, index: int, term: int) -> bool:
        """Commit up to ``index`` only if that entry is of ``term`` (the current term).

        Safety, §5.4.2: a leader never commits an entry of an earlier term by counting
        replicas; such entries are committed indirectly by a current-term entry after them.
        """
        if index > self.committed and self.zero_term(index) == term:
            self.commit_to(index)
            return True
        return False

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            invariant(index <= self.last_index(), f"commit {index} beyond last index")
            self.committed = index

    def applied_to(self, index: int) -> None:
        if index == 0:
            return
        invariant(self.applied <= index <= self.committed, f"applied {index} out of range")
        self.applied = index
        self.applying = max(self.applying, index)

    def restore(self, snap: Snapshot) -> None:
        """Replace the log by a snapshot from the leader (nothing of ours is kept)."""
        self.committed = snap.meta.index
        self.unstable.restore(snap)

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def stable_to(self, index: int, term: int) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, index: int) -> None:
        self.unstable.stable_snap_to(index)
