"""``KnownPeers``: the peers a node has seen running, kept across restarts; the marker of a
start that is asking them."""

from __future__ import annotations

import json
from pathlib import Path

from raftstream.cluster.repair.known_peers import (
    CHECKING_MARKER,
    KNOWN_PEERS_FILE,
    KnownPeers,
    begin_check,
    clear_interrupted_check,
    end_check,
)


def test_peers_are_recorded_durably_and_read_back(tmp_path: Path) -> None:
    known = KnownPeers(tmp_path)
    known.load()  # no file yet: nobody known
    assert "n2" not in known
    known.add("n2")
    known.add("n3")
    known.add("n2")
    assert json.loads((tmp_path / KNOWN_PEERS_FILE).read_text()) == ["n2", "n3"]
    again = KnownPeers(tmp_path)
    again.load()
    assert "n2" in again and "n3" in again and "n1" not in again


def test_an_unreadable_record_is_ignored_not_fatal(tmp_path: Path) -> None:
    """Forgetting a peer only loses this protection; it never refuses a good start."""
    (tmp_path / KNOWN_PEERS_FILE).write_text("{not json")
    known = KnownPeers(tmp_path)
    known.load()
    assert "n2" not in known
    known.add("n2")
    assert json.loads((tmp_path / KNOWN_PEERS_FILE).read_text()) == ["n2"]


def test_a_start_interrupted_while_asking_leaves_nothing_taken_for_data(tmp_path: Path) -> None:
    """A kill -9 between ``begin_check`` and ``end_check``: the next start removes the empty
    environment, so it asks its peers again."""
    raft = tmp_path / "raft"
    clear_interrupted_check(tmp_path, raft)  # nothing to clear
    begin_check(tmp_path)
    raft.mkdir()
    (raft / "data.mdb").write_bytes(b"")
    clear_interrupted_check(tmp_path, raft)  # the next start
    assert not raft.exists() and not (tmp_path / CHECKING_MARKER).exists()
    begin_check(tmp_path)
    raft.mkdir()
    end_check(tmp_path, None)  # the peers allowed the start: the environment stays
    assert raft.exists() and not (tmp_path / CHECKING_MARKER).exists()
