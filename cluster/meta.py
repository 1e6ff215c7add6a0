"""The meta state machine: stream and consumer assignments, replicated by the meta group.

``MetaState.apply(entry) -> result`` is deterministic: the result and the new state depend
only on the entry (``cluster/meta_entries.py``) and the state before it, never on a clock,
the node, or the order of a dict; so every node that applies the meta log holds the same
definitions. Time is the leader's stamp in the entry, floored at the last applied stamp so
a new leader whose clock lags cannot make creation times go backwards.

Refusals. ``apply`` validates everything BEFORE changing anything and raises the refusal
(``InvalidArgumentError`` naming the field, ``AlreadyExistsError``, ``NotFoundError``,
``LimitError``, ``ConflictError``); the state is then unchanged. A refusal is an ordinary,
replicated outcome (every replica refuses the same entry), so the Raft adapter must hand it
to the proposer as the entry's result and keep going (``apply_data`` does exactly that);
only ``DataLossError`` (an unreadable entry or snapshot) and ``InvariantError`` (a bug)
mean the replica cannot go on.

The state, per account: streams (``StreamAssignment``: config, peers with the preferred
leader first, Raft group id, creation time) and their consumers (``ConsumerAssignment``);
plus the peers removed from the cluster (``PeerRemove``; ``PeerAdd`` readmits one), the
nodes added to it after it was formed, with their addresses (``NodeAdd``), and the nodes
taken out of it for good (``NodeForget``). A
``SubList`` per account, rebuilt from the streams and never snapshotted, answers "which
stream captures this subject".

Rules applied (see each ``_apply_*``): a stream name is unique per account; no two streams
of an account capture overlapping subjects (``check_no_overlap``) nor mirror or source
each other in a cycle (``check_no_cycle``); updates follow
``check_update``; a consumer needs an existing stream, a unique name on it, the stream's
``max_consumers``, the workqueue rules (``check_for_stream``), and ``num_replicas`` 0 or
the stream's (consumers replicate through their stream's group, docs/cluster-design.md);
deleting a stream deletes its consumers; peers are distinct, never a removed peer, and
exactly ``num_replicas`` of them on create (fewer only while a group awaits repair).

Ownership: a ``MetaState`` belongs to the one thread or loop that applies the meta log;
queries return immutable values that callers may keep.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from raftstream.cluster.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.auth_values import AccountLimits
from raftstream.cluster.config import Address
from raftstream.cluster.meta_entries import (
    AddConsumer,
    AddStream,
    DeleteConsumer,
    DeleteStream,
    MetaEntry,
    NodeAdd,
    NodeForget,
    PeerAdd,
    PeerRemove,
    ReassignGroup,
    RepairCleared,
    RepairDone,
    RepairStart,
    UpdateConsumer,
    UpdateStream,
    decode_entry,
    stream_group_id,
)
from raftstream.cluster.meta_snapshot import decode_snapshot, encode_snapshot
from raftstream.cluster.names import validate_account, validate_node_name
from raftstream.cluster.repair_state import RepairBook, RepairRecorded
from raftstream.engine.consumer_config import (
    ConsumerConfig,
    RetentionKind,
    check_for_stream,
)
from raftstream.engine.consumer_config import check_update as check_consumer_update
from raftstream.engine.stream_config import (
    StorageType,
    StreamConfig,
    check_create,
    check_no_cycle,
    check_no_overlap,
)
from raftstream.engine.stream_config import check_update as check_stream_update
from raftstream.engine.subjects import (
    OverlapIndex,
    subjects_collide,
    validate_filter,
    validate_subject,
)
from raftstream.engine.sublist import SubList, Subscription
from raftstream.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
    InvariantError,
    LimitError,
    NotFoundError,
    RaftStreamError,
    invariant,
)

__all__ = [
    "LIST_LIMIT_MAX",
    "ConsumerAdded",
    "ConsumerAssignment",
    "ConsumerDeleted",
    "ConsumerUpdated",
    "GroupReassigned",
    "MetaResult",
    "MetaState",
    "NodeAdded",
    "NodeForgotten",
    "Page",
    "PeerAdded",
    "PeerRemoved",
    "StreamAdded",
    "StreamAssignment",
    "StreamDeleted",
    "StreamUpdated",
    "check_account_limits",
    "stream_exists_error",
    "subjects_undescribed",
]

# JetStream's API list limit (JSApiListLimit): one page of a list or names call.
LIST_LIMIT_MAX = 256
SUBJECT_MEMO_MAX = 65_536  # memoised stream_for_subject answers, at most
# Errors that are outcomes of an entry, not failures of the replica.
_REFUSALS = (InvalidArgumentError, AlreadyExistsError, NotFoundError, LimitError, ConflictError)

_T = TypeVar("_T")


# -- values ---------------------------------------------------------------------------------


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


# -- per-account state ------------------------------------------------------------------------


class _Account:
    """One account's streams, consumers and subject index. Mutated only by ``MetaState``."""

    def __init__(self) -> None:
        self.streams: dict[str, StreamAssignment] = {}
        self.consumers: dict[str, dict[str, ConsumerAssignment]] = {}
        # No cache: lookups come from the API path at a modest rate, and the cache would
        # be invalidated by every stream change anyway.
        self.sublist = SubList(cache_entries_max=0)

    def put_stream(self, sa: StreamAssignment) -> None:
        """Add or replace a stream (its consumers stay), keeping the subject index in step.
        Called only after every check passed."""
        try:
            old = self.streams.get(sa.name)
            if old is not None:
                for s in old.config.subjects:
                    self.sublist.remove(Subscription(s, sa.name))
            self.streams[sa.name] = sa
            self.consumers.setdefault(sa.name, {})
            for s in sa.config.subjects:
                self.sublist.insert(Subscription(s, sa.name))
        except RaftStreamError as exc:
            # The index disagreed with the streams: a bug, and the state is now half-changed.
            # Never let it pass as a refusal (apply_data returns refusals as results).
            raise InvariantError(f"subject index out of step: {exc}") from exc

    def drop_stream(self, name: str) -> dict[str, ConsumerAssignment]:
        sa = self.streams.pop(name)
        try:
            for s in sa.config.subjects:
                self.sublist.remove(Subscription(s, name))
        except RaftStreamError as exc:
            raise InvariantError(f"subject index out of step: {exc}") from exc
        return self.consumers.pop(name)

    def configs_except(self, name: str) -> Iterator[StreamConfig]:
        return (sa.config for n, sa in self.streams.items() if n != name)


