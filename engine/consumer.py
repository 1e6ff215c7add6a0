"""The consumer state machine: deliveries, acks, redelivery, pull requests and push pacing.

A ``Consumer`` reads one stream's ``StreamStore`` and keeps a ``ConsumerState``
(``consumer_state.py``). Replicated state changes only through ops: the leader's methods
(``pull``, ``push_step``, ``ack``...) decide, apply each op at once and keep it in an outbox
(``take_ops``) for the caller to replicate; a follower calls ``apply(op)`` with the same ops
in the same order and reaches the same state. Waiting pull requests and push pacing are
leader-local, as in JetStream.

Time: every method takes ``now_ns`` (ns since the epoch) from the caller, which in a cluster
is the leader's stamp carried by the op; nothing here reads the clock.

Delivery order: eligible redeliveries first (deadline passed, or nak'd), oldest deadline
first, then new messages in stream order. A message whose last allowed delivery
(``max_deliver``) expires is given up with a MAX_DELIVERIES event; new messages stop while
``max_ack_pending`` messages are unacked; a paused consumer delivers nothing.

Threading: a consumer belongs to one thread (the node's apply thread); it is not thread-safe.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from raftstream.engine.ack import AckKind, parse_ack_payload, parse_ack_subject
from raftstream.engine.consumer_config import (
    UNLIMITED,
    ConsumerConfig,
    ReplayPolicy,
)
from raftstream.engine.consumer_pull import (
    Delivery,
    PullEvent,
    PullRequest,
    StatusCode,
    WaitingQueue,
    WaitingRequest,
    delivery_event,
)
from raftstream.engine.consumer_push import FLOW_WINDOW_MSGS, Heartbeat, PushPlanner, PushStep
from raftstream.engine.consumer_start import start_op
from raftstream.engine.consumer_state import (
    Ack,
    Changes,
    ConsumerOp,
    ConsumerState,
    Deliver,
    Event,
    Gone,
    MaxDelivered,
    Nak,
    Pause,
    Progress,
    Reset,
    Term,
    apply_op,
)
from raftstream.engine.consumer_store import ConsumerKey, ConsumerStateStore
from raftstream.engine.store import StoredMsg, StreamStore
from raftstream.engine.subjects import subject_matches
from raftstream.errors import InvalidArgumentError, NotFoundError, PreconditionError, invariant

__all__ = ["ADVISORIES_MAX", "Consumer", "ConsumerInfo", "RetentionListener", "SequenceInfo"]

ADVISORIES_MAX = 1024
OUTBOX_OPS_MAX = 65536
HEAP_SLACK_ENTRIES = 1024  # stale deadline entries tolerated before the heap is rebuilt


class RetentionListener(Protocol):
    """Told when a consumer may have released messages (see ``engine/retention.py``)."""

    def released(self, consumer: Consumer, stream_seqs: Sequence[int], *, rescan: bool) -> None:
        """``stream_seqs`` are no longer held by ``consumer``; ``rescan``: its holds moved
        wholesale (start/reset), so every message may need a fresh look."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceInfo:
    """A consumer and stream sequence pair; ``last_active_ns``: when the last delivery (for
    ``delivered``) or ack (for ``ack_floor``) was applied here, by the op's own time, 0 when
    none was since this replica started (not persisted: a restart forgets it)."""

    consumer_seq: int
    stream_seq: int
    last_active_ns: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerInfo:
    """A consumer's info, as JetStream reports it (times in ns)."""

    stream: str
    name: str
    config: ConsumerConfig
    delivered: SequenceInfo
    ack_floor: SequenceInfo
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    num_pending: int
    paused: bool
    pause_remaining_ns: int


