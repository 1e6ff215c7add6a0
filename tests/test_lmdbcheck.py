"""``raftstream.engine.lmdbcheck`` and the Raft library's copy,
``raftstream.raft.storage.lmdbcheck``:
a truncated LMDB data file is refused before LMDB maps it. Both copies run every case.

The check reads with plain file reads, so a truncated file is safe to test in-process; the
open paths (which would mmap the file if the check regressed, and then die of SIGBUS) run in
a subprocess, so that a regression fails a test instead of killing the test runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import lmdb
import pytest

from raftstream import errors
from raftstream.engine import lmdbcheck
from raftstream.engine.lmdbcheck import DATA_FILE
from raftstream.raft import errors as raft_errors
from raftstream.raft.storage import lmdbcheck as raft_lmdbcheck

# (the check's module, the DataLossError it raises): the application's and the Raft library's.
COPIES = {
    "raftstream": (lmdbcheck, errors.DataLossError),
    "raft": (raft_lmdbcheck, raft_errors.DataLossError),
}


@pytest.fixture(params=sorted(COPIES))
def copy(request: pytest.FixtureRequest) -> tuple[ModuleType, type[Exception]]:
    return COPIES[request.param]


def write_env(path: Path, records: int = 3000) -> Path:
    """A real LMDB environment at ``path`` holding ``records`` values; returns its data file."""
    env = lmdb.open(os.fspath(path), map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            for i in range(records):
                txn.put(f"k{i:06d}".encode(), b"v" * 300)
    finally:
        env.close()
    return path / DATA_FILE


def truncate_to_half(data_file: Path) -> int:
    """Cut ``data_file`` to half its size (whole pages kept: the meta pages survive)."""
    half = data_file.stat().st_size // 2
    os.truncate(data_file, half)
    return half


def test_intact_env_passes(tmp_path: Path, copy: tuple[ModuleType, type[Exception]]) -> None:
    check, _ = copy
    data_file = write_env(tmp_path)
    check.check_lmdb_env(tmp_path)
    meta = check.read_meta(data_file)
    assert meta.page_size == os.sysconf("SC_PAGE_SIZE")
    assert data_file.stat().st_size >= check.required_size(meta) > 2 * meta.page_size


def test_truncated_env_is_data_loss_naming_the_sizes(
    tmp_path: Path, copy: tuple[ModuleType, type[Exception]]
) -> None:
    check, data_loss = copy
    data_file = write_env(tmp_path)
    required = check.required_size(check.read_meta(data_file))
    half = truncate_to_half(data_file)
    with pytest.raises(data_loss) as err:
        check.check_lmdb_env(tmp_path)
    message = str(err.value)
    assert str(data_file) in message
    assert str(half) in message and str(required) in message
    details = err.value.details  # type: ignore[attr-defined]
    assert details["size"] == half
    assert details["required"] == required


def test_file_cut_inside_the_meta_pages_is_data_loss(
    tmp_path: Path, copy: tuple[ModuleType, type[Exception]]
) -> None:
    check, data_loss = copy
    data_file = write_env(tmp_path)
    os.truncate(data_file, 100)
    with pytest.raises(data_loss, match="truncated"):
        check.check_lmdb_env(tmp_path)


def test_bad_magic_is_not_an_lmdb_file(
    tmp_path: Path, copy: tuple[ModuleType, type[Exception]]
) -> None:
    check, data_loss = copy
    data_file = write_env(tmp_path)
    size = data_file.stat().st_size
    data_file.write_bytes(b"\x00" * size)
    with pytest.raises(data_loss, match="not an LMDB file"):
        check.check_lmdb_env(tmp_path)


def test_missing_file_passes(tmp_path: Path, copy: tuple[ModuleType, type[Exception]]) -> None:
    check, _ = copy
    check.check_lmdb_env(tmp_path)
    check.check_lmdb_env(tmp_path / "not-created-yet")


# Each open path, in a fresh interpreter: prints the error's class and message, or "opened".
OPEN_PROBE = """
import sys
from raftstream.errors import DataLossError
from raftstream.raft.errors import DataLossError as RaftDataLossError
which, path = sys.argv[1], sys.argv[2]
try:
    if which == "engine":
        from raftstream.engine.lmdbstore import open_node_env
        open_node_env(path).close()
    else:
        from raftstream.raft.storage import LmdbLogStorage
        LmdbLogStorage(path).close()
except (DataLossError, RaftDataLossError) as exc:
    print("DataLossError:", exc)
else:
    print("opened")
"""


def open_in_subprocess(which: str, path: Path) -> subprocess.CompletedProcess[str]:
    """Open ``path`` by the ``which`` path in a child: a SIGBUS there is only a failed test."""
    return subprocess.run(
        [sys.executable, "-c", OPEN_PROBE, which, os.fspath(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("which", ["engine", "raft"])
def test_open_paths_refuse_a_truncated_file(tmp_path: Path, which: str) -> None:
    env_dir = tmp_path / which
    opened = open_in_subprocess(which, env_dir)  # creates the environment the path's way
    assert opened.returncode == 0 and opened.stdout.strip() == "opened", opened
    write_env(env_dir)  # grow it past a few pages
    truncate_to_half(env_dir / DATA_FILE)
    refused = open_in_subprocess(which, env_dir)
    assert refused.returncode == 0, refused  # negative: killed by a signal (SIGBUS)
    assert refused.stdout.startswith("DataLossError:"), refused
    assert "truncated LMDB data file" in refused.stdout


@pytest.mark.parametrize("command", [["run"], ["export", "--out", "OUT"]])
def test_the_audit_refuses_a_truncated_node_env_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """The audit reads every node's environments: a truncated one killed a Spark worker with
    a bus error (a 188-line trace naming no file). It is refused before Spark starts."""
    store = tmp_path / "data" / "n1" / "store"
    store.mkdir(parents=True)
    write_env(store)
    truncate_to_half(store / DATA_FILE)
    args = [arg.replace("OUT", os.fspath(tmp_path / "out")) for arg in command]
    res = subprocess.run(
        [sys.executable, "-m", "raftstream.audit", *args, "--data", os.fspath(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("raftstream: error: DATA_LOSS: ")
    assert "truncated LMDB data file" in lines[0] and os.fspath(store) in lines[0]
