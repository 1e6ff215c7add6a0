"""Where a new consumer starts: its deliver policy read against the stream, once.

The leader computes the ``Start`` op when the consumer is created and replicates it, so
replicas never re-read the stream to position a consumer (the stream may have moved on by
the time they apply it).
"""

from __future__ import annotations

from raftstream.engine.consumer_config import ConsumerConfig, DeliverPolicy
from raftstream.engine.consumer_state import Start
from raftstream.engine.store import StoredMsg, StreamStore
from raftstream.errors import NotFoundError

__all__ = ["start_op"]


def start_op(config: ConsumerConfig, store: StreamStore) -> Start:
    """The ``Start`` op for ``config``'s deliver policy on ``store`` as it is now.

    all: the first stored message; new: after the last; by_start_sequence: that sequence (or
    the first stored, if later); by_start_time: the first message stored at or after the
    time; last: the newest message matching the filters; last_per_subject: the newest
    message of every matching subject, then everything after the current last sequence.
    """
    st = store.state()
    first = max(st.first_seq if st.msgs else st.last_seq + 1, 1)
    policy = config.deliver_policy
    if policy is DeliverPolicy.ALL:
        return Start(start_seq=first)
    if policy is DeliverPolicy.NEW:
        return Start(start_seq=st.last_seq + 1)
    if policy is DeliverPolicy.BY_START_SEQUENCE:
        return Start(start_seq=max(config.opt_start_seq, first))
    if policy is DeliverPolicy.BY_START_TIME:
        return Start(start_seq=_first_at_or_after(store, config.opt_start_time, first))
    if policy is DeliverPolicy.LAST:
        lasts = [m.seq for m in _last_per_filter(config, store)]
        return Start(start_seq=max(lasts) if lasts else st.last_seq + 1)
    lps = sorted(store.load_last(s).seq for f in config.filters for s in store.subjects_state(f))
    start = lps[0] if lps else st.last_seq + 1
    return Start(start_seq=start, lps=tuple(lps), lps_end=st.last_seq)


def _last_per_filter(config: ConsumerConfig, store: StreamStore) -> list[StoredMsg]:
    out = []
    for f in config.filters:
        try:
            out.append(store.load_last(f))
        except NotFoundError:
            continue
    return out


def _first_at_or_after(store: StreamStore, ts_ns: int, first: int) -> int:
    """Binary search by stored time (the leader stamps times in sequence order).

    The answer may be a sequence with no message; delivery then starts at the next one.
    """
    lo, hi = first, store.state().last_seq + 1
    while lo < hi:
        mid = (lo + hi) // 2
        msg = store.load_next(">", mid)
        if msg is None or msg.ts >= ts_ns:
            hi = mid
        else:
            lo = msg.seq + 1
    return lo