# -- the state machine --------------------------------------------------------------------------


class MetaState:
    """The replicated definitions of a cluster (see the module docstring)."""

    def __init__(self) -> None:
        self._accounts: dict[str, _Account] = {}
        self._removed: set[str] = set()
        self._added: dict[str, str] = {}  # node -> address: nodes NodeAdd added
        self._forgotten: set[str] = set()  # nodes NodeForget took out for good
        self._last_ts_ns = 0
        # Repairs after data loss (docs/cluster-design.md, "Repair after data loss").
        self.repairs = RepairBook()
        # (account, subject) -> stream_for_subject's answer, for the publish hot path;
        # emptied by every apply and restore (anything that could change the answer).
        self._subject_memo: dict[tuple[str, str], StreamAssignment | None] = {}

    # -- applying ------------------------------------------------------------------------------

    def apply(self, entry: MetaEntry) -> MetaResult:
        """Apply one committed entry and return its result, or raise its refusal with the
        state unchanged (see the module docstring). Deterministic."""
        self._subject_memo.clear()
        now = max(entry.ts_ns, self._last_ts_ns)
        result = self._dispatch(entry, now)
        # Only an applied entry moves time: a refused one changed nothing, time included.
        self._last_ts_ns = now
        return result

    def apply_data(self, data: bytes) -> MetaResult | RaftStreamError:
        """Decode and apply one Raft entry's data; a refusal is RETURNED, as the entry's
        result for its proposer (raising would halt the group). ``DataLossError`` (unreadable
        entry) and ``InvariantError`` still raise: the replica must stop."""
        entry = decode_entry(data)
        try:
            return self.apply(entry)
        except _REFUSALS as refusal:
            return refusal

    def _dispatch(self, entry: MetaEntry, now: int) -> MetaResult:
        if isinstance(entry, AddStream):
            return self._apply_add_stream(entry, now)
        if isinstance(entry, UpdateStream):
            return self._apply_update_stream(entry)
        if isinstance(entry, DeleteStream):
            return self._apply_delete_stream(entry)
        if isinstance(entry, AddConsumer):
            return self._apply_add_consumer(entry, now)
        if isinstance(entry, UpdateConsumer):
            return self._apply_update_consumer(entry)
        if isinstance(entry, DeleteConsumer):
            return self._apply_delete_consumer(entry)
        if isinstance(entry, PeerRemove):
            return self._apply_peer_remove(entry)
        if isinstance(entry, PeerAdd):
            return self._apply_peer_add(entry)
        if isinstance(entry, NodeAdd):
            return self._apply_node_add(entry)
        if isinstance(entry, NodeForget):
            return self._apply_node_forget(entry)
        if isinstance(entry, RepairStart | RepairCleared | RepairDone):
            return self.repairs.apply(entry)
        invariant(isinstance(entry, ReassignGroup), f"unknown meta entry {type(entry).__name__}")
        return self._apply_reassign(entry)

    def _apply_add_stream(self, e: AddStream, now: int) -> StreamAdded:
        validate_account(e.account)
        cfg = check_create(e.config)
        acct = self._accounts.get(e.account)
        existing = acct.streams.get(cfg.name) if acct is not None else None
        if existing is not None:
            if existing.config == cfg:
                return StreamAdded(existing, created=False)
            raise stream_exists_error(existing.config, cfg)
        if acct is not None:
            check_no_overlap(cfg, acct.configs_except(cfg.name))
            check_no_cycle(cfg, acct.configs_except(cfg.name))
        self._check_peers(e.peers, cfg.num_replicas, exact=True)
        sa = StreamAssignment(
            account=e.account,
            config=cfg,
            peers=e.peers,
            group=stream_group_id(e.account, cfg.name),
            created_ns=now,
        )
        self._accounts.setdefault(e.account, _Account()).put_stream(sa)
        return StreamAdded(sa, created=True)

    def _apply_update_stream(self, e: UpdateStream) -> StreamUpdated:
        acct, old = self._stream(e.account, e.config.name)
        cfg = check_stream_update(old.config, e.config)
        check_no_overlap(cfg, acct.configs_except(cfg.name))
        check_no_cycle(cfg, acct.configs_except(cfg.name))
        if cfg.num_replicas != old.config.num_replicas:
            for ca in sorted(acct.consumers[cfg.name].values(), key=lambda c: c.name):
                if ca.config.num_replicas not in (0, cfg.num_replicas):
                    raise InvalidArgumentError(
                        "num_replicas",
                        f"consumer {ca.name!r} has num_replicas {ca.config.num_replicas}; "
                        "set it to 0 first (consumers replicate with their stream)",
                    )
        self._check_prior(old, e.prior_peers)
        self._check_peers(e.peers, cfg.num_replicas, exact=False)
        sa = replace(old, config=cfg, peers=e.peers)
        acct.put_stream(sa)
        return StreamUpdated(sa, previous=old)

    def _apply_delete_stream(self, e: DeleteStream) -> StreamDeleted:
        acct, sa = self._stream(e.account, e.name)
        consumers = acct.drop_stream(e.name)
        if not acct.streams:
            # An account without streams holds nothing: drop it, so the state (and its
            # snapshot) is the same as if the account had never been used.
            del self._accounts[e.account]
        return StreamDeleted(sa, consumers=tuple(sorted(consumers)))

    def _apply_add_consumer(self, e: AddConsumer, now: int) -> ConsumerAdded:
        acct, sa = self._stream(e.account, e.stream)
        name = _consumer_name(e.config)
        consumers = acct.consumers[e.stream]
        existing = consumers.get(name)
        if existing is not None:
            if existing.config == e.config:
                return ConsumerAdded(existing, created=False)
            raise consumer_exists_error(name, existing.config, e.config)
        limit = sa.config.max_consumers
        if limit > 0 and len(consumers) >= limit:
            raise LimitError(
                f"stream {sa.name!r} has reached max_consumers {limit}",
                field="max_consumers",
            )
        _check_consumer_rules(sa, e.config, (c.config for c in consumers.values()))
        ca = ConsumerAssignment(account=e.account, stream=e.stream, config=e.config, created_ns=now)
        consumers[name] = ca
        return ConsumerAdded(ca, created=True)

    def _apply_update_consumer(self, e: UpdateConsumer) -> ConsumerUpdated:
        acct, sa = self._stream(e.account, e.stream)
        name = _consumer_name(e.config)
        consumers = acct.consumers[e.stream]
        old = consumers.get(name)
        if old is None:
            raise NotFoundError(f"consumer {name!r} not found on stream {e.stream!r}", field="name")
        check_consumer_update(old.config, e.config)
        others = (c.config for n, c in consumers.items() if n != name)
        _check_consumer_rules(sa, e.config, others)
        ca = replace(old, config=e.config)
        consumers[name] = ca
        return ConsumerUpdated(ca)

    def _apply_delete_consumer(self, e: DeleteConsumer) -> ConsumerDeleted:
        acct, _ = self._stream(e.account, e.stream)
        consumers = acct.consumers[e.stream]
        ca = consumers.pop(e.name, None)
        if ca is None:
            raise NotFoundError(
                f"consumer {e.name!r} not found on stream {e.stream!r}", field="name"
            )
        return ConsumerDeleted(ca)

    def _apply_peer_remove(self, e: PeerRemove) -> PeerRemoved:
        validate_node_name(e.peer, "peer")
        newly = e.peer not in self._removed
        self._removed.add(e.peer)
        groups = tuple(sa.group for sa in self.streams_for_node(e.peer))
        return PeerRemoved(e.peer, newly_removed=newly, groups=groups)

    def _apply_peer_add(self, e: PeerAdd) -> PeerAdded:
        validate_node_name(e.peer, "peer")
        readmitted = e.peer in self._removed
        self._removed.discard(e.peer)
        return PeerAdded(e.peer, readmitted=readmitted)

    def _apply_node_add(self, e: NodeAdd) -> NodeAdded:
        validate_node_name(e.node, "peer")
        address = str(Address.parse(e.address, "address"))
        known = self._added.get(e.node)
        if known is not None and known != address:
            raise ConflictError(
                f"node {e.node!r} was added at {known}, not {address}", field="address"
            )
        for other, addr in self._added.items():
            if addr == address and other != e.node:
                raise ConflictError(f"node {other!r} serves on {address}", field="address")
        self._added[e.node] = address
        self._forgotten.discard(e.node)
        return NodeAdded(e.node, address, added=known is None)

    def _apply_node_forget(self, e: NodeForget) -> NodeForgotten:
        validate_node_name(e.node, "peer")
        if e.node in self._forgotten:
            return NodeForgotten(e.node, forgotten=False)
        if e.node not in self._removed:
            raise ConflictError(
                f"node {e.node!r} was not removed: remove it first"
                f" (raftstream cluster peer-remove {e.node})",
                field="peer",
            )
        groups = [sa.group for sa in self.streams_for_node(e.node)]
        if groups:
            raise ConflictError(
                f"node {e.node!r} still holds replicas of {len(groups)} stream group(s)"
                f" ({', '.join(sorted(groups)[:5])}): wait until they are placed elsewhere",
                field="peer",
            )
        self._removed.discard(e.node)
        self._added.pop(e.node, None)
        self._forgotten.add(e.node)
        return NodeForgotten(e.node, forgotten=True)

    def _apply_reassign(self, e: ReassignGroup) -> GroupReassigned:
        acct, old = self._stream(e.account, e.stream)
        self._check_prior(old, e.prior_peers)
        self._check_peers(e.peers, old.config.num_replicas, exact=False)
        sa = replace(old, peers=e.peers)
        acct.put_stream(sa)
        return GroupReassigned(sa, previous=old)

    # -- checks shared by the applies --------------------------------------------------------

    def _stream(self, account: str, name: str) -> tuple[_Account, StreamAssignment]:
        validate_account(account)
        acct = self._accounts.get(account)
        sa = acct.streams.get(name) if acct is not None else None
        if acct is None or sa is None:
            raise NotFoundError(f"stream {name!r} not found", field="stream")
        return acct, sa

    def _check_peers(self, peers: tuple[str, ...], replicas: int, *, exact: bool) -> None:
        """Distinct, valid, not removed; ``replicas`` of them (``exact``) or 1..``replicas``
        (an update or a repair may leave a group short while no node can take a replica)."""
        for p in peers:
            validate_node_name(p, "peers")
            if p in self._removed:
                raise InvalidArgumentError("peers", f"peer {p!r} was removed from the cluster")
        if len(set(peers)) != len(peers):
            raise InvalidArgumentError("peers", "a node may host only one replica of a group")
        if exact and len(peers) != replicas:
            raise InvalidArgumentError("peers", f"need {replicas} peers, got {len(peers)}")
        if not 1 <= len(peers) <= replicas:
            raise InvalidArgumentError("peers", f"need 1 to {replicas} peers, got {len(peers)}")

    @staticmethod
    def _check_prior(sa: StreamAssignment, prior: tuple[str, ...]) -> None:
        if prior != sa.peers:
            raise ConflictError(
                f"group {sa.group} was re-placed since the entry was planned; plan again",
                field="peers",
            )

    # -- queries -------------------------------------------------------------------------------

    @property
    def last_ts_ns(self) -> int:
        """The time of the last applied entry (leader-stamped, never decreasing)."""
        return self._last_ts_ns

    @property
    def removed_peers(self) -> frozenset[str]:
        return frozenset(self._removed)

    @property
    def forgotten_nodes(self) -> frozenset[str]:
        """The nodes ``NodeForget`` took out of the cluster for good."""
        return frozenset(self._forgotten)

    @property
    def added_nodes(self) -> Mapping[str, str]:
        """The nodes ``NodeAdd`` added to the cluster after it was formed, and their
        addresses (``host:port``), by name."""
        return MappingProxyType(dict(sorted(self._added.items())))

    def accounts(self) -> tuple[str, ...]:
        """Accounts with at least one stream, sorted."""
        return tuple(sorted(self._accounts))

    def stream(self, account: str, name: str) -> StreamAssignment:
        """The stream's assignment; ``NotFoundError`` (field ``stream``) when absent."""
        return self._stream(account, name)[1]

    def consumer(self, account: str, stream: str, name: str) -> ConsumerAssignment:
        """The consumer's assignment; ``NotFoundError`` naming ``stream`` or ``name``."""
        acct, _ = self._stream(account, stream)
        ca = acct.consumers[stream].get(name)
        if ca is None:
            raise NotFoundError(f"consumer {name!r} not found on stream {stream!r}", field="name")
        return ca

    def all_streams(self) -> tuple[StreamAssignment, ...]:
        """Every stream of every account, sorted by (account, name)."""
        return tuple(
            self._accounts[a].streams[n]
            for a in sorted(self._accounts)
            for n in sorted(self._accounts[a].streams)
        )

    def streams_for_node(self, node: str) -> tuple[StreamAssignment, ...]:
        """The streams whose group ``node`` hosts (the groups it must run), sorted."""
        return tuple(sa for sa in self.all_streams() if node in sa.peers)

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        """The stream's consumers sorted by name (NotFoundError when the stream is absent)."""
        acct, _ = self._stream(account, stream)
        consumers = acct.consumers[stream]
        return tuple(consumers[n] for n in sorted(consumers))

    def assets(self) -> dict[str, int]:
        """Groups hosted per node (nodes hosting none are absent), for placement."""
        out: dict[str, int] = {}
        for sa in self.all_streams():
            for p in sa.peers:
                out[p] = out.get(p, 0) + 1
        return out

    def stream_for_subject(self, account: str, subject: str) -> StreamAssignment | None:
        """The stream of ``account`` that captures literal ``subject``, or None.

        At most one can: subjects of an account's streams never overlap.
        ``InvalidArgumentError`` (field ``subject``) for a filter or malformed subject.
        Memoised (every publish asks): only valid subjects' answers are kept.
        """
        key = (account, subject)
        try:
            return self._subject_memo[key]
        except KeyError:
            pass
        validate_account(account)
        validate_subject(subject, "subject")
        acct = self._accounts.get(account)
        if acct is None:
            return None
        names = {sub.sid for sub in acct.sublist.match(subject).plain}
        invariant(len(names) <= 1, f"subject {subject!r} captured by streams {names}")
        sa = acct.streams[str(names.pop())] if names else None
        if len(self._subject_memo) >= SUBJECT_MEMO_MAX:
            self._subject_memo.clear()  # many distinct subjects: start over, stay bounded
        self._subject_memo[key] = sa
        return sa

    def list_streams(
        self, account: str, *, offset: int = 0, limit: int = 0, subject: str | None = None
    ) -> Page[StreamAssignment]:
        """The account's streams sorted by name, one page; with ``subject`` (a filter) only
        streams capturing a subject that collides with it (JetStream's subject filter)."""
        validate_account(account)
        if subject is not None:
            validate_filter(subject, "subject")
        acct = self._accounts.get(account)
        streams = [] if acct is None else [acct.streams[n] for n in sorted(acct.streams)]
        if subject is not None:
            streams = [
                sa
                for sa in streams
                if any(subjects_collide(subject, s) for s in sa.config.subjects)
            ]
        return _page(streams, offset, limit)

    def stream_names(
        self, account: str, *, offset: int = 0, limit: int = 0, subject: str | None = None
    ) -> Page[str]:
        page = self.list_streams(account, offset=offset, limit=limit, subject=subject)
        return Page(tuple(sa.name for sa in page.items), page.total, page.offset, page.limit)

    def list_consumers(
        self, account: str, stream: str, *, offset: int = 0, limit: int = 0
    ) -> Page[ConsumerAssignment]:
        return _page(list(self.consumers_of(account, stream)), offset, limit)

    def consumer_names(
        self, account: str, stream: str, *, offset: int = 0, limit: int = 0
    ) -> Page[str]:
        page = self.list_consumers(account, stream, offset=offset, limit=limit)
        return Page(tuple(ca.name for ca in page.items), page.total, page.offset, page.limit)

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as bytes (canonical: equal states give equal bytes)."""
        return encode_snapshot(
            streams=self.all_streams(),
            consumers=[ca for sa in self.all_streams() for ca in self._consumers_sorted(sa)],
            removed_peers=sorted(self._removed),
            added_nodes=dict(sorted(self._added.items())),
            forgotten_nodes=sorted(self._forgotten),
            last_ts_ns=self._last_ts_ns,
            repairs=self.repairs.to_json(),
        )

    def restore(self, data: bytes) -> None:
        """Replace the whole state by a ``snapshot()``'s. ``DataLossError`` (and the state
        unchanged) when ``data`` is not one."""
        snap = decode_snapshot(data)
        fresh = MetaState()
        fresh._load(snap.streams, snap.consumers, snap.removed_peers, snap.last_ts_ns)
        fresh.check_invariants()
        repairs = RepairBook.from_json(snap.repairs)
        self._accounts, self._removed = fresh._accounts, fresh._removed
        self._added = dict(snap.added_nodes)
        self._forgotten = set(snap.forgotten_nodes)
        self.repairs = repairs
        self._last_ts_ns = fresh._last_ts_ns
        self._subject_memo.clear()

    @classmethod
    def from_snapshot(cls, data: bytes) -> MetaState:
        state = cls()
        state.restore(data)
        return state

    def _consumers_sorted(self, sa: StreamAssignment) -> list[ConsumerAssignment]:
        consumers = self._accounts[sa.account].consumers[sa.name]
        return [consumers[n] for n in sorted(consumers)]

    def _load(
        self,
        streams: Iterable[StreamAssignment],
        consumers: Iterable[ConsumerAssignment],
        removed: Iterable[str],
        last_ts_ns: int,
    ) -> None:
        for sa in streams:
            self._accounts.setdefault(sa.account, _Account()).put_stream(sa)
        for ca in consumers:
            acct = self._accounts.get(ca.account)
            invariant(acct is not None and ca.stream in acct.streams, "consumer without stream")
            if acct is not None:
                acct.consumers[ca.stream][ca.name] = ca
        self._removed = set(removed)
        self._last_ts_ns = last_ts_ns

    # -- invariants ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``InvariantError`` if the state breaks a rule ``apply`` maintains."""
        for account, acct in self._accounts.items():
            invariant(bool(acct.streams), f"account {account!r} kept without streams")
            invariant(set(acct.consumers) == set(acct.streams), "consumer map out of sync")
            indexed = {(s.subject, s.sid) for s in acct.sublist.subscriptions()}
            wanted = {(s, n) for n, sa in acct.streams.items() for s in sa.config.subjects}
            invariant(indexed == wanted, f"subject index of {account!r} out of sync")
            _check_no_overlap(account, acct)
            for name, sa in acct.streams.items():
                _check_stream_invariants(account, name, sa, acct)


