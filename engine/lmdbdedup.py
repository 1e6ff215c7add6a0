"""The LMDB stream store's dedup window: one stream's msg id records and their time index.

Part of ``LmdbStreamStore`` (``engine/lmdbstore.py``), which owns the transactions: each
method works in the transaction it is given (the store's open write transaction, or a read
transaction for lookups). The records live in the ``dedup`` and ``dedupt`` DBs
(``engine/lmdbrecords.py`` has the layouts); they are never buffered, so a read needs no
flush first. Threading: as the store, one thread at a time.
"""

from __future__ import annotations

from typing import Any

from raftstream.engine.lmdbrecords import (
    ID,
    SEQ,
    StoreDbs,
    decode_dedup,
    encode_dedup,
    verify_dedup_index,
)
from raftstream.engine.store import TS_NS_MAX, DedupRecord, dedup_key
from raftstream.errors import DataLossError

__all__ = ["LmdbDedup"]

_NO_DEDUP_RECORDS = TS_NS_MAX + 1  # a dedup floor above any record's time: there are none


class LmdbDedup:
    """A stream's dedup records (keys under ``prefix``, the stream id) and the floor that
    lets an expiry with nothing due skip LMDB. Arguments are checked by the caller."""

    def __init__(self, dbs: StoreDbs, prefix: bytes) -> None:
        self._dbs = dbs
        self._prefix = prefix
        # No dedup record of the stream is older than this (0 says nothing: times are >= 0).
        # Lets the dedup_expire of every applied entry return without an LMDB call when no
        # record is due; raised by expiry, lowered by puts, reset when a transaction aborts.
        self._floor_ns = 0

    def forget(self) -> None:
        """Forget the floor (the transaction that moved it aborted)."""
        self._floor_ns = 0

    def get(self, txn: Any, msg_id: str) -> DedupRecord | None:
        """The record of ``msg_id``, or None; ``DataLossError`` when it fails its checksum."""
        key = self._prefix + dedup_key(msg_id)
        raw = txn.get(key, db=self._dbs.dedup)
        if raw is None:
            return None
        rec = decode_dedup(key, raw)
        # Another id with the same digest owns the slot: this id has no record.
        return rec if rec.msg_id == msg_id else None

    def put(self, txn: Any, msg_id: str, seq: int, ts_ns: int) -> None:
        """Record ``msg_id`` -> (``seq``, ``ts_ns``) in the write transaction ``txn``,
        replacing the id's record and its time index entry."""
        # On the publish path (once per publish with a msg id): two puts, no buffering.
        dbs = self._dbs
        h = dedup_key(msg_id)
        key = self._prefix + h
        old = txn.get(key, db=dbs.dedup)
        if old is not None:
            # The id's older record leaves the time index too. On a digest collision the
            # slot held another id's record, which is replaced: deterministic (every
            # replica puts the same ids), and it only shortens that id's protection.
            prev = decode_dedup(key, old)
            if not txn.delete(self._prefix + SEQ.pack(prev.ts_ns) + h, db=dbs.dedupt):
                raise DataLossError("dedup record has no time index entry", key=key)
        txn.put(key, encode_dedup(key, seq, ts_ns, msg_id.encode()), db=dbs.dedup)
        txn.put(self._prefix + SEQ.pack(ts_ns) + h, h, db=dbs.dedupt)
        self._floor_ns = min(self._floor_ns, ts_ns)

    def expiry_due(self, before_ts_ns: int) -> bool:
        """False when no record is older than ``before_ts_ns`` (no LMDB call)."""
        return before_ts_ns > self._floor_ns

    def expire(self, txn: Any, before_ts_ns: int, limit: int) -> int:
        """Remove up to ``limit`` records older than ``before_ts_ns`` in the write
        transaction ``txn``, in time index order; returns how many."""
        before_ts_ns = min(before_ts_ns, _NO_DEDUP_RECORDS)
        hi = self._prefix + SEQ.pack(before_ts_ns)  # every key of a record older sorts below
        cur = txn.cursor(db=self._dbs.dedupt)
        found = cur.set_range(self._prefix)
        removed = 0
        while found and removed < limit:
            key, value = cur.item()
            if not key.startswith(self._prefix) or key >= hi:
                break
            self._indexed(txn, key, value)  # checks before removing
            txn.delete(self._prefix + value, db=self._dbs.dedup)
            found = cur.delete()  # and moves to the next entry
            removed += 1
        # The cursor is on the oldest record left (if any): the new floor.
        key = cur.key() if found else b""
        self._floor_ns = (
            int(SEQ.unpack_from(key, ID.size)[0])
            if key.startswith(self._prefix)
            else _NO_DEDUP_RECORDS
        )
        return removed

    def chunk(self, txn: Any, start: bytes, limit: int) -> tuple[list[DedupRecord], bytes]:
        """Up to ``limit`` records from the time index key ``start`` on, and where to resume."""
        cur = txn.cursor(db=self._dbs.dedupt)
        out: list[DedupRecord] = []
        found = cur.set_range(start)
        while found and len(out) < limit:
            key, value = cur.item()
            if not key.startswith(self._prefix):
                break
            out.append(self._indexed(txn, key, value))
            start = key + b"\x00"  # keys have one length: the next key is the next record
            found = cur.next()
        return out, start

    def _indexed(self, txn: Any, key: bytes, value: bytes) -> DedupRecord:
        """The record a dedup time index entry leads to; ``DataLossError`` unless the entry
        is well formed, its record exists and the record holds the entry's time."""
        verify_dedup_index(key, value)
        rkey = self._prefix + value
        raw = txn.get(rkey, db=self._dbs.dedup)
        if raw is None:
            raise DataLossError("dedup time index points at a missing record", key=key)
        rec = decode_dedup(rkey, raw)
        if SEQ.unpack_from(key, ID.size)[0] != rec.ts_ns:
            raise DataLossError("dedup time index disagrees with its record", key=key)
        return rec
