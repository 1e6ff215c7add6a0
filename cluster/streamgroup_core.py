"""What every part of a ``StreamGroup`` shares (``cluster/stream_leader.py``): the node's
``GroupDeps``, the group's names and replica, the leader's clock, proposing on the group,
the background tasks the parts start; and the answer-time rules of its callers.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from raftstream.cluster.stream_group import StreamReplica
from raftstream.errors import NotLeaderError, RaftStreamError, UnavailableError

if TYPE_CHECKING:
    from raftstream.cluster.stream_leader import GroupDeps

__all__ = ["GroupCore", "answer_within", "answered_within", "moving_to", "no_commit"]

ANSWER_MARGIN_S = 0.05  # answer this long before the client's deadline (at most 10% of it)


def answer_within(timeout_s: float | None) -> float | None:
    """How long to wait for a commit: a little less than the client's time left, so the
    client gets our UNAVAILABLE (no quorum in time) rather than its own DEADLINE_EXCEEDED."""
    if timeout_s is None:
        return None
    return max(0.001, timeout_s - min(ANSWER_MARGIN_S, timeout_s / 10))


def no_commit(what: str) -> UnavailableError:
    """A proposal not committed in time: a quorum is likely lost; the outcome is unknown
    (the entry may still commit), so only an idempotent request may be retried."""
    return UnavailableError(f"{what}: not committed in time (no quorum?); the outcome is unknown")


def moving_to(what: str, to: str, to_addr: str | None) -> NotLeaderError:
    """A proposal the Raft core refused while ``what`` (a group's leadership) moves to node
    ``to`` (a step-down, cluster balance, a planned stop): it is in no log, so NOT_LEADER
    naming the node taking over, which clients follow even for a request they never retry
    when its outcome is unknown (a publish without a msg id, a delete); the core's own
    refusal is a retriable UNAVAILABLE, which says no such thing."""
    return NotLeaderError(f"not done: {what} is moving to {to}", leader=to, leader_addr=to_addr)


def answered_within(
    fut: asyncio.Future[Any], timeout_s: float | None, what: str
) -> asyncio.Future[Any]:
    """``fut``'s outcome, or ``no_commit(what)`` when it is not there a little before
    ``timeout_s`` (``answer_within``; None: no bound). A future of its own (cancelling it
    leaves ``fut`` alone) and no task: a timer and a callback, cheap enough per publish.
    A late outcome of ``fut`` is retrieved and dropped."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Any] = loop.create_future()
    within = answer_within(timeout_s)

    def late() -> None:
        if not out.done():
            out.set_exception(no_commit(what))

    timer = loop.call_later(within, late) if within is not None else None

    def settled(f: asyncio.Future[Any]) -> None:
        if timer is not None:
            timer.cancel()
        if f.cancelled():
            exc: BaseException | None = UnavailableError(
                f"{what} cancelled before its answer; the outcome is unknown"
            )
        else:
            exc = f.exception()  # retrieved even when late
        if out.done():
            return
        if exc is not None:
            out.set_exception(exc)
        else:
            out.set_result(f.result())

    fut.add_done_callback(settled)
    return out


class GroupCore:
    """The node's deps, the group's names and replica, proposing, and the parts' tasks."""

    def __init__(
        self, deps: GroupDeps, *, group: str, account: str, name: str, replica: StreamReplica
    ) -> None:
        self.d = deps
        self.group = group
        self.account = account
        self.name = name
        self.replica = replica
        self._tasks: set[asyncio.Task[Any]] = set()

    def now_ns(self) -> int:
        # The leader's clock, stamped into entries and ops: replicas never read theirs (they
        # use the stamp), so every replica computes the same expiry, deadlines and state.
        return self.d.clock.time_ns()

    def propose(
        self, data: bytes, timeout_s: float | None = None, *, lazy: bool = False
    ) -> Awaitable[Any]:
        """Propose ``data`` on the group, bounded by the proposal timeout and, when given, a
        little less than ``timeout_s`` (``answer_within``)."""
        timeout_ms = self.d.proposal_timeout_ms
        within = answer_within(timeout_s)
        if within is not None:
            timeout_ms = max(1, min(timeout_ms, int(within * 1000)))
        self.d.metrics.proposals.labels("stream").inc()
        return self.d.host.propose(self.group, data, timeout_ms=timeout_ms, lazy=lazy)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of the group's (cancelled when it closes)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def watch(self, fut: Awaitable[Any], *, on_error: Callable[[BaseException], None]) -> None:
        """Call ``on_error`` if ``fut`` fails with a RaftStreamError (from a task)."""

        async def wait() -> None:
            try:
                await fut
            except RaftStreamError as exc:
                on_error(exc)

        self.spawn(wait())

    async def close_tasks(self) -> None:
        """Cancel the group's tasks and wait for them to end."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
