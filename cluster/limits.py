"""Hostile input: the node's checks of every client request, its gRPC options and deadlines.

Why one module: a request must be refused before it does any work (a rejection changes
nothing), and the rules for names, subjects, sizes and numbers must be the same on every
RPC. ``check_request`` runs on every unary request and on the first message of ``Consume``
(from ``LimitsInterceptor``, before the servicer sees the call); the per-item checks
(``check_publish``, ``check_ack``) run inside ``PublishStream``/``AckStream``/``Consume``,
where one bad item is that item's error and the call goes on.

Every refusal is an ``InvalidArgumentError`` (INVALID_ARGUMENT: a malformed field, a number
out of its range) or a ``LimitError`` (RESOURCE_EXHAUSTED: a payload or headers above the
node's limits), naming the field and the rule (``field``/``rule`` in the error details).
Error texts never carry a payload or a header value, and quote a name or subject only
through ``sanitize`` (a short, escaped prefix): a client's data must not land in logs.

Deadlines: every unary and server-streaming call of the client API runs under a deadline:
the client's, capped at ``limits.call_timeout_max_ms``; a call without one gets
``limits.request_timeout_ms`` (``Fetch``, a long poll: ``call_timeout_max_ms``). The cap is
enforced here (DEADLINE_EXCEEDED when it passes) and visible to the servicers through
``capped_time_left``, so the work inside (forwards, proposals, pull expiry) ends before it.
Bidirectional streams (``PublishStream``, ``AckStream``, ``Consume``) are sessions: they
are bounded by their windows (``publish_async_pending_max``, acks in flight, flow control)
rather than by a deadline. How many streaming calls (those and ``Fetch``) a node has open at
once is bounded by ``limits.streaming_calls_max``: one more is RESOURCE_EXHAUSTED. Every
list is paged (``cluster/meta.py`` LIST_LIMIT_MAX).

The limits themselves are ``[limits]`` of the node config (``cluster/config.py``); their
documentation, with defaults, units and errors, is docs/limits.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from raftstream.cluster.config import Limits
from raftstream.cluster.handlers import rewrap
from raftstream.cluster.names import validate_node_name
from raftstream.engine.ack import AckMetadata, parse_ack_subject
from raftstream.engine.consumer_config import MAX_WAITING_DEFAULT, ConsumerConfig, with_changes
from raftstream.engine.subjects import validate_filter, validate_queue, validate_subject
from raftstream.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    LimitError,
    RaftStreamError,
)
from raftstream.msg import ACK_DELAY_NS_MAX, ACK_REASON_BYTES_MAX, ACK_RUN_SEQS_MAX
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import abort

__all__ = [
    "CONSUMER_FILTER_SUBJECTS_MAX",
    "INT64_MAX",
    "NAME_BYTES_MAX",
    "PULL_HEARTBEAT_MIN_NS",
    "STREAM_SUBJECTS_MAX",
    "SUBJECTS_DETAIL_MAX",
    "TOKEN_BYTES_MAX",
    "LimitsInterceptor",
    "bound_consumer",
    "capped_time_left",
    "check_ack",
    "check_ack_run",
    "check_cluster_limits",
    "check_config_name",
    "check_consumer_filter_count",
    "check_consumer_limits",
    "check_name",
    "check_publish",
    "check_request",
    "check_stream_subject_count",
    "check_subjects_detail",
    "sanitize",
    "server_options",
]

INT64_MAX = 2**63 - 1  # sequences and times are stored as int64: larger ones are refused
NAME_BYTES_MAX = 255  # stream and consumer names (as engine/stream_config.py)
TOKEN_BYTES_MAX = 4096  # ack tokens, msg ids, flow-control tokens, TERM reasons
HEADER_NAME_BYTES_MAX = 256
PULL_HEARTBEAT_MIN_NS = 10_000_000  # 10 ms: a pull's idle heartbeats are at most 100 per second
SANITIZED_CHARS_MAX = 32
SUBJECTS_DETAIL_MAX = 100_000  # per-subject counts one stream info may carry
# Subjects of one stream and filter subjects of one consumer, in a create or update request
# (JetStream has no count; the overlap check of a list, and of a stream against the
# account's others, costs O(the list's tokens), so this bounds a request's work on the meta
# leader's loop and on every node that applies it). Definitions stored before the bound
# still load: it is checked on requests, never on apply or restore.
STREAM_SUBJECTS_MAX = 1_000
CONSUMER_FILTER_SUBJECTS_MAX = 1_000
# JetStream's name rule (isValidName) plus path separators: names end up in subjects, group
# ids and paths.
_NAME_FORBIDDEN = frozenset(".*>/\\")
_ACK_KINDS = frozenset(pb.AckKind.values())
_CONSUMER_ACTIONS = frozenset(pb.ConsumerAction.values())
_PREFIX = "/raftstream.v1."
_LONG_POLLS = frozenset({"/raftstream.v1.ConsumeService/Fetch"})

_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("raftstream_call_deadline")


# -- text -------------------------------------------------------------------------------------


def sanitize(text: str, chars_max: int = SANITIZED_CHARS_MAX) -> str:
    """A short, escaped prefix of ``text`` fit for an error message or a log line."""
    head = text[:chars_max]
    return repr(head) + ("..." if len(text) > chars_max else "")


def _utf8_bytes(value: str, field: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(field, "must be valid UTF-8") from None


def check_name(value: str, field: str) -> str:
    """A stream or consumer name: non-empty, printable, no whitespace, none of ``. * > / \\``,
    at most ``NAME_BYTES_MAX`` bytes (the engine's rule, checked before any lookup so a bad
    name is INVALID_ARGUMENT rather than NOT_FOUND)."""
    if not value:
        raise InvalidArgumentError(field, "is required")
    if _utf8_bytes(value, field) > NAME_BYTES_MAX:
        raise InvalidArgumentError(field, f"must be at most {NAME_BYTES_MAX} bytes")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgumentError(field, "must not contain whitespace or control characters")
    if not _NAME_FORBIDDEN.isdisjoint(value):
        raise InvalidArgumentError(field, "must not contain '.', '*', '>', '/' or '\\'")
    return value


def _token(value: str, field: str, bytes_max: int = TOKEN_BYTES_MAX) -> None:
    if _utf8_bytes(value, field) > bytes_max:
        raise InvalidArgumentError(field, f"must be at most {bytes_max} bytes")


def _seq(value: int, field: str) -> None:
    if value > INT64_MAX:
        raise InvalidArgumentError(field, f"must be at most {INT64_MAX} (int64)")


def _non_negative(value: int, field: str) -> None:
    if value < 0:
        raise InvalidArgumentError(field, "must not be negative")


def _node(value: str, field: str) -> None:
    if value:
        validate_node_name(value, field)


def _filter(value: str, field: str) -> None:
    if value:
        validate_filter(value, field)


# -- publish ----------------------------------------------------------------------------------


def _check_header(name: str, value: str) -> int:
    """One header's rules; its size in bytes. The value is never quoted back."""
    name_bytes = _utf8_bytes(name, "headers")
    if not name or name_bytes > HEADER_NAME_BYTES_MAX:
        raise InvalidArgumentError(
            "headers", f"a header name must be 1 to {HEADER_NAME_BYTES_MAX} bytes"
        )
    if not name.isascii() or any(c <= " " or c == ":" or c == "\x7f" for c in name):
        raise InvalidArgumentError(
            "headers", "a header name must be printable ASCII without spaces or ':'"
        )
    if any((c < " " and c != "\t") or c == "\x7f" for c in value):
        raise InvalidArgumentError(
            "headers", f"the value of header {sanitize(name)} has a control character"
        )
    return name_bytes + _utf8_bytes(value, "headers")