def _check_no_overlap(account: str, acct: _Account) -> None:
    """No subject of one stream of ``acct`` overlaps one of another (each stream's own are
    disjoint by its config's rules). One ``OverlapIndex`` query per subject, not a
    comparison per pair: this runs on every snapshot restore, at every restart."""
    owners = [(s, name) for name, sa in acct.streams.items() for s in sa.config.subjects]
    index = OverlapIndex([s for s, _ in owners])
    start = 0
    for name, sa in acct.streams.items():
        end = start + len(sa.config.subjects)
        own = ((1 << end) - 1) ^ ((1 << start) - 1)  # this stream's bits
        for s in sa.config.subjects:
            hits = index.colliding(s) & ~own
            other = owners[(hits & -hits).bit_length() - 1][1] if hits else None
            invariant(other is None, f"{name!r} overlaps {other!r} in account {account!r}")
        start = end


def _check_stream_invariants(account: str, name: str, sa: StreamAssignment, acct: _Account) -> None:
    invariant(sa.account == account and sa.name == name, f"stream {name!r} filed wrongly")
    invariant(sa.group == stream_group_id(account, name), f"group id of {name!r}")
    invariant(len(set(sa.peers)) == len(sa.peers), f"duplicate peer in {sa.group}")
    invariant(len(sa.peers) <= sa.config.num_replicas, f"too many peers in {sa.group}")
    for cname, ca in acct.consumers[name].items():
        invariant(ca.name == cname and ca.stream == name, f"consumer {cname!r} filed wrongly")
        invariant(
            ca.config.num_replicas in (0, sa.config.num_replicas),
            f"consumer {cname!r} replicas differ from its stream's",
        )


