"""The simulator's storage: the project's one in-memory log (``MemoryGroupLog`` on a
``MemoryLogStorage``, raft/storage/memory.py), with fault injection and a write count.

Everything written here models a completed fsync: a crash keeps exactly this. Each write
(one per Ready, one per compaction) is counted, so tests can see what was fsynced when.
Records are stored encoded with their checksums, as on disk; ``corrupt`` flips bytes of a
stored record without fixing its checksum, as a bad disk would, and every read of it raises
DataLossError, so a corrupted entry is refused, never applied or sent.
"""

from __future__ import annotations

from raftstream.raft.storage.api import GroupWrite
from raftstream.raft.storage.memory import MemoryGroupLog
from raftstream.raft.types import Ready, Snapshot

GROUP = "g"  # one storage per (node, group): the group's name inside it does not matter
CRC_BYTES = 4  # a stored record starts with its checksum (raft/storage/codec.py)


class SimStorage(MemoryGroupLog):
    """One replica's durable log, counting its writes, with a bad disk on demand."""

    __slots__ = ("corrupted", "fsyncs")

    def __init__(self) -> None:
        super().__init__(group=GROUP)
        self.fsyncs = 0
        self.corrupted: set[int] = set()

    def write(self, write: GroupWrite) -> None:
        super().write(write)
        self.fsyncs += 1

    def persist(self, rd: Ready) -> None:
        """One fsync: the durable part of a Ready (raft/storage's order in one transaction)."""
        super().persist(rd)

    def compact(self, snap: Snapshot) -> None:
        """Keep a snapshot taken locally and drop the entries it covers."""
        super().compact(snap)

    def corrupt(self, index: int) -> bool:
        """Flip the bytes of stored entry ``index`` after its checksum (left as it was)."""
        st = self.storage.group_state(GROUP)
        recs = self.storage.disk.entries.get(st.prefix, {})
        raw = recs.get(index)
        if raw is None or index < st.first_index:
            return False
        recs[index] = raw[:CRC_BYTES] + bytes(b ^ 0x5A for b in raw[CRC_BYTES:])
        self.storage.drop_cache(GROUP)  # reads go to the "disk" and meet the bad record
        self.corrupted.add(index)
        return True

    def verify_all(self) -> None:
        """What a restart does: read and check every stored entry (DataLossError)."""
        st = self.storage.group_state(GROUP)
        if st.last_index >= st.first_index:
            self.storage.read_entries(st.prefix, st.first_index, st.last_index + 1, None)
