"""The command line is a client (docs/architecture.md "Layers"): loading ``raftstream.cli`` and
every client command module pulls in neither the node (``raftstream.cluster``) nor the
engine; only ``raftstream server`` imports the node, lazily. Checked in a fresh interpreter
so nothing another test imported leaks in."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import raftstream.cli.app
import raftstream.cli.bench, raftstream.cli.cluster, raftstream.cli.consumer
import raftstream.cli.kv, raftstream.cli.pub, raftstream.cli.stream
from click.testing import CliRunner
assert CliRunner().invoke(raftstream.cli.app.cli, ["stream", "ls", "--help"]).exit_code == 0
bad = sorted(m for m in sys.modules if m.startswith(("raftstream.engine", "raftstream.cluster")))
print("bad:", bad)
"""


def test_cli_modules_import_the_sdk_only():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "bad: []"
