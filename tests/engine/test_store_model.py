"""Model-based test: both stream stores against a plain-Python model of JetStream's rules.

A hypothesis ``RuleBasedStateMachine`` appends (random subjects, sizes, headers, TTLs),
deletes, purges (all, by filter, below a sequence, keep N, and the combinations JetStream
allows), changes limits, expires with time moving forward, groups operations in transactions
that commit or abort, and closes and reopens the LMDB environment. After every step the
memory store, the LMDB store and the model must agree on the state, every message and the
subject lookups. The model is deliberately naive (a dict and linear scans) so that its
reading of the rules is easy to check against the JetStream documentation:

- discard old: after storing, the subject's oldest go first (max_msgs_per_subject), then the
  stream's oldest (max_msgs, max_bytes), then those ``max_age`` old;
- discard new: max_msgs / max_bytes (and max_msgs_per_subject with discard_new_per_subject)
  refuse the message and nothing changes; max_msg_size refuses under either policy;
- purge ``seq`` is exclusive and, without a subject, compacts (first_seq >= seq);
- an empty stream that used sequences has first_seq = last_seq + 1;
- dedup records (msg id -> seq, ts) are untouched by every message operation; a put
  replaces the id's record; ``dedup_expire`` removes up to ``limit`` records older than its
  bound in (ts, ``dedup_key``) order; all of it commits or aborts with its transaction.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import (
    DEDUP_EXPIRE_RECORDS_MAX,
    DedupRecord,
    DiscardPolicy,
    StoredMsg,
    StoreLimits,
    StreamState,
    dedup_key,
)
from raftstream.engine.subjects import subject_matches
from raftstream.errors import InvalidArgumentError, LimitError, NotFoundError

SEC_NS = 1_000_000_000
SUBJECTS = ["a", "a.b", "a.c", "b.c", "c"]
FILTERS = [">", "a", "a.*", "*.c", "b.>", "*", "a.b", "zz"]
MSG_IDS = ["x1", "x2", "x3", "é✓", "long-" + "z" * 600]
MAP_SIZE_BYTES = 64 * 1024 * 1024


class Refused(Exception):
    """The model's LimitError."""


