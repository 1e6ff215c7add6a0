"""JetStream's ``delivered.last_active`` and ``ack_floor.last_active``: when the last
delivery and the last ack happened. They were always 0 (a user review); now they are the
times of the last Deliver and Ack ops applied, which carry the leader's clock, so a follower
applying the same ops reports the same times."""

from __future__ import annotations

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_pull import PullRequest
from raftstream.engine.consumer_state import ConsumerState
from raftstream.engine.memstore import MemoryStreamStore


def _consumer(store: MemoryStreamStore, *, leader: bool) -> Consumer:
    return Consumer(
        stream="S",
        name="c",
        config=ConsumerConfig(durable_name="c"),
        store=store,
        state=ConsumerState(),
        record_ops=leader,
    )


def test_last_delivery_and_last_ack_times_on_leader_and_follower() -> None:
    store = MemoryStreamStore()
    for i in range(3):
        store.append("a", b"x", now_ns=1 + i)
    lead, follow = _consumer(store, leader=True), _consumer(store, leader=False)
    info = lead.info(5)
    assert (info.delivered.last_active_ns, info.ack_floor.last_active_ns) == (0, 0)

    lead.pull(PullRequest(batch=2, reply="r1"), 100)
    lead.ack(1, 150)
    lead.pull(PullRequest(batch=1, reply="r2"), 200)
    for op in lead.take_ops():
        follow.apply(op)
    for c in (lead, follow):
        info = c.info(300)
        assert info.delivered.last_active_ns == 200, c
        assert info.ack_floor.last_active_ns == 150, c
