"""The SDK's values: what the server answers, as frozen dataclasses.

Each ``from_pb`` builds a value from its ``raftstream.v1`` message; the values own their data
(bytes and mappings are copied out of the protobuf messages). Times are ns since the Unix
epoch and durations ns, as in the API (``_ns`` in the field name).

``MsgMetadata.from_reply`` parses a delivery's ack token, in JetStream's two forms (ADR-15):
v2 ``$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``
(11 tokens or more; tokens past the 11th are reserved and ignored; domain ``_`` means none)
and v1 ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (9 tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from raftstream.config import ConsumerConfig, StreamConfig
from raftstream.errors import InvalidArgumentError
from raftstream.proto import raftstream_pb2 as pb

__all__ = [
    "ClusterGroup",
    "ClusterInfo",
    "ConsumerInfo",
    "GroupInfo",
    "MsgMetadata",
    "NodeInfo",
    "PauseInfo",
    "PubAck",
    "RawStreamMsg",
    "ReplicaInfo",
    "SequenceInfo",
    "StreamInfo",
    "StreamSourceInfo",
    "StreamState",
]

_EMPTY: Mapping[str, str] = MappingProxyType({})
_ACK_PREFIX = ("$JS", "ACK")
_V1_TOKENS = 9
_V2_TOKENS_MIN = 11
_NO_DOMAIN = "_"


@dataclass(frozen=True, slots=True, kw_only=True)
class PubAck:
    """A stored message's place. ``duplicate``: the msg_id was seen and ``seq`` is the
    original message's."""

    stream: str
    seq: int
    duplicate: bool = False
    domain: str | None = None

    @classmethod
    def from_pb(cls, m: pb.PubAck) -> PubAck:
        return cls(stream=m.stream, seq=m.seq, duplicate=m.duplicate, domain=m.domain or None)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaInfo:
    name: str
    current: bool
    offline: bool
    active_ns: int
    lag: int

    @classmethod
    def from_pb(cls, m: pb.ReplicaInfo) -> ReplicaInfo:
        return cls(
            name=m.name, current=m.current, offline=m.offline, active_ns=m.active_ns, lag=m.lag
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupInfo:
    """A Raft group: its leader (None when there is none) and its other replicas."""

    name: str
    leader: str | None
    replicas: tuple[ReplicaInfo, ...] = ()
    term: int = 0
    commit_index: int = 0

    @classmethod
    def from_pb(cls, m: pb.GroupInfo) -> GroupInfo:
        return cls(
            name=m.name,
            leader=m.leader or None,
            replicas=tuple(ReplicaInfo.from_pb(r) for r in m.replicas),
            term=m.term,
            commit_index=m.commit_index,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamState:
    """A stream's counters. ``subjects`` only with ``stream_info(subjects_filter=...)``;
    ``deleted`` only with ``stream_info(deleted_details=True)``: the sequences between
    ``first_seq`` and ``last_seq`` that hold no message, ascending. A node cuts the list
    short, to the lowest ones, at 100,000 sequences or after walking a million stored
    messages looking for them (``DELETED_DETAILS_MAX``, ``DELETED_SCAN_MSGS_MAX`` in
    ``cluster/services/streams.py``): fewer than ``num_deleted`` means cut short."""

    messages: int
    bytes: int
    first_seq: int
    first_ts_ns: int
    last_seq: int
    last_ts_ns: int
    num_deleted: int = 0
    num_subjects: int = 0
    subjects: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    deleted: tuple[int, ...] = ()
    consumer_count: int = 0

    @classmethod
    def from_pb(cls, m: pb.StreamState) -> StreamState:
        return cls(
            messages=m.messages,
            bytes=m.bytes,
            first_seq=m.first_seq,
            first_ts_ns=m.first_ts_ns,
            last_seq=m.last_seq,
            last_ts_ns=m.last_ts_ns,
            num_deleted=m.num_deleted,
            num_subjects=m.num_subjects,
            subjects=MappingProxyType(dict(m.subjects)),
            deleted=tuple(m.deleted),
            consumer_count=m.consumer_count,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamInfo:
    """A stream's config, state and group. ``state_known`` is False when no replica could
    answer with the state (every node hosting it down, or a leader still being elected):
    ``state`` is then all zeros, not an empty stream."""

    config: StreamConfig
    state: StreamState
    cluster: GroupInfo | None
    created_ns: int
    mirror: StreamSourceInfo | None = None
    sources: tuple[StreamSourceInfo, ...] = ()
    state_known: bool = True

    @classmethod
    def from_pb(cls, m: pb.StreamInfo) -> StreamInfo:
        return cls(
            config=StreamConfig.from_dict(json.loads(m.config_json)),
            state=StreamState.from_pb(m.state),
            cluster=GroupInfo.from_pb(m.cluster) if m.HasField("cluster") else None,
            created_ns=m.created_ns,
            mirror=StreamSourceInfo.from_pb(m.mirror) if m.HasField("mirror") else None,
            sources=tuple(StreamSourceInfo.from_pb(s) for s in m.sources),
            state_known=m.HasField("state"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSourceInfo:
    """A mirror's or source's link, as the copying stream's leader reports it.

    ``external``: the origin cluster's addresses (empty: this cluster). ``lag``: origin
    messages not copied yet, as last seen; ``active_ns``: since the origin was last heard
    from (-1: never, or no link runs, ``running`` False); ``error``: the link's last error
    (None: none). ``last_origin_seq`` is the replicated last origin sequence stored;
    ``skipped`` the origin ranges (first, last) removed before they could be copied (newest
    last, bounded), ``skipped_msgs`` all of them counted."""

    name: str
    external: tuple[str, ...] = ()
    lag: int = 0
    active_ns: int = -1
    error: str | None = None
    last_origin_seq: int = 0
    skipped: tuple[tuple[int, int], ...] = ()
    skipped_msgs: int = 0
    filter_subject: str | None = None
    running: bool = False

    @classmethod
    def from_pb(cls, m: pb.StreamSourceInfo) -> StreamSourceInfo:
        return cls(
            name=m.name,
            external=tuple(m.external_api),
            lag=m.lag,
            active_ns=m.active_ns,
            error=m.error or None,
            last_origin_seq=m.last_origin_seq,
            skipped=tuple((r.first_seq, r.last_seq) for r in m.skipped),
            skipped_msgs=m.skipped_msgs,
            filter_subject=m.filter_subject or None,
            running=m.running,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SequenceInfo:
    consumer_seq: int
    stream_seq: int
    last_active_ns: int = 0

    @classmethod
    def from_pb(cls, m: pb.SequenceInfo) -> SequenceInfo:
        return cls(
            consumer_seq=m.consumer_seq, stream_seq=m.stream_seq, last_active_ns=m.last_active_ns
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerInfo:
    stream: str
    name: str
    config: ConsumerConfig
    created_ns: int
    delivered: SequenceInfo
    ack_floor: SequenceInfo
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    num_pending: int
    paused: bool = False
    pause_remaining_ns: int = 0
    cluster: GroupInfo | None = None
    push_bound: bool = False

    @classmethod
    def from_pb(cls, m: pb.ConsumerInfo) -> ConsumerInfo:
        return cls(
            stream=m.stream,
            name=m.name,
            config=ConsumerConfig.from_dict(json.loads(m.config_json)),
            created_ns=m.created_ns,
            delivered=SequenceInfo.from_pb(m.delivered),
            ack_floor=SequenceInfo.from_pb(m.ack_floor),
            num_ack_pending=m.num_ack_pending,
            num_redelivered=m.num_redelivered,
            num_waiting=m.num_waiting,
            num_pending=m.num_pending,
            paused=m.paused,
            pause_remaining_ns=m.pause_remaining_ns,
            cluster=GroupInfo.from_pb(m.cluster) if m.HasField("cluster") else None,
            push_bound=m.push_bound,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseInfo:
    paused: bool
    pause_until_ns: int
    pause_remaining_ns: int

    @classmethod
    def from_pb(cls, m: pb.PauseConsumerResponse) -> PauseInfo:
        return cls(
            paused=m.paused,
            pause_until_ns=m.pause_until_ns,
            pause_remaining_ns=m.pause_remaining_ns,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RawStreamMsg:
    """A stored message read directly (``get_msg``, ``get_last_msg``): no ack token."""

    stream: str
    subject: str
    seq: int
    ts_ns: int
    data: bytes
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    @classmethod
    def from_pb(cls, stream: str, m: pb.Msg) -> RawStreamMsg:
        return cls(
            stream=stream,
            subject=m.subject,
            seq=m.seq,
            ts_ns=m.ts_ns,
            data=bytes(m.data),
            headers=MappingProxyType(dict(m.headers)) if m.headers else _EMPTY,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """One node in cluster info. ``described``: the answering node has heard the node's
    placement description (its ``cluster``, ``tags``, ``free_bytes``, ``version``); when
    False those are empty. ``removed``: taken out with ``remove_peer`` (no replica is
    placed on it any more)."""

    name: str
    addr: str
    online: bool
    last_seen_ns: int
    voter: bool
    described: bool = False
    cluster: str = ""
    tags: tuple[str, ...] = ()
    free_bytes: int = 0
    version: str = ""
    removed: bool = False

    @classmethod
    def from_pb(cls, m: pb.NodeInfo) -> NodeInfo:
        return cls(
            name=m.name,
            addr=m.addr,
            online=m.online,
            last_seen_ns=m.last_seen_ns,
            voter=m.voter,
            described=m.described,
            cluster=m.cluster,
            tags=tuple(m.tags),
            free_bytes=m.free_bytes,
            version=m.version,
            removed=m.removed,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterGroup:
    """A group of the cluster: the meta group (``stream`` None) or a stream's group."""

    account: str | None
    stream: str | None
    group: GroupInfo

    @classmethod
    def from_pb(cls, m: pb.ClusterGroup) -> ClusterGroup:
        meta = m.kind == pb.GROUP_KIND_META
        return cls(
            account=None if meta else m.account,
            stream=None if meta else m.stream,
            group=GroupInfo.from_pb(m.group),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterInfo:
    name: str
    meta_leader: str | None
    nodes: tuple[NodeInfo, ...]
    groups: tuple[ClusterGroup, ...]
    answered_by: str

    @classmethod
    def from_pb(cls, m: pb.ClusterInfo) -> ClusterInfo:
        return cls(
            name=m.name,
            meta_leader=m.meta_leader or None,
            nodes=tuple(NodeInfo.from_pb(n) for n in m.nodes),
            groups=tuple(ClusterGroup.from_pb(g) for g in m.groups),
            answered_by=m.answered_by,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class MsgMetadata:
    """What a delivery's ack token says. ``domain`` None: no domain (``_``) or a v1 token;
    ``account`` None for a v1 token. ``timestamp_ns`` is the message's stored time."""

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    num_pending: int
    domain: str | None = None
    account: str | None = None

    @classmethod
    def from_reply(cls, reply: str) -> MsgMetadata:
        """Parse an ack token; ``InvalidArgumentError`` (field ``reply``) if it is not one."""
        tokens = reply.split(".")
        n = len(tokens)
        if n < 2 or tuple(tokens[:2]) != _ACK_PREFIX:
            raise InvalidArgumentError("reply", "not an ack token: must start with $JS.ACK.")
        if n == _V1_TOKENS:
            domain, account, rest = None, None, tokens[2:]
        elif n >= _V2_TOKENS_MIN:
            domain = None if tokens[2] == _NO_DOMAIN else _name(tokens[2], "domain")
            account, rest = _name(tokens[3], "account"), tokens[4:11]
        else:
            raise InvalidArgumentError("reply", f"ack token has {n} tokens; 9 or 11+ expected")
        return cls(
            stream=_name(rest[0], "stream"),
            consumer=_name(rest[1], "consumer"),
            num_delivered=_number(rest[2], "delivered count"),
            stream_seq=_number(rest[3], "stream sequence"),
            consumer_seq=_number(rest[4], "consumer sequence"),
            timestamp_ns=_number(rest[5], "timestamp"),
            num_pending=_number(rest[6], "pending count"),
            domain=domain,
            account=account,
        )


def _name(token: str, what: str) -> str:
    if not token or any(c in token for c in " \t\r\n*>"):
        raise InvalidArgumentError("reply", f"ack token: bad {what} token {token!r}")
    return token


def _number(token: str, what: str) -> int:
    if not token.isascii() or not token.isdigit():
        raise InvalidArgumentError("reply", f"ack token: {what} is not a number: {token!r}")
    return int(token)
