"""``raftstream.v1.StreamService``: stream definitions (meta group) and stored messages.

Definitions (create, update, delete) are meta requests: answered by the meta leader, which
validates, places (``cluster/meta/placement.py``) and proposes; any other node forwards them to
it. Stream info, purge, message reads and deletes need the stream's leader (its store is
the one that has applied everything it acknowledged); elsewhere they fail NOT_LEADER with
the leader's address. Lists come from this node's meta state (every node has it); each
stream's state in a list is its leader's (``from_leaders``: asked in parallel, this node's
own view for a leader that does not answer in time).

Permissions (docs/security.md): defining a stream needs ``manage`` on its name, and one
that mirrors or sources a stream of this cluster also needs ``read`` on every origin
(``manage`` when the origin is a work queue or interest stream: the link's consumer changes
what it keeps), since the link copies the origin with the account's node token, whatever the
user who defined it may read (``check_origins``). A list of stream infos holds only the
streams the caller may ``read``; stream names are the account's and are not filtered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from raftstream.cluster.common.raft_extras import followers
from raftstream.cluster.meta.account_limits import check_account_limits
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.meta.descriptions import NodeDescription, node_infos
from raftstream.cluster.meta.entries import AddStream, DeleteStream, UpdateStream
from raftstream.cluster.meta.placement import NodeInfo, place_stream, plan_stream_peers
from raftstream.cluster.meta.results import LIST_LIMIT_MAX, StreamAdded, StreamUpdated
from raftstream.cluster.meta.rules import stream_exists_error
from raftstream.cluster.security.auth_values import Caller
from raftstream.cluster.security.limits_admission import (
    check_cluster_limits,
    check_stream_subject_count,
    check_subjects_detail,
)
from raftstream.cluster.security.limits_fields import check_config_name
from raftstream.cluster.services.context import (
    ServiceContext,
    account_of,
    caller_of,
    from_leaders,
    time_left,
)
from raftstream.cluster.services.convert import (
    group_info_pb,
    parse_json,
    stored_msg_pb,
    stream_info_pb,
    stream_state_pb,
)
from raftstream.engine.entries import DeleteMsg, Purge
from raftstream.engine.stream import Purged
from raftstream.engine.stream_config import (
    RetentionPolicy,
    StreamConfig,
    check_create,
    check_update,
)
from raftstream.engine.stream_source import StreamSource
from raftstream.errors import (
    InvalidArgumentError,
    InvariantError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import map_errors

__all__ = [
    "DELETED_DETAILS_MAX",
    "DELETED_SCAN_MSGS_MAX",
    "StreamServicer",
    "check_origins",
    "cluster_nodes",
    "group_info",
]

_SVC = "/raftstream.v1.StreamService/"
NEW_LEADER_WAIT_S = 3.0  # a create or update waits this long for the group's leader
NEW_LEADER_POLL_S = 0.05
STEP_DOWN_WAIT_S = 3.0  # how long a step-down waits to learn the new leader
STEP_DOWN_POLL_S = 0.05
# Deleted sequences one stream info carries (``deleted_details``), the lowest ones; the
# state's ``num_deleted`` says how many there are. JetStream sends them all; here a stream
# with millions of gaps would pass the gRPC message cap (``limits.grpc_message_bytes_max``,
# 4 MiB at least): at most 10 bytes each (a packed varint), this many take 1 MB or less.
DELETED_DETAILS_MAX = 100_000
# Stored messages walked (keys only) to find them: the walk runs on the node's event loop,
# and a million keys take about 0.3 s of it (LMDB); past this the sequences found so far
# (the lowest) are the answer, and ``num_deleted`` still counts them all.
DELETED_SCAN_MSGS_MAX = 1_000_000


# Origins whose contents a link's consumer changes: a work queue deletes what the link
# acknowledges; an interest stream keeps each message until the link acknowledged it too,
# and drops it once the link and the other consumers did.
_CONSUMED_RETENTIONS = frozenset({RetentionPolicy.WORKQUEUE, RetentionPolicy.INTEREST})


def check_origins(
    who: Caller, config: StreamConfig, origin: Callable[[str], StreamConfig | None]
) -> None:
    """Refuse (``PermissionDeniedError`` naming ``mirror.name`` or ``sources[i].name`` and
    the rule) a stream ``config`` whose mirror or sources copy an origin of this cluster
    that ``who`` may not read, or may not manage when the link's consumer would change what
    the origin keeps (workqueue or interest retention). ``origin(name)``: the account's
    stream of that name, None when it does not exist (yet): then its retention is unknown,
    and ``manage`` is needed, as a work queue created later under that name would be
    drained by the link. External origins are not checked: their cluster checks the
    credentials the link presents there."""
    links: list[tuple[str, StreamSource]] = []
    if config.mirror is not None:
        links.append(("mirror", config.mirror))
    links += [(f"sources[{i}]", s) for i, s in enumerate(config.sources)]
    for where, link in links:
        if link.external is not None:
            continue
        field = f"{where}.name"
        # The link reads its origin as the account's node (every permission there), so
        # the user defining it must hold the rights the copy exercises.
        if not who.permissions.may_read(link.name):
            rule = "copying a stream needs read on it"
            raise _origin_denied(who, link.name, field, rule)
        found = origin(link.name)
        if found is None:
            rule = "the origin does not exist yet (its retention is unknown): needs manage on it"
        elif found.retention in _CONSUMED_RETENTIONS:
            rule = (
                f"the origin's retention is {found.retention.value} (the link's consumer "
                "changes what it keeps): needs manage on it"
            )
        else:
            continue
        if not who.permissions.may_manage(link.name):
            raise _origin_denied(who, link.name, field, rule)


def _origin_denied(who: Caller, origin: str, field: str, rule: str) -> PermissionDeniedError:
    return PermissionDeniedError(
        f"user {who.user!r} may not copy stream {origin!r} ({field}): {rule}",
        field=field,
        rule=rule,
        stream=origin,
    )


def cluster_nodes(ctx: ServiceContext) -> list[NodeInfo]:
    """The meta leader's view for placement: every configured peer with its latest
    description (placement cluster, tags, free space: cluster/meta/descriptions.py; a peer not
    heard from yet has no tags and no free space), live unless its health probes have been
    failing for a while."""
    try:
        own = ctx.peers.describe_self()
    except OSError:  # free space unknown right now: rank this node as having none
        cfg = ctx.config
        own = NodeDescription(name=cfg.name, cluster=cfg.cluster_name, tags=frozenset(cfg.tags))
    return node_infos(
        config=ctx.config,
        nodes=ctx.nodes.names(),
        own=own,
        peers=ctx.peers.descriptions(),
        live=ctx.peer_live,
    )


def group_info(ctx: ServiceContext, group: str, peers: tuple[str, ...]) -> pb.GroupInfo:
    """The group's leader and replicas as this node knows them (lag only on the leader)."""
    if group not in ctx.host.groups():
        return group_info_pb(group, leader=None)
    st = ctx.host.status(group)
    commit, progress = followers(ctx.host, group)
    by_name = {f.name: f for f in progress}
    replicas = []
    for p in peers:
        if p == st.leader:
            continue
        f = by_name.get(p)
        lag = max(0, commit - f.match) if f is not None else 0
        replicas.append(
            pb.ReplicaInfo(
                name=p,
                current=f is not None and f.active and lag == 0,
                offline=not ctx.peer_live(p),
                lag=lag,
            )
        )
    return group_info_pb(
        group, leader=st.leader or None, term=st.term, commit=commit, replicas=replicas
    )


