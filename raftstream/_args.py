"""Checks of the SDK's own call arguments, made before a request is built or sent.

Protobuf refuses a negative sequence or a header value that is not a string itself, with a
bare ``ValueError``/``TypeError`` that names neither the argument nor the rule; these raise
``InvalidArgumentError`` naming both, as the node would, and nothing is sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from raftstream import errors

__all__ = [
    "INT64_MAX",
    "PORT_MAX",
    "QUEUE_RULE",
    "check_address",
    "check_durations_ns",
    "check_headers",
    "check_int",
    "check_payload",
    "check_queue_name",
    "check_seconds",
    "check_servers",
    "check_subject",
]

INT64_MAX = 2**63 - 1  # sequences, counts and times travel as int64/uint64 within int64


def check_int(field: str, value: object, *, minimum: int) -> int:
    """``value`` when it is an int from ``minimum`` to ``INT64_MAX``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgumentError(field, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= INT64_MAX:
        raise errors.InvalidArgumentError(field, f"must be {minimum} to {INT64_MAX}")
    return value


def check_seconds(field: str, value: object, *, zero_ok: bool = False) -> float:
    """``value`` when it is a finite number of seconds above 0 (``zero_ok``: or 0); else
    ``InvalidArgumentError`` naming ``field``. A str, a bool, NaN or infinity is refused
    here rather than failing later as a bare TypeError, or as a wait that never ends or ends
    at once ("no messages within -1.000s")."""
    rule = "must be a finite number of seconds, " + ("0 or more" if zero_ok else "above 0")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.InvalidArgumentError(field, f"{rule}, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise errors.InvalidArgumentError(field, f"{rule}, not {value!r}")
    return value


# Below this, a config duration (nanoseconds) was surely meant in seconds or milliseconds:
# nats.py takes ack_wait=30 as 30 s; here it was 30 ns, and the message came back at once,
# over and over (a user review).
DURATION_NS_MIN = 1_000_000  # 1 ms
_DURATION_FIELDS = (
    "ack_wait",
    "inactive_threshold",
    "max_expires",
    "idle_heartbeat",
    "duplicate_window",
    "max_age",
)


def check_durations_ns(config: object) -> None:
    """Refuse a set duration field of a stream or consumer config (nanoseconds) below 1 ms,
    backoff steps included: ``InvalidArgumentError`` naming the field and the unit."""
    for name in _DURATION_FIELDS:
        _check_duration(name, getattr(config, name, 0))
    for step in getattr(config, "backoff", ()) or ():
        _check_duration("backoff", step)


def _check_duration(name: str, value: object) -> None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < DURATION_NS_MIN:
        raise errors.InvalidArgumentError(
            name,
            f"{value} ns is below 1 ms: durations in configs are nanoseconds "
            "(30 s is 30_000_000_000)",
        )


def check_subject(subject: object) -> str:
    """``subject`` when it is a string (the node checks its tokens)."""
    if not isinstance(subject, str):
        raise errors.InvalidArgumentError(
            "subject", f"must be a string, not {type(subject).__name__}"
        )
    return subject


def check_payload(payload: object) -> bytes:
    """``payload`` as bytes: bytes as is, a bytearray or memoryview copied; anything else
    (a str, a number) is ``InvalidArgumentError`` naming ``payload``, where protobuf and
    ``len()`` raised bare TypeErrors."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    hint = " (encode it: text.encode())" if isinstance(payload, str) else ""
    raise errors.InvalidArgumentError(
        "payload", f"must be bytes, not {type(payload).__name__}{hint}"
    )


def check_headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    """``headers`` when every name and value is a string (the node checks the rest)."""
    if not isinstance(headers, Mapping):
        raise errors.InvalidArgumentError("headers", "must be a mapping of names to values")
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise errors.InvalidArgumentError(
                "headers", f"names and values must be strings (header {name!r})"
            )
    return headers


PORT_MAX = 65535
_SERVERS_RULE = "'host:port' addresses with a port 1 to 65535 (IPv6 hosts in brackets)"


def check_servers(servers: object) -> list[str]:
    """The server addresses of ``connect``: a sequence of ``host:port`` strings, or one
    string of them comma-separated; ``InvalidArgumentError`` naming ``servers`` for none, an
    empty element (``",,,"``), or an element that is no ``host:port`` (``nohostport``, a port
    above 65535), rather than a server reported unreachable after the connect timeout."""
    if isinstance(servers, str):
        items: list[object] = [s.strip() for s in servers.split(",")]
    elif isinstance(servers, Sequence):
        items = list(servers)
    else:
        raise errors.InvalidArgumentError(
            "servers", f"must be {_SERVERS_RULE}, not {type(servers).__name__}"
        )
    if not items or items == [""]:
        raise errors.InvalidArgumentError("servers", "at least one server address")
    for item in items:
        check_address("servers", item)
    return [str(item) for item in items]


def check_address(field: str, addr: object) -> str:
    """One ``host:port`` (``[::1]:7101`` for IPv6), as the node parses its own addresses."""
    if not isinstance(addr, str) or not addr:
        raise errors.InvalidArgumentError(field, f"an empty or non-string address: {addr!r}")
    scheme, sep, _ = addr.partition("://")
    if sep:  # nats://host:port, grpc://...: said as such, not as a misplaced IPv6 host
        raise errors.InvalidArgumentError(
            field, f"a host:port without a scheme ({scheme}:// is not spoken here), got {addr!r}"
        )
    host, sep, port = addr.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise errors.InvalidArgumentError(field, f"IPv6 hosts go in brackets: {addr!r}")
    if not sep or not host or any(c.isspace() or not c.isprintable() for c in host):
        raise errors.InvalidArgumentError(field, f"expected host:port, got {addr!r}")
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= PORT_MAX:
        raise errors.InvalidArgumentError(field, f"port must be 1 to {PORT_MAX}, got {addr!r}")
    return addr


# What a queue group name may not contain: it names the group's consumer too.
_QUEUE_FORBIDDEN = frozenset(".*>")
QUEUE_RULE = (
    "a queue group is a non-empty name without whitespace, control characters, '.', '*' "
    "or '>' (it also names the group's consumer)"
)


def check_queue_name(queue: object, field: str = "queue") -> str:
    """A queue group name (``QUEUE_RULE``); ``InvalidArgumentError`` naming ``field``."""
    if (
        not isinstance(queue, str)
        or not queue
        or any(c.isspace() or not c.isprintable() or c in _QUEUE_FORBIDDEN for c in queue)
    ):
        raise errors.InvalidArgumentError(field, f"{QUEUE_RULE}, not {queue!r}")
    return queue
