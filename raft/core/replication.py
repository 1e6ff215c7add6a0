"""Log replication: the leader's side (progress, pipelining, backtracking, snapshots,
heartbeats, ReadIndex acks) and the follower's (AppendEntries, heartbeats, snapshots).

Functions over ``Raft`` rather than methods, to keep raft.py about roles and elections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftstream.raft.core.log import CompactedError, entries_size
from raftstream.raft.core.progress import Progress, ProgressState
from raftstream.raft.types import NONE, Entry, EntryType, Message, MessageType, Role

if TYPE_CHECKING:
    from raftstream.raft.core.raft import Raft

__all__ = [
    "bcast_append",
    "bcast_heartbeat",
    "expire_snapshots",
    "send_append",
    "step_follower_replication",
    "step_leader",
]

MT = MessageType


# ---------------------------------------------------------------------- leader: sending
def bcast_append(r: Raft) -> None:
    """Send every peer what it is missing, or just the commit index (unless
    ``commit_notices`` is off: then a peer with nothing to receive gets nothing; it learns
    the commit index from its next append or heartbeat)."""
    r.bcast_pending = False
    notices = r.cfg.commit_notices
    last = r.log.last_index()
    for peer, pr in r.tracker.progress.items():
        if peer == r.id:
            continue
        if not notices and pr.state == ProgressState.REPLICATE and pr.next > last:
            continue  # everything is on its way already: only the commit index would go
        send_append(r, peer)


def send_append(r: Raft, to: str) -> None:
    """One append even if empty (it carries the commit index), then as many more as the
    pipeline allows."""
    if maybe_send_append(r, to, send_if_empty=True):
        while maybe_send_append(r, to, send_if_empty=False):
            pass


def maybe_send_append(r: Raft, to: str, *, send_if_empty: bool) -> bool:
    """Send ``to`` the entries after its ``next`` (bounded by append_bytes_max); a snapshot
    instead if they are compacted. False when paused or when there was nothing to send."""
    pr = r.tracker.progress[to]
    if pr.is_paused():
        return False
    prev = pr.next - 1
    try:
        prev_term = r.log.term(prev)
        ents = r.log.entries_from(pr.next, r.cfg.append_bytes_max)
    except CompactedError:
        return send_snapshot(r, to, pr)
    if not ents and not send_if_empty:
        return False
    size = entries_size(ents)
    r.send(
        Message(
            MT.APPEND, r.group, r.id, to, r.term,
            log_term=prev_term, index=prev, entries=tuple(ents), commit=r.log.committed,
        )
    )  # fmt: skip
    pr.sent_entries(prev + len(ents), size)
    return True


def send_snapshot(r: Raft, to: str, pr: Progress) -> bool:
    """The follower needs entries we compacted: send the latest snapshot (the transport
    streams it in chunks). Nothing else goes to it until it acknowledges or times out."""
    snap = r.log.snapshot()
    if snap.meta.index == 0:
        return False  # nothing compacted yet: cannot happen with a consistent LogView
    r.send(Message(MT.SNAPSHOT, r.group, r.id, to, r.term, snapshot=snap))
    pr.become_snapshot(snap.meta.index)
    return True


def expire_snapshots(r: Raft) -> None:
    """Called once per election timeout: a snapshot not acknowledged within two checks is
    presumed lost, and the follower is probed again (which resends it if still needed)."""
    for peer, pr in r.tracker.progress.items():
        if peer == r.id or pr.state != ProgressState.SNAPSHOT:
            continue
        if pr.snapshot_checks >= 1:
            pr.become_probe()
        else:
            pr.snapshot_checks += 1


def bcast_heartbeat(r: Raft, context: bytes | None) -> None:
    """Heartbeats are tiny (no entries) so the host can coalesce them per peer. The commit
    sent is capped at the follower's match: it may not hold our later entries yet."""
    ctx = context or b""
    committed = r.log.committed
    for peer, pr in r.tracker.progress.items():
        if peer != r.id:
            r.send(
                Message(
                    MT.HEARTBEAT, r.group, r.id, peer, r.term,
                    commit=min(pr.match, committed), context=ctx,
                )
            )  # fmt: skip


# ---------------------------------------------------------------------- leader: receiving
def step_leader(r: Raft, m: Message) -> None:
    pr = r.tracker.progress.get(m.src)
    t = m.type
    if t == MT.PROPOSE:
        _handle_forwarded_proposal(r, m)
        return
    if pr is None:
        return  # not (or no longer) a member
    if t == MT.APPEND_RESP:
        pr.recent_active = True
        if m.reject:
            _handle_reject(r, m, pr)
        else:
            _handle_ack(r, m, pr)
    elif t == MT.HEARTBEAT_RESP:
        _handle_heartbeat_resp(r, m, pr)
    elif t == MT.SNAPSHOT_RESP:
        # The transport (or the follower) reports the snapshot done or failed.
        if pr.state == ProgressState.SNAPSHOT:
            if m.reject:
                pr.pending_snapshot = 0
            pr.become_probe()
            pr.probe_sent = True  # wait for a heartbeat response before probing
    elif t == MT.READ_INDEX:
        r.leader_read_index(m.src, m.context)


