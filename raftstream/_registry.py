"""The push subscriptions of one client: which are alive, which consumers a non-queue one is
bound to, and what ending one does (forget it; delete the consumer the SDK created).

Belongs to the client's loop. The bound set makes "duplicate subscription" hold within one
client even when the server does not report ``push_bound``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from raftstream import errors
from raftstream._push import PushSubscription

__all__ = ["SubscriptionRegistry"]

DeleteConsumer = Callable[[str, str], Awaitable[bool]]


class SubscriptionRegistry:
    def __init__(self, delete_consumer: DeleteConsumer) -> None:
        self._delete_consumer = delete_consumer
        self._subs: set[PushSubscription] = set()
        self._bound: set[tuple[str, str]] = set()
        self._closing = False

    def is_bound(self, stream: str, consumer: str) -> bool:
        return (stream, consumer) in self._bound

    def register(self, sub: PushSubscription, *, bound: bool) -> None:
        self._subs.add(sub)
        if bound:
            self._bound.add((sub.stream, sub.consumer))

    def closer(
        self, stream: str, consumer: str, *, delete: bool, bound: bool
    ) -> Callable[[], Awaitable[None]]:
        """What a subscription runs when it ends: forget it, and delete its consumer if the
        SDK created it (one already gone is fine; another failure is raised)."""

        async def close() -> None:
            self._subs = {s for s in self._subs if not s.is_closed}
            if bound:
                self._bound.discard((stream, consumer))
            if delete and not self._closing:
                with contextlib.suppress(errors.NotFoundError):  # gone already: fine
                    await self._delete_consumer(stream, consumer)

        return close

    async def shutdown(self) -> None:
        """Stop every subscription without deleting consumers (the client is closing)."""
        self._closing = True
        for sub in list(self._subs):
            await sub.shutdown()
        self._subs.clear()
        self._bound.clear()
