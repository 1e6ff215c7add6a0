"""Time as the node reads it: a ``NodeClock`` its parts are given, so that the whole-node
simulator (tests/vopr) can run them on simulated time, each node with its own drift and
jumps. The stream groups (``GroupDeps.clock``) and their mirror links, the meta group, the
servicers (``ServiceContext.clock``: the stamps of the entries they propose, their waits)
and the node's parts (peer liveness, storage room, readiness) read it. What reads the
machine's clock does so on purpose: rate limits of log lines, and the deadlines of gRPC
calls (a client's deadline is real time: cluster/security/limits_interceptor.py).

- ``time_ns()``: the wall clock, nanoseconds since the epoch. The leader stamps it into
  every entry and consumer op (replicas never read theirs), and a consumer's deadlines,
  expiry and inactivity are measured on it.
- ``monotonic()``: seconds on a monotonic scale, for intervals that only this node sees
  (how long a looked-up value stays good).

``SYSTEM_CLOCK`` is the real one. The Raft host has its own clock (raft/clock.py), which
only needs monotonic time and timers.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["SYSTEM_CLOCK", "NodeClock", "SystemClock"]


class NodeClock(Protocol):
    """Wall and monotonic time of one node. Called on the node's event loop."""

    def time_ns(self) -> int: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The machine's clocks."""

    def time_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: NodeClock = SystemClock()
