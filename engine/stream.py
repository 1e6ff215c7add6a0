"""The stream state machine: ``Stream.apply(entry) -> result``, deterministic.

One ``Stream`` owns one ``StreamStore``. Every replica applies the same log of entries
(``engine/entries.py``) and ends in the same state with the same results, because:

- time comes only from the entry (``ts_ns``, stamped by the leader), never from a clock;
- the time a replica acts on is ``max(entry.ts_ns, store.state().last_ts)``: a new leader
  whose clock runs behind cannot make time go backwards, and the bound is itself replicated
  state (the last append's stamp, persisted by the store), so a replica that restarted
  computes the same time as one that did not;
- every refusal is a function of the entry and the replicated state, and is raised before
  the entry writes anything; the expiry due by the entry's time happens either way, so a
  replica applying entries in batches (one store transaction) and one applying them one by
  one stay identical.

Publish follows JetStream's order: subject capture, sealed, deduplication (so a retried
publish gets its original answer even when its preconditions no longer hold), expected
stream / last sequence / last subject sequence / last msg id, rollup and TTL permissions,
``max_msg_size``, interest, then the append and the rollup purge in one transaction.

Deduplication. A publish with a msg id is a duplicate while the stream's dedup record of
that id (``StreamStore.dedup_*``) is younger than ``duplicate_window`` at the entry's time;
it is answered with the recorded sequence and ``duplicate=true`` and stores nothing. The
record is written in the transaction of the append it belongs to and outlives its message,
as in JetStream: an id keeps deduplicating for the whole window after its message was acked
from a work queue, deleted, purged or dropped by a limit. Records are replicated state, not
a cache: every replica writes the same records on the same entries and expires them on the
same entries (``dedup_expire`` as of each entry's time, a bounded amount per entry), so a
replica that restarted reads from its store exactly what one that did not holds.

Mirrors and sources. A ``Copy`` entry stores a message copied from an origin and advances
that origin's replicated position (``engine/origins.py``) in the same apply: a copy at or
below the position is a duplicate (stored once only, whoever proposed it twice); a copy whose
``prev_origin_seq`` is not the position is refused (the proposer missed something and must
resume from the replicated position). A mirror stores each message at its origin sequence
(skipping the store's sequence forward over origin gaps) and refuses publishes. A copy with
``rollup`` set applies its ``Nats-Rollup`` header as a publish does, on a stream that allows
rollups (the origin removed those messages too); older entries store it as it is.

Retention. Interest and workqueue streams need the consumers' state; the consumer engine
provides it through ``RetentionPolicyHook`` (below) and tells the stream when a message may
go through ``Stream.release`` and ``Stream.sweep_interest``. Those calls come from the
consumers' own deterministic apply path, so every replica makes them in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from raftstream.engine.entries import (
    HDR_MSG_ID,
    HDR_ROLLUP,
    Copy,
    DeleteMsg,
    Entry,
    Expire,
    Publish,
    PublishOptions,
    Purge,
    Rollup,
    UpdateConfig,
    publish_options,
)
from raftstream.engine.origins import HDR_STREAM_SOURCE, OriginState
from raftstream.engine.store import EMPTY_HEADERS, StoredMsg, StreamStore, headers_size
from raftstream.engine.stream_config import (
    RetentionPolicy,
    StreamConfig,
    check_update,
    store_limits,
)
from raftstream.engine.stream_source import StreamSource, source_key
from raftstream.engine.subjects import subject_matches, validate_filter, validate_subject
from raftstream.errors import (
    ExpectedLastMsgIdError,
    ExpectedLastSeqError,
    ExpectedLastSubjectSeqError,
    ExpectedStreamError,
    InvalidArgumentError,
    LimitError,
    NotFoundError,
    PreconditionError,
    RaftStreamError,
    invariant,
)

__all__ = [
    "ConfigUpdated",
    "Copied",
    "Expired",
    "MsgDeleted",
    "PubAck",
    "Purged",
    "Result",
    "RetentionPolicyHook",
    "Stream",
]


class RetentionPolicyHook(Protocol):
    """What an interest or workqueue stream asks its consumers (implemented by the consumer
    engine; ``engine/consumer*.py``). Both methods must be pure functions of the consumers'
    replicated state, so that every replica gets the same answers.

    The other direction, consumers to stream: after a consumer has RECORDED an ack (so that
    ``is_needed`` already reflects it), it calls ``Stream.release(seq)``; after a consumer is
    deleted or its filter changes, ``Stream.sweep_interest()``.
    """

    def has_interest(self, subject: str) -> bool:
        """Interest retention, on publish: True when at least one consumer's filter matches
        the (transformed) ``subject``. False means the message is not stored: its sequence
        is used and acknowledged, as JetStream does when no one is interested."""
        ...

    def is_needed(self, seq: int, subject: str) -> bool:
        """True while some consumer still has to deliver ``seq`` or see it acknowledged:
        interest retention keeps a message while any consumer whose filter matches it has
        not acked it; workqueue retention until the one consumer that takes it acks it."""
        ...


@dataclass(frozen=True, slots=True)
class PubAck:
    """JetStream's publish acknowledgement. A duplicate answers the original sequence."""

    stream: str
    seq: int
    duplicate: bool = False


