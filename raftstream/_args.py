"""Checks of the SDK's own call arguments, made before a request is built or sent.

Protobuf refuses a negative sequence or a header value that is not a string itself, with a
bare ``ValueError``/``TypeError`` that names neither the argument nor the rule; these raise
``InvalidArgumentError`` naming both, as the node would, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Mapping

from raftstream import errors

__all__ = ["INT64_MAX", "check_headers", "check_int"]

INT64_MAX = 2**63 - 1  # sequences, counts and times travel as int64/uint64 within int64


def check_int(field: str, value: object, *, minimum: int) -> int:
    """``value`` when it is an int from ``minimum`` to ``INT64_MAX``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise errors.InvalidArgumentError(field, f"must be an integer, not {type(value).__name__}")
    if not minimum <= value <= INT64_MAX:
        raise errors.InvalidArgumentError(field, f"must be {minimum} to {INT64_MAX}")
    return value


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