async def step_down(ctx: ServiceContext, group: str, preferred: str) -> pb.StepDownResponse:
    """Hand this node's leadership of ``group`` to ``preferred`` (any other voter when
    empty) and wait, bounded, to learn the new leader."""
    candidates = [v for v in ctx.host.voters(group) if v != ctx.node_id]
    if preferred:
        if preferred not in candidates:
            raise InvalidArgumentError("preferred", f"{preferred!r} is not another replica")
        candidates = [preferred]
    if not candidates:
        raise InvalidArgumentError("preferred", "the group has no other replica")
    ctx.host.transfer_leadership(group, candidates[0])
    deadline = ctx.clock.monotonic() + STEP_DOWN_WAIT_S
    while ctx.clock.monotonic() < deadline:
        leader = ctx.host.leader(group)
        if leader is not None and leader != ctx.node_id:
            return pb.StepDownResponse(leader=leader)
        await asyncio.sleep(STEP_DOWN_POLL_S)
    raise UnavailableError("leadership did not move in time", group=group)


def _authorized_config(config_json: str, context: Any) -> StreamConfig:
    """The stream config of a create or update, once the caller may manage the stream it
    names: authenticate (the interceptor), authorize on the name, and only then parse and
    check the rest (issue 39: a user without the permission made the meta leader run the
    subjects' overlap check first). The subjects' count is bounded before they are read."""
    raw = parse_json(config_json)
    caller_of(context).check_manage(check_config_name(raw))
    check_stream_subject_count(raw)
    return StreamConfig.from_dict(raw)


