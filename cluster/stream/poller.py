"""A ``StreamGroup``'s leader timer (``cluster/stream/group.py``): while this node leads
with valid copies, it serves waiting pulls on new data and deadlines, proposes the stream's
expiry (max_age, per-message TTLs) and asks the meta leader to delete consumers gone
inactive. It runs when woken (an apply, a new pull, a transfer's end) and at least every
``POLL_INTERVAL_MAX_S``.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from raftstream.cluster.stream.consumers import ConsumerDecisions
from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.leadership import Leadership
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.entries import Expire
from raftstream.errors import RaftStreamError

__all__ = ["Poller"]

log = logging.getLogger(__name__)

POLL_INTERVAL_MAX_S = 1.0  # the leader's timer looks at expiry at least this often


class Poller:
    """The leader's timer task. ``propose_stream`` proposes an engine entry on the stream
    (``StreamGroup.propose_stream``): the poller's expiry."""

    def __init__(
        self,
        core: GroupCore,
        leadership: Leadership,
        consumers: ConsumerDecisions,
        *,
        propose_stream: Callable[[EngineEntry, float | None], Awaitable[Any]],
    ) -> None:
        self._core = core
        self._lead = leadership
        self._consumers = consumers
        self._propose_stream = propose_stream
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reaping: set[str] = set()  # inactive consumers whose deletion is in flight

    def wake(self) -> None:
        """Run the timer's work on the next loop turn rather than when its timer is due."""
        self._wake.set()

    def start(self) -> None:
        """Start the timer unless it runs (the leader copies were just built)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        """Leader timer: serve waiting pulls on new data and deadlines; propose expiry."""
        group = self._core.group
        try:
            while self._lead.ready:
                await self._poll_once()
                timeout = self._next_wake_s()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        except RaftStreamError as exc:
            # A failed proposal dropped the leader state; the next barrier starts a poller.
            log.info("poller stopped: %r", exc, extra={"group": group})
        except Exception:
            log.exception("poller failed (a bug)", extra={"group": group})
            self._lead.proposal_failed(RaftStreamError("poller failed"))
        finally:
            self._task = None

    async def _poll_once(self) -> None:
        if self._lead.held_until_woken():
            return  # waiting pulls wait
        consumers = self._consumers
        for c in list(consumers.copies.values()):
            # A copy dropped while an earlier one was proposed is skipped: it is stale.
            if (
                self._lead.ready
                and not consumers.stale(c)
                and not c.deleted
                and c.config.is_pull
                and c.num_waiting
            ):
                await consumers.run(c, c.poll, None, deliver_early=True)
        await self._maybe_expire()
        self.reap_inactive()

    def reap_inactive(self) -> None:
        """Consumers idle past their ``inactive_threshold`` (no waiting pull, no push call
        attached, no request or ack) are deleted through the meta leader, as in JetStream
        2.9+: every ephemeral (5 s unless set) and a durable that sets one (0, a durable's
        default: never). The deletion then comes back to this group as a CONSUMER_DELETE."""
        now = self._core.now_ns()
        consumers = self._consumers
        copies, active_ns = consumers.copies, consumers.active_ns
        if len(active_ns) > len(copies):  # consumers deleted since: forget them
            for gone in [n for n in active_ns if n not in copies]:
                del active_ns[gone]
        for name, c in copies.items():
            threshold = c.config.inactive_threshold
            if not threshold or name in self._reaping:
                continue
            if c.num_waiting or consumers.push_bound(name):
                continue
            # A consumer created while this node leads is first seen here: idle from now.
            if now - active_ns.setdefault(name, now) < threshold:
                continue
            self._reaping.add(name)
            self._core.spawn(self._reap(name))

    async def _reap(self, name: str) -> None:
        core = self._core
        try:
            await core.d.delete_consumer(core.account, core.name, name)
        except RaftStreamError as exc:
            log.info(
                "inactive consumer %s not deleted yet: %r",
                name,
                exc,
                extra={"group": core.group},
            )
        finally:
            self._reaping.discard(name)

    def _next_wake_s(self) -> float:
        if self._lead.held():
            return POLL_INTERVAL_MAX_S  # the transfer's end wakes it
        now = self._core.now_ns()
        wakes = [c.next_wake_ns(now) for c in self._consumers.copies.values() if not c.deleted]
        due = min((w for w in wakes if w), default=0)
        if not due:
            return POLL_INTERVAL_MAX_S
        return max(0.001, min(POLL_INTERVAL_MAX_S, (due - now) / 1e9))

    async def _maybe_expire(self) -> None:
        replica = self._core.replica
        cfg = replica.stream.config
        st = replica.store.state()
        if not st.msgs or not (cfg.max_age or cfg.allow_msg_ttl):
            return
        now = self._core.now_ns()
        if cfg.max_age and st.first_ts + cfg.max_age > now and not cfg.allow_msg_ttl:
            return
        with contextlib.suppress(RaftStreamError):
            await self._propose_stream(Expire(ts_ns=now), None)
