"""The core's extensions to the paper's basic algorithm: pre-vote, check-quorum and the
leader lease (thesis §9.6, §6.2, §4.2.3), pipelining and batching, fast backtracking,
snapshots (§7), leadership transfer (thesis §3.10), single-server membership changes and
learners (thesis §4), ReadIndex (thesis §6.4), and how proposals are refused."""

from __future__ import annotations

import pytest

from raftstream.raft.core import (
    ConfChangePendingError,
    ProgressState,
    TransferInProgressError,
)
from raftstream.raft.errors import (
    InvalidArgumentError,
    InvariantError,
    LimitError,
    NoLeaderError,
    NotLeaderError,
)
from raftstream.raft.storage import MemoryGroupLog
from raftstream.raft.types import (
    ConfChange,
    ConfChangeType,
    Entry,
    HardState,
    Message,
    MessageType,
    ReadState,
    Role,
)
from tests.support.sim_net import Network

MT = MessageType


def sent(net: Network, t: MessageType, src: str | None = None, dst: str | None = None):
    return [
        m
        for m in net.sent
        if m.type == t and (src is None or m.src == src) and (dst is None or m.dst == dst)
    ]


def compact(net: Network, id: str) -> int:
    """Have ``id``'s state machine snapshot at its applied index and compact its log."""
    rep = net.replicas[id]
    applied = rep.node.status().applied
    snap = rep.node.make_snapshot(applied, b"|".join(rep.data()))
    rep.storage.compact(snap)
    return applied


# ---------------------------------------------------------------- pre-vote, check-quorum
@pytest.mark.parametrize("pre_vote", [True, False])
def test_pre_vote_keeps_a_rejoining_node_from_disrupting(pre_vote: bool) -> None:
    """Pre-vote (thesis §9.6): a node cut off from the group campaigns without raising its
    term, so when it comes back the leader keeps leading. Without pre-vote its term has
    grown and its return deposes the leader."""
    net = Network(["a", "b", "c"], pre_vote=pre_vote, check_quorum=False)
    net.elect("a")
    term = net["a"].term
    net.isolate("c")
    for _ in range(60):
        net.tick("c")
        net.stabilize()
    assert (net["c"].term == term) is pre_vote
    net.heal()
    net.tick_all(30)
    assert (net["a"].role == Role.LEADER and net["a"].term == term) is pre_vote


@pytest.mark.parametrize("check_quorum", [True, False])
def test_check_quorum_isolated_leader_steps_down(check_quorum: bool) -> None:
    """Check-quorum (thesis §6.2): a leader that has not heard from a quorum within an
    election timeout steps down."""
    net = Network(["a", "b", "c"], check_quorum=check_quorum, election_tick=10)
    net.elect("a")
    net.isolate("a")
    for _ in range(20):
        net.tick("a")
        net.stabilize()
    assert (net["a"].role == Role.FOLLOWER) is check_quorum


