"""Where the Raft library's errors become raftstream's: ``app_error``, the one converter.

``raftstream.raft`` has its own error hierarchy (``raftstream.raft.errors``) so that it
imports nothing of the application. The node turns those errors into
``raftstream.errors`` ones at the edges where it meets the library: the host hands every
error it raises or fails an awaitable with through ``app_error`` (``RaftHost(map_error=
app_error)``, cluster/node/node.py), and the code that opens the Raft log itself (the node's
start, the scrub in cluster/repair/repair.py) converts with it too. So the rest of ``cluster``
catches ``NotLeaderError``, ``UnavailableError``, ``DeadlineExceededError``... of
``raftstream.errors`` as before, and clients see the same gRPC codes, reasons and details
(``proto/errors.py`` maps those, in one place).

Each kind maps to the class with the same code; the structured details come along (the
leader hint as ``NotLeaderError.leader``, the field and rule of an invalid argument). The
two refusals of the core that callers act on keep their own reason:
``LeadershipTransferError`` (LEADERSHIP_TRANSFER, ``to`` names the next leader) and
``ConfChangePendingError`` (CONF_CHANGE_PENDING). The raft error is the result's
``__cause__``.
"""

from __future__ import annotations

from typing import Any

from raftstream import errors as e
from raftstream.raft import errors as raft_errors
from raftstream.raft.core import errors as core_errors

__all__ = ["ConfChangePendingError", "LeadershipTransferError", "app_error"]


class LeadershipTransferError(e.UnavailableError):
    """Proposals are refused while leadership moves to ``to``; retry on the new leader."""

    reason = "LEADERSHIP_TRANSFER"

    def __init__(self, to: str, message: str | None = None, **details: Any) -> None:
        super().__init__(message or f"leadership is moving to {to}", to=to, **details)
        self.to = to


class ConfChangePendingError(e.UnavailableError):
    """A membership change is in the log and not applied yet (one at a time)."""

    reason = "CONF_CHANGE_PENDING"


# By code, the application's class for a raft error that has no closer match below.
_BY_CODE: dict[str, type[e.RaftStreamError]] = {
    "INVALID_ARGUMENT": e.InvalidArgumentError,
    "NOT_FOUND": e.NotFoundError,
    "PERMISSION_DENIED": e.PermissionDeniedError,
    "RESOURCE_EXHAUSTED": e.LimitError,
    "FAILED_PRECONDITION": e.PreconditionError,
    "DATA_LOSS": e.DataLossError,
    "UNAVAILABLE": e.UnavailableError,
    "DEADLINE_EXCEEDED": e.DeadlineExceededError,
    "INTERNAL": e.InvariantError,
}


def _convert(exc: raft_errors.RaftError) -> e.RaftStreamError:
    details = dict(exc.details)
    if isinstance(exc, core_errors.TransferInProgressError):
        details.pop("to", None)
        return LeadershipTransferError(exc.to, exc.message, **details)
    if isinstance(exc, core_errors.ConfChangePendingError):
        return ConfChangePendingError(exc.message, **details)
    if isinstance(exc, raft_errors.NotLeaderError):
        details.pop("leader", None)
        return e.NotLeaderError(exc.message, leader=exc.leader, **details)
    if isinstance(exc, raft_errors.NoLeaderError):
        return e.NoLeaderError(exc.message, **details)
    if isinstance(exc, raft_errors.InvalidArgumentError):
        return e.InvalidArgumentError(exc.field, exc.rule, exc.message)
    cls = _BY_CODE.get(exc.code, e.RaftStreamError)
    return cls(exc.message, **details)


def app_error(exc: raft_errors.RaftError) -> e.RaftStreamError:
    """``exc`` as a ``raftstream.errors`` error: same code, ``retriable``, message and
    details (module docstring); ``exc`` is its ``__cause__``."""
    out = _convert(exc)
    out.__cause__ = exc
    return out
