"""``RaftHost``: one asyncio driver for every Raft group of a node.

The driver loop is the only code that touches the cores (``RaftNode``). Each round it:

1. ticks every group if a tick is due, steps the messages received since the last round
   (coalesced heartbeats arrive already expanded per group) and hands queued proposals to
   their groups;
2. collects the Ready of every group that has one;
3. writes all of them in ONE storage transaction with ONE fsync, on the single writer thread
   (the write lane: LMDB write transactions are bound to a thread), or on the loop when the
   round only follows (see "Following rounds write on the loop" below); a Ready whose only
   change is a higher commit index is not worth an fsync of its own (see "Commit index");
4. THEN sends their messages, one batch per peer for all groups (so one round's heartbeats
   to a peer travel as one coalesced heartbeat); a leader's appends leave before the write
   instead (see "The leader writes in parallel" below);
5. applies committed entries through each group's state machine and resolves proposals
   (those already durable before the write are applied while it runs, see "Applying
   during the write" below);
6. ``advance()``s every core, then compacts logs whose state machine made a snapshot.

Compaction. A group's log is compacted to a snapshot of its state machine once
``snapshot_entries`` entries applied since the last one hold at least as many bytes as that
snapshot (a snapshot costs the whole state, so it waits for a log as large: the cost is
then at most about one more write of each byte logged), or once they hold twice the last
snapshot plus ``snapshot_log_bytes_min`` bytes, however few they are (so the log stays
within about three times the state), or when the state machine asks (``compaction_wanted``).
Byte counts start at 0 after a restart. The snapshot is taken on the event loop; a state
machine with ``snapshot_job`` (a stream group) makes it in steps of a few milliseconds
scheduled between the loop's other callbacks (raft/host_snapshots.py), so a large state
slows its node's groups while it is read instead of stalling them (and their heartbeats) for
the whole of it (``SNAPSHOT_JOBS_MAX`` jobs at once); the compaction it makes is written by
the round after it finished, at the index where it started.

While a round's write is in flight, incoming messages and proposals only queue (bounded);
they are handled in the next round, which is where the batching comes from.

Quiescence (as CockroachDB does it; proto/raft.proto describes the wire side). An idle group
costs nothing: once a leader sees every follower holding its whole log, committed, and
nothing changed over an election timeout, it stops ticking the group (no more heartbeats)
and tells the followers, who stop ticking it too. Any message of the group or a proposal
wakes it. Liveness moves to the node level: every tick each host sends every peer at least
an empty batch; a peer silent for ``liveness_ticks`` wakes every quiesced group it leads or
follows, and a woken follower is credited the ticks of that silence (up to one short of an
election timeout, so that the random part of its timeout still separates it from the other
followers), so its election starts as if it had been ticking all along. If that leader is
heard again before then, having sent nothing for the group, the follower goes back to quiet
(raft/host_ticks.py): the leader was stalled, not gone, and still holds the group quiesced.
Safety does not depend on any of this (Raft is safe under any timing); only how soon a dead
leader is replaced does.

Elections between ticks. A randomized election timeout counted in ticks has only
``election_tick`` values to choose from (6 with the node's defaults), so two followers of a
dead leader often time out on the same tick; both then win their pre-votes, both stand,
each votes for itself, and the group waits a whole second timeout (a chaos run saw a 1.7 s
failover). So the tick that starts a follower's election is delayed by a random part of a
tick: the first voter to stand usually reaches the other before its own timeout does, and
gets its vote.

Commit index. Raft's commit index is volatile state (Raft paper, Figure 2): safety needs the
term, the vote and the log entries durable before anything is sent, never the commit index.
So a Ready whose hard state differs from the last one written only by its commit (same term
and vote) and that has no entries or snapshot to write is not written by itself: that would
put an fsync between a commit and its apply (the leader's round that learns a quorum has an
entry, a follower's round that learns the new commit). Its hard state rides along with the
next round that writes anyway, or with a tick's round that writes nothing else, the second
tick after it at the latest (not the first: under load every round writes, and a write of
a commit index alone at each tick kept the loop waiting for an fsync ten times a second,
for nothing a message or an acknowledgement needs), so the stored commit trails the real
one by one to two ticks when a group goes idle. A replica restarted from a stale commit
re-applies less at start and learns the rest from its leader (as etcd's ``MustSync`` does).

Commit notices. A leader tells its followers a new commit index with their next append or
heartbeat, not with an empty append of its own (``HostConfig.commit_notices`` off; see
``RaftConfig.commit_notices``): with one publish at a time, that message and its answer
were half of what the leader sent and received per publish, each costing a stream write.
Only how soon a follower applies changes (a tick later at the latest when nothing follows);
what commits, when, and so every acknowledgement, is untouched. A group whose followers'
state machines answer clients turns notices on for itself (``add_group``): the meta group,
whose every node lists streams and consumers from its own replica, so that a consumer just
created is not missing from a listing on another node for a heartbeat. A stream group's
reads go to its leader (``read_index``); only ``ListStreams`` shows each node's own replica
state, never linearizable, and on a follower now up to a heartbeat older.

The leader writes in parallel (Raft thesis §10.2.1). A leader's append messages may leave
before its own write of those entries completes: replication and the leader's fsync then
overlap, and a commit waits for one fsync round trip less. It stays safe because the leader
counts itself only after its own write: the core counts the leader's match at once, but
the host steps received messages only at the start of a round, and a round starts only after
the previous round's write completed; so no acknowledgement of an entry is counted before
the leader's copy is durable, and a commit always has the leader's copy plus the followers'
(each follower persists before it acknowledges, as ever). Only APPEND messages go early,
and only when the group's term and vote are already durable (a leader elected this round
sends nothing before its term and vote are written: a crash could otherwise let it vote
twice in that term). Votes, vote responses, acknowledgements and everything a follower
sends keep persist-before-send.

Following rounds write on the loop (``HostConfig.inline_follower_writes``). A round that
sent no append early (no group here leads with new entries) has nothing to do while its
write runs: its messages (a follower's acknowledgements, votes) wait for the write anyway.
Such a round writes on the event loop itself, while nothing runs on the writer thread
(``WriteJobs.pending``: storage writes stay one at a time), instead of handing the write to
the writer thread and back: that hand-off cost about 110 us of CPU and two thread wake-ups per
replicated round, on the follower's side of every commit. Measured on the 3-node cluster
bench (docs/cluster-design.md, "Commit latency in the Raft host"): R3 sync publishes
6-13 % faster and 8-15 % less CPU per publish. The price: while such a write waits for the
disk, the node's loop does nothing else (its Raft rounds waited for the write already).

Applying during the write. A round's committed entries that were durable here before the
round's write began (every one below the first entry the round writes; none when the round
installs a snapshot) are applied while that write runs, not after it: under load a round
writes new entries AND commits older ones, and waiting for the disk before applying them
put a whole fsync between every commit and its PubAck. It is safe because what decides an
acknowledgement is unchanged: such an entry is committed (a quorum has it durably, the
leader's copy included, see above) and this replica's own copy was written by an earlier,
completed round. Entries the round itself writes (a follower told to commit what it has just
received, or a group of one, which commits at once) are applied after the write, as before;
so are a membership change and what follows it (a change takes effect at ``advance``, after
the write, and ``propose_conf_change`` resolves only once it is in effect). State machines
then write on the loop thread while the log's transaction is open on the writer thread; the
node keeps them in separate LMDB environments (cluster/node/node.py), so the two never wait for
one environment's single writer lock (a state machine sharing the log's environment would
wait there for the log's fsync, on the loop).
Only a round whose messages all left before its write (a leader's appends), or are a
leader's heartbeats, does this: otherwise (a follower's acknowledgements, votes) those
messages go first, and applying waits until the transport has had them (the host yields
once between sending and applying for that, so a long apply never delays an acknowledgement
its leader's commit waits for).

Lazy proposals (``propose(lazy=True)``). A proposal whose result nobody waits for soon (a
stream's fire-and-forget acks) starts no round of its own: it waits in the queue, in order
with every other proposal, until a round takes proposals anyway (an eager proposal of any
group, or a lazy one's ``HostConfig.lazy_linger_ms`` running out), and goes with it. Rounds
that only step messages or tick leave it queued. Each round with new entries costs every
replica a log write (an fsync) and the leader a send per follower, whatever it carries; a
consumer's acks and the Deliver op of its next pull, a millisecond or two apart, then share
one. Nothing about commitment changes: a lazy proposal is an ordinary entry once taken, and
a leadership transfer takes it with the rest of the queue (``transfer_leadership``).

Membership. A group whose membership never changes is started with ``add_group`` (a static
bootstrap, the same on every replica). One whose membership changes is started with
``create_group`` on its initial members and ``join_group`` on a node added later (see
``create_group`` for why the bootstrap is then empty everywhere); its leader changes it with
``propose_conf_change``, one server at a time, and the host follows each applied change
(the nodes it pings and watches for the group). A removed node's replica keeps running
until its owner calls ``remove_group``.

Linearizable reads (``read_index``, Raft thesis §6.4). A replica's state machine may be stale
even on "the leader": a leader paused or partitioned longer than an election timeout has been
replaced and does not know it yet. A read awaits ``read_index`` first: the leader confirms
with a heartbeat round that it still leads (after committing an entry of its term) and
answers its commit index at the read's arrival; the read is served once this replica has
applied that index. A deposed leader gets no quorum, so the read fails or times out instead
of answering stale data.

Time and writes are seams (raft/clock.py, raft/lanes.py). The host reads time and sets its
timers only through its ``Clock`` (``clock``; by default the running loop's), and runs every
storage write that does not run on the loop through its ``WriteLane`` (``lane``; by default
one writer thread, FIFO). It keeps asyncio for ordering its work: a simulation runs it on an
ordinary event loop with a ``ManualClock``, an ``InlineLane`` and in-memory storage and
transport, and moves time itself.

Parts. ``RaftHost`` is the public face; the work is done by parts it owns, one concern
each: the group table and what the parts share (raft/host_groups.py), waiting proposals
and reads with their deadlines (raft/host_requests.py), ticks, quiescence and peer liveness
(raft/host_ticks.py), snapshots for compaction (raft/host_snapshots.py), and the driver
loop with its round: collect, write, send, apply (raft/host_round.py).

Ownership: the host belongs to the event loop that ran ``start()``; its methods must be called
on that loop. It uses, but does not own, the storage and the transport (close them after
``stop()``); it owns its write lane (closed by ``stop()``).
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from raftstream.raft.clock import Clock, LoopClock
from raftstream.raft.errors import (
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    RaftError,
    UnavailableError,
)
from raftstream.raft.host_api import (
    FollowerInfo,
    GroupStatus,
    HostConfig,
    LeaderChange,
    SnapshotJob,
    StateMachine,
)
from raftstream.raft.host_groups import GroupTable, HostShared, WriteJobs
from raftstream.raft.host_requests import Requests
from raftstream.raft.host_round import Driver
from raftstream.raft.host_snapshots import SNAPSHOT_JOBS_MAX, Snapshots
from raftstream.raft.host_ticks import Ticks
from raftstream.raft.lanes import ThreadLane, WriteLane
from raftstream.raft.storage import GroupWrite, LogStorage
from raftstream.raft.transport import Transport
from raftstream.raft.types import (
    NONE,
    ConfChange,
    ConfState,
    HardState,
    Role,
    Snapshot,
    SnapshotMeta,
)

__all__ = [
    "SNAPSHOT_JOBS_MAX",
    "ErrorMap",
    "FollowerInfo",
    "GroupStatus",
    "HostConfig",
    "LeaderChange",
    "RaftHost",
    "SnapshotJob",
    "StateMachine",
]

ErrorMap = Callable[[RaftError], Exception]
"""How the host's errors reach its callers: an application may turn them into its own
hierarchy (``RaftHost(map_error=...)``); by default they are raft's own."""


