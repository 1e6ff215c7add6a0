"""Time as the Raft host sees it: a ``Clock`` it is given, so a simulation can drive it.

The host reads time only through its clock (``now()``, monotonic seconds) and sets its
timers only through it (``call_at``): the next tick, a lazy proposal's linger, the random
part of an election tick, proposal and read deadlines. It keeps its asyncio event loop for
ordering its own work (the loop runs the callbacks and the driver task); only *when* things
happen comes from the clock.

- ``LoopClock``: the real one, the running event loop's clock (``loop.time()``,
  ``loop.call_at``), what the host used before it took a clock.
- ``ManualClock``: the simulated twin. Time stands still until the test (or a simulator)
  moves it with ``advance``, which runs the timers that come due, in time order, each at its
  own time. A timer set for a time already reached runs at the loop's next turn.

Both belong to the event loop of the host that uses them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

from raftstream.raft.errors import InvalidArgumentError

__all__ = ["Clock", "LoopClock", "ManualClock", "Timer"]


class Timer(Protocol):
    """A callback set for a time; ``cancel()`` makes sure it does not run (idempotent)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic time in seconds and timers on it. Called on the host's event loop."""

    def now(self) -> float:
        """Seconds on a monotonic scale (the origin is arbitrary)."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Run ``callback`` on the loop once ``now() >= when``; as soon as possible when
        that is already so. Callbacks due at the same time run in the order they were set."""
        ...


class LoopClock:
    """The running event loop's clock (``loop.time()``): the real one."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_at(when, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled", "handle")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False
        self.handle: asyncio.Handle | None = None  # when it was due at once: on the loop

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


class ManualClock:
    """Simulated time: stands still until ``advance``; deterministic."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()  # same time: first set, first run

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = _ManualTimer(callback)
        if when <= self._now:
            timer.handle = asyncio.get_running_loop().call_soon(callback)
        else:
            heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def next_due(self) -> float | None:
        """When the earliest pending timer is due, or None when none is."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> int:
        """Move time ``seconds`` forward, running each timer that comes due at its own time
        (``now()`` reads its due time while it runs), in time order; returns how many ran.
        A timer set meanwhile for a time within the step runs too."""
        if seconds < 0:
            raise InvalidArgumentError("seconds", "time only moves forward")
        end = self._now + seconds
        ran = 0
        while (due := self.next_due()) is not None and due <= end:
            _, _, timer = heapq.heappop(self._timers)
            self._now = due
            timer.callback()
            ran += 1
        self._now = end
        return ran
