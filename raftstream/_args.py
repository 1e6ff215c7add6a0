"""Checks of the SDK's own call arguments, made before a request is built or sent.

Protobuf refuses a negative sequence or a header value that is not a string itself, with a
bare ``ValueError``/``TypeError`` that names neither the argument nor the rule; these raise
``InvalidArgumentError`` naming both, as the node would, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from raftstream import errors

__all__ = [
    "INT64_MAX",
    "check_durations_ns",
    "check_headers",
    "check_int",
    "check_payload",
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
