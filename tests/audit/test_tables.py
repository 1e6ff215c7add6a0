"""The readers without Spark: partition planning by sequence range, the rows of a
partition, the Raft link, and the read-only contract (the audit never changes a node dir)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from raftstream.audit import logview as lv
from raftstream.audit import tables
from raftstream.audit.layout import discover_nodes, snapshot_root
from raftstream.audit.synth import SynthCluster
from raftstream.audit.tables import pack_parts, plan_parts, read_part
from raftstream.cluster.stream.entries import StreamBatch
from raftstream.engine.entries import Publish


def _build(root: Path) -> str:
    c = SynthCluster(root)
    try:
        g = c.add_stream("S", ["s.>"])
        c.publish(g, 100, subject="s.x", batch=7, msg_id=lambda i: f"m-{i}")
        # A duplicate (refused by deduplication) stores nothing: the link skips it.
        dup = Publish(ts_ns=c.tick(), subject="s.x", data=b"msg-3", msg_id="m-3")
        c.propose(g, [StreamBatch((dup,))])
        c.publish(g, 5, subject="s.x", first=100)
    finally:
        c.close()
    return g


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_messages_split_by_sequence_range_and_link_to_their_entries(tmp_path: Path) -> None:
    _build(tmp_path)
    parts = [p for p in plan_parts(str(tmp_path), "messages", 30) if p.node == "n1"]
    assert [(p.lo, p.hi) for p in parts] == [(1, 31), (31, 61), (61, 91), (91, 106)]
    rows = [r for p in parts for b in read_part(p) for r in b.to_pylist()]
    assert [r["seq"] for r in rows] == list(range(1, 106))
    assert [r["msg_id"] for r in rows[:100]] == [f"m-{i}" for i in range(100)]
    # Publishes go 7 per entry after the meta log's entry: seq s is in entry (s - 1) // 7 + 1;
    # the deduplicated publish took entry 16, so the last 5 are in entry 17.
    assert [r["raft_index"] for r in rows[:100]] == [(s - 1) // 7 + 1 for s in range(1, 101)]
    assert {r["raft_index"] for r in rows[100:]} == {17}
    assert len({r["hash"] for r in rows}) == 105


def test_a_split_stream_decodes_its_log_once_and_reads_as_one_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _build(tmp_path)
    whole = [p for p in plan_parts(str(tmp_path), "messages", 1000) if p.node == "n1"]
    one = [r for p in whole for b in read_part(p) for r in b.to_pylist()]
    built: list[int] = []
    real = lv.LinkIndex.__init__

    def counting(self: lv.LinkIndex, entries: Any) -> None:
        real(self, entries)
        built.append(len(self))

    monkeypatch.setattr(lv.LinkIndex, "__init__", counting)
    tables._LAST_LINK_INDEX.clear()
    split = [p for p in plan_parts(str(tmp_path), "messages", 10) if p.node == "n1"]
    assert len(split) == 11
    rows = [r for p in split for b in read_part(p) for r in b.to_pylist()]
    assert rows == one  # the same links (term, index) part by part as in one walk
    assert built == [106]  # one decode of the log's 106 publishes for all eleven parts
    # Another node's log is another index (and replaces the kept one).
    other = [p for p in plan_parts(str(tmp_path), "messages", 10) if p.node == "n2"]
    list(read_part(other[0]))
    assert built == [106, 106] and len(tables._LAST_LINK_INDEX) == 1


def test_small_parts_of_a_node_share_a_spark_partition(tmp_path: Path) -> None:
    _build(tmp_path)
    parts = plan_parts(str(tmp_path), "raft_log", 1000)  # meta and S on 3 nodes
    packed = pack_parts(parts, 1000)
    assert len(parts) == 6 and len(packed) == 3
    assert all(len({p.node for p in group}) == 1 for group in packed)


def test_snapshot_copy_reads_the_same_and_leaves_the_node_dirs_untouched(tmp_path: Path) -> None:
    _build(tmp_path / "data")
    before = _digest(tmp_path / "data")
    copy = snapshot_root(tmp_path / "data", tmp_path / "copy")
    for table in ("messages", "raft_log", "consumers", "streams"):
        for src in (tmp_path / "data", copy):
            [
                r
                for p in plan_parts(str(src), table, 50)
                for b in read_part(p)
                for r in b.to_pylist()
            ]
    a = [
        r
        for p in plan_parts(str(tmp_path / "data"), "messages", 50)
        for b in read_part(p)
        for r in b.to_pylist()
    ]
    b = [
        r
        for p in plan_parts(str(copy), "messages", 50)
        for b in read_part(p)
        for r in b.to_pylist()
    ]
    assert [{**r, "node": ""} for r in a] == [{**r, "node": ""} for r in b] and len(a) == 315
    assert _digest(tmp_path / "data") == before
    assert [n.name for n in discover_nodes(copy)] == ["n1", "n2", "n3"]


def test_cli_default_partition_size_is_the_tables_one() -> None:
    # audit/cli.py repeats the constant so that importing the command line loads no Spark.
    from raftstream.audit import cli, tables

    assert cli.DEFAULT_ROWS_PER_PARTITION == tables.DEFAULT_ROWS_PER_PARTITION
