"""The per-RPC checks of client API requests: ``check_request`` and its table by method.

``check_request`` runs on every unary request and on the first message of ``Consume``, from
``LimitsInterceptor`` (``cluster/security/limits_interceptor.py``) before the servicer sees the
call; a method without an entry here (``GetClusterInfo``, the bidirectional streams' later messages)
has no checks. The field rules themselves are ``cluster/security/limits_fields.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.config import Limits
from raftstream.cluster.security.limits_fields import (
    check_ack,
    check_ack_run,
    check_filter,
    check_name,
    check_node,
    check_publish,
    check_seq,
    check_token,
)
from raftstream.engine.subjects import validate_filter, validate_queue
from raftstream.errors import InvalidArgumentError
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["CLIENT_API_PREFIX", "PULL_HEARTBEAT_MIN_NS", "check_request"]

CLIENT_API_PREFIX = "/raftstream.v1."
PULL_HEARTBEAT_MIN_NS = 10_000_000  # 10 ms: a pull's idle heartbeats are at most 100 per second
_CONSUMER_ACTIONS = frozenset(pb.ConsumerAction.values())


# -- fetch and consume ---------------------------------------------------------------------


def _check_fetch(req: pb.FetchRequest, limits: Limits) -> None:
    check_name(req.stream, "stream")
    check_name(req.consumer, "consumer")
    if not 1 <= req.batch <= limits.pull_batch_msgs_max:
        raise InvalidArgumentError(
            "batch", f"must be 1 to {limits.pull_batch_msgs_max} (limits.pull_batch_msgs_max)"
        )
    if req.max_bytes > limits.pull_batch_bytes_max:
        raise InvalidArgumentError(
            "max_bytes",
            f"must be at most {limits.pull_batch_bytes_max} (limits.pull_batch_bytes_max)",
        )
    expires_max_ns = limits.call_timeout_max_ms * 1_000_000
    if not 0 <= req.expires_ns <= expires_max_ns:
        raise InvalidArgumentError(
            "expires_ns", f"must be 0 to {expires_max_ns} (limits.call_timeout_max_ms)"
        )
    hb = req.idle_heartbeat_ns
    if hb and not PULL_HEARTBEAT_MIN_NS <= hb <= expires_max_ns:
        raise InvalidArgumentError(
            "idle_heartbeat_ns", f"must be 0 or {PULL_HEARTBEAT_MIN_NS} to {expires_max_ns}"
        )


def _check_consume(req: pb.ConsumeRequest, limits: Limits) -> None:
    """The first message of a Consume call: a start naming a valid consumer."""
    if not req.HasField("start"):
        raise InvalidArgumentError("start", "the first request must carry start")
    check_name(req.start.stream, "start.stream")
    check_name(req.start.consumer, "start.consumer")
    if req.start.queue:
        validate_queue(req.start.queue, "start.queue")
    for reply in req.flow_control_replies:
        check_token(reply.token, "flow_control_replies")


# -- per RPC ----------------------------------------------------------------------------------


def _stream_info(r: pb.StreamInfoRequest, _: Limits) -> None:
    check_name(r.name, "name")
    check_filter(r.subjects_filter, "subjects_filter")


def _purge(r: pb.PurgeStreamRequest, _: Limits) -> None:
    check_name(r.name, "name")
    if r.HasField("subject"):
        validate_filter(r.subject, "subject")
    if r.HasField("seq"):
        check_seq(r.seq, "seq")
    if r.HasField("keep"):
        check_seq(r.keep, "keep")
    if r.HasField("seq") and r.HasField("keep"):
        raise InvalidArgumentError("keep", "may not be combined with seq")


def _get_message(r: pb.GetMessageRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    by = r.WhichOneof("by")
    if by is None:
        raise InvalidArgumentError("by", "one of seq, last_by_subject, next_by_subject")
    if by == "seq":
        check_seq(r.seq, "seq")
    elif by == "last_by_subject":
        validate_filter(r.last_by_subject, "last_by_subject")
    else:
        validate_filter(r.next_by_subject, "next_by_subject")
    check_seq(r.start_seq, "start_seq")


def _delete_message(r: pb.DeleteMessageRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    if r.seq < 1:
        raise InvalidArgumentError("seq", "must be at least 1")
    check_seq(r.seq, "seq")


def _config(config_json: str, limits: Limits) -> None:
    # The JSON is parsed and validated by the engine; here only its size is bounded: a
    # config is small (its largest part, metadata, is at most 128 KiB).
    if len(config_json) > limits.headers_bytes_max + 256 * 1024:
        raise InvalidArgumentError("config_json", "is too large to be a configuration")


def _stream_consumer(stream: str, consumer: str) -> None:
    check_name(stream, "stream")
    check_name(consumer, "consumer")


def _action(action: int) -> None:
    if action not in _CONSUMER_ACTIONS:
        raise InvalidArgumentError("action", "must be one of the ConsumerAction values")


def _stream_config(r: pb.CreateStreamRequest | pb.UpdateStreamRequest, limits: Limits) -> None:
    _config(r.config_json, limits)


def _named(r: pb.DeleteStreamRequest, _: Limits) -> None:
    check_name(r.name, "name")


def _listed(r: pb.ListStreamsRequest | pb.StreamNamesRequest, _: Limits) -> None:
    check_filter(r.subject, "subject")


def _stream_step_down(r: pb.StreamStepDownRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    check_node(r.preferred, "preferred")


def _create_consumer(r: pb.CreateConsumerRequest, limits: Limits) -> None:
    check_name(r.stream, "stream")
    _config(r.config_json, limits)
    _action(r.action)


def _update_consumer(r: pb.UpdateConsumerRequest, limits: Limits) -> None:
    check_name(r.stream, "stream")
    _config(r.config_json, limits)


def _consumer(r: Any, _: Limits) -> None:
    """Requests that name a stream and a consumer (info, delete, pause, resume)."""
    _stream_consumer(r.stream, r.consumer)


def _of_stream(r: pb.ListConsumersRequest | pb.ConsumerNamesRequest, _: Limits) -> None:
    check_name(r.stream, "stream")


def _reset(r: pb.ResetConsumerRequest, _: Limits) -> None:
    _stream_consumer(r.stream, r.consumer)
    check_seq(r.seq, "seq")


def _consumer_step_down(r: pb.ConsumerStepDownRequest, _: Limits) -> None:
    _stream_consumer(r.stream, r.consumer)
    check_node(r.preferred, "preferred")


def _ack(r: pb.AckRequest, limits: Limits) -> None:
    if r.HasField("run"):
        if r.HasField("ack"):
            raise InvalidArgumentError("run", "must not come with ack (one or the other)")
        check_ack_run(r.run)
    else:
        check_ack(r.ack, limits)


def _meta_step_down(r: pb.MetaStepDownRequest, _: Limits) -> None:
    check_node(r.preferred, "preferred")


def _peer(r: pb.RemovePeerRequest | pb.AddPeerRequest, _: Limits) -> None:
    validate_node_name(r.peer, "peer")


_Check = Callable[[Any, Limits], None]
_CHECKS: Mapping[str, _Check] = {
    "StreamService/CreateStream": _stream_config,
    "StreamService/UpdateStream": _stream_config,
    "StreamService/DeleteStream": _named,
    "StreamService/GetStreamInfo": _stream_info,
    "StreamService/ListStreams": _listed,
    "StreamService/StreamNames": _listed,
    "StreamService/PurgeStream": _purge,
    "StreamService/GetMessage": _get_message,
    "StreamService/DeleteMessage": _delete_message,
    "StreamService/StepDownStreamLeader": _stream_step_down,
    "ConsumerService/CreateConsumer": _create_consumer,
    "ConsumerService/UpdateConsumer": _update_consumer,
    "ConsumerService/DeleteConsumer": _consumer,
    "ConsumerService/GetConsumerInfo": _consumer,
    "ConsumerService/ListConsumers": _of_stream,
    "ConsumerService/ConsumerNames": _of_stream,
    "ConsumerService/PauseConsumer": _consumer,
    "ConsumerService/ResumeConsumer": _consumer,
    "ConsumerService/ResetConsumer": _reset,
    "ConsumerService/StepDownConsumerLeader": _consumer_step_down,
    "PublishService/Publish": check_publish,
    "ConsumeService/Fetch": _check_fetch,
    "ConsumeService/Ack": _ack,
    "ConsumeService/Consume": _check_consume,
    "ClusterService/StepDownMetaLeader": _meta_step_down,
    "ClusterService/RemovePeer": _peer,
    "ClusterService/AddPeer": _peer,
}


def check_request(method: str, request: Any, limits: Limits) -> None:
    """The checks of ``method`` (``/raftstream.v1.<Service>/<Rpc>``) on ``request``;
    nothing for a method without checks (``GetClusterInfo``, the bidirectional streams'
    later messages)."""
    check = _CHECKS.get(method.removeprefix(CLIENT_API_PREFIX))
    if check is not None:
        check(request, limits)
