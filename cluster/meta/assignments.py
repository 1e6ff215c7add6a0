"""The values the meta group replicates: a stream's and a consumer's assignment.

Frozen and shared: ``MetaState`` hands the same objects to every caller, and callers may keep
them (a later apply replaces an assignment, never mutates it).
"""

from __future__ import annotations

from dataclasses import dataclass

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import invariant

__all__ = ["ConsumerAssignment", "StreamAssignment"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamAssignment:
    """A stream as the meta group knows it. ``config`` is validated (normalised);
    ``peers`` is the preferred-leader order (first: the preferred leader); ``group`` is the
    Raft group id ``S:<account>:<stream>``; ``created_ns`` the leader-stamped creation time."""

    account: str
    config: StreamConfig
    peers: tuple[str, ...]
    group: str
    created_ns: int

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def quorum(self) -> int:
        """How many of ``peers`` elect a leader and commit: a majority."""
        return len(self.peers) // 2 + 1

    @property
    def under_replicated(self) -> bool:
        """True while the group has fewer peers than ``num_replicas`` (awaiting repair)."""
        return len(self.peers) < self.config.num_replicas


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerAssignment:
    """A consumer as the meta group knows it; it runs inside its stream's group."""

    account: str
    stream: str
    config: ConsumerConfig
    created_ns: int

    @property
    def name(self) -> str:
        name = self.config.consumer_name
        invariant(name is not None, "an assigned consumer always has a name")
        return name or ""