def _handle_reject(r: Raft, m: Message, pr: Progress) -> None:
    """Fast backtracking: the follower rejected the append after ``m.index`` and hints
    ``(reject_hint, log_term)``: its last index whose term is <= the term we sent. We skip
    every index of ours whose term is above that hint's term in one step."""
    hint = m.reject_hint
    if m.log_term > 0:
        hint, _ = r.log.find_conflict_by_term(hint, m.log_term)
    if pr.maybe_decr_to(m.index, hint):
        if pr.state == ProgressState.REPLICATE:
            pr.become_probe()
        send_append(r, m.src)


def _handle_ack(r: Raft, m: Message, pr: Progress) -> None:
    was_paused = pr.is_paused()
    if pr.maybe_update(m.index):
        if pr.state == ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state == ProgressState.SNAPSHOT:
            if pr.match + 1 >= r.log.first_index():
                pr.become_probe()
                pr.become_replicate()
        else:
            pr.inflights.free_le(m.index)
        # A new commit index reaches followers with the broadcast flushed at the next
        # Ready, so many acks between two Readies cost one round of appends.
        r.maybe_commit()
        if was_paused or pr.state == ProgressState.REPLICATE:
            send_more(r, m.src)
        if m.src == r.lead_transferee and pr.match == r.log.last_index():
            # Thesis §3.10: the target is caught up, it may start its election now.
            r.send(r.msg(MT.TIMEOUT_NOW, m.src))


def send_more(r: Raft, to: str) -> None:
    while maybe_send_append(r, to, send_if_empty=False):
        pass


def _handle_heartbeat_resp(r: Raft, m: Message, pr: Progress) -> None:
    pr.recent_active = True
    pr.probe_sent = False
    if pr.state == ProgressState.REPLICATE and pr.inflights.full():
        # Some appends may be lost: let one more through; a gap makes the follower reject
        # and we fall back to probing.
        pr.inflights.free_first()
    if pr.match < r.log.last_index():
        send_append(r, m.src)
    if not m.context:
        return
    acks = r.read_only.ack(m.src, m.context)
    if acks is None or sum(1 for v in r.tracker.voters if v in acks) < r.tracker.quorum():
        return
    for read in r.read_only.advance(m.context):
        r.answer_read(read)


def _handle_forwarded_proposal(r: Raft, m: Message) -> None:
    """A follower's host forwarded proposals (the core itself never forwards). Dropped on
    any refusal: the proposer learns through its own timeout."""
    ents = [Entry(0, 0, EntryType.NORMAL, e.data) for e in m.entries if e.data]
    if r.role != Role.LEADER or r.lead_transferee != NONE or not ents:
        return
    size = entries_size(ents)
    if r.uncommitted_bytes and r.uncommitted_bytes + size > r.cfg.uncommitted_bytes_max:
        return
    r.append_entries(ents)


# ---------------------------------------------------------------------- follower
def step_follower_replication(r: Raft, m: Message) -> None:
    if m.type == MT.APPEND:
        _handle_append(r, m)
    elif m.type == MT.HEARTBEAT:
        # m.commit <= our match on the leader, so we hold that entry: safe to commit.
        r.log.commit_to(min(m.commit, r.log.last_index()))
        r.send(r.msg(MT.HEARTBEAT_RESP, m.src, context=m.context))
    elif m.type == MT.SNAPSHOT:
        _handle_snapshot(r, m)


def _handle_append(r: Raft, m: Message) -> None:
    log = r.log
    if m.index < log.committed:
        # Everything up to our commit index already matches (Log Matching, §5.3).
        r.send(r.msg(MT.APPEND_RESP, m.src, index=log.committed))
        return
    last = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
    if last is not None:
        # The ack leaves only after these entries are persisted (RaftNode.ready): an entry
        # counted towards a quorum is on disk (§5.3, fsync-before-ack).
        r.send(r.msg(MT.APPEND_RESP, m.src, index=last))
        return
    # §5.3 consistency check failed: hint our last index whose term <= m.log_term, so the
    # leader can skip a whole term of mismatching entries per round trip.
    hint_index, hint_term = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
    r.send(
        r.msg(
            MT.APPEND_RESP, m.src, index=m.index, reject=True,
            reject_hint=hint_index, log_term=hint_term,
        )
    )  # fmt: skip


def _handle_snapshot(r: Raft, m: Message) -> None:
    snap = m.snapshot
    if snap is None:
        return
    meta = snap.meta
    log = r.log
    if meta.index <= log.committed:
        r.send(r.msg(MT.APPEND_RESP, m.src, index=log.committed))
        return
    if log.match_term(meta.index, meta.term):
        # We already hold that prefix: just commit it instead of discarding our log.
        log.commit_to(meta.index)
        r.send(r.msg(MT.APPEND_RESP, m.src, index=log.last_index()))
        return
    log.restore(snap)
    r.tracker.set_conf(meta.conf, meta.index + 1)
    r.conf_index = meta.index
    r.send(r.msg(MT.APPEND_RESP, m.src, index=log.last_index()))
