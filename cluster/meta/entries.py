"""The entries the meta Raft group carries, and their byte encoding.

Every entry is a frozen value proposed by the meta leader AFTER it has made every choice that
needs the cluster's live view (placement, an ephemeral consumer's name): replicas never
consult anything but the entry and the replicated state, so they all apply the same choice.
Every entry carries ``ts_ns``, the LEADER's time (nanoseconds since the epoch), and, except
``PeerRemove``, ``PeerAdd``, ``NodeAdd``, ``NodeForget`` and the repair entries (cluster-wide
facts), the ``account`` it belongs to.

Encoding: ``u8 FORMAT_VERSION | u8 kind | canonical JSON body`` (UTF-8, sorted keys, no
spaces). JSON rather than the binary framing of ``engine/entries.py`` because definitions
are small and rare (a handful per second at most, never on the publish path), the configs
already have a canonical JetStream JSON form (``to_dict``/``from_dict``), so a new config
field needs no new layout, and the meta log stays readable by the offline audits. Canonical
JSON also makes the same entry encode to the same bytes on every node. ``decode`` raises
``DataLossError`` for anything it cannot read exactly (unknown version or kind, bad JSON,
missing or unknown keys, a config that no longer parses): a log entry is never
half-understood.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError, RaftStreamError

__all__ = [
    "FORMAT_VERSION",
    "AddConsumer",
    "AddStream",
    "DeleteConsumer",
    "DeleteStream",
    "MetaEntry",
    "NodeAdd",
    "NodeForget",
    "PeerAdd",
    "PeerRemove",
    "ReassignGroup",
    "RepairCleared",
    "RepairDone",
    "RepairStart",
    "UpdateConsumer",
    "UpdateStream",
    "decode_entry",
    "encode_entry",
]

FORMAT_VERSION = 1


class _Kind(enum.IntEnum):
    ADD_STREAM = 1
    UPDATE_STREAM = 2
    DELETE_STREAM = 3
    ADD_CONSUMER = 4
    UPDATE_CONSUMER = 5
    DELETE_CONSUMER = 6
    PEER_REMOVE = 7
    REASSIGN_GROUP = 8
    REPAIR_START = 9
    REPAIR_CLEARED = 10
    REPAIR_DONE = 11
    PEER_ADD = 12
    NODE_ADD = 13
    NODE_FORGET = 14


@dataclass(frozen=True, slots=True, kw_only=True)
class AddStream:
    """Create a stream on ``peers`` (placement's choice, preferred leader first).

    Idempotent as in JetStream: adding a stream that exists with the same config answers
    with the existing assignment; with another config it is refused.
    """

    account: str
    config: StreamConfig
    peers: tuple[str, ...]
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateStream:
    """Replace a stream's config; ``peers`` is the whole new peer list (changed when the
    replica count or the placement changed). ``prior_peers`` is the list the leader planned
    from: if the group was re-placed meanwhile, the entry is refused (``ConflictError``)
    rather than undo that change."""

    account: str
    config: StreamConfig
    peers: tuple[str, ...]
    prior_peers: tuple[str, ...]
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteStream:
    """Delete a stream and every consumer on it."""

    account: str
    name: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AddConsumer:
    """Define a consumer on a stream. ``config`` must carry the consumer's name (the leader
    names an ephemeral consumer before proposing). Idempotent for an equal config."""

    account: str
    stream: str
    config: ConsumerConfig
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConsumer:
    """Replace an existing consumer's config (``check_update`` rules)."""

    account: str
    stream: str
    config: ConsumerConfig
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteConsumer:
    account: str
    stream: str
    name: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerRemove:
    """An operator declared ``peer`` gone for good. Cluster-wide, so it has no account.

    Applying it only records the removal (no new group may be placed on the peer); the meta
    leader then proposes ``ReassignGroup`` entries for every group that still names it
    (``cluster.placement.plan_repairs``), and a new leader does the same on election, so a
    crash between the two leaves nothing stuck.
    """

    peer: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerAdd:
    """An operator readmitted ``peer``, which ``PeerRemove`` took out: replicas may be placed
    on it again. Applying it only drops the removal; the meta leader's next repair plan
    (``cluster.placement.plan_repairs``) gives groups left short of their replica count a
    replica on it once it is online.
    """

    peer: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAdd:
    """An operator added a new node, ``node``, serving on ``address`` (``host:port``), to the
    cluster (``raftstream cluster peer-add NODE --address ADDR``). Applying it records the
    node and its address on every node (they dial it there); the node then joins, empty,
    with ``raftstream server --join``: the meta leader takes it into the meta group
    (``cluster/repair/repair.py``), and replicas may be placed on it once it is online. Proposed
    only when every node reads it (``LOG_FEATURE_NODE_ADD``)."""

    node: str
    address: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeForget:
    """An operator took ``node`` (removed before, its replicas all placed elsewhere) out of
    the cluster for good (``raftstream cluster peer-remove NODE --forget``). The meta leader
    proposes it once the node is out of the meta group's membership; applying it drops the
    node from every node's list of the cluster's nodes. ``NodeAdd`` may add it again."""

    node: str
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReassignGroup:
    """Replace the peers of a stream's group (a removed peer replaced, a lost replica
    restored, or the preferred-leader order changed). ``prior_peers`` guards as in
    ``UpdateStream``."""

    account: str
    stream: str
    peers: tuple[str, ...]
    prior_peers: tuple[str, ...]
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairStart:
    """``node`` lost its Raft data and is out of the meta group's membership (the leader
    proposes this only once that removal applied); ``repair_id`` names this repair, and
    ``meta_term`` is the meta leader's term then: the node restarts the meta group at that
    term (docs/cluster-design.md, "Repair after data loss"). A new ``repair_id`` restarts
    the repair from scratch."""

    node: str
    repair_id: str
    meta_term: int
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairCleared:
    """``node`` (under repair ``repair_id``) is out of ``group``'s membership as of the
    group leader's ``term``: it may now rejoin the group empty, at that term."""

    node: str
    repair_id: str
    group: str
    term: int
    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairDone:
    """Repair ``repair_id`` of ``node`` is over: every group has it back."""

    node: str
    repair_id: str
    ts_ns: int


