"""Safety checkers of Raft §5, run by the simulator as every Ready is processed.

- Election Safety (§5.2): at most one leader per term; and its foundation, one vote per
  term per server (granted votes are watched on the wire, so a vote forgotten across a
  crash is caught even when no second leader results); a restarted server must hold, in
  what it persisted, the last vote it was seen granting (persist-before-send).
- Fsync-before-ack (§5.3 counts an entry once stored on a majority): a restarted server
  still of the term of its last acknowledgement holds the entries it acknowledged.
- Leader Append-Only (§5.3): a leader never overwrites or deletes entries of its term.
- Log Matching (§5.3): checked inductively. Every (index, term) ever persisted anywhere is
  registered with its content and the term of the entry before it; any replica persisting
  the same (index, term) must agree on both. Equal (index, term) then implies equal
  prefixes by induction on the index.
- Leader Completeness (§5.4): a new leader's log holds every entry known committed.
- State Machine Safety (§5.4.3): no two replicas apply different entries at one index
  (including snapshots, whose (index, term) must match the committed entry).
"""

from __future__ import annotations

from raftstream.raft.core import RaftNode
from raftstream.raft.types import (
    Entry,
    EntryType,
    Message,
    MessageType,
    Ready,
    Role,
    Snapshot,
)

from .storage import SimStorage


class SafetyViolation(AssertionError):
    pass


class SafetyChecker:
    def __init__(self) -> None:
        self.leaders: dict[tuple[str, int], str] = {}
        self.registry: dict[tuple[str, int, int], tuple[EntryType, bytes, int]] = {}
        self.committed: dict[str, dict[int, tuple[int, EntryType, bytes]]] = {}
        self.votes: dict[tuple[str, int, str], str] = {}
        self.last_vote: dict[tuple[str, str], tuple[int, str]] = {}
        self.last_ack: dict[tuple[str, str], tuple[int, int, int]] = {}
        self.checks = 0

    def on_ready(self, node: str, group: str, raft: RaftNode, st: SimStorage, rd: Ready) -> None:
        """Before ``rd`` is persisted to ``st``."""
        self.checks += 1
        if rd.soft_state is not None and rd.soft_state.role == Role.LEADER:
            self._election_safety(node, group, raft)
            self._leader_completeness(node, group, raft)
        if rd.snapshot is not None:
            self.on_snapshot(group, rd.snapshot)
        if rd.entries:
            self._append_only(node, group, raft, st, rd.entries)
            self._log_matching(group, st, rd)

    def _election_safety(self, node: str, group: str, raft: RaftNode) -> None:
        term = raft.term
        other = self.leaders.setdefault((group, term), node)
        if other != node:
            raise SafetyViolation(
                f"Election Safety (§5.2): {other} and {node} both lead {group} in term {term}"
            )

    def _leader_completeness(self, node: str, group: str, raft: RaftNode) -> None:
        first = raft.first_index()
        for index, (term, _, _) in self.committed.get(group, {}).items():
            if index >= first and raft.log_term(index) != term:
                raise SafetyViolation(
                    f"Leader Completeness (§5.4): {node} leads {group} in term {raft.term} "
                    f"without committed entry {index} of term {term}"
                )

    def _append_only(
        self, node: str, group: str, raft: RaftNode, st: SimStorage, ents: tuple[Entry, ...]
    ) -> None:
        if raft.role != Role.LEADER:
            return
        first_new = max(ents[0].index, st.first_index())
        for i in range(first_new, st.last_index() + 1):
            if st.term(i) == raft.term:
                raise SafetyViolation(
                    f"Leader Append-Only (§5.3): {node} overwrites its own entry {i} "
                    f"of term {raft.term} in {group}"
                )

    def _log_matching(self, group: str, st: SimStorage, rd: Ready) -> None:
        ents = rd.entries
        base = rd.snapshot.meta if rd.snapshot is not None else None
        first = ents[0].index
        if base is not None and first - 1 == base.index:
            prev_term = base.term
        elif first - 1 >= st.first_index() - 1:
            prev_term = st.term(first - 1)
        else:
            prev_term = -1  # below our snapshot: storage drops these, nothing to check
        for e in ents:
            key = (group, e.index, e.term)
            seen = self.registry.setdefault(key, (e.type, e.data, prev_term))
            if prev_term >= 0 and seen[2] >= 0 and seen != (e.type, e.data, prev_term):
                raise SafetyViolation(
                    f"Log Matching (§5.3): {group} entry ({e.index}, {e.term}) differs "
                    f"between replicas: {seen!r} vs {(e.type, e.data, prev_term)!r}"
                )
            prev_term = e.term

    def on_send(self, m: Message) -> None:
        if m.type != MessageType.VOTE_RESP or m.reject:
            return
        self.last_vote[(m.group, m.src)] = (m.term, m.dst)
        other = self.votes.setdefault((m.group, m.term, m.src), m.dst)
        if other != m.dst:
            raise SafetyViolation(
                f"Election Safety (§5.2): {m.src} voted for {other} and {m.dst} in "
                f"{m.group} term {m.term}"
            )

    def on_ack(self, group: str, node: str, term: int, index: int, entry_term: int) -> None:
        """``node`` acknowledged (in ``term``) its log up to ``index`` (of ``entry_term``)."""
        self.last_ack[(group, node)] = (term, index, entry_term)

    def on_restart(self, node: str, group: str, st: SimStorage) -> None:
        """What ``node`` recovered must hold every vote and acknowledgement it sent."""
        hs = st.hard_state()
        ack = self.last_ack.get((group, node))
        if ack is not None and hs.term == ack[0]:
            _, index, entry_term = ack
            kept = st.last_index() >= index and (
                index < st.first_index() - 1 or st.term(index) == entry_term
            )
            if not kept:
                raise SafetyViolation(
                    f"fsync-before-ack (§5.3): {node} acknowledged {group} up to {index} in "
                    f"term {ack[0]} but restarted without it (last {st.last_index()})"
                )
        seen = self.last_vote.get((group, node))
        if seen is None:
            return
        term, candidate = seen
        if hs.term < term or (hs.term == term and hs.vote != candidate):
            raise SafetyViolation(
                f"Election Safety (§5.2): {node} granted {candidate} its vote in {group} "
                f"term {term} but restarted with {hs} (a vote sent before it was persisted)"
            )

    def on_apply(self, node: str, group: str, e: Entry) -> None:
        got = (e.term, e.type, e.data)
        seen = self.committed.setdefault(group, {}).setdefault(e.index, got)
        if seen != got:
            raise SafetyViolation(
                f"State Machine Safety (§5.4.3): {node} applies {got!r} at {group}/{e.index}, "
                f"another replica applied {seen!r}"
            )

    def on_snapshot(self, group: str, snap: Snapshot) -> None:
        seen = self.committed.get(group, {}).get(snap.meta.index)
        if seen is not None and seen[0] != snap.meta.term:
            raise SafetyViolation(
                f"State Machine Safety (§5.4.3): snapshot of {group} at {snap.meta.index} has "
                f"term {snap.meta.term}, the committed entry has term {seen[0]}"
            )
