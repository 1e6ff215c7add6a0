"""A ``StreamGroup``'s consumer decisions (``cluster/stream/group.py``, "Consumer
decisions"): the leader copies of the consumers, the decisions run on them and the ops they
record proposed (``run``), the meta group's definitions sequenced into the log
(``reconcile``), the Consume calls attached (push wakers) and each consumer's last activity.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.entries import (
    ConsumerDelete,
    ConsumerPut,
    StreamBatch,
    encode,
    ops_entry,
)
from raftstream.cluster.stream.leadership import Leadership
from raftstream.cluster.stream.replica import drain_events
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import PullEvent
from raftstream.engine.consumer_push import PushStep
from raftstream.engine.entries import UpdateConfig
from raftstream.errors import NotFoundError, RaftStreamError, UnavailableError

__all__ = ["ConsumerDecisions"]

_CONFIG_KEY = "\x00config"  # ``reconcile``'s key for the stream's config in ``_sequencing``


class ConsumerDecisions:
    """The leader copies and what is decided on them. ``deliver`` takes the events of a
    decision (a pull's deliveries and statuses) to the pulls waiting for them."""

    def __init__(
        self,
        core: GroupCore,
        leadership: Leadership,
        *,
        deliver: Callable[[list[PullEvent]], None],
    ) -> None:
        self._core = core
        self._lead = leadership
        self._deliver = deliver
        self._leaders: dict[str, Consumer] = {}
        self._sequencing: set[str] = set()
        # One per attached Consume call, set on every apply. Which call sends what a step
        # takes is the calls' own business (a queue group deals it: services_push.py).
        self._push_wakers: set[asyncio.Event] = set()
        self._attached: dict[str, int] = {}  # consumer -> attached Consume calls
        self.active_ns: dict[str, int] = {}  # consumer -> last request, ack or push step

    @property
    def copies(self) -> Mapping[str, Consumer]:
        """The leader copies by name (deleted ones included until the next sync)."""
        return self._leaders

    # -- the leader copies ---------------------------------------------------------------------

    def build(self) -> None:
        """Make the leader copies from the replica (this leader's barrier applied)."""
        replica = self._core.replica
        self._leaders = {n: replica.leader_copy(n) for n in replica.consumers}
        # Inactivity counts from when this leader took over (its copies' clocks start now).
        self.active_ns = dict.fromkeys(self._leaders, self._core.now_ns())

    def drop(self) -> None:
        """Drop the leader copies: their waiting pulls end (409 Leadership Change)."""
        self._deliver(drain_events(list(self._leaders.values())))
        self._leaders.clear()
        self._sequencing.clear()

    def applied(self) -> None:
        """Entries applied: wake the attached Consume calls and follow consumer puts and
        deletes (level-triggered) while the copies are valid."""
        for w in self._push_wakers:
            w.set()
        if not self._lead.lead_term:
            return
        replicas = self._core.replica.consumers
        for name in [n for n in self._leaders if n not in replicas]:
            self._deliver(self._leaders.pop(name).delete())
        for name, c in replicas.items():
            lc = self._leaders.get(name)
            if lc is None:
                self._leaders[name] = self._core.replica.leader_copy(name)
            elif lc.config != c.config:
                lc.update_config(c.config)

    def led_consumers(self) -> list[Consumer]:
        """The leader copies of the consumers, while this node leads (else none)."""
        if not self._lead.ready:
            return []
        return [c for c in self._leaders.values() if not c.deleted]

    def leader_consumer(self, name: str) -> Consumer:
        """The leader copy of consumer ``name`` (NotLeader/NotFound otherwise)."""
        self._lead.require_leader()
        c = self._leaders.get(name)
        if c is None or c.deleted:
            raise NotFoundError(
                f"consumer {name!r} not found on stream {self._core.name!r}", field="name"
            )
        return c

    def stale(self, c: Consumer) -> bool:
        """Whether ``c`` is not the current leader copy: one this leader dropped (a failed
        proposal, a change of term or leadership), rebuilt since or not yet. A stale copy
        must decide nothing more: its ops would be proposed after the new barrier, so the
        new copy, built from a replica that had not applied them yet, would decide the same
        deliveries again, and applying both halts every replica ("new delivery N is behind
        the cursor"). That includes the time between the drop and the new barrier's apply,
        when there is no copy at all: a push call holds its copy across awaits (found by
        the soak, ``chaos/soak.py``, with every replica halted)."""
        return self._leaders.get(c.name) is not c

    # -- sequencing the meta group's definitions ------------------------------------------------

    def reconcile(self) -> None:
        """Leader: make the group's consumers and config match the meta state (proposes the
        differences; level-triggered, so a lost proposal is made again on the next call)."""
        if not self._lead.ready:
            return
        core = self._core
        now = core.now_ns()
        wanted = {ca.name: ca for ca in core.d.consumers_of(core.account, core.name)}
        have = core.replica.consumers
        for name, ca in wanted.items():
            c = have.get(name)
            if (c is None or c.config != ca.config) and name not in self._sequencing:
                self._sequence(name, encode(ConsumerPut(name, ca.config, now)))
        for name in have:
            if name not in wanted and name not in self._sequencing:
                self._sequence(name, encode(ConsumerDelete(name, now)))
        sa = core.d.stream_of(core.account, core.name)
        if sa is None or sa.config == core.replica.stream.config or _CONFIG_KEY in self._sequencing:
            return
        update = UpdateConfig(ts_ns=now, config=sa.config)
        self._sequence(_CONFIG_KEY, encode(StreamBatch((update,))))

    def _sequence(self, key: str, data: bytes) -> None:
        self._sequencing.add(key)
        try:
            fut = self._core.propose(data)
        except RaftStreamError:
            self._sequencing.discard(key)
            return

        async def wait() -> None:
            with contextlib.suppress(RaftStreamError):
                await fut
            self._sequencing.discard(key)

        self._core.spawn(wait())

    # -- decisions -------------------------------------------------------------------------------

    async def run(
        self,
        c: Consumer,
        decide: Callable[[int], list[PullEvent]],
        timeout_s: float | None,
        *,
        deliver_early: bool = False,
        lazy: bool = False,
    ) -> asyncio.Future[Any] | None:
        """``StreamGroup.run``: one decision of the leader copy ``c``, its ops proposed; with
        ``deliver_early``, its events handed out once the leadership is confirmed."""
        lead = self._lead
        await lead.await_transfer(timeout_s)
        if self.stale(c):
            raise _stale_copy() if lead.is_leader else lead.not_leader()
        now = self._core.now_ns()
        events = decide(now)
        self.active_ns[c.name] = now
        ops = c.take_ops()
        commit = None
        if not ops:
            self._deliver(events)
            return commit
        try:
            if deliver_early:
                commit = asyncio.ensure_future(self._propose_op_entry(c, ops, timeout_s))
                self._core.watch(commit, on_error=lead.proposal_failed)
                # What a deposed leader decided is never handed out: one that has not heard
                # of the new term yet would deliver messages the new leader has seen acked.
                # A quorum's heartbeat answers (in the round that carries the ops, no
                # fsync) confirm the leadership first; failing that, the copies go, as for
                # a failed proposal, and the deliveries stay pending (redelivered after
                # ack_wait by whoever leads).
                await self._core.confirm_leader(timeout_s)
            else:
                await self._propose_ops(c, ops, timeout_s, lazy=lazy)
        except RaftStreamError as exc:
            lead.proposal_failed(exc)
            raise lead.hinted(exc, "consumer op") from None
        self._deliver(events)
        return commit

    def _propose_op_entry(
        self, c: Consumer, ops: list[Any], timeout_s: float | None, *, lazy: bool = False
    ) -> asyncio.Future[Any]:
        fut = asyncio.ensure_future(
            self._core.propose(ops_entry(c.name, ops), timeout_s, lazy=lazy)
        )
        self._lead.track_op(fut)  # until settled: what ``handing_over`` waits for
        return fut

    async def _propose_ops(
        self, c: Consumer, ops: list[Any], timeout_s: float | None, *, lazy: bool = False
    ) -> None:
        """Propose ops the leader copy ``c`` already applied, surviving the caller's
        cancellation: the host skips a proposal whose future was cancelled, so a caller
        cancelled mid-way (a client gone, a deadline) would leave the copy ahead of a log
        that never gets its ops, and a later redelivery of those messages would halt every
        replica ("new delivery N is behind the cursor"; found by the chaos bridge nemesis on
        5 nodes). Shielded, the proposal goes on; if it then fails, the copies are dropped
        as for any failed proposal."""
        fut = self._propose_op_entry(c, ops, timeout_s, lazy=lazy)
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._core.watch(fut, on_error=self._lead.proposal_failed)
            raise

    # -- push delivery ---------------------------------------------------------------------------

    def push_waker(self, consumer: str) -> asyncio.Event:
        """Attach a Consume call to ``consumer``: an event set on every apply (new
        messages, acks) that its session waits on. Detach with ``drop_push_waker``."""
        w = asyncio.Event()
        self._push_wakers.add(w)
        self._attached[consumer] = self._attached.get(consumer, 0) + 1
        return w

    def drop_push_waker(self, consumer: str, w: asyncio.Event) -> None:
        self._push_wakers.discard(w)
        left = self._attached.get(consumer, 0) - 1
        if left > 0:
            self._attached[consumer] = left
        else:
            self._attached.pop(consumer, None)
        self.active_ns[consumer] = self._core.now_ns()  # its inactivity starts now

    def push_bound(self, consumer: str) -> bool:
        return self._attached.get(consumer, 0) > 0

    async def push_step(
        self, c: Consumer, max_msgs: int, timeout_s: float | None
    ) -> tuple[PushStep, asyncio.Future[Any] | None]:
        """``StreamGroup.push_step``: one push step of the leader copy ``c``, run as a pull's
        decision is."""
        steps: list[PushStep] = []

        def decide(now: int) -> list[PullEvent]:
            steps.append(c.push_step(now, max_msgs=max_msgs))
            return []

        commit = await self.run(c, decide, timeout_s, deliver_early=True)
        return steps[0], commit


def _stale_copy() -> UnavailableError:
    return UnavailableError("the consumer's leader state was rebuilt; retry")
