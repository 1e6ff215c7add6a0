"""What every part of a ``StreamGroup`` shares (``cluster/stream/group.py``): the node's
``GroupDeps``, the group's names and replica, the leader's clock, proposing on the group,
the background tasks the parts start.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from raftstream.cluster.common.answers import bounded_ms
from raftstream.cluster.stream.replica import StreamReplica
from raftstream.errors import RaftStreamError

if TYPE_CHECKING:
    from raftstream.cluster.stream.deps import GroupDeps

__all__ = ["GroupCore"]


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
        self.d.metrics.proposals.labels("stream").inc()
        return self.d.host.propose(
            self.group,
            data,
            timeout_ms=bounded_ms(self.d.proposal_timeout_ms, timeout_s),
            lazy=lazy,
        )

    def confirm_leader(self, timeout_s: float | None) -> Awaitable[int]:
        """Resolves once a quorum confirmed that this node still led the group when it was
        called (a ReadIndex round, Raft thesis §6.4: heartbeats, no fsync), bounded as a
        proposal is. A deposed leader that has not heard of the new term yet fails it
        (NOT_LEADER, NO_LEADER, or DEADLINE_EXCEEDED when it cannot reach a quorum)."""
        return self.d.host.read_index(
            self.group, timeout_ms=bounded_ms(self.d.proposal_timeout_ms, timeout_s)
        )

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
