"""``raftstream.tooling.procfs``: a process that exited is not running, reaped or not; a process's
children are those it started, and only while they exist."""

from __future__ import annotations

import os
import subprocess
import sys

from raftstream.tooling.procfs import children, cpu_seconds, running
from tests.support.polling import wait_for


def test_a_zombie_and_a_reaped_process_are_not_running() -> None:
    assert running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    assert running(child.pid)
    assert child.stdin is not None
    child.stdin.close()  # it exits; not waited for, it stays a zombie
    wait_for("the child to exit", lambda: not running(child.pid) or None)
    assert os.path.exists(f"/proc/{child.pid}")  # still there, as a zombie
    child.wait()
    assert not running(child.pid)


def test_children_are_the_processes_started_and_only_while_they_exist() -> None:
    before = children(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert children(os.getpid()) - before == {child.pid}
        assert child.pid not in children(child.pid)
        assert cpu_seconds(child.pid) >= 0.0
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert child.pid not in children(os.getpid())
    assert cpu_seconds(child.pid) == 0.0  # gone
