"""Delivery decisions: which message a consumer hands out next, and handing it out.

Order: eligible redeliveries first (deadline passed, or nak'd), oldest deadline first; a
message whose last allowed delivery (``max_deliver``) expires is given up (MaxDelivered) and
one no longer in the stream is dropped (Gone); then the last-per-subject messages still owed;
then new messages in stream order, none while ``max_ack_pending`` messages are unacked.

These were the ``Consumer``'s own methods (``_candidate``, ``_hand_out``...; moved here from
``consumer.py`` for issue 34): functions over one consumer's state, the consumer first. They
read and write its private attributes, and commit ops through it; the consumer owns all of
it, on its one thread. The serving loops (``consumer_serve.py``) call them per message.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from raftstream.engine.consumer_config import UNLIMITED
from raftstream.engine.consumer_pull import Delivery
from raftstream.engine.consumer_state import Deliver, Gone, MaxDelivered
from raftstream.engine.store import StoredMsg, StreamStore
from raftstream.errors import NotFoundError

if TYPE_CHECKING:
    from raftstream.engine.consumer import Consumer

__all__ = [
    "candidate",
    "eligible_redelivery",
    "hand_out",
    "load",
    "new_from",
    "next_new",
    "scan_next",
    "scanning",
]


def eligible_redelivery(c: Consumer, now_ns: int) -> int | None:
    heap = c._heap
    pending = c._state.pending
    while heap:
        deadline, seq = heap[0]
        p = pending.get(seq)
        if p is None or p.deadline_ns != deadline:
            heapq.heappop(heap)  # stale: settled, or renewed with a later entry
            continue
        return seq if deadline <= now_ns else None
    return None


def load(store: StreamStore, seq: int) -> StoredMsg | None:
    try:
        return store.load(seq)
    except NotFoundError:
        return None


def candidate(c: Consumer, now_ns: int) -> StoredMsg | None:
    """The next message to hand out at ``now_ns``, not yet consumed (None: nothing).

    May commit MaxDelivered/Gone ops for pending messages it finds exhausted or gone.
    """
    max_deliver = c._config.max_deliver
    while (seq := eligible_redelivery(c, now_ns)) is not None:
        p = c._state.pending[seq]
        if max_deliver != UNLIMITED and p.deliveries >= max_deliver:
            c._commit(MaxDelivered(stream_seq=seq))
            continue
        msg = load(c._store, seq)
        if msg is None:
            c._commit(Gone(stream_seqs=(seq,)))
            continue
        return msg
    cap = c._config.max_ack_pending
    if cap != UNLIMITED and len(c._state.pending) >= cap:
        return None
    return next_new(c)


def next_new(c: Consumer) -> StoredMsg | None:
    state = c._state
    while state.lps_queue:
        msg = load(c._store, state.lps_queue[0])
        if msg is not None:
            return msg
        c._commit(Gone(stream_seqs=(state.lps_queue[0],)))
    return new_from(c, state.delivered_stream_seq + 1)


def new_from(c: Consumer, start: int) -> StoredMsg | None:
    """The first message at or after ``start`` that passes the filters (None: none)."""
    filters = c._config.filters
    if c._scan_live and len(filters) == 1:
        return scan_next(c, start, filters[0])
    best: StoredMsg | None = None
    for f in filters:
        msg = c._store.load_next(f, start)
        if msg is not None and (best is None or msg.seq < best.seq):
            best = msg
    return best


def scan_next(c: Consumer, start: int, subject_filter: str) -> StoredMsg | None:
    """The first message at or after ``start`` from the call's scan (created lazily).

    Sound within one call: the cursor only grows, and the only store writes meanwhile
    are retention removals of messages this consumer already settled.
    """
    if c._scan is None:
        head = c._waiting.head()  # a pull's batch is about what it takes
        expect = head.remaining_msgs if head is not None else 0
        c._scan = c._store.iter_from(start, subject_filter, expect=expect)
        c._scan_peek = None
    while c._scan_peek is None or c._scan_peek.seq < start:
        c._scan_peek = next(c._scan, None)
        if c._scan_peek is None:
            return None
    return c._scan_peek


@contextmanager
def scanning(c: Consumer) -> Iterator[None]:
    """A scan of the stream for new messages, live only inside one serving call: one read
    transaction per chunk instead of one per message."""
    c._scan_live = True
    try:
        yield
    finally:
        c._scan_live = False
        c._scan = None
        c._scan_peek = None


def hand_out(c: Consumer, msg: StoredMsg, now_ns: int) -> Delivery:
    """Commit the delivery of ``msg`` and describe it for the client."""
    c._commit(Deliver(stream_seqs=(msg.seq,), now_ns=now_ns))
    p = c._state.pending.get(msg.seq)
    return Delivery(
        stream=c.stream,
        consumer=c.name,
        msg=msg,
        consumer_seq=p.consumer_seq if p else c._state.delivered_consumer_seq,
        deliveries=p.deliveries if p else 1,
        num_pending=c._pending_cache[1] if c._pending_cache else c.num_pending(),
        headers_only=c._config.headers_only,
        domain=c._domain,
        account=c._account,
    )
