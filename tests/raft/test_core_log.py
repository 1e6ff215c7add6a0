"""Unit tests of the core's building blocks: the log (stable view + unstable tail),
progress and inflights, quorum arithmetic, and ReadIndex bookkeeping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftstream.raft.core import CompactedError
from raftstream.raft.core.log import RaftLog, limit_size
from raftstream.raft.core.progress import Inflights, Progress, ProgressState, Tracker
from raftstream.raft.core.readonly import ReadOnly
from raftstream.raft.errors import InvariantError
from raftstream.raft.storage import MemoryGroupLog
from raftstream.raft.types import ConfState, Entry, Snapshot, SnapshotMeta


def ents(*terms: int, start: int = 1, size: int = 1) -> list[Entry]:
    return [Entry(start + i, t, data=b"x" * size) for i, t in enumerate(terms)]


def stored(*terms: int) -> MemoryGroupLog:
    m = MemoryGroupLog()
    m.append(ents(*terms))
    return m


# ---------------------------------------------------------------- MemoryGroupLog (LogView twin)
def test_memory_log_contract_bounds() -> None:
    m = stored(1, 1, 2, 3)
    assert (m.first_index(), m.last_index()) == (1, 4)
    assert m.term(0) == 0 and m.term(4) == 3 and m.term(5) == 0
    m.compact(Snapshot(SnapshotMeta(2, 1)))
    assert (m.first_index(), m.last_index()) == (3, 4)
    assert m.term(2) == 1  # the snapshot's term at its index
    with pytest.raises(CompactedError):
        m.term(1)
    with pytest.raises(CompactedError):
        m.entries(2, 4, 100)
    assert [e.index for e in m.entries(3, 5, 100)] == [3, 4]


def test_memory_log_append_truncates_conflicting_suffix() -> None:
    m = stored(1, 1, 2, 2)
    m.append(ents(3, 3, start=3))
    assert [m.term(i) for i in range(1, 5)] == [1, 1, 3, 3]


def test_limit_size_keeps_at_least_one() -> None:
    big = ents(1, 1, 1, size=10)
    assert len(limit_size(big, 5)) == 1
    assert len(limit_size(big, 20)) == 2
    assert len(limit_size(big, 30)) == 3


# ---------------------------------------------------------------- RaftLog
def test_maybe_append_checks_prev_and_truncates_conflicts() -> None:
    log = RaftLog(stored(1, 1, 2), 0)
    assert log.maybe_append(3, 9, 0, ents(3, start=4)) is None  # prev term mismatch
    assert log.maybe_append(5, 2, 0, ents(3, start=6)) is None  # prev missing
    assert log.maybe_append(2, 1, 2, ents(3, 3, start=3)) == 4
    assert [log.term(i) for i in range(1, 5)] == [1, 1, 3, 3]
    assert log.committed == 2
    assert [e.index for e in log.unstable_entries()] == [3, 4]


def test_maybe_append_never_truncates_committed() -> None:
    log = RaftLog(stored(1, 1, 2), 0)
    log.commit_to(3)
    with pytest.raises(InvariantError):
        log.maybe_append(2, 1, 3, ents(5, start=3))


def test_commit_rule_needs_current_term() -> None:
    """§5.4.2 at the log level: maybe_commit refuses an index whose entry is not of term."""
    log = RaftLog(stored(1, 2, 2), 0)
    assert not log.maybe_commit(3, 3)
    assert log.maybe_commit(3, 2) and log.committed == 3


def test_find_conflict_by_term() -> None:
    log = RaftLog(stored(1, 1, 2, 2, 4, 4, 4), 0)
    assert log.find_conflict_by_term(7, 3) == (4, 2)
    assert log.find_conflict_by_term(7, 4) == (7, 4)
    assert log.find_conflict_by_term(3, 1) == (2, 1)
    assert log.find_conflict_by_term(7, 0) == (0, 0)


def test_slice_spans_stable_and_unstable_within_bytes() -> None:
    log = RaftLog(stored(1, 1, 1), 0)
    log.append(ents(2, 2, start=4))
    assert [e.index for e in log.slice(2, 6, 1 << 20)] == [2, 3, 4, 5]
    assert [e.index for e in log.slice(2, 6, 2)] == [2, 3]
    assert [e.index for e in log.slice(3, 6, 2)] == [3, 4]


def test_stable_to_ignores_entries_replaced_since_the_ready() -> None:
    log = RaftLog(MemoryGroupLog(), 0)
    log.append(ents(1, 1))
    log.append(ents(2, start=2))  # replaces index 2 before the Ready for it persisted
    log.stable_to(2, 1)
    assert [e.index for e in log.unstable_entries()] == [1, 2]
    log.stable_to(2, 2)
    assert log.unstable_entries() == []


def test_restore_from_snapshot() -> None:
    log = RaftLog(stored(1, 1), 0)
    snap = Snapshot(SnapshotMeta(10, 3, ConfState(("a",))))
    log.restore(snap)
    assert (log.first_index(), log.last_index(), log.committed) == (11, 10, 10)
    assert log.term(10) == 3
    assert not log.has_next_committed()  # the snapshot is installed first


@given(
    # A stored log's terms never go down (the storage refuses such a write).
    st.lists(st.integers(1, 3), min_size=1, max_size=12).map(sorted),
    st.lists(st.tuples(st.integers(0, 12), st.lists(st.integers(1, 4), max_size=5))),
)
def test_log_follows_a_list_model(initial: list[int], appends: list[tuple[int, list[int]]]) -> None:
    """Whatever the sequence of leader appends (each at some index, with non-decreasing
    terms beyond our last), the log equals a plain list model."""
    log = RaftLog(stored(*initial), 0)
    model = list(initial)
    for at, terms in appends:
        at = min(at, len(model))
        prev = model[at - 1] if at else 0
        terms = sorted(max(t, prev) for t in terms)
        new = [Entry(at + 1 + i, t, data=b"x") for i, t in enumerate(terms)]
        result = log.maybe_append(at, prev, 0, new)
        assert result == at + len(new)
        for e in new:
            if e.index <= len(model):
                if model[e.index - 1] != e.term:
                    del model[e.index - 1 :]
                    model.append(e.term)
            else:
                model.append(e.term)
        assert [log.term(i) for i in range(1, log.last_index() + 1)] == model


# ---------------------------------------------------------------- progress and quorum
def test_inflights_full_by_count_or_bytes() -> None:
    inf = Inflights(3, 100)
    inf.add(1, 10)
    inf.add(2, 10)
    assert not inf.full()
    inf.add(3, 10)
    assert inf.full()
    inf.free_le(2)
    assert inf.count() == 1 and inf.bytes == 10 and not inf.full()
    inf.add(4, 95)
    assert inf.full()


def test_progress_probe_then_replicate() -> None:
    pr = Progress(5, Inflights(2, 1000), is_learner=False)
    assert pr.state == ProgressState.PROBE and not pr.is_paused()
    pr.sent_entries(6, 10)
    assert pr.is_paused()  # one probe at a time
    assert pr.maybe_update(6)
    pr.become_replicate()
    pr.sent_entries(8, 10)
    pr.sent_entries(9, 10)
    assert pr.next == 10 and pr.is_paused()  # pipelined up to the inflight limit
    assert not pr.maybe_decr_to(5, 0)  # stale rejection below match
    assert pr.maybe_decr_to(8, 6) and pr.next == 7


def test_quorum_counts_voters_only() -> None:
    t = Tracker(10, 1000)
    t.set_conf(ConfState(("a", "b", "c"), ("l1", "l2")), 1)
    for peer, match in {"a": 9, "b": 5, "c": 1, "l1": 9, "l2": 9}.items():
        t.progress[peer].match = match
    assert t.committed_index() == 5
    t.record_vote("a", True)
    t.record_vote("l1", True)
    assert t.tally().name == "PENDING"
    t.record_vote("b", True)
    assert t.tally().name == "WON"


def test_read_only_ack_releases_earlier_reads() -> None:
    ro = ReadOnly()
    assert ro.add(5, "me", b"r1", "me")
    assert ro.add(6, "f", b"r2", "me")
    assert not ro.add(6, "f", b"r2", "me")
    assert ro.ack("x", b"r2") == {"me", "x"}
    done = ro.advance(b"r2")
    assert [(r.index, r.context) for r in done] == [(5, b"r1"), (6, b"r2")]
    assert len(ro) == 0 and ro.ack("x", b"r1") is None
