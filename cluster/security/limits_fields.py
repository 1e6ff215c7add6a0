"""The field rules of client requests: names, subjects, tokens, sequences, publishes, acks.

What ``cluster/security/limits.py`` (the face) says holds here: a field is refused before it does
any work, with an ``InvalidArgumentError`` or ``LimitError`` naming the field and the rule; error
texts never carry a payload or a header value, and quote a name or subject only through
``sanitize``. The per-item checks (``check_publish``, ``check_ack``, ``check_ack_run``) run inside
``PublishStream``/``AckStream``/``Consume``, where one bad item is that item's error and the call
goes on; the per-RPC table (``cluster/security/limits_requests.py``) builds on the helpers here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.config import Limits
from raftstream.engine.ack import AckMetadata, parse_ack_subject
from raftstream.engine.subjects import validate_filter, validate_subject
from raftstream.errors import InvalidArgumentError, LimitError
from raftstream.msg import ACK_DELAY_NS_MAX, ACK_REASON_BYTES_MAX, ACK_RUN_SEQS_MAX
from raftstream.proto import raftstream_pb2 as pb

__all__ = [
    "HEADER_NAME_BYTES_MAX",
    "INT64_MAX",
    "NAME_BYTES_MAX",
    "SANITIZED_CHARS_MAX",
    "TOKEN_BYTES_MAX",
    "check_ack",
    "check_ack_run",
    "check_config_name",
    "check_filter",
    "check_name",
    "check_node",
    "check_non_negative",
    "check_publish",
    "check_seq",
    "check_token",
    "sanitize",
]

INT64_MAX = 2**63 - 1  # sequences and times are stored as int64: larger ones are refused
NAME_BYTES_MAX = 255  # stream and consumer names (as engine/stream_config.py)
TOKEN_BYTES_MAX = 4096  # ack tokens, msg ids, flow-control tokens, TERM reasons
HEADER_NAME_BYTES_MAX = 256
SANITIZED_CHARS_MAX = 32
# JetStream's name rule (isValidName) plus path separators: names end up in subjects, group
# ids and paths.
_NAME_FORBIDDEN = frozenset(".*>/\\")
_ACK_KINDS = frozenset(pb.AckKind.values())


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


def check_token(value: str, field: str, bytes_max: int = TOKEN_BYTES_MAX) -> None:
    if _utf8_bytes(value, field) > bytes_max:
        raise InvalidArgumentError(field, f"must be at most {bytes_max} bytes")


def check_seq(value: int, field: str) -> None:
    if value > INT64_MAX:
        raise InvalidArgumentError(field, f"must be at most {INT64_MAX} (int64)")


def check_non_negative(value: int, field: str) -> None:
    if value < 0:
        raise InvalidArgumentError(field, "must not be negative")


def check_node(value: str, field: str) -> None:
    if value:
        validate_node_name(value, field)


def check_filter(value: str, field: str) -> None:
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
    check_token(req.msg_id, "msg_id")
    if req.HasField("expected_stream"):
        check_name(req.expected_stream, "expected_stream")
    if req.HasField("expected_last_seq"):
        check_seq(req.expected_last_seq, "expected_last_seq")
    if req.HasField("expected_last_subject_seq"):
        check_seq(req.expected_last_subject_seq, "expected_last_subject_seq")
    if req.HasField("expected_last_subject_seq_subject"):
        validate_filter(req.expected_last_subject_seq_subject, "expected_last_subject_seq_subject")
    if req.HasField("expected_last_msg_id"):
        check_token(req.expected_last_msg_id, "expected_last_msg_id")
    check_non_negative(req.ttl_ns, "ttl_ns")
    check_non_negative(req.timeout_ns, "timeout_ns")


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


# -- acks -------------------------------------------------------------------------------------


def check_ack(item: pb.AckItem, limits: Limits) -> AckMetadata:
    """One ack item: a well-formed token with int64 sequences, a known kind, bounded
    numbers (before it reaches its stream). Returns the token's parsed metadata."""
    reply = item.reply  # once: each read of a proto string field makes a new str
    check_token(reply, "reply")
    meta = parse_ack_subject(reply)
    check_seq(meta.stream_seq, "reply")
    check_seq(meta.consumer_seq, "reply")
    if item.kind not in _ACK_KINDS:
        raise InvalidArgumentError("kind", "must be one of the AckKind values")
    if not 0 <= item.delay_ns <= ACK_DELAY_NS_MAX:
        raise InvalidArgumentError("delay_ns", f"must be 0 to {ACK_DELAY_NS_MAX} (a year)")
    check_token(item.reason, "reason", ACK_REASON_BYTES_MAX)
    if item.next_batch > limits.pull_batch_msgs_max:
        raise InvalidArgumentError(
            "next_batch",
            f"must be at most {limits.pull_batch_msgs_max} (limits.pull_batch_msgs_max)",
        )
    return meta


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


# -- configs ----------------------------------------------------------------------------------


def check_config_name(raw: Mapping[str, Any]) -> str:
    """The ``name`` of a parsed stream config (``config_json``), checked as a name: what a
    permission check needs before the config is parsed any further."""
    name = raw.get("name")
    if not isinstance(name, str):
        raise InvalidArgumentError("name", "is required (a string)")
    return check_name(name, "name")
