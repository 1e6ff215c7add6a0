"""The meta state machine: stream and consumer assignments, replicated by the meta group.

``MetaState.apply(entry) -> result`` is deterministic: the result and the new state depend
only on the entry (``cluster/meta/entries.py``) and the state before it, never on a clock,
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

Where the parts live: the results and ``Page`` in ``cluster/meta/results.py``; one
account's streams, consumers and subject index (``MetaAccount``) in
``cluster/meta/account.py``; the removed, added and forgotten nodes (``MetaMembers``) in
``cluster/meta/members.py``; the consumer rules and "exists already" refusals in
``cluster/meta/rules.py``; the meta leader's account limits (``check_account_limits``) in
``cluster/meta/account_limits.py``. This module re-exports the names importers used from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from raftstream.cluster.common.names import stream_group_id, validate_account
from raftstream.cluster.meta.account import MetaAccount
from raftstream.cluster.meta.account_limits import check_account_limits
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.entries import (
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
)
from raftstream.cluster.meta.members import MetaMembers
from raftstream.cluster.meta.repairs import RepairBook
from raftstream.cluster.meta.results import (
    LIST_LIMIT_MAX,
    ConsumerAdded,
    ConsumerDeleted,
    ConsumerUpdated,
    GroupReassigned,
    MetaResult,
    NodeAdded,
    NodeForgotten,
    Page,
    PeerAdded,
    PeerRemoved,
    StreamAdded,
    StreamDeleted,
    StreamUpdated,
    page,
)
from raftstream.cluster.meta.rules import (
    check_consumer_rules,
    consumer_exists_error,
    consumer_name,
    stream_exists_error,
    subjects_undescribed,
)
from raftstream.cluster.meta.snapshot import decode_snapshot, encode_snapshot
from raftstream.engine.consumer_config import check_update as check_consumer_update
from raftstream.engine.stream_config import check_create, check_no_cycle, check_no_overlap
from raftstream.engine.stream_config import check_update as check_stream_update
from raftstream.engine.subjects import subjects_collide, validate_filter, validate_subject
from raftstream.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidArgumentError,
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

SUBJECT_MEMO_MAX = 65_536  # memoised stream_for_subject answers, at most
# Errors that are outcomes of an entry, not failures of the replica.
_REFUSALS = (InvalidArgumentError, AlreadyExistsError, NotFoundError, LimitError, ConflictError)


# -- the state machine --------------------------------------------------------------------------


class MetaState:
    """The replicated definitions of a cluster (see the module docstring)."""

    def __init__(self) -> None:
        self._accounts: dict[str, MetaAccount] = {}
        # Removed peers, added and forgotten nodes (PeerRemove, PeerAdd, NodeAdd, NodeForget).
        self.members = MetaMembers()
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
            return self.members.apply_peer_remove(entry, self._groups_of)
        if isinstance(entry, PeerAdd):
            return self.members.apply_peer_add(entry)
        if isinstance(entry, NodeAdd):
            return self.members.apply_node_add(entry)
        if isinstance(entry, NodeForget):
            return self.members.apply_node_forget(entry, self._groups_of)
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
        self.members.check_peers(e.peers, cfg.num_replicas, exact=True)
        sa = StreamAssignment(
            account=e.account,
            config=cfg,
            peers=e.peers,
            group=stream_group_id(e.account, cfg.name),
            created_ns=now,
        )
        self._accounts.setdefault(e.account, MetaAccount()).put_stream(sa)
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
        self.members.check_peers(e.peers, cfg.num_replicas, exact=False)
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
        name = consumer_name(e.config)
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
        check_consumer_rules(sa, e.config, (c.config for c in consumers.values()))
        ca = ConsumerAssignment(account=e.account, stream=e.stream, config=e.config, created_ns=now)
        consumers[name] = ca
        return ConsumerAdded(ca, created=True)

    def _apply_update_consumer(self, e: UpdateConsumer) -> ConsumerUpdated:
        acct, sa = self._stream(e.account, e.stream)
        name = consumer_name(e.config)
        consumers = acct.consumers[e.stream]
        old = consumers.get(name)
        if old is None:
            raise NotFoundError(f"consumer {name!r} not found on stream {e.stream!r}", field="name")
        check_consumer_update(old.config, e.config)
        others = (c.config for n, c in consumers.items() if n != name)
        check_consumer_rules(sa, e.config, others)
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

    def _apply_reassign(self, e: ReassignGroup) -> GroupReassigned:
        acct, old = self._stream(e.account, e.stream)
        self._check_prior(old, e.prior_peers)
        self.members.check_peers(e.peers, old.config.num_replicas, exact=False)
        sa = replace(old, peers=e.peers)
        acct.put_stream(sa)
        return GroupReassigned(sa, previous=old)

    # -- checks shared by the applies --------------------------------------------------------

    def _stream(self, account: str, name: str) -> tuple[MetaAccount, StreamAssignment]:
        validate_account(account)
        acct = self._accounts.get(account)
        sa = acct.streams.get(name) if acct is not None else None
        if acct is None or sa is None:
            raise NotFoundError(f"stream {name!r} not found", field="stream")
        return acct, sa

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
        return self.members.removed_peers

    @property
    def forgotten_nodes(self) -> frozenset[str]:
        """The nodes ``NodeForget`` took out of the cluster for good."""
        return self.members.forgotten_nodes

    @property
    def added_nodes(self) -> Mapping[str, str]:
        """The nodes ``NodeAdd`` added to the cluster after it was formed, and their
        addresses (``host:port``), by name."""
        return self.members.added_nodes

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

    def _groups_of(self, node: str) -> tuple[str, ...]:
        return tuple(sa.group for sa in self.streams_for_node(node))

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
        return page(streams, offset, limit)

    def stream_names(
        self, account: str, *, offset: int = 0, limit: int = 0, subject: str | None = None
    ) -> Page[str]:
        page = self.list_streams(account, offset=offset, limit=limit, subject=subject)
        return Page(tuple(sa.name for sa in page.items), page.total, page.offset, page.limit)

    def list_consumers(
        self, account: str, stream: str, *, offset: int = 0, limit: int = 0
    ) -> Page[ConsumerAssignment]:
        return page(list(self.consumers_of(account, stream)), offset, limit)

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
            removed_peers=sorted(self.members.removed_peers),
            added_nodes=dict(self.members.added_nodes),
            forgotten_nodes=sorted(self.members.forgotten_nodes),
            last_ts_ns=self._last_ts_ns,
            repairs=self.repairs.to_json(),
        )

    def restore(self, data: bytes) -> None:
        """Replace the whole state by a ``snapshot()``'s. ``DataLossError`` (and the state
        unchanged) when ``data`` is not one."""
        snap = decode_snapshot(data)
        fresh = MetaState()
        fresh._load(snap.streams, snap.consumers, snap.last_ts_ns)
        fresh.check_invariants()
        repairs = RepairBook.from_json(snap.repairs)
        self._accounts = fresh._accounts
        self.members = MetaMembers(
            removed=snap.removed_peers, added=snap.added_nodes, forgotten=snap.forgotten_nodes
        )
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
        last_ts_ns: int,
    ) -> None:
        for sa in streams:
            self._accounts.setdefault(sa.account, MetaAccount()).put_stream(sa)
        for ca in consumers:
            acct = self._accounts.get(ca.account)
            invariant(acct is not None and ca.stream in acct.streams, "consumer without stream")
            if acct is not None:
                acct.consumers[ca.stream][ca.name] = ca
        self._last_ts_ns = last_ts_ns

    # -- invariants ----------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``InvariantError`` if the state breaks a rule ``apply`` maintains."""
        for account, acct in self._accounts.items():
            acct.check_invariants(account)
