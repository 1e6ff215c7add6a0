"""Raft log storage: the LogStorage Protocol, an LMDB implementation and an in-memory twin."""

from raftstream.raft.storage.api import (
    GroupLog,
    GroupWrite,
    LogCompactedError,
    LogStorage,
    LogUnavailableError,
)
from raftstream.raft.storage.lmdb_storage import LmdbLogStorage
from raftstream.raft.storage.memory import MemoryDisk, MemoryGroupLog, MemoryLogStorage

__all__ = [
    "GroupLog",
    "GroupWrite",
    "LmdbLogStorage",
    "LogCompactedError",
    "LogStorage",
    "LogUnavailableError",
    "MemoryDisk",
    "MemoryGroupLog",
    "MemoryLogStorage",
]
