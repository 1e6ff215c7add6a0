"""The in-memory twin of the LMDB log storage, for tests and the simulator.

Records are kept encoded, with the same checksums as on disk, so corruption is detected the
same way. A ``MemoryDisk`` outlives the storage objects opened on it: reopening one on the
same disk models a restart that kept exactly what was written (every write is "durable").
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
from raftstream.raft.types import Entry, HardState, SnapshotMeta

__all__ = ["MemoryDisk", "MemoryLogStorage"]


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


def _conforms(storage: MemoryLogStorage) -> LogStorage:
    """Static check (mypy) that MemoryLogStorage implements the LogStorage Protocol."""
    return storage
