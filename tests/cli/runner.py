"""Running the installed ``raftstream`` console script against a test cluster: one way for
every CLI test (the cluster in $RAFTSTREAM_SERVERS, stdin not a terminal, bounded time)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RAFTSTREAM = Path(sys.executable).parent / "raftstream"
RUN_TIMEOUT_S = 60


def cli_env(cluster: Any, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run: this one, with the cluster in $RAFTSTREAM_SERVERS."""
    return {**os.environ, "RAFTSTREAM_SERVERS": ",".join(cluster.servers), **(extra or {})}


def rs(
    cluster: Any, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``raftstream ARGS`` with the cluster in $RAFTSTREAM_SERVERS, stdin not a TTY."""
    return subprocess.run(
        [str(RAFTSTREAM), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=cli_env(cluster, env),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def ok(cluster: Any, *args: str) -> str:
    """stdout of a run that must succeed."""
    res = rs(cluster, *args)
    assert res.returncode == 0, f"{args}: rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    return res.stdout
