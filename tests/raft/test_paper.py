"""Tests from the Raft paper (Ongaro & Ousterhout, "In Search of an Understandable
Consensus Algorithm", 2014). Each test names the property or rule and the section it pins.

These run with pre-vote and check-quorum off (plain Raft as the paper describes it); the
extensions have their own tests in test_core_features.py.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from raftstream.raft.storage import MemoryGroupLog
from raftstream.raft.types import NONE, Entry, HardState, Message, MessageType, Role
from tests.support.sim_net import Network

MT = MessageType
PLAIN = {"pre_vote": False, "check_quorum": False}


def net3(**kw: object) -> Network:
    return Network(["a", "b", "c"], **{**PLAIN, **kw})  # type: ignore[arg-type]


def log_with(terms: list[int], *, term: int, vote: str = NONE, commit: int = 0) -> MemoryGroupLog:
    """A durable log whose entry i+1 has term terms[i]."""
    st = MemoryGroupLog()
    st.append([Entry(i + 1, t, data=f"{i + 1}/{t}".encode()) for i, t in enumerate(terms)])
    st.set_hard_state(HardState(term, vote, commit))
    return st


def terms_of(net: Network, id: str) -> list[int]:
    node = net[id]
    return [node.log_term(i) for i in range(1, node.status().last_index + 1)]


def msgs(out: list[Message], t: MessageType) -> list[Message]:
    return [m for m in out if m.type == t]


# ---------------------------------------------------------------- §5.1 terms
@pytest.mark.parametrize("role", ["follower", "candidate", "leader"])
def test_higher_term_makes_any_role_a_follower(role: str) -> None:
    """§5.1: a server that sees a larger term updates its term and reverts to follower
    (candidate and leader step down)."""
    net = net3()
    if role == "candidate":
        net["a"].campaign()
        net.drain("a")
        assert net["a"].role == Role.CANDIDATE
    elif role == "leader":
        net.elect("a")
    term = net["a"].term
    net["a"].step(Message(MT.APPEND, "g", "b", "a", term + 5, log_term=0, index=0))
    assert net["a"].role == Role.FOLLOWER
    assert net["a"].term == term + 5
    assert net["a"].leader == "b"


def test_stale_term_request_is_rejected() -> None:
    """§5.1: a request with a stale term is rejected; the log is untouched and the reply
    carries the current term so the stale sender learns it."""
    net = Network(["a", "b", "c"])  # check-quorum on: stale appends are answered
    net.elect("a")
    net.propose("a", b"x")
    before = terms_of(net, "b")
    stale = Message(MT.APPEND, "g", "c", "b", 0, log_term=1, index=1, entries=(Entry(2, 0),))
    net["b"].step(dataclasses.replace(stale, term=net["b"].term - 1))
    out = net.drain("b")
    assert terms_of(net, "b") == before
    assert [(m.type, m.term, m.dst) for m in out] == [(MT.APPEND_RESP, net["b"].term, "c")]


# ---------------------------------------------------------------- §5.2 elections
def test_servers_start_as_followers() -> None:
    """§5.2: when servers start up, they begin as followers."""
    net = net3()
    assert {net[i].role for i in net.ids} == {Role.FOLLOWER}


def test_leader_sends_heartbeats_every_heartbeat_tick() -> None:
    """§5.2: leaders send periodic heartbeats (AppendEntries with no entries) to all
    followers to maintain their authority."""
    net = net3(heartbeat_tick=2)
    net.elect("a")
    net.tick("a")
    assert msgs(net.drain("a"), MT.HEARTBEAT) == []
    net.tick("a")
    hbs = msgs(net.drain("a"), MT.HEARTBEAT)
    assert sorted(m.dst for m in hbs) == ["b", "c"]
    assert all(not m.entries for m in hbs)


def test_follower_times_out_and_starts_election() -> None:
    """§5.2: a follower that receives no communication over the election timeout becomes
    a candidate: increments its term, votes for itself, requests votes from all others."""
    net = net3(election_tick=10)
    for _ in range(2 * 10):
        net.tick("a")
    out = net.drain("a")
    assert net["a"].role == Role.CANDIDATE
    assert net["a"].term == 1
    assert net["a"].status().vote == "a"
    votes = msgs(out, MT.VOTE)
    assert sorted(m.dst for m in votes) == ["b", "c"]
    assert all(m.term == 1 for m in votes)


@pytest.mark.parametrize(
    ("size", "grants", "rejects", "role"),
    [
        (1, 0, 0, Role.LEADER),
        (3, 1, 0, Role.LEADER),
        (3, 0, 2, Role.FOLLOWER),
        (3, 0, 1, Role.CANDIDATE),
        (5, 2, 0, Role.LEADER),
        (5, 1, 1, Role.CANDIDATE),
        (5, 0, 3, Role.FOLLOWER),
    ],
)
def test_candidate_wins_with_majority_of_votes(
    size: int, grants: int, rejects: int, role: Role
) -> None:
    """§5.2: a candidate wins with votes from a majority of the full cluster, steps down
    once a majority rejected it, and otherwise keeps waiting."""
    ids = [f"n{i}" for i in range(size)]
    net = Network(ids, **PLAIN)
    net["n0"].campaign()
    net.drain("n0")
    voters = iter(ids[1:])
    for granted, count in ((True, grants), (False, rejects)):
        for _ in range(count):
            src = next(voters)
            resp = Message(MT.VOTE_RESP, "g", src, "n0", 1, reject=not granted)
            net["n0"].step(resp)
    assert net["n0"].role == role


def test_follower_votes_once_per_term_first_come_first_served() -> None:
    """§5.2 (Election Safety's foundation): each server votes for at most one candidate
    in a term, on a first-come-first-served basis; it repeats the same answer."""
    net = net3()
    b = net["b"]
    b.step(Message(MT.VOTE, "g", "a", "b", 1, log_term=0, index=0))
    b.step(Message(MT.VOTE, "g", "c", "b", 1, log_term=0, index=0))
    b.step(Message(MT.VOTE, "g", "a", "b", 1, log_term=0, index=0))
    out = msgs(net.drain("b"), MT.VOTE_RESP)
    assert [(m.dst, m.reject) for m in out] == [("a", False), ("c", True), ("a", False)]


def test_vote_survives_restart() -> None:
    """§5.2 with Figure 2's persistence rule: votedFor is persistent state, so a server
    that restarts cannot vote for a second candidate in the same term; the vote is in the
    very Ready whose messages grant it (persist before send)."""
    net = net3()
    net["b"].step(Message(MT.VOTE, "g", "a", "b", 1, log_term=0, index=0))
    rd = net["b"].ready()
    assert rd.hard_state is not None and rd.hard_state.vote == "a"
    assert msgs(list(rd.messages), MT.VOTE_RESP)[0].reject is False
    net.replicas["b"].persist(rd)
    net["b"].advance(rd)
    net.restart("b")
    net["b"].step(Message(MT.VOTE, "g", "c", "b", 1, log_term=0, index=0))
    assert msgs(net.drain("b"), MT.VOTE_RESP)[0].reject is True


def test_candidate_returns_to_follower_on_append_from_leader() -> None:
    """§5.2: a candidate that receives AppendEntries from a leader whose term is at least
    its own recognizes the leader and returns to follower."""
    net = net3()
    net["a"].campaign()
    net.drain("a")
    net["a"].step(Message(MT.APPEND, "g", "b", "a", 1, log_term=0, index=0))
    assert net["a"].role == Role.FOLLOWER
    assert net["a"].leader == "b"


def test_election_timeouts_are_randomized() -> None:
    """§5.2: election timeouts are chosen randomly from [T, 2T) so split votes are rare."""
    seen = set()
    for seed in range(40):
        net = Network(["a", "b", "c"], seed=seed, election_tick=10, **PLAIN)
        ticks = 0
        while net["a"].role == Role.FOLLOWER:
            net.tick("a")
            ticks += 1
        seen.add(ticks)
    assert min(seen) >= 10 and max(seen) < 20
    assert len(seen) > 5


def test_election_safety_under_random_ticks() -> None:
    """Election Safety, §5.2: at most one leader can be elected in a given term, however
    the timeouts interleave and messages are lost."""
    for seed in range(10):
        rng = random.Random(seed)
        net = Network([f"n{i}" for i in range(5)], seed=seed, **PLAIN)
        leaders: dict[int, str] = {}
        for _ in range(300):
            for i in net.ids:
                if rng.random() < 0.7:
                    net.tick(i)
            net.collect()
            batch, net.queue = net.queue, []
            for m in batch:
                if rng.random() > 0.2:
                    net.deliver(m)
            for i in net.ids:
                if net[i].role == Role.LEADER:
                    assert leaders.setdefault(net[i].term, i) == i
        assert leaders, "no leader was ever elected"


# ---------------------------------------------------------------- §5.3 replication
def test_leader_appends_then_replicates_with_prev_index_and_term() -> None:
    """§5.3: the leader appends the command to its log as a new entry, then issues
    AppendEntries carrying the preceding entry's index and term and its commit index."""
    net = net3()
    net.elect("a")
    index = net["a"].propose(b"cmd")
    out = msgs(net.drain("a"), MT.APPEND)
    assert sorted(m.dst for m in out) == ["b", "c"]
    for m in out:
        assert m.index == index - 1 and m.log_term == 1
        assert [e.data for e in m.entries] == [b"cmd"]
        assert m.commit == 1


def test_leader_append_only() -> None:
    """Leader Append-Only, §5.3: a leader never overwrites or deletes entries in its log,
    even when a follower sends it conflicting entries of an older term."""
    net = net3()
    net.elect("a")
    for i in range(3):
        net.propose("a", b"x%d" % i)
    before = terms_of(net, "a")
    old = Message(MT.APPEND, "g", "b", "a", 0, log_term=0, index=0, entries=(Entry(1, 0),))
    net["a"].step(old)
    net.stabilize()
    assert terms_of(net, "a")[: len(before)] == before
    assert net["a"].role == Role.LEADER


@pytest.mark.parametrize(
    ("size", "acks", "committed"),
    [(1, 0, True), (3, 0, False), (3, 1, True), (5, 1, False), (5, 2, True)],
)
def test_entry_commits_once_on_a_majority(size: int, acks: int, committed: bool) -> None:
    """§5.3: an entry is committed once the leader has replicated it on a majority."""
    ids = [f"n{i}" for i in range(size)]
    net = Network(ids, **PLAIN)
    net.elect("n0")
    index = net["n0"].propose(b"x")
    net.drain("n0")
    for src in ids[1 : 1 + acks]:
        net["n0"].step(Message(MT.APPEND_RESP, "g", src, "n0", 1, index=index))
    assert (net["n0"].status().commit >= index) is committed


def test_commit_covers_preceding_entries_and_reaches_followers() -> None:
    """§5.3: committing an entry commits all preceding entries; followers learn the commit
    index from later AppendEntries and apply in log order."""
    net = net3()
    net.elect("a")
    cut = net.cut("a", "c")
    for i in range(3):
        net.propose("a", b"x%d" % i)
    assert net.replicas["c"].data() == []
    net.filters.remove(cut)
    net.propose("a", b"last")
    for i in net.ids:
        assert net.replicas[i].data() == [b"x0", b"x1", b"x2", b"last"]


def test_follower_consistency_check_rejects_missing_prev() -> None:
    """§5.3: if the follower does not find an entry with the same index and term as the
    one preceding the new entries, it refuses them."""
    net = Network(["a", "b", "c"], **PLAIN)
    net.add("b", log_with([1, 1, 2], term=2))
    b = net["b"]
    b.step(Message(MT.APPEND, "g", "a", "b", 2, log_term=1, index=3, entries=(Entry(4, 2),)))
    b.step(Message(MT.APPEND, "g", "a", "b", 2, log_term=2, index=5, entries=(Entry(6, 2),)))
    b.step(Message(MT.APPEND, "g", "a", "b", 2, log_term=2, index=3, entries=(Entry(4, 2),)))
    out = msgs(net.drain("b"), MT.APPEND_RESP)
    assert [m.reject for m in out] == [True, True, False]
    assert terms_of(net, "b") == [1, 1, 2, 2]


def test_follower_deletes_conflicting_suffix() -> None:
    """§5.3: if an existing entry conflicts with a new one (same index, different term),
    the follower deletes it and all that follow it, then appends the new entries."""
    net = Network(["a", "b", "c"], **PLAIN)
    net.add("b", log_with([1, 1, 2, 2, 2], term=2))
    ents = (Entry(3, 3, data=b"n3"), Entry(4, 3, data=b"n4"))
    net["b"].step(Message(MT.APPEND, "g", "a", "b", 3, log_term=1, index=2, entries=ents))
    net.drain("b")
    assert terms_of(net, "b") == [1, 1, 3, 3]


FIGURE_7 = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7))
def test_leader_brings_follower_logs_in_line(case: str) -> None:
    """§5.3, Figure 7: whatever the follower's log (missing entries, extra uncommitted
    entries, or both), the leader's AppendEntries consistency check finds the last point of
    agreement and the follower's log ends up identical to the leader's."""
    leader_terms = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
    net = Network(["ldr", "fol", "helper"], **PLAIN)
    net.add("ldr", log_with(leader_terms, term=7))
    net.add("helper", log_with(leader_terms, term=7))
    net.add("fol", log_with(FIGURE_7[case], term=7))
    net.cut("fol", "ldr")
    net.elect("ldr")  # wins with the helper's vote; term 8
    net.heal()
    net.tick("ldr")  # a heartbeat round un-pauses the probe of the follower
    net.stabilize()
    net.propose("ldr", b"after")
    assert net["ldr"].term == 8
    assert terms_of(net, "fol") == terms_of(net, "ldr") == [*leader_terms, 8, 8]


