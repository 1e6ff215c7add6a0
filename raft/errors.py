"""The errors of the Raft library: its own hierarchy, so that ``raft`` imports nothing of
the application that uses it.

Every error carries ``code``, the name of a gRPC status code (a string, so that the pure core
imports no grpc), and ``retriable``: whether the same request may succeed later unchanged
(a leader change, a timeout) as opposed to one that is wrong (bad input, a refused state).
``reason`` is a stable machine-readable name and ``details`` the structured facts (a leader
hint, the field that failed validation): an application maps them into its own errors
without parsing the text (raftstream does it in ``raftstream.cluster.common.raft_errors``, and
gives the mapping to ``RaftHost`` as ``map_error``).

``invariant(cond, msg)`` raises ``InvariantError`` unless ``cond``; unlike ``assert`` it
survives ``python -O``.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "DataLossError",
    "DeadlineExceededError",
    "InvalidArgumentError",
    "InvariantError",
    "LimitError",
    "NoLeaderError",
    "NotFoundError",
    "NotLeaderError",
    "PermissionDeniedError",
    "PreconditionError",
    "RaftError",
    "UnavailableError",
    "invariant",
]


class RaftError(Exception):
    """Base of every error the Raft library raises.

    ``code`` is a gRPC status code's name; ``retriable`` says whether the same request may
    succeed later unchanged; ``reason`` is a stable name; ``details`` holds structured facts
    (values may be None: unknown).
    """

    code: ClassVar[str] = "UNKNOWN"
    retriable: ClassVar[bool] = False
    reason: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(RaftError):
    """Bad input. ``field`` names the offending field and ``rule`` the rule it broke."""

    code = "INVALID_ARGUMENT"
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, rule: str, message: str | None = None) -> None:
        super().__init__(message or f"{field}: {rule}", field=field, rule=rule)
        self.field = field
        self.rule = rule


class NotFoundError(RaftError):
    """No such group on this node."""

    code = "NOT_FOUND"
    reason = "NOT_FOUND"


class PermissionDeniedError(RaftError):
    """A peer the transport does not accept as a node of the cluster."""

    code = "PERMISSION_DENIED"
    reason = "PERMISSION_DENIED"


class LimitError(RaftError):
    """A bound was reached (pending proposals or reads, uncommitted bytes)."""

    code = "RESOURCE_EXHAUSTED"
    reason = "LIMIT"


class PreconditionError(RaftError):
    """The request is well formed but the current state refuses it."""

    code = "FAILED_PRECONDITION"
    reason = "FAILED_PRECONDITION"


class DataLossError(RaftError):
    """Stored bytes failed their checksum (or the file is cut short): never use them."""

    code = "DATA_LOSS"
    reason = "DATA_LOSS"


class UnavailableError(RaftError):
    """Not now: no leader, a stopped host, a halted group. What a proposal carried may or
    may not commit when the error says its outcome is unknown."""

    code = "UNAVAILABLE"
    retriable = True
    reason = "UNAVAILABLE"


class NotLeaderError(UnavailableError):
    """This replica is not the leader; ``leader`` (may be None) is the leader it knows."""

    reason = "NOT_LEADER"

    def __init__(
        self, message: str = "not the leader", *, leader: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, leader=leader, **details)
        self.leader = leader


class NoLeaderError(UnavailableError):
    """No leader is known for the group (an election is due or under way)."""

    reason = "NO_LEADER"


class DeadlineExceededError(RaftError, TimeoutError):
    """No outcome within the request's time; what it carried may still commit. Also a
    ``TimeoutError``, as asyncio's timeouts are."""

    code = "DEADLINE_EXCEEDED"
    retriable = True
    reason = "TIMEOUT"


class InvariantError(RaftError):
    """An internal invariant broke: a bug, never a user error."""

    code = "INTERNAL"
    reason = "INVARIANT"


def invariant(cond: bool, msg: str) -> None:
    """Raise InvariantError unless ``cond``. Unlike ``assert``, survives ``python -O``."""
    if not cond:
        raise InvariantError(msg)
