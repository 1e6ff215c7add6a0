"""Placement: fewest assets, then most free space, then name; tags; repairs after a removal.

Issue 5: "The meta leader validates, places replicas (fewest assets and most free space
first; placement.tags)" and "removing a dead peer makes the meta leader re-place its
replicas so the replica count is restored".
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.cluster.meta.entries import PeerRemove
from raftstream.cluster.meta.placement import (
    FREE_RANK_STEP_BYTES,
    NodeInfo,
    place,
    place_stream,
    plan_repairs,
    plan_stream_peers,
)
from raftstream.cluster.meta.state import MetaState, StreamAdded
from raftstream.engine.stream_config import Placement, StreamConfig
from raftstream.errors import (
    Code,
    ConflictError,
    InvalidArgumentError,
    LimitError,
    UnavailableError,
)
from tests.support.meta import ACC, add_stream

GIB = 1 << 30


def nodes(n: int, **kw: object) -> list[NodeInfo]:
    return [NodeInfo(name=f"n{i}", cluster="c1", **kw) for i in range(1, n + 1)]  # type: ignore[arg-type]


# -- the ranking ------------------------------------------------------------------------------


def test_fewest_assets_first() -> None:
    """Nodes hosting the fewest groups are chosen first; the first is the preferred leader."""
    chosen = place(replicas=2, nodes=nodes(4), assets={"n1": 3, "n2": 1, "n3": 0, "n4": 2})
    assert chosen == ("n3", "n2")


def test_then_most_free_space() -> None:
    """Among nodes with as many groups, the one with the most free space comes first."""
    ns = [
        NodeInfo(name="n1", cluster="c1", free_bytes=10 * GIB),
        NodeInfo(name="n2", cluster="c1", free_bytes=30 * GIB),
        NodeInfo(name="n3", cluster="c1", free_bytes=20 * GIB),
    ]
    assert place(replicas=2, nodes=ns, assets={}) == ("n2", "n3")
    assert place(replicas=2, nodes=ns, assets={"n2": 1}) == ("n3", "n1")


def test_free_space_within_one_step_ties_to_the_name() -> None:
    """Free space ranks in whole FREE_RANK_STEP_BYTES: nodes on one filesystem (or whose
    free space differs by the noise of ordinary writes) fall to the name, a stable order."""
    step = FREE_RANK_STEP_BYTES
    ns = [
        NodeInfo(name="n1", cluster="c1", free_bytes=5 * step + 1),
        NodeInfo(name="n2", cluster="c1", free_bytes=5 * step + step - 1),
        NodeInfo(name="n3", cluster="c1", free_bytes=6 * step),
    ]
    assert place(replicas=3, nodes=ns, assets={}) == ("n3", "n1", "n2")


def test_then_the_name_and_never_the_input_order() -> None:
    """Ties break by name, so every leader with the same view makes the same choice."""
    ns = nodes(5)
    expected = place(replicas=3, nodes=ns, assets={"n1": 1})
    assert expected == ("n2", "n3", "n4")
    for seed in range(5):
        shuffled = ns[:]
        random.Random(seed).shuffle(shuffled)
        assert place(replicas=3, nodes=shuffled, assets={"n1": 1}) == expected


def test_dead_and_excluded_nodes_are_not_chosen() -> None:
    ns = [*nodes(2), NodeInfo(name="n3", cluster="c1", live=False), *nodes(4)[3:]]
    assert place(replicas=2, nodes=ns, assets={}, exclude={"n1"}) == ("n2", "n4")


# -- placement constraints --------------------------------------------------------------------


def test_every_tag_must_be_on_the_node() -> None:
    """placement.tags: all the stream's tags must be among the node's tags."""
    ns = [
        NodeInfo(name="n1", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n2", cluster="c1", tags=frozenset({"ssd", "az1"})),
        NodeInfo(name="n3", cluster="c1", tags=frozenset({"az1"})),
        NodeInfo(name="n4", cluster="c1", tags=frozenset({"ssd", "az1", "big"})),
    ]
    chosen = place(replicas=2, nodes=ns, assets={}, placement=Placement(tags=("az1", "ssd")))
    assert chosen == ("n2", "n4")


def test_placement_cluster_restricts_the_nodes() -> None:
    ns = [*nodes(2), NodeInfo(name="e1", cluster="east"), NodeInfo(name="e2", cluster="east")]
    assert place(replicas=2, nodes=ns, assets={}, placement=Placement(cluster="east")) == (
        "e1",
        "e2",
    )
    with pytest.raises(InvalidArgumentError) as info:
        place(replicas=1, nodes=ns, assets={}, placement=Placement(cluster="west"))
    assert info.value.field == "placement.cluster"


def test_too_few_qualifying_nodes_is_invalid_and_names_what_leaves_them_out() -> None:
    """A request the cluster can never satisfy (R above the qualifying nodes, live or not):
    the replica count's fault when the cluster is too small, the placement's when it left
    out nodes that would have been enough (a review: a tag no node has named num_replicas)."""
    with pytest.raises(InvalidArgumentError) as info:
        place(replicas=4, nodes=nodes(3), assets={})
    assert info.value.field == "num_replicas"
    assert "4 replicas need 4 nodes; the cluster has 3" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        place(replicas=1, nodes=nodes(3), assets={}, placement=Placement(tags=("gpu",)))
    assert info.value.field == "placement.tags"
    assert "0 of the cluster's 3 do" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        place(replicas=4, nodes=nodes(3), assets={}, placement=Placement(tags=("gpu",)))
    assert info.value.field == "num_replicas"  # not enough nodes, tags or not


def test_growing_past_the_cluster_counts_the_whole_group() -> None:
    """R3 to R5 on three nodes: said for the five replicas asked for, not for the two still
    to place ("2 replicas need as many qualifying nodes; 0 do", a review)."""
    cfg = StreamConfig(name="S", subjects=("s",), num_replicas=5)
    with pytest.raises(InvalidArgumentError) as info:
        plan_stream_peers(config=cfg, current=("n1", "n2", "n3"), nodes=nodes(3), assets={})
    assert info.value.field == "num_replicas"
    assert "5 replicas need 5 nodes; the cluster has 3" in str(info.value)


def test_too_few_described_nodes_is_unavailable_while_a_live_one_is_unknown() -> None:
    """Tags or a placement cluster leaving too few nodes while a live node has not described
    itself yet (the leader has not heard it since a start): UNAVAILABLE, retriable, naming
    num_replicas (the SDK retries a create); once it is described, or only down nodes are
    unknown, the usual answer."""
    ssd = Placement(tags=("ssd",))
    unknown = NodeInfo(name="n3", cluster="c1", described=False)
    ns = [NodeInfo(name="n1", cluster="c1", tags=frozenset({"ssd"})), *nodes(2)[1:], unknown]
    with pytest.raises(UnavailableError) as info:
        place(replicas=2, nodes=ns, assets={}, placement=ssd)
    assert info.value.details["field"] == "num_replicas" and info.value.retriable
    with pytest.raises(UnavailableError):
        place(replicas=1, nodes=ns, assets={}, placement=Placement(cluster="east"))
    assert place(replicas=1, nodes=ns, assets={}, placement=ssd) == ("n1",)
    down = NodeInfo(name="n3", cluster="c1", described=False, live=False)
    with pytest.raises(InvalidArgumentError):
        place(replicas=2, nodes=[*ns[:2], down], assets={}, placement=ssd)
    with pytest.raises(InvalidArgumentError):  # without a constraint, unknown nodes qualify
        place(replicas=4, nodes=ns, assets={})


def test_too_few_live_nodes_is_resource_exhausted() -> None:
    """Enough nodes exist but too few are up: RESOURCE_EXHAUSTED naming num_replicas, a
    condition that passes when nodes come back."""
    ns = [*nodes(2), NodeInfo(name="n3", cluster="c1", live=False)]
    with pytest.raises(LimitError) as info:
        place(replicas=3, nodes=ns, assets={})
    assert info.value.code is Code.RESOURCE_EXHAUSTED
    assert info.value.details["field"] == "num_replicas"


@pytest.mark.parametrize("replicas", [0, -1, 6])
def test_replica_count_out_of_range(replicas: int) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        place(replicas=replicas, nodes=nodes(7), assets={})
    assert info.value.field == "num_replicas"


def test_node_names_are_validated() -> None:
    with pytest.raises(InvalidArgumentError):
        NodeInfo(name="a b", cluster="c1")


# -- properties -------------------------------------------------------------------------------

TAGS = ("ssd", "az1", "az2")
node_lists = st.lists(
    st.builds(
        lambda i, tags, free, live: NodeInfo(
            name=f"n{i}", cluster="c1", tags=frozenset(tags), free_bytes=free, live=live
        ),
        st.integers(0, 30),
        st.sets(st.sampled_from(TAGS)),
        st.integers(0, 8 * FREE_RANK_STEP_BYTES),
        st.booleans(),
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda n: n.name,
)


@settings(max_examples=300)
@given(
    ns=node_lists,
    replicas=st.integers(1, 5),
    tags=st.sets(st.sampled_from(TAGS), max_size=2),
    assets=st.dictionaries(st.sampled_from([f"n{i}" for i in range(31)]), st.integers(0, 9)),
)
def test_placement_returns_r_distinct_live_qualifying_nodes(
    ns: list[NodeInfo], replicas: int, tags: set[str], assets: dict[str, int]
) -> None:
    """Never two replicas on one node; always R live nodes carrying every tag; or an error
    exactly when fewer than R such nodes exist."""
    placement = Placement(tags=tuple(sorted(tags))) if tags else None
    ok = [n for n in ns if n.live and set(tags) <= n.tags]
    try:
        chosen = place(replicas=replicas, nodes=ns, assets=assets, placement=placement)
    except (InvalidArgumentError, LimitError):
        assert len(ok) < replicas
        return
    by_name = {n.name: n for n in ns}
    assert len(chosen) == replicas == len(set(chosen))
    assert all(by_name[c].live and set(tags) <= by_name[c].tags for c in chosen)
    # And no better-ranked qualifying node was passed over (free space in whole steps).
    step = FREE_RANK_STEP_BYTES
    rank = sorted(ok, key=lambda n: (assets.get(n.name, 0), -(n.free_bytes // step), n.name))
    assert chosen == tuple(n.name for n in rank[:replicas])


@settings(max_examples=200)
@given(
    n=st.integers(1, 9),
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=60),
    free=st.lists(st.integers(0, 100), min_size=9, max_size=9),
)
def test_placing_many_groups_stays_balanced(n: int, sizes: list[int], free: list[int]) -> None:
    """Without tags, after any number of placements no node hosts more than one group more
    than another (fewest assets first), whatever the free space says."""
    ns = [NodeInfo(name=f"n{i}", cluster="c1", free_bytes=free[i]) for i in range(n)]
    assets = {x.name: 0 for x in ns}
    for r in sizes:
        if r > n:
            continue
        for name in place(replicas=r, nodes=ns, assets=assets):
            assets[name] += 1
        assert max(assets.values()) - min(assets.values()) <= 1


# -- new streams ------------------------------------------------------------------------------


def test_a_new_stream_is_placed_from_the_meta_state() -> None:
    """The leader places a new stream by the state's assets, never on a removed peer, with
    the config's normalised replica count (0 means 1) and its placement."""
    state = MetaState()
    state.apply(add_stream("A", "a", peers=("n1", "n2")))
    state.apply(PeerRemove(peer="n3", ts_ns=2))
    assert place_stream(
        config=StreamConfig(name="B", num_replicas=2), state=state, nodes=nodes(5)
    ) == ("n4", "n5")
    assert place_stream(
        config=StreamConfig(name="B", num_replicas=0), state=state, nodes=nodes(4)
    ) == ("n4",)
    entry = add_stream("B", "b", peers=("n4", "n5"))
    assert isinstance(state.apply(entry), StreamAdded)
    with pytest.raises(InvalidArgumentError) as info:
        place_stream(config=StreamConfig(name="bad.name"), state=state, nodes=nodes(3))
    assert info.value.field == "name"