def test_log_matching() -> None:
    """Log Matching, §5.3: if two logs contain an entry with the same index and term, the
    logs are identical in all entries up through that index."""
    for seed in range(8):
        rng = random.Random(seed)
        net = Network([f"n{i}" for i in range(5)], seed=seed, **PLAIN)
        for step in range(150):
            net.heal()
            if rng.random() < 0.3:
                net.isolate(rng.choice(net.ids))
            leader = net.leader()
            if leader is None or rng.random() < 0.05:
                net.elect(rng.choice(net.ids))
            else:
                net.propose(leader, b"%d" % step)
            net.tick_all()
        logs = {i: net.replicas[i].storage for i in net.ids}
        for a in net.ids:
            for b in net.ids:
                la, lb = logs[a], logs[b]
                top = min(la.last_index(), lb.last_index())
                for i in range(top, 0, -1):
                    if la.term(i) == lb.term(i):
                        assert la.entries(1, i + 1, 1 << 30) == lb.entries(1, i + 1, 1 << 30)
                        break


# ---------------------------------------------------------------- §5.4 safety
@pytest.mark.parametrize(
    ("voter_log", "cand_last", "granted"),
    [
        ([1, 1], (2, 1), True),  # same last term, same length
        ([1, 1], (3, 1), True),  # same term, longer
        ([1, 1], (1, 1), False),  # same term, shorter
        ([1, 2], (1, 3), True),  # higher last term wins even if shorter
        ([1, 2], (5, 1), False),  # lower last term loses even if longer
    ],
)
def test_vote_only_for_up_to_date_log(
    voter_log: list[int], cand_last: tuple[int, int], granted: bool
) -> None:
    """§5.4.1 election restriction: a voter denies its vote if its own log is more
    up-to-date (later last term, or same last term and longer)."""
    net = Network(["a", "b", "c"], **PLAIN)
    net.add("b", log_with(voter_log, term=3))
    index, log_term = cand_last
    net["b"].step(Message(MT.VOTE, "g", "a", "b", 4, log_term=log_term, index=index))
    out = msgs(net.drain("b"), MT.VOTE_RESP)
    assert out[0].reject is (not granted)