def _consumer_name(config: ConsumerConfig) -> str:
    name = config.consumer_name
    if name is None:
        raise InvalidArgumentError(
            "name", "a meta entry needs the consumer's name (the leader names ephemerals)"
        )
    return name


def subjects_undescribed(cfg: StreamConfig) -> bool:
    """Whether a stream stores subjects its ``subjects`` do not describe (a subject
    transform, a mirror, sources): consumer filters are then not checked against them."""
    return cfg.subject_transform is not None or cfg.mirror is not None or bool(cfg.sources)


def _check_consumer_rules(
    sa: StreamAssignment, config: ConsumerConfig, others: Iterable[ConsumerConfig]
) -> None:
    """The rules that depend on the stream: replicas, workqueue, filters in its subjects."""
    replicas = sa.config.num_replicas
    if config.num_replicas not in (0, replicas):
        raise InvalidArgumentError(
            "num_replicas",
            f"must be 0 or the stream's {replicas}: a consumer replicates through its "
            "stream's group",
        )
    # With a subject transform the stream stores rewritten subjects, which its ``subjects``
    # do not describe; filters are then not checked against them (they may name either).
    # Nor are they for a mirror (no subjects; it stores its origin's) or a stream with
    # sources (it stores theirs too), as JetStream does (LOG_FEATURE_LINKED_FILTERS).
    subjects = None if subjects_undescribed(sa.config) else sa.config.subjects
    check_for_stream(
        config,
        retention=RetentionKind(sa.config.retention),
        stream_subjects=subjects,
        others=others,
    )


