"""Helpers for running nodes on this machine: a free loopback port, and polling until ready.

Shared by the benchmarks, the chaos harness and the tests, which all start real node
processes on 127.0.0.1. Standard library only, so any layer may import it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["POLL_S", "READY_TIMEOUT_S", "free_port", "wait_for"]

T = TypeVar("T")

# Generous: the machines are shared and noisy. The loop polls; it never sleeps this long.
READY_TIMEOUT_S = 60.0
POLL_S = 0.05


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; another process may take it
    before the caller binds it, so callers that race retry on a bind failure)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = READY_TIMEOUT_S,
    *,
    poll_s: float = POLL_S,
) -> T:
    """Poll ``probe`` until it returns something other than None and return that;
    ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(poll_s)
