"""A ``StreamGroup``'s pull requests (``cluster/stream/group.py``): each one queued on its
consumer's leader copy, and its events (deliveries once their Deliver op is proposed,
statuses) handed to its ``PullHandle`` until the call ends.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from raftstream.cluster.stream.consumers import ConsumerDecisions
from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.leadership import Leadership
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import PullEvent, PullRequest

__all__ = ["PullHandle", "Pulls"]

log = logging.getLogger(__name__)

PULL_QUEUE_EVENTS_SLACK = 64  # room in a pull's queue beyond its batch (statuses)


class PullHandle:
    """One pull request's events (deliveries once their Deliver op is proposed, statuses),
    in order. At most ``batch`` + ``PULL_QUEUE_EVENTS_SLACK`` events wait; one more is
    dropped (logged). Belongs to the node's event loop."""

    def __init__(self, reply: str, batch: int, close: Callable[[str], None]) -> None:
        self.reply = reply
        self._items: collections.deque[PullEvent] = collections.deque()
        self._items_max = batch + PULL_QUEUE_EVENTS_SLACK
        self._ready = asyncio.Event()
        self._close = close

    def put(self, events: Sequence[PullEvent]) -> int:
        """Queue ``events`` in order, as many as there is room for; returns how many did
        not fit (dropped)."""
        room = self._items_max - len(self._items)
        self._items.extend(events[: max(0, room)])
        self._ready.set()
        return max(0, len(events) - room)

    async def take(self) -> list[PullEvent]:
        """Every queued event, oldest first, waiting until there is one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        out = list(self._items)
        self._items.clear()
        return out

    def close(self) -> None:
        """The pull's call ended (completed, failed, cancelled): stop taking events and
        drop its request if it still waits. Idempotent."""
        self._close(self.reply)


class Pulls:
    """The pull requests of this leader's calls, by reply subject. ``wake`` wakes the
    leader's timer (the poller), which serves waiting pulls."""

    def __init__(
        self,
        core: GroupCore,
        leadership: Leadership,
        consumers: ConsumerDecisions,
        *,
        wake: Callable[[], None],
    ) -> None:
        self._core = core
        self._lead = leadership
        self._consumers = consumers
        self._wake = wake
        self._waiters: dict[str, PullHandle] = {}
        self._reply_ids = itertools.count(1)

    async def open_pull(
        self, consumer: str, request: dict[str, Any], timeout_s: float | None
    ) -> PullHandle:
        """``StreamGroup.open_pull``: queue a pull request on the leader copy."""
        await self._lead.await_transfer(timeout_s)
        consumers = self._consumers
        c = consumers.leader_consumer(consumer)
        reply = f"pull.{next(self._reply_ids)}"
        handle = PullHandle(reply, int(request.get("batch", 1)), lambda r: self._close(c, r))
        self._waiters[reply] = handle
        req = PullRequest(reply=reply, **request)
        try:
            await consumers.run(c, lambda now: c.pull(req, now), timeout_s, deliver_early=True)
        except BaseException:
            handle.close()
            raise
        self._wake()
        return handle

    def _close(self, c: Consumer, reply: str) -> None:
        """The call of pull ``reply`` on the leader copy ``c`` ended. A request still
        waiting (the client cancelled or went away, or its deadline cut the call) is
        dropped from ``c`` at once, as JetStream drops a request whose requester is gone:
        else it would hold a ``max_waiting`` place and take messages no one receives until
        it expired. Waiting requests are leader-local (engine/consumer_pull.py), so this
        proposes nothing. Deliveries decided for it before this point (their Deliver op
        proposed) are not undone: they stay pending and are redelivered after ack_wait.
        A copy dropped since (stale, deleted) had its requests drained with a 409."""
        self._waiters.pop(reply, None)
        if c.deleted or self._consumers.stale(c) or not c.cancel_pull(reply):
            return
        # Inactivity starts when the last pull ends.
        self._consumers.active_ns[c.name] = self._core.now_ns()

    def dispatch(self, events: list[PullEvent]) -> None:
        """Hand ``events`` to their pull handles, one batch per handle."""
        batches: dict[str, list[PullEvent]] = {}
        waiters = self._waiters
        for e in events:
            if e.reply not in waiters:
                continue  # the client went away: an undelivered message is redelivered later
            batch = batches.get(e.reply)
            if batch is None:
                batch = batches[e.reply] = []
            batch.append(e)
        for reply, items in batches.items():
            if waiters[reply].put(items):
                log.warning("pull queue full; events dropped", extra={"group": self._core.group})
