"""``RaftHost``: one asyncio driver for every Raft group of a node.

The driver loop is the only code that touches the cores (``RaftNode``). Each round it:

1. ticks every group if a tick is due, steps the messages received since the last round
   (coalesced heartbeats arrive already expanded per group) and hands queued proposals to
   their groups;
2. collects the Ready of every group that has one;
3. writes all of them in ONE storage transaction with ONE fsync, on the single writer thread
   (LMDB write transactions are bound to a thread), or on the loop when the round only
   follows (see "Following rounds write on the loop" below); a Ready whose only change is a
   higher commit index is not worth an fsync of its own (see "Commit index" below);
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
scheduled between the loop's other callbacks (``_snapshot_step``), so a large state slows
its node's groups while it is read instead of stalling them (and their heartbeats) for the
whole of it (``SNAPSHOT_JOBS_MAX`` jobs at once); the compaction it makes is written by the
round after it finished, at the index where it started.

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
(``_requiesce``): the leader was stalled, not gone, and still holds the group quiesced.
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
(``_writer_jobs``: storage writes stay one at a time), instead of handing the write to the
writer thread and back: that hand-off cost about 110 us of CPU and two thread wake-ups per
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
node keeps them in separate LMDB environments (cluster/node.py), so the two never wait for
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

Ownership: the host belongs to the event loop that ran ``start()``; its methods must be called
on that loop. It uses, but does not own, the storage and the transport (close them after
``stop()``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import heapq
import itertools
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftstream.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LimitError,
    NotFoundError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.raft.core import RaftConfig, RaftNode
from raftstream.raft.host_api import (
    FollowerInfo,
    GroupStatus,
    HostConfig,
    LeaderChange,
    SnapshotJob,
    StateMachine,
)
from raftstream.raft.storage import GroupWrite, LogStorage
from raftstream.raft.transport import Inbound, Transport
from raftstream.raft.types import (
    NONE,
    ConfChange,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
)

__all__ = [
    "FollowerInfo",
    "GroupStatus",
    "HostConfig",
    "LeaderChange",
    "RaftHost",
    "SnapshotJob",
    "StateMachine",
]

log = logging.getLogger(__name__)

# Snapshot jobs running at once on a host, at most. A stream group's job holds an LMDB read
# transaction until it is done, and the node's store environment has 126 reader slots: a
# burst of compactions across hundreds of groups must not take them all (a job that cannot
# start halts its group). A group over the bound tries again after its next apply.
SNAPSHOT_JOBS_MAX = 8


@dataclass(slots=True)
class _Group:
    name: str
    node: RaftNode
    sm: StateMachine
    applied: int
    # Proposals in the log, by index: (term at proposal, awaitable); resolved at apply.
    waiting: dict[int, tuple[int, asyncio.Future[Any]]] = field(default_factory=dict)
    members: frozenset[str] = frozenset()  # the other nodes of the group, as created
    compaction: Snapshot | None = None
    # A state machine's snapshot in the making, by steps (``_maybe_snapshot``), and the
    # applied index and log bytes as of its start.
    snapshotting: SnapshotJob | None = None
    snapshotting_at: tuple[int, int] = (0, 0)
    log_bytes: int = 0  # entry data written to the log since the last snapshot (about)
    snap_bytes: int = 0  # the size of the last snapshot taken or received here (0: unknown)
    halted: bool = False
    halt_reason: str = ""  # the error that halted it (``_halt``)
    quiet: bool = False  # quiesced: not ticked (see "Quiescence" in the module docstring)
    on_leader_change: LeaderChange | None = None
    ticks_to_check: int = 0  # ticks until the leader next considers quiescing
    last_check: tuple[int, int] = (-1, -1)  # (last index, commit) at the previous check
    # Reads asked of the core, by context: ((term, leader) when asked, awaitable).
    reads: dict[bytes, tuple[tuple[int, str], asyncio.Future[int]]] = field(default_factory=dict)
    # Confirmed reads waiting for this replica to apply their index: (index, seq, future).
    read_waits: list[tuple[int, int, asyncio.Future[int]]] = field(default_factory=list)
    # (term, vote) of the hard state last written; a newer hard state differing only in its
    # commit index waits in ``unsynced`` (see "Commit index" in the module docstring).
    durable_vote: tuple[int, str] = (0, NONE)
    unsynced: HardState | None = None
    unsynced_ticks: int = 0  # ticks ``unsynced`` has waited through without a write
    late_tick: bool = False  # the tick starting its election waits (see "Elections between ticks")


@dataclass(frozen=True, slots=True)
class _QuiesceNotice:
    src: str
    group: str
    term: int


@dataclass(slots=True)
class _Proposal:
    group: str
    data: bytes
    future: asyncio.Future[Any]
    change: ConfChange | None = None  # a membership change instead of a command


@dataclass(frozen=True, slots=True)
class _Read:
    group: str
    context: bytes  # unique on this node: the core matches its ReadState by it
    future: asyncio.Future[int]


class RaftHost:
    """Drives every Raft group of node ``node_id`` (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        *,
        storage: LogStorage,
        transport: Transport,
        config: HostConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if transport.node_id != node_id:
            raise InvalidArgumentError("transport", "must belong to this node")
        self.node_id = node_id
        self.config = config or HostConfig()
        self._storage = storage
        self._transport = transport
        self._rng = rng or random.Random()
        self._groups: dict[str, _Group] = {}
        self._inbox: collections.deque[Message | _QuiesceNotice] = collections.deque()
        self._proposals: collections.deque[_Proposal] = collections.deque()
        # Whether a queued proposal asks for a round now, and when the oldest lazy one
        # queued since the last round does ("Lazy proposals").
        self._eager = False
        self._lazy_due: float | None = None
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._pending = 0  # proposals queued or waiting, against proposals_pending_max
        self._deadlines: list[tuple[float, int, asyncio.Future[Any]]] = []
        self._reads: collections.deque[_Read] = collections.deque()
        self._reads_pending = 0  # reads queued or waiting, against reads_pending_max
        self._seq = itertools.count()
        self._dirty: set[str] = set()
        # Followers woken by their leader's silence, not by anything of the group (_requiesce).
        self._woken_by_silence: set[str] = set()
        self._sync_commits = False  # this round writes every unsynced commit (once a tick)
        self._peers: set[str] = set()  # every other node of any group here
        self._heard: dict[str, float] = {}  # peer -> loop time of its last batch
        self._quiesce_out: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        self._sent_since_tick: set[str] = set()
        # Election ticks now due (see "Elections between ticks").
        self._late_ticks: list[_Group] = []
        self._snapshot_jobs = 0  # groups with a snapshot job running (``SNAPSHOT_JOBS_MAX``)
        self._wake = asyncio.Event()
        # The one writer thread: every storage write happens there, one at a time, except a
        # following round's, on the loop while no job is queued there (module docstring).
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raft-writer")
        self._writer_jobs = 0  # submitted to the writer thread and not seen done on the loop
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._failure: BaseException | None = None
        self.rounds = 0  # rounds that had work (a Ready), for observers and tests
        self.ticks = 0

    def _on_writer(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run a storage write on the writer thread (FIFO: after those queued there)."""
        self._writer_jobs += 1
        fut = asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        fut.add_done_callback(self._writer_job_done)
        return fut

    def _writer_job_done(self, _: asyncio.Future[Any]) -> None:
        self._writer_jobs -= 1

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Bind the transport and start the driver on the running loop."""
        self._transport.bind(self._on_inbound)
        self._task = asyncio.create_task(self._run(), name=f"raft-host-{self.node_id}")

    async def stop(self) -> None:
        """Stop the driver; waiting proposals fail with UnavailableError (outcome unknown)."""
        if self._task is not None:
            # Not task.cancel(): a round may be writing, and the write must finish or not
            # start; the loop checks the flag between rounds.
            self._stopping = True
            self._wake.set()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        for g in self._groups.values():
            self._abandon_snapshot(g)  # before the state machines' stores close
        self._fail_all(UnavailableError("raft host stopped; the outcome is unknown"))
        self._writer.shutdown(wait=True)

    @property
    def failure(self) -> BaseException | None:
        """Why the driver stopped on its own (a storage write failed), if it did."""
        return self._failure

    # ------------------------------------------------------------------ groups
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
        if group in self._groups:
            raise InvalidArgumentError("group", f"{group} already runs here")
        view = self._storage.log(group)
        snap = view.snapshot()
        if snap.meta.index > 0:
            state_machine.restore(group, snap.data)
        cfg = self.config
        rc = RaftConfig(
            id=self.node_id,
            group=group,
            rng=random.Random(self._rng.getrandbits(64)),
            voters=tuple(voters),
            learners=tuple(learners),
            election_tick=cfg.election_tick,
            heartbeat_tick=cfg.heartbeat_tick,
            pre_vote=cfg.pre_vote,
            check_quorum=cfg.check_quorum,
            commit_notices=cfg.commit_notices if commit_notices is None else commit_notices,
        )
        node = RaftNode(rc, view)
        members = frozenset((*voters, *learners)) - {self.node_id}
        hs = view.hard_state()
        self._groups[group] = _Group(
            group,
            node,
            state_machine,
            applied=snap.meta.index,
            members=members,
            on_leader_change=on_leader_change,
            durable_vote=(hs.term, hs.vote),
        )
        self._track_peers(members)
        self._dirty.add(group)
        self._wake.set()

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
        view = self._storage.log(group)
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
            await self._on_writer(self._storage.write_batch, [write])
        self.join_group(group, state_machine=state_machine, on_leader_change=on_leader_change)

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

    async def raise_term(self, group: str, term: int) -> None:
        """Durably raise the stored term of ``group`` (not running here) to at least ``term``,
        with no vote: a node that lost its Raft state and rejoins a group does so at a term
        no older than the one in which the group dropped it from its membership, so that it
        never acknowledges a message of a leader older than that (docs/cluster-design.md,
        "Repair after data loss"). A no-op when the stored term is already as high."""
        if group in self._groups:
            raise InvalidArgumentError("group", f"{group} runs here; its term is the core's")
        hs = self._storage.log(group).hard_state()
        if hs.term >= term:
            return
        write = GroupWrite(group, HardState(term=term, commit=hs.commit))
        # Durable before the group starts: its first answer may rest on this term.
        await self._on_writer(self._storage.write_batch, [write])

    async def remove_group(self, group: str) -> None:
        """Stop the replica of ``group`` and delete its log durably. Its waiting proposals
        fail with NotFoundError (their outcome is unknown); so do its waiting reads."""
        g = self._groups.pop(group, None)
        if g is not None:
            self._abandon_snapshot(g)
            self._fail_group(g, NotFoundError(f"group {group} removed; outcome unknown"))
        self._dirty.discard(group)
        # On the writer thread, after any write already queued there (FIFO executor).
        await self._on_writer(self._storage.remove_group, group)

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def status(self, group: str) -> GroupStatus:
        g = self._group(group)
        n = g.node
        snap_index = self._storage.log(group).snapshot_meta().index
        return GroupStatus(
            group, n.leader, n.role, n.term, g.applied, snap_index, g.quiet, g.halted
        )

    def _group(self, group: str) -> _Group:
        g = self._groups.get(group)
        if g is None:
            raise NotFoundError(f"no raft group {group} on {self.node_id}", group=group)
        return g

    # ------------------------------------------------------------------ proposals
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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._failure is not None:
            fut.set_exception(UnavailableError("raft host failed", cause=repr(self._failure)))
            return fut
        self._group(group)
        if self._pending >= self.config.proposals_pending_max:
            raise LimitError("too many raft proposals pending", limit="proposals_pending_max")
        self._pending += 1
        fut.add_done_callback(self._proposal_done)
        timeout = self.config.proposal_timeout_ms if timeout_ms is None else timeout_ms
        heapq.heappush(self._deadlines, (loop.time() + timeout / 1000, next(self._seq), fut))
        self._proposals.append(_Proposal(group, data, fut))
        if lazy and self.config.lazy_linger_ms:
            if self._lazy_due is None:
                self._lazy_due = loop.time() + self.config.lazy_linger_ms / 1000
                self._lazy_timer = loop.call_at(self._lazy_due, self._wake.set)
        else:
            self._eager = True
            self._wake.set()
        return fut

    def _proposal_done(self, _: asyncio.Future[Any]) -> None:
        self._pending -= 1

    # ------------------------------------------------------------------ reads
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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        if self._failure is not None:
            fut.set_exception(UnavailableError("raft host failed", cause=repr(self._failure)))
            return fut
        self._group(group)
        if self._reads_pending >= self.config.reads_pending_max:
            raise LimitError("too many raft reads pending", limit="reads_pending_max")
        self._reads_pending += 1
        timeout = self.config.proposal_timeout_ms if timeout_ms is None else timeout_ms
        heapq.heappush(self._deadlines, (loop.time() + timeout / 1000, next(self._seq), fut))
        context = f"{self.node_id}/{next(self._seq)}".encode()
        self._reads.append(_Read(group, context, fut))
        self._wake.set()
        return fut

    def _take_reads(self) -> None:
        """Hand queued reads to their groups' cores (only the driver touches cores)."""
        while self._reads:
            r = self._reads.popleft()
            g = self._groups.get(r.group)
            if r.future.done() or g is None or g.halted:
                self._reads_pending -= 1
                if not r.future.done():
                    r.future.set_exception(self._not_running(r.group, g))
                continue
            try:
                g.node.read_index(r.context)
            except RaftStreamError as exc:  # NoLeaderError, LimitError (core's pending reads)
                self._reads_pending -= 1
                r.future.set_exception(exc)
                continue
            g.reads[r.context] = ((g.node.term, g.node.leader), r.future)
            # Forget the read at once when it times out, so a lost one never lingers.
            r.future.add_done_callback(functools.partial(self._read_done, g, r.context))
            g.quiet = False  # the confirmation needs a heartbeat round (and ticks)
            self._dirty.add(r.group)

    def _read_done(self, g: _Group, context: bytes, _: asyncio.Future[int]) -> None:
        if g.reads.pop(context, None) is not None:
            self._reads_pending -= 1

    def _follow_reads(self, g: _Group, rd: Ready) -> None:
        """After ``rd`` was applied: confirmed reads wait for their index to be applied;
        reads asked under another term or leader fail (the core dropped them when it stepped
        down or changed term, e.g. check-quorum deposing it within its term, so their
        ReadState will never come); reads now applied resolve."""
        for rs in rd.read_states:
            waiter = g.reads.pop(rs.context, None)
            if waiter is None:
                continue  # timed out meanwhile, or not ours
            heapq.heappush(g.read_waits, (rs.index, next(self._seq), waiter[1]))
        now = (g.node.term, g.node.leader)
        stale = [ctx for ctx, (asked, _) in g.reads.items() if asked != now]
        if stale:
            leader = g.node.leader or None
            for ctx in stale:
                _, fut = g.reads.pop(ctx)
                self._reads_pending -= 1
                fut.set_exception(NotLeaderError("raft read not confirmed", leader=leader))
        self._release_reads(g)

    def _release_reads(self, g: _Group) -> None:
        while g.read_waits and g.read_waits[0][0] <= g.applied:
            index, _, fut = heapq.heappop(g.read_waits)
            self._reads_pending -= 1
            if not fut.done():
                fut.set_result(index)

    def _fail_reads(self, g: _Group, exc: RaftStreamError) -> None:
        """Fail every read of ``g`` (halted or removed): none will be confirmed or applied."""
        reads = [fut for _, fut in g.reads.values()]
        reads += [fut for _, _, fut in g.read_waits]
        self._reads_pending -= len(g.reads) + len(g.read_waits)
        g.reads.clear()
        g.read_waits.clear()
        for fut in reads:
            if not fut.done():
                fut.set_exception(exc)

    def _expire_proposals(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, fut = heapq.heappop(self._deadlines)
            if not fut.done():
                fut.set_exception(
                    DeadlineExceededError("raft request timed out; a proposal may commit")
                )

    def _take_proposals(self) -> None:
        self._eager = False
        self._lazy_due = None
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        while self._proposals:
            p = self._proposals.popleft()
            if p.future.done():
                continue
            g = self._groups.get(p.group)
            if g is None or g.halted:
                p.future.set_exception(self._not_running(p.group, g))
                continue
            try:
                if p.change is not None:
                    index = g.node.propose_conf_change(p.change)
                else:
                    index = g.node.propose(p.data)
            except RaftStreamError as exc:
                p.future.set_exception(exc)
                continue
            g.waiting[index] = (g.node.term, p.future)
            g.quiet = False
            self._dirty.add(p.group)

    # ------------------------------------------------------------------ receiving
    def _track_peers(self, peers: frozenset[str]) -> None:
        """Ping ``peers`` every tick from now on, and watch for their silence."""
        now = asyncio.get_running_loop().time()
        for peer in peers - self._peers:
            self._peers.add(peer)
            self._heard[peer] = now  # a grace period before it can be presumed down

    def untrack_peer(self, peer: str) -> bool:
        """Ping ``peer`` no more and stop watching it (a node taken out of the cluster for
        good), unless a group here still counts it as a member: then nothing changes and
        the answer is False. A batch it sends later tracks it again."""
        if any(
            peer in g.members or peer in g.node.status().conf.voters
            or peer in g.node.status().conf.learners
            for g in self._groups.values()
        ):  # fmt: skip
            return False
        self._peers.discard(peer)
        self._heard.pop(peer, None)
        self._quiesce_out.pop(peer, None)
        self._sent_since_tick.discard(peer)
        return True

    def _on_inbound(self, inbound: Inbound) -> None:
        """Transport handler (on the loop): queue for the next round, never step here."""
        if inbound.src != self.node_id:  # not a report the transport made up locally
            if inbound.src not in self._peers:
                self._track_peers(frozenset((inbound.src,)))
            self._heard[inbound.src] = asyncio.get_running_loop().time()
        room = self.config.inbox_msgs_max - len(self._inbox)
        if room <= 0:
            return  # dropped: Raft resends what matters
        self._inbox.extend(inbound.messages[:room])
        # After the batch's messages: the leader quiesced after sending them.
        self._inbox.extend(_QuiesceNotice(inbound.src, g, t) for g, t in inbound.quiesce)
        if inbound.messages or inbound.quiesce:
            self._wake.set()

    def _step_inbox(self) -> None:
        while self._inbox:
            m = self._inbox.popleft()
            if isinstance(m, _QuiesceNotice):
                self._follow_quiesce(m)
                continue
            g = self._groups.get(m.group)
            if g is None or g.halted:
                continue
            if m.type != MessageType.HEARTBEAT_RESP:
                g.quiet = False  # the group is active again: tick it
                self._woken_by_silence.discard(m.group)
            try:
                g.node.step(m)
            except RaftStreamError as exc:
                self._halt(g, exc)
                continue
            self._dirty.add(m.group)

    # ------------------------------------------------------------------ the driver
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick_s = self.config.tick_ms / 1000
        next_tick = loop.time() + tick_s
        try:
            while not self._stopping:
                if not (
                    self._inbox
                    or self._eager
                    or self._lazy_is_due(loop.time())
                    or self._reads
                    or self._dirty
                    or self._late_ticks
                ):
                    self._wake.clear()
                    wake_at = min(next_tick, self._lazy_due or next_tick)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, wake_at - loop.time())):
                            await self._wake.wait()
                    if self._stopping:
                        break
                now = loop.time()
                ticked = now >= next_tick
                if ticked:
                    next_tick = max(next_tick + tick_s, now)
                    self._sync_commits = True
                    self._tick_all(now)
                    self._expire_proposals(now)
                self._tick_late()
                self._step_inbox()
                if self._eager or self._lazy_is_due(now):
                    self._take_proposals()
                self._take_reads()
                await self._round()
                if ticked:  # after the tick's round: peers it sent nothing get a ping
                    self._ping_peers()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("raft host %s stopped: %r", self.node_id, exc)
            self._failure = exc
            self._fail_all(UnavailableError("raft host failed; the outcome is unknown"))
            raise

    def _lazy_is_due(self, now: float) -> bool:
        return self._lazy_due is not None and now >= self._lazy_due

    def _tick_all(self, now: float) -> None:
        self.ticks += 1
        self._wake_groups_of_silent_peers(now)
        check_every = self.config.election_tick
        loop = asyncio.get_running_loop()
        tick_s = self.config.tick_ms / 1000
        for name, g in self._groups.items():
            if g.halted or g.quiet or g.late_tick:
                continue
            if g.node.election_due():
                g.late_tick = True
                loop.call_later(self._rng.uniform(0, tick_s), self._late_tick_due, g)
                continue
            g.node.tick()
            self._dirty.add(name)
            if self.config.quiesce and g.node.role == Role.LEADER:
                g.ticks_to_check -= 1
                if g.ticks_to_check <= 0:
                    g.ticks_to_check = check_every
                    self._maybe_quiesce(g)

    def _late_tick_due(self, g: _Group) -> None:
        """A delayed election tick is due: the driver gives it at its next turn."""
        self._late_ticks.append(g)
        self._wake.set()

    def _tick_late(self) -> None:
        late, self._late_ticks = self._late_ticks, []
        for g in late:
            g.late_tick = False
            if self._groups.get(g.name) is g and not (g.halted or g.quiet):
                g.node.tick()
                self._dirty.add(g.name)

    # ------------------------------------------------------------------ quiescence
    def _silent_peers(self, now: float) -> set[str]:
        limit = self.config.liveness_ticks * self.config.tick_ms / 1000
        return {p for p in self._peers if now - self._heard.get(p, now) > limit}

    def _maybe_quiesce(self, g: _Group) -> None:
        """Leader: quiesce ``g`` if nothing changed since the last check (so the followers
        have heard the commit index), every follower holds the whole log, and all is
        applied. Never while a member is presumed down: check-quorum needs the ticks."""
        st = g.node.status()
        state = (st.last_index, st.commit)
        stable, g.last_check = g.last_check == state, state
        if not stable or g.waiting or st.commit != st.last_index or st.applied != st.commit:
            return
        if any(p.match != st.last_index for n, p in st.progress.items() if n != self.node_id):
            return
        # The current membership (it may have changed since add_group): these are the
        # nodes whose silence must wake the group, and they must get our pings.
        g.members = frozenset(st.progress) - {self.node_id}
        self._track_peers(g.members)
        if g.members & self._silent_peers(asyncio.get_running_loop().time()):
            return
        g.quiet = True
        for peer in g.members:
            self._quiesce_out[peer].append((g.name, st.term))

    def _follow_quiesce(self, q: _QuiesceNotice) -> None:
        """Follower: stop ticking a group its current leader quiesced in its current term."""
        g = self._groups.get(q.group)
        n = g.node if g is not None else None
        if g is None or n is None or g.halted or n.role != Role.FOLLOWER:
            return
        if n.leader == q.src and n.term == q.term:
            g.quiet = True

    def _wake_groups_of_silent_peers(self, now: float) -> None:
        silent = self._silent_peers(now)
        if self._woken_by_silence:
            self._requiesce(silent)
        if not silent:
            return
        tick_s = self.config.tick_ms / 1000
        for g in self._groups.values():
            if not g.quiet:
                continue
            lead = g.node.leader
            is_leader = g.node.role == Role.LEADER
            if (is_leader and g.members & silent) or (not is_leader and lead in silent):
                g.quiet = False
                self._dirty.add(g.name)
            if lead in silent and not is_leader:
                self._woken_by_silence.add(g.name)
                # Credit the silence: the election starts as if we had kept ticking. At
                # most one tick short of the base timeout: every follower of the group is
                # credited the same silence, and the random rest of each one's timeout is
                # what keeps them from standing at once.
                missed = int((now - self._heard.get(lead, now)) / tick_s)
                for _ in range(min(missed, self.config.election_tick - 1)):
                    g.node.tick()

    def _requiesce(self, silent: set[str]) -> None:
        """A follower woken by its leader's silence goes back to quiet once that leader is
        heard again while nothing came for the group: the leader kept the group quiesced, so
        it was stalled (a long apply or snapshot, a loaded machine), not gone, and an election
        would only move an idle group's leadership (a soak under load saw the meta group's
        term reach 15 in 31 minutes). Anything for the group (``_step_inbox``), or a campaign
        of its own, ends this."""
        for name in list(self._woken_by_silence):
            g = self._groups.get(name)
            if g is None or g.halted or g.node.role != Role.FOLLOWER:
                self._woken_by_silence.discard(name)
                continue
            lead = g.node.leader
            if lead and lead not in silent:
                g.quiet = True
                self._woken_by_silence.discard(name)

    def _ping_peers(self) -> None:
        """Liveness: every peer gets at least one batch per tick (an empty one if need be),
        so a peer silent for ``liveness_ticks`` (> 1) ticks is down or cut off."""
        for peer in self._peers - self._sent_since_tick:
            self._transport.send(peer, [], self._quiesce_out.pop(peer, []))
        self._sent_since_tick.clear()

    def _collect(self) -> list[tuple[_Group, Ready]]:
        readies: list[tuple[_Group, Ready]] = []
        for name in self._dirty:
            g = self._groups.get(name)
            if g is None or g.halted:
                continue
            try:
                if g.node.has_ready():
                    readies.append((g, g.node.ready()))
            except RaftStreamError as exc:  # e.g. DataLossError reading the log: stop it
                self._halt(g, exc)
        self._dirty.clear()
        return readies

    async def _round(self) -> None:
        readies = self._collect()
        writes = self._writes(readies)
        early: set[int] = set()
        applied_early: dict[str, int] = {}
        if writes:
            # A leader's appends leave now, in parallel with its own write (module docstring:
            # their acknowledgements are stepped only in a later round, after this write).
            early = self._send_appends_early(readies)
            # fsync-before-send for everything else: one transaction for every group.
            written: asyncio.Future[Any] | None = None
            if not early and self.config.inline_follower_writes and not self._writer_jobs:
                # Nothing to overlap with the write (module docstring, "Following rounds
                # write on the loop").
                self._storage.write_batch(writes)
            else:
                written = self._on_writer(self._storage.write_batch, writes)
            if written is not None and all(
                id(m) in early or m.type == MessageType.HEARTBEAT
                for _, rd in readies
                for m in rd.messages
            ):
                # While the disk works: apply what was durable before this write (module
                # docstring, "Applying during the write"); never ahead of messages that
                # wait for the write, such as a follower's acknowledgements.
                applied_early = self._apply_durable(readies)
            if written is not None:
                await written
            self._written(writes)
        if not readies:
            return
        self.rounds += 1
        # Persist-before-send (Raft §5, and the core's Ready contract): the votes and
        # appended entries these messages vouch for are durable now, so a crash cannot make
        # this node forget a vote it granted or an entry it acknowledged.
        if self._send([rd for _, rd in readies], skip=early) and any(
            len(rd.committed_entries) > applied_early.get(g.name, 0) for g, rd in readies
        ):
            # Let the transport write them before applying: a follower's acknowledgement
            # must not wait behind a long apply (its leader's commit waits for it).
            await asyncio.sleep(0)
        for g, rd in readies:
            self._apply(g, rd, skip=applied_early.get(g.name, 0))
            self._follow_reads(g, rd)
            if not g.halted:
                g.node.advance(rd)
                if rd.snapshot is not None or _has_conf_change(rd.committed_entries):
                    self._follow_membership(g)
                if rd.committed_entries:
                    self._maybe_snapshot(g)
            self._dirty.add(g.name)  # advance may have produced more (next round)
            if rd.soft_state is not None and g.on_leader_change is not None:
                self._notify_leader_change(g, rd.soft_state.leader, rd.soft_state.role)

    def _follow_membership(self, g: _Group) -> None:
        """After a membership change or a snapshot took effect (``advance``): the group's
        other members are the ones to ping and to watch for silence (quiescence)."""
        conf = g.node.status().conf
        g.members = frozenset((*conf.voters, *conf.learners)) - {self.node_id}
        self._track_peers(g.members)

    def _notify_leader_change(self, g: _Group, leader: str, role: Role) -> None:
        if g.on_leader_change is None:
            return
        try:
            g.on_leader_change(g.name, leader or None, role)
        except Exception:
            log.exception("raft group %s: leader-change callback failed", g.name)

    def _writes(self, readies: list[tuple[_Group, Ready]]) -> list[GroupWrite]:
        writes: list[GroupWrite] = []
        in_round = set()
        for g, rd in readies:
            in_round.add(g.name)
            compaction, g.compaction = g.compaction, None
            if rd.snapshot is not None:
                compaction = None  # the leader's snapshot supersedes our own
            hs = rd.hard_state
            if hs is not None and (hs.term, hs.vote) == g.durable_vote:
                # Only the commit index moved (volatile, module docstring): no fsync for it
                # alone; it goes with this group's or any other write, or the next tick's.
                g.unsynced, hs = hs, None
            if rd.snapshot is not None:
                g.log_bytes, g.snap_bytes = 0, len(rd.snapshot.data)
            for e in rd.entries:
                g.log_bytes += len(e.data)
            if hs or rd.entries or rd.snapshot or compaction:
                writes.append(
                    GroupWrite(g.name, hs or g.unsynced, rd.entries, rd.snapshot, compaction)
                )
        for g in self._groups.values():
            if g.compaction is not None and g.name not in in_round:
                writes.append(GroupWrite(g.name, g.unsynced, compaction=g.compaction))
                in_round.add(g.name)
                g.compaction = None
        if writes or self._sync_commits:
            others, self._sync_commits = bool(writes), False
            written = {w.group for w in writes}
            for g in self._groups.values():
                if g.unsynced is None or g.name in written:
                    continue
                if others or g.unsynced_ticks >= 1:
                    writes.append(GroupWrite(g.name, g.unsynced))
                else:  # a tick's round with nothing else to write (module docstring)
                    g.unsynced_ticks += 1
        return writes

    def _written(self, writes: list[GroupWrite]) -> None:
        """After ``writes`` are durable: what each group's stored hard state now is."""
        for w in writes:
            g = self._groups.get(w.group)
            if g is None or w.hard_state is None:
                continue
            g.durable_vote = (w.hard_state.term, w.hard_state.vote)
            if g.unsynced is not None and g.unsynced.commit <= w.hard_state.commit:
                g.unsynced = None
                g.unsynced_ticks = 0

    def _send_appends_early(self, readies: list[tuple[_Group, Ready]]) -> set[int]:
        """Send the leaders' APPEND messages of this round before its write (module
        docstring, "The leader writes in parallel"); returns the ids of those sent."""
        by_peer: dict[str, list[Message]] = collections.defaultdict(list)
        sent: set[int] = set()
        for g, rd in readies:
            hs = rd.hard_state
            if rd.snapshot is not None or (hs is not None and (hs.term, hs.vote) != g.durable_vote):
                continue  # a new term or vote is not durable yet: everything waits for it
            for m in rd.messages:
                if m.type == MessageType.APPEND and m.term == g.durable_vote[0]:
                    by_peer[m.dst].append(m)
                    sent.add(id(m))
        for peer, messages in by_peer.items():
            self._transport.send(peer, messages)
            self._sent_since_tick.add(peer)
        return sent

    def _send(self, readies: list[Ready], *, skip: set[int] | frozenset[int] = frozenset()) -> bool:
        """Send the messages of ``readies`` not in ``skip``, one batch per peer; True if
        there were any."""
        by_peer: dict[str, list[Message]] = collections.defaultdict(list)
        for rd in readies:
            for m in rd.messages:
                if id(m) not in skip:
                    by_peer[m.dst].append(m)
        for peer, messages in by_peer.items():
            self._transport.send(peer, messages, self._quiesce_out.pop(peer, []))
            self._sent_since_tick.add(peer)
        return bool(by_peer)

    # ------------------------------------------------------------------ applying
    def _apply_durable(self, readies: list[tuple[_Group, Ready]]) -> dict[str, int]:
        """Apply, before this round's write completes, each Ready's committed entries that
        were durable here before it (below the first entry it writes; none when it brings
        a snapshot), and before its first membership change: a change takes effect only at
        ``advance``, after the write, and ``propose_conf_change`` promises the new membership
        in effect when it resolves. Returns how many were applied per group, for ``_apply``
        to skip."""
        done: dict[str, int] = {}
        for g, rd in readies:
            if g.halted or rd.snapshot is not None or not rd.committed_entries:
                continue
            ents = rd.committed_entries
            count = len(ents)
            if rd.entries:  # committed entries are contiguous and ascending
                first_new = rd.entries[0].index
                count = first_new - ents[0].index if ents[-1].index >= first_new else count
            count = next((i for i in range(count) if ents[i].type == EntryType.CONF_CHANGE), count)
            if count <= 0:
                continue
            try:
                self._apply_entries(g, ents[:count])
            except Exception as exc:  # as in _apply: a failed state machine has diverged
                self._halt(g, exc)
            done[g.name] = count
        return done

    def _apply(self, g: _Group, rd: Ready, *, skip: int = 0) -> None:
        """Apply ``rd``'s snapshot and committed entries, but its first ``skip`` committed
        entries (``_apply_durable`` did those)."""
        if g.halted:
            return
        try:
            if rd.snapshot is not None:
                self._abandon_snapshot(g)  # the state it was made from is gone
                g.sm.restore(g.name, rd.snapshot.data)
                g.applied = rd.snapshot.meta.index
                self._fail_waiting_through(g, g.applied)
            if len(rd.committed_entries) > skip:
                self._apply_entries(g, rd.committed_entries[skip:])
        except Exception as exc:  # a state machine that failed has diverged: stop the group
            self._halt(g, exc)

    def _apply_entries(self, g: _Group, entries: Sequence[Entry]) -> None:
        commands = [e for e in entries if e.type == EntryType.NORMAL and e.data]
        results = g.sm.apply(g.name, commands) if commands else []
        by_index = dict(zip((e.index for e in commands), results, strict=True))
        for e in entries:
            waiter = g.waiting.pop(e.index, None)
            if waiter is None:
                continue
            term, fut = waiter
            if fut.done():
                continue
            if term == e.term:
                fut.set_result(by_index.get(e.index))
            else:  # another leader's entry took this index: ours will never commit
                leader = g.node.leader or None
                fut.set_exception(NotLeaderError("raft proposal superseded", leader=leader))
        g.applied = entries[-1].index

    def _fail_waiting_through(self, g: _Group, index: int) -> None:
        for i in [i for i in g.waiting if i <= index]:
            _, fut = g.waiting.pop(i)
            if not fut.done():
                fut.set_exception(UnavailableError("raft log replaced by a snapshot; unknown"))

    def _maybe_snapshot(self, g: _Group) -> None:
        if g.compaction is not None or g.snapshotting is not None:
            return
        snap_index = self._storage.log(g.name).snapshot_meta().index
        if g.applied == snap_index:
            return
        cfg = self.config
        by_entries = g.applied - snap_index >= cfg.snapshot_entries and g.log_bytes >= g.snap_bytes
        by_bytes = g.log_bytes >= 2 * g.snap_bytes + cfg.snapshot_log_bytes_min
        if not (by_entries or by_bytes):
            wanted = getattr(g.sm, "compaction_wanted", None)  # optional (StateMachine)
            if wanted is None or not wanted(g.name):
                return
        start_job = getattr(g.sm, "snapshot_job", None)  # optional (StateMachine)
        if start_job is not None:
            if self._snapshot_jobs >= SNAPSHOT_JOBS_MAX:
                return  # tried again after the group's next apply
            try:
                g.snapshotting = start_job(g.name)
            except Exception as exc:  # the state could not be read at all
                self._halt(g, exc)
                return
            g.snapshotting_at = (g.applied, g.log_bytes)
            self._snapshot_jobs += 1
            asyncio.get_running_loop().call_soon(self._snapshot_step, g, g.snapshotting)
            return
        try:
            data = g.sm.snapshot(g.name)
            g.compaction = g.node.make_snapshot(g.applied, data)
        except InvalidArgumentError:
            return  # a membership change is not applied yet: try again later
        g.log_bytes, g.snap_bytes = 0, len(data)

    def _snapshot_step(self, g: _Group, job: SnapshotJob) -> None:
        """One step of ``g``'s snapshot job, on the loop between other callbacks; the next
        is scheduled after it, and the finished snapshot is handed to the next round's
        write as the group's compaction. A job whose group is gone, halted or restored
        from a snapshot meanwhile (``_abandon_snapshot``) has been closed: it stops."""
        if g.snapshotting is not job:
            return
        if self._stopping or g.halted or self._groups.get(g.name) is not g:
            self._abandon_snapshot(g)
            return
        try:
            data = job.step()
        except Exception as exc:  # the state could not be read (a corrupt store record)
            self._abandon_snapshot(g)
            self._halt(g, exc)
            return
        if data is None:
            asyncio.get_running_loop().call_soon(self._snapshot_step, g, job)
            return
        self._abandon_snapshot(g)
        index, logged = g.snapshotting_at
        if index <= self._storage.log(g.name).snapshot_meta().index:
            return  # a newer snapshot came meanwhile
        try:
            g.compaction = g.node.make_snapshot(index, data)
        except InvalidArgumentError:
            return  # a membership change applied meanwhile: the next trigger starts again
        g.log_bytes, g.snap_bytes = max(0, g.log_bytes - logged), len(data)
        self._dirty.add(g.name)
        self._wake.set()

    def _abandon_snapshot(self, g: _Group) -> None:
        """Close ``g``'s snapshot job, if any (done, or no longer wanted)."""
        job, g.snapshotting = g.snapshotting, None
        if job is not None:
            self._snapshot_jobs -= 1
            job.close()

    # ------------------------------------------------------------------ failures
    def _not_running(self, group: str, g: _Group | None) -> RaftStreamError:
        """Why a request for ``group`` cannot be served here: the group is halted on this
        node (UNAVAILABLE, with the reason: its data needs an operator), or not here."""
        if g is not None and g.halted:
            return UnavailableError(
                f"raft group {group} is halted on {self.node_id}: {g.halt_reason} "
                "(the node's log has the details)"
            )
        return NotFoundError(f"raft group {group} is not running")

    def _halt(self, g: _Group, exc: BaseException) -> None:
        # A state machine's own refusal is said in a line; anything else (a bug, data this
        # version cannot read) with its traceback.
        trace = exc if not isinstance(exc, RaftStreamError) else None
        log.error("raft group %s halted on %s: %r", g.name, self.node_id, exc, exc_info=trace)
        g.halted = True
        g.halt_reason = repr(exc)
        self._fail_group(g, UnavailableError(f"raft group {g.name} halted: {exc!r}"))

    def _fail_group(self, g: _Group, exc: RaftStreamError) -> None:
        for _, fut in g.waiting.values():
            if not fut.done():
                fut.set_exception(exc)
        g.waiting.clear()
        self._fail_reads(g, exc)

    def _fail_all(self, exc: RaftStreamError) -> None:
        for g in self._groups.values():
            self._fail_group(g, exc)
        while self._proposals:
            p = self._proposals.popleft()
            if not p.future.done():
                p.future.set_exception(exc)
        while self._reads:
            r = self._reads.popleft()
            self._reads_pending -= 1
            if not r.future.done():
                r.future.set_exception(exc)

    def leader(self, group: str) -> str | None:
        """The leader this replica knows for ``group``, if any."""
        lead = self._group(group).node.leader
        return None if lead == NONE else lead

    def role(self, group: str) -> tuple[Role, int]:
        """(role, term) of this replica of ``group``: ``status``'s cheap part (no storage
        read), for callers that look every tick."""
        node = self._group(group).node
        return node.role, node.term

    def peer_lags(self, group: str) -> dict[str, int]:
        """On the group's leader: entries each other replica's log is known to lack (the
        leader's last index less the peer's match index); empty on a follower."""
        st = self._group(group).node.status()
        return {
            p: max(0, st.last_index - pr.match)
            for p, pr in st.progress.items()
            if p != self.node_id
        }

    # ------------------------------------------------------------------ leadership
    def transfer_leadership(self, group: str, to: str) -> None:
        """Ask this node's leader replica of ``group`` to hand leadership to voter ``to``
        (it catches ``to`` up, then sends TIMEOUT_NOW; abandoned after an election timeout).
        Raises NotLeaderError here on a follower, InvalidArgumentError for a non-voter."""
        g = self._group(group)
        if g.node.role != Role.LEADER:
            raise NotLeaderError(f"not the leader of {group}", leader=self.leader(group))
        if to not in g.node.status().conf.voters:
            raise InvalidArgumentError("to", f"{to!r} is not a voter of {group}")
        # Proposals queued for the next round (lazy ones too) go into the log first: once
        # the transfer starts the core refuses them, and the callers had already acted on
        # them (a consumer's deliveries had left, its acks were decided). In the log, ``to``
        # is caught up with them before it is told to campaign, and they commit in the new
        # leader's term.
        self._take_proposals()
        g.node.transfer_leadership(to)
        g.quiet = False  # the transfer needs ticks (its timeout) and messages
        self._dirty.add(group)
        self._wake.set()

    def transferring(self, group: str) -> str | None:
        """The voter this replica's leadership of ``group`` is being handed to, while a
        ``transfer_leadership`` is in progress here (the core refuses every proposal until
        leadership moves or, after an election timeout, the transfer is abandoned); None
        otherwise. Read-only."""
        return self._group(group).node.lead_transferee or None

    def members(self, group: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(``voters``, ``learners``) with one look at the replica's state."""
        conf = self._group(group).node.conf_state()
        return tuple(conf.voters), tuple(conf.learners)

    def voters(self, group: str) -> tuple[str, ...]:
        """The group's voters as this replica knows them (the newest membership it has
        applied, or received in a snapshot)."""
        return tuple(self._group(group).node.status().conf.voters)

    def learners(self, group: str) -> tuple[str, ...]:
        """The group's learners (non-voting members), as ``voters`` knows them."""
        return tuple(self._group(group).node.status().conf.learners)

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
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._failure is not None:
            fut.set_exception(UnavailableError("raft host failed", cause=repr(self._failure)))
            return fut
        self._group(group)
        self._pending += 1
        fut.add_done_callback(self._proposal_done)
        timeout = self.config.proposal_timeout_ms if timeout_ms is None else timeout_ms
        heapq.heappush(self._deadlines, (loop.time() + timeout / 1000, next(self._seq), fut))
        self._proposals.append(_Proposal(group, b"", fut, change))
        self._eager = True
        self._wake.set()
        return fut

    def followers(self, group: str) -> tuple[int, list[FollowerInfo]]:
        """(commit index, each follower's progress) when this replica leads ``group``; the
        list is empty on a follower (only a leader tracks progress)."""
        st = self._group(group).node.status()
        out = [
            FollowerInfo(p, pr.match, pr.recent_active)
            for p, pr in sorted(st.progress.items())
            if p != st.id
        ]
        return st.commit, out


def _has_conf_change(entries: Sequence[Entry]) -> bool:
    return any(e.type == EntryType.CONF_CHANGE for e in entries)
