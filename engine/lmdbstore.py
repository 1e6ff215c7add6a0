"""LmdbStreamStore: a stream's messages in the node's LMDB environment.

One ``lmdb.Environment`` per node holds every stream (and, later, the Raft logs): the stores
share a fixed set of named DBs (``engine/lmdbrecords.py`` has the layouts) and tell their keys
apart by a 4-byte stream id allocated from the stream's name. A stream's counters and limits
live in one meta record, written once per write transaction, so reopening is one read.
Deduplication records (at most one per publish) go straight into the open transaction
(the store's ``LmdbDedup`` part, ``engine/lmdbdedup.py``, reads and writes them).

Inside a write transaction, appends are buffered, then encoded and written in one batch
(``encode_msgs`` and one ``putmulti``) when anything reads, removes or commits; the subject
index takes each sequence into an in-memory chunk, and chunks, subject counts and the meta
record are written once per transaction. That batch-level work is what keeps a 1000-append
transaction near the raw py-lmdb floor (``bench/engine/store.py``).

Parts: the store is the face and keeps appends, limits, single removals and transactions;
it owns a part per concern, each working in the transaction the store hands it:
``LmdbDedup`` (the dedup window, ``engine/lmdbdedup.py``), ``LmdbPurge`` (purge, compaction
and a drop's wholesale delete, ``engine/lmdbpurge.py``), ``LmdbExpiry`` (removal by
``max_age`` and TTL, with the TTL floor, ``engine/lmdbexpiry.py``) and ``LmdbIndexReads``
(lookups in the subject index, ``engine/lmdbindex.py``). The read side is the base class
``LmdbStreamReads`` (``engine/lmdbreads.py``).

Threading: a store is used by one thread at a time, and LMDB binds a write transaction to its
thread, so all writes of a node come from its one writer thread. Transactions of two stores on
one environment must not overlap (LMDB has one writer; the second would wait forever).
One ``LmdbStreamStore`` object per stream per environment: the object caches the stream's meta
and subject counts, so a second writer object would corrupt them.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import lmdb

from raftstream.engine.lmdbcheck import check_lmdb_env
from raftstream.engine.lmdbdedup import LmdbDedup
from raftstream.engine.lmdbexpiry import LmdbExpiry
from raftstream.engine.lmdbindex import LmdbIndexReads
from raftstream.engine.lmdbpurge import LmdbPurge
from raftstream.engine.lmdbreads import LmdbStreamReads, SubjectCount
from raftstream.engine.lmdbrecords import (
    ID,
    INDEX_CHUNK_SEQS_MAX,
    SEQ,
    MsgHead,
    StreamMeta,
    decode_chunk,
    decode_count,
    decode_head,
    decode_id,
    decode_meta,
    encode_headers,
    encode_meta,
    encoded_headers_size,
    hash_of,
    id_record,
    msg_lead,
    open_dbs,
    subject_key,
)
from raftstream.engine.memstore import check_append_args
from raftstream.engine.store import (
    DEDUP_EXPIRE_RECORDS_MAX,
    EMPTY_HEADERS,
    TS_NS_MAX,
    DiscardPolicy,
    StoreLimits,
    check_dedup_args,
    limit_set,
    normalize_purge,
)
from raftstream.errors import DataLossError, InvalidArgumentError, LimitError, invariant

__all__ = ["DEFAULT_MAP_SIZE_BYTES", "NODE_MAX_DBS", "LmdbStreamStore", "open_node_env"]

DEFAULT_MAP_SIZE_BYTES = 64 * 1024**3  # address space only; the file grows as data does
NODE_MAX_DBS = 16  # the stream store uses 7 named DBs (DB_NAMES), consumers 2; the rest spare
NODE_READERS_MAX = 126
STREAM_NAME_BYTES_MAX = 255
# Buffered appends are written once they hold this many bytes (counting a fixed overhead per
# message, so many tiny messages also stay bounded: at most ~32 K of them).
PENDING_BYTES_MAX = 4 * 1024 * 1024
PENDING_MSG_OVERHEAD_BYTES = 128
SUBJECT_CACHE_ENTRIES_MAX = 4096  # cached subject counts kept between transactions
_NO_DEDUP_RECORDS = TS_NS_MAX + 1  # a dedup floor above any record's time: there are none
# What ``transaction()`` returns inside an open transaction: joining needs no work.
JOINED_TRANSACTION: AbstractContextManager[None] = nullcontext()


def open_node_env(
    path: str | os.PathLike[str],
    *,
    map_size_bytes: int = DEFAULT_MAP_SIZE_BYTES,
    max_dbs: int = NODE_MAX_DBS,
    readers_max: int = NODE_READERS_MAX,
    sync: bool = True,
) -> Any:
    """Open (creating) a node's LMDB environment in directory ``path``.

    Keep ``sync`` on: a committed write transaction is then on disk when ``commit()``
    returns, which is what "acknowledged" promises. Off is a relaxed mode for benchmarks.
    ``DataLossError`` when the data file is shorter than LMDB's record of its pages.
    """
    # Private to the node's user: the data holds every account's messages (issue 39, 7).
    Path(path).mkdir(parents=True, exist_ok=True, mode=0o700)
    # LMDB mmaps the file: a truncated one would SIGBUS on first read, so check it first.
    check_lmdb_env(path)
    return lmdb.open(
        os.fspath(path),
        map_size=map_size_bytes,
        max_dbs=max_dbs,
        max_readers=readers_max,
        sync=sync,
        metasync=sync,
        readahead=False,  # random reads of a large map; readahead only evicts useful pages
        mode=0o600,  # data.mdb and lock.mdb, when it creates them
    )


class LmdbStreamStore(LmdbStreamReads):
    """One stream's messages in a shared node environment (see the module docstring).

    ``limits`` None keeps the limits stored with the stream (unlimited for a new one); a value
    replaces them, enforced from the next append (call ``update_limits`` to enforce at once).
    Not thread-safe: one thread at a time. ``close()`` forgets the store; the environment
    belongs to the caller.
    """

    def __init__(self, env: Any, name: str, *, limits: StoreLimits | None = None) -> None:
        raw_name = name.encode()
        if not raw_name or len(raw_name) > STREAM_NAME_BYTES_MAX:
            raise InvalidArgumentError("name", f"must be 1..{STREAM_NAME_BYTES_MAX} bytes")
        self._env = env
        self._name = name
        self._dbs = open_dbs(env)
        self._index = LmdbIndexReads(self._dbs.sidx)
        self._txn = None
        self._closed = False
        self._dropping = False
        self._pend_msgs = []
        self._pend_bytes = 0
        self._first_ts = (0, 0)
        self._dirty_subjects = []
        self._wide_subjects: list[SubjectCount] = []  # holding more chunks than their tail
        self._subjects: dict[str, SubjectCount] = {}
        self._by_hash = {}
        with env.begin(write=True) as txn:
            self._id = self._stream_id(txn, raw_name)
            self._prefix = ID.pack(self._id)
            self._dedup = LmdbDedup(self._dbs, self._prefix)
            self._expiry = LmdbExpiry(self)
            self._purge = LmdbPurge(self)
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
            return decode_id(key, raw)
        counter = txn.get(b"C", db=self._dbs.meta)
        stream_id = 1 if counter is None else decode_id(b"C", counter)
        invariant(stream_id < 2**32 - 1, "stream ids exhausted")
        txn.put(b"C", id_record(b"C", stream_id + 1), db=self._dbs.meta)
        txn.put(key, id_record(key, stream_id), db=self._dbs.meta)
        return stream_id

    # -- configuration and transactions ---------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def limits(self) -> StoreLimits:
        return self._meta.limits

    @property
    def last_seq(self) -> int:
        """``state().last_seq`` without building a ``StreamState`` (read per applied entry)."""
        self._check_open()
        return self._meta.last_seq

    @property
    def last_ts(self) -> int:
        """``state().last_ts`` without building a ``StreamState`` (read per applied entry)."""
        self._check_open()
        return self._meta.last_ts

    def update_limits(self, limits: StoreLimits, now_ns: int) -> None:
        """Change limits and enforce them at once, removing the oldest messages as needed."""
        with self.transaction():
            self._meta.limits = limits
            self._limits_changed()
            per = limits.max_msgs_per_subject
            if limit_set(per):
                counts = self._subject_counts(self._wt(), ">")
                for count, raw in counts.values():
                    if count > per:
                        self._trim_subject(self._subject_of(raw), per)
            self._enforce_totals()
            self._expiry.expire_age(now_ns)

    def transaction(self) -> AbstractContextManager[None]:
        """One LMDB write transaction (one fsync) for everything done inside the block.

        Nested blocks join the outermost one. An exception leaving the outermost block aborts
        it: nothing of the block is stored and the store's counters roll back. If commit
        itself fails the outcome is as LMDB reports it: an error means nothing was stored.
        A full environment (LMDB's map size) aborts the block with ``LimitError``.
        """
        self._check_open()
        if self._txn is not None:
            # Joining costs nothing: the stream state machine nests several blocks per
            # applied entry inside the caller's batch, so this is on the publish path.
            return JOINED_TRANSACTION
        return self._outermost_transaction()

    @contextmanager
    def _outermost_transaction(self) -> Iterator[None]:
        saved = replace(self._meta)
        txn = self._env.begin(write=True)
        self._txn = txn
        try:
            yield
            self._flush()
        except BaseException as exc:
            self._rollback(saved)
            txn.abort()
            if isinstance(exc, lmdb.MapFullError):
                raise LimitError("node storage is full (LMDB map size)", limit="map_size") from exc
            raise
        self._txn = None
        try:
            # Durability point: with the environment's sync on, commit() returns after the
            # fsync, so a mutation that returned is on disk (fsync-before-ack).
            txn.commit()
        except BaseException as exc:
            self._rollback(saved)
            if isinstance(exc, lmdb.MapFullError):
                raise LimitError("node storage is full (LMDB map size)", limit="map_size") from exc
            raise
        if len(self._by_hash) > SUBJECT_CACHE_ENTRIES_MAX:
            self._forget_subjects()
        for subj in self._wide_subjects:  # keep memory bounded: only tails stay cached
            subj.chunks = {subj.tail_lo: subj.tail} if subj.tail is not None else {}
        self._wide_subjects = []

    def _rollback(self, saved: StreamMeta) -> None:
        """Forget everything the aborted transaction changed in memory."""
        self._txn = None
        self._dropping = False
        self._pend_msgs = []
        self._pend_bytes = 0
        self._forget_subjects()
        self._first_ts = (0, 0)
        self._dedup.forget()
        self._expiry.forget()
        self._meta = saved
        self._limits_changed()

    def _forget_subjects(self) -> None:
        """Drop cached counts and chunks (after an abort, or once everything is written)."""
        self._subjects.clear()
        self._by_hash.clear()
        self._dirty_subjects = []
        self._wide_subjects = []

    def _flush(self) -> None:
        """Write what the transaction keeps in memory: appends, subject counts, meta."""
        self._flush_counts()
        txn = self._wt()
        if self._dropping:
            txn.delete(self._meta_key, db=self._dbs.meta)
            txn.delete(b"N" + self._name.encode(), db=self._dbs.meta)
            return
        txn.put(self._meta_key, encode_meta(self._meta_key, self._meta), db=self._dbs.meta)

    def _limits_changed(self) -> None:
        lim = self._meta.limits
        self._admission = limit_set(lim.max_msg_size) or lim.discard is DiscardPolicy.NEW
        self._enforce = (
            limit_set(lim.max_msgs_per_subject)
            or limit_set(lim.max_msgs)
            or limit_set(lim.max_bytes)
            or lim.max_age_ns > 0
        )

    def _subject(self, subject: str) -> SubjectCount:
        """The cached count of a subject being appended to (validating it the first time)."""
        raw, h = subject_key(subject)
        c = self._by_hash.get(h) or self._load_subject(raw, h)
        self._subjects[subject] = c
        return c

    def _subject_of(self, raw: bytes) -> SubjectCount:
        """The cached count of a stored subject."""
        h = hash_of(raw)
        return self._by_hash.get(h) or self._load_subject(raw, h)

    def _load_subject(self, raw: bytes, h: bytes) -> SubjectCount:
        key = self._prefix + h
        value = self._txn.get(key, db=self._dbs.subj)  # counts are never buffered
        count = 0
        if value is not None:
            count, stored = decode_count(key, value)
            if stored != raw:
                raise DataLossError(f"subject record for {raw!r} holds {stored!r}", key=key)
        c = self._by_hash[h] = SubjectCount(raw, key, count)
        # Its index chunks are all written (a cached subject holds any unwritten ones), so the
        # stored last chunk is the tail appends extend.
        tail = self._index.last_chunk(self._txn, key)
        if tail is not None:
            c.tail_lo, c.tail = tail
            c.chunks[c.tail_lo] = c.tail
        return c

    # -- appends ------------------------------------------------------------------------------

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
                return self.append(subject, data, headers=headers, now_ns=now_ns, ttl_ns=ttl_ns)
        # The hot path: no LMDB call and no encoding here. The message is buffered, encoded and
        # written in one batch (encode_msgs + putmulti) before any read, removal or commit;
        # the index entry goes into the subject's tail chunk; counts and meta are written at
        # commit. ``data`` is kept by reference until then: bytes, never mutated.
        subj = self._subjects.get(subject) or self._subject(subject)
        if ttl_ns or not 0 <= now_ns <= TS_NS_MAX:
            check_append_args(now_ns, ttl_ns)
        raw = subj.raw
        if headers:
            hdrs = encode_headers(headers)
            lead = msg_lead(raw, hdrs)
            payload = len(data) + encoded_headers_size(hdrs, len(headers))
        else:
            lead = subj.lead
            payload = len(data)
        size = payload + len(raw)
        if self._admission:
            self._check_admission(size, payload, subj.count)
        self._pend_bytes += size + PENDING_MSG_OVERHEAD_BYTES
        m = self._meta
        seq = m.last_seq + 1
        self._pend_msgs.append((seq, lead, data, now_ns, ttl_ns))  # encoded by _wt_msgs
        tail = subj.tail
        if tail is None or len(tail) >= INDEX_CHUNK_SEQS_MAX:
            tail = self._new_tail(subj, seq)
        tail.append(seq)
        if not subj.tail_dirty:
            subj.tail_dirty = True
            self._dirty_subjects.append(subj)
        if ttl_ns:
            seq_b = SEQ.pack(seq)
            tkey = self._prefix + SEQ.pack(now_ns + ttl_ns) + seq_b
            self._txn.put(tkey, seq_b, db=self._dbs.ttl)
            self._expiry.ttl_added(now_ns + ttl_ns)
        if subj.count == 0:
            m.num_subjects += 1
        subj.count += 1
        if m.msgs == 0:
            m.first_seq = seq
            self._first_ts = (seq, now_ns)
        m.msgs += 1
        m.bytes += size
        m.last_seq = seq
        m.last_ts = now_ns
        if self._enforce:
            self._enforce_after_append(subj, now_ns)
        if self._pend_bytes > PENDING_BYTES_MAX:
            self._wt_msgs()  # keeps memory bounded; removals no longer write the buffer
        return seq

    def _new_tail(self, subj: SubjectCount, seq: int) -> list[int]:
        """Start the subject's next index chunk at ``seq`` (the previous one is full or gone)."""
        if subj.tail is not None:
            subj.dirty.add(subj.tail_lo)  # its last appends are not written yet
            self._wide_subjects.append(subj)  # the full chunk leaves the cache at commit
        tail: list[int] = []
        subj.tail = subj.chunks[seq] = tail
        subj.tail_lo = seq
        return tail

    def _check_admission(self, size: int, payload: int, subject_count: int) -> None:
        """Refuse (before anything is written) what max_msg_size or discard new forbids."""
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

    def _enforce_after_append(self, subj: SubjectCount, now_ns: int) -> None:
        per = self._meta.limits.max_msgs_per_subject
        if limit_set(per) and subj.count > per:
            self._trim_subject(subj, per)
        self._enforce_totals()
        self._expiry.expire_age(now_ns)

    def _trim_subject(self, subj: SubjectCount, keep: int) -> None:
        """Remove the subject's oldest messages until it has ``keep``."""
        txn = self._wt()
        for seq in self._index.seqs(txn, subj.ikey, 1, 0, limit=subj.count - keep):
            self._remove(self._indexed_head(txn, seq, subj))

    def _enforce_totals(self) -> None:
        m = self._meta
        lim = m.limits
        if limit_set(lim.max_msgs):
            while m.msgs > lim.max_msgs:
                self._remove(self._head(self._txn_holding(m.first_seq), m.first_seq))
        if limit_set(lim.max_bytes):
            while m.msgs and m.bytes > lim.max_bytes:
                self._remove(self._head(self._txn_holding(m.first_seq), m.first_seq))

    def skip(self, seq: int) -> None:
        """Make ``seq`` the next sequence; ``seq`` must be above ``last_seq``."""
        if seq <= self._meta.last_seq:
            raise InvalidArgumentError("seq", f"must be above last_seq {self._meta.last_seq}")
        with self.transaction():
            self._meta.last_seq = seq - 1
            if self._meta.msgs == 0:
                self._meta.first_seq = seq

    # -- deduplication records ----------------------------------------------------------------

    def dedup_put(self, msg_id: str, seq: int, ts_ns: int) -> None:
        """Record ``msg_id`` -> (``seq``, ``ts_ns``) in the open transaction (or its own),
        replacing the id's record and its time index entry."""
        check_dedup_args(msg_id, seq, ts_ns)
        if self._txn is None:
            with self.transaction():
                return self.dedup_put(msg_id, seq, ts_ns)
        self._dedup.put(self._txn, msg_id, seq, ts_ns)
        return None

    def dedup_expire(self, before_ts_ns: int, *, limit: int = DEDUP_EXPIRE_RECORDS_MAX) -> int:
        """Remove up to ``limit`` records older than ``before_ts_ns``, in time index order."""
        self._check_open()
        if limit <= 0 or not self._dedup.expiry_due(before_ts_ns):
            return 0  # none is that old: the common case costs no LMDB call
        with self.transaction():
            return self._dedup.expire(self._txn, before_ts_ns, limit)

    # -- removal ------------------------------------------------------------------------------

    def delete(self, seq: int, *, erase: bool = False) -> bool:
        """Remove one message; False when absent.

        ``erase`` overwrites the record with zeros before removing it. LMDB is copy-on-write:
        older images of the page may survive in free pages until reused, so erase hides the
        bytes from the store and from casual inspection, not from forensics.
        """
        if seq <= 0:
            return False
        with self.transaction():
            txn = self._wt_msgs()
            key = self._prefix + SEQ.pack(seq)
            raw = txn.get(key, db=self._dbs.msgs)
            if raw is None:
                return False
            head = decode_head(key, raw)
            if erase:
                txn.put(key, bytes(len(raw)), db=self._dbs.msgs)
            self._remove(head)
            return True

    def purge(
        self, *, subject: str | None = None, seq: int | None = None, keep: int | None = None
    ) -> int:
        """Remove messages as JetStream's purge request does (see the Protocol)."""
        req = normalize_purge(subject, seq, keep)
        with self.transaction():
            return self._purge.purge(req)

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count.

        Called for every applied entry: when nothing can be due (no age limit or a young
        first message, and no TTL deadline reached) it returns without an LMDB call and
        without writing the buffered appends."""
        self._check_open()
        if not self._expiry.due(now_ns):
            return 0
        with self.transaction():
            return self._expiry.expire(now_ns)

    def _indexed_head(self, txn: Any, seq: int, subj: SubjectCount) -> MsgHead:
        head = self._head(txn, seq)
        if head.subject != subj.raw:
            raise DataLossError(f"subject index points at {seq} of another subject", seq=seq)
        return head

    def _remove(self, head: MsgHead) -> None:
        """Remove one message and its index entries; update counters (in the open txn).
        The transaction's buffered appends stay buffered unless ``head`` is one of them."""
        txn, dbs, m = self._txn_holding(head.seq), self._dbs, self._meta
        seq_b = SEQ.pack(head.seq)
        txn.delete(self._prefix + seq_b, db=dbs.msgs)
        subj = self._subject_of(head.subject)
        self._unindex(subj, head.seq)
        if head.ttl:
            txn.delete(self._prefix + SEQ.pack(head.ts + head.ttl) + seq_b, db=dbs.ttl)
        invariant(subj.count > 0, "subject count underflow")
        subj.count -= 1
        if subj.count == 0:
            m.num_subjects -= 1
        m.msgs -= 1
        m.bytes -= head.size
        invariant(m.msgs >= 0 and m.bytes >= 0, "negative stream counters")
        if head.seq == m.first_seq:
            m.first_seq = self._next_stored(txn, head.seq + 1)

    def _unindex(self, subj: SubjectCount, seq: int) -> None:
        """Take ``seq`` out of its subject's index chunk (in memory; written by _wt)."""
        lo = self._chunk_lo(subj, seq)
        chunk = subj.chunks.get(lo)
        if chunk is None:
            key = subj.ikey + SEQ.pack(lo)
            chunk = subj.chunks[lo] = decode_chunk(key, self._txn.get(key, db=self._dbs.sidx))
            self._wide_subjects.append(subj)
        i = bisect_left(chunk, seq)
        if i == len(chunk) or chunk[i] != seq:
            raise DataLossError(f"subject index entry missing for sequence {seq}", seq=seq)
        del chunk[i]
        if not subj.tail_dirty:
            subj.tail_dirty = True
            self._dirty_subjects.append(subj)
        subj.dirty.add(lo)

    def _chunk_lo(self, subj: SubjectCount, seq: int) -> int:
        """``lo_seq`` of the chunk whose range holds ``seq``: the greatest one <= seq, among
        the stored chunks and the cached ones (which may be newer than the stored)."""
        cached = max((lo for lo in subj.chunks if lo <= seq), default=0)
        lo = max(cached, self._index.stored_lo(self._txn, subj.ikey, seq))
        if lo == 0:
            raise DataLossError(f"no subject index chunk holds sequence {seq}", seq=seq)
        return lo

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Forget the store (the environment stays open; it belongs to the caller)."""
        invariant(self._txn is None, "close() inside a transaction")
        self._closed = True
        self._forget_subjects()

    def drop(self) -> None:
        """Delete the stream: every record (dedup records too) and its name. The store is
        closed afterwards."""
        with self.transaction():
            self._purge.erase_all()
            self._dropping = True
        self.close()
