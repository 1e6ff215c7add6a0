"""The meta group on this node: ``MetaState`` as a Raft state machine, and the reconciler.

Every node runs the meta group (``meta``; voters up to ``meta_voters_max``, in name order,
the rest learners) and applies its log to a local ``MetaState``: an always-current cache of
every stream and consumer assignment that any node can answer lists and lookups from.

Proposals: only the meta leader proposes (``propose``). It validates and places BEFORE
proposing (``cluster/meta/placement.py``), stamps the entry with its clock (replicas use the
stamp, never their clock) and answers from the entry's apply result; a refusal is a
replicated result (``MetaState.apply_data``), raised to the caller here. A node that is not
the meta leader forwards meta requests (``cluster/services_*.py``).

Reconciler: after entries apply, a task compares the streams assigned to this node with the
stream groups it runs, and starts or stops groups through the node's callbacks; and tells
the groups this node leads that their consumers or config may have changed (the stream
leader sequences them into its log). It starts only once the meta log replayed up to the
commit index it had at start, so a restarting node never acts on a stale intermediate
state (say, removing the log of a stream that was deleted and created again).

Repairs: the meta leader proposes ``plan_repairs`` (``cluster/meta/placement.py``) after every
reconcile it runs while leading, so after a ``PeerRemove`` applies and whenever it becomes
the meta leader (an interrupted repair resumes: the plan reads only the state). Each
``ReassignGroup`` carries ``prior_peers``, so a stale one is refused, never misapplied. The
stream group's leader then carries the new peers out (``cluster/stream/membership.py``).

Fresh groups: ``fresh_groups`` holds the stream groups whose ``AddStream`` this node applied
and whose peers have not changed since: on those, a node without state for the group is one
of its initial members and creates it (``RaftHost.create_group``); on any other it joins
empty and waits for the leader's snapshot (``RaftHost.join_group``). A restored meta
snapshot empties the set (joining is the safe choice: a node that joins never campaigns).

Ownership: the node's event loop. Failures in a callback are logged and retried on the
next trigger (level-triggered).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from raftstream.cluster.common.answers import bounded_ms, moving_to, no_commit
from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.raft_errors import LeadershipTransferError
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.entries import MetaEntry, encode_entry
from raftstream.cluster.meta.placement import NodeInfo, plan_repairs
from raftstream.cluster.meta.results import (
    GroupReassigned,
    MetaResult,
    StreamAdded,
    StreamDeleted,
    StreamUpdated,
)
from raftstream.cluster.meta.state import MetaState
from raftstream.errors import (
    DeadlineExceededError,
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
    RaftStreamError,
)
from raftstream.raft.host import RaftHost
from raftstream.raft.types import Entry

__all__ = ["META_GROUP", "MetaGroup", "meta_members"]

META_GROUP = "meta"
REPLAY_POLL_S = 0.02  # how often the reconciler looks whether the restart replay is done
RECONCILE_BUG_RETRY_S = 1.0  # after an unexpected error (logged with its traceback)
log = logging.getLogger(__name__)


def meta_members(peers: Sequence[str], voters_max: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(voters, learners) of the meta group: the first ``voters_max`` names, sorted."""
    names = sorted(peers)
    return tuple(names[:voters_max]), tuple(names[voters_max:])


