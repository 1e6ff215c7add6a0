"""The whole-node simulator's loop (tests/support/simloop.py): simulated time, and what it calls a
spin. A timer runs at its due time, never before it, even when the loop runs it with an
earlier timer that is within the loop's clock resolution of it: a run would otherwise see a
deadline a few femtoseconds away after its timer fired, and code that waits out what is
left of a deadline would wait again and again without time ever moving (seeds 239 and 1981:
``StreamGroup.open_pull > _await_transfer > wait_for``, reported as a spin)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import pytest

from tests.support import simloop as loop_module
from tests.support.simloop import SimLoop, SimStuckError


def _run(main: Coroutine[Any, Any, Any]) -> Any:
    loop = SimLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.close()


def test_a_timer_runs_at_its_time_with_an_earlier_one_within_the_resolution() -> None:
    async def main() -> list[tuple[float, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[float, float]] = []
        first = 3.4730942775230855  # the times of seed 239's spin
        for when in (first, first + 2e-14, first + 5e-10):
            loop.call_at(when, lambda w=when: seen.append((w, loop.time())))
        await asyncio.sleep(4)
        return seen

    seen = _run(main())
    assert len(seen) == 3
    for when, ran_at in seen:
        assert ran_at >= when, (when, ran_at)


def test_waiting_out_a_deadline_does_not_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """As ``Leadership.await_transfer`` waits (a poll of 10 ms, then what is left of its
    deadline), while another task's timer falls within the loop's clock resolution before
    that deadline. Before the fix, the wait's timer ran with the other one, a few
    femtoseconds short of the deadline, and every later wait for those few femtoseconds
    ran at once again: a spin."""
    monkeypatch.setattr(loop_module, "SPIN_TURNS_MAX", 10_000)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        deadline = 3.4730942775231055  # seed 239's deadline
        loop.call_at(deadline - 2e-14, lambda: None)  # another task's timer, just before
        event = asyncio.Event()  # never set: the transfer never ends
        while (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(left, 0.01))
        return loop.time()

    try:
        ended = _run(main())
    except SimStuckError as exc:
        pytest.fail(f"the wait spun: {exc}")
    assert ended == 3.4730942775231055


def test_a_busy_wait_is_still_a_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the catch-up to a timer's time must not hide: a loop that never lets time move."""
    monkeypatch.setattr(loop_module, "SPIN_TURNS_MAX", 1_000)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, lambda: None)
        while True:
            await asyncio.sleep(0)

    with pytest.raises(SimStuckError, match="without time moving"):
        _run(main())
