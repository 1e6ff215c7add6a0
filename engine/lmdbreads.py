"""The read side of the LMDB stream store: lookups, walks and counts over one stream's keys.

``LmdbStreamReads`` is the base of ``LmdbStreamStore`` (``engine/lmdbstore.py``), which owns
the state declared here and the write side; dedup records are read through its ``LmdbDedup``
part (``engine/lmdbdedup.py``), the subject index through ``LmdbIndexReads``
(``engine/lmdbindex.py``). Reads inside ``transaction()`` go through the open
write transaction (after flushing the appends it buffers), so they see its writes; outside
one, each read is its own read transaction. Threading: as the store, one thread at a time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

from raftstream.engine.lmdbdedup import LmdbDedup
from raftstream.engine.lmdbindex import SEQ_MAX, LmdbIndexReads, seek_le
from raftstream.engine.lmdbrecords import (
    ID,
    SEQ,
    MsgHead,
    PendingMsg,
    StoreDbs,
    StreamMeta,
    decode_count,
    decode_head,
    decode_msg,
    encode_chunk,
    encode_count,
    encode_msgs,
    hash_of,
    msg_lead,
    subject_key,
    verified_records,
)
from raftstream.engine.memstore import valid_filter
from raftstream.engine.store import (
    DedupRecord,
    StoredMsg,
    StreamState,
    missing_seqs,
)
from raftstream.engine.subjects import FWC, has_wildcards, subject_matches
from raftstream.errors import DataLossError, InvariantError, NotFoundError, invariant

__all__ = [
    "DEDUP_ITER_CHUNK_RECORDS",
    "ITER_CHUNK_MSGS",
    "ITER_FIRST_CHUNK_MSGS",
    "SUBJECT_WALK_SUBJECTS_MAX",
    "LmdbStreamReads",
    "RecordsReader",
    "SubjectCount",
]

ITER_CHUNK_MSGS = 256  # messages read per read transaction by iter_from, at most
# The first read transaction of an iter_from reads this many; each next one four times the
# last, up to ITER_CHUNK_MSGS: a consumer's fetch(1) reads a few messages, not 256.
ITER_FIRST_CHUNK_MSGS = 16
DEDUP_ITER_CHUNK_RECORDS = 256  # dedup records read per read transaction by dedup_iter
# A wildcard load_next walks each matching subject's index when the stream has at most this
# many subjects, and walks the messages otherwise.
SUBJECT_WALK_SUBJECTS_MAX = 256


class SubjectCount:
    """A subject's count and index chunks as cached by the store (its stream's only writer).

    ``count`` is current, ``stored`` is what the ``subj`` record holds; ``ikey`` is the
    subject's index prefix (stream id + subject key). ``chunks`` maps ``lo_seq`` to the chunks
    read or written since the last commit, ``tail`` is the last chunk (None: start a new one
    at the next append). ``tail_dirty`` marks a subject with unwritten chunks: the tail and
    those in ``dirty`` (by ``lo_seq``); the store lists such subjects once.
    """

    __slots__ = (
        "chunks",
        "count",
        "dirty",
        "ikey",
        "lead",
        "raw",
        "stored",
        "tail",
        "tail_dirty",
        "tail_lo",
    )

    def __init__(self, raw: bytes, ikey: bytes, count: int) -> None:
        self.raw = raw
        self.lead = msg_lead(raw, b"")  # its messages' record lead when they have no headers
        self.ikey = ikey
        self.count = count
        self.stored = count
        self.chunks: dict[int, list[int]] = {}
        self.tail: list[int] | None = None
        self.tail_lo = 0
        self.dirty: set[int] = set()
        self.tail_dirty = False


class LmdbStreamReads:
    """Read-side methods of the LMDB stream store; state is set up by ``LmdbStreamStore``."""

    _env: Any
    _name: str
    _dbs: StoreDbs
    _prefix: bytes
    _meta: StreamMeta
    _txn: Any
    _closed: bool
    _id: int
    _pend_msgs: list[PendingMsg]
    _pend_bytes: int
    _by_hash: dict[bytes, SubjectCount]
    _first_ts: tuple[int, int]  # (first_seq, its ts) once known; (0, 0) when not
    _dirty_subjects: list[SubjectCount]
    _dedup: LmdbDedup  # the stream's dedup records
    _index: LmdbIndexReads  # lookups in the subject index

    # -- Protocol reads ------------------------------------------------------------------------

    def load(self, seq: int) -> StoredMsg:
        """The message at ``seq``; ``NotFoundError`` if absent, ``DataLossError`` if corrupt."""
        with self._reading(index=False) as txn:
            return self._load(txn, seq)

    def load_last(self, subject_filter: str) -> StoredMsg:
        """The newest message matching the filter; ``NotFoundError`` when none does."""
        valid_filter(subject_filter, "subject_filter")
        with self._reading(index=subject_filter != FWC) as txn:
            if subject_filter == FWC:
                best, ikey = self._last_stored(txn), b""
            else:
                found = [(self._index.last(txn, k), k) for k in self._ikeys(txn, subject_filter)]
                best, ikey = max(found, default=(0, b""))
            if best == 0:
                raise NotFoundError(f"no message matches {subject_filter!r}")
            return self._load_indexed(txn, best, ikey) if ikey else self._load(txn, best)

    def load_next(self, subject_filter: str, start_seq: int) -> StoredMsg | None:
        """The first message at or after ``start_seq`` matching the filter, or None."""
        valid_filter(subject_filter, "subject_filter")
        start = max(start_seq, self._meta.first_seq, 1)
        if start > self._meta.last_seq:
            return None
        walk_messages = subject_filter == FWC or (
            has_wildcards(subject_filter) and self._meta.num_subjects > SUBJECT_WALK_SUBJECTS_MAX
        )
        with self._reading(index=not walk_messages) as txn:
            if walk_messages:
                return self._scan_next(txn, start, subject_filter)
            found = []
            for ikey in self._ikeys(txn, subject_filter):
                seqs = self._index.seqs(txn, ikey, start, 0, limit=1)
                if seqs:
                    found.append((seqs[0], ikey))
            best, ikey = min(found, default=(0, b""))
            return self._load_indexed(txn, best, ikey) if best else None

    def iter_from(
        self, start_seq: int, subject_filter: str = ">", *, expect: int = 0
    ) -> Iterator[StoredMsg]:
        """Messages at or after ``start_seq`` matching the filter, in sequence order.

        Reads ``expect`` records (``ITER_FIRST_CHUNK_MSGS`` when 0) in its first read
        transaction, then four times more per transaction up to ``ITER_CHUNK_MSGS`` (a
        caller that takes a few reads a few), so a slow consumer of the iterator never pins
        old pages; writes between chunks may or may not be seen.
        """
        self._check_open()
        valid_filter(subject_filter, "subject_filter")
        first = min(ITER_CHUNK_MSGS, expect) if expect > 0 else ITER_FIRST_CHUNK_MSGS
        return self._iter(max(start_seq, self._meta.first_seq, 1), subject_filter, first)

    def num_pending(self, start_seq: int, subject_filter: str = ">") -> int:
        """How many messages at or after ``start_seq`` match the filter."""
        valid_filter(subject_filter, "subject_filter")
        m = self._meta
        start = max(start_seq, m.first_seq, 1)
        if m.msgs == 0 or start > m.last_seq:
            return 0
        if subject_filter == FWC and start == m.first_seq:
            return m.msgs
        with self._reading(index=subject_filter != FWC) as txn:
            if subject_filter == FWC:
                return self._count_msgs(txn, start)
            total = 0
            for ikey, (count, _) in self._subject_counts(txn, subject_filter).items():
                total += count if start <= m.first_seq else self._index.count(txn, ikey, start)
            return total

    def state(self, *, subjects_filter: str | None = None) -> StreamState:
        """Counters from the cached meta; per-subject counts only when a filter is given."""
        self._check_open()
        m = self._meta
        first_ts = 0
        if m.msgs:
            seq, first_ts = self._first_ts
            if seq != m.first_seq:
                # Cached per first message: the stream state machine asks for state() on
                # every entry, and a read here would flush the transaction's buffer.
                with self._reading(index=False) as txn:
                    first_ts = self._head(txn, m.first_seq).ts
                self._first_ts = (m.first_seq, first_ts)
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
        with self._reading(index=False) as txn:
            counts = self._subject_counts(txn, subject_filter)
        return {raw.decode(): count for count, raw in counts.values()}

    # -- Protocol: deduplication records ------------------------------------------------------

    def deleted(self, limit: int, *, scan_msgs_max: int) -> list[int]:
        """The sequences missing between first and last, the lowest ``limit`` (Protocol):
        one read transaction walking the message keys from ``first_seq`` (no values read)."""
        self._check_open()
        m = self._meta
        missing = (m.last_seq - m.first_seq + 1 - m.msgs) if m.msgs else 0
        if missing <= 0 or limit <= 0:
            return []
        with self._reading(index=False) as txn:
            return missing_seqs(
                self._stored_seqs(txn, m.first_seq),
                first_seq=m.first_seq,
                last_seq=m.last_seq,
                missing=missing,
                limit=limit,
                scan_max=scan_msgs_max,
            )

    def dedup_get(self, msg_id: str) -> DedupRecord | None:
        """The record of ``msg_id``, or None; ``DataLossError`` when it fails its checksum."""
        if self._txn is not None:  # the publish path: no context manager to enter
            return self._dedup.get(self._txn, msg_id)
        with self._plain_reading() as txn:
            return self._dedup.get(txn, msg_id)

    @property
    def store_id(self) -> int:
        """The stream's id in this node's environment: the seed of its records' CRCs."""
        return self._id

    def records_reader(self) -> RecordsReader:
        """A ``RecordsReader`` of the stream as it is now: one read transaction, read in
        steps while writes go on. Only between write transactions (it would not see the
        open one's writes)."""
        self._check_open()
        invariant(self._txn is None, "records are read between write transactions")
        return RecordsReader(self, self._env.begin())

    def dedup_iter(self) -> Iterator[DedupRecord]:
        """Every record in expiry order, ``DEDUP_ITER_CHUNK_RECORDS`` per read transaction
        (as ``iter_from``: writes between chunks may or may not be seen)."""
        self._check_open()
        return self._dedup_walk()

    def _dedup_walk(self) -> Iterator[DedupRecord]:
        start = self._prefix
        while True:
            with self._plain_reading() as txn:
                chunk, start = self._dedup.chunk(txn, start, DEDUP_ITER_CHUNK_RECORDS)
            yield from chunk
            if len(chunk) < DEDUP_ITER_CHUNK_RECORDS:
                return

    # -- transactions and buffered writes -----------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvariantError(f"stream store {self._name!r} used after close()")

    def _wt_msgs(self) -> Any:
        """The open write transaction, with the buffered message records written into it."""
        txn = self._txn
        invariant(txn is not None, "stream store write outside a transaction")
        if self._pend_msgs:
            # One putmulti for the batch: the append path's main saving over a put per call.
            records = encode_msgs(self._id, self._pend_msgs)
            done, _ = txn.cursor(db=self._dbs.msgs).putmulti(records)
            invariant(done == len(records), "not every buffered message was written")
            self._pend_msgs = []
            self._pend_bytes = 0
        return txn

    def _txn_holding(self, seq: int) -> Any:
        """The open write transaction, for reading or removing the message at ``seq``.

        The buffered appends are written first only when ``seq`` is one of them: every
        buffered sequence is above every written one, so removing an older message (limits,
        age, TTL at the front of the stream) leaves the batch buffered.
        """
        pend = self._pend_msgs
        if pend and seq >= pend[0][0]:
            return self._wt_msgs()
        txn = self._txn
        invariant(txn is not None, "stream store write outside a transaction")
        return txn

    def _wt(self) -> Any:
        """The open write transaction with every buffered write (messages, index) in it."""
        txn = self._wt_msgs()
        for subj in self._dirty_subjects:
            if subj.tail is not None:
                subj.dirty.add(subj.tail_lo)
            for lo in subj.dirty:
                key = subj.ikey + SEQ.pack(lo)
                chunk = subj.chunks.get(lo)
                if chunk:
                    txn.put(key, encode_chunk(key, chunk), db=self._dbs.sidx)
                    continue
                txn.delete(key, db=self._dbs.sidx)
                subj.chunks.pop(lo, None)
                if subj.tail is chunk:
                    subj.tail = None  # the next append starts a new chunk
            subj.dirty.clear()
            subj.tail_dirty = False
        self._dirty_subjects = []
        return txn

    def _flush_counts(self) -> None:
        """Write the subject counts that changed since they were last stored."""
        txn = self._wt_msgs()
        for h, c in self._by_hash.items():
            if c.count == c.stored:
                continue
            key = self._prefix + h
            if c.count == 0:
                txn.delete(key, db=self._dbs.subj)
            else:
                txn.put(key, encode_count(key, c.count, c.raw), db=self._dbs.subj)
            c.stored = c.count

    @contextmanager
    def _plain_reading(self) -> Iterator[Any]:
        """The open write transaction as it is, or a fresh read transaction: for DBs the
        store never buffers (dedup records), so nothing needs flushing first."""
        self._check_open()
        if self._txn is not None:
            yield self._txn
            return
        with self._env.begin() as txn:
            yield txn

    @contextmanager
    def _reading(self, *, index: bool) -> Iterator[Any]:
        """The open write transaction (to see its writes) or a fresh read transaction.

        ``index`` says whether the read uses the subject index, which is then written out
        first; reads of messages only leave the buffered index chunks alone.
        """
        self._check_open()
        if self._txn is not None:
            yield self._wt() if index else self._wt_msgs()
            return
        with self._env.begin() as txn:
            yield txn

    # -- lookups -----------------------------------------------------------------------------

    def _load(self, txn: Any, seq: int) -> StoredMsg:
        key = self._prefix + SEQ.pack(seq) if seq > 0 else b""
        raw = txn.get(key, db=self._dbs.msgs) if key else None
        if raw is None:
            raise NotFoundError(f"no message at sequence {seq}", seq=seq)
        return decode_msg(key, raw)

    def _load_indexed(self, txn: Any, seq: int, ikey: bytes) -> StoredMsg:
        """Load a message the subject index pointed at, checking it has that subject."""
        msg = self._load(txn, seq)
        if self._prefix + hash_of(msg.subject.encode()) != ikey:
            raise DataLossError(f"subject index points at {seq} of another subject", seq=seq)
        return msg

    def _load_literal(self, txn: Any, seqs: list[int], subject: str) -> list[StoredMsg]:
        """The messages at ``seqs``, which the index of literal ``subject`` pointed at,
        checking each has that subject (``_load_indexed`` for a run of one subject's
        messages: a string comparison instead of the subject's index key per message; a
        consumer's every new message comes through here)."""
        get, db, prefix, pack = txn.get, self._dbs.msgs, self._prefix, SEQ.pack
        out: list[StoredMsg] = []
        for seq in seqs:
            key = prefix + pack(seq)
            raw = get(key, db=db)
            if raw is None:
                raise NotFoundError(f"no message at sequence {seq}", seq=seq)
            msg = decode_msg(key, raw)
            if msg.subject != subject:
                raise DataLossError(f"subject index points at {seq} of another subject", seq=seq)
            out.append(msg)
        return out

    def _head(self, txn: Any, seq: int) -> MsgHead:
        """The head of a message that must exist (first_seq, or an index pointed at it)."""
        key = self._prefix + SEQ.pack(seq)
        raw = txn.get(key, db=self._dbs.msgs)
        if raw is None:
            raise DataLossError(f"message {seq} is missing", seq=seq)
        return decode_head(key, raw)

    def _heads_from(self, txn: Any, seq: int, limit: int) -> list[MsgHead]:
        """Up to ``limit`` message heads from ``seq`` on, in order."""
        cur = txn.cursor(db=self._dbs.msgs)
        out: list[MsgHead] = []
        found = cur.set_range(self._prefix + SEQ.pack(seq))
        while found and len(out) < limit:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            out.append(decode_head(key, value))
            found = cur.next()
        return out

    def _msgs_from(self, txn: Any, seq: int, limit: int) -> list[StoredMsg]:
        """Up to ``limit`` whole messages from ``seq`` on, in order (``_heads_from`` then
        ``_load`` would read and verify every record twice)."""
        cur = txn.cursor(db=self._dbs.msgs)
        out: list[StoredMsg] = []
        found = cur.set_range(self._prefix + SEQ.pack(seq))
        while found and len(out) < limit:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            out.append(decode_msg(key, value))
            found = cur.next()
        return out

    def _next_stored(self, txn: Any, seq: int) -> int:
        """The lowest stored sequence >= ``seq``, written or still buffered in the open
        transaction, or last_seq + 1 when there is none."""
        cur = txn.cursor(db=self._dbs.msgs)
        if cur.set_range(self._prefix + SEQ.pack(seq)):
            key = cur.key()
            if key.startswith(self._prefix):
                return int(SEQ.unpack_from(key, ID.size)[0])
        # None written: the buffered appends (ascending, above every written one) come next.
        pend = self._pend_msgs
        i = bisect_left(pend, (seq,))
        return pend[i][0] if i < len(pend) else self._meta.last_seq + 1

    def _stored_seqs(self, txn: Any, start: int) -> Iterator[int]:
        """The stored sequences at or after ``start``, ascending (keys only)."""
        cur = txn.cursor(db=self._dbs.msgs)
        if not cur.set_range(self._prefix + SEQ.pack(start)):
            return
        prefix, unpack, at = self._prefix, SEQ.unpack_from, ID.size
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                return
            yield int(unpack(key, at)[0])

    def _last_stored(self, txn: Any) -> int:
        """The newest stored sequence, or 0."""
        cur = txn.cursor(db=self._dbs.msgs)
        if not seek_le(cur, self._prefix, self._prefix + SEQ_MAX):
            return 0
        return int(SEQ.unpack_from(cur.key(), ID.size)[0])

    def _count_msgs(self, txn: Any, start: int) -> int:
        """Stored messages at or after ``start``."""
        cur = txn.cursor(db=self._dbs.msgs)
        if not cur.set_range(self._prefix + SEQ.pack(start)):
            return 0
        n = 0
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(self._prefix):
                break
            n += 1
        return n

    def _subject_counts(self, txn: Any, subject_filter: str) -> dict[bytes, tuple[int, bytes]]:
        """(count, subject) by index prefix, for the subjects matching the filter."""
        if self._txn is not None:
            self._flush_counts()
        out: dict[bytes, tuple[int, bytes]] = {}
        if not has_wildcards(subject_filter):
            key = self._prefix + subject_key(subject_filter)[1]
            value = txn.get(key, db=self._dbs.subj)
            if value is not None:
                out[key] = decode_count(key, value)
            return out
        cur = txn.cursor(db=self._dbs.subj)
        found = cur.set_range(self._prefix)
        while found:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            count, raw = decode_count(key, value)
            if subject_filter == FWC or subject_matches(subject_filter, raw.decode()):
                out[key] = (count, raw)
            found = cur.next()
        return out

    def _ikeys(self, txn: Any, subject_filter: str) -> list[bytes]:
        return list(self._subject_counts(txn, subject_filter))

    # -- walks ---------------------------------------------------------------------------------

    def _scan_next(self, txn: Any, start: int, subject_filter: str) -> StoredMsg | None:
        """Walk the messages from ``start`` to the first one matching the filter."""
        cur = txn.cursor(db=self._dbs.msgs)
        found = cur.set_range(self._prefix + SEQ.pack(start))
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

    def _iter(self, seq: int, subject_filter: str, size: int) -> Iterator[StoredMsg]:
        literal = not has_wildcards(subject_filter)
        match_all = subject_filter == FWC
        ikey = self._prefix + subject_key(subject_filter)[1] if literal else b""
        while seq <= self._meta.last_seq:
            with self._reading(index=literal) as txn:
                if literal:
                    seqs = self._index.seqs(txn, ikey, seq, 0, limit=size)
                    chunk = self._load_literal(txn, seqs, subject_filter)
                elif match_all:  # every message: decoded straight off the cursor
                    chunk = self._msgs_from(txn, seq, size)
                    seqs = [m.seq for m in chunk]
                else:
                    heads = self._heads_from(txn, seq, size)
                    seqs = [hd.seq for hd in heads]
                    chunk = [
                        self._load(txn, hd.seq)
                        for hd in heads
                        if match_all or subject_matches(subject_filter, hd.subject.decode())
                    ]
            yield from chunk
            if len(seqs) < size:
                return
            seq = seqs[-1] + 1
            size = min(ITER_CHUNK_MSGS, size * 4)