# -- updates ----------------------------------------------------------------------------------


def test_update_shrink_keeps_the_first_peers() -> None:
    """A lower replica count keeps the leading peers: the preferred leader stays."""
    cfg = StreamConfig(name="S", num_replicas=1)
    peers = plan_stream_peers(config=cfg, current=("n2", "n1", "n3"), nodes=nodes(3), assets={})
    assert peers == ("n2",)


def test_update_grow_adds_the_least_loaded_nodes() -> None:
    cfg = StreamConfig(name="S", num_replicas=3)
    peers = plan_stream_peers(
        config=cfg, current=("n2",), nodes=nodes(5), assets={"n1": 4, "n3": 1, "n4": 0, "n5": 2}
    )
    assert peers == ("n2", "n4", "n3")


def test_growing_with_too_few_live_nodes_counts_the_whole_group() -> None:
    """R1 -> R3 with one of the two other nodes down said "2 replicas need 2 live nodes;
    1 are up" while two nodes were up (a user review): the group's count, and its grammar."""
    ns = [*nodes(2), NodeInfo(name="n3", cluster="c1", live=False)]
    with pytest.raises(LimitError) as info:
        plan_stream_peers(
            config=StreamConfig(name="S", num_replicas=3), current=("n1",), nodes=ns, assets={}
        )
    assert "3 replicas need 3 live nodes; 2 are up" in str(info.value)
    with pytest.raises(LimitError) as info:
        place(replicas=2, nodes=[ns[0], ns[2]], assets={})
    assert "2 replicas need 2 live nodes; 1 is up" in str(info.value)


