"""Pure Raft core: no IO, no asyncio, no clock, no global randomness.

The driver builds a ``RaftNode(config, storage_view)`` per group and runs the cycle
described in ``raftstream.raft.core.rawnode``. Storage implements ``LogView`` (read side);
``raftstream.raft.storage.MemoryGroupLog`` is the in-memory one.
"""

from raftstream.raft.core.config import RaftConfig, Rng
from raftstream.raft.core.errors import ConfChangePendingError, TransferInProgressError
from raftstream.raft.core.log import CompactedError, LogView
from raftstream.raft.core.progress import ProgressState
from raftstream.raft.core.raft import TRANSFER_CONTEXT
from raftstream.raft.core.rawnode import PeerStatus, RaftNode, Status

__all__ = [
    "TRANSFER_CONTEXT",
    "CompactedError",
    "ConfChangePendingError",
    "LogView",
    "PeerStatus",
    "ProgressState",
    "RaftConfig",
    "RaftNode",
    "Rng",
    "Status",
    "TransferInProgressError",
]
