"""Membership changes of the meta group, made by its leader: one change at a time, and
whether a learner caught up enough to become a voter. Used by peer removal and readmission
(``ClusterService``) and by the repair of a node after data loss (the repair steps).
"""

from __future__ import annotations

from raftstream.cluster.meta.group import META_GROUP
from raftstream.cluster.services.context import ServiceContext
from raftstream.cluster.stream.membership import LEARNER_LAG_MAX_ENTRIES
from raftstream.raft.types import ConfChange

__all__ = ["CHANGE_TIMEOUT_MS", "meta_conf_change", "meta_learner_caught_up"]

CHANGE_TIMEOUT_MS = 5_000


async def meta_conf_change(ctx: ServiceContext, change: ConfChange) -> None:
    """Meta leader: one membership change of the meta group, resolved once in effect."""
    await ctx.host.propose_conf_change(META_GROUP, change, timeout_ms=CHANGE_TIMEOUT_MS)


def meta_learner_caught_up(ctx: ServiceContext, node: str) -> bool:
    """Meta leader: whether ``node``, a learner of the meta group, is active and within
    ``LEARNER_LAG_MAX_ENTRIES`` of the commit index (ready to be promoted)."""
    commit, followers = ctx.host.followers(META_GROUP)
    return any(
        f.name == node and f.active and commit - f.match <= LEARNER_LAG_MAX_ENTRIES
        for f in followers
    )
