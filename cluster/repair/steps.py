"""Repair after data loss, the meta leader's side: the next step of a node's repair.

A damaged node's ``RepairClient`` (``cluster/repair/repair.py``) asks, through any peer, for the
next step of its repair until it is done; the meta leader takes it here (``repair_step``,
``RepairSteps``): the node out of the meta group's membership, ``RepairStart``, back in as
a learner and promoted when it should vote, then ``RepairDone`` once every stream group's
leader has reported it out of its group (docs/cluster-design.md, "Repair after data loss").
Every step is decided from the applied state, so a new meta leader goes on where an old one
stopped.
"""

from __future__ import annotations

import logging

from raftstream.cluster.meta.entries import RepairDone, RepairStart
from raftstream.cluster.meta.group import META_GROUP, meta_members
from raftstream.cluster.meta.repairs import RepairRecord
from raftstream.cluster.services.context import ServiceContext
from raftstream.cluster.services.meta_changes import meta_conf_change, meta_learner_caught_up
from raftstream.errors import InvalidArgumentError, PreconditionError
from raftstream.proto import repair_pb2 as rpb
from raftstream.raft.types import ConfChange, ConfChangeType

__all__ = [
    "RepairSteps",
    "repair_step",
]

# The logger's name from before the repair modules were split: log filters name it.
log = logging.getLogger("raftstream.cluster.repair.repair")


async def repair_step(ctx: ServiceContext, node: str, repair_id: str) -> rpb.RepairNodeResponse:
    """Meta leader: take the next step of ``node``'s repair ``repair_id`` and say where it
    stands. Level-triggered: every step is decided from the applied state, so a new meta
    leader continues where an old one stopped.

    1. out of the meta group's membership (a conf change), and only then ``RepairStart`` at
       the current term;
    2. back into the meta group as a learner, promoted to voter once caught up (if the static
       membership makes it a voter; a node added after the cluster formed, ``NodeAdd``, if
       the group has fewer than ``meta_voters_max`` voters);

    A node added after the cluster formed joins the same way (it is in no group yet). Every
    answer names the meta group's founders and the cluster's nodes: the node starts the
    group from the same bootstrap as every other replica (``cluster/services/node_book.py``).
    3. wait until every stream group's leader reported it out of that group
       (``RepairCleared``; the group leaders re-add it through ``cluster/stream/membership.py``);
    4. ``RepairDone``.
    """
    _check_repairable(ctx, node)
    return await RepairSteps(ctx, node, repair_id).next_step()


def _check_repairable(ctx: ServiceContext, node: str) -> None:
    """Refuse a repair of a node that is not of this cluster, of the meta leader itself, or
    of a node ``PeerRemove`` took out (until it is readmitted)."""
    if node not in ctx.nodes:
        raise PreconditionError(
            f"{node!r} is not a node of this cluster: add it first with `raftstream cluster"
            f" peer-add {node} --address HOST:PORT` (where it serves)"
        )
    if node == ctx.node_id:
        raise InvalidArgumentError("node", "the meta leader is not under repair")
    if node in ctx.meta.state.removed_peers:
        raise PreconditionError(
            f"node {node!r} was removed from the cluster (peer-remove): readmit it first with"
            f" `raftstream cluster peer-add {node}`"
        )


class RepairSteps:
    """The next step of ``node``'s repair ``repair_id`` on the meta leader (``repair_step``),
    decided from the applied meta state and the meta group's membership as they are now.
    Made for one call and dropped after it: nothing is kept between steps."""

    def __init__(self, ctx: ServiceContext, node: str, repair_id: str) -> None:
        self._ctx = ctx
        self._node = node
        self._id = repair_id
        self._voters = ctx.host.voters(META_GROUP)
        self._learners = ctx.host.learners(META_GROUP)
        self._founders = ctx.nodes.founders()

    async def next_step(self) -> rpb.RepairNodeResponse:
        node, repair_id = self._node, self._id
        rec = self._ctx.meta.state.repairs.get(node)
        if rec is None or rec.repair_id != repair_id:
            return await self._start()
        term = rec.meta_term
        if rec.done:
            return self._answer(rpb.REPAIR_PHASE_DONE, term)
        if node not in self._voters and node not in self._learners:
            log.info("repair %s: adding %s back to the meta group as a learner", repair_id, node)
            await meta_conf_change(self._ctx, ConfChange(ConfChangeType.ADD_LEARNER, node))
            return self._answer(rpb.REPAIR_PHASE_META_REJOIN, term)
        if node in self._learners and self._voter():
            if meta_learner_caught_up(self._ctx, node):
                log.info("repair %s: %s caught up; promoting it in the meta group", repair_id, node)
                await meta_conf_change(self._ctx, ConfChange(ConfChangeType.ADD_VOTER, node))
            return self._answer(rpb.REPAIR_PHASE_META_REJOIN, term)
        return await self._finish(rec)

    def _answer(self, phase: rpb.RepairPhase.ValueType, term: int = 0) -> rpb.RepairNodeResponse:
        # Every answer tells the node the meta group's founders and the cluster's nodes.
        return rpb.RepairNodeResponse(
            phase=phase,
            meta_term=term,
            meta_founders=self._founders,
            addresses=self._ctx.nodes.addresses(),
        )

    async def _start(self) -> rpb.RepairNodeResponse:
        """Step 1: out of the meta group's membership, and only then ``RepairStart``."""
        node, meta = self._node, self._ctx.meta
        if node in self._voters or node in self._learners:
            log.info("repair %s: removing %s from the meta group", self._id, node)
            await meta_conf_change(self._ctx, ConfChange(ConfChangeType.REMOVE, node))
            return self._answer(rpb.REPAIR_PHASE_REMOVING)
        term = self._ctx.host.status(META_GROUP).term
        await meta.propose(
            RepairStart(
                node=node, repair_id=self._id, meta_term=term, ts_ns=self._ctx.clock.time_ns()
            ),
            None,
        )
        return self._answer(rpb.REPAIR_PHASE_META_REJOIN, term)

    def _voter(self) -> bool:
        """Whether the node is to be a voter of the meta group, not a learner."""
        static_voters, _ = meta_members(self._founders, self._ctx.config.meta_voters_max)
        # A founder is a voter if the founding membership made it one; a node added later if
        # the meta group has fewer voters than meta_voters_max.
        return self._node in static_voters or (
            self._node not in self._founders
            and len(self._voters) < self._ctx.config.meta_voters_max
        )

    async def _finish(self, rec: RepairRecord) -> rpb.RepairNodeResponse:
        """Steps 3 and 4: wait for every stream group's leader, then ``RepairDone``."""
        node, repair_id, meta = self._node, self._id, self._ctx.meta
        waiting = [
            sa.group
            for sa in meta.state.streams_for_node(node)
            if rec.may_rejoin(sa.group) is None and len(sa.peers) > 1
        ]
        if waiting:
            return self._answer(rpb.REPAIR_PHASE_GROUPS, rec.meta_term)
        await meta.propose(
            RepairDone(node=node, repair_id=repair_id, ts_ns=self._ctx.clock.time_ns()), None
        )
        log.info("repair %s of %s done", repair_id, node)
        return self._answer(rpb.REPAIR_PHASE_DONE, rec.meta_term)