MetaEntry = (
    AddStream
    | UpdateStream
    | DeleteStream
    | AddConsumer
    | UpdateConsumer
    | DeleteConsumer
    | PeerRemove
    | PeerAdd
    | NodeAdd
    | NodeForget
    | ReassignGroup
    | RepairStart
    | RepairCleared
    | RepairDone
)

_KIND_OF: Mapping[type[Any], _Kind] = {
    AddStream: _Kind.ADD_STREAM,
    UpdateStream: _Kind.UPDATE_STREAM,
    DeleteStream: _Kind.DELETE_STREAM,
    AddConsumer: _Kind.ADD_CONSUMER,
    UpdateConsumer: _Kind.UPDATE_CONSUMER,
    DeleteConsumer: _Kind.DELETE_CONSUMER,
    PeerRemove: _Kind.PEER_REMOVE,
    PeerAdd: _Kind.PEER_ADD,
    NodeAdd: _Kind.NODE_ADD,
    NodeForget: _Kind.NODE_FORGET,
    ReassignGroup: _Kind.REASSIGN_GROUP,
    RepairStart: _Kind.REPAIR_START,
    RepairCleared: _Kind.REPAIR_CLEARED,
    RepairDone: _Kind.REPAIR_DONE,
}
_CLASS_OF: Mapping[_Kind, type[Any]] = {kind: cls for cls, kind in _KIND_OF.items()}
# Fields whose JSON form is not the Python value itself.
_TUPLE_FIELDS = frozenset({"peers", "prior_peers"})
_INT_FIELDS = frozenset({"ts_ns", "meta_term", "term"})


def _body(entry: MetaEntry) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(entry):
        name = f.name
        value = getattr(entry, name)
        if isinstance(value, StreamConfig | ConsumerConfig):
            value = value.to_dict()
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


def encode_entry(entry: MetaEntry) -> bytes:
    """The entry's bytes: version, kind, canonical JSON (same entry, same bytes)."""
    body = json.dumps(_body(entry), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return bytes((FORMAT_VERSION, _KIND_OF[type(entry)])) + body.encode("utf-8")


def _field_value(cls: type[Any], name: str, raw: Any) -> Any:
    if name == "config":
        parse: Callable[[Any], Any] = (
            ConsumerConfig.from_dict
            if cls in (AddConsumer, UpdateConsumer)
            else StreamConfig.from_dict
        )
        return parse(raw)
    if name in _TUPLE_FIELDS:
        if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
            raise DataLossError(f"meta entry field {name!r} is not a list of strings")
        return tuple(raw)
    expected = int if name in _INT_FIELDS else str
    if not isinstance(raw, expected) or isinstance(raw, bool):
        raise DataLossError(f"meta entry field {name!r} is not a {expected.__name__}")
    return raw


def decode_entry(data: bytes) -> MetaEntry:
    """Read ``encode_entry``'s bytes back; ``DataLossError`` for anything else."""
    if len(data) < 2 or data[0] != FORMAT_VERSION:
        raise DataLossError(f"meta entry: unknown format version {data[:1]!r}")
    try:
        cls = _CLASS_OF[_Kind(data[1])]
        body = json.loads(data[2:].decode("utf-8"))
    except (ValueError, KeyError) as exc:  # bad kind, bad UTF-8, bad JSON
        raise DataLossError(f"meta entry unreadable: {exc}") from None
    names = [f.name for f in fields(cls)]
    if not isinstance(body, dict) or set(body) != set(names):
        raise DataLossError(f"meta entry {cls.__name__}: fields do not match")
    try:
        kwargs = {name: _field_value(cls, name, body[name]) for name in names}
    except RaftStreamError as exc:
        if isinstance(exc, DataLossError):
            raise
        # A config the leader encoded no longer parses: version skew or corruption.
        raise DataLossError(f"meta entry {cls.__name__}: {exc}") from None
    entry: MetaEntry = cls(**kwargs)
    return entry
