"""ReadIndex bookkeeping on the leader (Raft thesis §6.4).

A read is linearizable if it is served once the state machine has applied the commit index
the leader had when the read arrived, provided the leader was still the leader then. The
leader proves the latter with one heartbeat round carrying the read's context: once a quorum
echoes that context back, every read queued up to and including it is confirmed (a later
round confirms earlier reads too, since acknowledgements are cumulative in time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PendingRead", "ReadOnly"]


@dataclass(slots=True)
class PendingRead:
    index: int  # the leader's commit index when the read arrived
    requester: str  # who asked: the leader itself or a follower to answer
    context: bytes
    acks: set[str] = field(default_factory=set)


class ReadOnly:
    """Reads waiting for their heartbeat round, oldest first."""

    __slots__ = ("_by_ctx", "_queue")

    def __init__(self) -> None:
        self._by_ctx: dict[bytes, PendingRead] = {}
        self._queue: list[bytes] = []

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, index: int, requester: str, context: bytes, self_id: str) -> bool:
        """Queue a read; False if a read with the same context is already waiting."""
        if context in self._by_ctx:
            return False
        self._by_ctx[context] = PendingRead(index, requester, context, {self_id})
        self._queue.append(context)
        return True

    def ack(self, peer: str, context: bytes) -> set[str] | None:
        """Record ``peer`` echoing ``context``; the acks so far, or None if unknown."""
        pending = self._by_ctx.get(context)
        if pending is None:
            return None
        pending.acks.add(peer)
        return pending.acks

    def advance(self, context: bytes) -> list[PendingRead]:
        """Release every read queued up to and including ``context``."""
        if context not in self._by_ctx:
            return []
        n = self._queue.index(context) + 1
        done = [self._by_ctx.pop(c) for c in self._queue[:n]]
        del self._queue[:n]
        return done

    def last_context(self) -> bytes | None:
        return self._queue[-1] if self._queue else None

    def clear(self) -> None:
        self._by_ctx.clear()
        self._queue.clear()
