"""Watches of a bucket (``KeyValue.watch``): a ``KeyWatcher`` over an ordered
subscription, the latest entry per key (or the whole history) first, then ``None`` once (the
end of the initial data), then updates as they happen (``raftstream.kv``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Self

from raftstream import errors
from raftstream._kv_model import KeyValueEntry, KeyValueOp, as_bucket_error
from raftstream.ordered import OrderedSubscription

if TYPE_CHECKING:
    from raftstream.kv import KeyValue

__all__ = ["KeyWatcher", "transient_only"]


def transient_only(
    forward: Callable[[errors.RaftStreamError], None],
) -> Callable[[errors.RaftStreamError], None]:
    """A watch's error callback: passes on the errors its ordered consumer recovers from
    (retriable ones); an error that ends it is left to ``KeyWatcher.updates`` to raise, so
    it is reported once (an ordered consumer retries every retriable error itself, so the
    others are exactly the ones that end it)."""

    def report(exc: errors.RaftStreamError) -> None:
        if exc.retriable:
            forward(exc)

    return report


class KeyWatcher:
    """A running watch (see ``KeyValue.watch``); owns its ordered subscription."""

    def __init__(self, kv: KeyValue, sub: OrderedSubscription, *, ignore_deletes: bool) -> None:
        self._kv = kv
        self._sub = sub
        self._ignore_deletes = ignore_deletes
        # The filter held nothing when the watch began: the end marker comes first.
        self._initial_done = sub.initial_info.num_pending == 0
        self._marker_due = self._initial_done

    @property
    def subscription(self) -> OrderedSubscription:
        return self._sub

    async def updates(self, timeout: float | None = None) -> KeyValueEntry | None:
        """The next entry, or ``None`` once at the end of the initial data. Raises
        ``DeadlineExceededError`` when nothing came within ``timeout`` seconds (None: wait),
        ``BucketNotFoundError`` once the bucket is deleted (the watch has ended),
        ``SubscriptionClosedError`` once stopped."""
        while True:
            if self._marker_due:
                self._marker_due = False
                return None
            try:
                msg = await self._sub.next_msg(timeout)
            except errors.NotFoundError as exc:
                raise as_bucket_error(self._kv.bucket, exc) from None
            entry = self._kv.entry_of(msg)
            if not self._initial_done and entry.delta == 0:
                self._initial_done = True
                self._marker_due = True
            if self._ignore_deletes and entry.operation is not KeyValueOp.PUT:
                continue
            return entry

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> KeyValueEntry | None:
        try:
            return await self.updates(None)
        except errors.SubscriptionClosedError:
            raise StopAsyncIteration from None

    async def stop(self) -> None:
        """End the watch and delete its consumer."""
        await self._sub.unsubscribe()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
