"""``RaftNode``: the driver-facing API of one replica (in the manner of etcd's RawNode).

The driver (raft/host, or the simulator) owns one RaftNode per group and calls it from one
thread or event loop. The cycle is::

    node.tick() / node.step(msg) / node.propose(data) ...   # any number, any order
    if node.has_ready():
        rd = node.ready()
        storage: persist rd.snapshot, rd.entries, rd.hard_state   (fsync)
        transport: send rd.messages
        state machine: install rd.snapshot, apply rd.committed_entries; serve rd.read_states
        node.advance(rd)
    # at any time, from the state machine's snapshot at its applied index:
    snap = node.make_snapshot(applied, data); storage: keep snap, drop entries <= snap index

``committed_entries`` may include entries of the same Ready's ``entries``: they are safe to
apply because they are applied only after that Ready is persisted.

``tick``/``step``/``propose`` may also be called between ``ready()`` and ``advance()`` (their
effects go into the next Ready), but ``ready()`` may not be called again before
``advance()``.

Heartbeats: a leader emits one HEARTBEAT per follower every ``heartbeat_tick`` ticks, and
nothing else while idle. They carry no entries, only ``term``, ``commit`` and ``context``
(a ReadIndex round), so the host can coalesce all HEARTBEAT (and HEARTBEAT_RESP) messages
of a round to one peer into one RPC of (group, term, commit, context) tuples and step each
back into its group on arrival. A follower's idle tick allocates nothing.

Proposals made between two Readies leave in one round of appends (as few messages as
``append_bytes_max`` allows): broadcasting is deferred to ``has_ready``/``ready``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raftstream.raft.core import replication as repl
from raftstream.raft.core.config import RaftConfig
from raftstream.raft.core.errors import ConfChangePendingError
from raftstream.raft.core.log import LogView
from raftstream.raft.core.progress import ProgressState
from raftstream.raft.core.raft import Raft
from raftstream.raft.errors import (
    InvalidArgumentError,
    NoLeaderError,
    NotLeaderError,
    invariant,
)
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
    SoftState,
)

__all__ = ["PeerStatus", "RaftNode", "Status"]


@dataclass(frozen=True, slots=True)
class PeerStatus:
    match: int
    next: int
    state: ProgressState
    recent_active: bool


@dataclass(frozen=True, slots=True)
class Status:
    """A snapshot of the replica's state, for observers and tests."""

    id: str
    group: str
    term: int
    vote: str
    commit: int
    applied: int
    last_index: int
    lead: str
    role: Role
    conf: ConfState
    lead_transferee: str
    progress: dict[str, PeerStatus]  # empty unless leader