if PubAck.__slots__ != ("stream", "seq", "duplicate"):  # a field was added: update _stored_ack
    raise ImportError("PubAck fields changed; update stream._stored_ack")
_set_ack_stream, _set_ack_seq, _set_ack_duplicate = (
    getattr(PubAck, name).__set__ for name in PubAck.__slots__
)


def _stored_ack(stream: str, seq: int) -> PubAck:
    """``PubAck(stream=stream, seq=seq)``, the same value, in about half the time: a frozen
    dataclass's ``__init__`` pays a guarded ``__setattr__`` per field, and every replica
    makes one per applied message (as ``entries.plain_publish`` does for ``Publish``)."""
    ack = object.__new__(PubAck)
    _set_ack_stream(ack, stream)
    _set_ack_seq(ack, seq)
    _set_ack_duplicate(ack, False)
    return ack


@dataclass(frozen=True, slots=True)
class MsgDeleted:
    seq: int


@dataclass(frozen=True, slots=True)
class Purged:
    purged: int


@dataclass(frozen=True, slots=True)
class ConfigUpdated:
    config: StreamConfig


@dataclass(frozen=True, slots=True)
class Expired:
    expired: int


@dataclass(frozen=True, slots=True)
class Copied:
    """A ``Copy`` applied: stored at ``seq`` (0: not stored, as interest retention may
    decide), or a ``duplicate`` of a copy already applied."""

    origin_seq: int
    seq: int
    duplicate: bool = False


Result = PubAck | MsgDeleted | Purged | ConfigUpdated | Expired | Copied

# Errors that refuse an entry. Each is raised before the entry writes anything (checks come
# first; the store refuses an append before writing it), which ``Stream.apply`` relies on.
_REFUSALS = (InvalidArgumentError, PreconditionError, LimitError, NotFoundError)
# Publishes repeat subjects: validate each distinct one once (bounded; errors are not cached).
_SUBJECT_CACHE_ENTRIES_MAX = 4096
_valid_subject = lru_cache(maxsize=_SUBJECT_CACHE_ENTRIES_MAX)(validate_subject)


def _remember(cache: dict[str, str], subject: str, value: str) -> None:
    """Cache ``value`` for ``subject``, dropping the whole cache when it is full: a cache
    miss only recomputes a pure function of the config, so eviction cannot change results."""
    if len(cache) >= _SUBJECT_CACHE_ENTRIES_MAX:
        cache.clear()
    cache[subject] = value


def _is_plain(e: Publish) -> bool:
    """True when the publish carries a subject and data only (no header, id or option)."""
    return (
        not e.headers
        and e.msg_id is None
        and e.expected_stream is None
        and e.expected_last_seq is None
        and e.expected_last_subject_seq is None
        and e.expected_last_subject_seq_subject is None
        and e.expected_last_msg_id is None
        and e.ttl_ns is None
    )


def _stored_headers(e: Publish, opts: PublishOptions) -> Mapping[str, str]:
    """The headers stored with a publish: its own, plus its msg id, which is part of the
    message as in JetStream (expected-last-msg-id reads it back). Without either, the
    shared empty mapping (no dict per message on the common path)."""
    if opts.msg_id is None:
        return dict(e.headers) if e.headers else EMPTY_HEADERS
    headers = dict(e.headers)
    headers[HDR_MSG_ID] = opts.msg_id
    return headers


