"""The push subscriptions of one client: which are alive, which consumers a non-queue one is
bound to, and what ending one does (forget it; delete the consumer the SDK created).

Belongs to the client's loop. The bound set makes "duplicate subscription" hold within one
client even when the server does not report ``push_bound``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from raftstream import errors
from raftstream._push import PushSubscription

__all__ = ["CLOSE_DELETE_WAIT_S", "SubscriptionRegistry"]

DeleteConsumer = Callable[[str, str], Awaitable[bool]]
# Closing a client deletes the ephemeral consumers its subscriptions made, waiting at most
# this long (best effort: the server may be gone).
CLOSE_DELETE_WAIT_S = 2.0


class SubscriptionRegistry:
    def __init__(self, delete_consumer: DeleteConsumer) -> None:
        self._delete_consumer = delete_consumer
        self._subs: dict[PushSubscription, bool] = {}  # -> delete when the client closes
        self._bound: set[tuple[str, str]] = set()

    def is_bound(self, stream: str, consumer: str) -> bool:
        return (stream, consumer) in self._bound

    def register(self, sub: PushSubscription, *, bound: bool, ephemeral_created: bool) -> None:
        """``ephemeral_created``: the SDK made an ephemeral consumer for ``sub``; it is
        deleted when the client closes (a durable one outlives the client)."""
        self._subs[sub] = ephemeral_created
        if bound:
            self._bound.add((sub.stream, sub.consumer))

    def closer(
        self, stream: str, consumer: str, *, delete: bool, bound: bool
    ) -> Callable[[], Awaitable[None]]:
        """What a subscription runs when it ends: forget it, and delete its consumer if the
        SDK created it (one already gone is fine; another failure is raised)."""

        async def close() -> None:
            self._subs = {s: e for s, e in self._subs.items() if not s.is_closed}
            if bound:
                self._bound.discard((stream, consumer))
            if delete:
                with contextlib.suppress(errors.NotFoundError):  # gone already: fine
                    await self._delete_consumer(stream, consumer)

        return close

    async def shutdown(self) -> None:
        """End every subscription (the client is closing): ephemeral consumers the SDK made
        are deleted (best effort, ``CLOSE_DELETE_WAIT_S`` at most); others are kept."""
        subs, self._subs = self._subs, {}
        await asyncio.gather(*(_end(sub, delete) for sub, delete in subs.items()))
        self._bound.clear()


async def _end(sub: PushSubscription, delete: bool) -> None:
    if not delete:
        await sub.shutdown()
        return
    try:
        async with asyncio.timeout(CLOSE_DELETE_WAIT_S):
            await sub.unsubscribe()
    except (errors.RaftStreamError, TimeoutError):
        await sub.shutdown()
