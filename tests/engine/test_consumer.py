"""The consumer state machine: delivery order, acks, redelivery, limits, policies, state.

Every test runs on both backends (memory stream + memory consumer store, and LMDB stream +
LMDB consumer store in one node environment) and names the JetStream behaviour it pins.
Time is a plain integer passed in; nothing here sleeps or reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from raftstream.engine.consumer import HEAP_SLACK_ENTRIES, Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.consumer_pull import PullRequest, StatusCode
from raftstream.engine.consumer_state import (
    Ack,
    Deliver,
    EventKind,
    Progress,
    decode_op,
    decode_state,
    encode_op,
    encode_state,
)
from raftstream.engine.consumer_store import (
    DB_PENDING,
    ConsumerStateStore,
    LmdbConsumerStore,
    MemoryConsumerStore,
)
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import StreamStore
from raftstream.errors import DataLossError, InvalidArgumentError, NotFoundError, PreconditionError

S = NS_PER_S
MAP_BYTES = 256 * 1024 * 1024


class Rig:
    """A stream store and a consumer state store of one kind; ``reopen`` closes and reopens
    the LMDB environment (the memory twin keeps its bytes)."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.env: Any = None
        self.store: StreamStore
        self.cstore: ConsumerStateStore
        self._open()
        self.ts = 0

    def _open(self) -> None:
        if self.kind == "memory":
            if not hasattr(self, "store"):
                self.store = MemoryStreamStore()
                self.cstore = MemoryConsumerStore()
            return
        self.env = open_node_env(self.path, map_size_bytes=MAP_BYTES, sync=False)
        self.store = LmdbStreamStore(self.env, "S")
        self.cstore = LmdbConsumerStore(env=self.env)

    def publish(self, subject: str = "a", data: bytes = b"x", *, ts: int | None = None) -> int:
        self.ts = self.ts + 1 if ts is None else ts
        return self.store.append(subject, data, now_ns=self.ts)

    def consumer(self, name: str = "c", *, now: int = 0, **cfg: Any) -> Consumer:
        config = ConsumerConfig(durable_name=name, **cfg)
        return Consumer.create(
            stream="S",
            name=name,
            config=config,
            store=self.store,
            now_ns=now,
            state_store=self.cstore,
        )

    def reopen(self, name: str = "c") -> Consumer:
        if self.kind == "lmdb":
            self.env.close()
            self._open()
        return Consumer.open(stream="S", name=name, store=self.store, state_store=self.cstore)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


