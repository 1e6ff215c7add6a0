"""``raftstream.v1.ClusterService``: cluster info, meta leader step-down, peer removal and
readmission.

Cluster info is answered by any node: every node of the cluster as this node knows it (online
when this node heard from it recently; its placement cluster, tags and free space as it last
described itself, ``cluster/meta/descriptions.py``), the meta leader, and every group, the meta
group and each stream's, as the group's leader sees it. Only a group's leader knows its
followers' lag, and a node that hosts no replica does not even know the leader; so for
each group this node does not lead, it asks the leader it knows, or else the group's peers
(``NodeService.LedGroups``, one call per peer for all its groups, at most
``LEADER_VIEW_TIMEOUT_S``). A group whose leader does not answer in time is listed as this
node sees it: with the leader it knows when it hosts a replica, else with no leader.

Peer removal is a meta request (forwarded to the meta leader): it records the removal, so
no new replica is placed on the peer; the meta leader then re-places the peer's replicas
(``plan_repairs``, proposed by ``cluster/meta/group.py`` after the removal applies and on
every election), and each stream group's leader carries the new peers out one server at a
time (``cluster/stream/membership.py``). The call returns once the removal is recorded; the
repair follows asynchronously (watch the stream's cluster info). Readmission (``AddPeer``)
drops the removal: the meta leader's next repair plan gives groups left short of their
replica count a replica on the node once it is online (``cluster/node/node.py`` plans again when
a node comes online). A node that lost its data comes back through the repair protocol
(``raftstream server --join``, ``cluster/repair/repair.py``), which waits for the readmission.
``AddPeer`` with an address adds a new node to the cluster (``NodeAdd``, recorded in the
meta state: every node learns where it serves, ``cluster/services/node_book.py``); the node then
joins with ``raftstream server --join`` through the same protocol, which takes it into the
meta group, and replicas may be placed on it once it is online. With ``[auth]`` and
without ``[tls]`` every node would then send node tokens to that address, so the meta
leader first has the server there prove it holds the node key (``cluster/security/node_proof.py``):
the node must be running already, and an address that does not prove it is refused with
nothing changed.

With ``[auth]`` (docs/security.md), any authenticated user may read cluster info, but it
lists only its own account's stream groups; users of the ``$SYS`` account see every group
and alone may step the meta leader down or remove or readmit a peer.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.config import Address
from raftstream.cluster.meta.descriptions import LOG_FEATURE_NODE_ADD
from raftstream.cluster.meta.entries import NodeAdd, NodeForget, PeerAdd, PeerRemove
from raftstream.cluster.meta.group import META_GROUP, meta_members
from raftstream.cluster.meta.results import NodeAdded, PeerAdded
from raftstream.cluster.security.node_proof import PROVE_TIMEOUT_S, check_new_node
from raftstream.cluster.services.context import ServiceContext, caller_of, time_left
from raftstream.cluster.services.meta_changes import meta_conf_change, meta_learner_caught_up
from raftstream.cluster.services.streams import group_info, step_down
from raftstream.errors import InvalidArgumentError, PreconditionError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import map_errors
from raftstream.raft.types import ConfChange, ConfChangeType

__all__ = ["ClusterServicer", "led_group_infos"]

log = logging.getLogger(__name__)

_SVC = "/raftstream.v1.ClusterService/"
# How long cluster info waits for the leaders of the groups this node does not lead. A
# peer on loopback or a LAN answers in milliseconds; one paused or partitioned away costs
# the call this much, and its groups are listed as this node sees them.
LEADER_VIEW_TIMEOUT_S = 0.5


def led_group_infos(ctx: ServiceContext, names: Sequence[str]) -> list[pb.GroupInfo]:
    """The infos of the groups among ``names`` that this node leads (``LedGroups``)."""
    wanted = set(names)
    peers: dict[str, tuple[str, ...]] = {}
    if META_GROUP in wanted:
        peers[META_GROUP] = meta_members_now(ctx)
    for sa in ctx.meta.state.all_streams():
        if sa.group in wanted:
            peers[sa.group] = sa.peers
    hosted = ctx.host.groups()
    return [
        group_info(ctx, name, members)
        for name, members in peers.items()
        if name in hosted and ctx.host.status(name).leader == ctx.node_id
    ]


async def _leaders_views(
    ctx: ServiceContext, groups: list[tuple[pb.GroupInfo, tuple[str, ...]]], timeout_s: float | None
) -> None:
    """Replace, in place, the info of each group of ``groups`` (info, peers) that this node
    does not lead with its leader's, where the leader answers in time (module docstring)."""
    asks: dict[str, list[str]] = collections.defaultdict(list)
    for info, peers in groups:
        if info.leader == ctx.node_id:
            continue
        targets = [info.leader] if info.leader else [p for p in peers if p != ctx.node_id]
        for peer in targets:
            if peer in ctx.nodes and not ctx.peers.down(peer):
                asks[peer].append(info.name)
    if not asks:
        return
    cap = LEADER_VIEW_TIMEOUT_S
    if timeout_s is not None:
        cap = max(0.05, min(cap, timeout_s / 2))
    answers = await asyncio.gather(
        *(ctx.peers.led_groups(peer, names, cap) for peer, names in asks.items())
    )
    best: dict[str, pb.GroupInfo] = {}
    for views in answers:
        for view in views:
            known = best.get(view.name)
            if known is None or view.term > known.term:  # a deposed leader's is older
                best[view.name] = view
    for info, _ in groups:
        leaders = best.get(info.name)
        if leaders is not None and info.leader != ctx.node_id:
            info.CopyFrom(leaders)