def test_leader_lease_followers_ignore_disruptive_votes() -> None:
    """Leader lease (thesis §4.2.3): a follower that heard from its leader within the
    election timeout ignores a vote request from a higher term."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    term = net["b"].term
    net["b"].step(Message(MT.VOTE, "g", "c", "b", term + 1, log_term=9, index=99))
    assert net.drain("b") == []
    assert net["b"].term == term and net["b"].leader == "a"


def test_stale_leader_learns_newer_term_from_rejected_heartbeat() -> None:
    """With check-quorum, a follower answers a stale leader's append with its term, so a
    leader that missed an election steps down as soon as it is heard."""
    net = Network(["a", "b", "c"], check_quorum=False)
    net.elect("a")
    net.isolate("a")
    net.tick_all(40)
    new = net.leader()
    assert new in ("b", "c")
    net.heal()
    net.tick("a")
    net.stabilize()
    assert net["a"].role == Role.FOLLOWER and net["a"].term == net[new].term
    net.tick_all(2)
    assert net["a"].leader == new


# ---------------------------------------------------------------- pipelining, batching
def _replicating_net(**kw: object) -> Network:
    net = Network(["a", "b", "c"], **kw)  # type: ignore[arg-type]
    net.elect("a")
    net.propose("a", b"warm")
    assert net["a"].status().progress["b"].state == ProgressState.REPLICATE
    return net


def test_pipelining_bounded_by_inflight_msgs_max() -> None:
    """Many appends go out without waiting for acks, at most inflight_msgs_max of them."""
    net = _replicating_net(inflight_msgs_max=3)
    before = len(sent(net, MT.APPEND, "a", "b"))
    net.filters.append(lambda m: m.type == MT.APPEND_RESP)
    for i in range(10):
        net.propose("a", b"p%d" % i)
    with_entries = [m for m in sent(net, MT.APPEND, "a", "b")[before:] if m.entries]
    assert len(with_entries) == 3  # then the pipeline is full
    net.heal()
    net.tick("a")
    net.stabilize()
    net.propose("a", b"end")
    assert net.replicas["b"].data()[-1] == b"end" and len(net.replicas["b"].data()) == 12


def test_pipelining_bounded_by_inflight_bytes_max() -> None:
    net = _replicating_net(inflight_msgs_max=100, inflight_bytes_max=25)
    before = len(sent(net, MT.APPEND, "a", "b"))
    net.filters.append(lambda m: m.type == MT.APPEND_RESP)
    for _ in range(10):
        net.propose("a", b"0123456789")
    payloads = [m for m in sent(net, MT.APPEND, "a", "b")[before:] if m.entries]
    assert len(payloads) == 3  # 10 + 10 < 25 <= 30 bytes in flight


@pytest.mark.parametrize("notices", [True, False])
def test_without_commit_notices_followers_learn_the_commit_from_the_next_heartbeat(
    notices: bool,
) -> None:
    """RaftConfig.commit_notices: a new commit index reaches a follower that has everything
    at once in an empty append (etcd's way), or, with notices off, in its next heartbeat.
    What commits on the leader, and when, is the same either way (§5.3)."""
    net = _replicating_net(commit_notices=notices)
    net.tick("a")  # the warm-up entry's commit reaches everyone
    net.stabilize()
    before = len(sent(net, MT.APPEND, "a", "b"))
    index = net.propose("a", b"x")
    assert net["a"].status().commit == index
    empty = [m for m in sent(net, MT.APPEND, "a", "b")[before:] if not m.entries]
    assert len(empty) == (1 if notices else 0)
    assert (net["b"].status().commit == index) is notices
    net.tick("a")  # heartbeat_tick=1: a heartbeat carries the commit index
    net.stabilize()
    assert net["b"].status().commit == index
    assert net.replicas["b"].data()[-1] == b"x"


@pytest.mark.parametrize(("append_bytes_max", "messages"), [(10_000, 1), (100, 5)])
def test_proposals_between_readies_are_batched(append_bytes_max: int, messages: int) -> None:
    """Proposals made between two Readies leave in as few appends as append_bytes_max
    allows (each append carries at most that many payload bytes)."""
    net = _replicating_net(append_bytes_max=append_bytes_max)
    before = len(sent(net, MT.APPEND, "a", "b"))
    for i in range(50):
        net["a"].propose(b"%010d" % i)
    net.stabilize()
    appends = [m for m in sent(net, MT.APPEND, "a", "b")[before:] if m.entries]
    assert len(appends) == messages
    assert all(sum(len(e.data) for e in m.entries) <= append_bytes_max for m in appends)
    assert sum(len(m.entries) for m in appends) == 50


def test_propose_many_appends_consecutive_entries_in_one_round() -> None:
    net = _replicating_net()
    before = len(sent(net, MT.APPEND, "a", "b"))
    last = net["a"].propose_many([b"m%d" % i for i in range(20)])
    net.stabilize()
    assert len([m for m in sent(net, MT.APPEND, "a", "b")[before:] if m.entries]) == 1
    assert net.replicas["b"].data()[-20:] == [b"m%d" % i for i in range(20)]
    assert net.replicas["b"].applied[-1].index == last
    with pytest.raises(NotLeaderError):
        net["b"].propose_many([b"x"])


def test_fast_backtracking_skips_a_term_per_round_trip() -> None:
    """On a rejected append the follower hints its last index with a term no greater than
    the leader's; the leader skips whole terms of conflicting entries, so a follower 50
    entries off needs a couple of round trips, not 50."""

    def log(terms: list[int], term: int) -> MemoryGroupLog:
        st = MemoryGroupLog()
        st.append([Entry(i + 1, t, data=b"x") for i, t in enumerate(terms)])
        st.set_hard_state(HardState(term))
        return st

    net = Network(["ldr", "fol", "helper"], pre_vote=False, check_quorum=False)
    net.add("ldr", log([1, 1] + [3] * 50, 3))
    net.add("helper", log([1, 1] + [3] * 50, 3))
    net.add("fol", log([1, 1] + [2] * 60, 2))
    net.elect("ldr")
    net.tick("ldr")
    net.stabilize()
    rejects = [m for m in sent(net, MT.APPEND_RESP, "fol") if m.reject]
    assert 1 <= len(rejects) <= 3
    for i in range(1, 54):
        assert net["fol"].log_term(i) == net["ldr"].log_term(i)


# ---------------------------------------------------------------- snapshots
def test_lagging_follower_gets_a_snapshot() -> None:
    """§7: a follower that needs compacted entries gets the leader's snapshot, installs it
    from its Ready, then catches up from the log."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.isolate("c")
    for i in range(20):
        net.propose("a", b"s%d" % i)
    index = compact(net, "a")
    net.heal()
    net.tick("a")
    net.stabilize()
    snaps = sent(net, MT.SNAPSHOT, "a", "c")
    assert len(snaps) == 1 and snaps[0].snapshot is not None
    assert [s.meta.index for s in net.replicas["c"].installed] == [index]
    assert net.replicas["c"].storage.snapshot().meta.conf.voters == ("a", "b", "c")
    net.propose("a", b"after")
    assert net.replicas["c"].data() == [b"after"]
    assert net["c"].status().commit == net["a"].status().commit


def test_lost_snapshot_is_sent_again() -> None:
    net = Network(["a", "b", "c"], election_tick=10)
    net.elect("a")
    net.isolate("c")
    for i in range(5):
        net.propose("a", b"s%d" % i)
    compact(net, "a")
    net.heal()
    drop_first = [True]

    def lose_one_snapshot(m: Message) -> Message | None:
        if m.type == MT.SNAPSHOT and drop_first[0]:
            drop_first[0] = False
            return None
        return m

    net.transform = lose_one_snapshot
    net.tick_all(30)
    assert not drop_first[0]
    assert len(net.replicas["c"].installed) == 1
    assert net["c"].status().commit == net["a"].status().commit


def test_make_snapshot_only_at_applied_index() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    applied = net["a"].status().applied
    with pytest.raises(InvalidArgumentError):
        net["a"].make_snapshot(applied + 1, b"")
    snap = net["a"].make_snapshot(applied, b"state")
    assert (snap.meta.index, snap.meta.term, snap.data) == (applied, 1, b"state")


# ---------------------------------------------------------------- leadership transfer
def test_transfer_to_caught_up_follower() -> None:
    """Thesis §3.10: once the target is caught up the leader sends TIMEOUT_NOW and the
    target wins an election at once (voters skip the lease for it)."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    term = net["a"].term
    net["a"].transfer_leadership("b")
    net.stabilize()
    assert len(sent(net, MT.TIMEOUT_NOW, "a", "b")) == 1
    assert net["b"].role == Role.LEADER and net["b"].term == term + 1
    assert net["a"].role == Role.FOLLOWER and net["a"].leader == "b"


def test_transfer_to_lagging_follower_catches_it_up_first() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.cut("a", "c")
    for i in range(5):
        net.propose("a", b"x%d" % i)
    net.heal()
    net["a"].transfer_leadership("c")
    net.stabilize()
    if net["c"].role != Role.LEADER:  # the probe waits for a heartbeat round
        net.tick("a")
        net.stabilize()
    assert net["c"].role == Role.LEADER
    assert net.replicas["c"].data()[:5] == [b"x%d" % i for i in range(5)]


def test_transfer_refuses_proposals_then_aborts_after_election_timeout() -> None:
    net = Network(["a", "b", "c"], election_tick=10)
    net.elect("a")
    net.isolate("b")
    net["a"].transfer_leadership("b")
    with pytest.raises(TransferInProgressError) as exc:
        net["a"].propose(b"x")
    assert exc.value.retriable and exc.value.to == "b"
    for _ in range(10):
        net.tick("a")
    net.stabilize()
    assert net["a"].status().lead_transferee == ""
    assert net["a"].propose(b"x") > 0


def test_transfer_target_must_be_a_voter() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    with pytest.raises(InvalidArgumentError):
        net["a"].transfer_leadership("zz")


# ---------------------------------------------------------------- membership
def _add_joiner(net: Network, id: str) -> None:
    """A new node starts with the group's bootstrap membership (which does not include it,
    so it never campaigns) and an empty log; it learns the rest from the leader."""
    net.add(id, MemoryGroupLog())
    net.ids.append(id)


def test_learner_receives_the_log_but_never_votes_or_counts() -> None:
    """Thesis §4.2.1: a new server joins as a non-voting learner; it gets every entry but
    neither campaigns nor counts towards a quorum."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.propose("a", b"before")
    _add_joiner(net, "d")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    net.tick("a")
    net.stabilize()
    assert net["a"].status().conf.learners == ("d",)
    assert net.replicas["d"].data() == [b"before"]
    for _ in range(50):
        net.tick("d")
    assert not [m for m in net.drain("d") if m.type in (MT.VOTE, MT.PRE_VOTE)]
    net.cut("a", "b")
    net.cut("a", "c")
    index = net.propose("a", b"needs-a-voter")
    assert net["a"].status().commit < index  # a + learner d is no quorum
    net.heal()
    net.tick("a")
    net.stabilize()
    assert net["a"].status().commit >= index


