"""Issue 39, finding 7: the data directory and LMDB files were created 0755/0644, so any
local user could read a KV secret out of ``store/data.mdb`` or another account's messages
out of ``raft/data.mdb``.

What closes it (cluster/common/private_files.py; docs/security.md, docs/configuration.md ``data``):
a node creates its data directory and the LMDB environments' directories 0700, their files
and ``write_json``'s records 0600, whatever the umask lets through at most; a looser
existing directory or file is used with a WARNING naming its path and mode.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftstream.cluster.common.durable import write_json
from raftstream.cluster.node.process import lock_data_dir, unlock_data_dir
from raftstream.engine.lmdbstore import open_node_env
from raftstream.raft.storage import LmdbLogStorage


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def _open_umask() -> Iterator[None]:
    """The most permissive umask an operator might run with: the modes are the code's."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_the_data_directory_and_its_lock_are_private(tmp_path: Path) -> None:
    data = tmp_path / "data"
    fd = lock_data_dir(data)
    try:
        assert _mode(data) == 0o700
        assert _mode(data / "LOCK") == 0o600
    finally:
        unlock_data_dir(fd)


def test_the_lmdb_environments_are_private(tmp_path: Path) -> None:
    env = open_node_env(tmp_path / "store", map_size_bytes=1 << 20)
    env.close()
    log = LmdbLogStorage(tmp_path / "raft", map_size_bytes=1 << 20)
    log.close()
    for name in ("store", "raft"):
        assert _mode(tmp_path / name) == 0o700
        for file in ("data.mdb", "lock.mdb"):
            assert _mode(tmp_path / name / file) == 0o600, f"{name}/{file}"


def test_json_records_are_private(tmp_path: Path) -> None:
    write_json(tmp_path / "known_peers.json", ["n1"])
    assert _mode(tmp_path / "known_peers.json") == 0o600


def test_a_looser_existing_data_directory_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    with caplog.at_level(logging.WARNING):
        fd = lock_data_dir(data)
    unlock_data_dir(fd)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(data) in m and "0755" in m for m in warned), warned
    assert _mode(data) == 0o755  # the operator's to change, not the node's
