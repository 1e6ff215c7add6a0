"""The Raft host's ticks, quiescence and peer liveness (raft/host.py is the host; this is
one of its parts; its docstring explains "Quiescence" and "Elections between ticks").

Each tick of the driver ticks every group that is not quiet; a follower whose tick would
start an election gets it a random part of a tick later (``tick_late``); a leader now and
then considers quiescing its group (``maybe_quiesce``), and tells the followers with its
next batch to each (``quiesce_notices``). Liveness is per node, not per group: every peer
gets at least one batch per tick (``ping_peers``), the time each one was last heard from is
kept (``heard_from``), and a peer silent for ``liveness_ticks`` wakes the quiet groups it
leads or follows. Time comes from the host's clock. Everything here belongs to the host's
event loop.
"""

from __future__ import annotations

import collections
import functools

from raftstream.raft.host_groups import GroupState, HostShared, QuiesceNotice
from raftstream.raft.types import Role

__all__ = ["Ticks"]


class Ticks:
    """Ticking the groups, quiescing idle ones, and watching the peers for silence."""

    def __init__(self, shared: HostShared) -> None:
        self._s = shared
        self.count = 0  # ticks given, for observers and tests
        self._peers: set[str] = set()  # every other node of any group here
        self._heard: dict[str, float] = {}  # peer -> clock time of its last batch
        self._quiesce_out: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
        self._sent_since_tick: set[str] = set()
        # Followers woken by their leader's silence, not by anything of the group (_requiesce).
        self._woken_by_silence: set[str] = set()
        # Election ticks now due (see "Elections between ticks").
        self._late_ticks: list[GroupState] = []

    # -- peers -----------------------------------------------------------------------------
    def track(self, peers: frozenset[str]) -> None:
        """Ping ``peers`` every tick from now on, and watch for their silence."""
        now = self._s.clock.now()
        for peer in peers - self._peers:
            self._peers.add(peer)
            self._heard[peer] = now  # a grace period before it can be presumed down

    def untrack(self, peer: str) -> bool:
        """See ``RaftHost.untrack_peer``."""
        if any(
            peer in g.members or peer in g.node.status().conf.voters
            or peer in g.node.status().conf.learners
            for g in self._s.groups.values()
        ):  # fmt: skip
            return False
        self._peers.discard(peer)
        self._heard.pop(peer, None)
        self._quiesce_out.pop(peer, None)
        self._sent_since_tick.discard(peer)
        return True

    def heard_from(self, peer: str) -> None:
        """A batch came from ``peer`` (tracked from now on if it was not)."""
        if peer not in self._peers:
            self.track(frozenset((peer,)))
        self._heard[peer] = self._s.clock.now()

    def sent_to(self, peer: str) -> None:
        """A batch left for ``peer`` this tick: it needs no ping."""
        self._sent_since_tick.add(peer)

    def quiesce_notices(self, peer: str) -> list[tuple[str, int]]:
        """The (group, term) quiesced for ``peer`` since its last batch, to go with the next."""
        return self._quiesce_out.pop(peer, [])

    def ping_peers(self) -> None:
        """Liveness: every peer gets at least one batch per tick (an empty one if need be),
        so a peer silent for ``liveness_ticks`` (> 1) ticks is down or cut off."""
        for peer in sorted(self._peers - self._sent_since_tick):  # in an order a seed replays
            self._s.transport.send(peer, [], self._quiesce_out.pop(peer, []))
        self._sent_since_tick.clear()

    def _silent_peers(self, now: float) -> set[str]:
        cfg = self._s.config
        limit = cfg.liveness_ticks * cfg.tick_ms / 1000
        return {p for p in self._peers if now - self._heard.get(p, now) > limit}

    # -- ticks -----------------------------------------------------------------------------
    def has_late_ticks(self) -> bool:
        return bool(self._late_ticks)

    def tick_all(self, now: float) -> None:
        """The driver's tick: every group not quiet is ticked (an election tick a random
        part of a tick later); leaders consider quiescing every ``election_tick`` ticks."""
        s = self._s
        self.count += 1
        self._wake_groups_of_silent_peers(now)
        check_every = s.config.election_tick
        tick_s = s.config.tick_ms / 1000
        for name, g in s.groups.items():
            if g.halted or g.quiet or g.late_tick:
                continue
            if g.node.election_due():
                g.late_tick = True
                late_at = s.clock.now() + s.rng.uniform(0, tick_s)
                s.clock.call_at(late_at, functools.partial(self._late_tick_due, g))
                continue
            g.node.tick()
            s.dirty[name] = None
            if s.config.quiesce and g.node.role == Role.LEADER:
                g.ticks_to_check -= 1
                if g.ticks_to_check <= 0:
                    g.ticks_to_check = check_every
                    self._maybe_quiesce(g)

    def _late_tick_due(self, g: GroupState) -> None:
        """A delayed election tick is due: the driver gives it at its next turn."""
        self._late_ticks.append(g)
        self._s.wake.set()

    def tick_late(self) -> None:
        """Give the delayed election ticks now due."""
        late, self._late_ticks = self._late_ticks, []
        for g in late:
            g.late_tick = False
            if self._s.groups.get(g.name) is g and not (g.halted or g.quiet):
                g.node.tick()
                self._s.dirty[g.name] = None

    # -- quiescence ------------------------------------------------------------------------
    def _maybe_quiesce(self, g: GroupState) -> None:
        """Leader: quiesce ``g`` if nothing changed since the last check (so the followers
        have heard the commit index), every follower holds the whole log, and all is
        applied. Never while a member is presumed down: check-quorum needs the ticks."""
        node_id = self._s.node_id
        st = g.node.status()
        state = (st.last_index, st.commit)
        stable, g.last_check = g.last_check == state, state
        if not stable or g.waiting or st.commit != st.last_index or st.applied != st.commit:
            return
        if any(p.match != st.last_index for n, p in st.progress.items() if n != node_id):
            return
        # The current membership (it may have changed since add_group): these are the
        # nodes whose silence must wake the group, and they must get our pings.
        g.members = frozenset(st.progress) - {node_id}
        self.track(g.members)
        if g.members & self._silent_peers(self._s.clock.now()):
            return
        g.quiet = True
        for peer in g.members:
            self._quiesce_out[peer].append((g.name, st.term))

    def follow_quiesce(self, q: QuiesceNotice) -> None:
        """Follower: stop ticking a group its current leader quiesced in its current term."""
        g = self._s.groups.get(q.group)
        n = g.node if g is not None else None
        if g is None or n is None or g.halted or n.role != Role.FOLLOWER:
            return
        if n.leader == q.src and n.term == q.term:
            g.quiet = True

    def woken(self, group: str) -> None:
        """Something came for ``group``: it is no longer awake only by its leader's silence."""
        self._woken_by_silence.discard(group)

    def _wake_groups_of_silent_peers(self, now: float) -> None:
        silent = self._silent_peers(now)
        if self._woken_by_silence:
            self._requiesce(silent)
        if not silent:
            return
        cfg = self._s.config
        tick_s = cfg.tick_ms / 1000
        for g in self._s.groups.values():
            if not g.quiet:
                continue
            lead = g.node.leader
            is_leader = g.node.role == Role.LEADER
            if (is_leader and g.members & silent) or (not is_leader and lead in silent):
                g.quiet = False
                self._s.dirty[g.name] = None
            if lead in silent and not is_leader:
                self._woken_by_silence.add(g.name)
                # Credit the silence: the election starts as if we had kept ticking. At
                # most one tick short of the base timeout: every follower of the group is
                # credited the same silence, and the random rest of each one's timeout is
                # what keeps them from standing at once.
                missed = int((now - self._heard.get(lead, now)) / tick_s)
                for _ in range(min(missed, cfg.election_tick - 1)):
                    g.node.tick()

    def _requiesce(self, silent: set[str]) -> None:
        """A follower woken by its leader's silence goes back to quiet once that leader is
        heard again while nothing came for the group: the leader kept the group quiesced, so
        it was stalled (a long apply or snapshot, a loaded machine), not gone, and an election
        would only move an idle group's leadership (a soak under load saw the meta group's
        term reach 15 in 31 minutes). Anything for the group (``woken``), or a campaign
        of its own, ends this."""
        for name in list(self._woken_by_silence):
            g = self._s.groups.get(name)
            if g is None or g.halted or g.node.role != Role.FOLLOWER:
                self._woken_by_silence.discard(name)
                continue
            lead = g.node.leader
            if lead and lead not in silent:
                g.quiet = True
                self._woken_by_silence.discard(name)
