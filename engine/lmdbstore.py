"""LmdbStreamStore: a stream's messages in the node's LMDB environment.

One ``lmdb.Environment`` per node holds every stream (and, later, the Raft logs): the stores
share a fixed set of named DBs (``engine/lmdbrecords.py`` has the layouts) and tell their keys
apart by a 4-byte stream id allocated from the stream's name. A stream's counters and limits
live in one meta record, written once per write transaction, so reopening is one read.

Threading: a store is used by one thread at a time, and LMDB binds a write transaction to its
thread, so all writes of a node come from its one writer thread. Transactions of two stores on
one environment must not overlap (LMDB has one writer; the second would wait forever).
One ``LmdbStreamStore`` object per stream per environment: the object caches the stream's meta.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any
from zlib import crc32

import lmdb

from raftstream.engine.lmdbrecords import (
    CRC,
    DB_NAMES,
    ID,
    SEQ,
    MsgHead,
    StreamMeta,
    checked_value,
    crc_only,
    decode_count,
    decode_head,
    decode_meta,
    decode_msg,
    encode_count,
    encode_headers,
    encode_meta,
    encode_msg,
    subject_key,
    verify_crc_only,
)
from raftstream.engine.memstore import TS_NS_MAX, check_append_args, valid_filter
from raftstream.engine.store import (
    EMPTY_HEADERS,
    DiscardPolicy,
    PurgeRequest,
    StoredMsg,
    StoreLimits,
    StreamState,
    headers_size,
    limit_set,
    normalize_purge,
)
from raftstream.engine.subjects import FWC, has_wildcards, subject_matches
from raftstream.errors import (
    DataLossError,
    InvalidArgumentError,
    InvariantError,
    LimitError,
    NotFoundError,
    invariant,
)

__all__ = ["DEFAULT_MAP_SIZE_BYTES", "NODE_MAX_DBS", "LmdbStreamStore", "open_node_env"]

DEFAULT_MAP_SIZE_BYTES = 64 * 1024**3  # address space only; the file grows as data does
NODE_MAX_DBS = 16  # the stream store uses 5 named DBs; the rest is for the Raft log storage
STREAM_NAME_BYTES_MAX = 255
ITER_CHUNK_MSGS = 256  # messages read per read transaction by iter_from
PURGE_CHUNK_MSGS = 4096  # sequences collected per pass of a range purge
# A wildcard load_next walks each matching subject's index when the stream has at most this
# many subjects, and walks the messages otherwise.
SUBJECT_WALK_SUBJECTS_MAX = 256
_SEQ_MAX = b"\xff" * SEQ.size


def open_node_env(
    path: str | os.PathLike[str],
    *,
    map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES,
    max_dbs: int = NODE_MAX_DBS,
    readers_max: int = 126,
    sync: bool = True,
) -> Any:
    """Open (creating) a node's LMDB environment in directory ``path``.

    ``sync`` stays on outside benchmarks of the relaxed mode: a committed write transaction is
    on disk when ``commit()`` returns, which is what "acknowledged" promises.
    """
    Path(path).mkdir(parents=True, exist_ok=True)
    return lmdb.open(
        os.fspath(path),
        map_size=map_size_bytes,
        max_dbs=max_dbs,
        max_readers=readers_max,
        sync=sync,
        metasync=sync,
        readahead=False,  # random reads of a large map; readahead only evicts useful pages
    )


@dataclass(frozen=True, slots=True)
class _Dbs:
    msgs: Any
    sidx: Any
    subj: Any
    ttl: Any
    meta: Any


def _open_dbs(env: Any) -> _Dbs:
    return _Dbs(*(env.open_db(name) for name in DB_NAMES))


@lru_cache(maxsize=4096)
def _hash_of(subject: bytes) -> bytes:
    try:
        return subject_key(subject.decode())[1]
    except (UnicodeDecodeError, InvalidArgumentError) as exc:
        raise DataLossError(f"stored subject is not a valid subject: {subject!r}") from exc


class _Count:
    """A subject's message count as cached within one write transaction."""

    __slots__ = ("now", "stored", "subject")

    def __init__(self, count: int, subject: bytes) -> None:
        self.now = count
        self.stored = count
        self.subject = subject


