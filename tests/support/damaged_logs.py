"""Raft log environments (LMDB) to damage: one written with known payloads, and a bit
flipped inside one entry's record, as a disk's silent corruption would (the scrub and the
repair after data loss, docs/cluster-design.md "Repair after data loss")."""

from __future__ import annotations

from pathlib import Path

from raftstream.raft.storage import LmdbLogStorage
from raftstream.raft.storage.api import GroupWrite
from raftstream.raft.types import Entry, HardState

__all__ = ["PAYLOAD", "flip_in_record", "make_env"]

PAYLOAD = b"payload-%04d-" + b"x" * 200


def make_env(path: Path, entries: int = 40) -> None:
    storage = LmdbLogStorage(path, map_size_bytes=1 << 26)
    try:
        batch = tuple(Entry(i, 1, data=PAYLOAD % i) for i in range(1, entries + 1))
        storage.write_batch([GroupWrite("g", HardState(term=1, commit=entries), entries=batch)])
    finally:
        storage.close()


def flip_in_record(path: Path, index: int) -> None:
    """Flip one bit inside entry ``index``'s payload (found by its text), not a free page."""
    data_file = path / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(PAYLOAD % index)
    assert at > 0
    raw[at + 20] ^= 0x04
    data_file.write_bytes(bytes(raw))
