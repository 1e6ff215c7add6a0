"""A pull request whose requester went away, and num_pending after a filter edit.

- JetStream drops a pull request whose requester is gone: it no longer counts toward
  ``max_waiting`` (409 Exceeded MaxWaiting) nor takes messages. Waiting requests are
  leader-local, so dropping one records no op and leaves the replicated state alone;
  what it was handed before stays pending and is redelivered after ``ack_wait``.
- A consumer's info reports num_pending for its current filters: JetStream recounts it
  when the filter is edited, not at the next publish.
"""

from __future__ import annotations

from typing import Any

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.consumer_pull import PullEvent, PullRequest, StatusCode, WaitingQueue
from raftstream.engine.consumer_pull import WaitingRequest as Waiting
from raftstream.engine.consumer_state import ConsumerState
from raftstream.engine.memstore import MemoryStreamStore

S = NS_PER_S


def leader(store: MemoryStreamStore, **cfg: Any) -> Consumer:
    config = ConsumerConfig(durable_name="c", **cfg)
    return Consumer(
        stream="S", name="c", config=config, store=store, state=ConsumerState(), record_ops=True
    )


def follower(store: MemoryStreamStore, config: ConsumerConfig) -> Consumer:
    return Consumer(stream="S", name="c", config=config, store=store, state=ConsumerState())


def seqs(events: list[PullEvent], reply: str) -> list[int]:
    return [e.delivery.stream_seq for e in events if e.delivery and e.reply == reply]


def codes(events: list[PullEvent]) -> list[tuple[str, int, str]]:
    return [(e.reply, e.status.code, e.status.description) for e in events if e.status]


def test_cancelled_requests_leave_max_waiting_and_take_nothing() -> None:
    """max_waiting=2 filled by two requests whose clients left: once cancelled, a live
    request is queued (no 409 Exceeded MaxWaiting) and gets every new message."""
    store = MemoryStreamStore()
    c = leader(store, max_waiting=2)
    assert c.pull(PullRequest(batch=100, reply="dead1"), 0) == []
    assert c.pull(PullRequest(batch=100, reply="dead2"), 0) == []
    full = c.pull(PullRequest(batch=3, reply="probe"), 0)
    assert codes(full) == [("probe", StatusCode.CONFLICT, "Exceeded MaxWaiting")]
    assert c.cancel_pull("dead1") and c.cancel_pull("dead2")
    assert c.num_waiting == 0 and c.take_ops() == []  # leader-local: no op
    assert c.pull(PullRequest(batch=3, reply="live"), 1) == []
    for i in range(3):
        store.append("a", b"x", now_ns=10 + i)
    events = c.poll(20)
    assert seqs(events, "live") == [1, 2, 3] and codes(events) == []


def test_cancelling_a_finished_or_unknown_request_is_a_no_op() -> None:
    """A request that completed (or never was) is not waiting: cancel says so and changes
    nothing."""
    store = MemoryStreamStore()
    store.append("a", b"x", now_ns=1)
    c = leader(store)
    assert seqs(c.pull(PullRequest(batch=1, reply="done"), 2), "done") == [1]
    c.take_ops()
    before = c.info(3)
    assert not c.cancel_pull("done") and not c.cancel_pull("never")
    assert c.info(3) == before and c.take_ops() == []


def test_deliveries_made_before_the_cancel_are_redelivered_after_ack_wait() -> None:
    """A request handed messages just as its client left: they stay delivered and unacked
    (the replicated Deliver op stands, a follower agrees) and go to the next request once
    ack_wait passed."""
    store = MemoryStreamStore()
    for i in range(2):
        store.append("a", b"x", now_ns=1 + i)
    c = leader(store, ack_wait=5 * S)
    f = follower(store, c.config)
    assert seqs(c.pull(PullRequest(batch=10, reply="gone"), 10), "gone") == [1, 2]
    assert c.cancel_pull("gone")
    f.apply_many(c.take_ops())
    assert sorted(f.state.pending) == sorted(c.state.pending) == [1, 2]
    assert f.state.delivered_stream_seq == c.state.delivered_stream_seq == 2
    assert c.pull(PullRequest(batch=10, reply="next"), 11) == []
    events = c.poll(10 + 5 * S)
    assert seqs(events, "next") == [1, 2]
    assert [e.delivery.deliveries for e in events if e.delivery] == [2, 2]
    f.apply_many(c.take_ops())
    assert f.info(10 + 5 * S).num_redelivered == c.info(10 + 5 * S).num_redelivered == 2


def test_waiting_queue_remove_keeps_the_others_in_order() -> None:
    q = WaitingQueue(max_waiting=3)
    for r in ("a", "b", "c"):
        q.add(Waiting.start(PullRequest(reply=r), 0))
    removed = q.remove("b")
    assert removed is not None and removed.request.reply == "b"
    assert q.remove("b") is None
    assert [w.request.reply for w in q] == ["a", "c"] and not q.full


def test_num_pending_follows_a_filter_edit_at_once() -> None:
    """Filter t.a (5 of 10 messages), edited to t.b, then to t.a and t.b: num_pending is
    5, 5, 10 right after each edit, on the leader copy and on a follower, with no publish
    in between."""
    store = MemoryStreamStore()
    for i in range(10):
        store.append("t.a" if i < 5 else "t.b", b"x", now_ns=i + 1)
    c = leader(store, filter_subject="t.a")
    f = follower(store, c.config)
    assert c.info(20).num_pending == f.num_pending() == 5
    delivered = c.pull(PullRequest(batch=2, reply="r"), 20)
    f.apply_many(c.take_ops())
    assert seqs(delivered, "r") == [1, 2]
    assert c.info(20).num_pending == f.info(20).num_pending == 3
    for cfg, want in (
        (ConsumerConfig(durable_name="c", filter_subject="t.b"), 5),
        (ConsumerConfig(durable_name="c", filter_subjects=("t.a", "t.b")), 8),
    ):
        c.update_config(cfg)
        f.update_config(cfg)
        assert c.info(21).num_pending == f.info(21).num_pending == want