@dataclass
class Model:
    """JetStream's stream rules over a dict of messages, as plainly as possible."""

    limits: StoreLimits = field(default_factory=StoreLimits)
    msgs: dict[int, StoredMsg] = field(default_factory=dict)
    first: int = 0
    last: int = 0
    last_ts: int = 0
    dedup: dict[str, DedupRecord] = field(default_factory=dict)

    def dedup_records(self) -> list[DedupRecord]:
        """The records in expiry order: time, then the id's digest."""
        return sorted(self.dedup.values(), key=lambda r: (r.ts_ns, dedup_key(r.msg_id)))

    def dedup_expire(self, before_ts_ns: int, *, limit: int) -> int:
        due = [r for r in self.dedup_records() if r.ts_ns < before_ts_ns][:limit]
        for r in due:
            del self.dedup[r.msg_id]
        return len(due)

    def count(self, subject: str) -> int:
        return sum(1 for m in self.msgs.values() if m.subject == subject)

    def total_bytes(self) -> int:
        return sum(m.size for m in self.msgs.values())

    def remove(self, seq: int) -> None:
        del self.msgs[seq]
        if seq == self.first:
            self.first = min(self.msgs) if self.msgs else self.last + 1

    def append(self, msg: StoredMsg) -> int:
        lim = self.limits
        payload = len(msg.data) + sum(len(k) + len(v) for k, v in msg.headers.items())
        if lim.max_msg_size > 0 and payload > lim.max_msg_size:
            raise Refused
        if lim.discard is DiscardPolicy.NEW:
            if 0 < lim.max_msgs <= len(self.msgs):
                raise Refused
            if lim.max_bytes > 0 and self.total_bytes() + msg.size > lim.max_bytes:
                raise Refused
            per = lim.max_msgs_per_subject
            if lim.discard_new_per_subject and 0 < per <= self.count(msg.subject):
                raise Refused
        seq = self.last + 1
        if not self.msgs:
            self.first = seq
        self.msgs[seq] = StoredMsg(seq, msg.subject, msg.data, msg.ts, msg.headers, msg.ttl_ns)
        self.last = seq
        self.last_ts = msg.ts
        self.enforce(msg.ts, subjects=[msg.subject])
        return seq

    def enforce(self, now_ns: int, *, subjects: list[str]) -> None:
        lim = self.limits
        per = lim.max_msgs_per_subject
        for subject in subjects:
            while per > 0 and self.count(subject) > per:
                self.remove(min(s for s, m in self.msgs.items() if m.subject == subject))
        while 0 < lim.max_msgs < len(self.msgs):
            self.remove(min(self.msgs))
        while lim.max_bytes > 0 and self.msgs and self.total_bytes() > lim.max_bytes:
            self.remove(min(self.msgs))
        self.expire_age(now_ns)

    def expire_age(self, now_ns: int) -> int:
        n = 0
        while self.limits.max_age_ns > 0 and self.msgs:
            first = self.msgs[min(self.msgs)]
            if first.ts + self.limits.max_age_ns > now_ns:
                break
            self.remove(first.seq)
            n += 1
        return n

    def expire(self, now_ns: int) -> int:
        n = self.expire_age(now_ns)
        for seq in sorted(self.msgs):
            m = self.msgs[seq]
            if m.ttl_ns and m.ts + m.ttl_ns <= now_ns:
                self.remove(seq)
                n += 1
        return n

    def purge(self, subject: str | None, seq: int | None, keep: int | None) -> int:
        if subject == ">":
            subject = None
        seq, keep = seq or None, keep or None
        if seq is not None and keep is not None:
            raise InvalidArgumentError("seq", "exclusive")
        victims = sorted(
            s
            for s, m in self.msgs.items()
            if (subject is None or subject_matches(subject, m.subject)) and (seq is None or s < seq)
        )
        if keep is not None:
            victims = victims[: max(0, len(victims) - keep)]
        for s in victims:
            self.remove(s)
        if subject is None and keep is None:
            if seq is None:
                self.first = self.last + 1
            else:
                self.last = max(self.last, seq - 1)
                if not self.msgs:
                    self.first = self.last + 1
        return len(victims)

    def state(self) -> StreamState:
        subjects: dict[str, int] = {}
        for m in self.msgs.values():
            subjects[m.subject] = subjects.get(m.subject, 0) + 1
        n = len(self.msgs)
        return StreamState(
            first_seq=self.first,
            last_seq=self.last,
            msgs=n,
            bytes=self.total_bytes(),
            first_ts=self.msgs[min(self.msgs)].ts if n else 0,
            last_ts=self.last_ts,
            num_deleted=(self.last - self.first + 1 - n) if n else 0,
            num_subjects=len(subjects),
            subjects=subjects,
        )


limits_strategy = st.builds(
    StoreLimits,
    max_msgs=st.sampled_from([-1, 0, 3, 8, 20]),
    max_bytes=st.sampled_from([-1, 60, 200, 1000]),
    max_msgs_per_subject=st.sampled_from([-1, 1, 2, 5]),
    max_msg_size=st.sampled_from([-1, 10, 40]),
    max_age_ns=st.sampled_from([0, 2 * SEC_NS, 10 * SEC_NS]),
    discard=st.sampled_from(list(DiscardPolicy)),
    discard_new_per_subject=st.booleans(),
)
message_strategy = st.tuples(
    st.sampled_from(SUBJECTS),
    st.binary(max_size=48),
    st.sampled_from([{}, {"k": "v"}, {"Nats-Msg-Id": "x1", "h": ""}]),
    st.sampled_from([0, 0, SEC_NS, 4 * SEC_NS]),
)


class StoresAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="raftstream-store-model-")
        self.env: Any = open_node_env(self.path, map_size_bytes=MAP_SIZE_BYTES)
        self.model = Model()
        self.mem = MemoryStreamStore()
        self.lmdb = LmdbStreamStore(self.env, "MODEL")
        self.now_ns = SEC_NS

    def teardown(self) -> None:
        self.env.close()
        shutil.rmtree(self.path, ignore_errors=True)

    @property
    def stores(self) -> list[Any]:
        return [self.mem, self.lmdb]

    def _all(self, op: Any) -> Any:
        """Run ``op`` on the model and both stores; outcomes (result or error) must agree."""
        outcomes = []
        for target in [self.model, *self.stores]:
            try:
                outcomes.append(("ok", op(target)))
            except (LimitError, Refused):
                outcomes.append(("limit", None))
            except InvalidArgumentError:
                outcomes.append(("invalid", None))
        assert outcomes[1] == outcomes[0], (outcomes, op)
        assert outcomes[2] == outcomes[0], (outcomes, op)
        return outcomes[0][1]

    def _append_to(self, target: Any, msg: tuple[str, bytes, dict[str, str], int]) -> int:
        subject, data, headers, ttl = msg
        if isinstance(target, Model):
            return target.append(StoredMsg(0, subject, data, self.now_ns, headers, ttl))
        seq: int = target.append(subject, data, headers=headers, now_ns=self.now_ns, ttl_ns=ttl)
        return seq

    @rule(
        msgs=st.lists(message_strategy, min_size=1, max_size=8),
        dt_ns=st.sampled_from([0, 0, SEC_NS // 2, 3 * SEC_NS]),
    )
    def append(self, msgs: list[tuple[str, bytes, dict[str, str], int]], dt_ns: int) -> None:
        """Publish a few messages, each its own transaction: the store assigns
        last_seq + 1, then enforces limits."""
        for msg in msgs:
            self.now_ns += dt_ns
            self._all(lambda t, msg=msg: self._append_to(t, msg))

    @rule(msgs=st.lists(message_strategy, min_size=1, max_size=6), abort=st.booleans())
    def append_in_transaction(
        self, msgs: list[tuple[str, bytes, dict[str, str], int]], abort: bool
    ) -> None:
        """A batch in one transaction; an exception leaving it stores nothing of it."""
        if abort:
            for store in self.stores:
                try:
                    with store.transaction():
                        for msg in msgs:
                            with contextlib.suppress(LimitError):
                                self._append_to(store, msg)
                        store.purge(subject="a.>")
                        store.dedup_put("aborted", 1, self.now_ns)
                        store.dedup_expire(self.now_ns + 10 * SEC_NS)
                        raise _Abort
                except _Abort:
                    pass
            return
        model_results = []
        for msg in msgs:
            try:
                model_results.append(self._append_to(self.model, msg))
            except Refused:
                model_results.append(-1)
        for store in self.stores:
            results = []
            with store.transaction():
                for msg in msgs:
                    try:
                        results.append(self._append_to(store, msg))
                    except LimitError:
                        results.append(-1)
            assert results == model_results, type(store).__name__

    @rule(
        msg_id=st.sampled_from(MSG_IDS),
        seq=st.integers(min_value=1, max_value=40),
        dt_ns=st.sampled_from([-2 * SEC_NS, 0, 0, SEC_NS]),
    )
    def dedup_put(self, msg_id: str, seq: int, dt_ns: int) -> None:
        """Record a msg id (sometimes stamped before the last record: any order is legal)."""
        ts = max(0, self.now_ns + dt_ns)
        self.model.dedup[msg_id] = DedupRecord(msg_id, seq, ts)
        for store in self.stores:
            store.dedup_put(msg_id, seq, ts)

    @rule(
        dt_ns=st.sampled_from([-SEC_NS, 0, SEC_NS, 3 * SEC_NS]),
        limit=st.sampled_from([1, 2, DEDUP_EXPIRE_RECORDS_MAX]),
    )
    def dedup_expire(self, dt_ns: int, limit: int) -> None:
        """Bounded expiry of records older than a time near now: both stores remove the
        same records (oldest first, ties by digest)."""
        before = self.now_ns + dt_ns
        self._all(lambda t: t.dedup_expire(before, limit=limit))

    @rule(data=st.data(), erase=st.booleans())
    def delete(self, data: st.DataObject, erase: bool) -> None:
        """STREAM.MSG.DELETE: True when the message was there."""
        seq = data.draw(st.integers(min_value=0, max_value=self.model.last + 2))
        present = seq in self.model.msgs
        if present:
            self.model.remove(seq)
        for store in self.stores:
            assert store.delete(seq, erase=erase) is present

    @rule(
        data=st.data(),
        subject=st.sampled_from([None, ">", "a", "a.*", "*.c", "b.>", "nope"]),
        kind=st.sampled_from(["none", "seq", "keep", "both"]),
    )
    def purge(self, data: st.DataObject, subject: str | None, kind: str) -> None:
        """STREAM.PURGE with filter / seq / keep, as JetStream combines them."""
        seq = keep = None
        if kind in ("seq", "both"):
            seq = data.draw(st.integers(min_value=0, max_value=self.model.last + 3))
        if kind in ("keep", "both"):
            keep = data.draw(st.integers(min_value=0, max_value=4))

        def op(t: Any) -> int:
            if isinstance(t, Model):
                return t.purge(subject, seq, keep)
            removed: int = t.purge(subject=subject, seq=seq, keep=keep)
            return removed

        self._all(op)

    @rule(limits=limits_strategy)
    def update_limits(self, limits: StoreLimits) -> None:
        """Stream update: new limits apply at once (oldest messages go)."""
        self.model.limits = limits
        self.model.enforce(
            self.now_ns, subjects=sorted({m.subject for m in self.model.msgs.values()})
        )
        for store in self.stores:
            store.update_limits(limits, self.now_ns)

    @rule(dt_ns=st.sampled_from([SEC_NS, 2 * SEC_NS, 5 * SEC_NS]))
    def expire(self, dt_ns: int) -> None:
        """max_age and per-message TTL against the leader's clock moving forward."""
        self.now_ns += dt_ns
        self._all(lambda t: t.expire(self.now_ns))

    @precondition(lambda self: self.model.last < 10_000)
    @rule(gap=st.integers(min_value=1, max_value=3))
    def skip(self, gap: int) -> None:
        """Mirror/first_seq skips: the next append takes last_seq + gap."""
        target = self.model.last + gap
        self.model.last = target - 1
        if not self.model.msgs:
            self.model.first = target
        for store in self.stores:
            store.skip(target)

    @rule()
    def reopen(self) -> None:
        """Restart: close the LMDB environment and open the stream again."""
        self.lmdb.close()
        self.env.close()
        self.env = open_node_env(self.path, map_size_bytes=MAP_SIZE_BYTES)
        self.lmdb = LmdbStreamStore(self.env, "MODEL")
        assert self.lmdb.limits == self.model.limits

    @invariant()
    def states_agree(self) -> None:
        expected = self.model.state()
        for store in self.stores:
            got = store.state(subjects_filter=">")
            assert got == expected, (type(store).__name__, got, expected)

    @invariant()
    def messages_agree(self) -> None:
        expected = [self.model.msgs[s] for s in sorted(self.model.msgs)]
        for store in self.stores:
            assert list(store.iter_from(0)) == expected

    @invariant()
    def dedup_records_agree(self) -> None:
        expected = self.model.dedup_records()
        for store in self.stores:
            assert list(store.dedup_iter()) == expected, type(store).__name__
            for msg_id in MSG_IDS:
                assert store.dedup_get(msg_id) == self.model.dedup.get(msg_id)

    @invariant()
    def lookups_agree(self) -> None:
        """load_last / load_next / num_pending / iter_from for a few filters and starts."""
        m = self.model
        for flt in ("a", "a.*", "*.c"):
            for start in sorted({0, m.first, (m.first + m.last) // 2, m.last + 1}):
                self._check_lookup(flt, start)

    @rule(flt=st.sampled_from(FILTERS), data=st.data())
    def lookup(self, flt: str, data: st.DataObject) -> None:
        """Any filter from any start (drawn, so shrinking narrows it to the failing one)."""
        self._check_lookup(flt, data.draw(st.integers(min_value=0, max_value=self.model.last + 2)))

    def _check_lookup(self, flt: str, start: int) -> None:
        m = self.model
        matching = sorted(s for s, msg in m.msgs.items() if subject_matches(flt, msg.subject))
        after = [s for s in matching if s >= start]
        subjects = {s: c for s, c in m.state().subjects.items() if subject_matches(flt, s)}
        for store in self.stores:
            name = type(store).__name__
            if matching:
                assert store.load_last(flt).seq == matching[-1], name
            else:
                with pytest.raises(NotFoundError):
                    store.load_last(flt)
            assert store.subjects_state(flt) == subjects, name
            nxt = store.load_next(flt, start)
            assert (nxt.seq if nxt else None) == (after[0] if after else None), name
            assert store.num_pending(start, flt) == len(after), name
            assert [x.seq for x in store.iter_from(start, flt)] == after, name


class _Abort(Exception):
    pass


StoresAgainstModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_stores_against_model = StoresAgainstModel.TestCase
