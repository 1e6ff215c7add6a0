"""Issue 39, finding 8: ``data/LOCK`` (and ``write_json``'s ``.tmp``) were opened through
symbolic links with O_CREAT and truncated: in a data directory another user owned, ``LOCK
-> /tmp/victim`` made a root node overwrite the victim with its pid.

What closes it (cluster/common/private_files.py; docs/security.md): the node's own files are
opened O_NOFOLLOW (a link is refused with an error naming its path, never followed) and
O_CLOEXEC, and a data directory another user owns is refused, naming it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raftstream.cluster.common.durable import write_json
from raftstream.cluster.node.process import lock_data_dir

VICTIM_TEXT = "precious\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    return victim


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "LOCK").symlink_to(victim)
    with pytest.raises(OSError, match=rf"{data / 'LOCK'} is a symbolic link"):
        lock_data_dir(data)
    assert victim.read_text() == VICTIM_TEXT


def test_a_symlinked_tmp_record_is_not_written_through(tmp_path: Path) -> None:
    """A planted ``.tmp`` link is removed, not followed: the record is written, the link's
    target keeps its contents."""
    victim = _victim(tmp_path)
    (tmp_path / "known_peers.json.tmp").symlink_to(victim)
    write_json(tmp_path / "known_peers.json", ["n1"])
    assert victim.read_text() == VICTIM_TEXT
    assert (tmp_path / "known_peers.json").read_text() == '["n1"]'
    assert not (tmp_path / "known_peers.json").is_symlink()


def test_a_data_directory_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    owner = os.stat(data).st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # the node runs as someone else
    with pytest.raises(PermissionError, match=rf"data directory {data} is owned by uid {owner}"):
        lock_data_dir(data)
    assert not (data / "LOCK").exists()
