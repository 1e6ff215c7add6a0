"""Helpers for running nodes on this machine: a free loopback port, and polling until ready.

Shared by the benchmarks, the chaos harness and the tests, which all start real node
processes on 127.0.0.1. Standard library only, so any layer may import it.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["POLL_S", "PORT_SLICE_ENV", "READY_TIMEOUT_S", "free_port", "port_slice", "wait_for"]

T = TypeVar("T")

# Generous: the machines are shared and noisy. The loop polls; it never sleeps this long.
READY_TIMEOUT_S = 60.0
POLL_S = 0.05


# Listening ports come from below the kernel's ephemeral range: a port the OS hands out for
# bind(0) is also one it may give any outgoing connection (a node dialling its peers) before
# the node that was told to listen there binds it, and then the node fails to start with
# "Address already in use" (seen in CI).
LISTEN_PORT_LOW = 20000
_EPHEMERAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"

# Processes that pick ports side by side (pytest-xdist workers, which do not share
# ``_handed_out``) each take their own slice of that range: "K/N" is slice K of N (K from 0),
# so two workers never hand out the same port and start nodes on it at the same time (seen in
# CI: a node's metrics port was taken by the other worker's node). Child processes inherit it.
PORT_SLICE_ENV = "RAFTSTREAM_PORT_SLICE"
_PICK_ATTEMPTS_MAX = 500
_handed_out: set[int] = set()  # never the same port twice in one process
_rng = random.Random()


def _listen_range() -> tuple[int, int] | None:
    """[low, high) for listening ports, below the ephemeral range and within this process's
    slice of it (``RAFTSTREAM_PORT_SLICE``); None when there is no room."""
    try:
        with open(_EPHEMERAL_RANGE_PATH) as f:
            ephemeral_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if ephemeral_low - LISTEN_PORT_LOW < 1000:
        return None
    return port_slice(LISTEN_PORT_LOW, ephemeral_low, os.environ.get(PORT_SLICE_ENV, ""))


def port_slice(low: int, high: int, spec: str) -> tuple[int, int]:
    """Slice ``spec`` ("K/N": the K-th of N equal parts, K from 0; "" the whole) of
    [low, high); ValueError naming the variable and the rule for anything else."""
    if not spec:
        return low, high
    k, sep, n = spec.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise ValueError(f"{PORT_SLICE_ENV}={spec!r}: must be K/N with 0 <= K < N, e.g. 0/2")
    width = (high - low) // int(n)
    if width < 100:
        raise ValueError(
            f"{PORT_SLICE_ENV}={spec!r}: slices of {width} ports; at most "
            f"{(high - low) // 100} slices fit in [{low}, {high})"
        )
    start = low + int(k) * width
    return start, start + width


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the ephemeral range (so no outgoing
    connection takes it meanwhile) and never returned twice by this process. Another process
    may still bind it first; callers that race retry on a bind failure."""
    span = _listen_range()
    if span is not None:
        for _ in range(_PICK_ATTEMPTS_MAX):
            port = _rng.randrange(*span)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    while True:  # no room below the ephemeral range: let the OS pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


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
