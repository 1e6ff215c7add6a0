"""``raftstream cluster balance``: after a rolling restart the nodes that stayed up lead
every stream (a restarted node comes back as a follower); balance moves leaderships back
out, to followers that are online and current, one planned step-down at a time.

``plan_balance`` is tested on cluster infos built here; the command against a real 3-node
cluster (the module's own, so no other test's streams count)."""

from __future__ import annotations

import json
from typing import Any

from raftstream.cli.cluster import BalancePlan, Move, plan_balance
from raftstream.models import ClusterGroup, ClusterInfo, GroupInfo, NodeInfo, ReplicaInfo
from tests.support.polling import wait_for

from .runner import ok

NODES = ("n1", "n2", "n3")
WAIT_S = 30.0


def _info(
    leaders: dict[str, str],
    *,
    offline: frozenset[str] = frozenset(),
    lagging: frozenset[tuple[str, str]] = frozenset(),
    r1: frozenset[str] = frozenset(),
) -> ClusterInfo:
    """Streams named by ``leaders`` (stream -> leader), each on every node (R3) but ``r1``'s;
    ``offline`` nodes are down; ``lagging`` (stream, node) followers are not current."""
    groups = [ClusterGroup(account=None, stream=None, group=GroupInfo(name="meta", leader="n1"))]
    for stream, leader in leaders.items():
        followers = () if stream in r1 else tuple(n for n in NODES if n != leader)
        replicas = tuple(
            ReplicaInfo(
                name=n,
                current=n not in offline and (stream, n) not in lagging,
                offline=n in offline,
                active_ns=0,
                lag=0,
            )
            for n in followers
        )
        group = GroupInfo(name=f"S:$G:{stream}", leader=leader, replicas=replicas)
        groups.append(ClusterGroup(account="$G", stream=stream, group=group))
    nodes = tuple(
        NodeInfo(name=n, addr="", online=n not in offline, last_seen_ns=0, voter=True)
        for n in NODES
    )
    return ClusterInfo(
        name="c", meta_leader="n1", nodes=nodes, groups=tuple(groups), answered_by="n1"
    )


def test_one_node_leading_everything_is_spread_out() -> None:
    info = _info({f"S{i}": "n1" for i in range(7)})
    plan = plan_balance(info, lambda g: True)
    assert plan.before == {"n1": 7, "n2": 0, "n3": 0}
    assert sorted(plan.after.values()) == [2, 2, 3]
    assert len(plan.moves) == 4 and len({m.stream for m in plan.moves}) == 4
    assert all(m.src == "n1" for m in plan.moves)
    moved = dict(plan.before)  # the counts after are those of the moves
    for m in plan.moves:
        moved[m.src] -= 1
        moved[m.dst] += 1
    assert moved == plan.after


def test_a_balanced_cluster_moves_nothing() -> None:
    info = _info({"A": "n1", "B": "n2", "C": "n3", "D": "n1"})
    counts = {"n1": 2, "n2": 1, "n3": 1}
    assert plan_balance(info, lambda g: True) == BalancePlan([], counts, counts)


def test_only_online_current_followers_take_a_leadership() -> None:
    # n3 is down: it is no target and counts for nothing; B's n2 replica is behind.
    info = _info(
        {"A": "n1", "B": "n1", "C": "n1"}, offline=frozenset({"n3"}), lagging={("B", "n2")}
    )
    plan = plan_balance(info, lambda g: True)
    assert plan.before == {"n1": 3, "n2": 0}
    assert [(m.src, m.dst) for m in plan.moves] == [("n1", "n2")]
    assert plan.moves[0].stream in ("A", "C")


def test_streams_that_cannot_move_still_count() -> None:
    # R1 streams have no follower; others' (not movable here) weigh on their leader too.
    info = _info({"R1a": "n1", "R1b": "n1", "X": "n2", "Y": "n1"}, r1=frozenset({"R1a", "R1b"}))
    plan = plan_balance(info, lambda g: g.stream != "Y")
    assert plan.before == {"n1": 3, "n2": 1, "n3": 0} and plan.moves == []
    assert plan_balance(info, lambda g: True).moves == [Move("Y", "n1", "n3")]


def _leaders(cluster: Any, streams: list[str]) -> dict[str, str | None]:
    info = json.loads(ok(cluster, "cluster", "info", "--json"))
    return {g["stream"]: g["group"]["leader"] for g in info["groups"] if g["stream"] in streams}


def _wait_current(cluster: Any, streams: list[str]) -> None:
    """Until every stream has a leader and both followers current."""

    def groups() -> list[Any]:
        info = json.loads(ok(cluster, "cluster", "info", "--json"))
        return [g["group"] for g in info["groups"] if g["stream"] in streams]

    def current(groups: list[Any]) -> bool:
        return len(groups) == len(streams) and all(
            g["leader"] and len(g["replicas"]) == 2 and all(r["current"] for r in g["replicas"])
            for g in groups
        )

    wait_for(f"streams {streams} current", groups, WAIT_S, interval_s=0.2, accept=current)


def test_balance_spreads_the_leaders_of_a_node_that_leads_everything(cluster: Any) -> None:
    streams = ["BAL1", "BAL2", "BAL3", "BAL4"]
    for s in streams:
        ok(cluster, "stream", "add", s, "--subjects", f"{s.lower()}.>", "--replicas", "3")
    _wait_current(cluster, streams)
    for s, leader in _leaders(cluster, streams).items():
        if leader != "n1":
            ok(cluster, "cluster", "step-down", "--stream", s, "--preferred", "n1")
    assert set(_leaders(cluster, streams).values()) == {"n1"}
    _wait_current(cluster, streams)

    plan = json.loads(ok(cluster, "cluster", "balance", "--dry-run", "--json"))
    assert plan["leaders_before"] == {"n1": 4, "n2": 0, "n3": 0}
    assert sorted(plan["leaders_planned"].values()) == [1, 1, 2]
    assert [m["result"] for m in plan["moves"]] == ["planned", "planned"]
    assert set(_leaders(cluster, streams).values()) == {"n1"}  # a dry run moves nothing

    out = ok(cluster, "cluster", "balance")
    assert "Leadership moves" in out and out.count("moved") == 2, out
    counts = {n: 0 for n in NODES}
    for leader in _leaders(cluster, streams).values():
        assert leader is not None
        counts[leader] += 1
    assert sorted(counts.values()) == [1, 1, 2], counts

    _wait_current(cluster, streams)
    assert ok(cluster, "cluster", "balance").startswith("Balanced: stream leaders per node: ")
