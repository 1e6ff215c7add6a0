"""``KnownPeers``: the peers a node has seen running, kept across restarts."""

from __future__ import annotations

import json
from pathlib import Path

from raftstream.cluster.known_peers import KNOWN_PEERS_FILE, KnownPeers


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
