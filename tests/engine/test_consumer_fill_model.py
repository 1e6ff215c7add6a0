"""The leader's run of new deliveries (``Consumer._fill_new``: ONE Deliver op for a run)
against the per-message path (``_candidate`` + ``_hand_out``, one op per message) as oracle.

A hypothesis rule-based machine drives two consumers with the same configuration over two
stores holding the same messages (memory, or LMDB): one as the engine runs it, one whose
``_fill_new`` never takes a run, so every message goes through the per-message path.
Several requests wait at
once (round-robin, ``max_bytes`` 409s, expiries, no_wait, idle heartbeats), with several
filters, every deliver policy, acks of every kind, pauses, deletions and retention removals
(a listener deletes what the consumer released, as workqueue retention does). After each
step both must have answered the same events (each delivery's consumer sequence, delivery
count and num_pending included), replicated the same ops and reached the same state.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig, DeliverPolicy
from raftstream.engine.consumer_pull import PullEvent, PullRequest
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import StreamStore

SUBJECTS = ("a.1", "a.2", "b.1", "c.1")
ACK_WAIT = 10


class _PerMessage(Consumer):
    """The oracle: never a run; every message through ``_candidate`` + ``_hand_out``."""

    def _fill_new(self, now_ns: int, events: list[PullEvent]) -> bool:
        return False


class _Removes:
    """Retention as a workqueue stream does it: a released message leaves the store."""

    def __init__(self, store: StreamStore) -> None:
        self.store = store
        self.removed: list[int] = []

    def released(self, consumer: Consumer, stream_seqs: Sequence[int], *, rescan: bool) -> None:
        for seq in stream_seqs:
            if self.store.delete(seq):
                self.removed.append(seq)


class FillMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.replies = 0
        self.dir: Path | None = None
        self.env: Any = None

    @initialize(
        kind=st.sampled_from(["memory", "lmdb"]),
        ack_policy=st.sampled_from(list(AckPolicy)),
        cap=st.sampled_from([-1, 1, 3, 8]),
        filters=st.sampled_from([(), ("a.*",), ("a.1", "b.1"), ("a.2", "b.*", "c.1")]),
        deliver=st.sampled_from(
            [
                DeliverPolicy.ALL,
                DeliverPolicy.LAST,
                DeliverPolicy.NEW,
                DeliverPolicy.LAST_PER_SUBJECT,
                DeliverPolicy.BY_START_SEQUENCE,
            ]
        ),
        headers_only=st.booleans(),
        retention=st.booleans(),
        initial=st.lists(st.sampled_from(SUBJECTS), max_size=6),
    )
    def setup(
        self,
        kind: str,
        ack_policy: AckPolicy,
        cap: int,
        filters: tuple[str, ...],
        deliver: DeliverPolicy,
        headers_only: bool,
        retention: bool,
        initial: list[str],
    ) -> None:
        acks = ack_policy is not AckPolicy.NONE
        if deliver is DeliverPolicy.LAST_PER_SUBJECT and not filters:
            filters = ("a.*", "c.1")  # it needs a filter
        self.config = ConsumerConfig(
            durable_name="c",
            ack_policy=ack_policy,
            ack_wait=ACK_WAIT,
            max_deliver=3,
            max_ack_pending=cap if acks else 0,
            filter_subjects=filters,
            deliver_policy=deliver,
            opt_start_seq=2 if deliver is DeliverPolicy.BY_START_SEQUENCE else 0,
            headers_only=headers_only,
            max_waiting=3,
        )
        self.stores: tuple[StreamStore, StreamStore]
        if kind == "lmdb":  # its chunked scans and index reads (two streams, one env)
            self.dir = Path(tempfile.mkdtemp(prefix="consumer-fill-"))
            self.env = open_node_env(self.dir, map_size_bytes=1 << 26, sync=False)
            self.stores = (LmdbStreamStore(self.env, "S1"), LmdbStreamStore(self.env, "S2"))
        else:
            self.stores = (MemoryStreamStore(), MemoryStreamStore())
        for subject in initial:
            self._append(subject, 1)
        self.listeners = tuple(_Removes(s) for s in self.stores) if retention else (None, None)
        self.fast, self.slow = (
            kind.create(
                stream="S",
                name="c",
                config=self.config,
                store=self.stores[i],
                now_ns=0,
                retention=self.listeners[i],
                record_ops=True,
            )
            for i, kind in enumerate((Consumer, _PerMessage))
        )
        self._same(self.fast.take_ops(), self.slow.take_ops())

    def teardown(self) -> None:
        if self.env is not None:
            self.env.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _append(self, subject: str, size: int) -> None:
        seqs = {s.append(subject, b"x" * size, now_ns=self.now) for s in self.stores}
        assert len(seqs) == 1

    def _same(self, fast: Any, slow: Any) -> None:
        assert fast == slow

    def _both(self, call: str, *args: Any, **kwargs: Any) -> None:
        fast = getattr(self.fast, call)(*args, **kwargs)
        slow = getattr(self.slow, call)(*args, **kwargs)
        self._same(fast, slow)
        self._same(self.fast.take_ops(), self.slow.take_ops())

    # -- rules ----------------------------------------------------------------------------

    @rule(subject=st.sampled_from(SUBJECTS), size=st.sampled_from([1, 4, 12]))
    def publish(self, subject: str, size: int) -> None:
        self._append(subject, size)

    @rule(subjects=st.lists(st.sampled_from(SUBJECTS), min_size=2, max_size=8))
    def publish_run_then_poll(self, subjects: list[str]) -> None:
        for subject in subjects:
            self._append(subject, 1)
        self._both("poll", self.now)

    @rule(pick=st.integers(0, 50))
    def delete(self, pick: int) -> None:
        last = self.stores[0].state().last_seq
        if not last:
            return
        seq = pick % last + 1
        assert self.stores[0].delete(seq) == self.stores[1].delete(seq)

    @rule(dt=st.sampled_from([1, 5, 10, 25]))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule(
        batch=st.integers(1, 6),
        max_bytes=st.sampled_from([0, 0, 20, 60, 200]),
        expires=st.sampled_from([0, 15, 40]),
        no_wait=st.booleans(),
        heartbeat=st.booleans(),
    )
    def pull(
        self, batch: int, max_bytes: int, expires: int, no_wait: bool, heartbeat: bool
    ) -> None:
        self.replies += 1
        req = PullRequest(
            batch=batch,
            max_bytes=max_bytes,
            expires=expires,
            no_wait=no_wait,
            idle_heartbeat=5 if heartbeat and expires >= 10 else 0,
            reply=f"r{self.replies}",
        )
        self._both("pull", req, self.now)

    @rule()
    def poll(self) -> None:
        self._both("poll", self.now)

    def _target(self, pick: int) -> int:
        pending = sorted(self.fast.state.pending)
        return pending[pick % len(pending)] if pending and pick < 40 else pick

    @rule(pick=st.integers(0, 50), kind=st.sampled_from(["ack", "term", "progress", "nak"]))
    def settle(self, pick: int, kind: str) -> None:
        seq = self._target(pick)
        if kind == "nak":
            self._both("nak", seq, self.now, delay_ns=3)
        else:
            self._both(kind, seq, self.now)

    @rule(until=st.sampled_from([0, 5, 30]))
    def pause(self, until: int) -> None:
        if until:
            self._both("pause", self.now + until)
        else:
            self._both("resume")

    # -- invariants -----------------------------------------------------------------------

    @invariant()
    def agree(self) -> None:
        if not hasattr(self, "fast"):
            return
        self._same(self.fast.state, self.slow.state)
        self._same(self.fast.num_pending(), self.slow.num_pending())
        self._same(self.fast.num_waiting, self.slow.num_waiting)
        self._same(self.fast.info(self.now), self.slow.info(self.now))
        if self.listeners[0] is not None and self.listeners[1] is not None:
            self._same(self.listeners[0].removed, self.listeners[1].removed)


TestFillModel = FillMachine.TestCase
TestFillModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