# Publishes repeat a few subjects (per message on a PublishStream call): each distinct valid
# subject is checked once (bounded; a refusal raises, so it is never cached).
PUBLISH_SUBJECT_MEMO_ENTRIES_MAX = 4096


@functools.lru_cache(maxsize=PUBLISH_SUBJECT_MEMO_ENTRIES_MAX)
def _valid_publish_subject(subject: str) -> None:
    validate_subject(subject, "subject")


def check_publish(req: pb.PublishRequest, limits: Limits) -> None:
    """A publish request's subject, payload, headers, ids and numbers (before any lookup).

    The stream's own ``max_msg_size`` is the engine's check, on the leader, below this one."""
    _valid_publish_subject(req.subject)
    size = len(req.data)
    if size > limits.payload_bytes_max:
        raise LimitError(
            f"data: payload of {size} bytes exceeds limits.payload_bytes_max "
            f"({limits.payload_bytes_max} bytes)",
            field="data",
            rule="payload_bytes_max",
            limit="payload_bytes_max",
            payload_bytes_max=limits.payload_bytes_max,
        )
    if req.headers:
        _check_headers(req.headers, limits)
    _token(req.msg_id, "msg_id")
    if req.HasField("expected_stream"):
        check_name(req.expected_stream, "expected_stream")
    if req.HasField("expected_last_seq"):
        _seq(req.expected_last_seq, "expected_last_seq")
    if req.HasField("expected_last_subject_seq"):
        _seq(req.expected_last_subject_seq, "expected_last_subject_seq")
    if req.HasField("expected_last_subject_seq_subject"):
        validate_filter(req.expected_last_subject_seq_subject, "expected_last_subject_seq_subject")
    if req.HasField("expected_last_msg_id"):
        _token(req.expected_last_msg_id, "expected_last_msg_id")
    _non_negative(req.ttl_ns, "ttl_ns")
    _non_negative(req.timeout_ns, "timeout_ns")