class StreamServicer(pbg.StreamServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def _meta_local(self, context: Any) -> bool:
        """True when this node answers a meta request itself (it leads, or the request was
        forwarded here: then NOT_LEADER is the answer, never a second hop)."""
        return self._ctx.meta.is_leader or self._ctx.forwarded(context)

    async def _info(self, sa: StreamAssignment, timeout_s: float | None) -> pb.StreamInfo:
        """The stream's info from its leader (this node or another); a new group still
        electing its first leader is waited for, briefly (bounded by ``timeout_s``)."""
        req = pb.StreamInfoRequest(name=sa.name)
        wait_s = min(timeout_s or NEW_LEADER_WAIT_S, NEW_LEADER_WAIT_S)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(UnavailableError),
            stop=stop_after_delay(wait_s),
            wait=wait_fixed(NEW_LEADER_POLL_S),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._ctx.to_stream_leader(
                        sa, _SVC + "GetStreamInfo", req, pb.StreamInfo.FromString, wait_s
                    )
        except UnavailableError:  # still electing: the definition stands, info without state
            pass
        return stream_info_pb(sa, None, group_info_pb(sa.group, leader=None))

    # -- definitions (meta) ------------------------------------------------------------------

    @map_errors
    async def CreateStream(self, request: pb.CreateStreamRequest, context: Any) -> pb.StreamInfo:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "CreateStream", request, pb.StreamInfo.FromString, time_left(context)
            )
        meta = self._ctx.meta
        if not meta.is_leader:
            raise meta.not_leader()
        cfg = _authorized_config(request.config_json, context)
        account = account_of(context)
        self._check_origins(context, account, cfg)
        existing = self._existing_stream(account, cfg)
        if existing is not None:  # idempotent, and no placement: it needs no live nodes
            return await self._info(existing, time_left(context))
        async with self._ctx.admission_lock:  # limits checked and used up atomically
            limits = self._ctx.account_limits(account)
            check_account_limits(meta.state, account, limits, stream=cfg)
            node_limits = self._ctx.config.limits
            check_cluster_limits(meta.state, node_limits, account=account, stream=cfg.name)
            peers = place_stream(config=cfg, state=meta.state, nodes=cluster_nodes(self._ctx))
            entry = AddStream(
                account=account, config=cfg, peers=peers, ts_ns=self._ctx.clock.time_ns()
            )
            result = await meta.propose(entry, time_left(context))
        if not isinstance(result, StreamAdded):
            raise InvariantError(f"AddStream answered {result!r}")
        return await self._info(result.assignment, time_left(context))

    def _check_origins(self, context: Any, account: str, cfg: StreamConfig) -> None:
        """``check_origins`` for the caller, against this (meta leader's) state."""
        state = self._ctx.meta.state

        def origin(name: str) -> StreamConfig | None:
            try:
                return state.stream(account, name).config
            except NotFoundError:
                return None

        check_origins(caller_of(context), cfg, origin)

    def _existing_stream(self, account: str, cfg: StreamConfig) -> StreamAssignment | None:
        """The stream ``cfg`` names when it exists with that very config: a create of it
        changes nothing and answers the stream, as in JetStream, even while too few nodes
        are up to place it anew. ALREADY_EXISTS when it exists with another config (what
        the entry would answer when it applies); None when it does not exist."""
        try:
            sa = self._ctx.meta.state.stream(account, cfg.name)
        except NotFoundError:
            return None
        asked = check_create(cfg)
        if sa.config != asked:
            raise stream_exists_error(sa.config, asked)
        return sa

    @map_errors
    async def UpdateStream(self, request: pb.UpdateStreamRequest, context: Any) -> pb.StreamInfo:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "UpdateStream", request, pb.StreamInfo.FromString, time_left(context)
            )
        meta = self._ctx.meta
        if not meta.is_leader:
            raise meta.not_leader()
        cfg = _authorized_config(request.config_json, context)
        account = account_of(context)
        # Every origin of the new config, not only new ones: simplest, and an origin kept
        # from before is checked against the permissions the user has now.
        self._check_origins(context, account, cfg)
        old = meta.state.stream(account, cfg.name)
        # The update's own rules (immutable fields, mirror) before the new config's shape,
        # which planning checks: adding a mirror names ``mirror``, not ``subjects``.
        check_update(old.config, cfg)
        peers = plan_stream_peers(
            config=cfg,
            current=old.peers,
            nodes=cluster_nodes(self._ctx),
            assets=meta.state.assets(),
            removed=meta.state.removed_peers,
        )
        # A changed peer set (num_replicas grown or shrunk) is carried out by the stream's
        # leader one server at a time once the entry applies (cluster/stream/membership.py).
        entry = UpdateStream(
            account=account,
            config=cfg,
            peers=peers,
            prior_peers=old.peers,
            ts_ns=self._ctx.clock.time_ns(),
        )
        async with self._ctx.admission_lock:  # a bigger max_bytes is a storage reservation
            limits = self._ctx.account_limits(account)
            check_account_limits(meta.state, account, limits, stream=cfg)
            result = await meta.propose(entry, time_left(context))
        if not isinstance(result, StreamUpdated):
            raise InvariantError(f"UpdateStream answered {result!r}")
        info = await self._info(result.assignment, time_left(context))
        # The stream leader may not have applied the update to its meta replica yet: the
        # answer carries the committed config, whatever that node's state says.
        links = (info.mirror if info.HasField("mirror") else None, list(info.sources))
        return stream_info_pb(result.assignment, info.state, info.cluster, links)

    @map_errors
    async def DeleteStream(
        self, request: pb.DeleteStreamRequest, context: Any
    ) -> pb.DeleteStreamResponse:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "DeleteStream",
                request,
                pb.DeleteStreamResponse.FromString,
                time_left(context),
            )
        meta = self._ctx.meta
        caller_of(context).check_manage(request.name)
        entry = DeleteStream(
            account=account_of(context), name=request.name, ts_ns=self._ctx.clock.time_ns()
        )
        await meta.propose(entry, time_left(context))
        return pb.DeleteStreamResponse()

    # -- state (stream leader) ---------------------------------------------------------------

    @map_errors
    async def GetStreamInfo(self, request: pb.StreamInfoRequest, context: Any) -> pb.StreamInfo:
        caller_of(context).check_read(request.name)
        account = account_of(context)
        # Not leader_group alone: a deposed leader would answer a stale state (§6.4).
        g = await self._ctx.read_leader_group(account, request.name, time_left(context))
        sa = self._ctx.stream(account, request.name)
        store = g.replica.store
        st = store.state()
        subjects = (
            store.subjects_state(request.subjects_filter) if request.subjects_filter else None
        )
        check_subjects_detail(subjects)  # a clear error, not one gRPC cannot send
        deleted = (
            store.deleted(DELETED_DETAILS_MAX, scan_msgs_max=DELETED_SCAN_MSGS_MAX)
            if request.deleted_details
            else ()
        )
        consumers = len(self._ctx.meta.state.consumers_of(account, sa.name))
        state = stream_state_pb(st, consumers=consumers, subjects=subjects, deleted=deleted)
        cluster = group_info(self._ctx, sa.group, sa.peers)
        return stream_info_pb(sa, state, cluster, g.source_infos())

    def _local_info(self, sa: StreamAssignment) -> pb.StreamInfo:
        g = self._ctx.local_group(sa)
        consumers = len(self._ctx.meta.state.consumers_of(sa.account, sa.name))
        state = None if g is None else stream_state_pb(g.replica.store.state(), consumers=consumers)
        return stream_info_pb(sa, state, group_info(self._ctx, sa.group, sa.peers))

    def _readable_streams(
        self, account: str, who: Caller, subject: str | None
    ) -> list[StreamAssignment]:
        """The account's streams (capturing ``subject``) that ``who`` may read, by name."""
        state = self._ctx.meta.state
        out: list[StreamAssignment] = []
        offset = 0
        while True:  # every page: the filter runs before the caller's page is cut
            page = state.list_streams(account, offset=offset, subject=subject)
            out.extend(sa for sa in page.items if who.permissions.may_read(sa.name))
            offset += len(page.items)
            if not page.items or offset >= page.total:
                return out

    @map_errors
    async def ListStreams(
        self, request: pb.ListStreamsRequest, context: Any
    ) -> pb.ListStreamsResponse:
        # A stream info is the stream's config and state, which ``read`` guards: only the
        # streams the caller may read, counted so that paging stays consistent. (Names
        # stay in StreamNames: they are the account's.)
        who = caller_of(context)
        account = account_of(context)
        subject = request.subject or None
        if who.permissions.may_read_all:
            page = self._ctx.meta.state.list_streams(
                account, offset=request.offset, subject=subject
            )
            items, total = page.items, page.total
        else:
            readable = self._readable_streams(account, who, subject)
            items = tuple(readable[request.offset : request.offset + LIST_LIMIT_MAX])
            total = len(readable)

        def leads(sa: StreamAssignment) -> bool:
            g = self._ctx.local_group(sa)
            return g is not None and g.ready

        async def ask(sa: StreamAssignment, timeout_s: float) -> pb.StreamInfo:
            req = pb.StreamInfoRequest(name=sa.name)
            return await self._ctx.to_stream_leader(
                sa, _SVC + "GetStreamInfo", req, pb.StreamInfo.FromString, timeout_s
            )

        streams = await from_leaders(
            items, leads=leads, local=self._local_info, ask=ask, timeout_s=time_left(context)
        )
        return pb.ListStreamsResponse(
            streams=streams,
            page=pb.Page(total=total, offset=request.offset, limit=LIST_LIMIT_MAX),
        )

    @map_errors
    async def StreamNames(
        self, request: pb.StreamNamesRequest, context: Any
    ) -> pb.StreamNamesResponse:
        page = self._ctx.meta.state.stream_names(
            account_of(context), offset=request.offset, subject=request.subject or None
        )
        return pb.StreamNamesResponse(
            names=list(page.items),
            page=pb.Page(total=page.total, offset=page.offset, limit=page.limit),
        )

    @map_errors
    async def PurgeStream(
        self, request: pb.PurgeStreamRequest, context: Any
    ) -> pb.PurgeStreamResponse:
        caller_of(context).check_manage(request.name)
        g = await self._ctx.leader_group(account_of(context), request.name)
        entry = Purge(
            ts_ns=self._ctx.clock.time_ns(),
            subject=request.subject if request.HasField("subject") else None,
            seq=request.seq if request.HasField("seq") else None,
            keep=request.keep if request.HasField("keep") else None,
        )
        result = await g.propose_stream(entry, time_left(context))
        if not isinstance(result, Purged):
            raise InvariantError(f"Purge answered {result!r}")
        return pb.PurgeStreamResponse(purged=result.purged)

    @map_errors
    async def GetMessage(
        self, request: pb.GetMessageRequest, context: Any
    ) -> pb.GetMessageResponse:
        # A read barrier before the store is read, not leader_group alone: a leader paused
        # or cut off past an election timeout is deposed without knowing it, and its store
        # misses writes the new leader acknowledged (Raft thesis §6.4, ReadIndex).
        caller_of(context).check_read(request.stream)
        account = account_of(context)
        g = await self._ctx.read_leader_group(account, request.stream, time_left(context))
        store = g.replica.store
        by = request.WhichOneof("by")
        if by == "seq":
            msg = store.load(request.seq)
        elif by == "last_by_subject":
            msg = store.load_last(request.last_by_subject)
        elif by == "next_by_subject":
            found = store.load_next(request.next_by_subject, max(1, request.start_seq))
            if found is None:
                raise NotFoundError("no message matches", field="next_by_subject")
            msg = found
        else:
            raise InvalidArgumentError("by", "one of seq, last_by_subject, next_by_subject")
        return pb.GetMessageResponse(message=stored_msg_pb(msg))

    @map_errors
    async def DeleteMessage(
        self, request: pb.DeleteMessageRequest, context: Any
    ) -> pb.DeleteMessageResponse:
        caller_of(context).check_manage(request.stream)
        g = await self._ctx.leader_group(account_of(context), request.stream)
        entry = DeleteMsg(
            ts_ns=self._ctx.clock.time_ns(), seq=request.seq, no_erase=request.no_erase
        )
        await g.propose_stream(entry, time_left(context))
        return pb.DeleteMessageResponse()

    @map_errors
    async def StepDownStreamLeader(
        self, request: pb.StreamStepDownRequest, context: Any
    ) -> pb.StepDownResponse:
        caller_of(context).check_manage(request.stream)
        g = await self._ctx.leader_group(account_of(context), request.stream)
        return await step_down(self._ctx, g.group, request.preferred)