def test_leader_completeness_new_leader_has_committed_entries() -> None:
    """Leader Completeness, §5.4: a leader elected for a term holds every entry committed
    in earlier terms: a node missing a committed entry cannot win."""
    net = Network(["a", "b", "c", "d", "e"], **PLAIN)
    net.elect("a")
    net.isolate("e")
    net.propose("a", b"committed")  # on a, b, c, d (a majority)
    committed = net["a"].status().commit
    net.heal()
    net.isolate("a")
    net.elect("e")  # e lacks the entry: everyone with it refuses
    assert net["e"].role != Role.LEADER
    net.elect("b")
    assert net["b"].role == Role.LEADER
    for i in range(1, committed + 1):
        assert net["b"].log_term(i) == net["a"].log_term(i)


def test_only_current_term_entries_commit_by_counting_figure_8() -> None:
    """§5.4.2, Figure 8: a leader may not conclude that an entry of a previous term is
    committed once it is on a majority; here such an entry is later overwritten, and the
    rule is what kept it from being applied."""
    ids = ["s1", "s2", "s3", "s4", "s5"]
    net = Network(ids, **PLAIN)
    net.elect("s1")  # term 1, no-op at index 1 everywhere
    # (a) s1 replicates entry 2 (of its term) to s2 only.
    net.filters.append(lambda m: m.src == "s1" and m.dst in ("s3", "s4", "s5"))
    net.propose("s1", b"old")
    assert net["s2"].log_term(2) == 1
    # (b) s1 crashes; s5 wins term 2 with s3, s4 and takes a different entry 2, alone.
    net.heal()
    net.isolate("s1")
    net.restart("s1")
    net.filters.append(lambda m: m.src == "s5" and m.type == MT.APPEND)
    net.elect("s5")
    assert net["s5"].role == Role.LEADER and net["s5"].log_term(2) == 2
    # (c) s5 crashes; s1 returns, wins term 3 and copies entry 2 (term 1) to s2 and s3 —
    # a majority holds it, but the entry of s1's own term (index 3) reaches nobody.
    net.heal()
    net.isolate("s5")
    net.restart("s5")
    net.filters.append(lambda m: m.src == "s1" and m.dst == "s4" and m.type == MT.APPEND)

    def only_old_entries(m: Message) -> Message | None:
        if m.type == MT.APPEND and m.src == "s1":
            return dataclasses.replace(m, entries=tuple(e for e in m.entries if e.index <= 2))
        return m

    net.transform = only_old_entries
    while net["s1"].role != Role.LEADER:
        net.elect("s1")
    assert net["s1"].term == 3
    assert net["s3"].log_term(2) == 1 and net["s2"].log_term(2) == 1
    assert net["s1"].status().progress["s3"].match == 2
    assert net["s1"].status().commit == 1, "committed an older-term entry by counting"
    # (d) s1 crashes; s5 can still win (its last term 2 beats their 1) and overwrite it.
    net.transform = None
    net.heal()
    net.isolate("s1")
    net.restart("s1")
    while net["s5"].role != Role.LEADER:
        net.elect("s5")
    net.propose("s5", b"new")
    for i in ("s2", "s3", "s4", "s5"):
        assert net[i].log_term(2) == 2
    for i in ids:
        assert b"old" not in net.replicas[i].data()


def test_state_machine_safety() -> None:
    """State Machine Safety, §5.4.3: if a server has applied an entry at an index, no
    other server ever applies a different entry at that index, across leader changes,
    partitions and restarts."""
    for seed in range(6):
        rng = random.Random(seed)
        net = Network([f"n{i}" for i in range(5)], seed=seed, **PLAIN)
        for step in range(200):
            if rng.random() < 0.2:
                net.heal()
                net.isolate(rng.choice(net.ids))
            if rng.random() < 0.05:
                net.restart(rng.choice(net.ids))
            leader = net.leader()
            if leader is not None and rng.random() < 0.7:
                net.propose(leader, b"s%d" % step)
            net.tick_all()
        net.heal()
        net.tick_all(40)
        applied = [net.replicas[i].applied for i in net.ids]
        longest = max(applied, key=len)
        for a in applied:
            assert [(e.index, e.term, e.data) for e in a] == [
                (e.index, e.term, e.data) for e in longest[: len(a)]
            ]
