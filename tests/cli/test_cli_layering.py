"""The command line is a client (ARCHITECTURE "Layers"): loading ``raftstream.cli`` and
every client command module pulls in neither the node (``raftstream.cluster``) nor the
engine; only ``raftstream server`` imports the node, lazily. Checked in a fresh interpreter
so nothing another test imported leaks in."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import raftstream.cli
import raftstream.cli_bench, raftstream.cli_cluster, raftstream.cli_consumer
import raftstream.cli_kv, raftstream.cli_pub, raftstream.cli_stream
from click.testing import CliRunner
assert CliRunner().invoke(raftstream.cli.cli, ["stream", "ls", "--help"]).exit_code == 0
bad = sorted(m for m in sys.modules if m.startswith(("raftstream.engine", "raftstream.cluster")))
print("bad:", bad)
"""


def test_cli_modules_import_the_sdk_only():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "bad: []"
