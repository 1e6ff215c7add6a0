"""What the node needs from ``RaftHost`` that it does not offer yet: ONE place for it.

``RaftHost`` (``raft/host.py``) has no public API for leadership transfer or for the
leader's view of its followers (match index, recent activity). The core (``RaftNode``) has
both (``transfer_leadership``, ``status().progress``). Until the host grows small public
methods for them (asked for in the cluster report), these helpers reach the group's core
through the host's private ``_group`` accessor, on the host's loop, between rounds (the
only code that touches a core while no round runs, as the host's contract requires), and
wake the driver so the core's new Ready is processed.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftstream.errors import InvalidArgumentError, NotLeaderError
from raftstream.raft.host import RaftHost
from raftstream.raft.types import Role

__all__ = ["FollowerInfo", "followers", "transfer_leadership", "voters"]


@dataclass(frozen=True, slots=True)
class FollowerInfo:
    name: str
    match: int
    active: bool


def transfer_leadership(host: RaftHost, group: str, to: str) -> None:
    """Ask this node's leader replica of ``group`` to hand leadership to voter ``to``.
    NotLeaderError when this node does not lead; InvalidArgumentError for a non-voter."""
    g = host._group(group)
    node = g.node
    if node.role != Role.LEADER:
        raise NotLeaderError(f"not the leader of {group}", leader=node.leader or None)
    if to not in node.status().conf.voters:
        raise InvalidArgumentError("preferred", f"{to!r} is not a voter of {group}")
    node.transfer_leadership(to)
    host._dirty.add(group)
    host._wake.set()


def voters(host: RaftHost, group: str) -> tuple[str, ...]:
    """The group's current voters, as this replica knows them."""
    return tuple(host._group(group).node.status().conf.voters)


def followers(host: RaftHost, group: str) -> tuple[int, list[FollowerInfo]]:
    """(commit index, the followers' progress) when this node leads ``group``; the list is
    empty on a follower (only the leader tracks progress)."""
    st = host._group(group).node.status()
    out = [
        FollowerInfo(p, pr.match, pr.recent_active)
        for p, pr in sorted(st.progress.items())
        if p != st.id
    ]
    return st.commit, out
