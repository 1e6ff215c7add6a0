"""What a consumer reports about itself: ``ConsumerInfo`` and its ``SequenceInfo`` pairs.

Moved here from ``consumer.py`` (issue 34); ``raftstream.engine.consumer`` re-exports both
names. ``consumer_info`` builds the info from one consumer's state, on its thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from raftstream.engine.consumer_config import ConsumerConfig

if TYPE_CHECKING:
    from raftstream.engine.consumer import Consumer

__all__ = ["ConsumerInfo", "SequenceInfo", "consumer_info"]


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


def consumer_info(c: Consumer, now_ns: int) -> ConsumerInfo:
    """``c``'s info at ``now_ns`` (``Consumer.info``)."""
    s = c.state
    return ConsumerInfo(
        stream=c.stream,
        name=c.name,
        config=c.config,
        delivered=SequenceInfo(
            consumer_seq=s.delivered_consumer_seq,
            stream_seq=s.delivered_stream_seq,
            last_active_ns=c._last_delivered_ns,
        ),
        ack_floor=SequenceInfo(
            consumer_seq=s.ack_floor_consumer_seq,
            stream_seq=s.ack_floor_stream_seq,
            last_active_ns=c._last_acked_ns,
        ),
        num_ack_pending=len(s.pending),
        num_redelivered=s.num_redelivered(),
        num_waiting=c.num_waiting,
        num_pending=c.num_pending(),
        paused=c.is_paused(now_ns),
        pause_remaining_ns=max(0, s.paused_until_ns - now_ns),
    )
