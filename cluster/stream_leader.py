"""The leader side of a stream group: publish batching, consumer decisions, pull waiters.

``StreamGroup`` is what the node runs per stream group it hosts: the replica state machine
(``StreamReplica``, registered with the ``RaftHost``) plus, while this node leads, the work
only a leader does. Everything belongs to the node's event loop.

Time: the leader stamps every entry and consumer op with its clock (``GroupDeps.clock``,
``cluster/clock.py``); replicas never read the clock, so they all compute the same state from
the same log.

Publishes: each waits in a bounded queue (``publish_queue_msgs_max``); on the next loop turn
the queue is cut into Raft entries of at most ``publish_batch_entries_max`` publishes and
``publish_batch_bytes_max`` bytes, each proposed at once (many in flight; the host also
writes all of a round's entries with one fsync). A publish is answered from its entry's
apply result: after commit, which needs the entry fsynced on a quorum (fsync-before-ack).

Consumer decisions run on the leader copies (see ``cluster/stream_group.py``): the ops they
record are proposed. A pull's deliveries go to the client as soon as their Deliver op is
proposed, as JetStream does, not after it commits: the fetch then costs no Raft round trip.
Every ack comes after its delivery, so its op is after the Deliver op in the log and commits
only if the Deliver op did. If the Deliver op is lost with a leader change, the new leader
does not know the delivery: it delivers the message again, and refuses an ack for a
sequence it never delivered (``cluster/services_consume.py``), so a sync ack never
succeeds for a message that is still to be delivered. A push step's deliveries leave the
same way; each Consume call keeps at most ``PUSH_STEPS_UNCOMMITTED_MAX`` steps uncommitted
(``cluster/services_push.py``), which is what bounds an AckNone push consumer's proposals.
Everything else (acks, naks, pause, reset) is answered after its ops commit.

Failure: a proposal that fails leaves the leader copies ahead of the log by ops that may
never commit, so the copies are dropped (waiting pulls get 409 Leadership Change) and a new
barrier is proposed if this node still leads. Ambiguous outcomes (timeouts) are reported to
the caller as such.

Leadership transfers (a step-down, a leader leaving the group, a planned stop): while one
is in progress the core refuses every proposal, so a Deliver op decided then would be
refused after its deliveries had left, and the new leader would not know them (it would
deliver them again as first deliveries, and refuse the client's ack). So while the host
says a transfer is in progress (``RaftHost.transferring``) the copies decide nothing:
waiting pulls stay waiting, and a new pull, push step, ack or nak waits for the transfer to
end (``_await_transfer``), then goes on here if this node still leads, else fails
NOT_LEADER with nothing decided (the client goes to the new leader; waiting pulls end with
409 Leadership Change when the copies are dropped). What is queued in the host when a
transfer starts is not refused: ``RaftHost.transfer_leadership`` puts it into the log first.
``handing_over`` (the consumer step-down) goes further for a caller that starts the transfer
inside it: it holds decisions and waits for the consumer ops already proposed to commit.

Mirrors and sources: while this node leads (from its barrier on), a ``LinkSet``
(``cluster/mirror_links.py``) runs one coordinator per origin of the config; they propose
``Copy`` entries through ``propose_copies`` and stop when leadership is lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftstream.cluster.assignments import StreamAssignment
from raftstream.cluster.descriptions import LOG_FEATURE_SNAPSHOT_RECORDS
from raftstream.cluster.group_deps import GroupDeps
from raftstream.cluster.mirror_links import LinkSet
from raftstream.cluster.raft_errors import LeadershipTransferError
from raftstream.cluster.stream_entries import (
    ConsumerDelete,
    ConsumerPut,
    LeaderBarrier,
    StreamBatch,
    encode,
    ops_entry,
)
from raftstream.cluster.stream_group import StreamReplica, drain_events
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import PullEvent, PullRequest
from raftstream.engine.consumer_push import PushStep
from raftstream.engine.entries import Copy, Expire, Publish, UpdateConfig, plain_publish
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.origins import OriginState
from raftstream.engine.stream import PubAck
from raftstream.errors import (
    DeadlineExceededError,
    LimitError,
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.types import Role

__all__ = ["GroupDeps", "PullHandle", "StreamGroup"]

log = logging.getLogger(__name__)

PUBLISH_QUEUE_MSGS_MAX = 65_536  # publishes waiting for a Raft entry, per group
STORAGE_CHECK_S = 0.05  # how long a storage room lookup stands for (``_check_storage``)
PULL_QUEUE_EVENTS_SLACK = 64  # room in a pull's queue beyond its batch (statuses)
POLL_INTERVAL_MAX_S = 1.0  # the leader's timer looks at expiry at least this often
# A decision waits this long at most for a leadership transfer to end (the core abandons
# one after an election timeout), and looks whether it ended at least this often.
TRANSFER_WAIT_S_MAX = 5.0
TRANSFER_POLL_S = 0.01
ANSWER_MARGIN_S = 0.05  # answer this long before the client's deadline (at most 10% of it)


@dataclass(slots=True)
class _PendingPublish:
    entry: Publish
    size_bytes: int
    future: asyncio.Future[PubAck]


class PullHandle:
    """One pull request's events (deliveries once their Deliver op is proposed, statuses),
    in order. At most ``batch`` + ``PULL_QUEUE_EVENTS_SLACK`` events wait; one more is
    dropped (logged). Belongs to the node's event loop."""

    def __init__(self, reply: str, batch: int, close: Callable[[str], None]) -> None:
        self.reply = reply
        self._items: collections.deque[PullEvent] = collections.deque()
        self._items_max = batch + PULL_QUEUE_EVENTS_SLACK
        self._ready = asyncio.Event()
        self._close = close

    def put(self, events: Sequence[PullEvent]) -> int:
        """Queue ``events`` in order, as many as there is room for; returns how many did
        not fit (dropped)."""
        room = self._items_max - len(self._items)
        self._items.extend(events[: max(0, room)])
        self._ready.set()
        return max(0, len(events) - room)

    async def take(self) -> list[PullEvent]:
        """Every queued event, oldest first, waiting until there is one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        out = list(self._items)
        self._items.clear()
        return out

    def close(self) -> None:
        """The pull's call ended (completed, failed, cancelled): stop taking events and
        drop its request if it still waits. Idempotent."""
        self._close(self.reply)


def answer_within(timeout_s: float | None) -> float | None:
    """How long to wait for a commit: a little less than the client's time left, so the
    client gets our UNAVAILABLE (no quorum in time) rather than its own DEADLINE_EXCEEDED."""
    if timeout_s is None:
        return None
    return max(0.001, timeout_s - min(ANSWER_MARGIN_S, timeout_s / 10))


def no_commit(what: str) -> UnavailableError:
    """A proposal not committed in time: a quorum is likely lost; the outcome is unknown
    (the entry may still commit), so only an idempotent request may be retried."""
    return UnavailableError(f"{what}: not committed in time (no quorum?); the outcome is unknown")


def moving_to(what: str, to: str, to_addr: str | None) -> NotLeaderError:
    """A proposal the Raft core refused while ``what`` (a group's leadership) moves to node
    ``to`` (a step-down, cluster balance, a planned stop): it is in no log, so NOT_LEADER
    naming the node taking over, which clients follow even for a request they never retry
    when its outcome is unknown (a publish without a msg id, a delete); the core's own
    refusal is a retriable UNAVAILABLE, which says no such thing."""
    return NotLeaderError(f"not done: {what} is moving to {to}", leader=to, leader_addr=to_addr)


def answered_within(
    fut: asyncio.Future[Any], timeout_s: float | None, what: str
) -> asyncio.Future[Any]:
    """``fut``'s outcome, or ``no_commit(what)`` when it is not there a little before
    ``timeout_s`` (``answer_within``; None: no bound). A future of its own (cancelling it
    leaves ``fut`` alone) and no task: a timer and a callback, cheap enough per publish.
    A late outcome of ``fut`` is retrieved and dropped."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()
    within = answer_within(timeout_s)

    def late() -> None:
        if not out.done():
            out.set_exception(no_commit(what))

    timer = loop.call_later(within, late) if within is not None else None

    def settled(f: asyncio.Future[Any]) -> None:
        if timer is not None:
            timer.cancel()
        if f.cancelled():
            exc: BaseException | None = UnavailableError(
                f"{what} cancelled before its answer; the outcome is unknown"
            )
        else:
            exc = f.exception()  # retrieved even when late
        if out.done():
            return
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result())

    fut.add_done_callback(settled)
    return out