def _page(items: list[_T], offset: int, limit: int) -> Page[_T]:
    """``limit`` 0 means ``LIST_LIMIT_MAX``; offsets past the end give an empty page."""
    if offset < 0:
        raise InvalidArgumentError("offset", "must not be negative")
    if not 0 <= limit <= LIST_LIMIT_MAX:
        raise InvalidArgumentError("limit", f"must be 0 (the default) to {LIST_LIMIT_MAX}")
    limit = limit or LIST_LIMIT_MAX
    return Page(tuple(items[offset : offset + limit]), len(items), offset, limit)


# -- account limits (issue 10) -------------------------------------------------------------------


def stream_exists_error(have: StreamConfig, asked: StreamConfig) -> AlreadyExistsError:
    """A create of stream ``asked`` refused because it exists as ``have``: names the fields
    that differ (both configs normalised by ``check_create``)."""
    differs = _differing(have, asked)
    return AlreadyExistsError(
        f"stream {asked.name!r} already exists with a different configuration "
        f"({', '.join(differs)} differ{'s' if len(differs) == 1 else ''}: "
        "update the stream to change it: raftstream stream edit, or the SDK's update_stream)",
        field="name",
        differs=",".join(differs),
    )


def consumer_exists_error(
    name: str, have: ConsumerConfig, asked: ConsumerConfig
) -> AlreadyExistsError:
    """A create of consumer ``name`` as ``asked`` refused because it exists as ``have``:
    names the fields that differ, as ``stream_exists_error`` does."""
    differs = _differing(have, asked)
    return AlreadyExistsError(
        f"consumer {name!r} already exists with a different configuration "
        f"({', '.join(differs)} differ{'s' if len(differs) == 1 else ''}: "
        "update the consumer to change it: raftstream consumer edit, or the SDK's "
        "update_consumer)",
        field="durable_name" if asked.durable_name else "name",
        differs=",".join(differs),
    )


