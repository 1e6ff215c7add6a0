"""The leader serving a consumer's clients: waiting pull requests, push steps, acks.

``Consumer.pull``/``poll`` queue requests and call ``serve``; ``fill`` hands messages to the
waiting requests round-robin, a run of new messages at a time (``fill_new``: ONE Deliver op
per run) or one by one (redeliveries, last-per-subject messages) through the delivery
decisions of ``consumer_deliver.py``. ``push_step`` is what a push consumer sends now.
``process_ack`` handles an ack published to an ack token.

These were the ``Consumer``'s own methods (``_serve``, ``_fill``, ``_fill_new``,
``push_step``...; moved here from ``consumer.py`` for issue 34): functions over one
consumer's state, the consumer first, on its one thread. ``fill_new`` is still reached as the
method ``Consumer._fill_new`` (a test's oracle switches runs off by overriding it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftstream.engine.ack import AckKind, parse_ack_payload, parse_ack_subject
from raftstream.engine.consumer_config import UNLIMITED, ConsumerConfig
from raftstream.engine.consumer_deliver import (
    candidate,
    eligible_redelivery,
    hand_out,
    new_from,
    scanning,
)
from raftstream.engine.consumer_pull import (
    Delivery,
    PullEvent,
    PullRequest,
    StatusCode,
    delivery_event,
)
from raftstream.engine.consumer_push import Heartbeat, PushStep
from raftstream.engine.consumer_state import Deliver
from raftstream.errors import InvalidArgumentError, PreconditionError, invariant

if TYPE_CHECKING:
    from raftstream.engine.consumer import Consumer

__all__ = [
    "fill",
    "fill_new",
    "process_ack",
    "push_fill",
    "push_step",
    "refusal",
    "run_room",
    "serve",
]


# -- pull ---------------------------------------------------------------------------------


def refusal(cfg: ConsumerConfig, request: PullRequest) -> str | None:
    """Why ``cfg`` refuses ``request`` at once (a 409's description), None when it may wait."""
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


def serve(c: Consumer, now_ns: int) -> list[PullEvent]:
    events: list[PullEvent] = []
    q = c._waiting
    paused = c.is_paused(now_ns)
    if not paused and len(q):
        c.num_pending()  # validate the cache once; deliveries then keep it exact
        with scanning(c):
            fill(c, now_ns, events)
    events.extend(q.finish_no_wait())
    s = c._state
    events.extend(q.heartbeats(now_ns, s.delivered_consumer_seq, s.delivered_stream_seq))
    return events


def fill(c: Consumer, now_ns: int, events: list[PullEvent]) -> None:
    """Hand messages to waiting requests, round-robin, while there are any."""
    q = c._waiting
    while (w := q.head()) is not None:
        if c._fill_new(now_ns, events):
            continue
        msg = candidate(c, now_ns)
        if msg is None:
            break
        if w.request.max_bytes and msg.size > w.remaining_bytes:
            q.pop_head()
            events.append(w.status(StatusCode.CONFLICT, "Message Size Exceeds MaxBytes"))
            continue
        d = hand_out(c, msg, now_ns)
        w.took(msg.size, now_ns)
        events.append(PullEvent(reply=w.request.reply, delivery=d))
        if w.done:
            q.pop_head()
        else:
            q.rotate()


def run_room(c: Consumer, now_ns: int) -> int | None:
    """The room under ``max_ack_pending`` for a run of new deliveries at ``now_ns`` (any
    number when uncapped); None when no run may start: the consumer still owes
    last-per-subject messages (those go one by one through ``candidate``), a redelivery is
    due, or, as in ``candidate``, max_ack_pending messages are pending.

    Why a run makes the same decisions as ``candidate`` + ``hand_out`` per message without
    applying each delivery first: while no redelivery is due at ``now_ns``, a new delivery
    changes only what the run tracks itself (the cursor, the next consumer sequence,
    num_pending, the room under ``max_ack_pending``), and makes no redelivery due (its
    deadline is ``now_ns`` plus a positive ack wait). Applying one op for the run instead
    of one per message is most of the cost of a fetch on the leader.
    """
    state = c._state
    if state.lps_queue or eligible_redelivery(c, now_ns) is not None:
        return None
    cap = c._config.max_ack_pending
    room = cap - len(state.pending)
    if cap != UNLIMITED and room <= 0:
        return None
    return room


def fill_new(c: Consumer, now_ns: int, events: list[PullEvent]) -> bool:
    """Hand out a run of new messages to the waiting requests, round-robin, as ONE
    Deliver op; True when it answered anything (deliveries, or a request finished with
    409), False when it did nothing: no new message, or no run may start (``run_room``).
    """
    room = run_room(c, now_ns)
    if room is None:
        return False
    state = c._state
    cfg = c._config
    track = cfg.acks_required
    capped = cfg.max_ack_pending != UNLIMITED
    cache = c._pending_cache
    pending_left = cache[1] if cache is not None else c.num_pending()
    q = c._waiting
    events_before = len(events)
    seqs: list[int] = []
    cseq = state.delivered_consumer_seq
    start = state.delivered_stream_seq + 1
    stream, name, account, domain = c.stream, c.name, c._account, c._domain
    headers_only = cfg.headers_only
    while (not capped or room > 0) and (w := q.head()) is not None:
        msg = new_from(c, start)
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
        c._commit(Deliver(stream_seqs=tuple(seqs), now_ns=now_ns))
        invariant(
            state.delivered_consumer_seq == cseq, "a run of new deliveries took its sequences"
        )
    return len(events) > events_before


# -- push ---------------------------------------------------------------------------------


def push_step(c: Consumer, now_ns: int, max_msgs: int) -> PushStep:
    """What a push consumer sends now (see ``consumer_push``): at most ``max_msgs``."""
    c._check_live()
    if c._config.is_pull:
        raise PreconditionError("push_step on a pull consumer")
    plan = c._push
    c.num_pending()  # validate the cache once; deliveries then keep it exact
    with scanning(c):
        out, wake, fc = push_fill(c, now_ns, max_msgs)
    s = c._state
    hb: Heartbeat | None = None
    if not out:
        hb = plan.heartbeat_due(now_ns, s.delivered_consumer_seq, s.delivered_stream_seq)
    times = [t for t in (wake, plan.next_heartbeat_ns(), c.next_wake_ns(now_ns)) if t]
    c.flush()
    return PushStep(
        deliveries=tuple(out), flow_control=fc, heartbeat=hb, wake_at_ns=min(times, default=0)
    )


def push_fill(c: Consumer, now_ns: int, max_msgs: int) -> tuple[list[Delivery], int, str | None]:
    """Deliveries allowed now, the time to wake for more (0: none), and a flow-control
    request when the window filled up."""
    out: list[Delivery] = []
    plan = c._push
    while not c.is_paused(now_ns) and len(out) < max_msgs:
        blocked = plan.blocked_until(now_ns)
        if blocked is not None:
            return out, blocked, None
        msg = candidate(c, now_ns)
        if msg is None:
            break
        at = plan.replay_at(msg.ts, now_ns) if msg.seq not in c._state.pending else now_ns
        if at > now_ns:
            return out, at, None
        out.append(hand_out(c, msg, now_ns))
        plan.sent(msg.size, now_ns)
        fc = plan.flow_control_due()
        if fc is not None:
            return out, 0, fc  # the window is used up: stall until the client answers
    return out, 0, None


# -- acks ---------------------------------------------------------------------------------


def process_ack(
    c: Consumer, subject: str, payload: bytes, now_ns: int, reply: str
) -> list[PullEvent]:
    """Handle an ack published to an ack token; returns events for +NXT's pull request.

    Raises ``InvalidArgumentError`` for a malformed token or payload, or a token naming
    another stream or consumer.
    """
    meta = parse_ack_subject(subject)
    if meta.stream != c.stream or meta.consumer != c.name:
        raise InvalidArgumentError("ack_subject", "names another stream or consumer")
    cmd = parse_ack_payload(payload)
    seq, cseq = meta.stream_seq, meta.consumer_seq
    if cmd.kind is AckKind.NAK:
        c.nak(seq, now_ns, delay_ns=cmd.delay_ns, consumer_seq=cseq)
    elif cmd.kind is AckKind.PROGRESS:
        c.progress(seq, now_ns, consumer_seq=cseq)
    elif cmd.kind is AckKind.TERM:
        c.term(seq, now_ns, reason=cmd.reason)
    else:
        c.ack(seq, now_ns)
    if cmd.kind is AckKind.NEXT:
        return c.pull(PullRequest.from_dict(cmd.next_request or {}, reply=reply), now_ns)
    return []
