"""Parts of ``raftstream server --join`` that need no cluster (docs/operations.md, "A node
lost its disk"; ``cluster/repair/repair.py`` ``prepare``): a node started with ``--join`` writes no
repair marker until a running cluster's meta leader answered, only the ``CHECKING`` marker
that makes the next start remove the empty Raft environment it created, so a node that never
found a cluster starts the next time, without ``--join``, as a new node. A marker an older
version wrote for ``--join`` before any cluster answered is looked for again the same way;
once the node got as far as the meta group, it is an interrupted repair as before.
"""

from __future__ import annotations

import json
from pathlib import Path

from raftstream.cluster.repair.known_peers import CHECKING_MARKER, clear_interrupted_check
from raftstream.cluster.repair.repair import JOIN_REASON, MARKER, prepare
from raftstream.raft.storage import LmdbLogStorage
from raftstream.raft.storage.api import GroupWrite
from raftstream.raft.types import HardState


def _start(data: Path, *, join: bool) -> str | None:
    """What a node start does to its data directory before it opens the Raft environment
    (``Node._start``): a start that ended while asking its peers is undone, then
    ``prepare``; then the environment is created (here: an empty one)."""
    clear_interrupted_check(data, data / "raft")
    repair_id = prepare(data, has_peers=True, join=join)
    LmdbLogStorage(data / "raft", map_size_bytes=1 << 24).close()
    return repair_id


def _with_meta_group(raft: Path) -> None:
    """What a repair leaves once the node started the meta group (``raise_term``)."""
    storage = LmdbLogStorage(raft, map_size_bytes=1 << 24)
    try:
        storage.write_batch([GroupWrite("meta", HardState(term=7, commit=0))])
    finally:
        storage.close()


def test_join_writes_no_marker_until_a_cluster_answers(tmp_path: Path) -> None:
    """The review's trap: the marker written at once kept a node that found no cluster
    under repair for good, with or without ``--join``. Once a meta leader answered
    (``seek_cluster`` wrote the marker naming it and dropped ``CHECKING``), it is a repair
    under way, resumed with or without the flag until its end (``finish``)."""
    repair_id = _start(tmp_path, join=True)
    assert repair_id
    assert not (tmp_path / MARKER).exists()
    assert (tmp_path / CHECKING_MARKER).exists()
    # Stopped before a meta leader answered, restarted without --join: a new node (its
    # peers' known-peers check comes next, in Node._start).
    assert _start(tmp_path, join=False) is None
    assert not (tmp_path / CHECKING_MARKER).exists()
    assert not (tmp_path / MARKER).exists()

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / MARKER).write_text(
        json.dumps({"repair_id": "abc", "reason": JOIN_REASON, "meta_leader": "n1"})
    )
    assert _start(taken, join=False) == "abc"
    assert not (taken / CHECKING_MARKER).exists()
    assert (taken / "raft" / "data.mdb").exists()  # kept: the repair writes into it
    assert _start(taken, join=True) == "abc"
    assert not (taken / CHECKING_MARKER).exists()


def test_an_older_versions_join_marker_is_looked_for_again_until_the_meta_group(
    tmp_path: Path,
) -> None:
    """Written before any cluster answered (no ``meta_leader``): while the node holds no
    group, only a running cluster can tell whether it took the repair up, so the node looks
    for one again (``CHECKING``), keeping the marker. Once it started the meta group the
    repair was taken up, and a marker written for damaged data is a repair whatever the
    peers say: both resume as before."""
    (tmp_path / MARKER).write_text(json.dumps({"repair_id": "old", "reason": JOIN_REASON}))
    LmdbLogStorage(tmp_path / "raft", map_size_bytes=1 << 24).close()  # what it created
    assert _start(tmp_path, join=False) == "old"
    assert (tmp_path / CHECKING_MARKER).exists()
    assert (tmp_path / MARKER).exists()

    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / MARKER).write_text(json.dumps({"repair_id": "old", "reason": JOIN_REASON}))
    _with_meta_group(taken / "raft")
    assert prepare(taken, has_peers=True) == "old"
    assert not (taken / CHECKING_MARKER).exists()

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / MARKER).write_text(json.dumps({"repair_id": "d", "reason": "LMDB found damage"}))
    assert _start(damaged, join=True) == "d"
    assert not (damaged / CHECKING_MARKER).exists()
