"""The values of ``RaftHost``'s public API: its configuration, the state machine it drives,
the status and follower views it answers with, and the leader-change callback.

Re-exported by ``raftstream.raft.host``; import them from there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from raftstream.raft.errors import InvalidArgumentError
from raftstream.raft.types import Entry, Role

__all__ = [
    "FollowerInfo",
    "GroupStatus",
    "HostConfig",
    "LeaderChange",
    "SnapshotJob",
    "StateMachine",
]

LeaderChange = Callable[[str, str | None, Role], None]
"""Called on the host's loop as ``(group, leader or None, this replica's role)`` after the
round in which this replica learned of a new leader or changed role."""


class StateMachine(Protocol):
    """What a group replicates into. Called on the host's event loop, in log order.

    ``apply`` gets the committed commands (NORMAL entries with data; the leader's empty
    no-ops and membership changes are not passed) and returns one result per entry, handed to
    the proposer's awaitable. An exception halts the group (its replica would diverge).
    ``snapshot`` returns the state after everything applied so far; ``restore`` replaces
    the state by a snapshot's (on start, and when the leader sends one).

    Optional: ``compaction_wanted(group) -> bool``. True asks the host to snapshot and compact
    the log now rather than at ``snapshot_entries`` (after a purge emptied most of the state,
    the log's older entries only hold storage, which can be short: docs/limits.md).

    Optional: ``snapshot_job(group) -> SnapshotJob``. When present, compaction uses it
    instead of ``snapshot``: the job is the state as of the call, made in steps between the
    host's other work (a large state would otherwise stall every group of the node).
    """

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]: ...

    def snapshot(self, group: str) -> bytes: ...

    def restore(self, group: str, data: bytes) -> None: ...


class SnapshotJob(Protocol):
    """A snapshot in the making: the state machine's state as of the applied index when the
    job was made. ``step`` does a bounded part of the work (a few milliseconds) and returns
    None while more is left, then the snapshot's bytes; an exception halts the group.
    ``close`` releases what the job holds; the host calls it when it is done or abandoned
    (the group removed or restored from a snapshot meanwhile, the host stopping)."""

    def step(self) -> bytes | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class HostConfig:
    """Timing and limits of a host. Ticks drive every core: heartbeats leave once per tick
    (``heartbeat_tick=1``, so one coalesced heartbeat per peer per tick), and an election
    starts after ``election_tick``..2x ticks without hearing from a leader."""

    tick_ms: int = 100
    election_tick: int = 6
    heartbeat_tick: int = 1
    proposal_timeout_ms: int = 5_000
    proposals_pending_max: int = 100_000  # queued or in the log, not yet applied
    inbox_msgs_max: int = 200_000  # received, not yet stepped
    reads_pending_max: int = 10_000  # read_index calls queued or waiting, not yet resolved
    snapshot_entries: int = 10_000  # compact a group's log every this many applied entries
    # ... but only once those entries hold as many bytes as the last snapshot: a snapshot
    # costs the whole state, so it waits for a log as large (a big stream of small entries
    # was written in full every 10,000 of them). And also once they hold twice the last
    # snapshot plus this many bytes, whatever their count (a group of few, large entries kept
    # 10,000 of them: 90 MB of log for a 5 MB stream). See "Compaction" in host.py.
    snapshot_log_bytes_min: int = 8 * 1024 * 1024
    pre_vote: bool = True
    check_quorum: bool = True
    quiesce: bool = True  # stop ticking idle groups (see the module docstring)
    liveness_ticks: int = 2  # a peer silent for longer than this is presumed down (>= 2)
    # Off: a follower learns a new commit index with its next append or heartbeat (a tick
    # later at the latest) instead of from a message of its own (RaftConfig.commit_notices).
    commit_notices: bool = False
    # A round that sends no append early writes on the loop rather than the writer thread
    # (host.py, "Following rounds write on the loop").
    inline_follower_writes: bool = True
    # A lazy proposal (``propose(lazy=True)``) waits at most this long for an eager one to
    # go with (host.py, "Lazy proposals"); 0: it is an eager one itself.
    lazy_linger_ms: int = 5

    def __post_init__(self) -> None:
        for name in (
            "tick_ms",
            "proposal_timeout_ms",
            "proposals_pending_max",
            "inbox_msgs_max",
            "reads_pending_max",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(name, "must be positive")
        if self.snapshot_entries <= 0:
            raise InvalidArgumentError("snapshot_entries", "must be positive")
        if self.snapshot_log_bytes_min <= 0:
            raise InvalidArgumentError("snapshot_log_bytes_min", "must be positive")
        if not 0 <= self.lazy_linger_ms <= self.tick_ms:
            raise InvalidArgumentError("lazy_linger_ms", "must be 0 to tick_ms")
        if self.liveness_ticks < 2:  # a ping per tick arrives up to a tick apart, plus jitter
            raise InvalidArgumentError("liveness_ticks", "must be at least 2")


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    leader: str
    role: Role
    term: int
    applied: int
    snapshot_index: int
    quiet: bool
    halted: bool = False  # stopped on this node after a failed apply or step (host log)


@dataclass(frozen=True, slots=True)
class FollowerInfo:
    """The leader's view of one follower: its match index, and whether it was heard from
    within the last election timeout."""

    name: str
    match: int
    active: bool
