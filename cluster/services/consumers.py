"""``raftstream.v1.ConsumerService``: consumer definitions and control.

Definitions go through the meta group (create, update, delete: the meta leader answers;
other nodes forward). The stream leader then *sequences* each definition into its stream's
log (``StreamGroup.reconcile``), so a created consumer is answered only once its stream
group has it (bounded by the caller's deadline). Info, pause, resume, reset and step-down
act on the stream leader's copy of the consumer (NOT_LEADER elsewhere). A list gives each
consumer's info as its stream leader has it (``from_leaders``).

Permissions (docs/security.md): reading a stream's consumers and running an ephemeral one
(create, delete) takes ``read`` on the stream; a durable consumer's definition and every
control (pause, resume, reset, step-down) take ``manage`` as well. The account's
``max_consumers`` is checked by the meta leader before it proposes a new consumer.
"""

from __future__ import annotations

import secrets
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from raftstream.cluster.meta.account_limits import check_account_limits
from raftstream.cluster.meta.assignments import ConsumerAssignment
from raftstream.cluster.meta.descriptions import LOG_FEATURE_LINKED_FILTERS
from raftstream.cluster.meta.entries import AddConsumer, DeleteConsumer, UpdateConsumer
from raftstream.cluster.meta.results import ConsumerAdded, ConsumerUpdated
from raftstream.cluster.meta.rules import subjects_undescribed
from raftstream.cluster.security.limits_admission import (
    bound_consumer,
    check_cluster_limits,
    check_consumer_filter_count,
)
from raftstream.cluster.services.context import (
    ServiceContext,
    account_of,
    caller_of,
    from_leaders,
    time_left,
)
from raftstream.cluster.services.convert import consumer_info_pb, parse_json
from raftstream.cluster.services.streams import group_info, step_down
from raftstream.engine.consumer_config import (
    IMMUTABLE_FIELDS,
    ConsumerConfig,
    RetentionKind,
    check_for_stream,
    with_changes,
)
from raftstream.engine.consumer_pull import PullEvent
from raftstream.errors import (
    InvalidArgumentError,
    InvariantError,
    NotFoundError,
    PreconditionError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import map_errors

__all__ = ["ConsumerServicer"]

_SVC = "/raftstream.v1.ConsumerService/"
SEQUENCED_WAIT_S_MAX = 10.0  # a create waits at most this long for the stream group
SEQUENCED_POLL_S = 0.05
EPHEMERAL_NAME_BYTES = 8


class ConsumerServicer(pbg.ConsumerServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    def _meta_local(self, context: Any) -> bool:
        return self._ctx.meta.is_leader or self._ctx.forwarded(context)

    @staticmethod
    def _check(context: Any, stream: str, *, manage: bool) -> None:
        """``read`` on ``stream``, and ``manage`` too when ``manage``."""
        who = caller_of(context)
        who.check_read(stream)
        if manage:
            who.check_manage(stream)

    async def _info(
        self, account: str, stream: str, name: str, timeout_s: float | None
    ) -> pb.ConsumerInfo:
        """The info from this node's leader copy (NOT_LEADER/NOT_FOUND otherwise), once
        this node is confirmed to still lead (a deposed leader's copy is stale, §6.4)."""
        ctx = self._ctx
        g = await ctx.read_leader_group(account, stream, timeout_s)
        ca = ctx.meta.state.consumer(account, stream, name)
        c = g.leader_consumer(name)
        sa = ctx.stream(account, stream)
        now = ctx.clock.time_ns()
        out = consumer_info_pb(
            ca, c.info(now), group_info(ctx, sa.group, sa.peers), c.config, now_ns=now
        )
        out.push_bound = g.push_bound(name)
        return out

    async def _sequenced_info(
        self, ca: ConsumerAssignment, timeout_s: float | None
    ) -> pb.ConsumerInfo:
        """The info once the stream group has the consumer (it is sequenced after the meta
        entry applies); on timeout the info from the definition alone."""
        sa = self._ctx.stream(ca.account, ca.stream)
        req = pb.ConsumerInfoRequest(stream=ca.stream, consumer=ca.name)
        wait_s = min(timeout_s or SEQUENCED_WAIT_S_MAX, SEQUENCED_WAIT_S_MAX)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((NotFoundError, UnavailableError)),
            stop=stop_after_delay(max(0.0, wait_s - SEQUENCED_POLL_S)),
            wait=wait_fixed(SEQUENCED_POLL_S),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    info = await self._ctx.to_stream_leader(
                        sa, _SVC + "GetConsumerInfo", req, pb.ConsumerInfo.FromString, wait_s
                    )
                    if info.config_json and parse_json(info.config_json) != ca.config.to_dict():
                        raise UnavailableError("the stream group has not applied the update yet")
                    return info
        except (NotFoundError, UnavailableError):
            pass
        return consumer_info_pb(
            ca, None, group_info(self._ctx, sa.group, sa.peers), now_ns=self._ctx.clock.time_ns()
        )

    def _parsed(self, account: str, stream: str, raw: Any) -> ConsumerConfig:
        """The config in ``raw``. When it is refused and it would update an existing
        consumer, the update rules speak first (as for streams): ``consumer edit --ack none``
        is told that ``ack_policy`` cannot change, not that ``max_ack_pending`` has no
        meaning without acks."""
        try:
            return ConsumerConfig.from_dict(raw)
        except InvalidArgumentError:
            old = self._existing(account, stream, raw)
            if old is not None:
                check_update_dict(old, raw)
            raise

    def _authorized_config(
        self, context: Any, account: str, stream: str, config_json: str
    ) -> ConsumerConfig:
        """The consumer config of a create or update, in the node's pull limits, once the
        caller may: ``read`` on ``stream`` before the config is parsed (issue 39: a user
        without it made the meta leader run the filters' overlap check first), the filters'
        count bounded before they are read, ``manage`` too for a durable (which the config
        says)."""
        caller_of(context).check_read(stream)
        raw = parse_json(config_json)
        check_consumer_filter_count(raw)
        cfg = self._parsed(account, stream, raw)
        cfg = bound_consumer(cfg, self._ctx.config.limits)  # within the node's pull limits
        self._check(context, stream, manage=cfg.is_durable)
        return cfg

    def _reachable(self, account: str, stream: str) -> None:
        """Refuse at once, proposing nothing, a consumer change whose stream's group cannot
        have a leader now (``ServiceContext.unreachable``: its replicas offline or lost).
        Proposed, it committed in the meta group and then waited for the group until the
        client's timeout: the client was told TIMEOUT while the consumer was made once
        the stream came back (a user review)."""
        try:
            sa = self._ctx.stream(account, stream)
        except NotFoundError:
            return  # the proposal answers NOT_FOUND, as before
        err = self._ctx.unreachable(sa)
        if err is not None:
            raise err

    def _filters_readable(self, account: str, stream: str, cfg: ConsumerConfig) -> None:
        """A filter that matches none of a mirror's or a sourced stream's ``subjects`` (it
        stores its origins' subjects) is refused by an earlier version applying it: propose
        one only once every node reads it (``LOG_FEATURE_LINKED_FILTERS``), else
        ``PreconditionError``, proposing nothing."""
        try:
            sa = self._ctx.stream(account, stream)
        except NotFoundError:
            return  # the proposal answers NOT_FOUND, as before
        if sa.config.subject_transform is not None or not subjects_undescribed(sa.config):
            return  # checked as before
        try:  # the earlier rule
            check_for_stream(
                cfg, retention=RetentionKind.LIMITS, stream_subjects=sa.config.subjects
            )
            return
        except InvalidArgumentError:
            pass
        missing = self._ctx.nodes_not_reading(LOG_FEATURE_LINKED_FILTERS)
        if missing:
            raise PreconditionError(
                f"filter_subject: {', '.join(missing)} {'runs' if len(missing) == 1 else 'run'}"
                " a version that refuses filters on a mirror's or a source's subjects (or has"
                " not described itself yet): upgrade every node first",
                field="filter_subject",
            )

    def _existing(self, account: str, stream: str, raw: Any) -> ConsumerConfig | None:
        if not isinstance(raw, dict):
            return None
        name = raw.get("durable_name") or raw.get("name")
        if not isinstance(name, str) or not name:
            return None
        try:
            return self._ctx.meta.state.consumer(account, stream, name).config
        except RaftStreamError:
            return None

    @map_errors
    async def CreateConsumer(
        self, request: pb.CreateConsumerRequest, context: Any
    ) -> pb.ConsumerInfo:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "CreateConsumer", request, pb.ConsumerInfo.FromString, time_left(context)
            )
        meta = self._ctx.meta
        if not meta.is_leader:
            raise meta.not_leader()
        account = account_of(context)
        cfg = self._authorized_config(context, account, request.stream, request.config_json)
        if cfg.consumer_name is None:  # ephemeral: the leader names it before proposing
            cfg = with_changes(cfg, name=secrets.token_hex(EPHEMERAL_NAME_BYTES // 2).upper())
        self._reachable(account, request.stream)
        self._filters_readable(account, request.stream, cfg)
        name = cfg.consumer_name or ""
        exists = name in meta.state.consumer_names(account, request.stream).items
        now = self._ctx.clock.time_ns()
        if request.action == pb.CONSUMER_ACTION_CREATE_OR_UPDATE and exists:
            entry: AddConsumer | UpdateConsumer = UpdateConsumer(
                account=account, stream=request.stream, config=cfg, ts_ns=now
            )
        else:
            entry = AddConsumer(account=account, stream=request.stream, config=cfg, ts_ns=now)
        async with self._ctx.admission_lock:  # limits checked and used up atomically
            limits = self._ctx.account_limits(account)
            check_account_limits(meta.state, account, limits, new_consumer=not exists)
            node_limits = self._ctx.config.limits
            check_cluster_limits(meta.state, node_limits, account=account, new_consumer=not exists)
            result = await meta.propose(entry, time_left(context))
        if not isinstance(result, ConsumerAdded | ConsumerUpdated):
            raise InvariantError(f"consumer entry answered {result!r}")
        ca = result.assignment
        return await self._sequenced_info(ca, time_left(context))

    @map_errors
    async def UpdateConsumer(
        self, request: pb.UpdateConsumerRequest, context: Any
    ) -> pb.ConsumerInfo:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "UpdateConsumer", request, pb.ConsumerInfo.FromString, time_left(context)
            )
        cfg = self._authorized_config(
            context, account_of(context), request.stream, request.config_json
        )
        self._reachable(account_of(context), request.stream)
        self._filters_readable(account_of(context), request.stream, cfg)
        entry = UpdateConsumer(
            account=account_of(context),
            stream=request.stream,
            config=cfg,
            ts_ns=self._ctx.clock.time_ns(),
        )
        result = await self._ctx.meta.propose(entry, time_left(context))
        if not isinstance(result, ConsumerUpdated):
            raise InvariantError(f"UpdateConsumer answered {result!r}")
        ca = result.assignment
        return await self._sequenced_info(ca, time_left(context))

    @map_errors
    async def DeleteConsumer(
        self, request: pb.DeleteConsumerRequest, context: Any
    ) -> pb.DeleteConsumerResponse:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "DeleteConsumer",
                request,
                pb.DeleteConsumerResponse.FromString,
                time_left(context),
            )
        self._check(context, request.stream, manage=False)
        ca = self._ctx.meta.state.consumer(account_of(context), request.stream, request.consumer)
        self._check(context, request.stream, manage=ca.config.is_durable)
        entry = DeleteConsumer(
            account=account_of(context),
            stream=request.stream,
            name=request.consumer,
            ts_ns=self._ctx.clock.time_ns(),
        )
        await self._ctx.meta.propose(entry, time_left(context))
        return pb.DeleteConsumerResponse()

    @map_errors
    async def GetConsumerInfo(
        self, request: pb.ConsumerInfoRequest, context: Any
    ) -> pb.ConsumerInfo:
        self._check(context, request.stream, manage=False)
        account = account_of(context)
        return await self._info(account, request.stream, request.consumer, time_left(context))

    def _listed(self, ca: ConsumerAssignment) -> pb.ConsumerInfo:
        ctx = self._ctx
        sa = ctx.stream(ca.account, ca.stream)
        g = ctx.local_group(sa)
        info, config, now = None, None, ctx.clock.time_ns()
        if g is not None and g.ready:
            c = g.leader_consumer(ca.name)
            info, config = c.info(now), c.config
        return consumer_info_pb(ca, info, group_info(ctx, sa.group, sa.peers), config, now_ns=now)

    @map_errors
    async def ListConsumers(
        self, request: pb.ListConsumersRequest, context: Any
    ) -> pb.ListConsumersResponse:
        self._check(context, request.stream, manage=False)
        page = self._ctx.meta.state.list_consumers(
            account_of(context), request.stream, offset=request.offset
        )
        ctx = self._ctx

        def leads(ca: ConsumerAssignment) -> bool:
            g = ctx.local_group(ctx.stream(ca.account, ca.stream))
            return g is not None and g.ready

        async def ask(ca: ConsumerAssignment, timeout_s: float) -> pb.ConsumerInfo:
            req = pb.ConsumerInfoRequest(stream=ca.stream, consumer=ca.name)
            return await ctx.to_stream_leader(
                ctx.stream(ca.account, ca.stream),
                _SVC + "GetConsumerInfo",
                req,
                pb.ConsumerInfo.FromString,
                timeout_s,
            )

        consumers = await from_leaders(
            page.items, leads=leads, local=self._listed, ask=ask, timeout_s=time_left(context)
        )
        return pb.ListConsumersResponse(
            consumers=consumers,
            page=pb.Page(total=page.total, offset=page.offset, limit=page.limit),
        )

    @map_errors
    async def ConsumerNames(
        self, request: pb.ConsumerNamesRequest, context: Any
    ) -> pb.ConsumerNamesResponse:
        self._check(context, request.stream, manage=False)
        page = self._ctx.meta.state.consumer_names(
            account_of(context), request.stream, offset=request.offset
        )
        return pb.ConsumerNamesResponse(
            names=list(page.items),
            page=pb.Page(total=page.total, offset=page.offset, limit=page.limit),
        )

    async def _pause(
        self, context: Any, stream: str, consumer: str, until_ns: int
    ) -> pb.PauseConsumerResponse:
        """Pause (``until_ns`` 0: resume) as JetStream does: an update of the consumer's
        config to that ``pause_until``, so the definition, ``consumer info`` and every
        replica agree, and a later update carrying another ``pause_until`` moves it."""
        self._check(context, stream, manage=True)
        account = account_of(context)
        ca = self._ctx.meta.state.consumer(account, stream, consumer)
        cfg = with_changes(ca.config, pause_until=until_ns)
        entry = UpdateConsumer(
            account=account, stream=stream, config=cfg, ts_ns=self._ctx.clock.time_ns()
        )
        result = await self._ctx.meta.propose(entry, time_left(context))
        if not isinstance(result, ConsumerUpdated):
            raise InvariantError(f"UpdateConsumer answered {result!r}")
        # The definition is committed, so every replica will pause; wait (bounded) until
        # the stream group has it, so that a fetch right after finds the consumer paused.
        await self._sequenced_info(result.assignment, time_left(context))
        now = self._ctx.clock.time_ns()
        return pb.PauseConsumerResponse(
            paused=until_ns > now,
            pause_until_ns=until_ns,
            pause_remaining_ns=max(0, until_ns - now),
        )

    @map_errors
    async def PauseConsumer(
        self, request: pb.PauseConsumerRequest, context: Any
    ) -> pb.PauseConsumerResponse:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "PauseConsumer",
                request,
                pb.PauseConsumerResponse.FromString,
                time_left(context),
            )
        return await self._pause(context, request.stream, request.consumer, request.pause_until_ns)

    @map_errors
    async def ResumeConsumer(
        self, request: pb.ResumeConsumerRequest, context: Any
    ) -> pb.PauseConsumerResponse:
        if not self._meta_local(context):
            return await self._ctx.to_meta_leader(
                _SVC + "ResumeConsumer",
                request,
                pb.PauseConsumerResponse.FromString,
                time_left(context),
            )
        return await self._pause(context, request.stream, request.consumer, 0)

    @map_errors
    async def ResetConsumer(
        self, request: pb.ResetConsumerRequest, context: Any
    ) -> pb.ConsumerInfo:
        self._check(context, request.stream, manage=True)
        account = account_of(context)
        g = await self._ctx.leader_group(account, request.stream)
        c = g.leader_consumer(request.consumer)
        seq = request.seq if request.HasField("seq") else 0

        def decide(now: int) -> list[PullEvent]:
            c.reset(seq)
            return []

        await g.run(c, decide, time_left(context))
        return await self._info(account, request.stream, request.consumer, time_left(context))

    @map_errors
    async def StepDownConsumerLeader(
        self, request: pb.ConsumerStepDownRequest, context: Any
    ) -> pb.StepDownResponse:
        # Consumers replicate through their stream's group: its leadership moves. Inside
        # ``handing_over`` no consumer op is left queued when the transfer starts (it would
        # be refused after its deliveries had left: operator review, finding 2).
        self._check(context, request.stream, manage=True)
        g = await self._ctx.leader_group(account_of(context), request.stream)
        g.leader_consumer(request.consumer)
        async with g.handing_over(time_left(context)):
            return await step_down(self._ctx, g.group, request.preferred)


def check_update_dict(old: ConsumerConfig, raw: dict[str, Any]) -> None:
    """``InvalidArgumentError`` naming the first field ``raw`` (a consumer config as JSON,
    not valid on its own) changes that an update may not change; nothing when none is."""
    before = old.to_dict()
    if bool(raw.get("deliver_subject")) != bool(before.get("deliver_subject")):
        raise InvalidArgumentError(
            "deliver_subject", "can not switch a consumer between pull and push"
        )
    for name in IMMUTABLE_FIELDS:
        if name in raw and raw[name] != before.get(name):
            raise InvalidArgumentError(name, "can not be changed on update")
