"""The Raft host's group table: each group's state on this node, and what the host's parts
share (raft/host.py is the host; this module is one of its parts).

``GroupState`` is a group's replica here: its core, state machine and the host's
bookkeeping around them. ``HostShared`` is what every part of the host reads and writes:
the table of groups, the set of groups to look at in the next round (``dirty``), the
driver's wake-up event, the clock, storage, transport, and how a waiter is failed
(``reject``, through the host's ``map_error``). ``WriteJobs`` counts the storage writes
handed to the write lane and not yet seen done. ``GroupTable`` starts a group's replica
from its stored state, finds groups for callers, and halts a group whose state machine or
log failed. Everything here belongs to the host's event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftstream.raft.clock import Clock
from raftstream.raft.core import RaftConfig, RaftNode
from raftstream.raft.errors import InvalidArgumentError, NotFoundError, RaftError, UnavailableError
from raftstream.raft.host_api import HostConfig, LeaderChange, SnapshotJob, StateMachine
from raftstream.raft.lanes import WriteLane
from raftstream.raft.storage import LogStorage
from raftstream.raft.transport import Transport
from raftstream.raft.types import NONE, HardState, Snapshot

if TYPE_CHECKING:
    from raftstream.raft.host_requests import Requests

__all__ = [
    "GroupState",
    "GroupTable",
    "HostShared",
    "QuiesceNotice",
    "WriteJobs",
    "not_running",
]

log = logging.getLogger("raftstream.raft.host")


@dataclass(slots=True)
class GroupState:
    name: str
    node: RaftNode
    sm: StateMachine
    applied: int
    # Proposals in the log, by index: (term at proposal, awaitable); resolved at apply.
    waiting: dict[int, tuple[int, asyncio.Future[Any]]] = field(default_factory=dict)
    members: frozenset[str] = frozenset()  # the other nodes of the group, as created
    compaction: Snapshot | None = None
    # A state machine's snapshot in the making, by steps (``Snapshots.maybe_snapshot``),
    # and the applied index and log bytes as of its start.
    snapshotting: SnapshotJob | None = None
    snapshotting_at: tuple[int, int] = (0, 0)
    log_bytes: int = 0  # entry data written to the log since the last snapshot (about)
    snap_bytes: int = 0  # the size of the last snapshot taken or received here (0: unknown)
    halted: bool = False
    halt_reason: str = ""  # the error that halted it (``GroupTable.halt``)
    quiet: bool = False  # quiesced: not ticked (see "Quiescence" in raft/host.py)
    on_leader_change: LeaderChange | None = None
    ticks_to_check: int = 0  # ticks until the leader next considers quiescing
    last_check: tuple[int, int] = (-1, -1)  # (last index, commit) at the previous check
    # Reads asked of the core, by context: ((term, leader) when asked, awaitable).
    reads: dict[bytes, tuple[tuple[int, str], asyncio.Future[int]]] = field(default_factory=dict)
    # Confirmed reads waiting for this replica to apply their index: (index, seq, future).
    read_waits: list[tuple[int, int, asyncio.Future[int]]] = field(default_factory=list)
    # (term, vote) of the hard state last written; a newer hard state differing only in its
    # commit index waits in ``unsynced`` (see "Commit index" in raft/host.py).
    durable_vote: tuple[int, str] = (0, NONE)
    unsynced: HardState | None = None
    unsynced_ticks: int = 0  # ticks ``unsynced`` has waited through without a write
    late_tick: bool = False  # the tick starting its election waits ("Elections between ticks")


@dataclass(frozen=True, slots=True)
class QuiesceNotice:
    """A leader's word, queued in the inbox after its batch: it quiesced ``group``."""

    src: str
    group: str
    term: int


