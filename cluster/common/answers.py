"""How long a proposer waits for its commit, and what it answers when the commit does not come
in time or leadership is moving: the rules every group's callers share (the stream groups'
publishes and decisions, the meta group's proposals).

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftstream.errors import NotLeaderError, UnavailableError

__all__ = [
    "ANSWER_MARGIN_S",
    "answer_within",
    "answered_within",
    "bounded_ms",
    "moving_to",
    "no_commit",
]

ANSWER_MARGIN_S = 0.05  # answer this long before the client's deadline (at most 10% of it)


def answer_within(timeout_s: float | None) -> float | None:
    """How long to wait for a commit: a little less than the client's time left, so the
    client gets our UNAVAILABLE (no quorum in time) rather than its own DEADLINE_EXCEEDED."""
    if timeout_s is None:
        return None
    return max(0.001, timeout_s - min(ANSWER_MARGIN_S, timeout_s / 10))


def bounded_ms(timeout_ms: int, timeout_s: float | None) -> int:
    """A Raft request's timeout: ``timeout_ms`` (the node's proposal timeout), cut to a little
    less than the client's ``timeout_s`` when one is given (``answer_within``)."""
    within = answer_within(timeout_s)
    return timeout_ms if within is None else max(1, min(timeout_ms, int(within * 1000)))


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