@pytest.fixture(params=["memory", "lmdb"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    r = Rig(str(request.param), tmp_path / "node")
    yield r
    r.close()


def seqs(deliveries: list[Any]) -> list[int]:
    return [d.stream_seq for d in deliveries]


# -- delivery order and redelivery ------------------------------------------------------------


def test_new_messages_in_stream_order_with_consumer_sequences(rig: Rig) -> None:
    """Each delivery takes the next consumer sequence; the ack token carries delivered count,
    both sequences, the stored time and the messages still pending."""
    for _ in range(5):
        rig.publish()
    c = rig.consumer()
    got = c.fetch(3, 10)
    assert seqs(got) == [1, 2, 3]
    assert [d.consumer_seq for d in got] == [1, 2, 3]
    assert [d.num_pending for d in got] == [4, 3, 2]
    assert got[0].reply == "$JS.ACK._._.S.c.1.1.1.1.4"


def test_redeliveries_come_before_new_messages(rig: Rig) -> None:
    """JetStream delivers expired/nak'd messages before new ones."""
    for _ in range(4):
        rig.publish()
    c = rig.consumer(ack_wait=5 * S)
    assert seqs(c.fetch(2, 0)) == [1, 2]
    got = c.fetch(3, 5 * S)
    assert seqs(got) == [1, 2, 3]
    assert [d.deliveries for d in got] == [2, 2, 1]
    assert [d.consumer_seq for d in got] == [3, 4, 5]


def test_not_redelivered_before_ack_wait(rig: Rig) -> None:
    """An unacked message becomes eligible again only when ack_wait has passed."""
    rig.publish()
    c = rig.consumer(ack_wait=5 * S)
    c.fetch(1, 0)
    assert c.fetch(1, 5 * S - 1) == []
    assert seqs(c.fetch(1, 5 * S)) == [1]


def test_backoff_schedule_sets_each_deadline(rig: Rig) -> None:
    """With backoff, the n-th delivery waits backoff[n-1]; the last value repeats."""
    rig.publish()
    c = rig.consumer(backoff=(1 * S, 3 * S))
    t = 0
    for wait in (1 * S, 3 * S, 3 * S):
        assert seqs(c.fetch(1, t)) == [1]
        assert c.fetch(1, t + wait - 1) == []
        t += wait
    assert c.state.pending[1].deliveries == 3


def test_max_deliver_stops_redelivery_and_records_advisory(rig: Rig) -> None:
    """At max_deliver a message is not delivered again; JetStream sends a MAX_DELIVERIES
    advisory, and the message no longer holds the ack floor."""
    rig.publish()
    rig.publish()
    c = rig.consumer(ack_wait=S, max_deliver=2)
    c.fetch(2, 0)
    c.ack(2, 1)
    assert seqs(c.fetch(1, S)) == [1]
    assert c.fetch(1, 2 * S) == []
    events = c.drain_advisories()
    assert [(e.kind, e.stream_seq, e.deliveries) for e in events] == [
        (EventKind.MAX_DELIVERIES, 1, 2)
    ]
    info = c.info(2 * S)
    assert info.num_ack_pending == 0 and info.ack_floor.stream_seq == 2


def test_max_ack_pending_blocks_new_but_not_redeliveries(rig: Rig) -> None:
    """At max_ack_pending outstanding messages nothing new is handed out; redeliveries of
    the outstanding ones still are."""
    for _ in range(5):
        rig.publish()
    c = rig.consumer(max_ack_pending=2, ack_wait=S)
    assert seqs(c.fetch(5, 0)) == [1, 2]
    assert c.fetch(5, 1) == []
    assert seqs(c.fetch(5, S)) == [1, 2]
    c.ack(1, S + 1)
    assert seqs(c.fetch(5, S + 1)) == [3]


# -- acks -------------------------------------------------------------------------------------


def test_ack_settles_and_moves_the_floor(rig: Rig) -> None:
    """+ACK settles a message; the ack floor rises only once everything below is settled."""
    for _ in range(3):
        rig.publish()
    c = rig.consumer(ack_wait=S)
    c.fetch(3, 0)
    c.ack(2, 1)
    assert c.info(1).ack_floor.stream_seq == 0
    c.ack(1, 1)
    info = c.info(1)
    assert (info.ack_floor.stream_seq, info.ack_floor.consumer_seq) == (2, 2)
    assert seqs(c.fetch(3, 10 * S)) == [3]  # only the unacked one comes back


def test_nak_redelivers_at_once_or_after_delay(rig: Rig) -> None:
    """-NAK makes the message eligible now; -NAK with a delay, after the delay."""
    rig.publish()
    rig.publish()
    c = rig.consumer(ack_wait=30 * S)
    c.fetch(2, 0)
    c.nak(1, 10)
    c.nak(2, 10, delay_ns=5 * S)
    assert seqs(c.fetch(2, 11)) == [1]
    assert seqs(c.fetch(2, 10 + 5 * S)) == [2]


def test_late_nak_of_an_earlier_delivery_is_ignored(rig: Rig) -> None:
    """A nak carrying an old consumer sequence refers to a delivery already superseded."""
    rig.publish()
    c = rig.consumer(ack_wait=S)
    first = c.fetch(1, 0)[0]
    c.fetch(1, S)
    c.nak(1, S + 1, consumer_seq=first.consumer_seq)
    assert c.fetch(1, S + 2) == []


def test_progress_resets_the_deadline_repeatedly(rig: Rig) -> None:
    """+WPI restarts the ack wait from now; it may be sent many times."""
    rig.publish()
    c = rig.consumer(ack_wait=10 * S)
    c.fetch(1, 0)
    c.progress(1, 8 * S)
    c.progress(1, 16 * S)
    assert c.fetch(1, 25 * S) == []
    assert seqs(c.fetch(1, 26 * S)) == [1]


def test_term_stops_deliveries_with_reason(rig: Rig) -> None:
    """+TERM: never redelivered; JetStream records a TERMINATED advisory with the reason."""
    rig.publish()
    c = rig.consumer(ack_wait=S)
    c.fetch(1, 0)
    c.term(1, 1, reason="poison")
    assert c.fetch(1, 10 * S) == []
    (event,) = c.drain_advisories()
    assert (event.kind, event.reason) == (EventKind.TERMINATED, "poison")
    assert c.info(10 * S).ack_floor.stream_seq == 1


def test_ack_all_acks_everything_at_or_below(rig: Rig) -> None:
    """Ack policy all: acking a sequence acknowledges every pending one at or below it."""
    for _ in range(4):
        rig.publish()
    c = rig.consumer(ack_policy="all", ack_wait=S)
    c.fetch(4, 0)
    c.ack(3, 1)
    assert sorted(c.state.pending) == [4]
    assert c.info(1).ack_floor.stream_seq == 3


def test_acks_of_unknown_or_acked_sequences_are_harmless(rig: Rig) -> None:
    """Duplicate and stray acks change nothing (JetStream ignores them)."""
    rig.publish()
    c = rig.consumer()
    c.fetch(1, 0)
    c.ack(1, 1)
    before = encode_state(c.state)
    c.ack(1, 2)
    c.ack(99, 2)
    c.nak(1, 2)
    c.progress(1, 2)
    c.term(1, 2)
    assert encode_state(c.state) == before
    assert c.drain_advisories() == []


def test_ack_none_tracks_nothing(rig: Rig) -> None:
    """Ack policy none: deliveries are settled at once and acks are ignored."""
    for _ in range(3):
        rig.publish()
    c = rig.consumer(ack_policy="none")
    assert seqs(c.fetch(2, 0)) == [1, 2]
    info = c.info(0)
    assert info.num_ack_pending == 0 and info.ack_floor.stream_seq == 2
    assert seqs(c.fetch(5, 100 * S)) == [3]


def test_process_ack_dispatches_every_kind(rig: Rig) -> None:
    """Acks arrive as payloads on the ack token; +NXT acks and asks for more."""
    for _ in range(4):
        rig.publish()
    c = rig.consumer(ack_wait=10 * S)
    d1, d2, d3 = c.fetch(3, 0)
    c.process_ack(d1.reply, b"+ACK", 1)
    c.process_ack(d2.reply, b"+TERM gone", 1)
    c.process_ack(d3.reply, b'-NAK {"delay": 1000}', 1)
    assert sorted(c.state.pending) == [3]
    events = c.process_ack(d3.reply, b"+NXT 2", 2000, reply="inbox.1")
    assert [e.delivery.stream_seq for e in events if e.delivery] == [4]
    assert all(e.reply == "inbox.1" for e in events)
    with pytest.raises(InvalidArgumentError):
        c.process_ack("$JS.ACK._._.S.other.1.1.1.1.1", b"+ACK", 3)


def test_sampled_acks_record_latency(rig: Rig) -> None:
    """sample_freq 100%: every ack records its latency (JetStream's ack metric advisory)."""
    rig.publish()
    c = rig.consumer(sample_freq="100%")
    c.fetch(1, 10)
    c.ack(1, 35)
    (event,) = c.drain_advisories()
    assert (event.kind, event.ack_latency_ns) == (EventKind.ACK_SAMPLE, 25)


# -- deliver policies and filters -------------------------------------------------------------


def test_deliver_policies(rig: Rig) -> None:
    """all / last / new / by_start_sequence / by_start_time start where JetStream does."""
    for i, subj in enumerate(["a.1", "a.2", "b.1", "a.1", "b.2"]):
        rig.publish(subj, ts=(i + 1) * S)
    rig.publish("c.x", ts=10 * S)
    assert seqs(rig.consumer("all").fetch(10, 0)) == [1, 2, 3, 4, 5, 6]
    assert seqs(rig.consumer("last", deliver_policy="last").fetch(10, 0)) == [6]
    last_a = rig.consumer("lasta", deliver_policy="last", filter_subject="a.*")
    assert seqs(last_a.fetch(10, 0)) == [4]
    new = rig.consumer("new", deliver_policy="new")
    assert new.fetch(10, 0) == []
    rig.publish("a.9")
    assert seqs(new.fetch(10, 0)) == [7]
    seq = rig.consumer("seq", deliver_policy="by_start_sequence", opt_start_seq=4)
    assert seqs(seq.fetch(10, 0)) == [4, 5, 6, 7]
    by_time = rig.consumer("time", deliver_policy="by_start_time", opt_start_time=3 * S + 1)
    assert seqs(by_time.fetch(10, 0)) == [4, 5, 6, 7]


def test_last_per_subject_then_new_messages(rig: Rig) -> None:
    """last_per_subject delivers the newest message of each matching subject, then
    everything stored after the consumer started."""
    for subj in ["a.1", "a.2", "a.1", "b.1", "a.2", "a.3"]:
        rig.publish(subj)
    c = rig.consumer(deliver_policy="last_per_subject", filter_subject="a.*")
    assert c.info(0).num_pending == 3
    assert seqs(c.fetch(2, 0)) == [3, 5]
    rig.publish("a.1")
    rig.publish("b.1")
    assert seqs(c.fetch(10, 0)) == [6, 7]
    assert c.info(0).num_pending == 0


def test_last_per_subject_skips_a_message_deleted_before_delivery(rig: Rig) -> None:
    """A start message that left the stream is skipped (and no longer counted pending)."""
    for subj in ["a.1", "a.2", "a.3"]:
        rig.publish(subj)
    c = rig.consumer(deliver_policy="last_per_subject", filter_subject="a.*")
    rig.store.delete(2)
    assert seqs(c.fetch(5, 0)) == [1, 3]
    assert c.info(0).num_pending == 0


def test_filters_select_messages(rig: Rig) -> None:
    """A consumer sees only matching subjects; several filters merge in stream order."""
    for subj in ["a.1", "b.1", "c.1", "a.2", "b.2"]:
        rig.publish(subj)
    one = rig.consumer("one", filter_subject="a.*")
    assert seqs(one.fetch(10, 0)) == [1, 4]
    two = rig.consumer("two", filter_subjects=("b.*", "c.>"))
    assert two.info(0).num_pending == 3
    assert seqs(two.fetch(10, 0)) == [2, 3, 5]
    assert two.matches("c.1.2") and not two.matches("a.1")


def test_deleted_pending_message_is_dropped_not_redelivered(rig: Rig) -> None:
    """A message removed from the stream while pending is forgotten on redelivery."""
    rig.publish()
    rig.publish()
    c = rig.consumer(ack_wait=S)
    c.fetch(2, 0)
    rig.store.delete(1)
    assert seqs(c.fetch(2, S)) == [2]
    assert 1 not in c.state.pending


def test_headers_only_sends_size_not_data(rig: Rig) -> None:
    """headers_only: the payload is left out and Nats-Msg-Size carries its size."""
    rig.publish(data=b"12345")
    (d,) = rig.consumer(headers_only=True).fetch(1, 0)
    assert d.data == b"" and d.headers["Nats-Msg-Size"] == "5"


# -- control and info -------------------------------------------------------------------------


def test_pause_and_resume(rig: Rig) -> None:
    """A paused consumer delivers nothing until pause_until or resume; info says so."""
    rig.publish()
    c = rig.consumer(pause_until=10 * S)
    info = c.info(4 * S)
    assert info.paused and info.pause_remaining_ns == 6 * S
    assert c.fetch(1, 4 * S) == []
    assert seqs(c.fetch(1, 10 * S)) == [1]
    rig.publish()
    c.pause(100 * S)
    assert c.fetch(1, 11 * S) == []
    c.resume()
    assert seqs(c.fetch(1, 11 * S)) == [2]


def test_an_update_moves_the_pause_as_in_jetstream(rig: Rig) -> None:
    """An update whose pause_until differs from the pause in force pauses or resumes
    (JetStream 2.11's consumer update; the cluster's pause and resume requests are such
    updates); one that carries the pause in force, editing another field, leaves it."""
    rig.publish()
    c = rig.consumer()
    cfg = c.info(1 * S).config
    c.update_config(replace(cfg, pause_until=100 * S))
    info = c.info(1 * S)
    assert info.paused and info.pause_remaining_ns == 99 * S
    c.update_config(replace(info.config, max_ack_pending=7))  # an edit of another field
    assert c.fetch(1, 2 * S) == [] and c.info(2 * S).config.max_ack_pending == 7
    c.update_config(replace(c.info(3 * S).config, pause_until=0))
    assert not c.info(3 * S).paused
    assert seqs(c.fetch(1, 3 * S)) == [1]


def test_a_pause_until_already_past_at_create_pauses_nothing(rig: Rig) -> None:
    """Created with a pause_until in the past: nothing paused, and a later edit that keeps
    that config does not pause it either."""
    rig.publish()
    c = rig.consumer(pause_until=1 * S)
    assert not c.info(5 * S).paused
    c.update_config(replace(c.info(5 * S).config, max_ack_pending=3))
    assert seqs(c.fetch(1, 5 * S)) == [1]


def test_reset_to_sequence_and_to_ack_floor(rig: Rig) -> None:
    """Reset drops pending acks and delivers again from the sequence (default: above the
    ack floor)."""
    for _ in range(5):
        rig.publish()
    c = rig.consumer(ack_wait=100 * S)
    c.fetch(4, 0)
    c.ack(1, 1)
    assert c.reset() == 2
    assert c.info(1).num_ack_pending == 0
    assert seqs(c.fetch(10, 1)) == [2, 3, 4, 5]
    c.reset(4)
    assert seqs(c.fetch(10, 2)) == [4, 5]
    with pytest.raises(InvalidArgumentError):
        c.reset(-1)


def test_info_reports_jetstream_counters(rig: Rig) -> None:
    """delivered, ack floor, num_ack_pending, num_redelivered, num_pending, num_waiting.

    The consumer part of the ack floor is below the oldest outstanding delivery: deliveries
    2 and 3 were superseded by the redeliveries 4 and 5, so nothing at or below 3 is owed.
    """
    for _ in range(6):
        rig.publish()
    c = rig.consumer(ack_wait=S)
    c.fetch(3, 0)
    c.ack(1, 0)
    c.fetch(3, S)  # 2 and 3 redelivered, 4 new
    info = c.info(S)
    assert (info.delivered.consumer_seq, info.delivered.stream_seq) == (6, 4)
    assert (info.ack_floor.consumer_seq, info.ack_floor.stream_seq) == (3, 1)
    assert info.num_ack_pending == 3 and info.num_redelivered == 2
    assert info.num_pending == 2 and info.num_waiting == 0 and not info.paused


def test_inactive_threshold_for_ephemerals(rig: Rig) -> None:
    """inactive_threshold: an ephemeral with no request or ack for that long may be reaped."""
    cfg = ConsumerConfig(inactive_threshold=5 * S)
    c = Consumer.create(stream="S", name="e", config=cfg, store=rig.store, now_ns=0)
    assert not c.is_inactive(4 * S)
    c.fetch(1, 4 * S)
    assert not c.is_inactive(8 * S) and c.is_inactive(9 * S)


def test_delete_removes_state_and_refuses_later_calls(rig: Rig) -> None:
    """Deleting a consumer removes its persisted state; the object refuses further use."""
    c = rig.consumer()
    c.delete()
    assert rig.cstore.names("S") == []
    with pytest.raises(PreconditionError):
        c.fetch(1, 0)
    with pytest.raises(NotFoundError):
        rig.reopen()


# -- replication and persistence --------------------------------------------------------------


def test_follower_applying_leader_ops_reaches_the_same_state(rig: Rig) -> None:
    """Replication contract: the ops a leader applied, applied in order by a follower over
    the same stream, give the same state (ops also survive their byte encoding)."""
    for _ in range(6):
        rig.publish()
    cfg = ConsumerConfig(durable_name="c", ack_wait=S, max_deliver=2, max_ack_pending=3)
    leader = Consumer.create(
        stream="S", name="c", config=cfg, store=rig.store, now_ns=0, record_ops=True
    )
    leader.fetch(3, 0)
    leader.ack(2, 1)
    leader.nak(3, 1, delay_ns=10)
    leader.fetch(3, 2 * S)
    leader.fetch(3, 4 * S)
    leader.term(4, 4 * S)
    leader.reset(5)
    leader.fetch(3, 5 * S)
    ops = leader.take_ops()
    assert any(isinstance(op, Deliver) and len(op.stream_seqs) > 1 for op in ops)
    follower = Consumer(
        stream="S", name="c", config=cfg, store=rig.store, state=type(leader.state)()
    )
    events = follower.apply_many(decode_op(encode_op(op)) for op in ops)
    assert follower.state == leader.state
    assert [e.kind for e in events] == [e.kind for e in leader.drain_advisories()]
    assert decode_state(encode_state(leader.state)) == leader.state


def test_a_run_of_new_deliveries_is_one_op_with_per_message_decisions(rig: Rig) -> None:
    """The leader decides a run of new messages as ONE Deliver op, with exactly the
    per-message decisions: round-robin over waiting requests, 409 when a message exceeds a
    request's bytes left (after its deliveries, in its own order), consumer sequences and
    num_pending per delivery, and max_ack_pending stopping the run; a follower applying the
    op reaches the leader's state."""
    cfg = ConsumerConfig(durable_name="c", ack_wait=S, max_ack_pending=6)
    leader = Consumer.create(
        stream="S", name="c", config=cfg, store=rig.store, now_ns=0, record_ops=True
    )
    follower = Consumer.create(stream="S", name="c", config=cfg, store=rig.store, now_ns=0)
    leader.take_ops()
    assert leader.pull(PullRequest(batch=3, max_bytes=5, reply="A"), 1) == []
    assert leader.pull(PullRequest(batch=5, reply="B"), 1) == []
    for i in range(8):
        rig.publish(data=b"x" * (20 if i == 3 else 1))  # seq 4 is 21 bytes, the others 2
    events = leader.poll(2)
    by_reply: dict[str, list[Any]] = {"A": [], "B": []}
    for e in events:
        by_reply[e.reply].append(e.delivery.stream_seq if e.delivery else e.status.code)
    assert by_reply == {"A": [1, 3, StatusCode.CONFLICT], "B": [2, 4, 5, 6]}
    deliveries = [e.delivery for e in events if e.delivery is not None]
    assert [d.consumer_seq for d in deliveries] == [1, 2, 3, 4, 5, 6]
    assert [d.num_pending for d in deliveries] == [7, 6, 5, 4, 3, 2]
    assert all(d.deliveries == 1 for d in deliveries)
    assert leader.take_ops() == [Deliver(stream_seqs=(1, 2, 3, 4, 5, 6), now_ns=2)]
    assert leader.num_waiting == 1  # B still wants one: max_ack_pending holds it back
    follower.apply_many([Deliver(stream_seqs=(1, 2, 3, 4, 5, 6), now_ns=2)])
    assert follower.state == leader.state
    assert leader.num_pending() == follower.num_pending() == 2


def test_state_survives_reopen(rig: Rig) -> None:
    """Consumer state persists beside the stream and is the same after a reopen."""
    for _ in range(5):
        rig.publish()
    c = rig.consumer(ack_wait=S, filter_subject="a")
    c.fetch(4, 0)
    c.ack(2, 1)
    c.nak(3, 1, delay_ns=7)
    c.pause(3)
    before = encode_state(c.state)
    again = rig.reopen()
    assert encode_state(again.state) == before
    assert again.config == c.config
    assert seqs(again.fetch(10, 10 * S)) == [3, 1, 4, 5]  # earliest deadline first
    c2 = rig.reopen()
    c2.reset(1)
    assert rig.reopen().state.pending == {}


def test_corrupt_lmdb_record_is_data_loss(tmp_path: Path) -> None:
    """A flipped bit in a stored consumer record is a DATA_LOSS error, never wrong state."""
    r = Rig("lmdb", tmp_path / "node")
    try:
        r.publish()
        c = r.consumer()
        c.fetch(1, 0)
        db = r.env.open_db(DB_PENDING)
        with r.env.begin(write=True, db=db) as txn:
            key, value = next(iter(txn.cursor()))
            txn.put(key, value[:-1] + bytes([value[-1] ^ 1]))
        with pytest.raises(DataLossError):
            r.reopen()
    finally:
        r.close()


def test_many_consumers_share_one_environment(tmp_path: Path) -> None:
    """Consumers of several streams live in the same two named DBs, apart by key prefix."""
    env = open_node_env(tmp_path / "n", map_size_bytes=MAP_BYTES, sync=False)
    try:
        cs = LmdbConsumerStore(env=env)
        for stream in ("S", "S2"):
            store = LmdbStreamStore(env, stream)
            store.append("a", b"x", now_ns=1)
            for name in ("x", "y"):
                cfg = ConsumerConfig(durable_name=name)
                c = Consumer.create(
                    stream=stream, name=name, config=cfg, store=store, now_ns=0, state_store=cs
                )
                c.fetch(1, 0)
        assert cs.names("S") == ["x", "y"] and cs.names("S2") == ["x", "y"]
        cs.remove(
            next(k for k in [Consumer.open(stream="S", name="x", store=store, state_store=cs).key])
        )
        assert cs.names("S") == ["y"]
        loaded = cs.load(Consumer.open(stream="S2", name="x", store=store, state_store=cs).key)
        assert loaded is not None and sorted(loaded[1].pending) == [1]
    finally:
        env.close()


def test_ack_op_encoding_round_trip() -> None:
    """Replicated ops decode to what was encoded (full u64 range, negative times)."""
    op = Ack(stream_seqs=(1, 5, 2**63), now_ns=-5)
    assert decode_op(encode_op(op)) == op


def test_repeated_progress_keeps_the_deadline_heap_bounded(rig: Rig) -> None:
    """+WPI may be sent forever; stale deadline entries are compacted, not accumulated."""
    rig.publish()
    c = rig.consumer(ack_wait=10 * S)
    c.fetch(1, 0)
    c.apply_many(Progress(stream_seq=1, now_ns=t) for t in range(5000))
    assert len(c._heap) <= 2 + HEAP_SLACK_ENTRIES  # internal, but the bound is the point
    assert c.fetch(1, 4999 + 10 * S - 1) == []
    assert seqs(c.fetch(1, 4999 + 10 * S)) == [1]


def test_config_update_is_persisted_with_the_state(rig: Rig) -> None:
    """An allowed update (here ack_wait) takes effect at once and survives a reopen."""
    rig.publish()
    c = rig.consumer(ack_wait=S)
    c.update_config(ConsumerConfig(durable_name="c", ack_wait=5 * S))
    c.fetch(1, 0)
    assert c.fetch(1, S) == []
    again = rig.reopen()
    assert again.config.ack_wait == 5 * S
    assert seqs(again.fetch(1, 5 * S)) == [1]
