"""``raftstream._places.Places``: publish_async's window of unanswered messages.

issue 5 "The SDK core": publish_async keeps "a bounded number pending"; a caller waits for
room up to its wait_stall. These pin what the window promises besides the bound (which
tests/sdk/test_publish.py checks end to end): waiters are served first come, first served,
a free place never skips a waiter, and a place is never lost to a timeout or a cancellation.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftstream._places import Places


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_places_are_bounded_and_given_back() -> None:
    async def main() -> None:
        places = Places(2)
        assert places.take_now() and places.take_now()
        assert not places.take_now()
        assert not await places.take(0.01)  # none came in time: nothing taken
        places.give()
        assert places.take_now()
        assert not places.take_now()

    run(main())


def test_waiters_are_served_in_order_and_before_a_newcomer() -> None:
    async def main() -> None:
        places = Places(1)
        assert places.take_now()
        order: list[str] = []

        async def waiter(name: str) -> None:
            assert await places.take(5)
            order.append(name)

        first = asyncio.ensure_future(waiter("first"))
        await _settle()
        second = asyncio.ensure_future(waiter("second"))
        await _settle()
        places.give()
        assert not places.take_now()  # the place went to "first", who still waits to run
        await _settle()
        places.give()
        await asyncio.gather(first, second)
        assert order == ["first", "second"]

    run(main())


def test_a_timed_out_or_cancelled_waiter_loses_no_place() -> None:
    async def main() -> None:
        places = Places(1)
        assert places.take_now()
        assert not await places.take(0.01)  # timed out: it no longer waits...
        places.give()
        assert places.take_now()  # ...so the place given back is free for the next
        cancelled = asyncio.ensure_future(places.take(5))
        await _settle()
        places.give()  # handed to the waiter...
        cancelled.cancel()  # ...which is cancelled before it runs
        (outcome,) = await asyncio.gather(cancelled, return_exceptions=True)
        if outcome is True:  # asyncio.wait_for (3.11) keeps a result that came first
            places.give()  # the waiter holds the place: its owner gives it back
        else:  # cancelled: it passed the place on
            assert isinstance(outcome, asyncio.CancelledError)
        assert places.take_now()  # either way the one place is there again
        assert not places.take_now()

    run(main())


def test_a_waiter_without_a_time_limit_waits_until_a_place_is_given() -> None:
    async def main() -> None:
        places = Places(1)
        assert places.take_now()
        waiter = asyncio.ensure_future(places.take(None))
        await _settle()
        assert not waiter.done()
        places.give()
        assert await waiter
        assert not places.take_now()

    run(main())