def _differing(have: Any, asked: Any) -> list[str]:
    """The fields of two configs of one dataclass whose values differ, in field order."""
    return [
        f.name for f in dataclasses.fields(asked) if getattr(asked, f.name) != getattr(have, f.name)
    ]


def check_account_limits(
    state: MetaState,
    account: str,
    limits: AccountLimits,
    *,
    stream: StreamConfig | None = None,
    new_consumer: bool = False,
) -> None:
    """Refuse, with ``LimitError`` naming the limit, a stream ``stream`` (new or updated) or
    a new consumer that would take ``account`` past ``limits``, counted over every stream and
    consumer of the account in the cluster (this replica's state: the meta leader's, which
    is the one that calls this before proposing).

    Storage counts reservations, as JetStream does: each stream reserves ``max_bytes`` times
    its replicas in its storage type, so a stream must set ``max_bytes`` when the account
    limits that storage (``InvalidArgumentError`` otherwise). Reserving up front makes the
    limit a promise the account cannot outgrow later, without summing live usage across
    replicas on every publish."""
    own = [sa for sa in state.all_streams() if sa.account == account]
    if stream is not None:
        existing = next((sa for sa in own if sa.name == stream.name), None)
        full = limits.max_streams is not None and len(own) + 1 > limits.max_streams
        if existing is None and full:
            raise LimitError(
                f"account {account!r} reached max_streams ({limits.max_streams})",
                limit="max_streams",
            )
        _check_storage(account, limits, stream, [sa.config for sa in own if sa.name != stream.name])
    if new_consumer and limits.max_consumers is not None:
        count = sum(len(state.consumers_of(account, sa.name)) for sa in own)
        if count + 1 > limits.max_consumers:
            raise LimitError(
                f"account {account!r} reached max_consumers ({limits.max_consumers})",
                limit="max_consumers",
            )


def _check_storage(
    account: str, limits: AccountLimits, cfg: StreamConfig, others: list[StreamConfig]
) -> None:
    memory = cfg.storage == StorageType.MEMORY
    limit_bytes = limits.max_memory_bytes if memory else limits.max_file_bytes
    if limit_bytes is None:
        return
    name = "max_memory_bytes" if memory else "max_file_bytes"
    if cfg.max_bytes <= 0:
        raise InvalidArgumentError(
            "max_bytes", f"must be set: account {account!r} has a {name} limit"
        )
    reserved = sum(
        c.max_bytes * max(1, c.num_replicas)
        for c in others
        if c.storage == cfg.storage and c.max_bytes > 0
    )
    wanted = cfg.max_bytes * max(1, cfg.num_replicas)
    if reserved + wanted > limit_bytes:
        raise LimitError(
            f"account {account!r} would reserve {reserved + wanted} bytes of {cfg.storage} "
            f"storage, over {name} ({limit_bytes})",
            limit=name,
        )
