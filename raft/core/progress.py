"""What the leader knows about each follower, and quorum arithmetic over the voters."""

from __future__ import annotations

import enum
from collections import deque

from raftstream.raft.errors import invariant
from raftstream.raft.types import ConfState

__all__ = ["Inflights", "Progress", "ProgressState", "Tracker", "VoteResult"]


class ProgressState(enum.IntEnum):
    # One append at a time until the follower's match index is known.
    PROBE = 0
    # Match known: appends are pipelined, ``next`` moves ahead optimistically.
    REPLICATE = 1
    # The follower needs a snapshot; nothing else is sent until it reports back.
    SNAPSHOT = 2


class Inflights:
    """Appends sent but not acknowledged, bounded by count and payload bytes.

    Entries are ``(last index of the append, payload bytes)`` in sending order; an
    acknowledgement up to index ``i`` frees every append ending at or before ``i``.
    """

    __slots__ = ("_q", "bytes", "bytes_max", "count_max")

    def __init__(self, count_max: int, bytes_max: int) -> None:
        self.count_max = count_max
        self.bytes_max = bytes_max
        self.bytes = 0
        self._q: deque[tuple[int, int]] = deque()

    def add(self, index: int, size: int) -> None:
        self._q.append((index, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        q = self._q
        while q and q[0][0] <= index:
            self.bytes -= q.popleft()[1]

    def free_first(self) -> None:
        if self._q:
            self.bytes -= self._q.popleft()[1]

    def full(self) -> bool:
        return len(self._q) >= self.count_max or self.bytes >= self.bytes_max

    def count(self) -> int:
        return len(self._q)

    def reset(self) -> None:
        self._q.clear()
        self.bytes = 0


class Progress:
    """The leader's view of one peer: ``match`` (known replicated) and ``next`` (to send)."""

    __slots__ = (
        "inflights",
        "is_learner",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "snapshot_checks",
        "state",
    )

    def __init__(self, next_index: int, inflights: Inflights, *, is_learner: bool) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.pending_snapshot = 0
        self.recent_active = False
        self.snapshot_checks = 0
        self.inflights = inflights
        self.is_learner = is_learner

    def become_probe(self) -> None:
        # After a snapshot, resume right after it; otherwise after the known match.
        if self.state == ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self._reset(ProgressState.PROBE)

    def become_replicate(self) -> None:
        self.next = self.match + 1
        self._reset(ProgressState.REPLICATE)

    def become_snapshot(self, index: int) -> None:
        self._reset(ProgressState.SNAPSHOT)
        self.pending_snapshot = index

    def _reset(self, state: ProgressState) -> None:
        self.state = state
        self.probe_sent = False
        self.pending_snapshot = 0
        self.snapshot_checks = 0
        self.inflights.reset()

    def maybe_update(self, index: int) -> bool:
        """An acknowledgement up to ``index``; False if it was stale."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def sent_entries(self, last: int, size: int) -> None:
        """Bookkeeping after sending an append ending at ``last`` (0 entries: last = next-1)."""
        if self.state == ProgressState.REPLICATE:
            if last >= self.next:
                self.next = last + 1
                self.inflights.add(last, size)
        elif self.state == ProgressState.PROBE:
            self.probe_sent = True

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the append whose previous index was ``rejected``; ``match_hint``
        is the follower's best guess of the longest matching prefix. False if stale."""
        if self.state == ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # an old, out-of-order rejection
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # not the probe we are waiting for
        self.next = max(min(rejected, match_hint + 1), self.match + 1, 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.probe_sent
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True


class VoteResult(enum.IntEnum):
    PENDING = 0
    WON = 1
    LOST = 2


class Tracker:
    """Membership (voters, learners), per-peer progress on the leader, and votes.

    Quorum is a strict majority of ``voters``; learners never count.
    """

    __slots__ = (
        "_inflight_bytes_max",
        "_inflight_msgs_max",
        "learners",
        "progress",
        "voters",
        "votes",
    )

    def __init__(self, inflight_msgs_max: int, inflight_bytes_max: int) -> None:
        self.voters: frozenset[str] = frozenset()
        self.learners: frozenset[str] = frozenset()
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self._inflight_msgs_max = inflight_msgs_max
        self._inflight_bytes_max = inflight_bytes_max

    def conf_state(self) -> ConfState:
        return ConfState(tuple(sorted(self.voters)), tuple(sorted(self.learners)))

    def set_conf(self, conf: ConfState, next_index: int) -> None:
        """Switch membership; peers new to the group start probing at ``next_index``."""
        invariant(not set(conf.voters) & set(conf.learners), "voter and learner at once")
        self.voters = frozenset(conf.voters)
        self.learners = frozenset(conf.learners)
        members = self.voters | self.learners
        for peer in list(self.progress):
            if peer not in members:
                del self.progress[peer]
        for peer in sorted(members):  # sorted: message order must not depend on hashing
            pr = self.progress.get(peer)
            if pr is None:
                infl = Inflights(self._inflight_msgs_max, self._inflight_bytes_max)
                pr = self.progress[peer] = Progress(next_index, infl, is_learner=True)
                pr.recent_active = True  # a new peer gets an election timeout to show up
            pr.is_learner = peer in self.learners

    def reset_progress(self, next_index: int, self_id: str, self_last: int) -> None:
        """Fresh leader: every peer probes from our last index + 1."""
        for peer, pr in self.progress.items():
            pr.match = 0
            pr.next = next_index
            pr.pending_snapshot = 0
            pr.recent_active = False
            pr._reset(ProgressState.PROBE)
            if peer == self_id:
                pr.match = self_last
                pr.recent_active = True
                pr.become_replicate()

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def committed_index(self) -> int:
        """The highest index a quorum of voters has durably (0 with no voters)."""
        if not self.voters:
            return 0
        matches = sorted((self.progress[v].match for v in self.voters), reverse=True)
        return matches[self.quorum() - 1]

    def quorum_active(self, self_id: str) -> bool:
        """Whether a quorum of voters (counting us) was heard from since the last check."""
        active = sum(1 for v in self.voters if v == self_id or self.progress[v].recent_active)
        return active >= self.quorum()

    def reset_recent_active(self, self_id: str) -> None:
        for peer, pr in self.progress.items():
            pr.recent_active = peer == self_id

    def record_vote(self, peer: str, granted: bool) -> None:
        self.votes.setdefault(peer, granted)

    def tally(self) -> VoteResult:
        q = self.quorum()
        granted = sum(1 for v in self.voters if self.votes.get(v) is True)
        rejected = sum(1 for v in self.voters if self.votes.get(v) is False)
        if granted >= q:
            return VoteResult.WON
        if rejected > len(self.voters) - q:
            return VoteResult.LOST
        return VoteResult.PENDING