class StreamGroup:
    """This node's replica of a stream group and, while it leads, the leader's work."""

    def __init__(self, deps: GroupDeps, assignment: StreamAssignment) -> None:
        self._d = deps
        self.group = assignment.group
        self.account = assignment.account
        self.name = assignment.name
        self.replica = StreamReplica(
            node_id=deps.node_id,
            assignment=assignment,
            env=deps.env,
            metrics=deps.metrics,
            on_barrier=self._barrier_applied,
            on_applied=self._applied,
            records_snapshots=lambda: self.replicas_read(LOG_FEATURE_SNAPSHOT_RECORDS) is True,
        )
        self._term = 0  # the term of the leadership last seen
        self._lead_term = 0  # nonzero: the leader copies are valid for this term
        self._barrier_term = 0  # the term a barrier was proposed for
        self._barrier_seq = 0  # the last barrier proposed (``_barrier_applied``)
        self._leaders: dict[str, Consumer] = {}
        self._waiters: dict[str, PullHandle] = {}
        self._reply_ids = itertools.count(1)
        # Storage room this group may still take before looking again (``_check_storage``).
        self._room_left = 0
        self._room_until = 0.0
        self._room_taken = 0  # admitted since the last look, told to the node at the next
        self._pubs: collections.deque[_PendingPublish] = collections.deque()
        self._flush_scheduled = False
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._sequencing: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # Leadership transfers (module docstring): hand-overs holding decisions, consumer
        # ops proposed and not settled, and what wakes decisions waiting for a transfer.
        self._handing_over = 0
        self._hand_over_began = False  # a transfer was seen since the hand-over started
        self._ops_inflight: set[asyncio.Future[Any]] = set()
        self._transfer_over = asyncio.Event()
        # One per attached Consume call, set on every apply. Which call sends what a step
        # takes is the calls' own business (a queue group deals it: services_push.py).
        self._push_wakers: set[asyncio.Event] = set()
        self._attached: dict[str, int] = {}  # consumer -> attached Consume calls
        self._active_ns: dict[str, int] = {}  # consumer -> last request, ack or push step
        self._reaping: set[str] = set()  # inactive consumers whose deletion is in flight
        self._links = LinkSet(
            host=self,
            account=self.account,
            stream=self.name,
            servers=deps.cluster_addrs,
            log_extra={"node": deps.node_id, "group": self.group},
            tls=deps.client_tls,
            token=deps.link_token(self.account),
        )

    def _now_ns(self) -> int:
        # The leader's clock, stamped into entries and ops: replicas never read theirs (they
        # use the stamp), so every replica computes the same expiry, deadlines and state.
        return self._d.clock.time_ns()

    # -- leadership ----------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._d.host.leader(self.group) == self._d.node_id

    @property
    def ready(self) -> bool:
        """True while this node leads and its leader copies are valid."""
        return self._lead_term != 0 and self.is_leader

    def check_leadership(self, *, observe: bool = True) -> None:
        """Called by the node's monitor: react to a change of role or term; ``observe``:
        refresh the group's gauges too (the monitor does that less often)."""
        role, term = self._d.host.role(self.group)
        leading = role == Role.LEADER
        if term != self._term or (not leading and self._lead_term):
            if term != self._term and self._term:  # not the term found at start
                self._d.metrics.leader_changed(self.group)
            self._term = term
            leader = "this node" if leading else self._d.host.leader(self.group) or "unknown"
            self._drop_leader_state(f"leadership changed: term {term}, leader {leader}")
        if leading and self._barrier_term != term and self._lead_term != term:
            self._propose_barrier(term)
        if leading and not self._transfer_over.is_set() and not self._held():
            self._transfer_ended()  # abandoned: what waited decides here after all
        if observe:
            st = self._d.host.status(self.group)
            self._d.metrics.observe_group(
                self.group, applied=st.applied, term=st.term, leader=leading, halted=st.halted
            )

    def _propose_barrier(self, term: int) -> None:
        self._barrier_term = term
        self._barrier_seq += 1
        data = encode(LeaderBarrier(term, self._d.node_id, self._barrier_seq))
        try:
            fut = self._d.host.propose(self.group, data)
        except RaftStreamError:
            self._barrier_term = 0  # try again on the next check
            return
        self._watch(fut, on_error=self._barrier_failed)

    def _barrier_failed(self, exc: BaseException) -> None:
        self._barrier_term = 0

    def _barrier_applied(self, term: int, seq: int) -> None:
        """Build the leader copies when this leader's last barrier applies. Only the last
        one proposed, and only while the copies are not built for this term: a barrier
        whose proposal failed ambiguously (a timeout) may still commit, after the next one
        was proposed or after the copies were built. Building again then, from a replica
        that had not applied the ops the copies had proposed meanwhile, would decide the
        same deliveries again, and applying both halts every replica ("new delivery N is
        behind the cursor": found by the soak, ``chaos/soak.py``, two barriers of one term
        in the log with a push step's deliveries between them)."""
        st = self._d.host.status(self.group)
        if st.role != Role.LEADER or st.term != term:
            return
        if seq != self._barrier_seq or self._lead_term == term:
            return
        self._barrier_term = term
        self._leaders = {n: self.replica.leader_copy(n) for n in self.replica.consumers}
        # Inactivity counts from when this leader took over (its copies' clocks start now).
        self._active_ns = dict.fromkeys(self._leaders, self._now_ns())
        self._lead_term = term
        log.info("leading", extra={"node": self._d.node_id, "group": self.group, "term": term})
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_loop())
        self.reconcile()
        self._links.sync(self.replica.stream.config)

    def _drop_leader_state(self, why: str) -> None:
        if self._lead_term:
            log.info(why, extra={"node": self._d.node_id, "group": self.group, "term": self._term})
        self._lead_term = 0
        self._links.stop_all()
        self._dispatch(drain_events(list(self._leaders.values())))
        self._leaders.clear()
        self._sequencing.clear()
        self.replica.forget_proposed()
        self._fail_pubs(NotLeaderError("stream leadership changed; not proposed"))
        self._transfer_over.set()  # decisions waiting for a transfer now fail NOT_LEADER

    # -- leadership transfers (module docstring) ----------------------------------------------

    def _held(self) -> bool:
        """Whether the leader copies must decide nothing now: a transfer of this group's
        leadership is in progress here (the core refuses every proposal until it ends), or
        a hand-over (``handing_over``) is about to start one (once its transfer was seen,
        the transfer's own end releases decisions, abandoned or not)."""
        if self._d.host.transferring(self.group) is not None:
            self._hand_over_began = bool(self._handing_over)
            return True
        return bool(self._handing_over) and not self._hand_over_began

    def _transfer_ended(self) -> None:
        """Wake what waited for a transfer: decisions (``_await_transfer``), the poller."""
        self._transfer_over.set()
        self._wake.set()

    async def _await_transfer(self, timeout_s: float | None) -> None:
        """Return at once unless a transfer holds decisions; else wait until it ends, then
        return if this node still leads with its copies, or raise ``not_leader()`` (the
        leadership moved: nothing was decided here, the request may go to the new leader).
        UnavailableError (retriable) when it outlasts ``timeout_s`` (``answer_within``) or
        ``TRANSFER_WAIT_S_MAX``."""
        if not self._held():
            return
        loop = asyncio.get_running_loop()
        within = answer_within(timeout_s)
        deadline = loop.time() + min(TRANSFER_WAIT_S_MAX, within or TRANSFER_WAIT_S_MAX)
        while self._lead_term and self._held():
            left = deadline - loop.time()
            if left <= 0:
                raise UnavailableError(
                    f"the leadership of stream {self.name!r} is moving; retry", group=self.group
                )
            self._transfer_over.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._transfer_over.wait(), min(left, TRANSFER_POLL_S))
        if not self.ready:
            raise self.not_leader()

    @contextlib.asynccontextmanager
    async def handing_over(self, timeout_s: float | None) -> AsyncIterator[None]:
        """Hold every consumer decision while the caller starts a leadership transfer of
        this group inside (``RaftHost.transfer_leadership``) and waits for it. Entering
        waits, bounded by ``timeout_s`` (else the proposal timeout), until the consumer
        ops already proposed have settled, so that none is still queued in the host when
        the transfer starts: the core would refuse it after its deliveries had left.
        Decisions asked meanwhile wait: until the transfer is seen to start, then until
        it ends, as during any transfer (an abandoned one releases them); at the latest on
        leaving, after which they go on if this node still leads, else fail NOT_LEADER."""
        self._handing_over += 1
        self._hand_over_began = False
        try:
            inflight = set(self._ops_inflight)
            if inflight:
                within = answer_within(timeout_s)
                limit_s = self._d.proposal_timeout_ms / 1000
                await asyncio.wait(inflight, timeout=min(limit_s, within or limit_s))
            yield
        finally:
            self._handing_over -= 1
            if not self._held():
                self._transfer_ended()

    def _proposal_failed(self, exc: BaseException) -> None:
        """Ops of the leader copies may not commit: drop the copies, make them again."""
        self._d.metrics.proposal_failures.labels("stream").inc()
        self._drop_leader_state(f"a consumer proposal failed: {exc!r}")
        self._barrier_term = 0

    def _applied(self) -> None:
        self._wake.set()
        for w in self._push_wakers:
            w.set()
        if self._lead_term:
            self._sync_leader_copies()
            self._links.sync(self.replica.stream.config)

    def _sync_leader_copies(self) -> None:
        """Follow consumer puts/deletes that just applied (level-triggered)."""
        replicas = self.replica.consumers
        for name in [n for n in self._leaders if n not in replicas]:
            self._dispatch(self._leaders.pop(name).delete())
        for name, c in replicas.items():
            lc = self._leaders.get(name)
            if lc is None:
                self._leaders[name] = self.replica.leader_copy(name)
            elif lc.config != c.config:
                lc.update_config(c.config)

    # -- proposals -----------------------------------------------------------------------------

    def _propose(
        self, data: bytes, timeout_s: float | None = None, *, lazy: bool = False
    ) -> Awaitable[Any]:
        timeout_ms = self._d.proposal_timeout_ms
        within = answer_within(timeout_s)
        if within is not None:
            timeout_ms = max(1, min(timeout_ms, int(within * 1000)))
        self._d.metrics.proposals.labels("stream").inc()
        return self._d.host.propose(self.group, data, timeout_ms=timeout_ms, lazy=lazy)

    def _watch(self, fut: Awaitable[Any], *, on_error: Callable[[BaseException], None]) -> None:
        async def wait() -> None:
            try:
                await fut
            except RaftStreamError as exc:
                on_error(exc)

        task = asyncio.get_running_loop().create_task(wait())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def not_leader(self) -> UnavailableError:
        """The error for a request that needs the leader: NOT_LEADER with the leader's
        client address when one is known, NO_LEADER otherwise."""
        leader = self._d.host.leader(self.group)
        if leader is None or leader == self._d.node_id:
            return NoLeaderError(f"stream {self.name!r} has no leader yet", group=self.group)
        return NotLeaderError(
            f"not the leader of stream {self.name!r}",
            leader=leader,
            leader_addr=self._d.client_addr(leader),
        )

    def require_leader(self) -> None:
        if not self.ready:
            raise self.not_leader()

    # -- publishing ----------------------------------------------------------------------------

    def submit(self, entry_args: dict[str, Any]) -> asyncio.Future[PubAck]:
        """Queue one message for the next Raft entry; the future resolves to its PubAck
        once committed and applied, or to the refusal (preconditions, limits), a
        NotLeader/NoLeader error, or UnavailableError when no quorum committed it in the
        proposal timeout (ambiguous: it may be stored). Raises at once when this node does
        not lead or the queue is full."""
        self._check_room()
        entry = Publish(ts_ns=self._now_ns(), **entry_args)
        size = len(entry.data) + len(entry.subject) + sum(map(len, entry.headers)) + 64
        self._check_storage(size)
        return self._enqueue(entry, size)

    def submit_plain(self, subject: str, data: bytes) -> asyncio.Future[PubAck]:
        """``submit`` of a message with a subject and data only (no headers, no options):
        the common publish, without building and unpacking its arguments."""
        self._check_room()
        size = len(data) + len(subject) + 64
        self._check_storage(size)
        return self._enqueue(plain_publish(self._now_ns(), subject, data), size)

    def _check_room(self) -> None:
        if not self.is_leader:
            raise self.not_leader()
        if len(self._pubs) >= PUBLISH_QUEUE_MSGS_MAX:
            raise LimitError("too many publishes waiting", limit="publish_queue_msgs_max")

    def _check_storage(self, size: int) -> None:
        """Refuse a publish that would leave a replica with less than the reserve of storage
        room: ``LimitError`` naming the node, nothing proposed (``cluster/storage_room.py``;
        a store that fills halts the group on that node). The room is looked up at most
        every ``STORAGE_CHECK_S`` (a publish on the hot path costs a subtraction), and what
        this group admitted in between counts against it."""
        left = self._room_left - size
        if left >= 0 and self._d.clock.monotonic() < self._room_until:
            self._room_left = left
            self._room_taken += size
            return
        self._d.storage_admitted(self._room_taken)
        self._room_taken = 0
        sa = self._d.stream_of(self.account, self.name)
        tightest = self._d.storage_room(sa.peers if sa is not None else (self._d.node_id,))
        if tightest is None:
            return
        node, room, reserve = tightest
        self._room_left = room - reserve - size
        self._room_until = self._d.clock.monotonic() + STORAGE_CHECK_S
        if self._room_left < 0:
            self._room_left = 0
            raise LimitError(
                f"insufficient storage: node {node} has {room} bytes of room left, and keeps "
                f"{reserve} free (limits.storage_bytes_max, or its disk): delete or purge "
                "messages, or give it more room",
                limit="storage_bytes_max",
                node=node,
            )
        self._room_taken = size

    def _enqueue(self, entry: Publish, size: int) -> asyncio.Future[PubAck]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PubAck] = loop.create_future()
        self._pubs.append(_PendingPublish(entry, size, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Everything queued until the loop turns goes into as few entries as the limits
            # allow: this is where concurrent publishes are batched.
            loop.call_soon(self._flush_publishes)
        return fut

    async def publish(self, entry_args: dict[str, Any], timeout_s: float | None) -> PubAck:
        """``submit`` and wait, answering UNAVAILABLE shortly before ``timeout_s``."""
        ack: PubAck = await answered_within(self.submit(entry_args), timeout_s, "publish")
        return ack

    def _flush_publishes(self) -> None:
        self._flush_scheduled = False
        limits = self._d.limits
        while self._pubs:
            batch: list[_PendingPublish] = []
            size = 0
            while self._pubs and len(batch) < limits.publish_batch_entries_max:
                p = self._pubs[0]
                if batch and size + p.size_bytes > limits.publish_batch_bytes_max:
                    break
                batch.append(self._pubs.popleft())
                size += p.size_bytes
            self._propose_publishes(batch)

    def _propose_publishes(self, batch: list[_PendingPublish]) -> None:
        live = [p for p in batch if not p.future.done()]
        if not live:
            return
        entries: tuple[EngineEntry, ...] = tuple(p.entry for p in live)
        self._d.metrics.publish_batch_entries.observe(len(live))
        batch_entry = StreamBatch(entries)
        data = encode(batch_entry)
        self.replica.remember(data, batch_entry)  # before proposing: it may apply at once
        try:
            fut = self._propose(data)
        except RaftStreamError as exc:
            self.replica.forget_proposed()  # not proposed: the kept entry would never apply
            hinted = self._hinted(exc)
            for p in live:
                p.future.set_exception(hinted)
            return

        async def resolve() -> None:
            try:
                results = await fut
            except RaftStreamError as exc:
                self._d.metrics.proposal_failures.labels("stream").inc()
                results = [self._hinted(exc)] * len(live)
            acked = 0
            for p, r in zip(live, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    acked += 1
                    p.future.set_result(r)
            if acked:  # once per entry: a counter's inc takes a lock, per message it showed
                self._d.metrics.published.inc(acked)

        task = asyncio.get_running_loop().create_task(resolve())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _hinted(self, exc: RaftStreamError) -> RaftStreamError:
        if isinstance(exc, DeadlineExceededError):
            return no_commit("publish")
        if isinstance(exc, LeadershipTransferError):
            return self._moving(exc)
        return self.not_leader() if isinstance(exc, NotLeaderError) else exc

    def _moving(self, exc: LeadershipTransferError) -> NotLeaderError:
        return moving_to(
            f"the leadership of stream {self.name!r}", exc.to, self._d.client_addr(exc.to)
        )

    def _fail_pubs(self, exc: RaftStreamError) -> None:
        while self._pubs:
            p = self._pubs.popleft()
            if not p.future.done():
                p.future.set_exception(exc)

    async def propose_stream(self, entry: EngineEntry, timeout_s: float | None) -> Any:
        """Propose one engine entry (purge, delete, config) and return its result."""
        if not self.is_leader:
            raise self.not_leader()
        results = await self._await(self._propose(encode(StreamBatch((entry,))), timeout_s))
        result = results[0]
        if isinstance(result, BaseException):
            raise result
        return result

    # -- mirrors and sources (cluster/mirror.py) -------------------------------------------------

    def replicas_read(self, feature: str) -> bool | None:
        """Whether every replica of the stream reads log entries of ``feature`` (a rolling
        upgrade: a node not upgraded yet would halt the group on an entry it cannot read);
        None while a replica has not described itself to this node yet."""
        sa = self._d.stream_of(self.account, self.name)
        return sa is not None and self._d.replicas_read(sa.peers, feature)

    def origin_position(self, key: str) -> OriginState:
        """The replicated position of origin ``key``, as applied here."""
        return self.replica.stream.origins.get(key, OriginState())

    async def propose_copies(self, copies: Sequence[Copy]) -> list[Any]:
        """Propose ``copies`` as one entry; their results (refusals as values). Raises
        NotLeader/Unavailable when it cannot commit (the outcome may be unknown: the
        engine's position check makes a retry safe)."""
        self.require_leader()
        batch = StreamBatch(tuple(copies))
        data = encode(batch)
        self.replica.remember(data, batch)
        try:
            fut = self._propose(data)
        except RaftStreamError:
            self.replica.forget_proposed()
            raise
        return list(await self._await(fut))

    def source_infos(self) -> tuple[pb.StreamSourceInfo | None, list[pb.StreamSourceInfo]]:
        """(mirror, sources) of ``GetStreamInfo``: replicated positions, plus the live
        state of the links running here."""
        stream = self.replica.stream
        infos = self._links.source_infos(stream.config, stream.origins)
        if stream.config.mirror is not None:
            return (infos[0] if infos else None), []
        return None, infos

    async def _await(self, fut: Awaitable[Any]) -> Any:
        try:
            return await fut
        except NotLeaderError:
            raise self.not_leader() from None
        except LeadershipTransferError as exc:
            raise self._moving(exc) from None
        except DeadlineExceededError:
            raise no_commit("stream change") from None

    # -- consumers: sequencing the meta group's definitions -----------------------------------

    def reconcile(self) -> None:
        """Leader: make the group's consumers and config match the meta state (proposes the
        differences; level-triggered, so a lost proposal is made again on the next call)."""
        if not self.ready:
            return
        now = self._now_ns()
        wanted = {ca.name: ca for ca in self._d.consumers_of(self.account, self.name)}
        have = self.replica.consumers
        for name, ca in wanted.items():
            c = have.get(name)
            if (c is None or c.config != ca.config) and name not in self._sequencing:
                self._sequence(name, encode(ConsumerPut(name, ca.config, now)))
        for name in have:
            if name not in wanted and name not in self._sequencing:
                self._sequence(name, encode(ConsumerDelete(name, now)))
        sa = self._d.stream_of(self.account, self.name)
        if sa is not None and sa.config != self.replica.stream.config:
            key = "\x00config"
            if key not in self._sequencing:
                update = UpdateConfig(ts_ns=now, config=sa.config)
                self._sequence(key, encode(StreamBatch((update,))))

    def _sequence(self, key: str, data: bytes) -> None:
        self._sequencing.add(key)
        try:
            fut = self._propose(data)
        except RaftStreamError:
            self._sequencing.discard(key)
            return

        async def wait() -> None:
            with contextlib.suppress(RaftStreamError):
                await fut
            self._sequencing.discard(key)

        task = asyncio.get_running_loop().create_task(wait())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def led_consumers(self) -> list[Consumer]:
        """The leader copies of the consumers, while this node leads (else none)."""
        if not self.ready:
            return []
        return [c for c in self._leaders.values() if not c.deleted]

    def leader_consumer(self, name: str) -> Consumer:
        """The leader copy of consumer ``name`` (NotLeader/NotFound otherwise)."""
        self.require_leader()
        c = self._leaders.get(name)
        if c is None or c.deleted:
            raise NotFoundError(
                f"consumer {name!r} not found on stream {self.name!r}", field="name"
            )
        return c

    def _stale(self, c: Consumer) -> bool:
        """Whether ``c`` is not the current leader copy: one this leader dropped (a failed
        proposal, a change of term or leadership), rebuilt since or not yet. A stale copy
        must decide nothing more: its ops would be proposed after the new barrier, so the
        new copy, built from a replica that had not applied them yet, would decide the same
        deliveries again, and applying both halts every replica ("new delivery N is behind
        the cursor"). That includes the time between the drop and the new barrier's apply,
        when there is no copy at all: a push call holds its copy across awaits (found by
        the soak, ``chaos/soak.py``, with every replica halted)."""
        return self._leaders.get(c.name) is not c

    def _stale_copy(self) -> UnavailableError:
        return UnavailableError("the consumer's leader state was rebuilt; retry")

    async def run(
        self,
        c: Consumer,
        decide: Callable[[int], list[PullEvent]],
        timeout_s: float | None,
        *,
        deliver_early: bool = False,
        lazy: bool = False,
    ) -> asyncio.Future[Any] | None:
        """Run one decision of the leader copy ``c`` at the leader's time, propose the ops
        it recorded, and return once they committed, delivering its events then; with
        ``deliver_early`` (pulls, push steps), deliver them and return once the ops are
        proposed, with the future of their commit (None when there were none): a failed
        commit then only drops the copies (module docstring). UnavailableError
        (retriable), with nothing decided, when ``c`` is a stale copy (``_stale``). While a
        leadership transfer is in progress it first waits for its end (``_await_transfer``:
        NOT_LEADER, with nothing decided, when leadership moved). ``lazy`` (fire-and-forget
        acks, whose sender waits for no answer): the op goes with the group's next Raft
        round rather than starting one (``RaftHost.propose``; docs/cluster-design.md)."""
        await self._await_transfer(timeout_s)
        if self._stale(c):
            raise self._stale_copy() if self.is_leader else self.not_leader()
        now = self._now_ns()
        events = decide(now)
        self._active_ns[c.name] = now
        ops = c.take_ops()
        commit = None
        if not ops:
            self._dispatch(events)
            return commit
        try:
            if deliver_early:
                commit = asyncio.ensure_future(self._propose_op_entry(c, ops, timeout_s))
                self._watch(commit, on_error=self._proposal_failed)
            else:
                await self._propose_ops(c, ops, timeout_s, lazy=lazy)
        except RaftStreamError as exc:
            self._proposal_failed(exc)
            if isinstance(exc, DeadlineExceededError):
                raise no_commit("consumer op") from None
            raise self._hinted(exc) from None
        self._dispatch(events)
        return commit

    def _propose_op_entry(
        self, c: Consumer, ops: list[Any], timeout_s: float | None, *, lazy: bool = False
    ) -> asyncio.Future[Any]:
        fut = asyncio.ensure_future(self._propose(ops_entry(c.name, ops), timeout_s, lazy=lazy))
        self._ops_inflight.add(fut)  # until settled: what ``handing_over`` waits for
        fut.add_done_callback(self._ops_inflight.discard)
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
            self._watch(fut, on_error=self._proposal_failed)
            raise

    # -- push delivery -----------------------------------------------------------------------

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
        self._active_ns[consumer] = self._now_ns()  # its inactivity starts now

    def push_bound(self, consumer: str) -> bool:
        return self._attached.get(consumer, 0) > 0

    async def push_step(
        self, c: Consumer, max_msgs: int, timeout_s: float | None
    ) -> tuple[PushStep, asyncio.Future[Any] | None]:
        """One push step of the leader copy ``c`` (``Consumer.push_step``), run as a pull's
        decision is (``run`` with ``deliver_early``): returned, to be sent at once, with the
        future of its Deliver ops' commit (None when it recorded none). The caller bounds
        how many steps it has uncommitted (cluster/services_push.py)."""
        steps: list[PushStep] = []

        def decide(now: int) -> list[PullEvent]:
            steps.append(c.push_step(now, max_msgs=max_msgs))
            return []

        commit = await self.run(c, decide, timeout_s, deliver_early=True)
        return steps[0], commit

    # -- pull requests -------------------------------------------------------------------------

    async def open_pull(
        self, consumer: str, request: dict[str, Any], timeout_s: float | None
    ) -> PullHandle:
        """Queue a pull request on the leader copy; its events arrive on the handle. The
        caller closes the handle when its call ends, however it ends: that also takes the
        request out of the consumer if it is still waiting (``_close_pull``). During a
        leadership transfer it first waits for the transfer's end (``_await_transfer``):
        NOT_LEADER, with nothing queued, when leadership moved."""
        await self._await_transfer(timeout_s)
        c = self.leader_consumer(consumer)
        reply = f"pull.{next(self._reply_ids)}"
        handle = PullHandle(reply, int(request.get("batch", 1)), lambda r: self._close_pull(c, r))
        self._waiters[reply] = handle
        req = PullRequest(reply=reply, **request)
        try:
            await self.run(c, lambda now: c.pull(req, now), timeout_s, deliver_early=True)
        except BaseException:
            handle.close()
            raise
        self._wake.set()
        return handle

    def _close_pull(self, c: Consumer, reply: str) -> None:
        """The call of pull ``reply`` on the leader copy ``c`` ended. A request still
        waiting (the client cancelled or went away, or its deadline cut the call) is
        dropped from ``c`` at once, as JetStream drops a request whose requester is gone:
        else it would hold a ``max_waiting`` place and take messages no one receives until
        it expired. Waiting requests are leader-local (engine/consumer_pull.py), so this
        proposes nothing. Deliveries decided for it before this point (their Deliver op
        proposed) are not undone: they stay pending and are redelivered after ack_wait.
        A copy dropped since (stale, deleted) had its requests drained with a 409."""
        self._waiters.pop(reply, None)
        if c.deleted or self._stale(c) or not c.cancel_pull(reply):
            return
        self._active_ns[c.name] = self._now_ns()  # inactivity starts when the last pull ends

    def _dispatch(self, events: list[PullEvent]) -> None:
        """Hand ``events`` to their pull handles, one batch per handle."""
        batches: dict[str, list[PullEvent]] = {}
        waiters = self._waiters
        for e in events:
            if e.reply not in waiters:
                continue  # the client went away: an undelivered message is redelivered later
            batch = batches.get(e.reply)
            if batch is None:
                batch = batches[e.reply] = []
            batch.append(e)
        for reply, items in batches.items():
            if self._waiters[reply].put(items):
                log.warning("pull queue full; events dropped", extra={"group": self.group})

    async def _poll_loop(self) -> None:
        """Leader timer: serve waiting pulls on new data and deadlines; propose expiry."""
        try:
            while self.ready:
                await self._poll_once()
                timeout = self._next_wake_s()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        except RaftStreamError as exc:
            # A failed proposal dropped the leader state; the next barrier starts a poller.
            log.info("poller stopped: %r", exc, extra={"group": self.group})
        except Exception:
            log.exception("poller failed (a bug)", extra={"group": self.group})
            self._proposal_failed(RaftStreamError("poller failed"))
        finally:
            self._poller = None

    async def _poll_once(self) -> None:
        if self._held():
            self._transfer_over.clear()  # so that the transfer's end wakes the poller
            return  # waiting pulls wait
        for c in list(self._leaders.values()):
            # A copy dropped while an earlier one was proposed is skipped: it is stale.
            if (
                self.ready
                and not self._stale(c)
                and not c.deleted
                and c.config.is_pull
                and c.num_waiting
            ):
                await self.run(c, c.poll, None, deliver_early=True)
        await self._maybe_expire()
        self._reap_inactive()

    def _reap_inactive(self) -> None:
        """Consumers idle past their ``inactive_threshold`` (no waiting pull, no push call
        attached, no request or ack) are deleted through the meta leader, as in JetStream
        2.9+: every ephemeral (5 s unless set) and a durable that sets one (0, a durable's
        default: never). The deletion then comes back to this group as a CONSUMER_DELETE."""
        now = self._now_ns()
        if len(self._active_ns) > len(self._leaders):  # consumers deleted since: forget them
            for gone in [n for n in self._active_ns if n not in self._leaders]:
                del self._active_ns[gone]
        for name, c in self._leaders.items():
            threshold = c.config.inactive_threshold
            if not threshold or name in self._reaping:
                continue
            if c.num_waiting or self.push_bound(name):
                continue
            # A consumer created while this node leads is first seen here: idle from now.
            if now - self._active_ns.setdefault(name, now) < threshold:
                continue
            self._reaping.add(name)
            self._watch_reap(name)

    def _watch_reap(self, name: str) -> None:
        async def reap() -> None:
            try:
                await self._d.delete_consumer(self.account, self.name, name)
            except RaftStreamError as exc:
                log.info(
                    "inactive consumer %s not deleted yet: %r",
                    name,
                    exc,
                    extra={"group": self.group},
                )
            finally:
                self._reaping.discard(name)

        task = asyncio.get_running_loop().create_task(reap())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _next_wake_s(self) -> float:
        if self._held():
            return POLL_INTERVAL_MAX_S  # ``_transfer_ended`` wakes it
        now = self._now_ns()
        wakes = [c.next_wake_ns(now) for c in self._leaders.values() if not c.deleted]
        due = min((w for w in wakes if w), default=0)
        if not due:
            return POLL_INTERVAL_MAX_S
        return max(0.001, min(POLL_INTERVAL_MAX_S, (due - now) / 1e9))

    async def _maybe_expire(self) -> None:
        cfg = self.replica.stream.config
        st = self.replica.store.state()
        if not st.msgs or not (cfg.max_age or cfg.allow_msg_ttl):
            return
        now = self._now_ns()
        if cfg.max_age and st.first_ts + cfg.max_age > now and not cfg.allow_msg_ttl:
            return
        with contextlib.suppress(RaftStreamError):
            await self.propose_stream(Expire(ts_ns=now), None)

    # -- lifecycle -----------------------------------------------------------------------------

    async def close(self, *, drop: bool) -> None:
        """Stop the leader's work and close (``drop``: delete) the store."""
        self._drop_leader_state("group closed")
        await self._links.close()
        if self._poller is not None:
            self._poller.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.replica.close(drop=drop)
