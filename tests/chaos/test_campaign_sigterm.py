"""SIGTERM stops a chaos campaign with its processes, as Ctrl-C does (``chaos/__main__.py``).

``timeout`` or a CI job ending sends SIGTERM; by default that ended Python at once and left
the run's three node processes and its proxy server running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from raftstream.tooling.procfs import children as children_of
from raftstream.tooling.procfs import running
from tests.support.polling import wait_for

START_WAIT_S = 60.0  # a safety net against hangs, not a timed assertion
EXIT_WAIT_S = 60.0


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if running(p)}


def test_sigterm_stops_the_campaign_and_its_processes(tmp_path: Path) -> None:
    campaign = subprocess.Popen(
        [sys.executable, "-m", "raftstream.chaos", "--time", "60", "--nemeses", "kill-random",
         "--root", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    children: set[int] = set()
    try:

        def started() -> bool:
            assert campaign.poll() is None, "the campaign ended before its nodes started"
            children.update(children_of(campaign.pid))
            return len(children) >= 4  # three nodes and the proxy server

        wait_for("the campaign's nodes to start", started, START_WAIT_S, interval_s=0.2)
        campaign.send_signal(signal.SIGTERM)
        campaign.wait(EXIT_WAIT_S)
        assert campaign.returncode != 0
        assert _alive(children) == set()
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.wait()
        for pid in _alive(children):  # never leave one behind, even when this failed
            os.kill(pid, signal.SIGKILL)
