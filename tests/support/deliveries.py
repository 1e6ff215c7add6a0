"""Deliveries to feed a consumer's response writers (pull and push) without a stream:
message ``seq`` of stream S to consumer c, ``data_bytes`` long, delivered once."""

from __future__ import annotations

from raftstream.engine.consumer_pull import Delivery, PullEvent, delivery_event
from raftstream.engine.store import StoredMsg

__all__ = ["delivery", "event"]


def event(seq: int, data_bytes: int = 10) -> PullEvent:
    return delivery_event(
        "r",
        stream="S",
        consumer="c",
        msg=StoredMsg(seq, "a.b", b"x" * data_bytes, 1_000 + seq),
        consumer_seq=seq,
        deliveries=1,
        num_pending=0,
        headers_only=False,
        domain=None,
        account="$G",
    )


def delivery(seq: int, data_bytes: int) -> Delivery:
    d = event(seq, data_bytes).delivery
    assert d is not None
    return d