def _check_headers(headers: Mapping[str, str], limits: Limits) -> None:
    if len(headers) > limits.headers_count_max:
        raise LimitError(
            f"headers: {len(headers)} headers exceed limits.headers_count_max "
            f"({limits.headers_count_max})",
            field="headers",
            rule="headers_count_max",
            limit="headers_count_max",
        )
    total = 0
    for name, value in headers.items():
        total += _check_header(name, value)
    if total > limits.headers_bytes_max:
        raise LimitError(
            f"headers: {total} bytes exceed limits.headers_bytes_max "
            f"({limits.headers_bytes_max} bytes)",
            field="headers",
            rule="headers_bytes_max",
            limit="headers_bytes_max",
        )


# -- pull and acks ----------------------------------------------------------------------------


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


def check_ack(item: pb.AckItem, limits: Limits) -> AckMetadata:
    """One ack item: a well-formed token with int64 sequences, a known kind, bounded
    numbers (before it reaches its stream). Returns the token's parsed metadata."""
    reply = item.reply  # once: each read of a proto string field makes a new str
    _token(reply, "reply")
    meta = parse_ack_subject(reply)
    _seq(meta.stream_seq, "reply")
    _seq(meta.consumer_seq, "reply")
    if item.kind not in _ACK_KINDS:
        raise InvalidArgumentError("kind", "must be one of the AckKind values")
    if not 0 <= item.delay_ns <= ACK_DELAY_NS_MAX:
        raise InvalidArgumentError("delay_ns", f"must be 0 to {ACK_DELAY_NS_MAX} (a year)")
    _token(item.reason, "reason", ACK_REASON_BYTES_MAX)
    if item.next_batch > limits.pull_batch_msgs_max:
        raise InvalidArgumentError(
            "next_batch",
            f"must be at most {limits.pull_batch_msgs_max} (limits.pull_batch_msgs_max)",
        )
    return meta


