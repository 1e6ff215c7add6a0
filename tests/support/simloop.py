"""An asyncio event loop on simulated time, for the whole-node simulator.

Everything in a simulation runs in memory (network, disks, clients), so the loop never waits
on a file descriptor: whenever nothing is ready to run, time jumps to the next timer instead
of sleeping until it. The host's timers (raft/clock.py's ``LoopClock``), ``asyncio.sleep``,
``asyncio.timeout`` and ``wait_for`` all read this time, so a run of simulated minutes takes
what its work takes, and a run is a pure function of its seed: asyncio runs ready callbacks
in FIFO order and timers in time order, and nothing else decides what runs next.

The loop is a ``SelectorEventLoop`` with a selector that owns no file descriptors: its
``select(timeout)`` advances the clock by ``timeout``. A ``select`` with no timeout (nothing
ready, no timer) means every task waits on something that can never happen: the run is
stuck, and ``SimStuckError`` says so rather than hanging; so does a loop that runs
``SPIN_TURNS_MAX`` turns without time moving (something busy-waits, which on a real node
would burn a core).

A timer runs at its due time, never before: asyncio runs every timer due within its clock
resolution of now (``CLOCK_RESOLUTION_S`` here), so ``select`` also moves the clock up to
the latest timer the turn is about to run. On a real loop time moves on by itself, and a
timer run a nanosecond early is late by the time anyone reads the clock; here only
``select`` moves it, and a timer run early left a run a few femtoseconds short of the
deadline it had waited for: waiting out that rest, again and again, ran at once every time
(seeds 239 and 1981 reported ``StreamGroup.open_pull > _await_transfer > wait_for`` as a
spin; tests/vopr/test_loop.py). That catch-up alone does not count as time moving.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CLOCK_RESOLUTION_S",
    "EPOCH_NS",
    "SPIN_TURNS_MAX",
    "LoopNodeClock",
    "SimLoop",
    "SimStuckError",
    "close_loop",
]

SPIN_TURNS_MAX = 1_000_000
# Timers due within this of now run now: sums of float delays must not leave a timer a
# rounding error short of due (the loop would then spin on select(~0)).
CLOCK_RESOLUTION_S = 1e-9


class SimStuckError(RuntimeError):
    """Nothing can run and no timer is set: every task waits forever."""


class _TimeSelector(selectors.BaseSelector):
    """Registers file objects (the loop's self-pipe) but never reports one ready; ``select``
    moves simulated time forward by its timeout."""

    def __init__(self) -> None:
        self.now = 0.0
        self._keys: dict[int, selectors.SelectorKey] = {}
        self._still = 0  # turns since time last moved
        self.loop: asyncio.AbstractEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise SimStuckError("nothing is ready and no timer is set: every task waits forever")
        if timeout > 0:
            self.now += timeout
        self.now = self._latest_due(self.now)
        if timeout > 0:
            self._still = 0
        else:
            self._still += 1
            if self._still > SPIN_TURNS_MAX:
                raise SimStuckError(
                    f"{SPIN_TURNS_MAX} loop turns without time moving: a spin; running: "
                    f"{self.spinning()}"
                )
        return []

    def _latest_due(self, now: float) -> float:
        """The time to run this turn's timers at: ``now``, or the due time of the latest
        timer the loop runs this turn, those due before ``now + CLOCK_RESOLUTION_S`` (and,
        once the clock moves up to one, those due within the resolution of it). The loop's
        timers are a heap (asyncio's own ``_scheduled``), so only the due ones are looked at:
        a child is never due before its parent."""
        heap = getattr(self.loop, "_scheduled", None)
        if not heap or heap[0].when() >= now + CLOCK_RESOLUTION_S:
            return now  # no timer runs this turn: the usual case
        while True:
            limit = now + CLOCK_RESOLUTION_S
            latest = now
            stack = [0]
            while stack:
                i = stack.pop()
                if i < len(heap) and heap[i].when() < limit:
                    if not heap[i].cancelled():
                        latest = max(latest, heap[i].when())
                    stack += (2 * i + 1, 2 * i + 2)
            if latest == now:
                return now
            now = latest

    def spinning(self) -> str:
        """What the loop runs again and again (its ready callbacks), for the error."""
        ready = getattr(self.loop, "_ready", ())  # asyncio's own queue: a diagnostic only
        seen = set()
        for h in ready:
            task = getattr(getattr(h, "_callback", None), "__self__", None)
            coro = task.get_coro() if isinstance(task, asyncio.Task) else None
            chain = []
            while coro is not None and len(chain) < 12:  # down the awaits, to where it waits
                frame = getattr(coro, "cr_frame", None)
                if frame is not None:
                    chain.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None)
            seen.add(" > ".join(chain) or repr(h)[:120])
        return "; ".join(sorted(seen))[:2000]

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """A loop whose ``time()`` is simulated, starting at 0 (module docstring)."""

    def __init__(self) -> None:
        self._time_selector = _TimeSelector()
        super().__init__(self._time_selector)
        self._time_selector.loop = self
        self._clock_resolution = CLOCK_RESOLUTION_S

    def time(self) -> float:
        return self._time_selector.now


EPOCH_NS = 1_767_225_600 * 10**9  # 2026-01-01: where a simulated wall clock starts


class LoopNodeClock:
    """A node's clocks (cluster/common/clock.py's ``NodeClock``) on the running loop's time:
    on a ``SimLoop``, simulated. The wall clock starts at ``EPOCH_NS``."""

    def time_ns(self) -> int:
        return EPOCH_NS + int(asyncio.get_running_loop().time() * 1e9)

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Close a loop a run is done with: the tasks it left behind (a group's poller is
    cancelled, not awaited; a failed run leaves everything) are cancelled and awaited first."""
    left = asyncio.all_tasks(loop)
    for t in left:
        t.cancel()
    with contextlib.suppress(Exception):
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