class MetaGroup:
    """This node's replica of the meta group (see the module docstring)."""

    def __init__(
        self,
        *,
        node_id: str,
        host: RaftHost,
        metrics: NodeMetrics,
        proposal_timeout_ms: int,
        client_addr: Callable[[str], str | None],
        reconcile: Callable[[tuple[StreamAssignment, ...]], Awaitable[None]],
        nodes: Callable[[], Sequence[NodeInfo]],
        clock: NodeClock = SYSTEM_CLOCK,
    ) -> None:
        self.node_id = node_id
        self.state = MetaState()
        self._host = host
        self._metrics = metrics
        self._timeout_ms = proposal_timeout_ms
        self._client_addr = client_addr
        self._reconcile = reconcile
        self._nodes = nodes
        self._clock = clock  # the leader's stamps (a simulation gives its own)
        self.fresh_groups: set[str] = set()
        self._trigger = asyncio.Event()
        self._replayed_to = 0  # the commit index the log had at start
        self.applied = 0
        self._task: asyncio.Task[None] | None = None

    # -- the state machine (RaftHost) --------------------------------------------------------

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]:
        results = [self.state.apply_data(e.data) for e in entries]
        for r in results:
            self._track_fresh(r)
        if entries:
            self.applied = entries[-1].index
        self._metrics.commits.labels("meta").inc(len(entries))
        self._trigger.set()
        return results

    def _track_fresh(self, result: MetaResult | RaftStreamError) -> None:
        if isinstance(result, StreamAdded) and result.created:
            self.fresh_groups.add(result.assignment.group)
        elif isinstance(result, GroupReassigned | StreamDeleted) or (
            isinstance(result, StreamUpdated) and result.assignment.peers != result.previous.peers
        ):
            self.fresh_groups.discard(result.assignment.group)

    def snapshot(self, group: str) -> bytes:
        return self.state.snapshot()

    def restore(self, group: str, data: bytes) -> None:
        self.state.restore(data)
        self.fresh_groups.clear()
        self._trigger.set()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, peers: Sequence[str], voters_max: int, replay_to: int) -> None:
        """Add the meta group to the host; reconcile once the log replayed to ``replay_to``."""
        voters, learners = meta_members(peers, voters_max)
        self._replayed_to = replay_to
        # Commit notices on (raft/host.py "Commit notices"): every node answers listings from
        # its own replica, which should apply a definition at once, not a heartbeat later.
        self._host.add_group(
            META_GROUP,
            voters=voters,
            learners=learners,
            state_machine=self,
            commit_notices=True,
        )
        self._task = asyncio.get_running_loop().create_task(self._run(), name="meta-reconciler")
        self._trigger.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._trigger.wait()
            self._trigger.clear()
            # The host's applied index, not the last command's: the log may end with a
            # leader's empty entry, which is applied without reaching ``apply``.
            if self._host.status(META_GROUP).applied < self._replayed_to:
                # Still replaying the log of a restart: never act on a stale state.
                await asyncio.sleep(REPLAY_POLL_S)
                self._trigger.set()
                continue
            try:
                await self._reconcile(self.state.streams_for_node(self.node_id))
                if self.is_leader:
                    await self._repair()
            except RaftStreamError as exc:
                log.warning("reconcile failed: %r", exc, extra={"node": self.node_id})
                await asyncio.sleep(0.2)
                self._trigger.set()
            except Exception:  # a bug: said, and retried; the reconciler must not die
                log.exception("reconcile failed", extra={"node": self.node_id})
                await asyncio.sleep(RECONCILE_BUG_RETRY_S)
                self._trigger.set()

    async def _repair(self) -> None:
        """Meta leader: propose the ``ReassignGroup`` entries that restore replica counts
        (one at a time, in order; a refused one is planned again on the next trigger)."""
        plan = plan_repairs(state=self.state, nodes=self._nodes(), ts_ns=self._clock.time_ns())
        for group in plan.stuck:
            log.warning(
                "not re-placing %s: a majority of its replicas were on removed nodes, so no"
                " leader can move it; peer-add them and start them with their data, or"
                " delete the stream",
                group,
                extra={"node": self.node_id},
            )
        for entry in plan.entries:
            log.info("re-placing %s on %s", entry.stream, ",".join(entry.peers))
            await self.propose(entry, None)

    def poke(self) -> None:
        """Reconcile again soon (a group's leadership changed, a retry is due)."""
        self._trigger.set()

    # -- lookups on this replica's state (a stream group's MetaView reads through them) -----

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        """The stream's consumers here; none when the stream is not (or no longer) here."""
        try:
            return self.state.consumers_of(account, stream)
        except NotFoundError:
            return ()

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        """The stream's assignment here, or None."""
        try:
            return self.state.stream(account, stream)
        except NotFoundError:
            return None

    # -- leadership and proposals -----------------------------------------------------------

    @property
    def leader(self) -> str | None:
        return self._host.leader(META_GROUP)

    @property
    def is_leader(self) -> bool:
        return self.leader == self.node_id

    def not_leader(self) -> NotLeaderError | NoLeaderError:
        leader = self.leader
        if leader is None or leader == self.node_id:
            return NoLeaderError("the meta group has no leader yet", group=META_GROUP)
        return NotLeaderError(
            "not the meta leader", leader=leader, leader_addr=self._client_addr(leader)
        )

    async def propose(self, entry: MetaEntry, timeout_s: float | None) -> MetaResult:
        """Propose ``entry`` (this node must lead); its result once applied here, or the
        refusal raised. NotLeaderError carries the leader's address; a timeout is ambiguous
        (UnavailableError: the entry may still apply)."""
        if not self.is_leader:
            raise self.not_leader()
        timeout_ms = bounded_ms(self._timeout_ms, timeout_s)
        self._metrics.proposals.labels("meta").inc()
        try:
            result = await self._host.propose(
                META_GROUP, encode_entry(entry), timeout_ms=timeout_ms
            )
        except NotLeaderError:
            self._metrics.proposal_failures.labels("meta").inc()
            raise self.not_leader() from None
        except LeadershipTransferError as exc:
            self._metrics.proposal_failures.labels("meta").inc()
            raise moving_to("the meta leadership", exc.to, self._client_addr(exc.to)) from None
        except DeadlineExceededError:
            self._metrics.proposal_failures.labels("meta").inc()
            raise no_commit("meta change") from None
        except RaftStreamError:
            self._metrics.proposal_failures.labels("meta").inc()
            raise
        if isinstance(result, RaftStreamError):
            raise result
        return result  # type: ignore[no-any-return]