def _same_error(exc: RaftError) -> Exception:
    return exc


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _mapped(
    method: Callable[Concatenate[RaftHost, _P], _R],
) -> Callable[Concatenate[RaftHost, _P], _R]:
    """A public method whose raised ``RaftError`` goes through the host's ``map_error``."""

    @functools.wraps(method)
    def wrapper(self: RaftHost, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except RaftError as exc:
            mapped = self._map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    return wrapper


def _mapped_async(
    method: Callable[Concatenate[RaftHost, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[RaftHost, _P], Coroutine[Any, Any, _R]]:
    """``_mapped`` for a coroutine method."""

    @functools.wraps(method)
    async def wrapper(self: RaftHost, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(self, *args, **kwargs)
        except RaftError as exc:
            mapped = self._map_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    return wrapper


class RaftHost:
    """Drives every Raft group of node ``node_id`` (see the module docstring).

    The public face of the host's parts, which it owns and wires together: the group table
    (raft/host_groups.py), the waiting proposals and reads (raft/host_requests.py), ticks,
    quiescence and peer liveness (raft/host_ticks.py), snapshots (raft/host_snapshots.py)
    and the driver that runs the rounds (raft/host_round.py).

    Errors: raised or failing an awaitable, they are ``raftstream.raft.errors``' unless
    ``map_error`` is given: then every one the host hands out (raised by a public method, or
    set on an awaitable it returned) goes through it first, so the application sees its own
    error types (raftstream: ``raftstream.cluster.common.raft_errors.app_error``).
    """

    def __init__(
        self,
        node_id: str,
        *,
        storage: LogStorage,
        transport: Transport,
        config: HostConfig | None = None,
        rng: random.Random | None = None,
        map_error: ErrorMap | None = None,
        clock: Clock | None = None,
        lane: WriteLane | None = None,
    ) -> None:
        self._map_error: ErrorMap = map_error or _same_error
        if transport.node_id != node_id:
            raise self._map_error(InvalidArgumentError("transport", "must belong to this node"))
        self.node_id = node_id
        # Every time read and timer goes through the clock, every storage write that does
        # not run on the loop through the lane: a simulation supplies both (raft/clock.py,
        # raft/lanes.py). The lane is the one writer thread by default: every storage write
        # happens there, one at a time, except a following round's, on the loop while no
        # job is queued there (module docstring).
        self._s = HostShared(
            node_id=node_id,
            config=config or HostConfig(),
            clock=clock or LoopClock(),
            storage=storage,
            transport=transport,
            rng=rng or random.Random(),
            reject=self._reject,
        )
        self._writes = WriteJobs(lane or ThreadLane())
        self._requests = Requests(self._s)
        self._table = GroupTable(self._s, self._requests)
        self._ticks = Ticks(self._s)
        # Read here, at construction, so that a test may lower the module's bound.
        self._snapshots = Snapshots(self._s, halt=self._table.halt, jobs_max=SNAPSHOT_JOBS_MAX)
        self._driver = Driver(
            self._s,
            table=self._table,
            requests=self._requests,
            ticks=self._ticks,
            snapshots=self._snapshots,
            writes=self._writes,
        )
        self._inbox = self._driver.inbox  # what arrived, not yet stepped (tests look)
        self._task: asyncio.Task[None] | None = None

    def _reject(self, fut: asyncio.Future[Any], exc: RaftError) -> None:
        """Fail ``fut`` with ``exc`` as the caller sees it (``map_error``)."""
        fut.set_exception(self._map_error(exc))

    def _failed(self) -> asyncio.Future[Any] | None:
        """An awaitable already failed UNAVAILABLE when the driver stopped on its own."""
        failure = self._driver.failure
        if failure is None:
            return None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reject(fut, UnavailableError("raft host failed", cause=repr(failure)))
        return fut

    # ------------------------------------------------------------------ observers
    @property
    def config(self) -> HostConfig:
        """Timing and limits; may be replaced (a test lowering a bound), on the loop."""
        return self._s.config

    @config.setter
    def config(self, config: HostConfig) -> None:
        self._s.config = config

    @property
    def rounds(self) -> int:
        """Rounds that had work (a Ready), for observers and tests."""
        return self._driver.rounds

    @property
    def ticks(self) -> int:
        """Ticks the driver gave, for observers and tests."""
        return self._ticks.count

    @property
    def reads_pending(self) -> int:
        """Reads queued or waiting, against ``reads_pending_max``."""
        return self._requests.reads_pending

    @property
    def snapshot_jobs(self) -> int:
        """Groups with a snapshot job running (at most ``SNAPSHOT_JOBS_MAX``)."""
        return self._snapshots.jobs

    @property
    def failure(self) -> BaseException | None:
        """Why the driver stopped on its own (a storage write failed), if it did."""
        return self._driver.failure

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind the transport and start the driver on the running loop."""
        self._s.transport.bind(self._driver.on_inbound)
        self._task = asyncio.create_task(self._driver.run(), name=f"raft-host-{self.node_id}")

    async def stop(self) -> None:
        """Stop the driver; waiting proposals fail with UnavailableError (outcome unknown)."""
        if self._task is not None:
            # Not task.cancel(): a round may be writing, and the write must finish or not
            # start; the loop checks the flag between rounds.
            self._s.stopping = True
            self._s.wake.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._requests.cancel_lazy_timer()
        for g in self._s.groups.values():
            self._snapshots.abandon(g)  # before the state machines' stores close
        self._requests.fail_all(UnavailableError("raft host stopped; the outcome is unknown"))
        self._writes.lane.close()

    # ------------------------------------------------------------------ groups
    @_mapped
    def add_group(
        self,
        group: str,
        *,
        voters: Sequence[str],
        state_machine: StateMachine,
        learners: Sequence[str] = (),
        on_leader_change: LeaderChange | None = None,
        commit_notices: bool | None = None,
    ) -> None:
        """Start this node's replica of ``group``. ``voters``/``learners`` bootstrap a new
        group only; a group with durable state resumes from it (its state machine restored
        from the stored snapshot, then fed the committed entries after it).
        ``on_leader_change`` is called after each round that changed the known leader or
        this replica's role (an exception from it is logged, never halts the group).
        ``commit_notices`` overrides ``HostConfig.commit_notices`` for this group: on for a
        group whose followers' state machines answer clients (the meta group's listings),
        so that they apply a commit at once rather than a heartbeat later."""
        g = self._table.add(
            group,
            voters=voters,
            state_machine=state_machine,
            learners=learners,
            on_leader_change=on_leader_change,
            commit_notices=commit_notices,
        )
        self._ticks.track(g.members)

    @_mapped_async
    async def create_group(
        self,
        group: str,
        *,
        voters: Sequence[str],
        state_machine: StateMachine,
        learners: Sequence[str] = (),
        on_leader_change: LeaderChange | None = None,
    ) -> None:
        """Start this node's replica of a group whose membership may change later.

        The core's rule: the bootstrap membership of a group is the same on every replica
        ever created for it, a node added later included. Here it is EMPTY on every replica
        (so ``join_group`` obeys it too), and the initial membership is the group's first
        snapshot instead: at index 1, term 1, ``voters``/``learners``, the fresh state
        machine's state, written durably before the group starts. Every replica's log
        therefore begins after index 1, so a node that joins empty can only be caught up
        by a snapshot, which tells it the membership; it never infers membership from an
        empty base plus later changes (which could make it believe it is alone, and elect
        itself). A group with durable state here resumes from it (arguments ignored).
        """
        view = self._s.storage.log(group)
        unsnapshotted = view.snapshot_meta().index == 0
        if unsnapshotted and view.last_index() > 0:
            # A log from before this scheme (made with a static bootstrap): resume it with
            # the bootstrap it was created with.
            self.add_group(
                group,
                voters=voters,
                learners=learners,
                state_machine=state_machine,
                on_leader_change=on_leader_change,
            )
            return
        if unsnapshotted and view.hard_state().term == 0:
            conf = ConfState(tuple(sorted(voters)), tuple(sorted(learners)))
            snap = Snapshot(SnapshotMeta(1, 1, conf), state_machine.snapshot(group))
            write = GroupWrite(group, HardState(term=1, commit=1), snapshot=snap)
            # Durable before the group runs: its first message may vouch for it.
            await self._writes.submit(self._s.storage.write_batch, [write])
        self.join_group(group, state_machine=state_machine, on_leader_change=on_leader_change)

    @_mapped
    def join_group(
        self,
        group: str,
        *,
        state_machine: StateMachine,
        on_leader_change: LeaderChange | None = None,
    ) -> None:
        """Start a replica of a group made by ``create_group`` elsewhere (this node was, or
        will be, added by a membership change), or resume one with durable state here.
        With nothing stored it knows no members, so it never campaigns; it waits for the
        leader's snapshot (see ``create_group``)."""
        self.add_group(
            group, voters=(), state_machine=state_machine, on_leader_change=on_leader_change
        )

    @_mapped_async
    async def raise_term(self, group: str, term: int) -> None:
        """Durably raise the stored term of ``group`` (not running here) to at least ``term``,
        with no vote: a node that lost its Raft state and rejoins a group does so at a term
        no older than the one in which the group dropped it from its membership, so that it
        never acknowledges a message of a leader older than that (docs/cluster-design.md,
        "Repair after data loss"). A no-op when the stored term is already as high."""
        if group in self._s.groups:
            raise InvalidArgumentError("group", f"{group} runs here; its term is the core's")
        hs = self._s.storage.log(group).hard_state()
        if hs.term >= term:
            return
        write = GroupWrite(group, HardState(term=term, commit=hs.commit))
        # Durable before the group starts: its first answer may rest on this term.
        await self._writes.submit(self._s.storage.write_batch, [write])

    @_mapped_async
    async def remove_group(self, group: str) -> None:
        """Stop the replica of ``group`` and delete its log durably. Its waiting proposals
        fail with NotFoundError (their outcome is unknown); so do its waiting reads."""
        g = self._s.groups.pop(group, None)
        if g is not None:
            self._snapshots.abandon(g)
            self._requests.fail_group(g, NotFoundError(f"group {group} removed; outcome unknown"))
        self._s.dirty.pop(group, None)
        # On the write lane, after any write already queued there (FIFO).
        await self._writes.submit(self._s.storage.remove_group, group)

    def groups(self) -> list[str]:
        return sorted(self._s.groups)

    @_mapped
    def status(self, group: str) -> GroupStatus:
        g = self._table.get(group)
        n = g.node
        snap_index = self._s.storage.log(group).snapshot_meta().index
        return GroupStatus(
            group, n.leader, n.role, n.term, g.applied, snap_index, g.quiet, g.halted
        )

    # ------------------------------------------------------------------ proposals, reads

    @_mapped
    def propose(
        self, group: str, data: bytes, *, timeout_ms: int | None = None, lazy: bool = False
    ) -> Awaitable[Any]:
        """Propose ``data`` to ``group``; the awaitable resolves to the state machine's
        result once the entry is applied here. ``lazy``: the proposal starts no round of
        its own; it goes with the next eager proposal (of any group), at the latest
        ``HostConfig.lazy_linger_ms`` later (module docstring, "Lazy proposals"), always
        in the order proposals were made.

        Raises at once NotFoundError for an unknown group and LimitError when
        ``proposals_pending_max`` are pending. The awaitable fails with NotLeaderError
        (``leader`` hint) / NoLeaderError when this replica cannot take proposals (nothing
        was appended: safe to retry elsewhere). Ambiguous outcomes: DeadlineExceededError
        after ``timeout_ms`` and UnavailableError on stop mean the entry may still commit;
        NotLeaderError after the proposal was accepted means another entry took its index
        (it will never commit).
        Many proposals may be in flight at once; they share rounds, fsyncs and batches.
        """
        failed = self._failed()
        if failed is not None:
            return failed
        self._table.get(group)
        return self._requests.propose(group, data, timeout_ms=timeout_ms, lazy=lazy)

    @_mapped
    def read_index(self, group: str, *, timeout_ms: int | None = None) -> Awaitable[int]:
        """A linearizable read point of ``group`` (ReadIndex, Raft thesis §6.4): the
        awaitable resolves to an index once the group was confirmed to have a leader at the
        time of the call AND this replica has applied that index; reading the state machine
        after that is linearizable. On a follower the request is forwarded to the leader
        (the follower then waits to apply the leader's index).

        Raises at once NotFoundError for an unknown group and LimitError when
        ``reads_pending_max`` are pending. The awaitable fails with NoLeaderError (no
        leader known), NotLeaderError (leadership or term changed before the read was
        confirmed: retry with the new leader), DeadlineExceededError after ``timeout_ms``
        (e.g. a deposed leader that cannot reach a quorum), UnavailableError on stop /
        NotFoundError on group removal. A read has no effect, so every failure is safe to
        retry.
        """
        failed = self._failed()
        if failed is not None:
            return failed
        self._table.get(group)
        return self._requests.read(group, timeout_ms=timeout_ms)

    @_mapped
    def propose_conf_change(
        self, group: str, change: ConfChange, *, timeout_ms: int | None = None
    ) -> Awaitable[None]:
        """Propose ONE membership change to ``group`` (this replica must lead); the
        awaitable resolves once the change's entry is applied here, when the new membership
        is in effect (``voters``/``learners`` show it).

        One server at a time (Raft thesis §4.1): the core refuses a change while another is
        in the log and not applied (ConfChangePendingError, retriable), and before the
        leader has committed an entry of its term. Add a node as ADD_LEARNER first and
        promote it (ADD_VOTER) only once it has caught up (``followers``), so it never
        weakens the quorum while it has no log. Outcomes as ``propose``: a timeout or a stop
        is ambiguous (the change may still apply), a refusal is not.
        """
        failed = self._failed()
        if failed is not None:
            return failed
        self._table.get(group)
        return self._requests.propose_conf_change(group, change, timeout_ms=timeout_ms)

    # ------------------------------------------------------------------ peers and leadership

    def untrack_peer(self, peer: str) -> bool:
        """Ping ``peer`` no more and stop watching it (a node taken out of the cluster for
        good), unless a group here still counts it as a member: then nothing changes and
        the answer is False. A batch it sends later tracks it again."""
        return self._ticks.untrack(peer)

    @_mapped
    def leader(self, group: str) -> str | None:
        """The leader this replica knows for ``group``, if any."""
        lead = self._table.get(group).node.leader
        return None if lead == NONE else lead

    @_mapped
    def role(self, group: str) -> tuple[Role, int]:
        """(role, term) of this replica of ``group``: ``status``'s cheap part (no storage
        read), for callers that look every tick."""
        node = self._table.get(group).node
        return node.role, node.term

    @_mapped
    def peer_lags(self, group: str) -> dict[str, int]:
        """On the group's leader: entries each other replica's log is known to lack (the
        leader's last index less the peer's match index); empty on a follower."""
        st = self._table.get(group).node.status()
        return {
            p: max(0, st.last_index - pr.match)
            for p, pr in st.progress.items()
            if p != self.node_id
        }

    @_mapped
    def transfer_leadership(self, group: str, to: str) -> None:
        """Ask this node's leader replica of ``group`` to hand leadership to voter ``to``
        (it catches ``to`` up, then sends TIMEOUT_NOW; abandoned after an election timeout).
        Raises NotLeaderError here on a follower, InvalidArgumentError for a non-voter."""
        g = self._table.get(group)
        if g.node.role != Role.LEADER:
            raise NotLeaderError(f"not the leader of {group}", leader=self.leader(group))
        if to not in g.node.status().conf.voters:
            raise InvalidArgumentError("to", f"{to!r} is not a voter of {group}")
        # Proposals queued for the next round (lazy ones too) go into the log first: once
        # the transfer starts the core refuses them, and the callers had already acted on
        # them (a consumer's deliveries had left, its acks were decided). In the log, ``to``
        # is caught up with them before it is told to campaign, and they commit in the new
        # leader's term.
        self._requests.take_proposals()
        g.node.transfer_leadership(to)
        g.quiet = False  # the transfer needs ticks (its timeout) and messages
        self._s.dirty[group] = None
        self._s.wake.set()

    @_mapped
    def transferring(self, group: str) -> str | None:
        """The voter this replica's leadership of ``group`` is being handed to, while a
        ``transfer_leadership`` is in progress here (the core refuses every proposal until
        leadership moves or, after an election timeout, the transfer is abandoned); None
        otherwise. Read-only."""
        return self._table.get(group).node.lead_transferee or None

    @_mapped
    def members(self, group: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(``voters``, ``learners``) with one look at the replica's state."""
        conf = self._table.get(group).node.conf_state()
        return tuple(conf.voters), tuple(conf.learners)

    @_mapped
    def voters(self, group: str) -> tuple[str, ...]:
        """The group's voters as this replica knows them (the newest membership it has
        applied, or received in a snapshot)."""
        return tuple(self._table.get(group).node.status().conf.voters)

    @_mapped
    def learners(self, group: str) -> tuple[str, ...]:
        """The group's learners (non-voting members), as ``voters`` knows them."""
        return tuple(self._table.get(group).node.status().conf.learners)

    @_mapped
    def followers(self, group: str) -> tuple[int, list[FollowerInfo]]:
        """(commit index, each follower's progress) when this replica leads ``group``; the
        list is empty on a follower (only a leader tracks progress)."""
        st = self._table.get(group).node.status()
        out = [
            FollowerInfo(p, pr.match, pr.recent_active)
            for p, pr in sorted(st.progress.items())
            if p != st.id
        ]
        return st.commit, out
