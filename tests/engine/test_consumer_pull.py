"""Pull requests: batch, expires, no_wait, max_bytes, heartbeats, and JetStream's statuses.

Statuses pinned (JetStream pull protocol): 404 No Messages, 408 Request Timeout, 409
Exceeded MaxWaiting / MaxRequestBatch / MaxRequestExpires / MaxRequestMaxBytes, 409 Message
Size Exceeds MaxBytes, 409 Consumer Deleted, 409 Leadership Change, 100 Idle Heartbeat.
"""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.consumer_pull import (
    Delivery,
    PullEvent,
    PullRequest,
    StatusCode,
    delivery_event,
)
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import StoredMsg
from raftstream.errors import InvalidArgumentError

S = NS_PER_S


def make(n: int = 0, **cfg: Any) -> tuple[MemoryStreamStore, Consumer]:
    store = MemoryStreamStore()
    for i in range(n):
        store.append("a", b"x" * 10, now_ns=i + 1)
    config = ConsumerConfig(durable_name="c", **cfg)
    return store, Consumer.create(stream="S", name="c", config=config, store=store, now_ns=0)


def msgs(events: list[PullEvent], reply: str | None = None) -> list[int]:
    return [
        e.delivery.stream_seq
        for e in events
        if e.delivery is not None and (reply is None or e.reply == reply)
    ]


def statuses(events: list[PullEvent]) -> list[tuple[str, int, str]]:
    return [(e.reply, e.status.code, e.status.description) for e in events if e.status]


def test_batch_is_filled_and_request_completes_without_status() -> None:
    """A request whose batch is filled ends without a status."""
    _, c = make(5)
    events = c.pull(PullRequest(batch=3, reply="r"), 0)
    assert msgs(events) == [1, 2, 3] and statuses(events) == []
    assert c.num_waiting == 0


def test_no_wait_with_nothing_is_404() -> None:
    """no_wait and no messages: 404 No Messages."""
    _, c = make(0)
    events = c.pull(PullRequest(batch=3, no_wait=True, reply="r"), 0)
    assert statuses(events) == [("r", StatusCode.NO_MESSAGES, "No Messages")]


def test_no_wait_partial_batch_is_408_with_pending_counts() -> None:
    """no_wait that got part of its batch ends with 408 and what it still wanted."""
    _, c = make(2)
    events = c.pull(PullRequest(batch=5, no_wait=True, reply="r"), 0)
    assert msgs(events) == [1, 2]
    (last,) = [e.status for e in events if e.status]
    assert (last.code, last.pending_msgs) == (StatusCode.REQUEST_TIMEOUT, 3)


def test_waiting_request_is_served_when_messages_arrive() -> None:
    """A waiting request gets messages stored after it arrived."""
    store, c = make(0)
    assert c.pull(PullRequest(batch=2, expires=10 * S, reply="r"), 0) == []
    assert c.num_waiting == 1
    store.append("a", b"x", now_ns=1)
    assert msgs(c.poll(1)) == [1]
    store.append("a", b"x", now_ns=2)
    assert msgs(c.poll(2)) == [2]
    assert c.num_waiting == 0


def test_expired_request_gets_408() -> None:
    """A request whose expires passed ends with 408 Request Timeout."""
    _, c = make(0)
    c.pull(PullRequest(batch=2, expires=5 * S, reply="r"), 0)
    assert c.poll(5 * S - 1) == []
    assert statuses(c.poll(5 * S)) == [("r", StatusCode.REQUEST_TIMEOUT, "Request Timeout")]
    assert c.num_waiting == 0


