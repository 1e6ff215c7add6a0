"""Flow-control tokens are unique across push plans, not only within one.

JetStream's flow-control reply subjects are unique, and clients answer each one once (the
raftstream SDK once per Consume call, older SDKs once per subscription). A consumer's push
plan is leader-local and starts afresh with a new leader, a rebuilt leader copy, or a
config update; a fresh plan that asked with a token of an earlier plan (``$JS.FC.S.c.1``
again) was never answered by such a client, so delivery stalled for good after any
failover. Each case builds the plans as the cluster does (``cluster/stream/replica.py``'s
``leader_copy``: a new ``Consumer`` over a copy of the replicated state).
"""

from __future__ import annotations

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.consumer_state import ConsumerState, decode_state, encode_state
from raftstream.engine.memstore import MemoryStreamStore

S = NS_PER_S
WINDOW_MSGS = 2
CONFIG = ConsumerConfig(
    durable_name="c", deliver_subject="deliver", flow_control=True, idle_heartbeat=S
)


def stored(n: int) -> MemoryStreamStore:
    store = MemoryStreamStore()
    for i in range(n):
        store.append("a", b"x", now_ns=(i + 1) * S)
    return store


def leader_copy(store: MemoryStreamStore, state: ConsumerState) -> Consumer:
    """A new leader's copy of the consumer, from the replicated ``state``."""
    return Consumer(
        stream="S",
        name="c",
        config=CONFIG,
        store=store,
        state=decode_state(encode_state(state)),
        record_ops=True,
        flow_window_msgs=WINDOW_MSGS,
    )


def asked(c: Consumer, now_ns: int) -> str:
    """The flow-control request of one push step that fills the window."""
    step = c.push_step(now_ns)
    assert len(step.deliveries) == WINDOW_MSGS and step.flow_control is not None
    return step.flow_control


def test_a_new_leader_asks_with_a_token_no_earlier_leader_used() -> None:
    """Failover: the new leader's plan starts again at its first request, whether the old
    leader's deliveries were replicated (it goes on from them) or lost with it (it
    delivers the same messages again); neither may ask with the old leader's token."""
    store = stored(6)
    first = Consumer.create(
        stream="S", name="c", config=CONFIG, store=store, now_ns=0, flow_window_msgs=WINDOW_MSGS
    )
    before = encode_state(first.state)  # the replicas' state if its deliveries are lost
    old = asked(first, 10)
    assert first.flow_control_reply(old)  # the client answered it
    replicated = asked(leader_copy(store, first.state), 20)
    lost = asked(leader_copy(store, decode_state(before)), 30)
    assert len({old, replicated, lost}) == 3
    assert all(t.startswith("$JS.FC.S.c.") for t in (old, replicated, lost))


def test_a_rebuilt_plan_after_a_config_update_asks_with_a_new_token() -> None:
    """The same leader, same Consume call: a config update replaces the plan; its first
    request must not repeat one the client answered on this call."""
    store = stored(6)
    c = Consumer.create(
        stream="S", name="c", config=CONFIG, store=store, now_ns=0, flow_window_msgs=WINDOW_MSGS
    )
    first = asked(c, 10)
    assert c.flow_control_reply(first)
    c.update_config(CONFIG)
    second = asked(c, 20)
    assert second != first
    assert c.flow_control_reply(second)


def test_one_plan_asks_with_a_new_token_each_time_and_takes_only_its_own() -> None:
    """Within a plan each request has its own token; an answer to another plan's token (or
    an old one) does not unstall it."""
    store = stored(6)
    c = Consumer.create(
        stream="S", name="c", config=CONFIG, store=store, now_ns=0, flow_window_msgs=WINDOW_MSGS
    )
    first = asked(c, 10)
    assert c.flow_control_reply(first)
    second = asked(c, 11)
    assert second != first
    assert not c.flow_control_reply(first)
    assert c.push_step(12).deliveries == ()  # still stalled
    assert c.flow_control_reply(second)
    assert len(c.push_step(13).deliveries) == WINDOW_MSGS
