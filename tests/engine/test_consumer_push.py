"""The push delivery plan: flow control stalls, idle heartbeats, rate limit, replay original.

Pins JetStream push behaviour (ADR-15 "Flow Control" and "Heartbeats"): after a window of
messages the server sends a flow-control request and stalls until the client answers;
heartbeats carry Nats-Last-Consumer / Nats-Last-Stream and, when stalled, the pending
flow-control subject (Nats-Consumer-Stalled).
"""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.errors import PreconditionError

S = NS_PER_S


def make(
    n: int = 0, *, size: int = 10, window: int = 512, **cfg: Any
) -> tuple[MemoryStreamStore, Consumer]:
    store = MemoryStreamStore()
    for i in range(n):
        store.append("a", b"x" * size, now_ns=(i + 1) * S)
    config = ConsumerConfig(durable_name="c", deliver_subject="deliver", **cfg)
    consumer = Consumer.create(
        stream="S", name="c", config=config, store=store, now_ns=0, flow_window_msgs=window
    )
    return store, consumer


def test_push_delivers_in_order_up_to_max_msgs() -> None:
    """Push delivers in stream order, at most max_msgs per step."""
    _, c = make(5)
    step = c.push_step(0, max_msgs=3)
    assert [d.stream_seq for d in step.deliveries] == [1, 2, 3]
    assert [d.stream_seq for d in c.push_step(0).deliveries] == [4, 5]


def test_flow_control_stalls_until_answered() -> None:
    """Past the window a flow-control request goes out and delivery stalls; answering it
    (once, duplicates ignored) resumes delivery."""
    _, c = make(6, window=2, idle_heartbeat=S, flow_control=True)
    step = c.push_step(0)
    token = step.flow_control
    assert len(step.deliveries) == 2 and token is not None and token.startswith("$JS.FC.S.c.")
    assert c.push_step(1).deliveries == ()
    hb = c.push_step(S + 1).heartbeat
    assert hb is not None and hb.stalled == token
    assert not c.flow_control_reply("$JS.FC.S.c.0")
    assert c.flow_control_reply(token)
    assert not c.flow_control_reply(token)
    assert [d.stream_seq for d in c.push_step(S + 2).deliveries] == [3, 4]


def test_idle_heartbeat_carries_last_sequences() -> None:
    """After idle_heartbeat of silence a heartbeat carries the last consumer/stream seqs."""
    _, c = make(2, idle_heartbeat=S)
    c.push_step(0)
    assert c.push_step(S - 1).heartbeat is None
    step = c.push_step(S)
    assert step.heartbeat is not None
    assert (step.heartbeat.last_consumer_seq, step.heartbeat.last_stream_seq) == (2, 2)
    assert step.heartbeat.stalled is None
    assert step.wake_at_ns == 2 * S


def test_rate_limit_spaces_messages() -> None:
    """rate_limit_bps: a 100-byte message at 800 bits/s takes one second of budget."""
    _, c = make(3, size=99, rate_limit_bps=800)  # 99 bytes + 1 subject byte = 100 bytes
    step = c.push_step(0)
    assert len(step.deliveries) == 1 and step.wake_at_ns == S
    assert c.push_step(S - 1).deliveries == ()
    assert len(c.push_step(S).deliveries) == 1


def test_replay_original_keeps_the_stored_spacing() -> None:
    """replay_policy original: messages go out spaced as they were stored."""
    _, c = make(3, replay_policy="original")  # stored at 1 s, 2 s, 3 s
    step = c.push_step(100)
    assert [d.stream_seq for d in step.deliveries] == [1] and step.wake_at_ns == 100 + S
    assert [d.stream_seq for d in c.push_step(100 + 2 * S).deliveries] == [2, 3]


def test_push_step_on_pull_consumer_is_refused() -> None:
    """Push planning is for push consumers only."""
    store = MemoryStreamStore()
    c = Consumer.create(
        stream="S", name="c", config=ConsumerConfig(durable_name="c"), store=store, now_ns=0
    )
    with pytest.raises(PreconditionError):
        c.push_step(0)


def test_paused_push_consumer_sends_only_heartbeats() -> None:
    """A paused push consumer keeps its heartbeats and resumes at pause_until."""
    _, c = make(1, idle_heartbeat=S, pause_until=10 * S)
    assert c.push_step(0).deliveries == ()
    assert c.push_step(S).heartbeat is not None
    assert [d.stream_seq for d in c.push_step(10 * S).deliveries] == [1]