def test_promote_learner_then_it_counts() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    _add_joiner(net, "d")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_VOTER, "d"))
    net.stabilize()
    net.tick("a")
    net.stabilize()
    assert net["a"].status().conf.voters == ("a", "b", "c", "d")
    assert net["d"].status().conf.voters == ("a", "b", "c", "d")
    net.cut("a", "b")
    index = net.propose("a", b"x")  # a, c, d: 3 of 4
    assert net["a"].status().commit >= index


def test_learner_lease_expires_so_it_can_vote_once_promoted() -> None:
    """A node that cannot campaign still lets its leader lease run out: a learner promoted
    by a leader that then died must be able to vote for the next one."""
    net = Network(["a", "b", "c"], election_tick=10)
    net.elect("a")
    _add_joiner(net, "d")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    net.isolate("a")
    for _ in range(10):
        net.tick("d")
    term = net["d"].term
    for _ in range(30):  # from now on, every request is heard
        net.tick("d")
        net["d"].step(Message(MT.PRE_VOTE, "g", "b", "d", term + 1, log_term=9, index=99))
        out = [m for m in net.drain("d") if m.type == MT.PRE_VOTE_RESP]
        assert [(m.dst, m.reject) for m in out] == [("b", False)]


def test_snapshot_arriving_mid_ready_wins_over_older_conf_change() -> None:
    """A snapshot received between ready() and advance() holds a later membership than
    the conf change that Ready applies: the change must not be replayed on top of it, and
    a local snapshot taken meanwhile records the membership as of its own index."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    i = net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    net["a"].propose_conf_change(ConfChange(ConfChangeType.REMOVE, "d"))
    net.stabilize()
    net.propose("a", b"x")
    compact(net, "a")
    snap = net.replicas["a"].storage.snapshot()
    # c restarts with the change at i committed but not applied yet.
    st = MemoryGroupLog()
    st.append(net.replicas["b"].storage.entries(1, i + 1, 1 << 20))
    st.set_hard_state(HardState(net["a"].term, "", i))
    rep = net.add("c", st, applied=i - 1)
    rd = rep.node.ready()
    assert [e.index for e in rd.committed_entries] == [i]
    rep.node.step(Message(MT.SNAPSHOT, "g", "a", "c", net["a"].term, snapshot=snap))
    rep.persist(rd)
    rep.node.advance(rd)
    local = rep.node.make_snapshot(i, b"")
    assert local.meta.conf.learners == ("d",)  # as of index i
    net.stabilize()
    assert rep.installed == [snap]
    assert net["c"].status().conf == snap.meta.conf == net["a"].status().conf
    assert net["c"].status().conf.learners == ()


def test_election_timeout_with_snapshot_pending_install() -> None:
    """A follower whose election timer fires while a received snapshot waits in its
    Ready still campaigns (the snapshot's membership is already in force)."""
    net = Network(["a", "b", "c"], election_tick=10)
    net.elect("a")
    net.isolate("c")
    for i in range(5):
        net.propose("a", b"x%d" % i)
    compact(net, "a")
    snap = net.replicas["a"].storage.snapshot()
    c = net["c"]
    c.step(Message(MT.SNAPSHOT, "g", "a", "c", net["a"].term, snapshot=snap))
    for _ in range(40):
        c.tick()
    assert c.role in (Role.PRE_CANDIDATE, Role.CANDIDATE)
    net.heal()
    net.stabilize()
    assert net.replicas["c"].installed == [snap]


def test_one_conf_change_at_a_time() -> None:
    """Thesis §4.1: a new change may start only once the previous one is applied."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    with pytest.raises(ConfChangePendingError):
        net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))
    net.stabilize()
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "e"))


def test_removing_voters_shrinks_the_quorum() -> None:
    net = Network(["a", "b", "c", "d", "e"])
    net.elect("a")
    for node in ("d", "e"):
        net["a"].propose_conf_change(ConfChange(ConfChangeType.REMOVE, node))
        net.stabilize()
    assert net["a"].status().conf.voters == ("a", "b", "c")
    net.isolate("c")
    net.isolate("d")
    net.isolate("e")
    index = net.propose("a", b"x")  # a and b: 2 of 3 (it would be 2 of 5 before)
    assert net["a"].status().commit >= index


def test_removed_leader_steps_down_and_the_rest_elect() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.REMOVE, "a"))
    net.stabilize()
    assert net["a"].role == Role.FOLLOWER
    net.tick_all(40)
    leader = net.leader()
    assert leader in ("b", "c")
    assert net[leader].status().conf.voters == ("b", "c")


def test_conf_change_survives_restart() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    net.restart("b")  # replays the log: the change is in it
    net.stabilize()
    assert net["b"].status().conf.learners == ("d",)


def test_joiner_catches_up_from_snapshot_with_membership() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    for i in range(5):
        net.propose("a", b"x%d" % i)
    _add_joiner(net, "d")
    net.isolate("d")
    net["a"].propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, "d"))
    net.stabilize()
    compact(net, "a")
    net.heal()
    net.tick("a")
    net.stabilize()
    assert len(net.replicas["d"].installed) == 1
    assert net["d"].status().conf == net["a"].status().conf


# ---------------------------------------------------------------- ReadIndex
def test_leader_read_index_after_heartbeat_round() -> None:
    """Thesis §6.4: the leader records its commit index, confirms it still leads with a
    heartbeat round carrying the read's context, then answers."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.propose("a", b"x")
    commit = net["a"].status().commit
    net["a"].read_index(b"r1")
    out = net.drain("a")
    assert net.replicas["a"].read_states == []
    assert {m.context for m in out if m.type == MT.HEARTBEAT} == {b"r1"}
    net.queue.extend(out)
    net.stabilize()
    assert net.replicas["a"].read_states == [ReadState(commit, b"r1")]


def test_isolated_leader_cannot_answer_reads() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.isolate("a")
    net["a"].read_index(b"r1")
    net.stabilize()
    net.tick("a")
    net.stabilize()
    assert net.replicas["a"].read_states == []


def test_read_index_waits_for_first_commit_of_the_term() -> None:
    """A new leader's commit index may lag until its no-op commits; reads wait for it."""
    net = Network(["a", "b", "c"])
    net.filters.append(lambda m: m.type == MT.APPEND_RESP)
    net.elect("a")
    net["a"].read_index(b"r1")
    net.stabilize()
    assert net.replicas["a"].read_states == []
    net.heal()
    net.tick("a")
    net.stabilize()
    net.tick("a")
    net.stabilize()
    [rs] = net.replicas["a"].read_states
    assert rs.context == b"r1" and rs.index >= 1 and net["a"].log_term(rs.index) == 1


def test_follower_read_index_goes_through_the_leader() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.propose("a", b"x")
    net["b"].read_index(b"f1")
    net.stabilize()
    assert net.replicas["b"].read_states == [ReadState(net["a"].status().commit, b"f1")]
    assert len(sent(net, MT.READ_INDEX, "b", "a")) == 1


def test_single_voter_reads_at_once() -> None:
    net = Network(["a"])
    net.elect("a")
    net["a"].read_index(b"r")
    net.stabilize()
    assert net.replicas["a"].read_states == [ReadState(1, b"r")]


def test_read_index_without_leader_fails_fast() -> None:
    net = Network(["a", "b", "c"])
    with pytest.raises(NoLeaderError):
        net["a"].read_index(b"r")


# ---------------------------------------------------------------- proposals
def test_follower_refuses_proposal_with_leader_hint() -> None:
    net = Network(["a", "b", "c"])
    net.elect("a")
    with pytest.raises(NotLeaderError) as exc:
        net["b"].propose(b"x")
    assert exc.value.leader == "a" and exc.value.retriable


def test_proposal_without_leader_fails_fast() -> None:
    net = Network(["a", "b", "c"])
    with pytest.raises(NoLeaderError):
        net["a"].propose(b"x")
    net["a"].campaign()
    with pytest.raises(NoLeaderError):
        net["a"].propose(b"x")


def test_leader_accepts_forwarded_proposals() -> None:
    """A host may forward proposals in a PROPOSE message; the leader appends them (only
    normal commands: a forwarded configuration change is not honoured)."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    fwd = (Entry(0, 0, data=b"f1"), Entry(0, 0, data=b"f2"))
    net["a"].step(Message(MT.PROPOSE, "g", "b", "a", net["a"].term, entries=fwd))
    net.stabilize()
    assert net.replicas["c"].data() == [b"f1", b"f2"]


def test_empty_proposal_is_refused() -> None:
    net = Network(["a"])
    net.elect("a")
    with pytest.raises(InvalidArgumentError):
        net["a"].propose(b"")
    with pytest.raises(InvalidArgumentError):
        net["a"].propose_many([b"x", b""])


def test_uncommitted_bytes_are_bounded() -> None:
    net = Network(["a", "b", "c"], uncommitted_bytes_max=100)
    net.elect("a")
    net.isolate("a")
    accepted = 0
    with pytest.raises(LimitError) as info:
        for _ in range(10):
            net["a"].propose(b"x" * 30)
            accepted += 1
    assert accepted == 3
    # The limit by name and what it bounds (a user review: "uncommitted_bytes_max reached").
    assert info.value.details["limit"] == "uncommitted_bytes_max"
    assert "not committed yet" in str(info.value)
    net.heal()
    net.tick("a")
    net.stabilize()
    net["a"].propose(b"x" * 30)  # committed bytes free the budget


def test_ready_twice_without_advance_is_a_bug() -> None:
    net = Network(["a", "b", "c"])
    net["a"].campaign()
    net["a"].ready()
    with pytest.raises(InvariantError):
        net["a"].ready()


def test_restart_hands_out_committed_entries_after_applied() -> None:
    """After a restart, committed entries after the configured applied index are handed
    out again (and only those)."""
    net = Network(["a", "b", "c"])
    net.elect("a")
    for i in range(4):
        net.propose("a", b"x%d" % i)
    rep = net.replicas["b"]
    applied = rep.node.status().applied
    net.add("b", rep.storage, applied=applied - 2)
    net.stabilize()
    assert net.replicas["b"].data() == [b"x2", b"x3"]
