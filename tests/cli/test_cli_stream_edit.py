"""``raftstream stream add/edit``: the replica range, adding and removing a mirror
(docs/cli.md "stream", docs/mirrors.md).

Pinned: ``--replicas`` is 1..5 and says so in ``--help`` (0 and 6 are usage errors naming
the option, exit 2); ``stream edit --no-mirror`` promotes a mirror to an ordinary stream that
keeps its messages and accepts publishes on the subjects given with it; ``--mirror ''`` is a
usage error pointing at ``--no-mirror``; adding a mirror to an existing stream is refused
naming ``mirror`` and that rule, not the subjects the stream has.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from raftstream.cli.app import cli
from tests.support.polling import wait_for

from .runner import ok, rs

MIRROR_CATCH_UP_S = 20


def info(cluster: Any, name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(ok(cluster, "stream", "info", name, "--json"))
    return out


# -- usage (no cluster) ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["add", "edit"])
def test_replicas_help_shows_the_range_one_to_five(command: str) -> None:
    res = CliRunner().invoke(cli, ["stream", command, "--help"])
    assert res.exit_code == 0
    line = next(x for x in res.output.splitlines() if x.strip().startswith("--replicas"))
    assert "[1<=x<=5]" in line and "x>=0" not in line


@pytest.mark.parametrize("command", ["add", "edit"])
@pytest.mark.parametrize("value", ["0", "6", "-1"])
def test_replicas_out_of_range_is_a_usage_error_naming_the_option(command: str, value: str) -> None:
    """Not silently 1 (0) nor sent to the server (6): the flag refuses what --help excludes."""
    res = CliRunner().invoke(
        cli, ["stream", command, "S", "--replicas", value, "-s", "127.0.0.1:1"]
    )
    assert res.exit_code == 2, res.output
    assert "--replicas" in res.output and "1<=x<=5" in res.output


def test_an_empty_mirror_name_is_a_usage_error_pointing_at_no_mirror() -> None:
    res = CliRunner().invoke(cli, ["stream", "edit", "P", "--mirror", "", "-s", "127.0.0.1:1"])
    assert res.exit_code == 2, res.output
    assert "--mirror" in res.output and "--no-mirror" in res.output


def test_no_mirror_with_mirror_is_a_usage_error() -> None:
    args = ["stream", "edit", "P", "--no-mirror", "--mirror", "O", "-s", "127.0.0.1:1"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2, res.output
    assert "--no-mirror and --mirror cannot be combined" in res.output


def test_edit_help_documents_removing_a_mirror() -> None:
    res = CliRunner().invoke(cli, ["stream", "edit", "--help"])
    assert res.exit_code == 0
    assert "--no-mirror" in res.output and "promote" in res.output
    assert "raftstream stream edit ORDERS_COPY --no-mirror --subjects" in res.output


# -- against a cluster -------------------------------------------------------------------------


@pytest.mark.integration
def test_adding_a_mirror_to_a_stream_names_the_mirror_rule(cluster: Any) -> None:
    """JetStream: "stream mirror configuration can not be updated"; the stream's subjects
    are not the problem and are not what the error names."""
    ok(cluster, "stream", "add", "ADDM_O", "--subjects", "addm.o.>")
    ok(cluster, "stream", "add", "ADDM_EU", "--subjects", "addm.eu.>")
    try:
        res = rs(cluster, "stream", "edit", "ADDM_EU", "--mirror", "ADDM_O")
        assert res.returncode == 1, res.stdout + res.stderr
        assert res.stderr.strip() == (
            "raftstream: error: INVALID_ARGUMENT: mirror: cannot be added to an existing stream"
        )
    finally:
        ok(cluster, "stream", "rm", "ADDM_EU", "-f")
        ok(cluster, "stream", "rm", "ADDM_O", "-f")


@pytest.mark.integration
def test_no_mirror_promotes_a_mirror_keeping_its_messages(cluster: Any) -> None:
    ok(cluster, "stream", "add", "PRM_O", "--subjects", "prm.o.>")
    ok(cluster, "stream", "add", "PRM", "--mirror", "PRM_O")
    try:
        ok(cluster, "pub", "prm.o.a", "m {{Count}}", "--count", "3", "--quiet")
        wait_for(
            "the mirror to copy 3 messages",
            lambda: info(cluster, "PRM")["state"]["messages"] >= 3,
            MIRROR_CATCH_UP_S,
            interval_s=0.2,
        )

        out = json.loads(
            ok(cluster, "stream", "edit", "PRM", "--no-mirror", "--subjects", "prm.p.>", "--json")
        )
        assert "mirror" not in out["config"] and out["config"]["subjects"] == ["prm.p.>"]
        ok(cluster, "pub", "prm.p.x", "own")  # now an ordinary stream: it takes publishes
        promoted = info(cluster, "PRM")
        assert "mirror" not in promoted["config"]
        assert promoted["state"]["messages"] == 4  # the 3 copies kept, then its own
        again = rs(cluster, "stream", "edit", "PRM", "--no-mirror")  # not a mirror any more
        assert again.returncode == 1
        assert "INVALID_ARGUMENT: mirror: PRM is not a mirror (--no-mirror)" in again.stderr
    finally:
        ok(cluster, "stream", "rm", "PRM", "-f")
        ok(cluster, "stream", "rm", "PRM_O", "-f")