class LmdbStreamStore:
    """One stream's messages in a shared node environment (see the module docstring).

    ``limits`` None keeps the limits stored with the stream (unlimited for a new one); a value
    replaces them, enforced from the next append (call ``update_limits`` to enforce at once).
    ``close()`` forgets the store; the environment belongs to the caller.
    """

    def __init__(self, env: Any, name: str, *, limits: StoreLimits | None = None) -> None:
        raw_name = name.encode()
        if not raw_name or len(raw_name) > STREAM_NAME_BYTES_MAX:
            raise InvalidArgumentError("name", f"must be 1..{STREAM_NAME_BYTES_MAX} bytes")
        self._env = env
        self._name = name
        self._dbs = _open_dbs(env)
        self._txn: Any = None
        self._msgs_cur: Any = None
        self._sidx_cur: Any = None
        self._counts: dict[bytes, _Count] = {}
        self._closed = False
        self._dropping = False
        with env.begin(write=True) as txn:
            self._prefix = ID.pack(self._stream_id(txn, raw_name))
            self._meta_key = b"M" + self._prefix
            raw = txn.get(self._meta_key, db=self._dbs.meta)
            self._meta = decode_meta(self._meta_key, raw) if raw else StreamMeta()
            if limits is not None:
                self._meta.limits = limits
            # Commit the registration (and new limits) now, so a reopen finds the stream.
            txn.put(self._meta_key, encode_meta(self._meta_key, self._meta), db=self._dbs.meta)
        self._limits_changed()

    def _stream_id(self, txn: Any, raw_name: bytes) -> int:
        key = b"N" + raw_name
        raw = txn.get(key, db=self._dbs.meta)
        if raw is not None:
            checked_value(key, raw)
            return int(ID.unpack_from(raw, CRC.size)[0])
        counter = txn.get(b"C", db=self._dbs.meta)
        if counter is None:
            stream_id = 1
        else:
            checked_value(b"C", counter)
            stream_id = int(ID.unpack_from(counter, CRC.size)[0])
        invariant(stream_id < 2**32 - 1, "stream ids exhausted")
        txn.put(b"C", _id_record(b"C", stream_id + 1), db=self._dbs.meta)
        txn.put(key, _id_record(key, stream_id), db=self._dbs.meta)
        return stream_id

    # -- Protocol: configuration and transactions ------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def limits(self) -> StoreLimits:
        return self._meta.limits

    def update_limits(self, limits: StoreLimits, now_ns: int) -> None:
        """Change limits and enforce them at once, removing the oldest messages as needed."""
        with self.transaction():
            self._meta.limits = limits
            self._limits_changed()
            per = limits.max_msgs_per_subject
            if limit_set(per):
                for h, (count, _) in self._subject_counts(">").items():
                    for _ in range(count - per):
                        self._remove(self._oldest_of(h))
            self._enforce_totals()
            self._expire_age(now_ns)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One LMDB write transaction (one fsync) for everything done inside the block.

        Nested blocks join the outermost one. An exception leaving the outermost block aborts
        it: nothing of the block is stored and the store's counters roll back.
        """
        self._check_open()
        if self._txn is not None:
            yield
            return
        saved = replace(self._meta)
        txn = self._env.begin(write=True)
        self._txn = txn
        try:
            yield
            self._flush()
        except BaseException:
            self._end_txn(saved)
            txn.abort()
            raise
        self._txn = None
        self._msgs_cur = self._sidx_cur = None
        self._counts.clear()
        try:
            # Durability point: with the environment's sync on, commit() returns after the
            # fsync, so a mutation that returned is on disk (fsync-before-ack).
            txn.commit()
        except BaseException:
            self._end_txn(saved)
            raise

    def _end_txn(self, saved: StreamMeta) -> None:
        self._txn = None
        self._msgs_cur = self._sidx_cur = None
        self._counts.clear()
        self._meta = saved
        self._limits_changed()

    def _flush(self) -> None:
        """Write what the transaction keeps in memory: subject counts and the meta record."""
        self._flush_counts()
        if self._dropping:
            self._txn.delete(self._meta_key, db=self._dbs.meta)
            self._txn.delete(b"N" + self._name.encode(), db=self._dbs.meta)
            return
        self._txn.put(self._meta_key, encode_meta(self._meta_key, self._meta), db=self._dbs.meta)

    def _flush_counts(self) -> None:
        for h, c in self._counts.items():
            if c.now == c.stored:
                continue
            key = self._prefix + h
            if c.now == 0:
                self._txn.delete(key, db=self._dbs.subj)
            else:
                self._txn.put(key, encode_count(key, c.now, c.subject), db=self._dbs.subj)
            c.stored = c.now

    def _limits_changed(self) -> None:
        lim = self._meta.limits
        self._admission = limit_set(lim.max_msg_size) or lim.discard is DiscardPolicy.NEW
        self._enforce = (
            limit_set(lim.max_msgs_per_subject)
            or limit_set(lim.max_msgs)
            or limit_set(lim.max_bytes)
            or lim.max_age_ns > 0
        )

    # -- Protocol: writes ------------------------------------------------------------------

    def append(
        self,
        subject: str,
        data: bytes,
        *,
        headers: Mapping[str, str] = EMPTY_HEADERS,
        now_ns: int,
        ttl_ns: int = 0,
    ) -> int:
        """Store a message at the next sequence and return it; then enforce limits.

        Raises ``LimitError`` (nothing stored) when ``max_msg_size`` or a discard-new limit
        refuses it. Outside ``transaction()`` the append is its own write transaction.
        """
        if self._txn is None:
            with self.transaction():
                return self._append(subject, data, headers, now_ns, ttl_ns)
        return self._append(subject, data, headers, now_ns, ttl_ns)

    def _append(
        self, subject: str, data: bytes, headers: Mapping[str, str], now_ns: int, ttl_ns: int
    ) -> int:
        # The hot path of the store: keep per-append work to two puts and a few dict updates;
        # counts and meta are written once per transaction by _flush().
        raw, h = subject_key(subject)
        if now_ns < 0 or ttl_ns < 0 or now_ns + ttl_ns > TS_NS_MAX:
            check_append_args(now_ns, ttl_ns)
        hdrs = encode_headers(headers) if headers else b""
        payload = len(data) + (headers_size(headers) if headers else 0)
        m = self._meta
        count = self._counts.get(h) or self._load_count(h, raw)
        if self._admission:
            self._check_admission(payload + len(raw), payload, count.now)
        seq = m.last_seq + 1
        key = self._prefix + SEQ.pack(seq)
        value = encode_msg(key, raw, hdrs, data, ts=now_ns, ttl=ttl_ns, size=payload + len(raw))
        if self._msgs_cur is None:
            self._msgs_cur = self._txn.cursor(db=self._dbs.msgs)
            self._sidx_cur = self._txn.cursor(db=self._dbs.sidx)
        self._msgs_cur.put(key, value)
        ikey = self._prefix + h + SEQ.pack(seq)
        self._sidx_cur.put(ikey, crc_only(ikey))
        if ttl_ns:
            tkey = self._prefix + SEQ.pack(now_ns + ttl_ns) + SEQ.pack(seq)
            self._txn.put(tkey, crc_only(tkey), db=self._dbs.ttl)
        if count.now == 0:
            m.num_subjects += 1
        count.now += 1
        if m.msgs == 0:
            m.first_seq = seq
        m.msgs += 1
        m.bytes += payload + len(raw)
        m.last_seq = seq
        m.last_ts = now_ns
        if self._enforce:
            self._enforce_after_append(h, now_ns)
        return seq

    def _check_admission(self, size: int, payload: int, subject_count: int) -> None:
        lim = self._meta.limits
        if limit_set(lim.max_msg_size) and payload > lim.max_msg_size:
            raise LimitError("message size exceeds maximum allowed", limit="max_msg_size")
        if lim.discard is not DiscardPolicy.NEW:
            return
        m = self._meta
        if limit_set(lim.max_msgs) and m.msgs >= lim.max_msgs:
            raise LimitError("maximum messages exceeded", limit="max_msgs")
        if limit_set(lim.max_bytes) and m.bytes + size > lim.max_bytes:
            raise LimitError("maximum bytes exceeded", limit="max_bytes")
        per = lim.max_msgs_per_subject
        if lim.discard_new_per_subject and limit_set(per) and subject_count >= per:
            raise LimitError("maximum messages per subject exceeded", limit="max_msgs_per_subject")

    def _enforce_after_append(self, h: bytes, now_ns: int) -> None:
        per = self._meta.limits.max_msgs_per_subject
        if limit_set(per):
            while self._counts[h].now > per:
                self._remove(self._oldest_of(h))
        self._enforce_totals()
        self._expire_age(now_ns)

    def _enforce_totals(self) -> None:
        m = self._meta
        lim = m.limits
        if limit_set(lim.max_msgs):
            while m.msgs > lim.max_msgs:
                self._remove(self._first_head())
        if limit_set(lim.max_bytes):
            while m.msgs and m.bytes > lim.max_bytes:
                self._remove(self._first_head())

    def _expire_age(self, now_ns: int) -> int:
        max_age = self._meta.limits.max_age_ns
        removed = 0
        if max_age <= 0:
            return 0
        while self._meta.msgs:
            head = self._first_head()
            if head.ts + max_age > now_ns:
                break
            self._remove(head)
            removed += 1
        return removed

    def skip(self, seq: int) -> None:
        """Make ``seq`` the next sequence; ``seq`` must be above ``last_seq``."""
        if seq <= self._meta.last_seq:
            raise InvalidArgumentError("seq", f"must be above last_seq {self._meta.last_seq}")
        with self.transaction():
            self._meta.last_seq = seq - 1
            if self._meta.msgs == 0:
                self._meta.first_seq = seq

    def delete(self, seq: int, *, erase: bool = False) -> bool:
        """Remove one message; False when absent.

        ``erase`` overwrites the record with zeros before removing it. LMDB is copy-on-write:
        older images of the page may survive in free pages until reused, so erase hides the
        bytes from the store and from casual inspection, not from forensics.
        """
        with self.transaction():
            key = self._msg_key(seq)
            raw = self._txn.get(key, db=self._dbs.msgs) if seq > 0 else None
            if raw is None:
                return False
            head = decode_head(key, raw)
            if erase:
                self._txn.put(key, bytes(len(raw)), db=self._dbs.msgs)
            self._remove(head)
            return True

    def purge(
        self, *, subject: str | None = None, seq: int | None = None, keep: int | None = None
    ) -> int:
        """Remove messages as JetStream's purge request does (see the Protocol)."""
        req = normalize_purge(subject, seq, keep)
        with self.transaction():
            if req.is_full:
                return self._purge_all()
            if req.subject is None:
                removed = self._purge_range(req)
            else:
                removed = self._purge_subject(req, req.subject)
            if req.subject is None and req.before_seq is not None:
                m = self._meta
                if req.before_seq > m.last_seq + 1:
                    m.last_seq = req.before_seq - 1  # JetStream Compact past the end
                if m.msgs == 0:
                    m.first_seq = m.last_seq + 1
            return removed

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count."""
        with self.transaction():
            removed = self._expire_age(now_ns)
            hi = self._prefix + SEQ.pack(now_ns) + _SEQ_MAX
            while True:
                due: list[int] = []
                cur = self._txn.cursor(db=self._dbs.ttl)
                found = cur.set_range(self._prefix)
                while found and len(due) < PURGE_CHUNK_MSGS:
                    key, value = cur.item()
                    if not key.startswith(self._prefix) or key > hi:
                        break
                    verify_crc_only(key, value)
                    due.append(SEQ.unpack_from(key, ID.size + SEQ.size)[0])
                    found = cur.next()
                for seq in due:
                    self._remove(self._head(seq))
                removed += len(due)
                if len(due) < PURGE_CHUNK_MSGS:
                    return removed

    # -- removal -----------------------------------------------------------------------------

    def _remove(self, head: MsgHead) -> None:
        """Remove one message and its index entries; update counters (in the open txn)."""
        txn, dbs, m = self._txn, self._dbs, self._meta
        seq_b = SEQ.pack(head.seq)
        txn.delete(self._prefix + seq_b, db=dbs.msgs)
        h = _hash_of(head.subject)
        if not txn.delete(self._prefix + h + seq_b, db=dbs.sidx):
            raise DataLossError(f"subject index entry missing for sequence {head.seq}")
        if head.ttl:
            txn.delete(self._prefix + SEQ.pack(head.ts + head.ttl) + seq_b, db=dbs.ttl)
        count = self._counts.get(h) or self._load_count(h, head.subject)
        invariant(count.now > 0, "subject count underflow")
        count.now -= 1
        if count.now == 0:
            m.num_subjects -= 1
        m.msgs -= 1
        m.bytes -= head.size
        invariant(m.msgs >= 0 and m.bytes >= 0, "negative stream counters")
        if head.seq == m.first_seq:
            m.first_seq = self._next_stored(head.seq + 1)

    def _purge_all(self) -> int:
        m = self._meta
        removed = m.msgs
        for db in (self._dbs.msgs, self._dbs.sidx, self._dbs.subj, self._dbs.ttl):
            cur = self._txn.cursor(db=db)
            found = cur.set_range(self._prefix)
            while found and cur.key().startswith(self._prefix):
                found = cur.delete()
        self._counts.clear()
        m.msgs = m.bytes = m.num_subjects = 0
        m.first_seq = m.last_seq + 1
        return removed

    def _purge_range(self, req: PurgeRequest) -> int:
        """Purge without a subject: below ``before_seq``, or all but the newest ``keep``."""
        m = self._meta
        budget = m.msgs - req.keep if req.keep is not None else m.msgs
        end = req.before_seq if req.before_seq is not None else m.last_seq + 1
        removed = 0
        while removed < budget and m.msgs and m.first_seq < end:
            heads = [h for h in self._heads_from(m.first_seq, PURGE_CHUNK_MSGS) if h.seq < end]
            for head in heads[: budget - removed]:
                self._remove(head)
                removed += 1
        return removed

    def _purge_subject(self, req: PurgeRequest, subject_filter: str) -> int:
        end = req.before_seq if req.before_seq is not None else self._meta.last_seq + 1
        victims: list[int] = []
        for h in self._subject_counts(subject_filter):
            victims += self._index_seqs(h, 1, end)
        victims.sort()
        if req.keep is not None:
            victims = victims[: max(0, len(victims) - req.keep)]
        for seq in victims:
            self._remove(self._head(seq))
        return len(victims)

    # -- Protocol: reads -------------------------------------------------------------------

    def load(self, seq: int) -> StoredMsg:
        """The message at ``seq``; ``NotFoundError`` if absent, ``DataLossError`` if corrupt."""
        with self._reading() as txn:
            return self._load(txn, seq)

    def load_last(self, subject_filter: str) -> StoredMsg:
        """The newest message matching the filter; ``NotFoundError`` when none does."""
        valid_filter(subject_filter, "subject_filter")
        with self._reading() as txn:
            best = 0
            if subject_filter == FWC:
                best = self._last_stored(txn)
            else:
                for h in self._matching_hashes(txn, subject_filter):
                    best = max(best, self._last_of(txn, h))
            if best == 0:
                raise NotFoundError(f"no message matches {subject_filter!r}")
            return self._load(txn, best)  # decode_msg checks the record's own checksum

    def load_next(self, subject_filter: str, start_seq: int) -> StoredMsg | None:
        """The first message at or after ``start_seq`` matching the filter, or None."""
        valid_filter(subject_filter, "subject_filter")
        start = max(start_seq, self._meta.first_seq, 1)
        if start > self._meta.last_seq:
            return None
        walk_messages = subject_filter == FWC or (
            has_wildcards(subject_filter) and self._meta.num_subjects > SUBJECT_WALK_SUBJECTS_MAX
        )
        with self._reading() as txn:
            if walk_messages:
                return self._scan_next(txn, start, subject_filter)
            found = [
                (self._next_of(txn, h, start), h)
                for h in self._matching_hashes(txn, subject_filter)
            ]
            best, h = min(((s, h) for s, h in found if s), default=(0, b""))
            return self._load_indexed(txn, best, h) if best else None

    def _scan_next(self, txn: Any, start: int, subject_filter: str) -> StoredMsg | None:
        """Walk the messages from ``start`` to the first one matching the filter."""
        cur = txn.cursor(db=self._dbs.msgs)
        found = cur.set_range(self._msg_key(start))
        while found:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                return None
            if subject_filter == FWC:
                return decode_msg(key, value)
            head = decode_head(key, value)
            if subject_matches(subject_filter, head.subject.decode()):
                return decode_msg(key, value)
            found = cur.next()
        return None

    def iter_from(self, start_seq: int, subject_filter: str = ">") -> Iterator[StoredMsg]:
        """Messages at or after ``start_seq`` matching the filter, in sequence order.

        Reads ``ITER_CHUNK_MSGS`` records per read transaction, so a slow consumer of the
        iterator never pins old pages; writes between chunks may or may not be seen.
        """
        self._check_open()
        valid_filter(subject_filter, "subject_filter")
        return self._iter(max(start_seq, self._meta.first_seq, 1), subject_filter)

    def _iter(self, seq: int, subject_filter: str) -> Iterator[StoredMsg]:
        literal = not has_wildcards(subject_filter)
        match_all = subject_filter == FWC
        h = subject_key(subject_filter)[1] if literal else b""
        while seq <= self._meta.last_seq:
            with self._reading() as txn:
                if literal:
                    seqs = self._index_seqs(h, seq, 0, limit=ITER_CHUNK_MSGS, txn=txn)
                    chunk = [self._load_indexed(txn, s, h) for s in seqs]
                    scanned = len(seqs)
                else:
                    heads = self._heads_from(seq, ITER_CHUNK_MSGS, txn=txn)
                    chunk = [
                        self._load(txn, hd.seq)
                        for hd in heads
                        if match_all or subject_matches(subject_filter, hd.subject.decode())
                    ]
                    seqs = [hd.seq for hd in heads]
                    scanned = len(heads)
            yield from chunk
            if scanned < ITER_CHUNK_MSGS:
                return
            seq = seqs[-1] + 1

    def num_pending(self, start_seq: int, subject_filter: str = ">") -> int:
        """How many messages at or after ``start_seq`` match the filter."""
        valid_filter(subject_filter, "subject_filter")
        m = self._meta
        start = max(start_seq, m.first_seq, 1)
        if m.msgs == 0 or start > m.last_seq:
            return 0
        if subject_filter == FWC and start == m.first_seq:
            return m.msgs
        with self._reading() as txn:
            if subject_filter == FWC:
                return self._count_keys(txn, self._dbs.msgs, self._msg_key(start), self._prefix)
            total = 0
            for h, (count, _) in self._subject_counts(subject_filter, txn=txn).items():
                if start <= m.first_seq:
                    total += count
                else:
                    total += self._count_keys(
                        txn, self._dbs.sidx, self._prefix + h + SEQ.pack(start), self._prefix + h
                    )
            return total

    def state(self, *, subjects_filter: str | None = None) -> StreamState:
        """Counters from the cached meta; per-subject counts only when a filter is given."""
        self._check_open()
        m = self._meta
        first_ts = self._first_head().ts if m.msgs else 0
        return StreamState(
            first_seq=m.first_seq,
            last_seq=m.last_seq,
            msgs=m.msgs,
            bytes=m.bytes,
            first_ts=first_ts,
            last_ts=m.last_ts,
            num_deleted=(m.last_seq - m.first_seq + 1 - m.msgs) if m.msgs else 0,
            num_subjects=m.num_subjects,
            subjects={} if subjects_filter is None else self.subjects_state(subjects_filter),
        )

    def subjects_state(self, subject_filter: str = ">") -> dict[str, int]:
        """Message count per subject matching the filter."""
        valid_filter(subject_filter, "subject_filter")
        counts = self._subject_counts(subject_filter)
        return {raw.decode(): count for count, raw in counts.values()}

    def close(self) -> None:
        """Forget the store (the environment stays open; it belongs to the caller)."""
        invariant(self._txn is None, "close() inside a transaction")
        self._closed = True

    def drop(self) -> None:
        """Delete the stream: every record and its name. The store is closed afterwards."""
        with self.transaction():
            self._purge_all()
            self._dropping = True
        self._closed = True

    # -- read helpers ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvariantError(f"stream store {self._name!r} used after close()")

    @contextmanager
    def _reading(self) -> Iterator[Any]:
        """The open write transaction (to see its writes) or a fresh read transaction."""
        self._check_open()
        if self._txn is not None:
            yield self._txn
            return
        with self._env.begin() as txn:
            yield txn

    def _msg_key(self, seq: int) -> bytes:
        return self._prefix + SEQ.pack(seq)

    def _load(self, txn: Any, seq: int) -> StoredMsg:
        key = self._msg_key(seq) if seq > 0 else b""
        raw = txn.get(key, db=self._dbs.msgs) if key else None
        if raw is None:
            raise NotFoundError(f"no message at sequence {seq}", seq=seq)
        return decode_msg(key, raw)

    def _load_indexed(self, txn: Any, seq: int, h: bytes) -> StoredMsg:
        """Load a message the subject index pointed at, checking it has that subject."""
        msg = self._load(txn, seq)
        if _hash_of(msg.subject.encode()) != h:
            raise DataLossError(f"subject index points at {seq} of another subject", seq=seq)
        return msg

    def _head(self, seq: int, txn: Any = None) -> MsgHead:
        """The head of a message that must exist (an index pointed at it)."""
        key = self._msg_key(seq)
        raw = (txn or self._txn).get(key, db=self._dbs.msgs)
        if raw is None:
            raise DataLossError(f"indexed message {seq} is missing", seq=seq)
        return decode_head(key, raw)

    def _first_head(self) -> MsgHead:
        with self._reading() as txn:
            return self._head(self._meta.first_seq, txn)

    def _heads_from(self, seq: int, limit: int, *, txn: Any = None) -> list[MsgHead]:
        """Up to ``limit`` message heads from ``seq`` on, in order."""
        cur = (txn or self._txn).cursor(db=self._dbs.msgs)
        out: list[MsgHead] = []
        found = cur.set_range(self._msg_key(seq))
        while found and len(out) < limit:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            out.append(decode_head(key, value))
            found = cur.next()
        return out

    def _next_stored(self, seq: int) -> int:
        """The lowest stored sequence >= ``seq``, or last_seq + 1 when there is none."""
        cur = self._txn.cursor(db=self._dbs.msgs)
        if cur.set_range(self._msg_key(seq)):
            key = cur.key()
            if key.startswith(self._prefix):
                return int(SEQ.unpack_from(key, ID.size)[0])
        return self._meta.last_seq + 1

    def _last_stored(self, txn: Any) -> int:
        return self._last_in(txn, self._dbs.msgs, self._prefix)

    def _last_in(self, txn: Any, db: Any, prefix: bytes) -> int:
        """The sequence ending the last key under ``prefix`` (8-byte seq suffix), or 0."""
        cur = txn.cursor(db=db)
        hi = prefix + _SEQ_MAX
        if cur.set_range(hi):
            if cur.key() == hi:
                return 2**64 - 1
            found = cur.prev()
        else:
            found = cur.last()
        if not found:
            return 0
        key, value = cur.item()
        if not key.startswith(prefix) or len(key) != len(hi):
            return 0
        if db is self._dbs.sidx:
            verify_crc_only(key, value)
        return int(SEQ.unpack_from(key, len(prefix))[0])

    def _last_of(self, txn: Any, h: bytes) -> int:
        return self._last_in(txn, self._dbs.sidx, self._prefix + h)

    def _next_of(self, txn: Any, h: bytes, start: int) -> int:
        seqs = self._index_seqs(h, start, 0, limit=1, txn=txn)
        return seqs[0] if seqs else 0

    def _oldest_of(self, h: bytes) -> MsgHead:
        seqs = self._index_seqs(h, 1, 0, limit=1)
        invariant(bool(seqs), "subject count says messages but the index has none")
        return self._head(seqs[0])

    def _index_seqs(
        self, h: bytes, start: int, end: int, *, limit: int = 0, txn: Any = None
    ) -> list[int]:
        """Sequences of subject ``h`` in [start, end) (end 0: no end), at most ``limit``."""
        prefix = self._prefix + h
        cur = (txn or self._txn).cursor(db=self._dbs.sidx)
        out: list[int] = []
        found = cur.set_range(prefix + SEQ.pack(start))
        while found and (not limit or len(out) < limit):
            key, value = cur.item()
            if not key.startswith(prefix) or len(key) != len(prefix) + SEQ.size:
                break
            verify_crc_only(key, value)
            seq = int(SEQ.unpack_from(key, len(prefix))[0])
            if end and seq >= end:
                break
            out.append(seq)
            found = cur.next()
        return out

    def _count_keys(self, txn: Any, db: Any, start_key: bytes, prefix: bytes) -> int:
        cur = txn.cursor(db=db)
        if not cur.set_range(start_key):
            return 0
        n = 0
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            n += 1
        return n

    def _load_count(self, h: bytes, raw: bytes) -> _Count:
        key = self._prefix + h
        value = self._txn.get(key, db=self._dbs.subj)
        count = 0
        if value is not None:
            count, stored = decode_count(key, value)
            if stored != raw:
                raise DataLossError(f"subject record for {raw!r} holds {stored!r}", key=key)
        c = self._counts[h] = _Count(count, raw)
        return c

    def _subject_counts(
        self, subject_filter: str, *, txn: Any = None
    ) -> dict[bytes, tuple[int, bytes]]:
        """(count, subject) per subject hash matching the filter."""
        if self._txn is not None:
            self._flush_counts()
        txn = txn or self._txn
        if txn is None:
            with self._env.begin() as rtxn:
                return self._subject_counts(subject_filter, txn=rtxn)
        out: dict[bytes, tuple[int, bytes]] = {}
        if not has_wildcards(subject_filter):
            h = subject_key(subject_filter)[1]
            key = self._prefix + h
            value = txn.get(key, db=self._dbs.subj)
            if value is not None:
                out[h] = decode_count(key, value)
            return out
        cur = txn.cursor(db=self._dbs.subj)
        found = cur.set_range(self._prefix)
        while found:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            count, raw = decode_count(key, value)
            if subject_filter == FWC or subject_matches(subject_filter, raw.decode()):
                out[key[ID.size :]] = (count, raw)
            found = cur.next()
        return out

    def _matching_hashes(self, txn: Any, subject_filter: str) -> list[bytes]:
        return list(self._subject_counts(subject_filter, txn=txn))


def _id_record(key: bytes, stream_id: int) -> bytes:
    body = ID.pack(stream_id)
    return CRC.pack(crc32(body, crc32(key))) + body
