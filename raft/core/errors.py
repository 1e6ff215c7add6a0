"""Errors the core raises beyond those of ``raftstream.raft.errors`` (all are part of it)."""

from __future__ import annotations

from typing import Any

from raftstream.raft.errors import UnavailableError

__all__ = ["ConfChangePendingError", "TransferInProgressError"]


class TransferInProgressError(UnavailableError):
    """Proposals are refused while leadership moves to ``to``; retry on the new leader."""

    reason = "LEADERSHIP_TRANSFER"

    def __init__(self, to: str, **details: Any) -> None:
        super().__init__(f"leadership is moving to {to}", to=to, **details)
        self.to = to


class ConfChangePendingError(UnavailableError):
    """A configuration change is already in the log and not yet applied (one at a time)."""

    reason = "CONF_CHANGE_PENDING"
