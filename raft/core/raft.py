"""The Raft state machine of one replica: roles, elections, and the step dispatch.

Pure: it reads its log through a ``LogView``, keeps new entries in memory, and queues
outgoing messages in ``msgs``; ``RaftNode`` (rawnode.py) turns that into a ``Ready``. Section
numbers refer to the Raft paper (Ongaro & Ousterhout, 2014); "thesis" to Ongaro's thesis.
Log replication on the leader and follower lives in replication.py.
"""

from __future__ import annotations

from collections import deque

from raftstream.raft.core import replication as repl
from raftstream.raft.core.config import RaftConfig
from raftstream.raft.core.errors import TransferInProgressError
from raftstream.raft.core.log import LogView, RaftLog
from raftstream.raft.core.progress import Tracker, VoteResult
from raftstream.raft.core.readonly import PendingRead, ReadOnly
from raftstream.raft.errors import InvalidArgumentError, LimitError, invariant
from raftstream.raft.types import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    ReadState,
    Role,
    SnapshotMeta,
)

__all__ = ["TRANSFER_CONTEXT", "Raft"]

MT = MessageType
# Marks a VOTE sent because of TIMEOUT_NOW: voters skip the leader lease for it (thesis §3.10).
TRANSFER_CONTEXT = b"\x00transfer"
_LEADER_MSGS = frozenset({MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT})
_VOTE_REQ_RESP = {MT.VOTE: MT.VOTE_RESP, MT.PRE_VOTE: MT.PRE_VOTE_RESP}