class Stream:
    """A stream's deterministic state machine over its store.

    Owned by one thread (the one applying the log). ``apply`` is the way to change the
    stream; ``release``/``sweep_interest`` are for the consumer engine (see
    ``RetentionPolicyHook``). Opening a ``Stream`` on a store that already holds a stream
    (a restart) reads nothing: its dedup records are in the store.
    """

    def __init__(
        self,
        config: StreamConfig,
        store: StreamStore,
        *,
        retention: RetentionPolicyHook | None = None,
    ) -> None:
        """``config`` is validated (not ``check_create``: a reopened stream may be sealed)
        and its limits are handed to the store if they differ. A fresh store starts at
        ``config.first_seq``."""
        self._config = config.validate()
        self._store = store
        self._retention = retention
        # Per-config caches of the publish path (pure functions of the config; cleared when
        # it changes): subjects known to be valid and captured, and their stored subjects.
        self._captured: dict[str, str] = {}
        self._transformed: dict[str, str] = {}
        # Replicated per-origin positions of a mirror or sourcing stream (engine/origins.py).
        self._origins: dict[str, OriginState] = {}
        self._links: dict[str, StreamSource] | None = None  # by source_key; per config
        self.purges = 0  # purges applied by this object (a replica compacts its log after one)
        state = store.state()
        if store.limits != store_limits(self._config):
            store.update_limits(store_limits(self._config), state.last_ts)
        if state.last_seq == 0 and self._config.first_seq > 1:
            store.skip(self._config.first_seq)

    @property
    def config(self) -> StreamConfig:
        return self._config

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def store(self) -> StreamStore:
        """The store, for reads (consumers load messages from it). Do not write to it."""
        return self._store

    @property
    def dedup_ids(self) -> int:
        """How many dedup records the store holds, including any past the window that a
        later entry has yet to expire. Walks them all: for tests and diagnostics."""
        return sum(1 for _ in self._store.dedup_iter())

    @property
    def origins(self) -> dict[str, OriginState]:
        """The replicated position of each origin (a copy: change it with ``apply``)."""
        return dict(self._origins)

    def restore_origins(self, origins: Mapping[str, OriginState]) -> None:
        """Set the origin positions read from a snapshot (with the store it restored)."""
        self._origins = dict(origins)

    def set_retention_hook(self, hook: RetentionPolicyHook | None) -> None:
        """Attach the consumer engine (consumers may be created after the stream)."""
        self._retention = hook

    # -- apply -----------------------------------------------------------------------------

    def apply(self, entry: Entry) -> Result:
        """Apply one committed entry; return its result or raise a ``RaftStreamError``.

        Deterministic: the same entries on the same state give the same results and errors
        on every replica. The entry runs in one store transaction (one fsync), which joins
        the caller's if the caller batches several entries in one. A refused entry
        (``InvalidArgumentError``, ``PreconditionError`` and its Expected* kinds,
        ``LimitError``, ``NotFoundError``) is refused before anything is written, so it
        changes nothing but the expiry due by its time, whether or not the caller batches.
        Any other error (``DataLossError``, ``InvariantError``, a failed commit) aborts the
        transaction and leaves this object unusable: reopen the stream from its store.
        """
        store = self._store
        now = self._now(entry.ts_ns)
        refused: RaftStreamError | None = None
        with store.transaction():
            # Expiry first, as of the entry's (leader-stamped) time, so limits and
            # preconditions see the stream as it is at that moment on every replica. Both
            # calls return at once when nothing is due (the stores keep their floors), so
            # the common entry pays no I/O here and the batch's appends stay buffered.
            expired = store.expire(now)
            self._expire_dedup(now)
            try:
                result = self._dispatch(entry, now, expired)
            except _REFUSALS as err:
                refused = err  # nothing was written: commit the expiry, refuse the entry
        if refused is not None:
            raise refused
        return result

    def apply_batch(self, entries: Sequence[Entry]) -> list[Result | RaftStreamError]:
        """Apply ``entries`` in order in ONE store transaction: one result per entry, a
        refusal as its value (the entries after it still apply); any other error raises as
        in ``apply`` (the whole transaction aborts).

        The same results and the same state as ``apply`` on each entry in turn within one
        transaction (``tests/engine/test_stream_batch.py`` pins it), faster for the common
        entry: a plain publish (subject and data, no header or option) on a stream with no
        per-message rule for it (not a mirror, not sealed, not interest retention) runs only
        the steps ``apply`` would run for it, in the same order (``_publish_plain``).
        Replicas apply every committed batch through here, so this is per message on every
        node of a group."""
        out: list[Result | RaftStreamError] = []
        with self._store.transaction():
            fast = self._plain_publishes_fast()
            for e in entries:
                try:
                    if fast and type(e) is Publish and _is_plain(e):
                        out.append(self._publish_plain(e))
                        continue
                    out.append(self.apply(e))
                except _REFUSALS as refusal:
                    out.append(refusal)
                fast = self._plain_publishes_fast()  # the entry may have changed the config
        return out

    def _plain_publishes_fast(self) -> bool:
        """Whether a plain publish needs none of ``_publish``'s per-config refusals and
        branches (mirror, sealed, interest retention): then ``_publish_plain`` applies it."""
        cfg = self._config
        return (
            cfg.mirror is None and not cfg.sealed and cfg.retention is not RetentionPolicy.INTEREST
        )

    def _publish_plain(self, e: Publish) -> PubAck:
        """``apply(e)`` for a plain publish when ``_plain_publishes_fast()``, inside an open
        transaction: what ``apply`` and ``_publish`` do for it, in their order (time, expiry,
        dedup expiry, capture check, max_msg_size, append), without the checks that cannot
        apply (no msg id, no expectation, no header, no TTL, no rollup) and the joined
        transaction blocks. A refusal raises before anything of this entry is written but its
        expiry, as in ``apply``."""
        store = self._store
        now = self._now(e.ts_ns)
        store.expire(now)
        self._expire_dedup(now)
        subject = e.subject
        if subject not in self._captured:
            self._check_captured(subject)
        cfg = self._config
        if cfg.max_msg_size > 0 and len(e.data) > cfg.max_msg_size:
            raise LimitError(
                f"message size exceeds max_msg_size {cfg.max_msg_size}",
                limit="max_msg_size",
            )
        stored = subject if cfg.subject_transform is None else self._stored_subject(subject)
        seq = store.append(stored, e.data, headers=EMPTY_HEADERS, now_ns=now, ttl_ns=0)
        return _stored_ack(cfg.name, seq)

    def _dispatch(self, entry: Entry, now: int, expired: int) -> Result:
        if isinstance(entry, Publish):
            return self._publish(entry, now)
        if isinstance(entry, DeleteMsg):
            return self._delete(entry)
        if isinstance(entry, Purge):
            return self._purge(entry)
        if isinstance(entry, UpdateConfig):
            return self._update(entry, now)
        if isinstance(entry, Copy):
            return self._copy(entry, now)
        invariant(isinstance(entry, Expire), f"unknown entry type {type(entry).__name__}")
        return Expired(expired=expired)

    def _expire_dedup(self, now: int) -> None:
        # Drop records that a lookup at ``now`` can no longer match (nor a later one, as
        # leader stamps grow). Driven by the entry's time and bounded per entry, so every
        # replica, batched or not, restarted or not, expires the same records at the same
        # entry; a lookup still measures the window itself, as a due record may remain.
        self._store.dedup_expire(now - self._config.duplicate_window + 1)

    def _now(self, ts_ns: int) -> int:
        # Leader-stamped time, never below the last append's stamp: a new leader whose clock
        # lags cannot move time backwards, and every replica reads the same bound from its
        # store, restarted or not.
        ts = self._store.last_ts
        return ts_ns if ts_ns > ts else ts

    def _check_captured(self, subject: str) -> None:
        """``InvalidArgumentError`` unless ``subject`` is a valid subject this stream
        captures. Cached per config: publishes repeat a few subjects."""
        if subject in self._captured:
            return
        cfg = self._config
        _valid_subject(subject)
        if not any(subject_matches(s, subject) for s in cfg.subjects):
            raise InvalidArgumentError("subject", f"{subject!r} is not captured by {cfg.name}")
        _remember(self._captured, subject, subject)

    def _stored_subject(self, subject: str) -> str:
        """The subject a captured ``subject`` is stored under (``subject_transform``)."""
        transform = self._config.subject_transform
        if transform is None:
            return subject
        out = self._transformed.get(subject)
        if out is None:
            out = transform.apply(subject)
            _remember(self._transformed, subject, out)
        return out

    def _publish(self, e: Publish, now: int) -> PubAck:
        cfg = self._config
        if cfg.mirror is not None:
            raise PreconditionError(
                f"publish refused: stream {cfg.name} is a mirror of {cfg.mirror.name} "
                "(read-only; remove its mirror setting to write to it)",
                rule="mirror",
            )
        self._check_captured(e.subject)
        self._refuse_if_sealed("publish")
        opts = publish_options(e)
        if opts.msg_id is not None:
            dup = self._find_duplicate(opts.msg_id, now)
            if dup is not None:
                return PubAck(stream=cfg.name, seq=dup, duplicate=True)
        subject = self._stored_subject(e.subject)
        self._check_expected(opts, subject)
        self._check_permissions(opts)
        headers = _stored_headers(e, opts)
        if cfg.max_msg_size > 0 and headers_size(headers) + len(e.data) > cfg.max_msg_size:
            raise LimitError(
                f"message size exceeds max_msg_size {cfg.max_msg_size}",
                limit="max_msg_size",
            )
        if cfg.retention is RetentionPolicy.INTEREST and not self._has_interest(subject):
            # JetStream: no consumer wants it, so the sequence is used but nothing is stored;
            # its msg id is still recorded, so a retry gets the same answer.
            seq = self._store.last_seq + 1
            with self._store.transaction():
                self._store.skip(seq + 1)
                self._record_msg_id(opts, seq, now)
            return PubAck(stream=cfg.name, seq=seq)
        seq = self._store_msg(subject, e.data, headers, now, opts)
        return PubAck(stream=cfg.name, seq=seq)

    def _copy(self, e: Copy, now: int) -> Copied:
        """Store a copied message and advance its origin's position (module docstring)."""
        cfg = self._config
        if self._links is None:
            links = (cfg.mirror,) if cfg.mirror is not None else cfg.sources
            self._links = {source_key(s): s for s in links}
        link = self._links.get(e.origin)
        if link is None:
            raise InvalidArgumentError("origin", f"{e.origin!r} is not an origin of {cfg.name}")
        self._refuse_if_sealed("copy")
        pos = self._origins.get(e.origin, OriginState())
        if e.origin_seq <= pos.last_seq:
            return Copied(origin_seq=e.origin_seq, seq=0, duplicate=True)
        if e.prev_origin_seq != pos.last_seq:
            raise PreconditionError(
                f"copy of {e.origin} {e.origin_seq} expects {e.prev_origin_seq} stored last; "
                f"{pos.last_seq} is",
                rule="origin_seq",
            )
        headers = dict(e.headers)
        headers[HDR_STREAM_SOURCE] = f"{link.name} {e.origin_seq}"
        subject = link.stored_subject(e.subject)
        if cfg.max_msg_size > 0 and headers_size(headers) + len(e.data) > cfg.max_msg_size:
            raise LimitError(
                f"message size exceeds max_msg_size {cfg.max_msg_size}", limit="max_msg_size"
            )
        store = self._store
        seq = 0
        with store.transaction():
            if cfg.mirror is not None:
                # A mirror keeps its origin's sequences: origin gaps stay gaps.
                if e.origin_seq <= store.last_seq:
                    raise PreconditionError(
                        f"mirror already holds sequence {store.last_seq} >= {e.origin_seq}",
                        rule="origin_seq",
                    )
                if e.origin_seq > store.last_seq + 1:
                    store.skip(e.origin_seq)
            if cfg.retention is not RetentionPolicy.INTEREST or self._has_interest(subject):
                seq = store.append(subject, e.data, headers=headers, now_ns=self._copy_ts(e, now))
                rollup = _copy_rollup(e, headers) if cfg.allow_rollup_hdrs else None
                if rollup is Rollup.SUBJECT:
                    store.purge(subject=subject, keep=1)
                elif rollup is Rollup.ALL:
                    store.purge(keep=1)
            elif cfg.mirror is not None:
                store.skip(e.origin_seq + 1)
            invariant(
                cfg.mirror is None or seq in (0, e.origin_seq), "a mirror stored out of place"
            )
        self._origins[e.origin] = pos.after_copy(e.origin_seq, e.skipped)
        return Copied(origin_seq=e.origin_seq, seq=seq)

    def _copy_ts(self, e: Copy, now: int) -> int:
        """The time a copy is stored at: a mirror keeps its origin's (as a JetStream mirror
        does, so ``max_age``, start times and ``stream info`` read the origin's times), never
        below the last stored one; a source's copy is stamped ``now``, as a publish: its
        messages interleave with other origins' and its own."""
        if self._config.mirror is None or not e.origin_ts_ns:
            return now
        last = self._store.last_ts
        return e.origin_ts_ns if e.origin_ts_ns > last else last

    def _store_msg(
        self,
        subject: str,
        data: bytes,
        headers: Mapping[str, str],
        now: int,
        opts: PublishOptions,
    ) -> int:
        """Append, record the msg id and, for a rollup, purge the older messages: one
        transaction, so the message and its dedup record commit (or not) together."""
        with self._store.transaction():
            seq = self._store.append(
                subject, data, headers=headers, now_ns=now, ttl_ns=opts.ttl_ns or 0
            )
            self._record_msg_id(opts, seq, now)
            if opts.rollup is Rollup.SUBJECT:
                self._store.purge(subject=subject, keep=1)
            elif opts.rollup is Rollup.ALL:
                self._store.purge(keep=1)
        return seq

    def _record_msg_id(self, opts: PublishOptions, seq: int, now: int) -> None:
        if opts.msg_id is not None:
            self._store.dedup_put(opts.msg_id, seq, now)

    def _find_duplicate(self, msg_id: str, now: int) -> int | None:
        """The sequence ``msg_id`` was stored as, if that was within the window before
        ``now``; whether the message is still stored does not matter (JetStream)."""
        rec = self._store.dedup_get(msg_id)
        if rec is None or now - rec.ts_ns >= self._config.duplicate_window:
            return None
        return rec.seq

    def _check_expected(self, opts: PublishOptions, subject: str) -> None:
        """JetStream's expected-* headers, each failing with its own error class."""
        name = self._config.name
        if opts.expected_stream is not None and opts.expected_stream != name:
            raise ExpectedStreamError(
                f"expected stream {opts.expected_stream!r}, this is {name!r}",
                expected=opts.expected_stream,
            )
        if opts.expected_last_seq is not None:
            last = self._store.last_seq
            if opts.expected_last_seq != last:
                raise ExpectedLastSeqError(
                    f"wrong last sequence: {last}", expected=opts.expected_last_seq, last=last
                )
        if opts.expected_last_subject_seq is not None:
            filt = opts.expected_last_subject_seq_subject or subject
            validate_filter(filt, "expected_last_subject_seq_subject")
            last = self._last_seq_of(filt)
            if opts.expected_last_subject_seq != last:
                raise ExpectedLastSubjectSeqError(
                    f"wrong last sequence for {filt!r}: {last}",
                    expected=opts.expected_last_subject_seq,
                    last=last,
                )
        if opts.expected_last_msg_id is not None:
            last_id = self._last_msg_id()
            if opts.expected_last_msg_id != last_id:
                raise ExpectedLastMsgIdError(
                    f"wrong last msg id: {last_id!r}",
                    expected=opts.expected_last_msg_id,
                    last=last_id,
                )

    def _last_seq_of(self, subject_filter: str) -> int:
        try:
            return self._store.load_last(subject_filter).seq
        except NotFoundError:
            return 0

    def _last_msg_id(self) -> str:
        """The msg id of the message at the last sequence ('' if none or removed)."""
        last = self._store.last_seq
        if last == 0:
            return ""
        try:
            return self._store.load(last).headers.get(HDR_MSG_ID, "")
        except NotFoundError:
            return ""

    def _check_permissions(self, opts: PublishOptions) -> None:
        cfg = self._config
        if opts.rollup is not None and not cfg.allow_rollup_hdrs:
            raise PreconditionError(
                f"rollup not permitted on stream {cfg.name} (allow_rollup_hdrs is false)",
                rule="allow_rollup_hdrs",
            )
        if opts.ttl_ns is not None and not cfg.allow_msg_ttl:
            raise PreconditionError(
                f"per-message TTL is disabled on stream {cfg.name} (allow_msg_ttl is false)",
                rule="allow_msg_ttl",
            )

    def _has_interest(self, subject: str) -> bool:
        return self._retention is not None and self._retention.has_interest(subject)

    def _refuse_if_sealed(self, what: str) -> None:
        if self._config.sealed:
            raise PreconditionError(
                f"{what} refused: stream {self._config.name} is sealed", rule="sealed"
            )

    def _delete(self, e: DeleteMsg) -> MsgDeleted:
        self._refuse_if_sealed("delete")
        if self._config.deny_delete:
            raise PreconditionError(
                f"message delete not permitted on stream {self._config.name} (deny_delete)",
                rule="deny_delete",
            )
        if e.seq <= 0:
            raise InvalidArgumentError("seq", "must be positive")
        if not self._store.delete(e.seq, erase=not e.no_erase):
            raise NotFoundError(f"no message at sequence {e.seq}", seq=e.seq)
        return MsgDeleted(seq=e.seq)

    def _purge(self, e: Purge) -> Purged:
        self._refuse_if_sealed("purge")
        if self._config.deny_purge:
            raise PreconditionError(
                f"purge not permitted on stream {self._config.name} (deny_purge)",
                rule="deny_purge",
            )
        purged = self._store.purge(subject=e.subject, seq=e.seq, keep=e.keep)
        self.purges += 1
        return Purged(purged=purged)

    def _update(self, e: UpdateConfig, now: int) -> ConfigUpdated:
        new = check_update(self._config, e.config)
        self._store.update_limits(store_limits(new), now)
        # A new duplicate_window applies from the next entry; records already expired stay
        # gone (JetStream does not bring ids back when the window grows).
        self._config = new
        self._captured.clear()  # subjects and transform may have changed
        self._transformed.clear()
        self._links = None
        return ConfigUpdated(config=new)

    # -- retention: called by the consumer engine ------------------------------------------

    def release(self, seq: int) -> bool:
        """A consumer acknowledged ``seq``: remove it if the retention policy says it is no
        longer needed. Limits retention: never (acks do not remove). Interest and
        workqueue: when ``RetentionPolicyHook.is_needed`` says no consumer still needs it.
        Returns True when the message was removed. A sealed stream removes nothing."""
        if self._config.retention is RetentionPolicy.LIMITS or self._config.sealed:
            return False
        try:
            msg = self._store.load(seq)
        except NotFoundError:
            return False
        if self._retention is not None and self._retention.is_needed(seq, msg.subject):
            return False
        return self._store.delete(seq)

    def sweep_interest(self) -> int:
        """Interest retention, after a consumer went away or changed its filter: remove
        every message no remaining consumer needs. Returns how many were removed. Workqueue
        messages stay (they wait for the next consumer), as in JetStream."""
        if self._config.retention is not RetentionPolicy.INTEREST or self._config.sealed:
            return 0
        hook = self._retention
        needed: Callable[[StoredMsg], bool] = (
            (lambda m: hook.is_needed(m.seq, m.subject)) if hook is not None else (lambda m: False)
        )
        victims = [m.seq for m in self._store.iter_from(1) if not needed(m)]
        with self._store.transaction():
            for seq in victims:
                self._store.delete(seq)
        return len(victims)


def _copy_rollup(e: Copy, headers: Mapping[str, str]) -> Rollup | None:
    """The rollup a copy applies: its ``Nats-Rollup`` header when the copy says to apply it
    (``Copy.rollup``); a header that is no rollup is stored and ignored, as the origin
    stored it (refusing the copy would stop the link)."""
    if not e.rollup:
        return None
    try:
        return Rollup(headers.get(HDR_ROLLUP, ""))
    except ValueError:
        return None
