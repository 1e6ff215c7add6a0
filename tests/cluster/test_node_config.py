"""The ``raftstream server`` command: a bad configuration is refused at start, naming the
field (issue 5: "validated at start with clear errors"; "a bad config names the field"),
and ``--help`` shows an example. Real processes, as an operator would run them."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import free_port

pytestmark = pytest.mark.integration


def _server(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftstream.cluster", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("section", "said"),
    [
        ("[raft]\ntick_ms = 0\n", ("raft.tick_ms", "must be positive")),
        # A user review: this was accepted and the node started.
        (
            "[limits]\nstreams_max = 99999999999999999999\n",
            ("limits.streams_max: must be at most 9223372036854775807 (int64)",),
        ),
    ],
    ids=["tick_ms-zero", "beyond-int64"],
)
def test_a_bad_toml_value_names_the_field(
    tmp_path: Path, section: str, said: tuple[str, ...]
) -> None:
    """A configuration error (exit 2) naming the key and the rule, before the data
    directory is touched."""
    addr = f"127.0.0.1:{free_port()}"
    config = tmp_path / "node.toml"
    config.write_text(
        f'[cluster]\nname = "n1"\nlisten = "{addr}"\ndata = "{tmp_path / "d"}"\n'
        f'peers = {{ n1 = "{addr}" }}\n\n{section}'
    )
    out = _server("--config", str(config))
    assert out.returncode == 2
    assert all(text in out.stderr for text in said), out.stderr
    assert not (tmp_path / "d").exists()  # refused before touching the data directory


def test_bad_flag_names_the_field(tmp_path: Path) -> None:
    out = _server(
        "--name", "n1",
        "--listen", "127.0.0.1:7",
        "--data", str(tmp_path / "d"),
        "--peers", "n2=127.0.0.1:8",
    )  # fmt: skip
    assert out.returncode == 2
    assert "cluster.name" in out.stderr and "not in cluster.peers" in out.stderr


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[raft]\ntick_msec = 10\n")
    out = _server("--config", str(config))
    assert out.returncode == 2
    assert "raft.tick_msec" in out.stderr and "unknown key" in out.stderr


def test_help_shows_an_example() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from raftstream.cli import main; main(['server', '--help'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0
    assert "raftstream server --name n1 --listen 127.0.0.1:7101" in out.stdout
    assert "--local-cluster" in out.stdout


def test_a_taken_port_is_refused_before_the_data_directory_is_made(tmp_path: Path) -> None:
    """A bad-input review: a node whose port another process listens on exited with the
    right message, but left a data directory with an empty Raft environment behind."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        addr = f"127.0.0.1:{other.getsockname()[1]}"
        data = tmp_path / "d"
        out = _server(
            "--name", "n1", "--listen", addr, "--data", str(data), "--peers", f"n1={addr}"
        )
    assert out.returncode == 1, out.stderr
    assert f"cannot listen on {addr}: the port is taken" in out.stderr
    assert not data.exists()
