"""Placement: which nodes host a stream's group. Run by the meta leader BEFORE proposing.

The leader decides with its live view of the cluster (who is up; each node's placement
cluster, tags and free space as the node last described itself, ``cluster/meta/descriptions.py``),
then puts the chosen peers in the entry (``AddStream``, ``UpdateStream``, ``ReassignGroup``),
so every replica of the meta state applies the same choice; nothing here runs on apply.

The rule (issue 5, as JetStream's ``selectPeerGroup``): among the live nodes that qualify
(in ``placement.cluster`` when set, carrying every tag of ``placement.tags``, not removed,
not already in the group), take the ones hosting the fewest groups first, then the ones
with the most free space (compared in steps of ``FREE_RANK_STEP_BYTES``: nodes sharing a
filesystem, or whose free space differs by the noise of ordinary writes, tie), then by name,
so the choice is a pure function of its inputs.
Taking the fewest-assets nodes first keeps the cluster balanced: when tags do not constrain,
the assets of any two nodes never differ by more than one after any number of placements.

Errors name ``num_replicas``: ``InvalidArgumentError`` when the cluster could never satisfy
the request (fewer qualifying nodes than replicas, live or not), ``LimitError``
(RESOURCE_EXHAUSTED, retriable once nodes come back) when enough nodes qualify but too few
are live, and ``UnavailableError`` (retriable) when a placement cluster or tags leave too
few nodes but a live node has not described itself yet (``described``: right after a start
the leader may not have heard every peer; it might qualify). All functions are pure; they
never mutate their arguments.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.meta.entries import ReassignGroup
from raftstream.cluster.meta.state import MetaState
from raftstream.engine.stream_config import REPLICAS_MAX, Placement, StreamConfig
from raftstream.errors import InvalidArgumentError, LimitError, UnavailableError, invariant

__all__ = [
    "FREE_RANK_STEP_BYTES",
    "NodeInfo",
    "RepairPlan",
    "place",
    "place_stream",
    "plan_repairs",
    "plan_stream_peers",
]


FREE_RANK_STEP_BYTES = 1 << 30  # free space ranks in whole GiB


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """The leader's view of one node: its placement ``cluster`` and ``tags`` (from the
    node's config, as it described itself), its free space in bytes (as last described; 0
    when unknown), whether it is live, and whether it has ``described`` itself yet (if not,
    ``cluster`` is the leader's own and ``tags`` empty: placeholders)."""

    name: str
    cluster: str
    tags: frozenset[str] = field(default_factory=frozenset)
    free_bytes: int = 0
    live: bool = True
    described: bool = True

    def __post_init__(self) -> None:
        validate_node_name(self.name, "name")
        object.__setattr__(self, "tags", frozenset(self.tags))


def _qualifies(node: NodeInfo, placement: Placement | None) -> bool:
    if placement is None:
        return True
    if placement.cluster is not None and node.cluster != placement.cluster:
        return False
    return all(t in node.tags for t in placement.tags)


def _rank_key(node: NodeInfo, assets: Mapping[str, int]) -> tuple[int, int, str]:
    # Fewest groups first, then most free space (in whole steps), then the name: a total
    # order, so every leader given the same view makes the same choice.
    return (assets.get(node.name, 0), -(node.free_bytes // FREE_RANK_STEP_BYTES), node.name)


def _check_request(
    replicas: int,
    qualifying: Sequence[NodeInfo],
    placement: Placement | None,
    undescribed: Sequence[str],
) -> None:
    if not 1 <= replicas <= REPLICAS_MAX:
        raise InvalidArgumentError("num_replicas", f"must be 1 to {REPLICAS_MAX}")
    constrained = placement is not None and (placement.cluster is not None or placement.tags)
    if constrained and len(qualifying) < replicas and undescribed:
        raise UnavailableError(
            f"placement needs the tags and cluster of {', '.join(undescribed)}, not heard yet",
            field="num_replicas",
            rule="nodes not yet described",
        )
    if placement is not None and placement.cluster is not None and not qualifying:
        raise InvalidArgumentError(
            "placement.cluster", f"no node in cluster {placement.cluster!r} qualifies"
        )


def place(
    *,
    replicas: int,
    nodes: Sequence[NodeInfo],
    assets: Mapping[str, int],
    placement: Placement | None = None,
    exclude: Collection[str] = (),
) -> tuple[str, ...]:
    """Choose ``replicas`` distinct live nodes, preferred leader first (see the module).

    ``assets`` counts the groups each node hosts (absent: 0); ``exclude`` are nodes that may
    not be chosen (removed peers, the group's current peers). Raises ``InvalidArgumentError``
    or ``LimitError`` naming ``num_replicas`` when too few nodes qualify.
    """
    qualifying = [n for n in nodes if n.name not in exclude and _qualifies(n, placement)]
    undescribed = [n.name for n in nodes if n.live and not n.described and n.name not in exclude]
    _check_request(replicas, qualifying, placement, undescribed)
    if len(qualifying) < replicas:
        usable = sum(1 for n in nodes if n.name not in exclude)
        raise _too_few_qualifying(replicas, len(qualifying), usable, placement)
    live = sorted((n for n in qualifying if n.live), key=lambda n: _rank_key(n, assets))
    if len(live) < replicas:
        raise _too_few_live(replicas, len(live))
    chosen = tuple(n.name for n in live[:replicas])
    invariant(len(set(chosen)) == replicas, "placement chose a node twice")
    return chosen


def place_stream(
    *, config: StreamConfig, state: MetaState, nodes: Sequence[NodeInfo]
) -> tuple[str, ...]:
    """The peers for ``AddStream`` of ``config``: ``place`` with the config's normalised
    replica count and placement, the state's assets, and removed peers excluded.
    ``InvalidArgumentError`` for an invalid config, else errors as ``place``."""
    cfg = config.validate()
    return place(
        replicas=cfg.num_replicas,
        nodes=nodes,
        assets=state.assets(),
        placement=cfg.placement,
        exclude=state.removed_peers,
    )


def plan_stream_peers(
    *,
    config: StreamConfig,
    current: Sequence[str],
    nodes: Sequence[NodeInfo],
    assets: Mapping[str, int],
    removed: Collection[str] = (),
) -> tuple[str, ...]:
    """The peers for ``UpdateStream`` of a group now on ``current``.

    Current peers that still qualify (placement, not removed; live or not: a node that is
    briefly down is not a reason to move data; not described yet: not known NOT to qualify)
    are kept in their order; when the replica
    count shrinks, the first ones stay (the preferred leader keeps its place); missing
    replicas are placed as by ``place``. Errors as ``place``.
    """
    cfg = config.validate()
    by_name = {n.name: n for n in nodes}
    kept = [
        p
        for p in current
        if p not in removed
        and p in by_name
        and (not by_name[p].described or _qualifies(by_name[p], cfg.placement))
    ][: cfg.num_replicas]
    missing = cfg.num_replicas - len(kept)
    if missing == 0:
        return tuple(kept)
    try:
        added = place(
            replicas=missing,
            nodes=nodes,
            assets=assets,
            placement=cfg.placement,
            exclude=set(removed) | set(kept),
        )
    except InvalidArgumentError as exc:
        if exc.details.get("field") not in ("num_replicas", "placement.tags", "placement.cluster"):
            raise
        # Counted over the whole group too: R3 to R5 on three nodes said "2 replicas need
        # as many qualifying nodes; 0 do" (a review).
        others = [n for n in nodes if n.name not in removed and n.name not in kept]
        qualifying = len(kept) + sum(1 for n in others if _qualifies(n, cfg.placement))
        usable = len(kept) + len(others)
        raise _too_few_qualifying(cfg.num_replicas, qualifying, usable, cfg.placement) from None
    except LimitError:
        # Counted over the whole group, not the replicas still to place: growing R1 to R3
        # with one other node up said "2 replicas need 2 live nodes; 1 are up" (a review).
        kept_live = sum(1 for p in kept if by_name[p].live)
        others = [n for n in nodes if n.name not in removed and n.name not in kept]
        up = kept_live + sum(1 for n in others if n.live and _qualifies(n, cfg.placement))
        raise _too_few_live(cfg.num_replicas, up) from None
    return (*kept, *added)


def _too_few_qualifying(
    replicas: int, qualifying: int, usable: int, placement: Placement | None
) -> InvalidArgumentError:
    """Fewer nodes qualify than replicas are asked for: the placement's fault when it left
    nodes out and enough nodes exist without it (``placement.tags`` or
    ``placement.cluster``), else the replica count's (``num_replicas``)."""
    if placement is not None and qualifying < usable and usable >= replicas:
        field = "placement.tags" if placement.tags else "placement.cluster"
        return InvalidArgumentError(
            field,
            f"{replicas} replicas need {replicas} nodes matching placement "
            f"{placement.to_dict()}; {qualifying} of the cluster's {usable} do",
        )
    return InvalidArgumentError(
        "num_replicas",
        f"{replicas} replicas need {replicas} nodes; the cluster has {usable}",
    )


def _too_few_live(replicas: int, up: int) -> LimitError:
    return LimitError(
        f"{replicas} replicas need {replicas} live nodes; {up} {'is' if up == 1 else 'are'} up",
        field="num_replicas",
        rule="not enough live nodes",
    )


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """``entries`` to propose, in order; ``short`` lists the groups that stay under their
    replica count after them (no qualifying live node to take a replica; plan again when
    one comes back), and ``stuck`` the groups that lost a majority of their replicas to
    removed nodes (an R1 stream whose only node was removed), for which no entry is
    proposed: a membership change is made by the group's leader, and without a majority
    of its members none can be elected, so new peers would only join a group that never
    answers (and a stream would look empty on them). A removed node that still runs
    (removed with ``--online``) counts as a member: it votes until its group moves off it.
    Such a stream comes back when its nodes are re-admitted (``PeerAdd``) with their data,
    or is deleted."""

    entries: tuple[ReassignGroup, ...]
    short: tuple[str, ...]
    stuck: tuple[str, ...]


def plan_repairs(*, state: MetaState, nodes: Sequence[NodeInfo], ts_ns: int) -> RepairPlan:
    """``ReassignGroup`` entries that restore every group's replica count.

    For each stream (in (account, name) order): peers removed from the cluster are dropped
    and replacements placed among the live qualifying nodes, counting the groups this plan
    already moved, so repairs spread over the cluster. Level-triggered: it reads only the
    state, so the leader runs it after a ``PeerRemove`` applies and again on election (a
    plan lost in a crash is simply made again). Every entry carries ``prior_peers``: an
    entry made stale by a change in between is refused on apply, never misapplied.
    """
    removed = state.removed_peers
    assets = state.assets()
    entries: list[ReassignGroup] = []
    short: list[str] = []
    stuck: list[str] = []
    live = {n.name for n in nodes if n.live}
    for sa in state.all_streams():
        # A removed peer still running (``peer-remove --online``, a decommission) still
        # votes, so its group's leader can move the replica away; a dead one never will.
        voters = [p for p in sa.peers if p not in removed or p in live]
        if len(voters) < sa.quorum:
            stuck.append(sa.group)
            continue
        peers = _repaired_peers(sa, nodes, assets, removed)
        if len(peers) < sa.config.num_replicas:
            short.append(sa.group)
        if peers == sa.peers:
            continue
        for p in set(sa.peers) - set(peers):
            assets[p] = assets.get(p, 0) - 1
        for p in set(peers) - set(sa.peers):
            assets[p] = assets.get(p, 0) + 1
        entries.append(
            ReassignGroup(
                account=sa.account,
                stream=sa.name,
                peers=peers,
                prior_peers=sa.peers,
                ts_ns=ts_ns,
            )
        )
    return RepairPlan(tuple(entries), tuple(short), tuple(stuck))


def _repaired_peers(
    sa: StreamAssignment,
    nodes: Sequence[NodeInfo],
    assets: Mapping[str, int],
    removed: Collection[str],
) -> tuple[str, ...]:
    """The group's peers without removed ones, topped up with as many as can be placed."""
    kept = tuple(p for p in sa.peers if p not in removed)
    missing = sa.config.num_replicas - len(kept)
    if missing <= 0:
        return kept
    exclude = set(removed) | set(kept)
    placement = sa.config.placement
    candidates = [n for n in nodes if n.live and n.name not in exclude and _qualifies(n, placement)]
    candidates.sort(key=lambda n: _rank_key(n, assets))
    return (*kept, *(n.name for n in candidates[:missing]))
