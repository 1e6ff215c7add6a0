"""The in-memory twin of the LMDB log storage, for tests and the simulators: the project's
one in-memory Raft log.

Records are kept encoded, with the same checksums as on disk, so corruption is detected the
same way. A ``MemoryDisk`` outlives the storage objects opened on it: reopening one on the
same disk models a restart that kept exactly what was written (every write is "durable").

``MemoryGroupLog`` is one group's log on it, with a write per kind of change: the
``LogView`` the pure core reads through where no host runs (the core's tests and the
core-only simulator, tests/sim); the host and the whole-node simulator use the storage
itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from raftstream.raft.storage import codec
from raftstream.raft.storage.api import GroupWrite, LogStorage
from raftstream.raft.storage.base import (
    GroupState,
    LogStorageBase,
    WritePlan,
    check_unique_groups,
    plan_write,
    take_entries,
)
from raftstream.raft.types import Entry, HardState, Ready, Snapshot, SnapshotMeta

__all__ = ["MemoryDisk", "MemoryGroupLog", "MemoryLogStorage"]


@dataclass
class MemoryDisk:
    """The "disk" of a MemoryLogStorage: encoded records by key, as LMDB would hold them."""

    registry: dict[str, bytes] = field(default_factory=dict)  # group -> prefix
    entries: dict[bytes, dict[int, bytes]] = field(default_factory=dict)  # prefix -> idx -> rec
    hard_states: dict[bytes, bytes] = field(default_factory=dict)
    snap_metas: dict[bytes, bytes] = field(default_factory=dict)
    snap_data: dict[bytes, bytes] = field(default_factory=dict)
    next_prefix_id: int = 1


class MemoryLogStorage(LogStorageBase):
    """LogStorage on a MemoryDisk. Same threading contract as the LMDB storage."""

    def __init__(
        self, disk: MemoryDisk | None = None, *, tail_cache_entries_max: int = 1024
    ) -> None:
        super().__init__(tail_cache_entries_max=tail_cache_entries_max)
        self.disk = disk if disk is not None else MemoryDisk()
        for group, prefix in self.disk.registry.items():
            self._states[group] = self._load(prefix)

    def _load(self, prefix: bytes) -> GroupState:
        hs_raw = self.disk.hard_states.get(prefix)
        hs = codec.decode_hard_state(hs_raw) if hs_raw is not None else HardState()
        meta_raw = self.disk.snap_metas.get(prefix)
        meta = codec.decode_snapshot_meta(meta_raw)[0] if meta_raw is not None else SnapshotMeta()
        recs = self.disk.entries.get(prefix, {})
        if recs:
            last = max(recs)
            entry = codec.decode_entry(codec.entry_key(prefix, last), recs[last])
            return GroupState(prefix, last, entry.term, hs, meta)
        return GroupState(prefix, meta.index, meta.term, hs, meta)

    def _record(self, prefix: bytes, index: int) -> Entry | None:
        raw = self.disk.entries.get(prefix, {}).get(index)
        return None if raw is None else codec.decode_entry(codec.entry_key(prefix, index), raw)

    def read_entries(self, prefix: bytes, lo: int, hi: int, max_bytes: int | None) -> list[Entry]:
        return take_entries(lo, hi, max_bytes, lambda i: self._record(prefix, i))

    def read_snapshot_data(self, prefix: bytes) -> bytes:
        meta_raw = self.disk.snap_metas.get(prefix)
        if meta_raw is None:
            return b""
        _, data_crc = codec.decode_snapshot_meta(meta_raw)
        return codec.verify_snapshot_data(self.disk.snap_data.get(prefix, b""), data_crc)

    def _term_at(self, prefix: bytes, index: int) -> int:
        entry = self._record(prefix, index)
        return -1 if entry is None else entry.term

    def _state_for_write(self, group: str) -> GroupState:
        state = self._states.get(group)
        if state is not None:
            return state
        prefix = codec.group_prefix(self.disk.next_prefix_id)
        self.disk.next_prefix_id += 1
        return GroupState(prefix=prefix)

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        check_unique_groups(writes)
        plans: list[tuple[str, WritePlan]] = []
        for w in writes:  # plan everything first: a bad write leaves the disk untouched
            state = self._state_for_write(w.group)
            term_at = functools.partial(self._term_at, state.prefix)
            plans.append((w.group, plan_write(state, w, term_at)))
        for group, plan in plans:
            self._apply(group, plan)
            self._states[group] = plan.state
            self.cache_written(group, plan)

    def _apply(self, group: str, plan: WritePlan) -> None:
        prefix = plan.state.prefix
        self.disk.registry[group] = prefix
        recs = self.disk.entries.setdefault(prefix, {})
        for index in list(recs):
            if (plan.compact_through is not None and index <= plan.compact_through) or (
                plan.truncate_from is not None and index >= plan.truncate_from
            ):
                del recs[index]
        for e in plan.entries:
            recs[e.index] = codec.encode_entry(codec.entry_key(prefix, e.index), e)
        if plan.hard_state is not None:
            self.disk.hard_states[prefix] = codec.encode_hard_state(plan.hard_state)
        if plan.snapshot is not None:
            snap = plan.snapshot
            self.disk.snap_metas[prefix] = codec.encode_snapshot_meta(snap.meta, snap.data)
            self.disk.snap_data[prefix] = snap.data

    def remove_group(self, group: str) -> None:
        prefix = self.disk.registry.pop(group, None)
        self._states.pop(group, None)
        self.drop_cache(group)
        if prefix is None:
            return
        for table in (self.disk.entries, self.disk.hard_states, self.disk.snap_metas):
            table.pop(prefix, None)
        self.disk.snap_data.pop(prefix, None)

    def close(self) -> None:
        """Nothing to release; the disk stays for a later reopen."""


class MemoryGroupLog:
    """One group's stable log on a ``MemoryLogStorage`` (a new one by default): the core's
    ``LogView`` and its write side. Every write is one ``write_batch`` of that group, so
    it is checked as the host's writes are (``plan_write``) and a crash keeps it whole."""

    __slots__ = ("group", "storage")

    def __init__(self, storage: MemoryLogStorage | None = None, group: str = "g") -> None:
        self.storage = storage if storage is not None else MemoryLogStorage()
        self.group = group

    # -- read side (the core's LogView) --
    def hard_state(self) -> HardState:
        return self.storage.log(self.group).hard_state()

    def snapshot(self) -> Snapshot:
        return self.storage.log(self.group).snapshot()

    def first_index(self) -> int:
        return self.storage.log(self.group).first_index()

    def last_index(self) -> int:
        return self.storage.log(self.group).last_index()

    def term(self, index: int) -> int:
        return self.storage.log(self.group).term(index)

    def entries(self, lo: int, hi: int, bytes_max: int | None) -> list[Entry]:
        return self.storage.log(self.group).entries(lo, hi, bytes_max)

    # -- write side --
    def write(self, write: GroupWrite) -> None:
        self.storage.write_batch([write])

    def set_hard_state(self, hs: HardState) -> None:
        self.write(GroupWrite(self.group, hard_state=hs))

    def append(self, entries: Sequence[Entry]) -> None:
        """Append, truncating a conflicting suffix first (the leader's log wins, Raft §5.3);
        entries a snapshot already covers are skipped."""
        self.write(GroupWrite(self.group, entries=tuple(entries)))

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Install a snapshot received from the leader (the whole log is replaced); one not
        newer than the stored snapshot changes nothing."""
        if snap.meta.index > self.storage.log(self.group).snapshot_meta().index:
            self.write(GroupWrite(self.group, snapshot=snap))

    def compact(self, snap: Snapshot) -> None:
        """Keep ``snap`` (taken locally at an applied index) and drop the entries it covers;
        one not newer than the stored snapshot changes nothing."""
        if snap.meta.index > self.storage.log(self.group).snapshot_meta().index:
            self.write(GroupWrite(self.group, compaction=snap))

    def persist(self, rd: Ready) -> None:
        """The durable part of a ``Ready`` in one write, as the host writes it: a newer
        snapshot, then the entries, then the hard state."""
        snap = rd.snapshot
        stored = self.storage.log(self.group).snapshot_meta().index
        if snap is not None and snap.meta.index <= stored:
            snap = None
        entries = tuple(rd.entries)
        self.write(GroupWrite(self.group, hard_state=rd.hard_state, entries=entries, snapshot=snap))


def _conforms(storage: MemoryLogStorage) -> LogStorage:
    """Static check (mypy) that MemoryLogStorage implements the LogStorage Protocol."""
    return storage
