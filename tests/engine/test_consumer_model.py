"""A hypothesis rule-based state machine: the consumer against a plain-Python model.

Random publishes, deletes, fetches, acks of every kind (+ACK, -NAK with and without delay,
+WPI, +TERM), time advancing on a fake clock, and reopening from the state store (memory
twin and LMDB). The model predicts every fetch exactly, which checks JetStream's promises:

- no acked (or terminated, or given-up) message is handed out again;
- every unacked message comes back once its deadline passed, until max_deliver, oldest
  deadline first and before any new message;
- max_ack_pending stops new deliveries;
- the ack floor never moves backwards; num_pending and num_ack_pending are exact.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.engine.consumer_store import LmdbConsumerStore, MemoryConsumerStore
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.subjects import subject_matches

SUBJECTS = ("a.1", "a.2", "b.1")
ACK_WAIT = 10


class Model:
    """What the consumer should do, in plain dicts and sets."""

    def __init__(
        self,
        *,
        ack_policy: AckPolicy,
        max_deliver: int,
        cap: int,
        backoff: tuple[int, ...],
        flt: str,
    ) -> None:
        self.ack_policy = ack_policy
        self.max_deliver = max_deliver
        self.cap = cap
        self.backoff = backoff
        self.filter = flt
        self.msgs: dict[int, str] = {}
        self.cursor = 0
        self.pending: dict[int, tuple[int, int]] = {}  # seq -> (deliveries, deadline)
        self.settled: set[int] = set()
        self.floor = 0

    def wait(self, n: int) -> int:
        if not self.backoff:
            return ACK_WAIT
        return self.backoff[min(n, len(self.backoff)) - 1]

    def fetch(self, batch: int, now: int) -> list[int]:
        out: list[int] = []
        for deadline, seq in sorted((d, s) for s, (_, d) in self.pending.items()):
            if deadline > now or len(out) == batch:
                break
            n = self.pending[seq][0]
            if (self.max_deliver != -1 and n >= self.max_deliver) or seq not in self.msgs:
                del self.pending[seq]
                self.settled.add(seq)
                continue
            out.append(seq)
            self.pending[seq] = (n + 1, now + self.wait(n + 1))
        for seq in sorted(self.msgs):
            if len(out) == batch or (self.cap != -1 and len(self.pending) >= self.cap):
                break
            if seq <= self.cursor or not subject_matches(self.filter, self.msgs[seq]):
                continue
            out.append(seq)
            self.cursor = seq
            if self.ack_policy is AckPolicy.NONE:
                self.settled.add(seq)
            else:
                self.pending[seq] = (1, now + self.wait(1))
        return out

    def settle(self, seqs: list[int]) -> None:
        if self.ack_policy is AckPolicy.NONE:
            return
        if self.ack_policy is AckPolicy.ALL:
            top = max(seqs)
            seqs = [s for s in self.pending if s <= top]
        for s in seqs:
            if self.pending.pop(s, None) is not None:
                self.settled.add(s)

    def num_pending(self) -> int:
        return sum(
            1
            for s, subj in self.msgs.items()
            if s > self.cursor and subject_matches(self.filter, subj)
        )

    def expected_floor(self) -> int:
        low = min(self.pending) - 1 if self.pending else self.cursor
        return max(self.floor, low)


class ConsumerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir: Path | None = None
        self.env: Any = None
        self.now = 0

    @initialize(
        kind=st.sampled_from(["memory", "lmdb"]),
        ack_policy=st.sampled_from(list(AckPolicy)),
        max_deliver=st.sampled_from([-1, 1, 3]),
        cap=st.sampled_from([-1, 2, 5]),
        backoff=st.sampled_from([(), (5, 20)]),
        flt=st.sampled_from([">", "a.*"]),
    )
    def setup(
        self,
        kind: str,
        ack_policy: AckPolicy,
        max_deliver: int,
        cap: int,
        backoff: tuple[int, ...],
        flt: str,
    ) -> None:
        acks = ack_policy is not AckPolicy.NONE
        backoff = backoff if acks else ()
        if backoff and max_deliver != -1:
            max_deliver = max(max_deliver, len(backoff))
        cap = cap if acks else -1
        self.model = Model(
            ack_policy=ack_policy, max_deliver=max_deliver, cap=cap, backoff=backoff, flt=flt
        )
        self.config = ConsumerConfig(
            durable_name="c",
            ack_policy=ack_policy,
            ack_wait=ACK_WAIT,
            max_deliver=max_deliver,
            max_ack_pending=cap if acks else 0,
            backoff=backoff,
            filter_subject=None if flt == ">" else flt,
        )
        self.kind = kind
        if kind == "lmdb":
            self.dir = Path(tempfile.mkdtemp(prefix="consumer-model-"))
        self._open_stores()
        self.c = Consumer.create(
            stream="S",
            name="c",
            config=self.config,
            store=self.store,
            now_ns=0,
            state_store=self.cstore,
        )

    def _open_stores(self) -> None:
        if self.kind == "memory":
            if not hasattr(self, "store"):
                self.store: Any = MemoryStreamStore()
                self.cstore: Any = MemoryConsumerStore()
            return
        assert self.dir is not None
        self.env = open_node_env(self.dir, map_size_bytes=1 << 26, sync=False)
        self.store = LmdbStreamStore(self.env, "S")
        self.cstore = LmdbConsumerStore(env=self.env)

    def teardown(self) -> None:
        if self.env is not None:
            self.env.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- rules ----------------------------------------------------------------------------

    @rule(subject=st.sampled_from(SUBJECTS))
    def publish(self, subject: str) -> None:
        seq = self.store.append(subject, b"m", now_ns=self.now)
        self.model.msgs[seq] = subject

    @rule(pick=st.integers(0, 50))
    def delete(self, pick: int) -> None:
        if not self.model.msgs:
            return
        seq = sorted(self.model.msgs)[pick % len(self.model.msgs)]
        assert self.store.delete(seq)
        del self.model.msgs[seq]

    @rule(dt=st.sampled_from([1, 5, 10, 25]))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule(batch=st.integers(1, 6))
    def fetch(self, batch: int) -> None:
        got = self.c.fetch(batch, self.now)
        seqs = [d.stream_seq for d in got]
        settled_before = set(self.model.settled)
        expected = self.model.fetch(batch, self.now)
        assert not set(seqs) & settled_before, "an acked message was handed out again"
        assert seqs == expected
        for d in got:
            if self.model.ack_policy is not AckPolicy.NONE:
                assert d.deliveries == self.model.pending[d.stream_seq][0]

    def _target(self, pick: int) -> int:
        candidates = sorted(self.model.pending) or sorted(self.model.msgs) or [1]
        return candidates[pick % len(candidates)] if pick < 40 else pick  # sometimes unknown

    @rule(pick=st.integers(0, 60))
    def ack(self, pick: int) -> None:
        seq = self._target(pick)
        self.c.ack(seq, self.now)
        self.model.settle([seq])

    @rule(pick=st.integers(0, 60))
    def term(self, pick: int) -> None:
        seq = self._target(pick)
        self.c.term(seq, self.now, reason="t")
        if self.model.ack_policy is not AckPolicy.NONE and self.model.pending.pop(seq, None):
            self.model.settled.add(seq)

    @rule(pick=st.integers(0, 60), delay=st.sampled_from([0, 3, 30]))
    def nak(self, pick: int, delay: int) -> None:
        seq = self._target(pick)
        self.c.nak(seq, self.now, delay_ns=delay)
        if self.model.ack_policy is not AckPolicy.NONE and seq in self.model.pending:
            n, _ = self.model.pending[seq]
            self.model.pending[seq] = (n, self.now + delay)

    @rule(pick=st.integers(0, 60))
    def progress(self, pick: int) -> None:
        seq = self._target(pick)
        self.c.progress(seq, self.now)
        if self.model.ack_policy is not AckPolicy.NONE and seq in self.model.pending:
            n, _ = self.model.pending[seq]
            self.model.pending[seq] = (n, self.now + self.model.wait(n))

    @rule()
    def reopen(self) -> None:
        if self.kind == "lmdb":
            self.env.close()
            self._open_stores()
        self.c = Consumer.open(stream="S", name="c", store=self.store, state_store=self.cstore)

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        if not hasattr(self, "c"):
            return
        m = self.model
        state = self.c.state
        assert {s: (p.deliveries, p.deadline_ns) for s, p in state.pending.items()} == m.pending
        info = self.c.info(self.now)
        assert info.num_pending == m.num_pending()
        assert info.num_ack_pending == len(m.pending)
        floor = m.expected_floor()
        assert info.ack_floor.stream_seq == floor
        assert floor >= m.floor, "the ack floor moved backwards"
        m.floor = floor
        assert info.delivered.stream_seq == m.cursor


TestConsumerModel = ConsumerMachine.TestCase
TestConsumerModel.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)
