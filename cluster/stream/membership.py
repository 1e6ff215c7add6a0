"""Carrying out a stream group's replica changes: the Raft membership follows the meta state.

The meta group decides WHICH nodes host a stream's group (``StreamAssignment.peers``: set on
create, changed by ``ReassignGroup`` after a peer removal and by ``UpdateStream`` when
``num_replicas`` grows or shrinks). The group's Raft membership is changed only by the
group's own leader, here, one step at a time, each step decided afresh from the applied
state (level-triggered: a leader that crashes mid-way leaves a membership from which the
next leader simply continues):

1. a peer of the assignment that is not a member is added as a LEARNER (it started the
   group empty on its node, ``RaftHost.join_group``, and is caught up by a snapshot);
2. a learner of the assignment that has caught up (``LEARNER_LAG_MAX_ENTRIES``) is
   promoted to voter: a learner catches up before it votes, so adding it never leaves the
   group waiting on a voter with no log;
3. only then, a member the assignment no longer names is removed; when that member is this
   leader, leadership moves first to a caught-up voter of the assignment.

A peer under repair after data loss (``cluster/repair/repair.py``) is first taken OUT of the
membership whatever the assignment says; once it is out, the leader reports that, with its
term, to the meta leader (``RepairCleared``), and only then is it wanted again: added as a
learner (it rejoins empty at that term), caught up, promoted, like any new peer.

One server at a time (Raft thesis §4.1): a step is proposed only when no other change is in
flight (here, and the core refuses a second one as well), so any two consecutive
configurations have overlapping majorities.

Ownership: the node's event loop; ``step`` is called by the node's monitor every tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.meta.repairs import RepairRecord
from raftstream.errors import RaftStreamError
from raftstream.raft.host import RaftHost
from raftstream.raft.types import ConfChange, ConfChangeType, Role

__all__ = ["LEARNER_LAG_MAX_ENTRIES", "MembershipDriver", "Step", "next_change"]

LEARNER_LAG_MAX_ENTRIES = 64  # a learner this close to the commit index has caught up
CHANGE_TIMEOUT_MS = 5_000
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Step:
    """The next action on a group: a conf change, or a leadership transfer to ``to``."""

    change: ConfChange | None = None
    transfer_to: str | None = None


def next_change(
    *,
    me: str,
    wanted: tuple[str, ...],
    voters: tuple[str, ...],
    learners: tuple[str, ...],
    lag: Mapping[str, int],
) -> Step | None:
    """The one next step that moves membership (``voters``, ``learners``) toward ``wanted``
    (see the module docstring), or None when they agree. ``lag`` is each follower's distance
    from the commit index as the leader ``me`` sees it (absent: unknown, not caught up)."""
    members = set(voters) | set(learners)
    for p in wanted:
        if p not in members:
            return Step(ConfChange(ConfChangeType.ADD_LEARNER, p))
    for p in wanted:
        if p in learners:
            if lag.get(p, LEARNER_LAG_MAX_ENTRIES + 1) <= LEARNER_LAG_MAX_ENTRIES:
                return Step(ConfChange(ConfChangeType.ADD_VOTER, p))
            return None  # wait for it to catch up before changing anything else
    for p in sorted(members - set(wanted)):
        if p != me:
            return Step(ConfChange(ConfChangeType.REMOVE, p))
    if me not in wanted:
        caught_up = [v for v in wanted if v in voters and lag.get(v, 1) == 0]
        return Step(transfer_to=caught_up[0]) if caught_up else None
    return None


class MembershipDriver:
    """Runs ``next_change`` for the stream groups this node leads (one change in flight per
    group; the host refuses a second anyway). ``repairs`` gives the repairs under way (meta
    state); ``report_cleared(node, repair_id, group, term)`` tells the meta leader a node
    under repair is out of a group."""

    def __init__(
        self,
        *,
        node_id: str,
        host: RaftHost,
        repairs: Callable[[], Mapping[str, RepairRecord]] = dict,
        report_cleared: Callable[[str, str, str, int], Awaitable[None]] | None = None,
    ) -> None:
        self._me = node_id
        self._host = host
        self._repairs = repairs
        self._report_cleared = report_cleared
        self._inflight: dict[str, asyncio.Task[None]] = {}

    def step(self, sa: StreamAssignment) -> None:
        """Leader of ``sa.group``: start the group's next membership step, if any and if
        none is in flight. A no-op on a follower."""
        group = sa.group
        task = self._inflight.get(group)
        if task is not None and not task.done():
            return
        host = self._host
        if host.leader(group) != self._me or host.role(group)[0] != Role.LEADER:
            return
        voters, learners = host.members(group)
        repairs = self._repairs()
        if (
            not learners
            and set(voters) == set(sa.peers)
            and not any(p in repairs for p in sa.peers)
        ):
            return  # nothing to change (next_change's None), found without the lags
        commit, followers = host.followers(group)
        lag = {f.name: max(0, commit - f.match) for f in followers if f.active}
        # Peers under repair that this group has not let go of yet: out first.
        held = {
            p: repairs[p]
            for p in sa.peers
            if p in repairs and repairs[p].may_rejoin(group) is None and p != self._me
        }
        for p, rec in held.items():
            if p not in voters and p not in learners:
                self._clear(group, p, rec.repair_id)
                return
        step = next_change(
            me=self._me,
            wanted=tuple(p for p in sa.peers if p not in held),
            voters=voters,
            learners=learners,
            lag=lag,
        )
        if step is None:
            return
        if step.transfer_to is not None:
            log.info(
                "leaving the group: leadership to %s", step.transfer_to, extra={"group": group}
            )
            host.transfer_leadership(group, step.transfer_to)
            return
        if step.change is not None:
            self._inflight[group] = asyncio.get_running_loop().create_task(
                self._change(group, step.change), name=f"membership-{group}"
            )

    def _clear(self, group: str, node: str, repair_id: str) -> None:
        """``node`` (under repair) is out of ``group``'s applied membership: report it with
        this leader's term, in which that holds (any later leader has it too)."""
        if self._report_cleared is None:
            return
        term = self._host.status(group).term
        log.info("repair: %s is out of the group at term %d", node, term, extra={"group": group})
        self._inflight[group] = asyncio.get_running_loop().create_task(
            self._report(group, node, repair_id, term), name=f"repair-cleared-{group}"
        )

    async def _report(self, group: str, node: str, repair_id: str, term: int) -> None:
        if self._report_cleared is None:
            return
        try:
            await self._report_cleared(node, repair_id, group, term)
        except RaftStreamError as exc:
            log.info("repair report not made: %r", exc, extra={"group": group})

    async def _change(self, group: str, change: ConfChange) -> None:
        log.info("membership: %s %s", change.type.name, change.node, extra={"group": group})
        try:
            await self._host.propose_conf_change(group, change, timeout_ms=CHANGE_TIMEOUT_MS)
        except RaftStreamError as exc:
            # Level-triggered: the next monitor tick decides again from the applied state.
            log.info("membership change not made: %r", exc, extra={"group": group})

    async def close(self) -> None:
        """Cancel the changes in flight (their outcome is decided by the log)."""
        for t in self._inflight.values():
            t.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        self._inflight.clear()
