"""The audit's checks before Spark starts: a node's Raft record that fails its checksum ends
the command in one line naming the node, the group and the entry (a Spark worker meeting it
mid-query ended the audit with a 250-line JVM trace naming none of them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftstream.audit.layout import scrub_root
from raftstream.errors import DataLossError
from tests.support.damaged_logs import flip_in_record, make_env


def test_scrub_root_names_the_node_group_and_entry(tmp_path: Path) -> None:
    make_env(tmp_path / "n1" / "raft")
    make_env(tmp_path / "n2" / "raft")
    scrub_root(tmp_path)  # healthy
    flip_in_record(tmp_path / "n2" / "raft", 7)
    with pytest.raises(DataLossError) as err:
        scrub_root(tmp_path)
    assert str(err.value) == (
        "node n2 (raft/): group g: raft entry failed its checksum (entry index 7)"
    )


def test_the_audit_refuses_a_damaged_raft_record_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_env(data / "n1" / "raft")
    flip_in_record(data / "n1" / "raft", 40)  # the last entry: read to list the groups
    res = subprocess.run(
        [sys.executable, "-m", "raftstream.audit", "run", "--data", os.fspath(data)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": os.fspath(tmp_path)},  # where the audit copies --data
    )
    assert res.returncode == 1, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(
        "raftstream: error: DATA_LOSS: node n1 (raft/): group g: raft entry failed its"
        " checksum (entry index 40)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["data"]  # the copy was removed