def test_idle_heartbeats_carry_last_sequences() -> None:
    """A waiting request with idle_heartbeat gets 100 Idle Heartbeat while idle."""
    _, c = make(1)
    c.pull(PullRequest(batch=1, reply="a"), 0)
    c.pull(PullRequest(batch=5, expires=10 * S, idle_heartbeat=S, reply="r"), 0)
    assert c.poll(S - 1) == []
    (hb,) = c.poll(S)
    assert hb.status is not None and hb.status.code is StatusCode.IDLE_HEARTBEAT
    assert (hb.status.last_consumer_seq, hb.status.last_stream_seq) == (1, 1)
    assert not hb.status.terminal
    assert c.poll(S + S // 2) == []


def test_max_waiting_bounds_the_queue() -> None:
    """More waiting requests than max_waiting: 409 Exceeded MaxWaiting."""
    _, c = make(0, max_waiting=2)
    c.pull(PullRequest(expires=S, reply="1"), 0)
    c.pull(PullRequest(expires=S, reply="2"), 0)
    events = c.pull(PullRequest(expires=S, reply="3"), 0)
    assert statuses(events) == [("3", StatusCode.CONFLICT, "Exceeded MaxWaiting")]
    # Expired requests make room before the limit is checked.
    assert statuses(c.pull(PullRequest(expires=S, reply="4"), S)) == [
        ("1", StatusCode.REQUEST_TIMEOUT, "Request Timeout"),
        ("2", StatusCode.REQUEST_TIMEOUT, "Request Timeout"),
    ]


@pytest.mark.parametrize(
    ("cfg", "req", "description"),
    [
        ({"max_batch": 2}, {"batch": 3}, "Exceeded MaxRequestBatch of 2"),
        ({"max_expires": S}, {"expires": 2 * S}, f"Exceeded MaxRequestExpires of {S}ns"),
        ({"max_expires": S}, {}, f"Exceeded MaxRequestExpires of {S}ns"),
        ({"max_bytes": 100}, {"max_bytes": 101}, "Exceeded MaxRequestMaxBytes of 100"),
    ],
)
def test_request_limits_are_409(cfg: dict[str, int], req: dict[str, int], description: str) -> None:
    """Requests beyond the consumer's max_batch / max_expires / max_bytes are refused."""
    _, c = make(3, **cfg)
    events = c.pull(PullRequest(reply="r", **req), 0)
    assert statuses(events) == [("r", StatusCode.CONFLICT, description)]
    assert c.num_waiting == 0 and c.state.pending == {}


def test_max_bytes_limits_a_request() -> None:
    """A request stops at max_bytes; a message larger than what is left is 409."""
    _, c = make(5)  # each message: subject "a" (1) + 10 bytes = 11
    events = c.pull(PullRequest(batch=10, max_bytes=25, reply="r"), 0)
    assert msgs(events) == [1, 2]
    assert statuses(events) == [("r", StatusCode.CONFLICT, "Message Size Exceeds MaxBytes")]
    events = c.pull(PullRequest(batch=10, max_bytes=22, reply="r2"), 0)
    assert msgs(events) == [3, 4] and statuses(events) == []


def test_requests_are_served_round_robin() -> None:
    """Waiting requests share new messages one at a time, in arrival order."""
    store, c = make(0)
    c.pull(PullRequest(batch=2, expires=S, reply="x"), 0)
    c.pull(PullRequest(batch=2, expires=S, reply="y"), 0)
    for i in range(4):
        store.append("a", b"", now_ns=i + 1)
    events = c.poll(1)
    assert [(e.reply, e.delivery.stream_seq) for e in events if e.delivery] == [
        ("x", 1),
        ("y", 2),
        ("x", 3),
        ("y", 4),
    ]


def test_delete_and_leadership_change_answer_waiting_requests() -> None:
    """409 Leadership Change and 409 Consumer Deleted end waiting requests."""
    _, c = make(0)
    c.pull(PullRequest(expires=S, reply="r"), 0)
    assert statuses(c.leadership_lost()) == [("r", StatusCode.CONFLICT, "Leadership Change")]
    c.pull(PullRequest(expires=S, reply="q"), 0)
    assert statuses(c.delete()) == [("q", StatusCode.CONFLICT, "Consumer Deleted")]


def test_pull_on_push_consumer_is_409() -> None:
    """JetStream: a pull request to a push consumer is a 409."""
    _, c = make(1, deliver_subject="d")
    assert statuses(c.pull(PullRequest(reply="r"), 0)) == [
        ("r", StatusCode.CONFLICT, "Consumer is push based")
    ]


def test_paused_consumer_keeps_requests_waiting() -> None:
    """A paused consumer keeps requests waiting and serves them on resume."""
    _, c = make(2, pause_until=5 * S)
    assert msgs(c.pull(PullRequest(batch=2, expires=10 * S, reply="r"), 0)) == []
    assert c.num_waiting == 1 and c.next_wake_ns(0) == 5 * S
    assert msgs(c.poll(5 * S)) == [1, 2]


def test_redelivery_reaches_a_waiting_request() -> None:
    """A message whose ack wait expires goes to a waiting request."""
    _, c = make(1, ack_wait=S)
    c.fetch(1, 0)
    c.pull(PullRequest(batch=1, expires=10 * S, reply="r"), 0)
    assert c.next_wake_ns(0) == S
    assert msgs(c.poll(S)) == [1]


def test_bad_requests_are_refused() -> None:
    """Malformed requests (400 in JetStream) are refused before queuing."""
    with pytest.raises(InvalidArgumentError):
        PullRequest(batch=0)
    with pytest.raises(InvalidArgumentError):
        PullRequest(idle_heartbeat=S)  # a heartbeat needs expires
    with pytest.raises(InvalidArgumentError):
        PullRequest.from_dict({"batch": 1, "bogus": 1})
    assert PullRequest.from_dict({"batch": 3, "no_wait": True}).batch == 3


def test_next_wake_is_always_in_the_future() -> None:
    """A timer loop never spins: past deadlines and an ended pause are not wake times."""
    _, c = make(1, ack_wait=S, pause_until=2 * S)
    assert c.next_wake_ns(0) == 2 * S
    assert c.next_wake_ns(3 * S) == 0
    c.fetch(1, 3 * S)
    assert c.next_wake_ns(3 * S) == 4 * S
    assert c.next_wake_ns(5 * S) == 0


def test_delivery_event_is_the_dataclasses_value() -> None:
    """``delivery_event`` (the leader's fast path) gives exactly the value the frozen
    dataclasses' constructors give, so nothing downstream can tell them apart."""
    msg = StoredMsg(7, "a.b", b"data", 123, {"k": "v"})
    fields: dict[str, Any] = {
        "stream": "S",
        "consumer": "c",
        "msg": msg,
        "consumer_seq": 3,
        "deliveries": 2,
        "num_pending": 9,
        "headers_only": True,
        "domain": "hub",
        "account": "acc",
    }
    fast = delivery_event("r", **fields)
    assert fast == PullEvent(reply="r", delivery=Delivery(**fields))
    assert fast.delivery is not None and fast.delivery.reply == Delivery(**fields).reply
    assert fast.status is None
