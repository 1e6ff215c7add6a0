"""What applying a meta entry returns (``MetaResult``), and one page of a listing (``Page``).

Frozen values: ``MetaState.apply`` (``cluster/meta/state.py``) returns one per applied entry, and
the meta group hands it to the entry's proposer; queries page their answers with ``page``,
at most ``LIST_LIMIT_MAX`` items (JetStream's API list limit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.repairs import RepairRecorded
from raftstream.errors import InvalidArgumentError

__all__ = [
    "LIST_LIMIT_MAX",
    "ConsumerAdded",
    "ConsumerDeleted",
    "ConsumerUpdated",
    "GroupReassigned",
    "MetaResult",
    "NodeAdded",
    "NodeForgotten",
    "Page",
    "PeerAdded",
    "PeerRemoved",
    "StreamAdded",
    "StreamDeleted",
    "StreamUpdated",
    "page",
]

# JetStream's API list limit (JSApiListLimit): one page of a list or names call.
LIST_LIMIT_MAX = 256

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StreamAdded:
    assignment: StreamAssignment
    created: bool  # False: the stream existed with this very config (idempotent add)


@dataclass(frozen=True, slots=True)
class StreamUpdated:
    assignment: StreamAssignment
    previous: StreamAssignment


@dataclass(frozen=True, slots=True)
class StreamDeleted:
    assignment: StreamAssignment
    consumers: tuple[str, ...]  # the consumers deleted with it, sorted


@dataclass(frozen=True, slots=True)
class ConsumerAdded:
    assignment: ConsumerAssignment
    created: bool


@dataclass(frozen=True, slots=True)
class ConsumerUpdated:
    assignment: ConsumerAssignment


@dataclass(frozen=True, slots=True)
class ConsumerDeleted:
    assignment: ConsumerAssignment


@dataclass(frozen=True, slots=True)
class PeerRemoved:
    peer: str
    newly_removed: bool  # False: it was removed already (a retried request)
    groups: tuple[str, ...]  # groups that still name the peer and need a ReassignGroup


@dataclass(frozen=True, slots=True)
class PeerAdded:
    peer: str
    readmitted: bool  # False: it was not removed (nothing changed)


@dataclass(frozen=True, slots=True)
class NodeAdded:
    node: str
    address: str
    added: bool  # False: it was added already, at this address (a retried request)


@dataclass(frozen=True, slots=True)
class NodeForgotten:
    node: str
    forgotten: bool  # False: it was forgotten already (a retried request)


@dataclass(frozen=True, slots=True)
class GroupReassigned:
    assignment: StreamAssignment
    previous: StreamAssignment


MetaResult = (
    StreamAdded
    | StreamUpdated
    | StreamDeleted
    | ConsumerAdded
    | ConsumerUpdated
    | ConsumerDeleted
    | PeerRemoved
    | PeerAdded
    | NodeAdded
    | NodeForgotten
    | GroupReassigned
    | RepairRecorded
)


@dataclass(frozen=True, slots=True)
class Page(Generic[_T]):
    """One page of a sorted listing: ``items`` from ``offset``, ``total`` in all."""

    items: tuple[_T, ...]
    total: int
    offset: int
    limit: int


def page(items: list[_T], offset: int, limit: int) -> Page[_T]:
    """``limit`` 0 means ``LIST_LIMIT_MAX``; offsets past the end give an empty page."""
    if offset < 0:
        raise InvalidArgumentError("offset", "must not be negative")
    if not 0 <= limit <= LIST_LIMIT_MAX:
        raise InvalidArgumentError("limit", f"must be 0 (the default) to {LIST_LIMIT_MAX}")
    limit = limit or LIST_LIMIT_MAX
    return Page(tuple(items[offset : offset + limit]), len(items), offset, limit)
