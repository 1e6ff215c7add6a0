"""The memory store's deduplication records (``MemoryStreamStore``'s ``dedup_*`` methods).

Moved out of ``memstore.py`` for issue 34: the records, their expiry heap and the undo log
of the store's open transaction, owned by one ``MemoryStreamStore``, which checks arguments,
opens the transaction around every change and calls ``begin``/``end``/``rollback`` with its
own. Not thread-safe, like the store.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from raftstream.engine.store import DedupRecord, dedup_key
from raftstream.errors import InvariantError

__all__ = ["MemoryDedup"]


class MemoryDedup:
    """msg_id -> ``DedupRecord``, with expiry in (ts_ns, dedup_key) order."""

    def __init__(self) -> None:
        self._dedup: dict[str, DedupRecord] = {}
        # (ts_ns, dedup_key, msg_id) in expiry order; an entry whose record was replaced or
        # removed is stale and skipped when it comes up (lazy deletion).
        self._dedup_heap: list[tuple[int, bytes, str]] = []
        self._dedup_undo: list[tuple[str, DedupRecord | None]] | None = None  # (id, before)

    # -- the store's transaction ----------------------------------------------------------

    @property
    def in_transaction(self) -> bool:
        return self._dedup_undo is not None

    def begin(self) -> None:
        """The store's outermost transaction opened: record changes to undo."""
        self._dedup_undo = []

    def end(self) -> None:
        """The store's transaction committed: forget the undo log."""
        self._dedup_undo = None

    def rollback(self) -> None:
        """Put back the records the aborted transaction replaced or removed."""
        undo = self._dedup_undo
        if undo is None:
            raise InvariantError("rollback outside a transaction")
        self._dedup_undo = None
        for msg_id, before in reversed(undo):
            if before is None:
                self._dedup.pop(msg_id, None)
            else:
                self._dedup[msg_id] = before
        if undo:  # rare: rebuild the heap rather than undo its pushes and pops
            self._dedup_heap = [(r.ts_ns, dedup_key(i), i) for i, r in self._dedup.items()]
            heapq.heapify(self._dedup_heap)

    def clear(self) -> None:
        self._dedup.clear()
        self._dedup_heap.clear()

    # -- records ----------------------------------------------------------------------------

    def put(self, msg_id: str, seq: int, ts_ns: int) -> None:
        """Record ``msg_id`` -> (``seq``, ``ts_ns``), replacing its record (arguments checked
        by the store, inside its transaction)."""
        self._set_dedup(msg_id, DedupRecord(msg_id, seq, ts_ns))
        heapq.heappush(self._dedup_heap, (ts_ns, dedup_key(msg_id), msg_id))

    def get(self, msg_id: str) -> DedupRecord | None:
        return self._dedup.get(msg_id)

    def due(self, before_ts_ns: int) -> bool:
        """True when a record may be older than ``before_ts_ns`` (the heap may be stale)."""
        heap = self._dedup_heap
        return bool(heap) and heap[0][0] < before_ts_ns

    def expire(self, before_ts_ns: int, limit: int) -> int:
        """Remove up to ``limit`` records older than ``before_ts_ns``, oldest first (inside the
        store's transaction)."""
        heap = self._dedup_heap
        removed = 0
        while heap and heap[0][0] < before_ts_ns and removed < limit:
            ts, _, msg_id = heapq.heappop(heap)
            rec = self._dedup.get(msg_id)
            if rec is None or rec.ts_ns != ts:
                continue  # stale: replaced or removed since (not counted: no record went)
            self._set_dedup(msg_id, None)
            removed += 1
        return removed

    def iter(self) -> Iterator[DedupRecord]:
        """Every record in expiry order (a snapshot taken now: O(records log records))."""
        return iter(sorted(self._dedup.values(), key=lambda r: (r.ts_ns, dedup_key(r.msg_id))))

    def _set_dedup(self, msg_id: str, rec: DedupRecord | None) -> None:
        """Replace (``rec``) or remove (None) the record of ``msg_id``, undoably."""
        if self._dedup_undo is not None:
            self._dedup_undo.append((msg_id, self._dedup.get(msg_id)))
        if rec is None:
            del self._dedup[msg_id]
        else:
            self._dedup[msg_id] = rec