class Raft:
    """One replica of one group. Not thread-safe: one driver owns it."""

    __slots__ = (
        "applied_conf",
        "applied_conf_index",
        "bcast_pending",
        "cfg",
        "conf_index",
        "election_elapsed",
        "group",
        "heartbeat_elapsed",
        "id",
        "lead",
        "lead_transferee",
        "log",
        "msgs",
        "pending_conf_index",
        "pending_reads",
        "randomized_timeout",
        "read_only",
        "read_states",
        "role",
        "term",
        "tracker",
        "uncommitted",
        "uncommitted_bytes",
        "vote",
    )

    def __init__(self, cfg: RaftConfig, storage: LogView) -> None:
        self.cfg = cfg
        self.id = cfg.id
        self.group = cfg.group
        self.log = RaftLog(storage, cfg.applied)
        hs = storage.hard_state()
        self.term = hs.term
        self.vote = hs.vote
        self.tracker = Tracker(cfg.inflight_msgs_max, cfg.inflight_bytes_max)
        self.msgs: list[Message] = []
        self.read_states: list[ReadState] = []
        self.read_only = ReadOnly()
        # Reads that arrived before this leader committed an entry of its term.
        self.pending_reads: list[tuple[str, bytes]] = []
        # (index, payload bytes) of this leader's uncommitted proposals.
        self.uncommitted: deque[tuple[int, int]] = deque()
        self.uncommitted_bytes = 0
        self.bcast_pending = False
        self.lead = NONE
        self.lead_transferee = NONE
        self.pending_conf_index = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = cfg.election_tick
        self.role = Role.FOLLOWER
        self._restore_conf(storage, hs.commit)
        self.become_follower(self.term, NONE)

    def _restore_conf(self, storage: LogView, commit: int) -> None:
        """Membership after a restart: the snapshot's (or the bootstrap one), then every
        configuration change up to the applied index, in log order."""
        snap = storage.snapshot()
        conf = snap.meta.conf
        if not conf.voters and not conf.learners:
            conf = ConfState(self.cfg.voters, self.cfg.learners)
        self.tracker.set_conf(conf, self.log.last_index() + 1)
        # Two views of membership: the tracker's is the newest we know (a snapshot received
        # from the leader replaces it at once, ``conf_index``); ``applied_conf`` is as of
        # the applied index, which is what a local snapshot must record.
        self.conf_index = snap.meta.index
        self.applied_conf = conf
        self.applied_conf_index = snap.meta.index
        invariant(commit <= self.log.last_index(), f"hard state commit {commit} beyond log")
        self.log.commit_to(commit)
        self.log.applied = min(self.log.applied, self.log.committed)
        self.log.applying = self.log.applied
        lo = snap.meta.index + 1
        for e in self.log.slice(lo, self.log.applied + 1, 1 << 62):
            if e.type == EntryType.CONF_CHANGE:
                self.apply_conf_change(e.index, ConfChange.decode(e.data))

    # ------------------------------------------------------------------ messages
    def send(self, m: Message) -> None:
        """Queue ``m`` for the next Ready. Nothing queued here leaves the node before the
        driver has persisted that Ready's entries and hard state, except a leader's appends
        under the rule in RaftNode.ready."""
        self.msgs.append(m)

    def msg(
        self,
        type_: MessageType,
        to: str,
        *,
        index: int = 0,
        log_term: int = 0,
        reject: bool = False,
        reject_hint: int = 0,
        context: bytes = b"",
    ) -> Message:
        """A message of our current term (no entries, no snapshot)."""
        return Message(
            type_, self.group, self.id, to, self.term,
            log_term=log_term, index=index, reject=reject, reject_hint=reject_hint,
            context=context,
        )  # fmt: skip

    # ------------------------------------------------------------------ roles
    def promotable(self) -> bool:
        """Only voters campaign: learners and removed nodes never do."""
        return self.id in self.tracker.voters

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self.cfg.election_tick + self.cfg.rng.randrange(
            0, self.cfg.election_tick
        )
        self.lead_transferee = NONE
        self.tracker.votes.clear()
        self.read_only.clear()
        self.pending_reads.clear()
        self.uncommitted.clear()
        self.uncommitted_bytes = 0
        self.bcast_pending = False

    def become_follower(self, term: int, lead: str) -> None:
        self._reset(term)
        self.lead = lead
        self.role = Role.FOLLOWER

    def become_pre_candidate(self) -> None:
        # Pre-vote (thesis §9.6): the term is NOT increased, so a node that cannot win
        # (e.g. back from a partition) never forces the group into a new term.
        invariant(self.role != Role.LEADER, "leader cannot become pre-candidate")
        self.tracker.votes.clear()
        self.lead = NONE
        self.role = Role.PRE_CANDIDATE

    def become_candidate(self) -> None:
        invariant(self.role != Role.LEADER, "leader cannot become candidate")
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        invariant(self.role == Role.CANDIDATE, "only a candidate becomes leader")
        self._reset(self.term)
        self.lead = self.id
        self.role = Role.LEADER
        last = self.log.last_index()
        self.tracker.reset_progress(last + 1, self.id, last)
        # No conf change until everything before our term is applied: we cannot know
        # whether the old log holds an unapplied one.
        self.pending_conf_index = last
        # The no-op of the new term (§5.4.2, §8): committing it commits every earlier entry,
        # and ReadIndex waits for it.
        self.append_entries([Entry(0, 0, EntryType.NORMAL, b"")])

    # ------------------------------------------------------------------ ticks
    def tick(self) -> None:
        if self.role == Role.LEADER:
            self._tick_heartbeat()
            return
        self.election_elapsed += 1
        # A node that cannot campaign (a learner, or a voter that does not know it was
        # promoted yet) keeps counting, so its leader lease expires and it grants votes.
        if self.election_elapsed >= self.randomized_timeout and self.promotable():
            self.election_elapsed = 0
            self.hup(transfer=False)

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_tick:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._check_quorum():
                return
            repl.expire_snapshots(self)
            if self.lead_transferee != NONE:
                self.lead_transferee = NONE  # transfer did not finish in an election timeout
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            repl.bcast_heartbeat(self, self.read_only.last_context())

    def _check_quorum(self) -> bool:
        """Check-quorum (thesis §6.2): a leader that has not heard from a quorum within an
        election timeout steps down, so a partitioned leader stops serving reads."""
        tracker = self.tracker
        if not tracker.quorum_active(self.id):
            self.become_follower(self.term, NONE)
            return False
        tracker.reset_recent_active(self.id)
        return True

    # ------------------------------------------------------------------ elections
    def hup(self, *, transfer: bool) -> None:
        if self.role == Role.LEADER or not self.promotable():
            return
        if self._has_unapplied_conf_change():
            return  # our membership view may be stale until it is applied
        if self.cfg.pre_vote and not transfer:
            self.campaign(MT.PRE_VOTE, transfer=False)
        else:
            self.campaign(MT.VOTE, transfer=transfer)

    def _has_unapplied_conf_change(self) -> bool:
        log = self.log
        if log.committed <= log.applied:
            return False
        # Entries under a snapshot still waiting to be installed are covered by its
        # membership, already in the tracker.
        lo = max(log.applied + 1, log.first_index())
        ents = log.slice(lo, log.committed + 1, 1 << 62)
        return any(e.type == EntryType.CONF_CHANGE for e in ents)

    def campaign(self, kind: MessageType, *, transfer: bool) -> None:
        if kind == MT.PRE_VOTE:
            self.become_pre_candidate()
            vote_term = self.term + 1
        else:
            self.become_candidate()
            vote_term = self.term
        self.tracker.record_vote(self.id, True)
        if self.tracker.tally() == VoteResult.WON:
            self._won(kind)
            return
        ctx = TRANSFER_CONTEXT if transfer else b""
        last, last_term = self.log.last_index(), self.log.last_term()
        for peer in sorted(self.tracker.voters):
            if peer != self.id:
                self.send(
                    Message(
                        kind, self.group, self.id, peer, vote_term,
                        log_term=last_term, index=last, context=ctx,
                    )
                )  # fmt: skip

    def _won(self, kind: MessageType) -> None:
        if kind == MT.PRE_VOTE:
            self.campaign(MT.VOTE, transfer=False)
        else:
            self.become_leader()
            repl.bcast_append(self)

    def _handle_vote_request(self, m: Message) -> None:
        # Election Safety (§5.2): at most one vote per term, persisted (HardState.vote)
        # before the response leaves (persist-before-send, RaftNode.ready).
        can_vote = (
            self.vote == m.src
            or (self.vote == NONE and self.lead == NONE)
            or (m.type == MT.PRE_VOTE and m.term > self.term)
        )
        resp = _VOTE_REQ_RESP[m.type]
        # §5.4.1: grant only to a candidate whose log is at least as up-to-date as ours.
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            self.send(Message(resp, self.group, self.id, m.src, m.term))
            if m.type == MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.src
        else:
            self.send(Message(resp, self.group, self.id, m.src, self.term, reject=True))

    def _handle_vote_response(self, m: Message) -> None:
        want = MT.PRE_VOTE_RESP if self.role == Role.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type != want:
            return
        self.tracker.record_vote(m.src, not m.reject)
        result = self.tracker.tally()
        if result == VoteResult.WON:
            self._won(MT.PRE_VOTE if self.role == Role.PRE_CANDIDATE else MT.VOTE)
        elif result == VoteResult.LOST:
            self.become_follower(self.term, NONE)

    # ------------------------------------------------------------------ step
    def step(self, m: Message) -> None:
        """Handle one message from a peer (term rules of §5.1, then by role)."""
        invariant(m.group == self.group, f"message for group {m.group!r} sent to {self.group!r}")
        if m.term > self.term:
            if not self._accept_higher_term(m):
                return
        elif m.term < self.term:
            self._reject_stale(m)
            return
        if m.type in _VOTE_REQ_RESP:
            self._handle_vote_request(m)
        elif self.role == Role.LEADER:
            repl.step_leader(self, m)
        elif self.role == Role.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _accept_higher_term(self, m: Message) -> bool:
        """A message from a later term. False if it is to be ignored."""
        if m.type in _VOTE_REQ_RESP:
            in_lease = (
                self.cfg.check_quorum
                and self.lead != NONE
                and self.election_elapsed < self.cfg.election_tick
            )
            # Leader lease (thesis §4.2.3): while we hear from a live leader, a candidate
            # from a higher term is ignored, so a node rejoining cannot disrupt the group.
            if in_lease and m.context != TRANSFER_CONTEXT:
                return False
        if m.type == MT.PRE_VOTE or (m.type == MT.PRE_VOTE_RESP and not m.reject):
            return True  # pre-votes never change our term
        elapsed = self.election_elapsed
        self.become_follower(m.term, m.src if m.type in _LEADER_MSGS else NONE)
        if m.type == MT.VOTE:
            # §5.2: only a leader's message or a granted vote resets the election timer. A
            # candidate with a stale log that keeps raising the term must not keep us (who
            # could win) from ever timing out.
            self.election_elapsed = elapsed
        return True

    def _reject_stale(self, m: Message) -> None:
        if m.type in (MT.APPEND, MT.HEARTBEAT) and (self.cfg.check_quorum or self.cfg.pre_vote):
            # A stale leader (e.g. back from a partition) learns our term and steps down;
            # without this it could keep its followers' pre-votes failing forever.
            self.send(self.msg(MT.APPEND_RESP, m.src))
        elif m.type == MT.PRE_VOTE:
            self.send(self.msg(MT.PRE_VOTE_RESP, m.src, reject=True))

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t in _LEADER_MSGS:
            self.election_elapsed = 0
            self.lead = m.src
            repl.step_follower_replication(self, m)
        elif t == MT.TIMEOUT_NOW:
            self.hup(transfer=True)
        elif t == MT.READ_INDEX_RESP:
            self.read_states.append(ReadState(m.index, m.context))

    def _step_candidate(self, m: Message) -> None:
        if m.type in _LEADER_MSGS:
            # Someone won this term (§5.2): step down and accept it as leader.
            self.become_follower(m.term, m.src)
            self._step_follower(m)
        elif m.type in (MT.VOTE_RESP, MT.PRE_VOTE_RESP):
            self._handle_vote_response(m)

    # ------------------------------------------------------------------ proposals
    def append_entries(self, entries: list[Entry]) -> int:
        """Leader: stamp ``entries`` with our term and next indexes; returns the last index."""
        last = self.log.last_index()
        stamped = [Entry(last + 1 + i, self.term, e.type, e.data) for i, e in enumerate(entries)]
        for e in stamped:
            if e.data:
                self.uncommitted.append((e.index, len(e.data)))
                self.uncommitted_bytes += len(e.data)
        last = self.log.append(stamped)
        # The leader counts itself at once; it cannot be part of a quorum "too early"
        # because the driver steps no acknowledgement of these entries before our Ready
        # (with them) is persisted: either the appends leave only after that write, or they
        # leave during it and acks are stepped after it (thesis §10.2.1, RawNode.ready).
        self.tracker.progress[self.id].maybe_update(last)
        self.maybe_commit()
        self.bcast_pending = True
        return last

    def check_proposal(self, size: int) -> None:
        """Raise unless a leader can take a proposal of ``size`` payload bytes now."""
        if self.lead_transferee != NONE:
            raise TransferInProgressError(self.lead_transferee)
        if (
            self.uncommitted_bytes
            and self.uncommitted_bytes + size > self.cfg.uncommitted_bytes_max
        ):
            raise LimitError(
                f"{self.uncommitted_bytes} bytes are proposed and not committed yet, up to "
                f"uncommitted_bytes_max {self.cfg.uncommitted_bytes_max}: the group's followers "
                "are behind; retry once they caught up",
                limit="uncommitted_bytes_max",
                field="uncommitted_bytes_max",
                rule="bytes proposed and not committed yet",
            )

    def maybe_commit(self) -> bool:
        """Leader: advance the commit index to what a quorum holds, if of our term."""
        if not self.log.maybe_commit(self.tracker.committed_index(), self.term):
            return False
        committed = self.log.committed
        q = self.uncommitted
        while q and q[0][0] <= committed:
            self.uncommitted_bytes -= q.popleft()[1]
        self.bcast_pending = True
        if self.pending_reads and self.committed_in_term():
            reads, self.pending_reads = self.pending_reads, []
            for requester, ctx in reads:
                self.leader_read_index(requester, ctx)
        return True

    def committed_in_term(self) -> bool:
        return self.log.zero_term(self.log.committed) == self.term

    # ------------------------------------------------------------------ reads
    def leader_read_index(self, requester: str, context: bytes) -> None:
        """ReadIndex (thesis §6.4) on the leader, for itself or a follower."""
        if self.tracker.voters == {self.id}:
            self.answer_read(PendingRead(self.log.committed, requester, context))
            return
        if len(self.read_only) + len(self.pending_reads) >= self.cfg.pending_reads_max:
            if requester == self.id:
                raise LimitError("pending_reads_max reached", limit=self.cfg.pending_reads_max)
            return  # a remote read is dropped; the follower's caller times out and retries
        if not self.committed_in_term():
            # The commit index is not known to be current until our no-op commits.
            self.pending_reads.append((requester, context))
            return
        if self.read_only.add(self.log.committed, requester, context, self.id):
            repl.bcast_heartbeat(self, context)

    def answer_read(self, r: PendingRead) -> None:
        if r.requester == self.id:
            self.read_states.append(ReadState(r.index, r.context))
        else:
            self.send(self.msg(MT.READ_INDEX_RESP, r.requester, index=r.index, context=r.context))

    # ------------------------------------------------------------------ membership
    def apply_conf_change(self, index: int, cc: ConfChange) -> None:
        """Apply one single-server change (thesis §4.1) once its entry at ``index`` is
        applied."""
        self.applied_conf = conf_after(self.applied_conf, cc)
        self.applied_conf_index = index
        if index <= self.conf_index:
            return  # a snapshot restored since then already holds a later membership
        self.conf_index = index
        self.tracker.set_conf(self.applied_conf, self.log.last_index() + 1)
        if self.role != Role.LEADER:
            return
        if self.id not in self.tracker.voters:
            self.become_follower(self.term, NONE)  # removed or demoted: stop leading
            return
        if self.lead_transferee not in self.tracker.voters:
            self.lead_transferee = NONE
        self.maybe_commit()  # the quorum may have shrunk
        self.bcast_pending = True

    def applied_snapshot(self, meta: SnapshotMeta) -> None:
        """The driver installed a snapshot: membership as of the applied index is its."""
        self.applied_conf = meta.conf
        self.applied_conf_index = meta.index

    def validate_conf_change(self, cc: ConfChange) -> None:
        if not cc.node:
            raise InvalidArgumentError("node", "must not be empty")
        if cc.type == ConfChangeType.REMOVE and self.tracker.voters == {cc.node}:
            raise InvalidArgumentError("node", "cannot remove the last voter")


def conf_after(conf: ConfState, cc: ConfChange) -> ConfState:
    """Membership after one single-server change (a voter added as learner is demoted)."""
    voters = set(conf.voters)
    learners = set(conf.learners)
    if cc.type == ConfChangeType.ADD_VOTER:
        voters.add(cc.node)
        learners.discard(cc.node)
    elif cc.type == ConfChangeType.ADD_LEARNER:
        voters.discard(cc.node)
        learners.add(cc.node)
    else:
        voters.discard(cc.node)
        learners.discard(cc.node)
    return ConfState(tuple(sorted(voters)), tuple(sorted(learners)))
