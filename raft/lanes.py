"""Where the Raft host's storage writes run: a ``WriteLane`` it is given.

A lane runs the jobs submitted to it one at a time, in the order submitted (FIFO), and
hands each one's outcome back on the event loop as an awaitable. The host counts on both:
one storage write at a time, and a write submitted after another is done after it (a
``remove_group`` after the writes queued before it; see raft/host.py).

- ``ThreadLane``: the real one, one writer thread (LMDB write transactions are bound to a
  thread). What the host used before it took a lane.
- ``InlineLane``: the simulated twin. Jobs run on the event loop itself, never inside
  ``submit`` (as on a thread, the submitter goes on before its job runs): at the loop's next
  turn, or ``delay_s`` later on the given ``Clock`` (a slow disk, in simulated time). The
  job's exception fails its awaitable.

A lane belongs to one host, which closes it when it stops.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Callable
from typing import Any, Protocol

from raftstream.raft.clock import Clock
from raftstream.raft.errors import InvalidArgumentError, UnavailableError

__all__ = ["InlineLane", "ThreadLane", "WriteLane"]


class WriteLane(Protocol):
    """Runs jobs one at a time, FIFO; results come back on the event loop."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue ``fn(*args)`` after the jobs already queued; the future (of the running
        loop) resolves to its result or fails with its exception."""
        ...

    def close(self) -> None:
        """Finish the queued jobs, then take no more. Called once, by the owning host."""
        ...


class ThreadLane:
    """One writer thread (``ThreadPoolExecutor(1)``: FIFO)."""

    def __init__(self, *, thread_name_prefix: str = "raft-writer") -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=thread_name_prefix
        )

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        # Blocks until the queued jobs are done: a write must finish or not start.
        self._executor.shutdown(wait=True)


class InlineLane:
    """Jobs on the event loop, in order, each ``delay_s`` after the previous one finished
    (on ``clock``; without a clock, ``delay_s`` must be 0)."""

    def __init__(self, clock: Clock | None = None, *, delay_s: float = 0.0) -> None:
        if delay_s < 0 or (delay_s > 0 and clock is None):
            raise InvalidArgumentError("delay_s", "must be 0, or positive with a clock")
        self._clock = clock
        self._delay_s = delay_s
        self._jobs: collections.deque[
            tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]
        ] = collections.deque()
        self._closed = False
        self.jobs_run = 0  # for tests and simulators

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._closed:
            fut.set_exception(UnavailableError("write lane closed"))
            return fut
        self._jobs.append((fn, args, fut))
        if len(self._jobs) == 1:  # nothing running or scheduled: schedule this one
            self._schedule()
        return fut

    def _schedule(self) -> None:
        if self._clock is not None and self._delay_s > 0:
            self._clock.call_at(self._clock.now() + self._delay_s, self._run_next)
        else:
            asyncio.get_running_loop().call_soon(self._run_next)

    def _run_next(self) -> None:
        if not self._jobs:
            return  # close() ran them
        fn, args, fut = self._jobs[0]
        self._run(fn, args, fut)
        self._jobs.popleft()
        if self._jobs:
            self._schedule()

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], fut: asyncio.Future[Any]) -> None:
        self.jobs_run += 1
        try:
            result = fn(*args)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
            return
        if not fut.done():
            fut.set_result(result)

    def close(self) -> None:
        # As the thread lane's shutdown: what was queued is done, now.
        self._closed = True
        while self._jobs:
            fn, args, fut = self._jobs.popleft()
            self._run(fn, args, fut)