def _check_consume(req: pb.ConsumeRequest, limits: Limits) -> None:
    """The first message of a Consume call: a start naming a valid consumer."""
    if not req.HasField("start"):
        raise InvalidArgumentError("start", "the first request must carry start")
    check_name(req.start.stream, "start.stream")
    check_name(req.start.consumer, "start.consumer")
    if req.start.queue:
        validate_queue(req.start.queue, "start.queue")
    for reply in req.flow_control_replies:
        _token(reply.token, "flow_control_replies")


def bound_consumer(cfg: ConsumerConfig, limits: Limits) -> ConsumerConfig:
    """``cfg`` within the node's pull limits: a ``max_waiting`` left at the engine's default
    is lowered to ``limits.pull_waiting_max``; one set above it, or a ``max_batch`` or
    ``max_bytes`` above the node's, is refused naming the field."""
    if cfg.max_waiting == MAX_WAITING_DEFAULT and cfg.max_waiting > limits.pull_waiting_max:
        cfg = with_changes(cfg, max_waiting=limits.pull_waiting_max)
    check_consumer_limits(cfg.max_waiting, cfg.max_batch, cfg.max_bytes, limits)
    return cfg


def check_consumer_limits(max_waiting: int, max_batch: int, max_bytes: int, limits: Limits) -> None:
    """A pull consumer's own bounds may not exceed the node's (its config is the engine's)."""
    if max_waiting > limits.pull_waiting_max:
        raise InvalidArgumentError(
            "max_waiting", f"must be at most {limits.pull_waiting_max} (limits.pull_waiting_max)"
        )
    if max_batch > limits.pull_batch_msgs_max:
        raise InvalidArgumentError(
            "max_batch",
            f"must be at most {limits.pull_batch_msgs_max} (limits.pull_batch_msgs_max)",
        )
    if max_bytes > limits.pull_batch_bytes_max:
        raise InvalidArgumentError(
            "max_bytes",
            f"must be at most {limits.pull_batch_bytes_max} (limits.pull_batch_bytes_max)",
        )


class _Counted(Protocol):
    """What ``check_cluster_limits`` counts in (the meta state)."""

    def all_streams(self) -> tuple[Any, ...]: ...

    def consumers_of(self, account: str, stream: str) -> tuple[Any, ...]: ...


def check_cluster_limits(
    state: _Counted,
    limits: Limits,
    *,
    account: str,
    stream: str | None = None,
    new_consumer: bool = False,
) -> None:
    """Refuse, ``LimitError`` naming the limit, a new stream (``stream``, created in
    ``account``; a re-create of an existing one takes no place) or a new consumer that would
    take the whole cluster, every account together, past ``streams_max``/``consumers_max``.
    The meta leader calls it before it proposes, under the admission lock (as for account
    limits), so without ``[auth]`` a client still cannot create Raft groups without bound."""
    streams = state.all_streams()
    full = stream is not None and len(streams) >= limits.streams_max
    if full and not any(sa.account == account and sa.name == stream for sa in streams):
        raise LimitError(
            f"the cluster holds streams_max ({limits.streams_max}) streams",
            limit="streams_max",
        )
    if new_consumer:
        count = sum(len(state.consumers_of(sa.account, sa.name)) for sa in streams)
        if count >= limits.consumers_max:
            raise LimitError(
                f"the cluster holds consumers_max ({limits.consumers_max}) consumers",
                limit="consumers_max",
            )


def check_subjects_detail(subjects: Mapping[str, int] | None) -> None:
    """Stream info's per-subject counts are at most ``SUBJECTS_DETAIL_MAX`` (JetStream's
    bound): a wider filter is RESOURCE_EXHAUSTED naming ``subjects_filter``."""
    if subjects is not None and len(subjects) > SUBJECTS_DETAIL_MAX:
        raise LimitError(
            f"subjects_filter: matches {len(subjects)} subjects, more than "
            f"{SUBJECTS_DETAIL_MAX}; narrow the filter",
            field="subjects_filter",
            rule="subjects_detail_max",
            limit="subjects_detail_max",
        )


