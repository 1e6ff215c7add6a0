"""The simulator's storage twin: a durable log per (node, group) with a checksum per entry.

Everything written here models a completed fsync: a crash keeps exactly this. Each write
(one per Ready) is counted, so tests can see what was fsynced when. ``corrupt`` flips bytes
of a stored entry without fixing its checksum, as a bad disk would; every read verifies the
checksum and raises DataLossError, so a corrupted entry is refused, never applied or sent.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from raftstream.raft.core import CompactedError
from raftstream.raft.core.log import limit_size
from raftstream.raft.errors import DataLossError
from raftstream.raft.types import Entry, HardState, Ready, Snapshot


def checksum(e: Entry) -> int:
    return zlib.crc32(e.data, zlib.crc32(f"{e.index}/{e.term}/{int(e.type)}".encode()))


class SimStorage:
    """LogView + write side. ``_ents[0]`` is a dummy with the snapshot's index and term."""

    def __init__(self) -> None:
        self._hard = HardState()
        self._snap = Snapshot()
        self._ents: list[Entry] = [Entry(0, 0)]
        self._sums: list[int] = [0]
        self.fsyncs = 0
        self.corrupted: set[int] = set()

    # ---------------------------------------------------------------- LogView
    def hard_state(self) -> HardState:
        return self._hard

    def snapshot(self) -> Snapshot:
        return self._snap

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def _checked(self, pos: int) -> Entry:
        e = self._ents[pos]
        if pos and checksum(e) != self._sums[pos]:
            raise DataLossError(f"entry {e.index} failed its checksum", index=e.index)
        return e

    def term(self, index: int) -> int:
        offset = self._ents[0].index
        if index < offset:
            raise CompactedError(f"index {index} compacted")
        if index - offset >= len(self._ents):
            return 0
        return self._checked(index - offset).term

    def entries(self, lo: int, hi: int, bytes_max: int) -> Sequence[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(f"index {lo} compacted")
        out = [self._checked(p) for p in range(lo - offset, hi - offset)]
        return limit_size(out, bytes_max)

    # ---------------------------------------------------------------- writes
    def persist(self, rd: Ready) -> None:
        """One fsync: the durable part of a Ready, snapshot first, then entries, then the
        hard state (the order raft/storage uses within its one transaction)."""
        if rd.snapshot is not None and rd.snapshot.meta.index > self._snap.meta.index:
            self._snap = rd.snapshot
            self._ents = [Entry(rd.snapshot.meta.index, rd.snapshot.meta.term)]
            self._sums = [0]
        self._append(rd.entries)
        if rd.hard_state is not None:
            self._hard = rd.hard_state
        self.fsyncs += 1

    def _append(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        first = self.first_index()
        entries = [e for e in entries if e.index >= first]
        if not entries:
            return
        pos = entries[0].index - self._ents[0].index
        assert pos <= len(self._ents), "gap in the log"
        del self._ents[pos:]
        del self._sums[pos:]
        self._ents.extend(entries)
        self._sums.extend(checksum(e) for e in entries)

    def compact(self, snap: Snapshot) -> None:
        """Keep a snapshot taken locally and drop the entries it covers."""
        index = snap.meta.index
        offset = self._ents[0].index
        if index <= offset:
            return
        pos = index - offset
        self._snap = snap
        self._ents = [Entry(index, snap.meta.term), *self._ents[pos + 1 :]]
        self._sums = [0, *self._sums[pos + 1 :]]
        self.fsyncs += 1

    def corrupt(self, index: int) -> bool:
        """Flip the payload of stored entry ``index`` (checksum untouched)."""
        pos = index - self._ents[0].index
        if pos <= 0 or pos >= len(self._ents):
            return False
        e = self._ents[pos]
        data = bytes(b ^ 0x5A for b in e.data) if e.data else b"\xff"
        self._ents[pos] = Entry(e.index, e.term, e.type, data)
        self.corrupted.add(index)
        return True

    def verify_all(self) -> None:
        """What a restart does: check every stored entry (DataLossError on corruption)."""
        for pos in range(1, len(self._ents)):
            self._checked(pos)
