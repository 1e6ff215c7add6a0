"""Interest and workqueue retention through the stream's hook (``engine/stream.py``).

Pins JetStream's retention: on an interest stream a message goes once every consumer whose
filter matches it has acked it, and a message nobody is interested in is not kept; deleting
the last interested consumer releases its holds. On a workqueue stream a message goes once
its consumer acks it, and two consumers may never take the same subject.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig, RetentionKind
from raftstream.engine.entries import Publish
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.retention import ConsumerSet
from raftstream.engine.store import StreamStore
from raftstream.engine.stream import Stream
from raftstream.engine.stream_config import RetentionPolicy, StreamConfig
from raftstream.engine.subjects import subject_matches
from raftstream.errors import AlreadyExistsError, InvalidArgumentError

S = NS_PER_S


class Rig:
    def __init__(self, retention: RetentionPolicy, store: StreamStore) -> None:
        self.stream = Stream(
            StreamConfig(name="S", subjects=("a.>", "b.>"), retention=retention), store
        )
        self.set = ConsumerSet(retention=RetentionKind(retention.value), stream=self.stream)
        self.stream.set_retention_hook(self.set)
        self.ts = 0

    def publish(self, subject: str) -> None:
        self.ts += 1
        self.stream.apply(Publish(ts_ns=self.ts, subject=subject, data=b"x"))

    def add(self, name: str, **cfg: Any) -> Consumer:
        c = Consumer.create(
            stream="S",
            name=name,
            config=ConsumerConfig(durable_name=name, **cfg),
            store=self.stream.store,
            now_ns=self.ts,
            retention=self.set,
        )
        self.set.add(c)
        return c

    def stored(self) -> list[int]:
        return [m.seq for m in self.stream.store.iter_from(1)]


@pytest.fixture(params=["memory", "lmdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamStore]:
    if request.param == "memory":
        yield MemoryStreamStore()
        return
    env = open_node_env(tmp_path / "node", map_size_bytes=1 << 28, sync=False)
    yield LmdbStreamStore(env, "S")
    env.close()


def test_interest_message_goes_when_every_matching_consumer_acked(store: StreamStore) -> None:
    """Interest: removed once all consumers whose filter matches it have acked it."""
    r = Rig(RetentionPolicy.INTEREST, store)
    x = r.add("x", filter_subject="a.>")
    y = r.add("y")
    r.publish("a.1")
    r.publish("b.1")
    assert r.stored() == [1, 2]
    x.fetch(5, 0)
    x.ack(1, 1)
    assert r.stored() == [1, 2]  # y still holds 1
    y.fetch(5, 0)
    y.ack(1, 1)
    assert r.stored() == [2]
    y.ack(2, 1)  # only y's filter matches b.1
    assert r.stored() == []


def test_interest_without_matching_consumer_keeps_nothing(store: StreamStore) -> None:
    """Interest: a message no consumer's filter matches is not stored (JetStream acks it)."""
    r = Rig(RetentionPolicy.INTEREST, store)
    r.publish("a.1")
    r.add("x", filter_subject="b.>")
    r.publish("a.2")
    r.publish("b.2")
    assert r.stored() == [3]


def test_term_and_max_deliveries_release_on_interest(store: StreamStore) -> None:
    """+TERM and an exhausted max_deliver settle the message for retention too."""
    r = Rig(RetentionPolicy.INTEREST, store)
    x = r.add("x", ack_wait=S, max_deliver=1)
    r.publish("a.1")
    r.publish("a.2")
    x.fetch(2, 0)
    x.term(1, 1)
    assert r.stored() == [2]
    x.fetch(2, S)
    assert r.stored() == []


def test_ack_none_consumer_releases_on_delivery(store: StreamStore) -> None:
    """Interest: an ack-none consumer settles a message when it delivers it."""
    r = Rig(RetentionPolicy.INTEREST, store)
    x = r.add("x", ack_policy="none")
    r.publish("a.1")
    x.fetch(1, 0)
    assert r.stored() == []


