"""Parts of the repair after data loss that need no cluster (docs/cluster-design.md, "Repair
after data loss"): the scrub finds a flipped bit in any record, a damaged environment is
quarantined behind a durable marker that makes an interrupted repair resume, the replicated
repair record, and a stream leader letting a peer under repair go before taking it back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftstream.cluster.meta.entries import (
    RepairCleared,
    RepairDone,
    RepairStart,
    decode_entry,
    encode_entry,
)
from raftstream.cluster.meta.repairs import RepairBook
from raftstream.cluster.meta.state import MetaState
from raftstream.cluster.repair.known_peers import CHECKING_MARKER, end_check
from raftstream.cluster.repair.repair import MARKER, QUARANTINE, finish, prepare, scrub_raft_env
from raftstream.cluster.stream.membership import next_change
from raftstream.errors import ConflictError, DataLossError, InvalidArgumentError, NotFoundError
from raftstream.raft.types import ConfChangeType
from tests.support.damaged_logs import flip_in_record, make_env


def test_scrub_passes_a_healthy_or_missing_environment(tmp_path: Path) -> None:
    scrub_raft_env(tmp_path / "none")
    make_env(tmp_path / "raft")
    scrub_raft_env(tmp_path / "raft")


def test_scrub_finds_a_flipped_bit_in_an_old_entry(tmp_path: Path) -> None:
    """An entry in the middle of the log is read by nothing at start but the scrub."""
    make_env(tmp_path / "raft")
    flip_in_record(tmp_path / "raft", 7)
    with pytest.raises(DataLossError):
        scrub_raft_env(tmp_path / "raft")


def test_damage_is_quarantined_behind_a_durable_marker(tmp_path: Path) -> None:
    make_env(tmp_path / "raft")
    flip_in_record(tmp_path / "raft", 3)
    repair_id = prepare(tmp_path, has_peers=True)
    assert repair_id
    assert not (tmp_path / "raft").exists()
    (kept,) = (tmp_path / QUARANTINE).iterdir()
    assert (kept / "data.mdb").is_file()
    assert json.loads((tmp_path / MARKER).read_text())["repair_id"] == repair_id
    # A restart before the repair is over resumes the same repair.
    assert prepare(tmp_path, has_peers=True) == repair_id
    finish(tmp_path)
    assert prepare(tmp_path, has_peers=True) is None


def test_a_node_without_peers_refuses_and_keeps_its_data(tmp_path: Path) -> None:
    make_env(tmp_path / "raft")
    flip_in_record(tmp_path / "raft", 3)
    with pytest.raises(DataLossError):
        prepare(tmp_path, has_peers=False)
    assert (tmp_path / "raft" / "data.mdb").is_file()
    assert not (tmp_path / MARKER).exists()


def test_join_puts_a_node_without_raft_data_under_repair(tmp_path: Path) -> None:
    """``--join``: an empty data directory joins as a new member, but writes no marker
    until a running cluster's meta leader answers (``seek_cluster``; the lifecycle is in
    tests/cluster/test_join_parts.py), only ``CHECKING``; once the node has Raft data, the
    flag is ignored."""
    repair_id = prepare(tmp_path, has_peers=True, join=True)
    assert repair_id
    assert not (tmp_path / MARKER).exists()
    assert (tmp_path / CHECKING_MARKER).exists()
    end_check(tmp_path, None)  # a meta leader answered (seek_cluster), the repair ran
    make_env(tmp_path / "raft")  # what the repair left: a member's Raft data
    assert prepare(tmp_path, has_peers=True, join=True) is None
    assert not (tmp_path / MARKER).exists()


def test_join_needs_peers_and_leaves_a_member_alone(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        prepare(tmp_path, has_peers=False, join=True)
    assert err.value.field == "join"
    assert not (tmp_path / MARKER).exists()
    assert prepare(tmp_path, has_peers=True) is None  # without the flag: a fresh node


def test_a_damaged_marker_still_means_a_repair(tmp_path: Path) -> None:
    (tmp_path / MARKER).write_text("{not json")
    assert prepare(tmp_path, has_peers=True)


def test_repair_record_follows_its_entries() -> None:
    book = RepairBook()
    book.apply(RepairStart(node="n2", repair_id="a", meta_term=7, ts_ns=1))
    with pytest.raises(ConflictError):  # a stale report of an older repair changes nothing
        book.apply(RepairCleared(node="n2", repair_id="old", group="S:$G:Q", term=9, ts_ns=2))
    with pytest.raises(NotFoundError):
        book.apply(RepairDone(node="n3", repair_id="a", ts_ns=2))
    book.apply(RepairCleared(node="n2", repair_id="a", group="S:$G:Q", term=9, ts_ns=3))
    book.apply(RepairCleared(node="n2", repair_id="a", group="S:$G:Q", term=11, ts_ns=4))
    rec = book.get("n2")
    assert rec is not None and rec.may_rejoin("S:$G:Q") == 9  # the first report holds
    assert rec.may_rejoin("S:$G:R") is None
    assert set(book.pending()) == {"n2"}
    book.apply(RepairDone(node="n2", repair_id="a", ts_ns=5))
    assert book.pending() == {}
    # A new repair of the same node starts over.
    book.apply(RepairStart(node="n2", repair_id="b", meta_term=12, ts_ns=6))
    rec = book.get("n2")
    assert rec is not None and not rec.done and rec.may_rejoin("S:$G:Q") is None


def test_repair_entries_round_trip_and_survive_meta_snapshots() -> None:
    state = MetaState()
    for e in (
        RepairStart(node="n2", repair_id="a", meta_term=7, ts_ns=1),
        RepairCleared(node="n2", repair_id="a", group="S:$G:Q", term=9, ts_ns=2),
    ):
        assert decode_entry(encode_entry(e)) == e
        state.apply(e)
    back = MetaState.from_snapshot(state.snapshot())
    assert back.repairs.to_json() == state.repairs.to_json()
    assert back.snapshot() == state.snapshot()
    # A state that never had a repair encodes without the key (the format is unchanged).
    assert b"repairs" not in MetaState().snapshot()


def test_a_leader_lets_a_peer_under_repair_go_before_taking_it_back() -> None:
    """What ``MembershipDriver`` asks ``next_change`` while n2 is held: n2 is removed (one
    server at a time, §4.1), and only once cleared is it a learner again, then a voter."""
    voters = ("n1", "n2", "n3")
    step = next_change(
        me="n1", wanted=("n1", "n3"), voters=voters, learners=(), lag={"n2": 0, "n3": 0}
    )
    assert step is not None and step.change is not None
    assert (step.change.type, step.change.node) == (ConfChangeType.REMOVE, "n2")
    step = next_change(
        me="n1", wanted=("n1", "n2", "n3"), voters=("n1", "n3"), learners=(), lag={"n3": 0}
    )
    assert step is not None and step.change is not None
    assert (step.change.type, step.change.node) == (ConfChangeType.ADD_LEARNER, "n2")