class Consumer:
    """One consumer of one stream (see the module docstring for the contract).

    Build with ``Consumer.create`` (a new consumer: computes its start from the deliver
    policy) or ``Consumer.open`` (state read back from a ``ConsumerStateStore``). With a
    ``state_store`` every public call persists its changes before returning (one write per
    call); failures of the state store propagate and leave memory ahead of disk, which a
    reopen repairs by redelivering (at-least-once).
    """

    def __init__(
        self,
        *,
        stream: str,
        name: str,
        config: ConsumerConfig,
        store: StreamStore,
        state: ConsumerState,
        state_store: ConsumerStateStore | None = None,
        retention: RetentionListener | None = None,
        record_ops: bool = False,
        domain: str | None = None,
        account: str = "_",
        flow_window_msgs: int = FLOW_WINDOW_MSGS,
    ) -> None:
        invariant(config.consumer_name in (None, name), "config names another consumer")
        self.stream = stream
        self.name = name
        self._config = config
        self._store = store
        self._state = state
        self._state_store = state_store
        self._retention = retention
        self._record_ops = record_ops
        self._domain = domain
        self._account = account
        self._flow_window_msgs = flow_window_msgs
        self._outbox: list[ConsumerOp] = []
        # The Deliver op being built at the end of the outbox: (now_ns, its sequences).
        self._deliver_run: tuple[int, list[int]] | None = None
        self._advisories: deque[Event] = deque(maxlen=ADVISORIES_MAX)
        self._heap: list[tuple[int, int]] = []
        self._dirty: set[int] = set()
        self._meta_dirty = False
        self._config_dirty = False
        self._clear_pending = False
        self._pending_cache: tuple[tuple[int, int, int], int] | None = None
        self._waiting = WaitingQueue(max_waiting=config.max_waiting)
        self._push = self._new_planner()
        self._last_active_ns = 0
        # JetStream's delivered.last_active and ack_floor.last_active: the times of the last
        # Deliver and Ack ops applied (each op carries the leader's time, so every replica
        # agrees); kept in memory only.
        self._last_delivered_ns = 0
        self._last_acked_ns = 0
        self._deleted = False
        # A scan of the stream for new messages, live only inside one serving call (see
        # ``_scanning``): one read transaction per chunk instead of one per message.
        self._scan: Iterator[StoredMsg] | None = None
        self._scan_peek: StoredMsg | None = None
        self._scan_live = False
        self._rebuild_heap()

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        stream: str,
        name: str,
        config: ConsumerConfig,
        store: StreamStore,
        now_ns: int,
        state_store: ConsumerStateStore | None = None,
        retention: RetentionListener | None = None,
        record_ops: bool = False,
        flow_window_msgs: int = FLOW_WINDOW_MSGS,
    ) -> Consumer:
        """A new consumer positioned by its deliver policy; its config is persisted.

        ``flow_window_msgs``: with flow control, messages sent between flow-control requests.
        """
        c = cls(
            stream=stream,
            name=name,
            config=config,
            store=store,
            state=ConsumerState(),
            state_store=state_store,
            retention=retention,
            record_ops=record_ops,
            flow_window_msgs=flow_window_msgs,
        )
        c._config_dirty = True  # written with the start state, in one transaction
        c._commit(start_op(config, store))
        if config.pause_until:  # one already past pauses nothing, and info shows it
            c._commit(Pause(until_ns=config.pause_until))
        c._last_active_ns = now_ns
        c.flush()
        return c

    @classmethod
    def open(
        cls,
        *,
        stream: str,
        name: str,
        store: StreamStore,
        state_store: ConsumerStateStore,
        retention: RetentionListener | None = None,
        record_ops: bool = False,
    ) -> Consumer:
        """Reopen a consumer from its persisted config and state (``NotFoundError`` if none)."""
        key = ConsumerKey(stream=stream, consumer=name)
        found = state_store.load(key)
        if found is None:
            raise NotFoundError(f"consumer {name!r} of stream {stream!r} not found")
        config, state = found
        return cls(
            stream=stream,
            name=name,
            config=config,
            store=store,
            state=state,
            state_store=state_store,
            retention=retention,
            record_ops=record_ops,
        )

    @property
    def key(self) -> ConsumerKey:
        return ConsumerKey(stream=self.stream, consumer=self.name)

    @property
    def config(self) -> ConsumerConfig:
        return self._config

    @property
    def state(self) -> ConsumerState:
        """The live replicated state (owned by this consumer: read, never mutate)."""
        return self._state

    def _new_planner(self) -> PushPlanner:
        cfg = self._config
        return PushPlanner(
            fc_prefix=f"$JS.FC.{self.stream}.{self.name}",
            idle_heartbeat_ns=cfg.idle_heartbeat,
            flow_control=cfg.flow_control,
            rate_limit_bps=cfg.rate_limit_bps,
            replay_original=cfg.replay_policy is ReplayPolicy.ORIGINAL,
            flow_window_msgs=self._flow_window_msgs,
        )

    # -- applying ops ---------------------------------------------------------------------

    def apply(self, op: ConsumerOp) -> list[Event]:
        """Apply a replicated op (a follower's path); persists unless inside ``apply_many``."""
        events = self._apply(op)
        self.flush()
        return events

    def apply_many(self, ops: Iterable[ConsumerOp]) -> list[Event]:
        """Apply ops in order and persist once (one state-store write)."""
        events: list[Event] = []
        for op in ops:
            events.extend(self._apply(op))
        self.flush()
        return events

    def _apply(self, op: ConsumerOp) -> list[Event]:
        self._check_live()
        changes = Changes()
        fresh = self._fresh_count(op)
        apply_op(self._state, self._config, op, changes)
        if isinstance(op, Deliver):
            self._last_delivered_ns = max(self._last_delivered_ns, op.now_ns)
        elif isinstance(op, Ack):
            self._last_acked_ns = max(self._last_acked_ns, op.now_ns)
        if fresh is None:
            self._pending_cache = None
        elif fresh and self._pending_cache is not None:
            # Each new delivery moved the cursor past exactly one undelivered message.
            key, count = self._pending_cache
            self._pending_cache = (key, count - fresh)
        self._meta_dirty = True
        if changes.reset:
            self._clear_pending = True
            self._dirty.clear()
            self._rebuild_heap()
        else:
            pending = self._state.pending
            if self._state_store is not None:
                # Only ``flush`` reads (and clears) it: without a store it would only grow.
                self._dirty.update(changes.dirty)
            for seq in changes.dirty:
                p = pending.get(seq)
                if p is not None:
                    heapq.heappush(self._heap, (p.deadline_ns, seq))
            if len(self._heap) > 2 * len(pending) + HEAP_SLACK_ENTRIES:
                self._rebuild_heap()  # renewals (+WPI, -NAK) left too many stale entries
        self._advisories.extend(changes.events)
        if self._retention is not None and (changes.settled or changes.reset):
            self._retention.released(self, changes.settled, rescan=changes.reset)
        return changes.events

    def _fresh_count(self, op: ConsumerOp) -> int | None:
        """New deliveries in ``op`` (0 for ops that leave num_pending alone); None when the
        op may move the cursor otherwise, so the num_pending cache must go."""
        if self._state.lps_queue:
            return None
        if isinstance(op, Deliver):
            pending = self._state.pending
            return sum(1 for s in op.stream_seqs if s not in pending)
        if isinstance(op, Ack | Nak | Progress | Term | MaxDelivered):
            return 0
        return None

    def _commit(self, op: ConsumerOp) -> None:
        """Leader path: apply now and keep the op for replication."""
        self._apply(op)
        if not self._record_ops:
            return
        if isinstance(op, Deliver):
            # Consecutive deliveries at one instant merge into one op: applying
            # Deliver(a, b) is by construction the same as Deliver(a) then Deliver(b). The
            # run is a list until taken (one op per batch, not one rebuilt per message).
            run = self._deliver_run
            if run is not None and run[0] == op.now_ns:
                run[1].extend(op.stream_seqs)
                return
            self._close_deliver_run()
            self._deliver_run = (op.now_ns, list(op.stream_seqs))
            return
        self._close_deliver_run()
        self._outbox_append(op)

    def _close_deliver_run(self) -> None:
        """Put the Deliver op being built, if any, in the outbox (keeping op order)."""
        run = self._deliver_run
        if run is not None:
            self._deliver_run = None
            self._outbox_append(Deliver(stream_seqs=tuple(run[1]), now_ns=run[0]))

    def _outbox_append(self, op: ConsumerOp) -> None:
        invariant(len(self._outbox) < OUTBOX_OPS_MAX, "consumer op outbox overflow")
        self._outbox.append(op)

    def take_ops(self) -> list[ConsumerOp]:
        """The ops the leader applied since the last call, in order, for replication."""
        self._close_deliver_run()
        out, self._outbox = self._outbox, []
        return out

    def drain_advisories(self) -> list[Event]:
        """Advisories recorded since the last call (the newest ``ADVISORIES_MAX`` kept)."""
        out = list(self._advisories)
        self._advisories.clear()
        return out

    def flush(self) -> None:
        """Persist what changed since the last flush (one state-store write), if anything."""
        if self._state_store is None:
            return
        if not (self._meta_dirty or self._dirty or self._config_dirty):
            return
        pending = self._state.pending
        if self._clear_pending:
            upserts = dict(pending)
            deletes: list[int] = []
        else:
            upserts = {s: pending[s] for s in self._dirty if s in pending}
            deletes = [s for s in self._dirty if s not in pending]
        self._state_store.write(
            self.key,
            state=self._state,
            upserts=upserts,
            deletes=deletes,
            clear=self._clear_pending,
            config=self._config if self._config_dirty else None,
        )
        self._dirty.clear()
        self._meta_dirty = False
        self._config_dirty = False
        self._clear_pending = False

    def _rebuild_heap(self) -> None:
        self._heap = [(p.deadline_ns, s) for s, p in self._state.pending.items()]
        heapq.heapify(self._heap)

    def _check_live(self) -> None:
        if self._deleted:
            raise PreconditionError(f"consumer {self.name!r} was deleted")

    # -- choosing what to deliver ---------------------------------------------------------

    def is_paused(self, now_ns: int) -> bool:
        return self._state.paused_until_ns > now_ns

    def _eligible_redelivery(self, now_ns: int) -> int | None:
        heap = self._heap
        pending = self._state.pending
        while heap:
            deadline, seq = heap[0]
            p = pending.get(seq)
            if p is None or p.deadline_ns != deadline:
                heapq.heappop(heap)  # stale: settled, or renewed with a later entry
                continue
            return seq if deadline <= now_ns else None
        return None

    def _load(self, seq: int) -> StoredMsg | None:
        try:
            return self._store.load(seq)
        except NotFoundError:
            return None

    def _candidate(self, now_ns: int) -> StoredMsg | None:
        """The next message to hand out at ``now_ns``, not yet consumed (None: nothing).

        May commit MaxDelivered/Gone ops for pending messages it finds exhausted or gone.
        """
        max_deliver = self._config.max_deliver
        while (seq := self._eligible_redelivery(now_ns)) is not None:
            p = self._state.pending[seq]
            if max_deliver != UNLIMITED and p.deliveries >= max_deliver:
                self._commit(MaxDelivered(stream_seq=seq))
                continue
            msg = self._load(seq)
            if msg is None:
                self._commit(Gone(stream_seqs=(seq,)))
                continue
            return msg
        cap = self._config.max_ack_pending
        if cap != UNLIMITED and len(self._state.pending) >= cap:
            return None
        return self._next_new()

    def _next_new(self) -> StoredMsg | None:
        state = self._state
        while state.lps_queue:
            msg = self._load(state.lps_queue[0])
            if msg is not None:
                return msg
            self._commit(Gone(stream_seqs=(state.lps_queue[0],)))
        return self._new_from(state.delivered_stream_seq + 1)

    def _new_from(self, start: int) -> StoredMsg | None:
        """The first message at or after ``start`` that passes the filters (None: none)."""
        filters = self._config.filters
        if self._scan_live and len(filters) == 1:
            return self._scan_next(start, filters[0])
        best: StoredMsg | None = None
        for f in filters:
            msg = self._store.load_next(f, start)
            if msg is not None and (best is None or msg.seq < best.seq):
                best = msg
        return best

    def _scan_next(self, start: int, subject_filter: str) -> StoredMsg | None:
        """The first message at or after ``start`` from the call's scan (created lazily).

        Sound within one call: the cursor only grows, and the only store writes meanwhile
        are retention removals of messages this consumer already settled.
        """
        if self._scan is None:
            head = self._waiting.head()  # a pull's batch is about what it takes
            expect = head.remaining_msgs if head is not None else 0
            self._scan = self._store.iter_from(start, subject_filter, expect=expect)
            self._scan_peek = None
        while self._scan_peek is None or self._scan_peek.seq < start:
            self._scan_peek = next(self._scan, None)
            if self._scan_peek is None:
                return None
        return self._scan_peek

    @contextmanager
    def _scanning(self) -> Iterator[None]:
        self._scan_live = True
        try:
            yield
        finally:
            self._scan_live = False
            self._scan = None
            self._scan_peek = None

    def _hand_out(self, msg: StoredMsg, now_ns: int) -> Delivery:
        """Commit the delivery of ``msg`` and describe it for the client."""
        self._commit(Deliver(stream_seqs=(msg.seq,), now_ns=now_ns))
        p = self._state.pending.get(msg.seq)
        return Delivery(
            stream=self.stream,
            consumer=self.name,
            msg=msg,
            consumer_seq=p.consumer_seq if p else self._state.delivered_consumer_seq,
            deliveries=p.deliveries if p else 1,
            num_pending=self._pending_cache[1] if self._pending_cache else self.num_pending(),
            headers_only=self._config.headers_only,
            domain=self._domain,
            account=self._account,
        )

    def num_pending(self) -> int:
        """Messages matching the filters not delivered yet (exact; cached while the stream
        and the cursor move only by this consumer's own deliveries)."""
        st = self._store.state()
        key = (st.first_seq, st.last_seq, st.msgs)
        if self._pending_cache is not None and self._pending_cache[0] == key:
            return self._pending_cache[1]
        state = self._state
        count = len(state.lps_queue)
        start = (state.lps_end if state.lps_queue else state.delivered_stream_seq) + 1
        count += sum(self._store.num_pending(start, f) for f in self._config.filters)
        self._pending_cache = (key, count)
        return count

    # -- pull ---------------------------------------------------------------------------------

    def pull(self, request: PullRequest, now_ns: int) -> list[PullEvent]:
        """Take a pull request: answer it at once where possible, else queue it.

        Returns the events to send now (for this and other waiting requests). A request that
        breaks a limit is answered with a 409 and never queued.
        """
        self._check_live()
        self._last_active_ns = now_ns
        refusal = self._refuse(request)
        if refusal is not None:
            w = WaitingRequest.start(request, now_ns)
            return [w.status(StatusCode.CONFLICT, refusal)]
        events = self._waiting.expire(now_ns)
        if self._waiting.full:
            w = WaitingRequest.start(request, now_ns)
            return [*events, w.status(StatusCode.CONFLICT, "Exceeded MaxWaiting")]
        self._waiting.add(WaitingRequest.start(request, now_ns))
        events.extend(self._serve(now_ns))
        self.flush()
        return events

    def _refuse(self, request: PullRequest) -> str | None:
        cfg = self._config
        if not cfg.is_pull:
            return "Consumer is push based"
        if cfg.max_batch and request.batch > cfg.max_batch:
            return f"Exceeded MaxRequestBatch of {cfg.max_batch}"
        if cfg.max_expires and (request.expires == 0 or request.expires > cfg.max_expires):
            return f"Exceeded MaxRequestExpires of {cfg.max_expires}ns"
        # As JetStream: a request must carry expires under max_expires, while max_bytes
        # only caps requests that ask for a byte limit.
        if cfg.max_bytes and request.max_bytes > cfg.max_bytes:
            return f"Exceeded MaxRequestMaxBytes of {cfg.max_bytes}"
        return None

    def poll(self, now_ns: int) -> list[PullEvent]:
        """Serve waiting requests at ``now_ns``: new messages, redeliveries that fell due,
        expiries (408) and idle heartbeats (100). Call on new messages, acks and timers."""
        self._check_live()
        events = self._waiting.expire(now_ns)
        events.extend(self._serve(now_ns))
        self.flush()
        return events

    def _serve(self, now_ns: int) -> list[PullEvent]:
        events: list[PullEvent] = []
        q = self._waiting
        paused = self.is_paused(now_ns)
        if not paused and len(q):
            self.num_pending()  # validate the cache once; deliveries then keep it exact
            with self._scanning():
                self._fill(now_ns, events)
        events.extend(q.finish_no_wait())
        s = self._state
        events.extend(q.heartbeats(now_ns, s.delivered_consumer_seq, s.delivered_stream_seq))
        return events

    def _fill(self, now_ns: int, events: list[PullEvent]) -> None:
        """Hand messages to waiting requests, round-robin, while there are any."""
        q = self._waiting
        while (w := q.head()) is not None:
            if self._fill_new(now_ns, events):
                continue
            msg = self._candidate(now_ns)
            if msg is None:
                break
            if w.request.max_bytes and msg.size > w.remaining_bytes:
                q.pop_head()
                events.append(w.status(StatusCode.CONFLICT, "Message Size Exceeds MaxBytes"))
                continue
            d = self._hand_out(msg, now_ns)
            w.took(msg.size, now_ns)
            events.append(PullEvent(reply=w.request.reply, delivery=d))
            if w.done:
                q.pop_head()
            else:
                q.rotate()

    def _fill_new(self, now_ns: int, events: list[PullEvent]) -> bool:
        """Hand out a run of new messages to the waiting requests, round-robin, as ONE
        Deliver op; True when it answered anything (deliveries, or a request finished with
        409), False when it did nothing: no new message, a redelivery is due or the
        consumer still owes last-per-subject messages (those go one by one through
        ``_candidate``).

        The same decisions as ``_candidate`` + ``_hand_out`` per message, made without
        applying each delivery first: while no redelivery is due at ``now_ns``, a new
        delivery changes only what this run tracks itself (the cursor, the next consumer
        sequence, num_pending, the room under ``max_ack_pending``), and makes no redelivery
        due (its deadline is ``now_ns`` plus a positive ack wait). Applying one op for the
        run instead of one per message is most of the cost of a fetch on the leader.
        """
        state = self._state
        if state.lps_queue or self._eligible_redelivery(now_ns) is not None:
            return False
        cfg = self._config
        track = cfg.acks_required
        # As ``_candidate``: no new message while max_ack_pending are pending.
        capped = cfg.max_ack_pending != UNLIMITED
        room = cfg.max_ack_pending - len(state.pending)
        if capped and room <= 0:
            return False
        cache = self._pending_cache
        pending_left = cache[1] if cache is not None else self.num_pending()
        q = self._waiting
        events_before = len(events)
        seqs: list[int] = []
        cseq = state.delivered_consumer_seq
        start = state.delivered_stream_seq + 1
        stream, name, account, domain = self.stream, self.name, self._account, self._domain
        headers_only = cfg.headers_only
        while (not capped or room > 0) and (w := q.head()) is not None:
            msg = self._new_from(start)
            if msg is None:
                break
            size = 0  # counted only against a request's max_bytes (``WaitingRequest.took``)
            if w.request.max_bytes:
                size = msg.size
                if size > w.remaining_bytes:
                    q.pop_head()
                    events.append(w.status(StatusCode.CONFLICT, "Message Size Exceeds MaxBytes"))
                    continue
            seqs.append(msg.seq)
            cseq += 1
            pending_left -= 1
            events.append(
                delivery_event(
                    w.request.reply,
                    stream=stream,
                    consumer=name,
                    msg=msg,
                    consumer_seq=cseq,
                    deliveries=1,
                    num_pending=pending_left,
                    headers_only=headers_only,
                    domain=domain,
                    account=account,
                )
            )
            w.took(size, now_ns)
            if w.done:
                q.pop_head()
            else:
                q.rotate()
            start = msg.seq + 1
            if track:
                room -= 1
        if seqs:
            self._commit(Deliver(stream_seqs=tuple(seqs), now_ns=now_ns))
            invariant(
                state.delivered_consumer_seq == cseq, "a run of new deliveries took its sequences"
            )
        return len(events) > events_before

    def cancel_pull(self, reply: str) -> bool:
        """The requester of ``reply`` went away (a cancelled call, a client gone): drop its
        request, unanswered, so it neither counts toward ``max_waiting`` nor takes more
        messages (JetStream drops a request whose requester left). True when one was
        waiting; False when it had finished already.

        Waiting requests are leader-local, so this records no op: the replicated state is
        unchanged. Messages already handed to the request stay delivered and unacked, and
        are redelivered after ``ack_wait`` like any delivery the client never got."""
        return self._waiting.remove(reply) is not None

    def fetch(self, batch: int, now_ns: int, *, max_bytes: int = 0) -> list[Delivery]:
        """A no_wait pull of up to ``batch`` messages; just the deliveries."""
        req = PullRequest(batch=batch, no_wait=True, max_bytes=max_bytes, reply="fetch")
        return [e.delivery for e in self.pull(req, now_ns) if e.delivery is not None]

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def next_wake_ns(self, now_ns: int) -> int:
        """The earliest time after ``now_ns`` a timer should call ``poll`` (or ``push_step``):
        a request expiry or heartbeat, an ack deadline, the end of a pause; 0 when none.

        The deadline heap may hold a stale entry, so a wake may find nothing to do.
        """
        times = [self._waiting.next_wake_ns()] if len(self._waiting) else []
        times.extend(t for t, _ in self._heap[:1])
        times.append(self._state.paused_until_ns)
        return min((t for t in times if t > now_ns), default=0)

    # -- push ---------------------------------------------------------------------------------

    def push_step(self, now_ns: int, *, max_msgs: int = 256) -> PushStep:
        """What a push consumer sends now (see ``consumer_push``): at most ``max_msgs``."""
        self._check_live()
        if self._config.is_pull:
            raise PreconditionError("push_step on a pull consumer")
        plan = self._push
        self.num_pending()  # validate the cache once; deliveries then keep it exact
        with self._scanning():
            out, wake, fc = self._push_fill(now_ns, max_msgs)
        s = self._state
        hb: Heartbeat | None = None
        if not out:
            hb = plan.heartbeat_due(now_ns, s.delivered_consumer_seq, s.delivered_stream_seq)
        times = [t for t in (wake, plan.next_heartbeat_ns(), self.next_wake_ns(now_ns)) if t]
        self.flush()
        return PushStep(
            deliveries=tuple(out), flow_control=fc, heartbeat=hb, wake_at_ns=min(times, default=0)
        )

    def _push_fill(self, now_ns: int, max_msgs: int) -> tuple[list[Delivery], int, str | None]:
        """Deliveries allowed now, the time to wake for more (0: none), and a flow-control
        request when the window filled up."""
        out: list[Delivery] = []
        plan = self._push
        while not self.is_paused(now_ns) and len(out) < max_msgs:
            blocked = plan.blocked_until(now_ns)
            if blocked is not None:
                return out, blocked, None
            msg = self._candidate(now_ns)
            if msg is None:
                break
            at = plan.replay_at(msg.ts, now_ns) if msg.seq not in self._state.pending else now_ns
            if at > now_ns:
                return out, at, None
            out.append(self._hand_out(msg, now_ns))
            plan.sent(msg.size, now_ns)
            fc = plan.flow_control_due()
            if fc is not None:
                return out, 0, fc  # the window is used up: stall until the client answers
        return out, 0, None

    def flow_control_reply(self, reply: str) -> bool:
        """The client answered a flow-control request; True when delivery resumes."""
        return self._push.answer(reply)

    # -- acks ---------------------------------------------------------------------------------

    def ack(self, stream_seq: int, now_ns: int) -> None:
        """+ACK (ack policy all: everything at or below). Unknown or settled: harmless."""
        self.ack_many((stream_seq,), now_ns)

    def ack_many(self, stream_seqs: Sequence[int], now_ns: int) -> None:
        """+ACK of several sequences in one op and one state-store write."""
        self._check_live()
        self._last_active_ns = now_ns
        if self._config.acks_required and stream_seqs:
            self._commit(Ack(stream_seqs=tuple(stream_seqs), now_ns=now_ns))
            self.flush()

    def nak(
        self, stream_seq: int, now_ns: int, *, delay_ns: int = 0, consumer_seq: int = 0
    ) -> None:
        """-NAK: redeliver after ``delay_ns`` (0: at once). A ``consumer_seq`` that is not the
        latest delivery's makes this a late nak of an earlier delivery, ignored."""
        if delay_ns < 0:
            raise InvalidArgumentError("delay", "must not be negative (ns)")
        self._ack_op(
            Nak(stream_seq=stream_seq, now_ns=now_ns, delay_ns=delay_ns, consumer_seq=consumer_seq),
            now_ns,
        )

    def progress(self, stream_seq: int, now_ns: int, *, consumer_seq: int = 0) -> None:
        """+WPI: the ack deadline restarts from ``now_ns``; repeatable."""
        self._ack_op(
            Progress(stream_seq=stream_seq, now_ns=now_ns, consumer_seq=consumer_seq), now_ns
        )

    def term(self, stream_seq: int, now_ns: int, *, reason: str = "") -> None:
        """+TERM: never redeliver; records a TERMINATED advisory with ``reason``."""
        self._ack_op(Term(stream_seq=stream_seq, reason=reason), now_ns)

    def _ack_op(self, op: ConsumerOp, now_ns: int) -> None:
        self._check_live()
        self._last_active_ns = now_ns
        if self._config.acks_required:
            self._commit(op)
            self.flush()

    def process_ack(
        self, subject: str, payload: bytes, now_ns: int, *, reply: str = ""
    ) -> list[PullEvent]:
        """Handle an ack published to an ack token; returns events for +NXT's pull request.

        Raises ``InvalidArgumentError`` for a malformed token or payload, or a token naming
        another stream or consumer.
        """
        meta = parse_ack_subject(subject)
        if meta.stream != self.stream or meta.consumer != self.name:
            raise InvalidArgumentError("ack_subject", "names another stream or consumer")
        cmd = parse_ack_payload(payload)
        seq, cseq = meta.stream_seq, meta.consumer_seq
        if cmd.kind is AckKind.NAK:
            self.nak(seq, now_ns, delay_ns=cmd.delay_ns, consumer_seq=cseq)
        elif cmd.kind is AckKind.PROGRESS:
            self.progress(seq, now_ns, consumer_seq=cseq)
        elif cmd.kind is AckKind.TERM:
            self.term(seq, now_ns, reason=cmd.reason)
        else:
            self.ack(seq, now_ns)
        if cmd.kind is AckKind.NEXT:
            return self.pull(PullRequest.from_dict(cmd.next_request or {}, reply=reply), now_ns)
        return []

    # -- control ------------------------------------------------------------------------------

    def pause(self, until_ns: int) -> None:
        """Deliver nothing until ``until_ns`` (waiting requests stay, heartbeats continue)."""
        self._check_live()
        self._commit(Pause(until_ns=until_ns))
        self.flush()

    def resume(self) -> None:
        self.pause(0)

    def reset(self, stream_seq: int = 0) -> int:
        """Start over from ``stream_seq`` (0: just above the ack floor); returns the sequence.

        Pending acks are dropped; messages from the sequence on are delivered again as new.
        """
        self._check_live()
        seq = stream_seq or self._state.ack_floor_stream_seq + 1
        if seq < 1:
            raise InvalidArgumentError("seq", "must be at least 1")
        self._commit(Reset(stream_seq=seq))
        self.flush()
        return seq

    def update_config(self, config: ConsumerConfig) -> None:
        """Adopt an allowed update (validated by the caller with ``check_update``).

        A ``pause_until`` other than the pause in force pauses (or, 0 or past, resumes) the
        consumer, as JetStream's update does: in a cluster the pause and resume requests
        are such updates, so the config always shows the pause. Every replica applies the
        same update, so nothing here reads a clock."""
        self._check_live()
        if config.pause_until != self._state.paused_until_ns:
            self._apply(Pause(until_ns=config.pause_until))
        self._config = config
        # The filters may have changed: num_pending's cache is keyed on the stream only.
        self._pending_cache = None
        self._push = self._new_planner()
        self._config_dirty = True
        self.flush()

    def leadership_lost(self) -> list[PullEvent]:
        """This replica stops leading: waiting requests get 409 Leadership Change."""
        self._push = self._new_planner()
        return self._waiting.drain("Leadership Change")

    def delete(self) -> list[PullEvent]:
        """Delete the consumer: waiting requests get 409 Consumer Deleted, state is removed,
        and retention releases its holds. Later calls raise ``PreconditionError``."""
        self._check_live()
        events = self._waiting.drain("Consumer Deleted")
        self._deleted = True
        if self._state_store is not None:
            self._state_store.remove(self.key)
        if self._retention is not None:
            self._retention.released(self, [], rescan=True)
        return events

    @property
    def deleted(self) -> bool:
        return self._deleted

    def is_inactive(self, now_ns: int) -> bool:
        """True when ``inactive_threshold`` (an ephemeral's default, or one a durable set)
        passed with no request or ack."""
        threshold = self._config.inactive_threshold
        if not threshold or len(self._waiting):
            return False
        return now_ns - self._last_active_ns >= threshold

    # -- reading ------------------------------------------------------------------------------

    def matches(self, subject: str) -> bool:
        """True when a message on ``subject`` passes this consumer's filters."""
        return any(subject_matches(f, subject) for f in self._config.filters)

    def needs_ack(self, stream_seq: int) -> bool:
        """True while this consumer holds ``stream_seq`` (see ``ConsumerState.needs_ack``)."""
        return not self._deleted and self._state.needs_ack(stream_seq)

    def info(self, now_ns: int) -> ConsumerInfo:
        s = self._state
        return ConsumerInfo(
            stream=self.stream,
            name=self.name,
            config=self._config,
            delivered=SequenceInfo(
                consumer_seq=s.delivered_consumer_seq,
                stream_seq=s.delivered_stream_seq,
                last_active_ns=self._last_delivered_ns,
            ),
            ack_floor=SequenceInfo(
                consumer_seq=s.ack_floor_consumer_seq,
                stream_seq=s.ack_floor_stream_seq,
                last_active_ns=self._last_acked_ns,
            ),
            num_ack_pending=len(s.pending),
            num_redelivered=s.num_redelivered(),
            num_waiting=len(self._waiting),
            num_pending=self.num_pending(),
            paused=self.is_paused(now_ns),
            pause_remaining_ns=max(0, s.paused_until_ns - now_ns),
        )