class RecordsReader:
    """A stream's dedup records and raw message records as of one read transaction, read a
    bounded step at a time (a snapshot made between other work, ``cluster/stream/snapshot.py``):
    what the store held when the reader was made, whatever is written meanwhile. The open
    transaction keeps the pages it sees from reuse until ``close``."""

    def __init__(self, store: LmdbStreamReads, txn: Any) -> None:
        self._store = store
        self._txn = txn
        self._prefix = store._prefix
        self._dedup_start: bytes | None = store._prefix
        self._cur = txn.cursor(db=store._dbs.msgs)
        self._msgs_done = not self._cur.set_range(store._prefix)

    def dedup(self, limit: int) -> list[DedupRecord]:
        """The next up to ``limit`` dedup records in expiry order; [] once all are read."""
        if self._dedup_start is None:
            return []
        out, self._dedup_start = self._store._dedup.chunk(self._txn, self._dedup_start, limit)
        if len(out) < limit:
            self._dedup_start = None
        return out

    def msgs(self, limit: int) -> list[bytes]:
        """The next up to ``limit`` message records in sequence order, each verified
        (``verified_records``) but not decoded; [] once all are read. ``decode_record(
        store_id, record)`` reads one back."""
        if self._msgs_done:
            return []
        # iternext yields the cursor's item, then moves: after ``limit`` items the cursor is
        # on the last one returned, and next() steps past it for the next call.
        out = verified_records(self._prefix, islice(self._cur.iternext(), limit))
        if len(out) < limit or not self._cur.next():
            self._msgs_done = True
        return out

    def close(self) -> None:
        """End the read transaction (idempotent)."""
        self._txn.abort()