@dataclass(slots=True, kw_only=True)
class HostShared:
    """What the host's parts share; owned by the host, on its event loop."""

    node_id: str
    config: HostConfig
    clock: Clock
    storage: LogStorage
    transport: Transport
    rng: random.Random
    reject: Callable[[asyncio.Future[Any], RaftError], None]
    groups: dict[str, GroupState] = field(default_factory=dict)
    # The groups the next round looks at, in the order they became dirty (a dict used as an
    # ordered set: a round collects and sends in that order, the same in every process; a
    # set's order follows the string hash, which changes per process, and a simulator's
    # seed would not replay).
    dirty: dict[str, None] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the driver's wake-up
    seq: Iterator[int] = field(default_factory=itertools.count)  # heap tie-breaks, contexts
    stopping: bool = False  # the host is stopping: no new snapshot step


class WriteJobs:
    """The host's use of its write lane: how many jobs were submitted and not yet seen done
    on the loop (a following round writes on the loop only while there are none)."""

    def __init__(self, lane: WriteLane) -> None:
        self.lane = lane
        self.pending = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run a storage write on the write lane (FIFO: after those queued there)."""
        self.pending += 1
        fut = self.lane.submit(fn, *args)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _: asyncio.Future[Any]) -> None:
        self.pending -= 1


def not_running(node_id: str, group: str, g: GroupState | None) -> RaftError:
    """Why a request for ``group`` cannot be served on ``node_id``: the group is halted
    there (UNAVAILABLE, with the reason: its data needs an operator), or not there."""
    if g is not None and g.halted:
        return UnavailableError(
            f"raft group {group} is halted on {node_id}: {g.halt_reason} "
            "(the node's log has the details)"
        )
    return NotFoundError(f"raft group {group} is not running")


class GroupTable:
    """Starts, finds and halts the groups of ``shared.groups``."""

    def __init__(self, shared: HostShared, requests: Requests) -> None:
        self._s = shared
        self._requests = requests

    def get(self, group: str) -> GroupState:
        """The running group ``group``; NotFoundError when it does not run here."""
        g = self._s.groups.get(group)
        if g is None:
            raise NotFoundError(f"no raft group {group} on {self._s.node_id}", group=group)
        return g

    def add(
        self,
        group: str,
        *,
        voters: Sequence[str],
        state_machine: StateMachine,
        learners: Sequence[str],
        on_leader_change: LeaderChange | None,
        commit_notices: bool | None,
    ) -> GroupState:
        """Start the replica of ``group`` from its stored state (see ``RaftHost.add_group``)."""
        s = self._s
        if group in s.groups:
            raise InvalidArgumentError("group", f"{group} already runs here")
        view = s.storage.log(group)
        snap = view.snapshot()
        if snap.meta.index > 0:
            state_machine.restore(group, snap.data)
        cfg = s.config
        rc = RaftConfig(
            id=s.node_id,
            group=group,
            rng=random.Random(s.rng.getrandbits(64)),
            voters=tuple(voters),
            learners=tuple(learners),
            election_tick=cfg.election_tick,
            heartbeat_tick=cfg.heartbeat_tick,
            pre_vote=cfg.pre_vote,
            check_quorum=cfg.check_quorum,
            commit_notices=cfg.commit_notices if commit_notices is None else commit_notices,
        )
        node = RaftNode(rc, view)
        hs = view.hard_state()
        g = GroupState(
            group,
            node,
            state_machine,
            applied=snap.meta.index,
            members=frozenset((*voters, *learners)) - {s.node_id},
            on_leader_change=on_leader_change,
            durable_vote=(hs.term, hs.vote),
        )
        s.groups[group] = g
        s.dirty[group] = None
        s.wake.set()
        return g

    def halt(self, g: GroupState, exc: BaseException) -> None:
        """Stop ``g`` on this node (its state machine or log failed: it would diverge); its
        waiters fail UNAVAILABLE."""
        # A typed refusal (raft's own, or a state machine's error of the same shape: one
        # with ``retriable``) is said in a line; anything else (a bug, data this version
        # cannot read) with its traceback.
        typed = isinstance(exc, RaftError) or hasattr(type(exc), "retriable")
        trace = None if typed else exc
        log.error("raft group %s halted on %s: %r", g.name, self._s.node_id, exc, exc_info=trace)
        g.halted = True
        g.halt_reason = repr(exc)
        self._requests.fail_group(g, UnavailableError(f"raft group {g.name} halted: {exc!r}"))