def test_update_replaces_peers_that_no_longer_qualify() -> None:
    """A placement change keeps the peers that still qualify and moves the others."""
    ns = [
        NodeInfo(name="n1", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n2", cluster="c1"),
        NodeInfo(name="n3", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n4", cluster="c1", tags=frozenset({"ssd"})),
    ]
    cfg = StreamConfig(name="S", num_replicas=2, placement=Placement(tags=("ssd",)))
    peers = plan_stream_peers(config=cfg, current=("n2", "n3"), nodes=ns, assets={"n3": 1})
    assert peers == ("n3", "n1")


def test_update_keeps_a_peer_that_is_briefly_down() -> None:
    """Liveness is not a reason to move data on an unrelated update."""
    ns = [*nodes(2), NodeInfo(name="n3", cluster="c1", live=False)]
    cfg = StreamConfig(name="S", num_replicas=3)
    assert plan_stream_peers(config=cfg, current=("n1", "n2", "n3"), nodes=ns, assets={}) == (
        "n1",
        "n2",
        "n3",
    )


def test_update_keeps_a_peer_not_described_yet() -> None:
    """A current peer whose tags the leader has not heard yet is not known to no longer
    qualify: it stays."""
    ns = [
        NodeInfo(name="n1", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n2", cluster="c1", described=False),
        NodeInfo(name="n3", cluster="c1", tags=frozenset({"ssd"})),
    ]
    cfg = StreamConfig(name="S", num_replicas=2, placement=Placement(tags=("ssd",)))
    assert plan_stream_peers(config=cfg, current=("n2", "n1"), nodes=ns, assets={}) == (
        "n2",
        "n1",
    )


def test_update_replaces_removed_peers() -> None:
    cfg = StreamConfig(name="S", num_replicas=2)
    peers = plan_stream_peers(
        config=cfg, current=("n1", "n2"), nodes=nodes(3), assets={}, removed={"n1"}
    )
    assert peers == ("n2", "n3")


# -- repairs after a peer removal -------------------------------------------------------------


def _state_after_removal(peer: str, *streams: tuple[str, tuple[str, ...]]) -> MetaState:
    state = MetaState()
    for i, (name, peers) in enumerate(streams):
        state.apply(add_stream(name, f"s.{i}", peers=peers))
    state.apply(PeerRemove(peer=peer, ts_ns=10))
    return state


def test_repairs_restore_every_replica_count() -> None:
    """Every group that had the removed peer gets a replacement; the plan applies cleanly
    and afterwards no group names the peer and none is short."""
    state = _state_after_removal(
        "n2",
        ("A", ("n1", "n2", "n3")),
        ("B", ("n2",)),
        ("C", ("n3", "n4", "n1")),
    )
    plan = plan_repairs(state=state, nodes=nodes(5), ts_ns=20)
    assert {e.stream for e in plan.entries} == {"A", "B"}
    assert plan.short == () and plan.stuck == ()
    for entry in plan.entries:
        state.apply(entry)
    state.check_invariants()
    assert state.streams_for_node("n2") == ()
    assert not any(sa.under_replicated for sa in state.all_streams())
    assert state.stream(ACC, "A").peers[:2] == ("n1", "n3")  # survivors keep their order
    assert plan_repairs(state=state, nodes=nodes(5), ts_ns=30).entries == ()  # level-triggered


def test_repairs_spread_over_the_cluster() -> None:
    """Replacements count what the plan already placed: they do not all land on one node."""
    streams = [(f"S{i}", ("n1",)) for i in range(6)]
    state = _state_after_removal("n1", *streams)
    plan = plan_repairs(state=state, nodes=nodes(4), ts_ns=20)
    landed = sorted(e.peers[0] for e in plan.entries)
    assert landed == ["n2", "n2", "n3", "n3", "n4", "n4"]


def test_repairs_respect_the_streams_placement() -> None:
    state = MetaState()
    cfg = StreamConfig(name="A", num_replicas=2, placement=Placement(tags=("ssd",)))
    state.apply(add_stream("A", peers=("n1", "n2"), placement=Placement(tags=("ssd",))))
    assert state.stream(ACC, "A").config == cfg.validate()
    state.apply(PeerRemove(peer="n1", ts_ns=5))
    ns = [
        # n1 still runs (an R2 group with a dead member could not move: see below)
        NodeInfo(name="n1", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n2", cluster="c1", tags=frozenset({"ssd"})),
        NodeInfo(name="n3", cluster="c1"),
        NodeInfo(name="n4", cluster="c1", tags=frozenset({"ssd"})),
    ]
    (entry,) = plan_repairs(state=state, nodes=ns, ts_ns=6).entries
    assert entry.peers == ("n2", "n4")


def test_no_replacement_leaves_the_group_short_but_without_the_removed_peer() -> None:
    """With no node to take a replica, the removed peer is still dropped and the group is
    reported short; an R1 group no live node qualifies for is reported stuck (no entry)."""
    state = MetaState()
    state.apply(add_stream("A", "a", peers=("n1", "n2", "n3")))
    state.apply(add_stream("B", "b", peers=("n3",), placement=Placement(tags=("gpu",))))
    state.apply(PeerRemove(peer="n3", ts_ns=10))
    plan = plan_repairs(state=state, nodes=nodes(2), ts_ns=20)
    (entry,) = plan.entries
    assert entry.stream == "A" and entry.peers == ("n1", "n2")
    assert plan.short == ("S:$G:A",) and plan.stuck == ("S:$G:B",)


def test_a_group_that_lost_a_majority_to_a_dead_removed_node_is_not_re_placed() -> None:
    """New peers could only join a group that can never elect a leader (a membership change
    needs the old majority): R1 and R2 groups on a removed node that is down are stuck
    (no entry, the assignment kept, so the node's data brings them back after a PeerAdd);
    an R3 group keeps its majority and is repaired; a removed node still running (a
    decommission with --online) still votes, so even its R1 group is moved."""
    state = MetaState()
    state.apply(add_stream("ONE", "one", peers=("n3",)))
    state.apply(add_stream("TWO", "two", peers=("n3", "n1")))
    state.apply(add_stream("THREE", "three", peers=("n1", "n2", "n3")))
    state.apply(PeerRemove(peer="n3", ts_ns=10))
    down = [NodeInfo(name=f"n{i}", cluster="c1", live=i != 3) for i in range(1, 5)]
    plan = plan_repairs(state=state, nodes=down, ts_ns=20)
    assert [e.stream for e in plan.entries] == ["THREE"]
    assert set(plan.stuck) == {"S:$G:ONE", "S:$G:TWO"}
    running = plan_repairs(state=state, nodes=nodes(4), ts_ns=20)
    assert {e.stream for e in running.entries} == {"ONE", "TWO", "THREE"}
    assert running.stuck == ()


def test_a_stale_repair_is_refused_on_apply() -> None:
    """A plan made before another change to the group is refused (ConflictError), never
    applied over that change."""
    state = _state_after_removal("n3", ("A", ("n1", "n2", "n3")))
    first = plan_repairs(state=state, nodes=nodes(5), ts_ns=20).entries[0]
    second = plan_repairs(state=state, nodes=nodes(5), ts_ns=21).entries[0]
    state.apply(first)
    with pytest.raises(ConflictError):
        state.apply(second)


@settings(max_examples=100)
@given(
    groups=st.lists(
        st.lists(
            st.sampled_from([f"n{i}" for i in range(1, 6)]), min_size=1, max_size=3, unique=True
        ),
        min_size=1,
        max_size=10,
    ),
    removed=st.sampled_from([f"n{i}" for i in range(1, 6)]),
    cluster=st.integers(2, 7),
)
def test_repair_plans_always_apply_and_never_name_a_removed_peer(
    groups: list[list[str]], removed: str, cluster: int
) -> None:
    """For any assignment: the plan applies, every repaired group is free of the removed
    peer, and only groups reported short stay under their replica count."""
    state = MetaState()
    for i, peers in enumerate(groups):
        state.apply(add_stream(f"S{i}", f"s.{i}", peers=tuple(peers)))
    state.apply(PeerRemove(peer=removed, ts_ns=5))
    ns = [NodeInfo(name=f"n{i}", cluster="c1") for i in range(1, cluster + 1)]
    plan = plan_repairs(state=state, nodes=ns, ts_ns=6)
    for entry in plan.entries:
        state.apply(entry)
    state.check_invariants()
    removed_live = removed in {n.name for n in ns}
    for sa in state.all_streams():
        if sa.group in plan.stuck:  # left as it was: a majority of it on a dead node
            assert not removed_live and removed in sa.peers
            assert len(sa.peers) - 1 < len(sa.peers) // 2 + 1
            continue
        assert removed not in sa.peers
        assert sa.under_replicated == (sa.group in plan.short)
