"""What the LMDB storage and its in-memory twin share: per-group bounds, write planning, views.

A write is planned (validated, turned into deletions and puts) before anything is touched, so
both backends enforce the same rules and reject the same bad writes.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from raftstream.raft.core.log import CompactedError
from raftstream.raft.errors import DataLossError, invariant
from raftstream.raft.storage.api import GroupWrite, LogUnavailableError
from raftstream.raft.types import ConfState, Entry, HardState, Snapshot, SnapshotMeta

__all__ = ["GroupState", "LogStorageBase", "WritePlan", "plan_write"]


@dataclass(frozen=True, slots=True)
class GroupState:
    """Cached bounds of one group's durable log. Immutable: swapped whole after a commit."""

    prefix: bytes
    last_index: int = 0
    last_term: int = 0
    hard_state: HardState = field(default_factory=HardState)
    snap_meta: SnapshotMeta = field(default_factory=SnapshotMeta)

    @property
    def first_index(self) -> int:
        return self.snap_meta.index + 1


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Storage operations of one GroupWrite, in order: delete entries ``<= compact_through``,
    delete entries ``>= truncate_from``, put ``entries``, put ``hard_state``, put
    ``snapshot`` (the installed or the compaction snapshot, whichever is newer)."""

    state: GroupState  # the bounds once the plan is applied
    compact_through: int | None
    truncate_from: int | None
    entries: tuple[Entry, ...]
    hard_state: HardState | None
    snapshot: Snapshot | None


def _plan_install(state: GroupState, snap: Snapshot) -> tuple[GroupState, int]:
    """A snapshot from the leader replaces the whole log (the core restores from it alone)."""
    meta = snap.meta
    invariant(
        meta.index >= state.snap_meta.index,
        f"snapshot at {meta.index} older than the stored one at {state.snap_meta.index}",
    )
    dropped = max(state.last_index, meta.index)
    return GroupState(state.prefix, meta.index, meta.term, state.hard_state, meta), dropped


def _plan_compaction(
    state: GroupState, snap: Snapshot, term_at: Callable[[int], int]
) -> tuple[GroupState, int]:
    """A snapshot taken locally at an applied index: entries it covers go, the rest stay."""
    meta = snap.meta
    invariant(
        state.snap_meta.index <= meta.index <= state.last_index,
        f"compaction at {meta.index} outside the log {state.first_index}..{state.last_index}",
    )
    if meta.index > state.snap_meta.index:
        invariant(term_at(meta.index) == meta.term, f"compaction term mismatch at {meta.index}")
    return GroupState(state.prefix, state.last_index, state.last_term, state.hard_state, meta), (
        meta.index
    )


def _check_entries(entries: tuple[Entry, ...]) -> None:
    for prev, cur in itertools.pairwise(entries):
        invariant(cur.index == prev.index + 1, f"entries not contiguous at {cur.index}")
        invariant(cur.term >= prev.term, f"entry terms go down at {cur.index}")


def plan_write(state: GroupState, write: GroupWrite, term_at: Callable[[int], int]) -> WritePlan:
    """Validate ``write`` against ``state`` and plan it; raise InvariantError if it is bad.

    ``term_at(i)`` reads the stored term of entry ``i`` (only called within the stored range).
    """
    compact_through: int | None = None
    if write.snapshot is not None:
        state, compact_through = _plan_install(state, write.snapshot)
    if write.compaction is not None:
        state, through = _plan_compaction(state, write.compaction, term_at)
        compact_through = max(compact_through or 0, through)
    # Entries at or below the snapshot are committed and already folded into it: skip them.
    entries = tuple(e for e in write.entries if e.index >= state.first_index)
    truncate_from: int | None = None
    if entries:
        _check_entries(entries)
        first = entries[0].index
        invariant(first <= state.last_index + 1, f"gap: append at {first} after {state.last_index}")
        if first <= state.last_index:  # a conflicting suffix: it goes, Raft §5.3
            truncate_from = first
        last = entries[-1]
        state = GroupState(state.prefix, last.index, last.term, state.hard_state, state.snap_meta)
    if write.hard_state is not None:
        hs = write.hard_state
        invariant(hs.term >= state.hard_state.term, "hard state term goes down")
        invariant(hs.commit <= state.last_index, f"commit {hs.commit} beyond the stored log")
        state = GroupState(state.prefix, state.last_index, state.last_term, hs, state.snap_meta)
    snap = write.compaction or write.snapshot
    return WritePlan(state, compact_through, truncate_from, entries, write.hard_state, snap)


def check_unique_groups(writes: Sequence[GroupWrite]) -> None:
    groups = [w.group for w in writes]
    invariant(len(set(groups)) == len(groups), "at most one write per group per batch")


class _View:
    """GroupLog over a LogStorageBase; reads the latest committed state on every call."""

    __slots__ = ("_group", "_storage")

    def __init__(self, storage: LogStorageBase, group: str) -> None:
        self._storage = storage
        self._group = group

    def _state(self) -> GroupState:
        return self._storage.group_state(self._group)

    def first_index(self) -> int:
        return self._state().first_index

    def last_index(self) -> int:
        return self._state().last_index

    def term(self, index: int) -> int:
        st = self._state()
        if index == st.last_index:
            return st.last_term
        if index == st.snap_meta.index:
            return st.snap_meta.term
        if index < st.snap_meta.index:
            raise CompactedError(f"{self._group}: entry {index} is compacted")
        if index > st.last_index:
            return 0
        cached = self._storage.cached_entry(self._group, index)
        if cached is not None:
            return cached.term
        return self._storage.read_entries(st.prefix, index, index + 1, None)[0].term

    def entries(self, lo: int, hi: int, bytes_max: int | None = None) -> list[Entry]:
        st = self._state()
        if lo < st.first_index:
            raise CompactedError(f"{self._group}: entries from {lo} are compacted")
        if hi > st.last_index + 1:
            raise LogUnavailableError(f"{self._group}: entries to {hi} are beyond the log")
        if lo >= hi:
            return []
        cached = self._storage.cached_entries(self._group, lo, hi, bytes_max)
        if cached is not None:
            return cached
        return self._storage.read_entries(st.prefix, lo, hi, bytes_max)

    def hard_state(self) -> HardState:
        return self._state().hard_state

    def conf_state(self) -> ConfState:
        return self._state().snap_meta.conf

    def snapshot_meta(self) -> SnapshotMeta:
        return self._state().snap_meta

    def snapshot(self) -> Snapshot:
        st = self._state()
        if not st.prefix:
            return Snapshot(meta=st.snap_meta)
        return Snapshot(meta=st.snap_meta, data=self._storage.read_snapshot_data(st.prefix))


def take_entries(
    lo: int, hi: int, max_bytes: int | None, records: Callable[[int], Entry | None]
) -> list[Entry]:
    """Read entries ``[lo, hi)`` one by one through ``records(index)`` with the size rule."""
    out: list[Entry] = []
    size = 0
    for index in range(lo, hi):
        entry = records(index)
        if entry is None:  # a hole inside the stored range: the log lost a record
            raise DataLossError(f"raft entry {index} missing inside the stored range")
        size += len(entry.data)
        if out and max_bytes is not None and size > max_bytes:
            break
        out.append(entry)
    return out


class LogStorageBase(abc.ABC):
    """Group registry, views and a tail cache; subclasses provide record reads and writes.

    The tail cache keeps the last ``tail_cache_entries_max`` entries written per group, as
    written (the core reads them back when they commit, a round or two later). It is
    updated on the writer thread after a commit; readers only look keys up (atomic under
    the GIL), and the host never reads a group while its write is in flight. It starts
    empty on open, so everything read after a restart comes from disk, checksums verified.
    """

    def __init__(self, *, tail_cache_entries_max: int = 1024) -> None:
        self._states: dict[str, GroupState] = {}
        self._tail: dict[str, dict[int, Entry]] = {}
        self._tail_max = tail_cache_entries_max

    def cache_written(self, group: str, plan: WritePlan) -> None:
        """Writer thread, after the commit of ``plan``: mirror it in the tail cache."""
        tail = self._tail.setdefault(group, {})
        ct, tf = plan.compact_through, plan.truncate_from
        if ct is not None or tf is not None:
            for i in [
                i for i in tail if (ct is not None and i <= ct) or (tf is not None and i >= tf)
            ]:
                del tail[i]
        for e in plan.entries:
            tail[e.index] = e
        while len(tail) > self._tail_max:
            del tail[next(iter(tail))]  # the oldest written

    def drop_cache(self, group: str) -> None:
        self._tail.pop(group, None)

    def cached_entry(self, group: str, index: int) -> Entry | None:
        tail = self._tail.get(group)
        return None if tail is None else tail.get(index)

    def cached_entries(
        self, group: str, lo: int, hi: int, bytes_max: int | None
    ) -> list[Entry] | None:
        """Entries ``[lo, hi)`` with the size rule if the cache has all it needs, else None."""
        tail = self._tail.get(group)
        if not tail:
            return None
        out: list[Entry] = []
        size = 0
        for index in range(lo, hi):
            entry = tail.get(index)
            if entry is None:
                return None
            size += len(entry.data)
            if out and bytes_max is not None and size > bytes_max:
                break
            out.append(entry)
        return out

    def group_state(self, group: str) -> GroupState:
        return self._states.get(group) or GroupState(prefix=b"")

    def groups(self) -> list[str]:
        return sorted(self._states)

    def log(self, group: str) -> _View:
        return _View(self, group)

    @abc.abstractmethod
    def read_entries(self, prefix: bytes, lo: int, hi: int, max_bytes: int | None) -> list[Entry]:
        """Entries [lo, hi) of the group with ``prefix``, verified, with the size rule."""

    @abc.abstractmethod
    def read_snapshot_data(self, prefix: bytes) -> bytes:
        """The snapshot data of the group with ``prefix``, verified."""
