"""Values exchanged between the pure Raft core and its driver (storage, transport, host).

All are immutable; the core never shares mutable state with its driver. Node ids and group
ids are strings (node names such as ``"n1"``; group ids such as ``"meta"``). The wire form of
``Message`` is ``raftstream.raft.v1`` in ``proto/raft.proto``; ``raft/transport`` converts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "NONE",
    "ConfChange",
    "ConfChangeType",
    "ConfState",
    "Entry",
    "EntryType",
    "HardState",
    "Message",
    "MessageType",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMeta",
    "SoftState",
]

NONE = ""  # "no node": no vote cast, no known leader


class Role(enum.IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class EntryType(enum.IntEnum):
    NORMAL = 0  # opaque command for the state machine (empty data: the leader's no-op)
    CONF_CHANGE = 1  # data is an encoded ConfChange


class MessageType(enum.IntEnum):
    APPEND = 1
    APPEND_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    PRE_VOTE = 5
    PRE_VOTE_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAPSHOT = 9  # carries a whole Snapshot; the transport streams it in chunks
    SNAPSHOT_RESP = 10
    TIMEOUT_NOW = 11  # leadership transfer: campaign now, skipping pre-vote
    READ_INDEX = 12  # follower -> leader: ask for a read index (context identifies the read)
    READ_INDEX_RESP = 13
    PROPOSE = 14  # follower -> leader forwarding (optional; the core may refuse instead)


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    term: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: str = NONE
    commit: int = 0


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: tuple[str, ...] = ()
    learners: tuple[str, ...] = ()


class ConfChangeType(enum.IntEnum):
    ADD_VOTER = 0  # also promotes a learner
    ADD_LEARNER = 1
    REMOVE = 2


@dataclass(frozen=True, slots=True)
class ConfChange:
    type: ConfChangeType
    node: str

    def encode(self) -> bytes:
        return bytes([int(self.type)]) + self.node.encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        return cls(ConfChangeType(data[0]), data[1:].decode("utf-8"))


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Message:
    type: MessageType
    group: str
    src: str
    dst: str
    term: int = 0
    log_term: int = 0  # term of the entry at ``index`` (append: prev entry; vote: last entry)
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0  # on a rejected append: the follower's guess of the match index
    snapshot: Snapshot | None = None
    context: bytes = b""  # read-index request id; heartbeats echo it back


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state, for observers: who leads, and this replica's role."""

    leader: str = NONE
    role: Role = Role.FOLLOWER


@dataclass(frozen=True, slots=True)
class ReadState:
    """A ReadIndex answer: once ``index`` is applied, a read tagged ``context`` is safe."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Work the driver must do, in this order: persist ``snapshot``, ``entries`` and
    ``hard_state`` (fsync), then send ``messages``, then apply ``committed_entries``, then
    call ``advance(ready)`` on the core.
    """

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    messages: tuple[Message, ...] = ()
    committed_entries: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    soft_state: SoftState | None = None

    def is_empty(self) -> bool:
        return (
            self.hard_state is None
            and not self.entries
            and self.snapshot is None
            and not self.messages
            and not self.committed_entries
            and not self.read_states
            and self.soft_state is None
        )
