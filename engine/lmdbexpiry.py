"""The LMDB stream store's expiry: messages removed by ``max_age`` and by their TTL.

Part of ``LmdbStreamStore`` (``engine/lmdbstore.py``): it works in the store's open write
transaction and removes each message through the store (``_remove``). It keeps the TTL
floor, which lets the expiry check of every applied entry return without an LMDB call.
Threading: as the store, one thread at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftstream.engine.lmdbindex import SEQ_MAX
from raftstream.engine.lmdbpurge import PURGE_CHUNK_MSGS
from raftstream.engine.lmdbrecords import ID, SEQ, verify_index
from raftstream.engine.store import TS_NS_MAX
from raftstream.errors import DataLossError, invariant

if TYPE_CHECKING:
    from raftstream.engine.lmdbstore import LmdbStreamStore

__all__ = ["LmdbExpiry"]

_NO_TTL = TS_NS_MAX + 1  # a TTL floor above any deadline: no message has a TTL


class LmdbExpiry:
    """Age and TTL expiry of ``store``'s messages. ``due`` needs no transaction; the
    removing methods need the store's transaction open."""

    def __init__(self, store: LmdbStreamStore) -> None:
        self._store = store
        self._dbs = store._dbs
        self._prefix = store._prefix
        # No TTL deadline of the stream's messages is earlier than this: expire() returns at
        # once while it is in the future. Lowered by appends with a TTL, set by a scan of the
        # TTL index, reset when a transaction aborts.
        self._ttl_floor_ns = 0

    def forget(self) -> None:
        """Forget the TTL floor (the transaction that moved it aborted)."""
        self._ttl_floor_ns = 0

    def ttl_added(self, deadline_ns: int) -> None:
        """A message with this TTL deadline was appended."""
        self._ttl_floor_ns = min(self._ttl_floor_ns, deadline_ns)

    def due(self, now_ns: int) -> bool:
        """False only when ``expire(now_ns)`` certainly removes nothing (cheap checks)."""
        if now_ns >= self._ttl_floor_ns:
            return True
        m = self._store._meta
        max_age = m.limits.max_age_ns
        if max_age <= 0 or not m.msgs:
            return False
        seq, ts = self._store._first_ts
        return seq != m.first_seq or ts + max_age <= now_ns

    def expire(self, now_ns: int) -> int:
        """Remove messages past ``max_age`` or their TTL as of ``now_ns``; returns count."""
        return self.expire_age(now_ns) + self._expire_ttl(now_ns)

    def expire_age(self, now_ns: int) -> int:
        """Remove from the front while messages are ``max_age`` old (ts + max_age <= now)."""
        store = self._store
        max_age = store._meta.limits.max_age_ns
        removed = 0
        while max_age > 0 and store._meta.msgs:
            if self._first_stored_ts() + max_age > now_ns:
                break
            first = store._meta.first_seq
            store._remove(store._head(store._txn_holding(first), first))
            removed += 1
        return removed

    def _first_stored_ts(self) -> int:
        """The timestamp of the first stored message (the stream holds one), cached per
        ``first_seq``. A miss reads the record without writing the buffered appends, unless
        the first message is one of them: checking ``max_age`` when nothing is due then
        costs no LMDB call and keeps the transaction's appends batched."""
        store = self._store
        m = store._meta
        seq, ts = store._first_ts
        if seq == m.first_seq:
            return ts
        invariant(m.msgs > 0, "first message of an empty stream")
        ts = store._head(store._txn_holding(m.first_seq), m.first_seq).ts
        store._first_ts = (m.first_seq, ts)
        return ts

    def _expire_ttl(self, now_ns: int) -> int:
        """Remove the messages whose TTL deadline (ts + ttl) is at or before ``now_ns``;
        then raise the TTL floor to the earliest deadline left."""
        removed = self._remove_due_ttl(now_ns)
        cur = self._store._txn.cursor(db=self._dbs.ttl)  # TTL entries are never buffered
        key = cur.key() if cur.set_range(self._prefix) else b""
        self._ttl_floor_ns = (
            int(SEQ.unpack_from(key, ID.size)[0]) if key.startswith(self._prefix) else _NO_TTL
        )
        return removed

    def _remove_due_ttl(self, now_ns: int) -> int:
        store, prefix = self._store, self._prefix
        hi = prefix + SEQ.pack(now_ns) + SEQ_MAX
        start = prefix
        removed = 0
        while True:
            due: list[tuple[bytes, int]] = []
            cur = store._wt_msgs().cursor(db=self._dbs.ttl)
            found = cur.set_range(start)
            while found and len(due) < PURGE_CHUNK_MSGS:
                key, value = cur.item()
                if not key.startswith(prefix) or key > hi:
                    break
                verify_index(key, value)
                due.append((key, SEQ.unpack_from(value)[0]))
                found = cur.next()
            for key, seq in due:
                head = store._head(store._wt_msgs(), seq)
                if not head.ttl or prefix + SEQ.pack(head.ts + head.ttl) != key[:-8]:
                    raise DataLossError(f"TTL index entry disagrees with message {seq}", seq=seq)
                store._remove(head)
            removed += len(due)
            if len(due) < PURGE_CHUNK_MSGS:
                return removed
            start = due[-1][0] + b"\x00"  # resume after the last entry: always progress