def test_deleting_the_last_interested_consumer_releases_holds(store: StreamStore) -> None:
    """Interest: when a consumer goes, messages only it held go too."""
    r = Rig(RetentionPolicy.INTEREST, store)
    x = r.add("x", filter_subject="a.>")
    y = r.add("y", filter_subject="b.>")
    for subj in ("a.1", "b.1", "a.2"):
        r.publish(subj)
    x.fetch(1, 0)  # 1 pending, 3 undelivered: both held by x
    x.delete()
    assert r.stored() == [2]
    assert "x" not in r.set and len(r.set) == 1
    y.delete()
    assert r.stored() == []


def test_reset_of_an_interest_consumer_sweeps(store: StreamStore) -> None:
    """Interest: messages a consumer skips by a reset are released."""
    r = Rig(RetentionPolicy.INTEREST, store)
    x = r.add("x")
    for _ in range(3):
        r.publish("a.1")
    x.reset(3)  # x gives up 1 and 2
    assert r.stored() == [3]


def test_workqueue_removes_on_ack(store: StreamStore) -> None:
    """Workqueue: a message goes once its consumer acks it; unacked ones stay."""
    r = Rig(RetentionPolicy.WORKQUEUE, store)
    x = r.add("x", filter_subject="a.>")
    r.publish("a.1")
    r.publish("a.2")
    r.publish("b.1")  # no consumer takes b.*: it waits
    x.fetch(2, 0)
    x.ack(2, 1)
    assert r.stored() == [1, 3]
    x.delete()
    assert r.stored() == [1, 3]  # workqueue items wait for the next consumer


def test_workqueue_refuses_overlapping_consumers(store: StreamStore) -> None:
    """Workqueue: only one consumer may take a given subject."""
    r = Rig(RetentionPolicy.WORKQUEUE, store)
    r.add("x", filter_subject="a.>")
    with pytest.raises(InvalidArgumentError):
        r.add("y", filter_subject="a.1")
    with pytest.raises(InvalidArgumentError):
        r.add("z")
    r.add("w", filter_subject="b.*")
    w = r.set.get("w")
    assert w is not None
    with pytest.raises(AlreadyExistsError):
        r.set.add(w)


def test_limits_streams_ignore_acks(store: StreamStore) -> None:
    """Limits retention: acks never remove messages."""
    r = Rig(RetentionPolicy.LIMITS, store)
    x = r.add("x")
    r.publish("a.1")
    x.fetch(1, 0)
    x.ack(1, 1)
    assert r.stored() == [1]
    assert r.set.is_needed(1, "a.1")


class InterestMachine(RuleBasedStateMachine):
    """Interest retention against a model: a message is stored exactly while some live
    consumer whose filter matches it has not settled it (acked or terminated)."""

    FILTERS = {"x": "a.>", "y": ">", "z": "b.*"}

    def __init__(self) -> None:
        super().__init__()
        self.rig = Rig(RetentionPolicy.INTEREST, MemoryStreamStore())
        self.live = {name: self.rig.add(name, filter_subject=f) for name, f in self.FILTERS.items()}
        self.subjects: dict[int, str] = {}
        self.settled: dict[str, set[int]] = {name: set() for name in self.FILTERS}
        self.now = 0

    @rule(subject=st.sampled_from(["a.1", "a.2", "b.1", "b.2.x"]))
    def publish(self, subject: str) -> None:
        self.rig.publish(subject)
        self.subjects[self.rig.stream.store.state().last_seq] = subject

    @rule(name=st.sampled_from(sorted(FILTERS)), batch=st.integers(1, 4), term=st.booleans())
    def fetch_and_settle(self, name: str, batch: int, term: bool) -> None:
        c = self.live.get(name)
        if c is None:
            return
        self.now += 1
        got = c.fetch(batch, self.now)
        if got:
            seq = got[0].stream_seq
            if term:
                c.term(seq, self.now)
            else:
                c.ack(seq, self.now)
            self.settled[name].add(seq)

    @rule(name=st.sampled_from(sorted(FILTERS)))
    def delete(self, name: str) -> None:
        c = self.live.pop(name, None)
        if c is not None:
            c.delete()

    @invariant()
    def stored_is_what_someone_still_holds(self) -> None:
        def held(seq: int, subject: str) -> bool:
            return any(
                subject_matches(self.FILTERS[n], subject) and seq not in self.settled[n]
                for n in self.live
            )

        expected = [s for s, subj in sorted(self.subjects.items()) if held(s, subj)]
        assert self.rig.stored() == expected


TestInterestModel = InterestMachine.TestCase
TestInterestModel.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