def meta_members_now(ctx: ServiceContext) -> tuple[str, ...]:
    """The meta group's members (voters, then learners) as this replica knows them; every
    node of the cluster before the group runs here."""
    if META_GROUP not in ctx.host.groups():
        return ctx.nodes.names()
    return (*ctx.host.voters(META_GROUP), *ctx.host.learners(META_GROUP))


def _check_peer(ctx: ServiceContext, peer: str) -> None:
    """``InvalidArgumentError`` unless ``peer`` is a node of the cluster."""
    if peer not in ctx.nodes:
        raise InvalidArgumentError(
            "peer",
            f"{peer!r} is not a node of this cluster (to add a new node: raftstream cluster"
            f" peer-add {peer} --address HOST:PORT)",
        )


class ClusterServicer(pbg.ClusterServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    @map_errors
    async def GetClusterInfo(self, request: pb.ClusterInfoRequest, context: Any) -> pb.ClusterInfo:
        ctx = self._ctx
        now = self._ctx.clock.time_ns()
        seen = ctx.peers.seen_ns()
        meta_voters = (
            frozenset(ctx.host.voters(META_GROUP)) if META_GROUP in ctx.host.groups() else None
        )
        static_voters, _ = meta_members(ctx.nodes.names(), ctx.config.meta_voters_max)
        described = dict(ctx.peers.descriptions())
        with contextlib.suppress(OSError):  # free space unknown right now: not described
            described[ctx.node_id] = ctx.peers.describe_self()
        removed = ctx.meta.state.removed_peers
        nodes = []
        for name, addr in ctx.nodes.addresses().items():
            last = seen.get(name, 0)
            online = ctx.peer_live(name)
            node = pb.NodeInfo(
                name=name,
                addr=str(addr),
                online=online,
                last_seen_ns=0 if name == ctx.node_id or not last else now - last,
                voter=name in (static_voters if meta_voters is None else meta_voters),
                removed=name in removed,
            )
            desc = described.get(name)
            if desc is not None:
                node.described = True
                node.cluster = desc.cluster
                node.tags.extend(sorted(desc.tags))
                node.free_bytes = desc.free_bytes
                node.version = desc.version
            nodes.append(node)
        meta_peers = meta_members_now(ctx)
        groups = [
            pb.ClusterGroup(kind=pb.GROUP_KIND_META, group=group_info(ctx, META_GROUP, meta_peers))
        ]
        peers_of = [meta_peers]
        who = caller_of(context)
        for sa in ctx.meta.state.all_streams():
            if not who.system and sa.account != who.account:
                continue  # another account's stream: not even its name (docs/security.md)
            groups.append(
                pb.ClusterGroup(
                    kind=pb.GROUP_KIND_STREAM,
                    account=sa.account,
                    stream=sa.name,
                    group=group_info(ctx, sa.group, sa.peers),
                )
            )
            peers_of.append(sa.peers)
        await _leaders_views(
            ctx, [(g.group, p) for g, p in zip(groups, peers_of, strict=True)], time_left(context)
        )
        return pb.ClusterInfo(
            name=ctx.config.cluster_name,
            meta_leader=ctx.meta.leader or "",
            nodes=nodes,
            groups=groups,
            answered_by=ctx.node_id,
        )

    @map_errors
    async def StepDownMetaLeader(
        self, request: pb.MetaStepDownRequest, context: Any
    ) -> pb.StepDownResponse:
        ctx = self._ctx
        caller_of(context).check_system("meta leader step-down")
        if not ctx.meta.is_leader:
            if ctx.forwarded(context):
                raise ctx.meta.not_leader()
            return await ctx.to_meta_leader(
                _SVC + "StepDownMetaLeader",
                request,
                pb.StepDownResponse.FromString,
                time_left(context),
            )
        return await step_down(ctx, META_GROUP, request.preferred)

    @map_errors
    async def RemovePeer(
        self, request: pb.RemovePeerRequest, context: Any
    ) -> pb.RemovePeerResponse:
        ctx = self._ctx
        caller_of(context).check_system("peer removal")
        if not ctx.meta.is_leader and not ctx.forwarded(context):
            return await ctx.to_meta_leader(
                _SVC + "RemovePeer", request, pb.RemovePeerResponse.FromString, time_left(context)
            )
        if request.forget and request.peer in ctx.meta.state.forgotten_nodes:
            return pb.RemovePeerResponse(already_removed=True, forgotten=False)
        _check_peer(ctx, request.peer)
        if request.refuse_online and ctx.peer_live(request.peer):
            # After the permission check: a user who may not remove peers is told that,
            # not advice about a flag (a user review).
            raise PreconditionError(
                f"node {request.peer} is online: peer-remove is for a dead node (stop it "
                "first, or remove it anyway: raftstream cluster peer-remove --online)"
            )
        if request.peer == ctx.node_id:
            raise InvalidArgumentError(
                "peer",
                "the meta leader cannot remove itself: move the leadership first"
                " (raftstream cluster step-down)",
            )
        again = request.peer in ctx.meta.state.removed_peers
        if not again:
            await ctx.meta.propose(
                PeerRemove(peer=request.peer, ts_ns=self._ctx.clock.time_ns()), time_left(context)
            )
        if request.forget:
            await _forget_node(ctx, request.peer, context)
        return pb.RemovePeerResponse(already_removed=again, forgotten=request.forget)

    @map_errors
    async def AddPeer(self, request: pb.AddPeerRequest, context: Any) -> pb.AddPeerResponse:
        ctx = self._ctx
        caller_of(context).check_system("peer readmission")
        if not ctx.meta.is_leader and not ctx.forwarded(context):
            return await ctx.to_meta_leader(
                _SVC + "AddPeer", request, pb.AddPeerResponse.FromString, time_left(context)
            )
        if request.address:
            return await _add_node(ctx, request, context)
        _check_peer(ctx, request.peer)
        result = await ctx.meta.propose(
            PeerAdd(peer=request.peer, ts_ns=self._ctx.clock.time_ns()), time_left(context)
        )
        return pb.AddPeerResponse(readmitted=isinstance(result, PeerAdded) and result.readmitted)


def _check_every_node_reads_node_entries(ctx: ServiceContext, what: str) -> None:
    """``PreconditionError`` unless every node that may still apply the meta log reads
    ``NodeAdd`` and ``NodeForget`` (``LOG_FEATURE_NODE_ADD``): an older one would halt."""
    # An added node runs a version that knows NodeAdd.
    missing = ctx.nodes_not_reading(LOG_FEATURE_NODE_ADD, exempt=ctx.meta.state.added_nodes)
    if missing:
        raise PreconditionError(
            f"cannot {what} yet: {', '.join(missing)} "
            f"{'runs' if len(missing) == 1 else 'run'} a version that cannot add or forget"
            " nodes (or has not described itself yet): upgrade every node first"
        )


async def _forget_node(ctx: ServiceContext, name: str, context: Any) -> None:
    """Meta leader: take ``name`` (removed) out of the cluster for good, once no stream
    group names it: out of the meta group's membership (a conf change), then ``NodeForget``;
    then, if that left the meta group short of ``meta_voters_max`` voters, promote a
    caught-up learner. Level-triggered: run again after a failure, it goes on from where
    it stopped."""
    groups = sorted(sa.group for sa in ctx.meta.state.streams_for_node(name))
    if groups:
        shown = ", ".join(groups[:5]) + (", ..." if len(groups) > 5 else "")
        raise PreconditionError(
            f"node {name} is removed, but {len(groups)} stream group(s) still have a replica"
            f" on it ({shown}), being placed elsewhere: forget it once they are (watch"
            " raftstream cluster info)"
        )
    _check_every_node_reads_node_entries(ctx, "forget a node")
    host = ctx.host
    if name in host.voters(META_GROUP) or name in host.learners(META_GROUP):
        log.info("forgetting %s: removing it from the meta group", name)
        await meta_conf_change(ctx, ConfChange(ConfChangeType.REMOVE, name))
    await ctx.meta.propose(NodeForget(node=name, ts_ns=ctx.clock.time_ns()), time_left(context))
    log.info("node %s forgotten", name)
    if len(host.voters(META_GROUP)) >= ctx.config.meta_voters_max:
        return
    caught_up = [n for n in sorted(host.learners(META_GROUP)) if meta_learner_caught_up(ctx, n)]
    if caught_up:
        log.info("promoting %s to a voter of the meta group", caught_up[0])
        await meta_conf_change(ctx, ConfChange(ConfChangeType.ADD_VOTER, caught_up[0]))


async def _add_node(
    ctx: ServiceContext, request: pb.AddPeerRequest, context: Any
) -> pb.AddPeerResponse:
    """Meta leader: add the new node ``request.peer`` serving on ``request.address`` (a
    node already in the cluster at that address: nothing changes)."""
    name = validate_node_name(request.peer, "peer")
    address = str(Address.parse(request.address, "address"))
    known = ctx.nodes.address(name)
    if name in ctx.nodes:
        if known == address:
            return pb.AddPeerResponse(added=False)  # added already (a retry): nothing to do
        raise InvalidArgumentError(
            "peer",
            f"{name!r} is a node of this cluster already, at {known or 'an unknown address'}",
        )
    for other, addr in ctx.nodes.addresses().items():
        if addr == address and other != name:
            raise InvalidArgumentError("address", f"node {other!r} serves on {address}")
    _check_every_node_reads_node_entries(ctx, "add a node")
    auth = ctx.config.auth
    if auth is not None and ctx.config.tls is None:
        # Every node sends node tokens to the addresses of the node book: without [tls]
        # nothing on the wire says who answers there, so the server must prove first that
        # it holds the node key (cluster/security/node_proof.py), or a $SYS user's address would
        # harvest them.
        left = time_left(context)
        await check_new_node(
            auth,
            name=name,
            address=address,
            timeout_s=PROVE_TIMEOUT_S if left is None else min(PROVE_TIMEOUT_S, left),
        )
    result = await ctx.meta.propose(
        NodeAdd(node=name, address=address, ts_ns=ctx.clock.time_ns()), time_left(context)
    )
    return pb.AddPeerResponse(added=isinstance(result, NodeAdded) and result.added)
