"""Configuration of one Raft replica, and the seeded randomness it is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from raftstream.raft.errors import InvalidArgumentError

__all__ = ["RaftConfig", "Rng"]


class Rng(Protocol):
    """The only randomness the core uses: ``random.Random(seed)`` satisfies it.

    The core never touches the global RNG, so a simulation seeded once replays exactly.
    """

    def randrange(self, start: int, stop: int) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """One replica of one group. Times are in ticks; the host decides how long a tick is.

    ``voters`` and ``learners`` are the group's bootstrap membership: the same on every
    replica ever created for the group, a node joining later included (it is not in them,
    so it never campaigns; it waits for the leader's log or snapshot). Membership changes
    in the log apply on top of them; a snapshot's membership replaces them.

    Membership changes need ``check_quorum``: its leader lease is what makes the members
    ignore a removed server that keeps campaigning (thesis §4.2.3).

    ``applied`` is the last index the state machine has already applied durably (0 when the
    state machine is rebuilt from the snapshot on every start): committed entries after it,
    and only those, are handed out again after a restart.
    """

    id: str
    group: str
    rng: Rng
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()
    election_tick: int = 10
    heartbeat_tick: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    applied: int = 0
    # Pipelining limits per follower: appends in flight, and their payload bytes.
    inflight_msgs_max: int = 256
    inflight_bytes_max: int = 8 * 1024 * 1024
    # Payload bytes per APPEND (one entry always goes, even a larger one).
    append_bytes_max: int = 1024 * 1024
    # Payload bytes of committed entries handed out per Ready.
    apply_bytes_max: int = 8 * 1024 * 1024
    # Payload bytes appended but not yet committed on the leader: proposals beyond are refused.
    uncommitted_bytes_max: int = 64 * 1024 * 1024
    # Reads waiting for leadership confirmation (or for the first commit of the term).
    pending_reads_max: int = 4096
    # When the commit index moves, tell a follower that has been sent everything at once
    # with an empty append (etcd's behaviour). Off, it learns the commit index with its next
    # append or heartbeat instead (heartbeat_tick later at the latest): one message and one
    # answer fewer per peer and commit. Only how soon followers apply changes; nothing
    # about what commits, or when.
    commit_notices: bool = True

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidArgumentError("id", "must not be empty")
        if self.heartbeat_tick <= 0:
            raise InvalidArgumentError("heartbeat_tick", "must be positive")
        if self.election_tick <= self.heartbeat_tick:
            raise InvalidArgumentError("election_tick", "must exceed heartbeat_tick")
        for name in (
            "inflight_msgs_max",
            "inflight_bytes_max",
            "append_bytes_max",
            "apply_bytes_max",
            "uncommitted_bytes_max",
            "pending_reads_max",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(name, "must be positive")
        if set(self.voters) & set(self.learners):
            raise InvalidArgumentError("learners", "a node is a voter or a learner, not both")