# -- per RPC ----------------------------------------------------------------------------------


def _stream_info(r: pb.StreamInfoRequest, _: Limits) -> None:
    check_name(r.name, "name")
    _filter(r.subjects_filter, "subjects_filter")


def _purge(r: pb.PurgeStreamRequest, _: Limits) -> None:
    check_name(r.name, "name")
    if r.HasField("subject"):
        validate_filter(r.subject, "subject")
    if r.HasField("seq"):
        _seq(r.seq, "seq")
    if r.HasField("keep"):
        _seq(r.keep, "keep")
    if r.HasField("seq") and r.HasField("keep"):
        raise InvalidArgumentError("keep", "may not be combined with seq")


def _get_message(r: pb.GetMessageRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    by = r.WhichOneof("by")
    if by is None:
        raise InvalidArgumentError("by", "one of seq, last_by_subject, next_by_subject")
    if by == "seq":
        _seq(r.seq, "seq")
    elif by == "last_by_subject":
        validate_filter(r.last_by_subject, "last_by_subject")
    else:
        validate_filter(r.next_by_subject, "next_by_subject")
    _seq(r.start_seq, "start_seq")


def _delete_message(r: pb.DeleteMessageRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    if r.seq < 1:
        raise InvalidArgumentError("seq", "must be at least 1")
    _seq(r.seq, "seq")


def _config(config_json: str, limits: Limits) -> None:
    # The JSON is parsed and validated by the engine; here only its size is bounded: a
    # config is small (its largest part, metadata, is at most 128 KiB).
    if len(config_json) > limits.headers_bytes_max + 256 * 1024:
        raise InvalidArgumentError("config_json", "is too large to be a configuration")


def check_config_name(raw: Mapping[str, Any]) -> str:
    """The ``name`` of a parsed stream config (``config_json``), checked as a name: what a
    permission check needs before the config is parsed any further."""
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidArgumentError("name", "is required (a string)")
    return check_name(name, "name")


def _count(raw: Mapping[str, Any], key: str, count_max: int, rule: str) -> None:
    value = raw.get(key)
    if isinstance(value, list | tuple) and len(value) > count_max:
        raise InvalidArgumentError(
            key, f"must hold at most {count_max} subjects ({rule}); {len(value)} given"
        )


def check_stream_subject_count(raw: Mapping[str, Any]) -> None:
    """A parsed stream config of a create or update request holds at most
    ``STREAM_SUBJECTS_MAX`` subjects (before ``from_dict`` checks each, or any overlap)."""
    _count(raw, "subjects", STREAM_SUBJECTS_MAX, "stream_subjects_max")


def check_consumer_filter_count(raw: Mapping[str, Any]) -> None:
    """A parsed consumer config of a create or update request holds at most
    ``CONSUMER_FILTER_SUBJECTS_MAX`` filter subjects (before ``from_dict`` checks each, or
    their overlap)."""
    _count(raw, "filter_subjects", CONSUMER_FILTER_SUBJECTS_MAX, "consumer_filter_subjects_max")


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
    _filter(r.subject, "subject")


def _stream_step_down(r: pb.StreamStepDownRequest, _: Limits) -> None:
    check_name(r.stream, "stream")
    _node(r.preferred, "preferred")


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
    _seq(r.seq, "seq")


def _consumer_step_down(r: pb.ConsumerStepDownRequest, _: Limits) -> None:
    _stream_consumer(r.stream, r.consumer)
    _node(r.preferred, "preferred")


def _ack(r: pb.AckRequest, limits: Limits) -> None:
    if r.HasField("run"):
        if r.HasField("ack"):
            raise InvalidArgumentError("run", "must not come with ack (one or the other)")
        check_ack_run(r.run)
    else:
        check_ack(r.ack, limits)


def check_ack_run(run: pb.AckRun) -> None:
    """A run of plain acks: valid stream and consumer names, and 1 to ``ACK_RUN_SEQS_MAX``
    sequences, each from 1 to int64. O(len) and allocation-free: the bound comes first, so
    what a refused run costs does not grow past it either."""
    check_name(run.stream, "run.stream")
    check_name(run.consumer, "run.consumer")
    seqs = run.stream_seqs
    if not seqs:
        raise InvalidArgumentError("run.stream_seqs", "is required")
    if len(seqs) > ACK_RUN_SEQS_MAX:
        raise InvalidArgumentError(
            "run.stream_seqs",
            f"must hold at most {ACK_RUN_SEQS_MAX} sequences (ack_run_seqs_max); "
            "send longer runs as several",
        )
    if min(seqs) < 1 or max(seqs) > INT64_MAX:
        raise InvalidArgumentError("run.stream_seqs", f"each must be 1 to {INT64_MAX}")


def _meta_step_down(r: pb.MetaStepDownRequest, _: Limits) -> None:
    _node(r.preferred, "preferred")


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
    check = _CHECKS.get(method.removeprefix(_PREFIX))
    if check is not None:
        check(request, limits)


# -- gRPC -------------------------------------------------------------------------------------


def server_options(limits: Limits, *, raft_message_bytes_max: int) -> list[tuple[str, int]]:
    """The gRPC server (and node-to-node channel) options the limits imply: messages up to
    ``grpc_message_bytes_max`` (or the Raft transport's, when larger) in and out; larger
    ones fail RESOURCE_EXHAUSTED in gRPC itself, before any of their bytes is parsed."""
    msg_max = max(limits.grpc_message_bytes_max, raft_message_bytes_max)
    return [
        ("grpc.max_send_message_length", msg_max),
        ("grpc.max_receive_message_length", msg_max),
    ]


def capped_time_left(left_s: float | None) -> float | None:
    """Seconds left of the call: the client's ``left_s`` (None: no deadline), within the
    server's cap when ``LimitsInterceptor`` set one for the running call."""
    deadline = _DEADLINE.get(None)
    if deadline is None:
        return left_s
    cap = max(0.001, deadline - time.monotonic())
    return cap if left_s is None else min(left_s, cap)


class LimitsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks every client API request (``check_request``) before its servicer runs, puts
    unary and server-streaming calls under the server's deadline cap and counts streaming
    calls against ``streaming_calls_max`` (see the module docstring). The node-to-node
    services, health and reflection are left alone. Owned by the server's event loop."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._streaming = 0  # streaming calls open now (limits.streaming_calls_max)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(_PREFIX):
            return handler
        return rewrap(
            handler,
            unary_unary=lambda behavior: self._unary(method, behavior),
            unary_stream=lambda behavior: self._server_stream(method, behavior),
            stream_stream=lambda behavior: self._bidi(method, behavior),
            request_deserializer=_tolerant,
        )

    def _cap_s(self, method: str, context: Any) -> tuple[float, bool]:
        """The call's time on this node, and whether the client's deadline set it."""
        lim = self._limits
        cap_s = lim.call_timeout_max_ms / 1000
        left = context.time_remaining()
        if left is None:
            return (cap_s if method in _LONG_POLLS else lim.request_timeout_ms / 1000), False
        left_s = max(0.001, float(left))
        return min(cap_s, left_s), left_s < cap_s

    async def _check(self, method: str, request: Any, context: Any) -> None:
        try:
            if isinstance(request, _Malformed):
                raise request.error()
            check_request(method, request, self._limits)
        except RaftStreamError as exc:
            await abort(context, exc)

    def _unary(self, method: str, behavior: Callable[..., Awaitable[Any]]) -> Any:
        async def capped(request: Any, context: Any) -> Any:
            await self._check(method, request, context)
            cap_s, by_client = self._cap_s(method, context)
            _DEADLINE.set(time.monotonic() + cap_s)
            try:
                async with asyncio.timeout(cap_s):
                    return await behavior(request, context)
            except DeadlineExceededError:  # the handler's own answer, not the cap
                raise
            except TimeoutError:
                await abort(context, _past_cap(cap_s, by_client))

        return capped

    async def _open_stream(self, context: Any) -> None:
        """Count a streaming call in, or refuse it RESOURCE_EXHAUSTED when
        ``streaming_calls_max`` are open (the caller counts it out when it ends)."""
        bound = self._limits.streaming_calls_max
        if self._streaming >= bound:
            exc = LimitError(
                f"this node has streaming_calls_max ({bound}) streaming calls open; retry later",
                limit="streaming_calls_max",
            )
            await abort(context, exc)
        self._streaming += 1

    def _server_stream(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Any:
        async def capped(request: Any, context: Any) -> AsyncIterator[Any]:
            await self._check(method, request, context)
            cap_s, by_client = self._cap_s(method, context)
            deadline = time.monotonic() + cap_s
            _DEADLINE.set(deadline)
            responses = aiter(behavior(request, context))
            await self._open_stream(context)  # counted out in the finally below
            # Only our own awaits are under the timeout, never a yield: a timeout must not
            # fire inside gRPC's write of a response.
            try:
                while True:
                    try:
                        async with asyncio.timeout_at(_loop_time(deadline)):
                            item = await anext(responses)
                    except StopAsyncIteration:
                        return
                    yield item
            except TimeoutError:
                await abort(context, _past_cap(cap_s, by_client))
            finally:
                self._streaming -= 1
                await responses.aclose()  # type: ignore[attr-defined]

        return capped

    def _bidi(self, method: str, behavior: Callable[..., AsyncIterator[Any]]) -> Any:
        """A bidirectional stream: its first ``Consume`` message is checked; a message that
        is not a valid protobuf of the request type ends the input, and the call ends
        INVALID_ARGUMENT once the servicer has answered what came before it (a servicer that
        keeps the call open without input, a push session, ends when its client ends it)."""
        limits = self._limits

        async def checked(request_iterator: Any, context: Any) -> AsyncIterator[Any]:
            refused: list[RaftStreamError] = []

            async def requests() -> AsyncIterator[Any]:
                first = True
                async for req in request_iterator:
                    if isinstance(req, _Malformed):
                        refused.append(req.error())
                        raise refused[-1]
                    if first:
                        check_request(method, req, limits)
                        first = False
                    yield req

            await self._open_stream(context)
            try:
                async for item in behavior(requests(), context):
                    yield item
            finally:
                self._streaming -= 1
            if refused:
                await abort(context, refused[0])

        return checked


class _Malformed:
    """What a request that is not a valid protobuf of its type deserializes to: refused
    INVALID_ARGUMENT by the interceptor (gRPC would answer UNKNOWN, naming nothing)."""

    __slots__ = ()

    @staticmethod
    def error() -> InvalidArgumentError:
        return InvalidArgumentError("request", "is not a valid protobuf message of its type")


_MALFORMED = _Malformed()


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserialize``, with a malformed message turned into ``_MALFORMED``."""
    if deserialize is None:
        return None

    def tolerant(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return _MALFORMED

    return tolerant


def _loop_time(deadline_monotonic: float) -> float:
    """``deadline_monotonic`` (``time.monotonic``) on the running loop's clock."""
    loop = asyncio.get_running_loop()
    return loop.time() + (deadline_monotonic - time.monotonic())


def _past_cap(cap_s: float, by_client: bool) -> DeadlineExceededError:
    """The call's time ran out on this node: ``cap_s`` was what the client's deadline left
    it (``by_client``), else the node's own cap (no client deadline, or a longer one)."""
    if by_client:
        return DeadlineExceededError(
            f"no answer within the {cap_s:.3f} s the client's deadline left the call"
        )
    return DeadlineExceededError(
        f"the call ran past the server's deadline of {cap_s:.3f} s "
        "(limits.request_timeout_ms without a client deadline, at most "
        "limits.call_timeout_max_ms)",
        limit="call_timeout_max_ms",
    )
