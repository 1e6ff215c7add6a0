"""The Raft host's driver: its loop and the round (raft/host.py is the host and explains
the round in its docstring; this is the part that runs it).

``Driver.run`` is the one task that touches the cores: it waits for work or the next tick
(on the host's clock), ticks, steps what the transport delivered (``on_inbound`` only
queues it), hands queued proposals and reads to the cores, then runs a round: collect
every group's Ready, write them all in one storage write, send, apply, advance. The safety
rules live here, each with its comment: persist-before-send, a leader's appends sent early
only with a durable term and vote, acknowledgements stepped only after the leader's own
write, entries applied early only when they were durable before the write. Everything here
belongs to the host's event loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from typing import Any

from raftstream.raft.errors import NotLeaderError, RaftError, UnavailableError
from raftstream.raft.host_groups import GroupState, GroupTable, HostShared, QuiesceNotice, WriteJobs
from raftstream.raft.host_requests import Requests
from raftstream.raft.host_snapshots import Snapshots
from raftstream.raft.host_ticks import Ticks
from raftstream.raft.storage import GroupWrite
from raftstream.raft.transport import Inbound
from raftstream.raft.types import Entry, EntryType, Message, MessageType, Ready, Role

__all__ = ["Driver"]

log = logging.getLogger("raftstream.raft.host")


class Driver:
    """The driver loop and its rounds, over the host's parts."""

    def __init__(
        self,
        shared: HostShared,
        *,
        table: GroupTable,
        requests: Requests,
        ticks: Ticks,
        snapshots: Snapshots,
        writes: WriteJobs,
    ) -> None:
        self._s = shared
        self._table = table
        self._requests = requests
        self._ticks = ticks
        self._snapshots = snapshots
        self._writes_lane = writes
        self.inbox: collections.deque[Message | QuiesceNotice] = collections.deque()
        self._sync_commits = False  # this round writes every unsynced commit (once a tick)
        self.rounds = 0  # rounds that had work (a Ready), for observers and tests
        self.failure: BaseException | None = None  # why ``run`` stopped on its own

    # -- receiving -------------------------------------------------------------------------
    def on_inbound(self, inbound: Inbound) -> None:
        """Transport handler (on the loop): queue for the next round, never step here."""
        s = self._s
        if inbound.src != s.node_id:  # not a report the transport made up locally
            self._ticks.heard_from(inbound.src)
        room = s.config.inbox_msgs_max - len(self.inbox)
        if room <= 0:
            return  # dropped: Raft resends what matters
        self.inbox.extend(inbound.messages[:room])
        # After the batch's messages: the leader quiesced after sending them.
        self.inbox.extend(QuiesceNotice(inbound.src, g, t) for g, t in inbound.quiesce)
        if inbound.messages or inbound.quiesce:
            s.wake.set()

    def _step_inbox(self) -> None:
        while self.inbox:
            m = self.inbox.popleft()
            if isinstance(m, QuiesceNotice):
                self._ticks.follow_quiesce(m)
                continue
            g = self._s.groups.get(m.group)
            if g is None or g.halted:
                continue
            if m.type != MessageType.HEARTBEAT_RESP:
                g.quiet = False  # the group is active again: tick it
                self._ticks.woken(m.group)
            try:
                g.node.step(m)
            except RaftError as exc:
                self._table.halt(g, exc)
                continue
            self._s.dirty[m.group] = None

    # -- the loop --------------------------------------------------------------------------
    async def run(self) -> None:
        """Until the host stops: wait for work or the clock, then tick, step, take, round.
        A failed storage write stops it: every waiter fails, ``failure`` says why."""
        s, clock, requests = self._s, self._s.clock, self._requests
        tick_s = s.config.tick_ms / 1000
        next_tick = clock.now() + tick_s
        try:
            while not s.stopping:
                if not self._has_work(clock.now()):
                    s.wake.clear()
                    wake_at = min(next_tick, requests.lazy_due() or next_tick)
                    # Woken by work, or by the clock at the next tick or lazy proposal's due.
                    timer = clock.call_at(wake_at, s.wake.set)
                    try:
                        await s.wake.wait()
                    finally:
                        timer.cancel()
                    if s.stopping:
                        break
                now = clock.now()
                ticked = now >= next_tick
                if ticked:
                    next_tick = max(next_tick + tick_s, now)
                    self._sync_commits = True
                    self._ticks.tick_all(now)
                    requests.expire(now)
                self._ticks.tick_late()
                self._step_inbox()
                if requests.eager or requests.lazy_is_due(now):
                    requests.take_proposals()
                requests.take_reads()
                await self._round()
                if ticked:  # after the tick's round: peers it sent nothing get a ping
                    self._ticks.ping_peers()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.critical("raft host %s stopped: %r", s.node_id, exc)
            self.failure = exc
            requests.fail_all(UnavailableError("raft host failed; the outcome is unknown"))
            raise

    def _has_work(self, now: float) -> bool:
        r = self._requests
        return bool(
            self.inbox
            or r.eager
            or r.lazy_is_due(now)
            or r.has_reads()
            or self._s.dirty
            or self._ticks.has_late_ticks()
        )

    # -- the round -------------------------------------------------------------------------
    def _collect(self) -> list[tuple[GroupState, Ready]]:
        readies: list[tuple[GroupState, Ready]] = []
        for name in self._s.dirty:
            g = self._s.groups.get(name)
            if g is None or g.halted:
                continue
            try:
                if g.node.has_ready():
                    readies.append((g, g.node.ready()))
            except RaftError as exc:  # e.g. DataLossError reading the log: stop it
                self._table.halt(g, exc)
        self._s.dirty.clear()
        return readies

    async def _round(self) -> None:
        readies = self._collect()
        writes = self._writes(readies)
        early: set[int] = set()
        applied_early: dict[str, int] = {}
        if writes:
            # A leader's appends leave now, in parallel with its own write (raft/host.py:
            # their acknowledgements are stepped only in a later round, after this write).
            early = self._send_appends_early(readies)
            # fsync-before-send for everything else: one transaction for every group.
            written: asyncio.Future[Any] | None = None
            lane = self._writes_lane
            if not early and self._s.config.inline_follower_writes and not lane.pending:
                # Nothing to overlap with the write (raft/host.py, "Following rounds write
                # on the loop").
                self._s.storage.write_batch(writes)
            else:
                written = lane.submit(self._s.storage.write_batch, writes)
            if written is not None and all(
                id(m) in early or m.type == MessageType.HEARTBEAT
                for _, rd in readies
                for m in rd.messages
            ):
                # While the disk works: apply what was durable before this write
                # (raft/host.py, "Applying during the write"); never ahead of messages that
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
            self._finish(g, rd, skip=applied_early.get(g.name, 0))

    def _finish(self, g: GroupState, rd: Ready, *, skip: int) -> None:
        """After the round's write and send: apply ``rd`` (but its first ``skip`` committed
        entries), resolve reads, advance the core, follow membership, maybe snapshot."""
        self._apply(g, rd, skip=skip)
        self._requests.follow_reads(g, rd)
        if not g.halted:
            g.node.advance(rd)
            if rd.snapshot is not None or _has_conf_change(rd.committed_entries):
                self._follow_membership(g)
            if rd.committed_entries:
                self._snapshots.maybe_snapshot(g)
        self._s.dirty[g.name] = None  # advance may have produced more (next round)
        if rd.soft_state is not None and g.on_leader_change is not None:
            self._notify_leader_change(g, rd.soft_state.leader, rd.soft_state.role)

    def _follow_membership(self, g: GroupState) -> None:
        """After a membership change or a snapshot took effect (``advance``): the group's
        other members are the ones to ping and to watch for silence (quiescence)."""
        conf = g.node.status().conf
        g.members = frozenset((*conf.voters, *conf.learners)) - {self._s.node_id}
        self._ticks.track(g.members)

    def _notify_leader_change(self, g: GroupState, leader: str, role: Role) -> None:
        if g.on_leader_change is None:
            return
        try:
            g.on_leader_change(g.name, leader or None, role)
        except Exception:
            log.exception("raft group %s: leader-change callback failed", g.name)

    # -- writing ---------------------------------------------------------------------------
    def _writes(self, readies: list[tuple[GroupState, Ready]]) -> list[GroupWrite]:
        writes: list[GroupWrite] = []
        in_round = set()
        for g, rd in readies:
            in_round.add(g.name)
            compaction, g.compaction = g.compaction, None
            if rd.snapshot is not None:
                compaction = None  # the leader's snapshot supersedes our own
            hs = rd.hard_state
            if hs is not None and (hs.term, hs.vote) == g.durable_vote:
                # Only the commit index moved (volatile, raft/host.py): no fsync for it
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
        for g in self._s.groups.values():
            if g.compaction is not None and g.name not in in_round:
                writes.append(GroupWrite(g.name, g.unsynced, compaction=g.compaction))
                in_round.add(g.name)
                g.compaction = None
        if writes or self._sync_commits:
            self._add_unsynced(writes)
        return writes

    def _add_unsynced(self, writes: list[GroupWrite]) -> None:
        """The commit indexes waiting for a write ride along with this one; a tick's round
        with nothing else to write takes those that waited through a tick already."""
        others, self._sync_commits = bool(writes), False
        written = {w.group for w in writes}
        for g in self._s.groups.values():
            if g.unsynced is None or g.name in written:
                continue
            if others or g.unsynced_ticks >= 1:
                writes.append(GroupWrite(g.name, g.unsynced))
            else:  # a tick's round with nothing else to write (raft/host.py, "Commit index")
                g.unsynced_ticks += 1

    def _written(self, writes: list[GroupWrite]) -> None:
        """After ``writes`` are durable: what each group's stored hard state now is."""
        for w in writes:
            g = self._s.groups.get(w.group)
            if g is None or w.hard_state is None:
                continue
            g.durable_vote = (w.hard_state.term, w.hard_state.vote)
            if g.unsynced is not None and g.unsynced.commit <= w.hard_state.commit:
                g.unsynced = None
                g.unsynced_ticks = 0

    # -- sending ---------------------------------------------------------------------------
    def _send_appends_early(self, readies: list[tuple[GroupState, Ready]]) -> set[int]:
        """Send the leaders' APPEND messages of this round before its write (raft/host.py,
        "The leader writes in parallel"); returns the ids of those sent."""
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
            self._s.transport.send(peer, messages)
            self._ticks.sent_to(peer)
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
            self._s.transport.send(peer, messages, self._ticks.quiesce_notices(peer))
            self._ticks.sent_to(peer)
        return bool(by_peer)

    # -- applying --------------------------------------------------------------------------
    def _apply_durable(self, readies: list[tuple[GroupState, Ready]]) -> dict[str, int]:
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
                self._table.halt(g, exc)
            done[g.name] = count
        return done

    def _apply(self, g: GroupState, rd: Ready, *, skip: int = 0) -> None:
        """Apply ``rd``'s snapshot and committed entries, but its first ``skip`` committed
        entries (``_apply_durable`` did those)."""
        if g.halted:
            return
        try:
            if rd.snapshot is not None:
                self._snapshots.abandon(g)  # the state it was made from is gone
                g.sm.restore(g.name, rd.snapshot.data)
                g.applied = rd.snapshot.meta.index
                gone = UnavailableError("raft log replaced by a snapshot; unknown")
                self._requests.fail_waiting_through(g, g.applied, gone)
            if len(rd.committed_entries) > skip:
                self._apply_entries(g, rd.committed_entries[skip:])
        except Exception as exc:  # a state machine that failed has diverged: stop the group
            self._table.halt(g, exc)

    def _apply_entries(self, g: GroupState, entries: Sequence[Entry]) -> None:
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
                self._s.reject(fut, NotLeaderError("raft proposal superseded", leader=leader))
        g.applied = entries[-1].index


def _has_conf_change(entries: Sequence[Entry]) -> bool:
    return any(e.type == EntryType.CONF_CHANGE for e in entries)
