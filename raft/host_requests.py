"""The Raft host's waiting requests: proposals and linearizable reads, their queues, limits
and deadlines, and how each one ends (raft/host.py is the host; this is one of its parts).

Callers queue a proposal or a read on the loop (``propose``, ``read``); the driver hands
the queue to the groups' cores at the start of a round (``take_proposals``,
``take_reads``): only the driver touches cores. A proposal then waits in its group's
``waiting`` until its entry is applied (raft/host_round.py resolves it); a read waits for
its ReadState, then for this replica to apply its index (``follow_reads``). Every request
has a deadline (``expire``), counts against a bound (``proposals_pending_max``,
``reads_pending_max``), and fails with its group (``fail_group``) or the host
(``fail_all``). Futures fail through ``HostShared.reject`` (the host's ``map_error``).
Everything here belongs to the host's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
from dataclasses import dataclass
from typing import Any

from raftstream.raft.clock import Timer
from raftstream.raft.errors import (
    DeadlineExceededError,
    LimitError,
    NotLeaderError,
    RaftError,
)
from raftstream.raft.host_groups import GroupState, HostShared, not_running
from raftstream.raft.types import ConfChange, Ready

__all__ = ["Requests"]


@dataclass(slots=True)
class _Proposal:
    group: str
    data: bytes
    future: asyncio.Future[Any]
    change: ConfChange | None = None  # a membership change instead of a command


@dataclass(frozen=True, slots=True)
class _Read:
    group: str
    context: bytes  # unique on this node: the core matches its ReadState by it
    future: asyncio.Future[int]


class Requests:
    """Proposals and reads waiting to be taken, committed, confirmed or applied."""

    def __init__(self, shared: HostShared) -> None:
        self._s = shared
        self._proposals: collections.deque[_Proposal] = collections.deque()
        # Whether a queued proposal asks for a round now, and when the oldest lazy one
        # queued since the last round does ("Lazy proposals" in raft/host.py).
        self.eager = False
        self._lazy_due: float | None = None
        self._lazy_timer: Timer | None = None
        self._pending = 0  # proposals queued or waiting, against proposals_pending_max
        self._deadlines: list[tuple[float, int, asyncio.Future[Any]]] = []
        self._reads: collections.deque[_Read] = collections.deque()
        self.reads_pending = 0  # reads queued or waiting, against reads_pending_max

    # -- queueing (callers, on the loop) ---------------------------------------------------
    def propose(
        self, group: str, data: bytes, *, timeout_ms: int | None, lazy: bool
    ) -> asyncio.Future[Any]:
        """Queue a command for ``group`` (known to run here); see ``RaftHost.propose``."""
        cfg = self._s.config
        if self._pending >= cfg.proposals_pending_max:
            raise LimitError("too many raft proposals pending", limit="proposals_pending_max")
        fut = self._queue(group, data, None, timeout_ms)
        if lazy and cfg.lazy_linger_ms:
            if self._lazy_due is None:
                clock = self._s.clock
                self._lazy_due = clock.now() + cfg.lazy_linger_ms / 1000
                self._lazy_timer = clock.call_at(self._lazy_due, self._s.wake.set)
        else:
            self.eager = True
            self._s.wake.set()
        return fut

    def propose_conf_change(
        self, group: str, change: ConfChange, *, timeout_ms: int | None
    ) -> asyncio.Future[Any]:
        """Queue a membership change (counted in ``proposals_pending_max``, never refused
        by it); see ``RaftHost.propose_conf_change``."""
        fut = self._queue(group, b"", change, timeout_ms)
        self.eager = True
        self._s.wake.set()
        return fut

    def _queue(
        self, group: str, data: bytes, change: ConfChange | None, timeout_ms: int | None
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending += 1
        fut.add_done_callback(self._proposal_done)
        self._add_deadline(fut, timeout_ms)
        self._proposals.append(_Proposal(group, data, fut, change))
        return fut

    def _proposal_done(self, _: asyncio.Future[Any]) -> None:
        self._pending -= 1

    def _add_deadline(self, fut: asyncio.Future[Any], timeout_ms: int | None) -> None:
        timeout = self._s.config.proposal_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._s.clock.now() + timeout / 1000
        heapq.heappush(self._deadlines, (deadline, next(self._s.seq), fut))

    def read(self, group: str, *, timeout_ms: int | None) -> asyncio.Future[int]:
        """Queue a read point of ``group`` (known to run here); see ``RaftHost.read_index``."""
        if self.reads_pending >= self._s.config.reads_pending_max:
            raise LimitError("too many raft reads pending", limit="reads_pending_max")
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.reads_pending += 1
        self._add_deadline(fut, timeout_ms)
        context = f"{self._s.node_id}/{next(self._s.seq)}".encode()
        self._reads.append(_Read(group, context, fut))
        self._s.wake.set()
        return fut

    # -- the driver's side -----------------------------------------------------------------
    def has_reads(self) -> bool:
        return bool(self._reads)

    def lazy_is_due(self, now: float) -> bool:
        return self._lazy_due is not None and now >= self._lazy_due

    def lazy_due(self) -> float | None:
        """When the oldest lazy proposal queued since the last round wants a round."""
        return self._lazy_due

    def cancel_lazy_timer(self) -> None:
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None

    def take_proposals(self) -> None:
        """Hand every queued proposal to its group's core, in the order they were made."""
        s = self._s
        self.eager = False
        self._lazy_due = None
        self.cancel_lazy_timer()
        while self._proposals:
            p = self._proposals.popleft()
            if p.future.done():
                continue
            g = s.groups.get(p.group)
            if g is None or g.halted:
                s.reject(p.future, not_running(s.node_id, p.group, g))
                continue
            try:
                if p.change is not None:
                    index = g.node.propose_conf_change(p.change)
                else:
                    index = g.node.propose(p.data)
            except RaftError as exc:
                s.reject(p.future, exc)
                continue
            g.waiting[index] = (g.node.term, p.future)
            g.quiet = False
            s.dirty[p.group] = None

    def take_reads(self) -> None:
        """Hand queued reads to their groups' cores (only the driver touches cores)."""
        s = self._s
        while self._reads:
            r = self._reads.popleft()
            g = s.groups.get(r.group)
            if r.future.done() or g is None or g.halted:
                self.reads_pending -= 1
                if not r.future.done():
                    s.reject(r.future, not_running(s.node_id, r.group, g))
                continue
            try:
                g.node.read_index(r.context)
            except RaftError as exc:  # NoLeaderError, LimitError (core's pending reads)
                self.reads_pending -= 1
                s.reject(r.future, exc)
                continue
            g.reads[r.context] = ((g.node.term, g.node.leader), r.future)
            # Forget the read at once when it times out, so a lost one never lingers.
            r.future.add_done_callback(functools.partial(self._read_done, g, r.context))
            g.quiet = False  # the confirmation needs a heartbeat round (and ticks)
            s.dirty[r.group] = None

    def _read_done(self, g: GroupState, context: bytes, _: asyncio.Future[int]) -> None:
        if g.reads.pop(context, None) is not None:
            self.reads_pending -= 1

    def follow_reads(self, g: GroupState, rd: Ready) -> None:
        """After ``rd`` was applied: confirmed reads wait for their index to be applied;
        reads asked under another term or leader fail (the core dropped them when it stepped
        down or changed term, e.g. check-quorum deposing it within its term, so their
        ReadState will never come); reads now applied resolve."""
        for rs in rd.read_states:
            waiter = g.reads.pop(rs.context, None)
            if waiter is None:
                continue  # timed out meanwhile, or not ours
            heapq.heappush(g.read_waits, (rs.index, next(self._s.seq), waiter[1]))
        now = (g.node.term, g.node.leader)
        stale = [ctx for ctx, (asked, _) in g.reads.items() if asked != now]
        if stale:
            leader = g.node.leader or None
            for ctx in stale:
                _, fut = g.reads.pop(ctx)
                self.reads_pending -= 1
                self._s.reject(fut, NotLeaderError("raft read not confirmed", leader=leader))
        self._release_reads(g)

    def _release_reads(self, g: GroupState) -> None:
        while g.read_waits and g.read_waits[0][0] <= g.applied:
            index, _, fut = heapq.heappop(g.read_waits)
            self.reads_pending -= 1
            if not fut.done():
                fut.set_result(index)

    def expire(self, now: float) -> None:
        """Fail every request whose deadline passed (a proposal's outcome is unknown)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, fut = heapq.heappop(self._deadlines)
            if not fut.done():
                self._s.reject(
                    fut, DeadlineExceededError("raft request timed out; a proposal may commit")
                )

    # -- failures --------------------------------------------------------------------------
    def fail_waiting_through(self, g: GroupState, index: int, exc: RaftError) -> None:
        """Fail ``g``'s proposals at or below ``index`` (a snapshot replaced the log)."""
        for i in [i for i in g.waiting if i <= index]:
            _, fut = g.waiting.pop(i)
            if not fut.done():
                self._s.reject(fut, exc)

    def fail_group(self, g: GroupState, exc: RaftError) -> None:
        """Fail everything waiting on ``g`` (halted or removed)."""
        for _, fut in g.waiting.values():
            if not fut.done():
                self._s.reject(fut, exc)
        g.waiting.clear()
        self._fail_reads(g, exc)

    def _fail_reads(self, g: GroupState, exc: RaftError) -> None:
        """Fail every read of ``g`` (halted or removed): none will be confirmed or applied."""
        reads = [fut for _, fut in g.reads.values()]
        reads += [fut for _, _, fut in g.read_waits]
        self.reads_pending -= len(g.reads) + len(g.read_waits)
        g.reads.clear()
        g.read_waits.clear()
        for fut in reads:
            if not fut.done():
                self._s.reject(fut, exc)

    def fail_all(self, exc: RaftError) -> None:
        """Fail every request: of every group, and those still queued."""
        for g in self._s.groups.values():
            self.fail_group(g, exc)
        while self._proposals:
            p = self._proposals.popleft()
            if not p.future.done():
                self._s.reject(p.future, exc)
        while self._reads:
            r = self._reads.popleft()
            self.reads_pending -= 1
            if not r.future.done():
                self._s.reject(r.future, exc)