class RaftNode:
    """One replica of one group; see the module docstring for the driving cycle.

    Not thread-safe. Every method is pure computation: nothing here blocks or does IO.
    """

    __slots__ = ("_prev_hs", "_prev_ss", "_r", "_readying")

    def __init__(self, config: RaftConfig, storage: LogView) -> None:
        """``storage`` is read for the initial state and for entries not in memory; the
        driver writes to it (from each Ready) and the node sees the writes through it."""
        self._r = Raft(config, storage)
        self._prev_hs = storage.hard_state()
        self._prev_ss = SoftState(self._r.lead, self._r.role)
        self._readying = False

    # ------------------------------------------------------------------ inputs
    def tick(self) -> None:
        """Advance logical time by one tick (heartbeats, election timeouts)."""
        self._r.tick()

    def election_due(self) -> bool:
        """Whether the next ``tick()`` starts an election (a driver may delay that tick by
        part of a tick, so that voters whose timeouts fell on the same tick do not split
        the vote)."""
        r = self._r
        return (
            r.role != Role.LEADER
            and r.election_elapsed + 1 >= r.randomized_timeout
            and r.promotable()
        )

    def step(self, message: Message) -> None:
        """Handle a message from a peer of this group."""
        self._r.step(message)

    def campaign(self) -> None:
        """Start an election now (pre-vote first if enabled), as on an election timeout."""
        self._r.hup(transfer=False)

    def propose(self, data: bytes) -> int:
        """Append ``data`` as a new entry; returns its index (its term is ``status().term``).

        Raises NotLeaderError(leader=hint) on a follower that knows the leader,
        NoLeaderError when no leader is known, TransferInProgressError during a
        leadership transfer, LimitError when too many bytes are uncommitted. A returned
        index is no promise: the entry commits only if the entry applied at that index has
        this term; after a leader change the outcome is unknown until then. Empty
        ``data`` is refused (InvalidArgumentError): empty entries are the leaders' no-ops.
        """
        r = self._require_leader()
        _check_data(data)
        r.check_proposal(len(data))
        return r.append_entries([Entry(0, 0, EntryType.NORMAL, data)])

    def propose_many(self, datas: Sequence[bytes]) -> int:
        """Append several commands at once (cheaper than one ``propose`` each); returns the
        index of the last, the first being ``last - len(datas) + 1``. All or nothing: the
        same errors as ``propose``, checked against their total size."""
        r = self._require_leader()
        if not datas:
            return r.log.last_index()
        for d in datas:
            _check_data(d)
        r.check_proposal(sum(len(d) for d in datas))
        return r.append_entries([Entry(0, 0, EntryType.NORMAL, d) for d in datas])

    def propose_conf_change(self, change: ConfChange) -> int:
        """Propose one membership change (add/remove voter, add learner, promote a learner
        by adding it as voter). It takes effect when its entry is applied (``advance``).
        Raises ConfChangePendingError while a previous change is not yet applied."""
        r = self._require_leader()
        r.validate_conf_change(change)
        if r.pending_conf_index > r.log.applied:
            raise ConfChangePendingError(
                f"conf change at {r.pending_conf_index} not yet applied (applied {r.log.applied})"
            )
        if not r.committed_in_term():
            # The fix to single-server changes (Ongaro, raft-dev 2015): a change appended
            # before the leader commits in its term could overlap one from a deposed leader.
            raise ConfChangePendingError("the leader has not committed an entry of its term yet")
        data = change.encode()
        r.check_proposal(len(data))
        index = r.append_entries([Entry(0, 0, EntryType.CONF_CHANGE, data)])
        r.pending_conf_index = index
        return index

    def transfer_leadership(self, to: str) -> None:
        """Leader: hand leadership to voter ``to`` once it is caught up (TIMEOUT_NOW).
        Proposals are refused meanwhile; the transfer is abandoned after an election
        timeout. A no-op if ``to`` is already the transfer target or this node."""
        r = self._require_leader()
        if to == r.id or to == r.lead_transferee:
            return
        if to not in r.tracker.voters:
            raise InvalidArgumentError("to", "must be a voter of the group")
        r.lead_transferee = to
        r.election_elapsed = 0
        pr = r.tracker.progress[to]
        if pr.match == r.log.last_index():
            r.send(r.msg(MessageType.TIMEOUT_NOW, to))
        else:
            repl.send_append(r, to)

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read point. A later Ready carries ReadState(index,
        context): the read is safe once the state machine has applied ``index``. On a
        follower the request goes to the leader; it may be lost, so callers time out.
        ``context`` must be unique among reads in flight in the group (e.g. node id and a
        counter). Raises NoLeaderError when no leader is known."""
        r = self._r
        if r.role == Role.LEADER:
            r.leader_read_index(r.id, context)
        elif r.lead == NONE:
            raise NoLeaderError("no leader known", group=r.group)
        else:
            r.send(r.msg(MessageType.READ_INDEX, r.lead, context=context))

    def report_unreachable(self, to: str) -> None:
        """Transport: sending to ``to`` failed; stop pipelining to it until it answers."""
        r = self._r
        pr = r.tracker.progress.get(to)
        if r.role == Role.LEADER and pr is not None and pr.state == ProgressState.REPLICATE:
            pr.become_probe()

    def report_snapshot(self, to: str, *, ok: bool) -> None:
        """Transport: the snapshot stream to ``to`` finished (``ok``) or failed."""
        r = self._r
        if r.role == Role.LEADER:
            r.step(Message(MessageType.SNAPSHOT_RESP, r.group, to, r.id, r.term, reject=not ok))

    def make_snapshot(self, index: int, data: bytes) -> Snapshot:
        """The state machine's snapshot ``data`` taken at applied ``index``: returns the
        Snapshot (with the term and membership at ``index``) for the driver to store,
        after which it may drop log entries up to ``index`` (LogView's first index moves
        past it). ``index`` must be applied, and not before the last applied membership
        change (the membership recorded is the one as of the applied index)."""
        r = self._r
        if not r.applied_conf_index <= index <= r.log.applied:
            raise InvalidArgumentError(
                "index", f"must be in [{r.applied_conf_index}, applied {r.log.applied}]"
            )
        # Applied entries are stable (persisted before they were applied), so storage has
        # the term even while a snapshot from the leader waits in the unstable log.
        meta = SnapshotMeta(index, r.log.storage.term(index), r.applied_conf)
        return Snapshot(meta, data)

    # ------------------------------------------------------------------ outputs
    def has_ready(self) -> bool:
        r = self._r
        if r.bcast_pending and r.role == Role.LEADER:
            repl.bcast_append(r)
        return bool(
            r.msgs
            or r.log.unstable.entries
            or r.log.unstable.snapshot is not None
            or r.read_states
            or r.log.has_next_committed()
            or r.term != self._prev_hs.term
            or r.vote != self._prev_hs.vote
            or r.log.committed != self._prev_hs.commit
            or r.lead != self._prev_ss.leader
            or r.role != self._prev_ss.role
        )

    def ready(self) -> Ready:
        """Everything to persist, send and apply since the last Ready.

        Safety: ``messages`` must be sent only after ``snapshot``, ``entries`` and
        ``hard_state`` are durable. Votes (HardState.vote) and acknowledgements of entries
        are among them; sending first could let a crash forget a vote (two leaders in a
        term) or an acknowledged entry (a commit lost). This is persist-before-send.
        One relaxation is allowed (Raft thesis §10.2.1): a leader's APPEND messages may leave
        while its own write of the same entries is in flight, provided its term and vote are
        already durable and the driver steps no received message before that write completes
        (the leader counted itself at once; see raft/host.py).
        """
        invariant(not self._readying, "ready() called twice without advance()")
        r = self._r
        if r.bcast_pending and r.role == Role.LEADER:
            repl.bcast_append(r)
        log = r.log
        hs = self._hard_state()
        ss = SoftState(r.lead, r.role)
        committed = log.next_committed(r.cfg.apply_bytes_max)
        if committed:
            log.applying = committed[-1].index
        rd = Ready(
            hard_state=hs if hs != self._prev_hs else None,
            entries=tuple(log.unstable.entries),
            snapshot=log.unstable.snapshot,
            messages=tuple(r.msgs),
            committed_entries=tuple(committed),
            read_states=tuple(r.read_states),
            soft_state=ss if ss != self._prev_ss else None,
        )
        r.msgs = []
        r.read_states = []
        self._prev_hs = hs
        self._prev_ss = ss
        self._readying = True
        return rd

    def advance(self, rd: Ready) -> None:
        """The driver persisted, sent and applied ``rd``. Membership changes among its
        committed entries take effect now."""
        invariant(self._readying, "advance() without ready()")
        self._readying = False
        r = self._r
        log = r.log
        if rd.snapshot is not None:
            log.stable_snap_to(rd.snapshot.meta.index)
            log.applied_to(rd.snapshot.meta.index)
            r.applied_snapshot(rd.snapshot.meta)
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        for e in rd.committed_entries:
            if e.type == EntryType.CONF_CHANGE:
                r.apply_conf_change(e.index, ConfChange.decode(e.data))
        if rd.committed_entries:
            log.applied_to(rd.committed_entries[-1].index)

    # ------------------------------------------------------------------ queries
    def _hard_state(self) -> HardState:
        r = self._r
        return HardState(r.term, r.vote, r.log.committed)

    def _require_leader(self) -> Raft:
        r = self._r
        if r.role == Role.LEADER:
            return r
        if r.lead != NONE:
            raise NotLeaderError(leader=r.lead)
        raise NoLeaderError("no leader known", group=r.group)

    @property
    def id(self) -> str:
        return self._r.id

    @property
    def group(self) -> str:
        return self._r.group

    @property
    def role(self) -> Role:
        return self._r.role

    @property
    def leader(self) -> str:
        return self._r.lead

    @property
    def lead_transferee(self) -> str:
        """The voter a transfer of this leader's leadership goes to ("" when none)."""
        return self._r.lead_transferee

    @property
    def term(self) -> int:
        return self._r.term

    def log_term(self, index: int) -> int:
        """Term of our log entry at ``index`` (stable or not); 0 if absent or compacted."""
        return self._r.log.zero_term(index)

    def first_index(self) -> int:
        """First index still in the log (earlier ones live only in the snapshot)."""
        return self._r.log.first_index()

    def conf_state(self) -> ConfState:
        """The membership in effect here: ``status().conf`` without the rest."""
        return self._r.tracker.conf_state()

    def status(self) -> Status:
        r = self._r
        progress: dict[str, PeerStatus] = {}
        if r.role == Role.LEADER:
            progress = {
                p: PeerStatus(pr.match, pr.next, pr.state, pr.recent_active)
                for p, pr in r.tracker.progress.items()
            }
        return Status(
            id=r.id,
            group=r.group,
            term=r.term,
            vote=r.vote,
            commit=r.log.committed,
            applied=r.log.applied,
            last_index=r.log.last_index(),
            lead=r.lead,
            role=r.role,
            conf=r.tracker.conf_state(),
            lead_transferee=r.lead_transferee,
            progress=progress,
        )


def _check_data(data: bytes) -> None:
    if not data:
        raise InvalidArgumentError("data", "must not be empty (empty entries are no-ops)")
