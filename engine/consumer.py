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

Layout (issue 34): this module keeps the ``Consumer`` itself (construction, applying ops,
acks, control); the leader's op outbox is in ``consumer_outbox.py``, the marks of what to
persist and the write that persists them in ``consumer_persist.py``, the delivery decisions
in ``consumer_deliver.py``, serving pull requests, push steps and published acks in
``consumer_serve.py``, the info values in ``consumer_info.py`` (``ConsumerInfo`` and
``SequenceInfo`` are re-exported here), the push plan in ``consumer_push.py``.

Threading: a consumer belongs to one thread (the node's apply thread); it is not thread-safe.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_info import ConsumerInfo, SequenceInfo, consumer_info
from raftstream.engine.consumer_outbox import OpOutbox
from raftstream.engine.consumer_persist import StateWriter
from raftstream.engine.consumer_pull import (
    Delivery,
    PullEvent,
    PullRequest,
    StatusCode,
    WaitingQueue,
    WaitingRequest,
)
from raftstream.engine.consumer_push import FLOW_WINDOW_MSGS, PushStep, new_planner
from raftstream.engine.consumer_serve import fill_new, process_ack, push_step, refusal, serve
from raftstream.engine.consumer_start import start_op
from raftstream.engine.consumer_state import (
    Ack,
    Changes,
    ConsumerOp,
    ConsumerState,
    Deliver,
    Event,
    Nak,
    Pause,
    Progress,
    Reset,
    Term,
    apply_op,
    fresh_deliveries,
)
from raftstream.engine.consumer_store import ConsumerKey, ConsumerStateStore
from raftstream.engine.store import StoredMsg, StreamStore
from raftstream.engine.subjects import subject_matches
from raftstream.errors import InvalidArgumentError, NotFoundError, PreconditionError, invariant

__all__ = ["ADVISORIES_MAX", "Consumer", "ConsumerInfo", "RetentionListener", "SequenceInfo"]

ADVISORIES_MAX = 1024
HEAP_SLACK_ENTRIES = 1024  # stale deadline entries tolerated before the heap is rebuilt


class RetentionListener(Protocol):
    """Told when a consumer may have released messages (see ``engine/retention.py``)."""

    def released(self, consumer: Consumer, stream_seqs: Sequence[int], *, rescan: bool) -> None:
        """``stream_seqs`` are no longer held by ``consumer``; ``rescan``: its holds moved
        wholesale (start/reset), so every message may need a fresh look."""


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
        self._retention = retention
        self._record_ops = record_ops
        self._domain = domain
        self._account = account
        self._flow_window_msgs = flow_window_msgs
        self._outbox = OpOutbox()
        self._writer = None if state_store is None else StateWriter(state_store, self.key)
        self._advisories: deque[Event] = deque(maxlen=ADVISORIES_MAX)
        self._heap: list[tuple[int, int]] = []
        self._pending_cache: tuple[tuple[int, int, int], int] | None = None
        self._waiting = WaitingQueue(max_waiting=config.max_waiting)
        self._push = new_planner(self.stream, self.name, self._config, self._flow_window_msgs)
        self._last_active_ns = 0
        # JetStream's delivered.last_active and ack_floor.last_active: the times of the last
        # Deliver and Ack ops applied (each op carries the leader's time, so every replica
        # agrees); kept in memory only.
        self._last_delivered_ns = 0
        self._last_acked_ns = 0
        self._deleted = False
        # A scan of the stream for new messages, live only inside one serving call (see
        # ``consumer_deliver.scanning``): one read transaction per chunk, not one per message.
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
        if c._writer is not None:
            c._writer.config_changed()  # written with the start state, in one transaction
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
        fresh = fresh_deliveries(self._state, op)
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
        if changes.reset:
            if self._writer is not None:
                self._writer.reset()
            self._rebuild_heap()
        else:
            pending = self._state.pending
            if self._writer is not None:
                self._writer.changed(changes.dirty)
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

    def _commit(self, op: ConsumerOp) -> None:
        """Leader path: apply now and keep the op for replication."""
        self._apply(op)
        if self._record_ops:
            self._outbox.put(op)

    def take_ops(self) -> list[ConsumerOp]:
        """The ops the leader applied since the last call, in order, for replication."""
        return self._outbox.take()

    def drain_advisories(self) -> list[Event]:
        """Advisories recorded since the last call (the newest ``ADVISORIES_MAX`` kept)."""
        out = list(self._advisories)
        self._advisories.clear()
        return out

    def flush(self) -> None:
        """Persist what changed since the last flush (one state-store write), if anything."""
        if self._writer is not None:
            self._writer.flush(self._state, self._config)

    def _rebuild_heap(self) -> None:
        self._heap = [(p.deadline_ns, s) for s, p in self._state.pending.items()]
        heapq.heapify(self._heap)

    def _check_live(self) -> None:
        if self._deleted:
            raise PreconditionError(f"consumer {self.name!r} was deleted")

    # -- choosing what to deliver ---------------------------------------------------------

    def is_paused(self, now_ns: int) -> bool:
        return self._state.paused_until_ns > now_ns

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

    # The run of new deliveries (``consumer_serve.fill_new``), bound as a method: the serving
    # loop reaches it as ``_fill_new``, which a test's oracle overrides to switch runs off.
    _fill_new = fill_new

    def pull(self, request: PullRequest, now_ns: int) -> list[PullEvent]:
        """Take a pull request: answer it at once where possible, else queue it.

        Returns the events to send now (for this and other waiting requests). A request that
        breaks a limit is answered with a 409 and never queued.
        """
        self._check_live()
        self._last_active_ns = now_ns
        refused = refusal(self._config, request)
        if refused is not None:
            w = WaitingRequest.start(request, now_ns)
            return [w.status(StatusCode.CONFLICT, refused)]
        events = self._waiting.expire(now_ns)
        if self._waiting.full:
            w = WaitingRequest.start(request, now_ns)
            return [*events, w.status(StatusCode.CONFLICT, "Exceeded MaxWaiting")]
        self._waiting.add(WaitingRequest.start(request, now_ns))
        events.extend(serve(self, now_ns))
        self.flush()
        return events

    def poll(self, now_ns: int) -> list[PullEvent]:
        """Serve waiting requests at ``now_ns``: new messages, redeliveries that fell due,
        expiries (408) and idle heartbeats (100). Call on new messages, acks and timers."""
        self._check_live()
        events = self._waiting.expire(now_ns)
        events.extend(serve(self, now_ns))
        self.flush()
        return events

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
        return push_step(self, now_ns, max_msgs)

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
        return process_ack(self, subject, payload, now_ns, reply)

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
        self._push = new_planner(self.stream, self.name, self._config, self._flow_window_msgs)
        if self._writer is not None:
            self._writer.config_changed()
        self.flush()

    def leadership_lost(self) -> list[PullEvent]:
        """This replica stops leading: waiting requests get 409 Leadership Change."""
        self._push = new_planner(self.stream, self.name, self._config, self._flow_window_msgs)
        return self._waiting.drain("Leadership Change")

    def delete(self) -> list[PullEvent]:
        """Delete the consumer: waiting requests get 409 Consumer Deleted, state is removed,
        and retention releases its holds. Later calls raise ``PreconditionError``."""
        self._check_live()
        events = self._waiting.drain("Consumer Deleted")
        self._deleted = True
        if self._writer is not None:
            self._writer.remove()
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
        return consumer_info(self, now_ns)
