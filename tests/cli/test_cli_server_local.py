"""``raftstream server --local-cluster N``: its addresses and the flags it refuses.

A user review: ``server --local-cluster 3 --join --listen 127.0.0.1:7301 --config
/nonexistent.toml --name zz`` ran the default cluster on 7101-7103 and exited 0, every other
flag ignored, and nothing chose the ports (a user with something on 7101 collided). Pinned,
with the function that starts the nodes replaced (no node is started):

- ``--listen HOST:PORT`` is n1's address and the others take the next ports (default
  127.0.0.1:7101); metrics follow 2000 above (9101..), or ``--metrics-listen``;
- the flags of one node (``--name``, ``--peers``, ``--config``, ``--join``,
  ``--cluster-name``, ``--tags``, ``--tls-*``) are usage errors naming the flag (exit 2);
- a malformed ``--listen``, or ports beyond 65535, are usage errors naming the flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from raftstream.cli import app as cli_module
from raftstream.cli.app import cli, local_addresses


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What ``_run_local_cluster`` was called with (it starts nothing here)."""
    calls: list[dict[str, Any]] = []

    def run_local_cluster(data: Path, addrs: Any, metrics: Any, **kw: Any) -> None:
        calls.append({"data": data, "addrs": dict(addrs), "metrics": dict(metrics), **kw})

    monkeypatch.setattr(cli_module, "_run_local_cluster", run_local_cluster)
    return calls


def server(*args: str) -> Result:
    return CliRunner().invoke(cli, ["server", "--local-cluster", *args])


def test_the_default_layout_is_unchanged(started: list[dict[str, Any]]) -> None:
    assert server("3").exit_code == 0
    assert started == [
        {
            "data": Path("./data"),
            "addrs": {"n1": "127.0.0.1:7101", "n2": "127.0.0.1:7102", "n3": "127.0.0.1:7103"},
            "metrics": {"n1": "127.0.0.1:9101", "n2": "127.0.0.1:9102", "n3": "127.0.0.1:9103"},
            "log_level": "INFO",
            "tls": False,
        }
    ]


def test_listen_moves_the_first_node_and_the_others_follow(
    started: list[dict[str, Any]], tmp_path: Path
) -> None:
    res = server("3", "--listen", "127.0.0.1:7301", "--data", str(tmp_path), "--tls")
    assert res.exit_code == 0, res.output
    (call,) = started
    assert call["addrs"] == {"n1": "127.0.0.1:7301", "n2": "127.0.0.1:7302", "n3": "127.0.0.1:7303"}
    assert call["metrics"] == {
        "n1": "127.0.0.1:9301",
        "n2": "127.0.0.1:9302",
        "n3": "127.0.0.1:9303",
    }
    assert call["data"] == tmp_path and call["tls"] is True


def test_metrics_listen_moves_the_metrics_ports() -> None:
    addrs, metrics = local_addresses(2, "[::1]:8000", "127.0.0.1:8500")
    assert addrs == {"n1": "[::1]:8000", "n2": "[::1]:8001"}
    assert metrics == {"n1": "127.0.0.1:8500", "n2": "127.0.0.1:8501"}


@pytest.mark.parametrize(
    "flag",
    [
        ("--name", "zz"),
        ("--peers", "n1=127.0.0.1:7101"),
        ("--config", "/nonexistent.toml"),
        ("--join",),
        ("--cluster-name", "c"),
        ("--tags", "ssd"),
        ("--tls-ca", "ca.pem"),
        ("--tls-cert", "cert.pem"),
        ("--tls-key", "key.pem"),
    ],
)
def test_a_flag_of_one_node_is_a_usage_error(
    started: list[dict[str, Any]], flag: tuple[str, ...]
) -> None:
    res = server("3", *flag)
    assert res.exit_code == 2, res.output
    assert f"Error: {flag[0]} is for one node, not --local-cluster" in res.output
    assert started == []


def test_the_review_s_command_is_refused(started: list[dict[str, Any]]) -> None:
    res = server(
        "3", "--join", "--listen", "127.0.0.1:7301", "--config", "/nonexistent.toml", "--name", "zz"
    )
    assert res.exit_code == 2 and "is for one node, not --local-cluster" in res.output
    assert started == []


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        (("--listen", "nohostport"), "--listen", "expected host:port"),
        (("--listen", "127.0.0.1:99999"), "--listen", "port must be 1 to 65535"),
        (("--listen", "127.0.0.1:65534"), "--listen", "3 nodes from port 65534 go beyond 65535"),
        (("--listen", "127.0.0.1:64000"), "--listen", "give --metrics-listen"),
        (("--metrics-listen", "127.0.0.1:65535"), "--metrics-listen", "go beyond 65535"),
        (("--metrics-listen", "127.0.0.1:7103"), "--metrics-listen", "127.0.0.1:7103"),
    ],
)
def test_bad_addresses_are_usage_errors_naming_the_flag(
    started: list[dict[str, Any]], args: tuple[str, ...], flag: str, words: str
) -> None:
    res = server("3", *args)
    assert res.exit_code == 2, res.output
    error = next(line for line in res.output.splitlines() if line.startswith("Error:"))
    assert flag in error and words in error, error
    assert started == []


def test_a_high_listen_port_with_metrics_listen_is_fine(started: list[dict[str, Any]]) -> None:
    res = server("3", "--listen", "127.0.0.1:64000", "--metrics-listen", "127.0.0.1:9101")
    assert res.exit_code == 0, res.output
    assert started[0]["addrs"]["n3"] == "127.0.0.1:64002"
    assert started[0]["metrics"]["n3"] == "127.0.0.1:9103"


def test_server_help_says_how_to_move_the_ports() -> None:
    out = CliRunner().invoke(cli, ["server", "--help"]).output
    assert "--listen 127.0.0.1:7201" in out and "are for one node" in out
