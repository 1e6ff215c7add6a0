"""The leader's view of a group's followers, for the cluster's info and liveness answers.

A thin face over ``RaftHost``'s public API (``followers``), kept because the services import
it from here; leadership transfer, membership and voters are called on the host directly.
"""

from __future__ import annotations

from raftstream.raft.host import FollowerInfo, RaftHost

__all__ = ["FollowerInfo", "followers"]


def followers(host: RaftHost, group: str) -> tuple[int, list[FollowerInfo]]:
    """(commit index, each follower's progress: match index and recent activity) when this
    node leads ``group``; the list is empty on a follower (only the leader tracks it)."""
    return host.followers(group)
