"""The LMDB stream store's purge and compaction: removing messages by request, in bulk.

Part of ``LmdbStreamStore`` (``engine/lmdbstore.py``): it works in the store's open write
transaction and removes each message through the store (``_remove``), so counters, the
subject index and the TTL index stay in step; a full purge and a drop delete the stream's
keys wholesale instead. Threading: as the store, one thread at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raftstream.engine.store import PurgeRequest
from raftstream.errors import invariant

if TYPE_CHECKING:
    from raftstream.engine.lmdbstore import LmdbStreamStore

__all__ = ["PURGE_CHUNK_MSGS", "LmdbPurge"]

PURGE_CHUNK_MSGS = 4096  # sequences collected per pass of a range purge or TTL expiry


class LmdbPurge:
    """Purges (JetStream's purge request: all, by sequence, keep, by subject), compaction
    and the wholesale delete of a drop, for ``store``. Every method needs the store's
    transaction open; an error aborts it with the rest of the block."""

    def __init__(self, store: LmdbStreamStore) -> None:
        self._store = store
        self._dbs = store._dbs
        self._prefix = store._prefix

    def purge(self, req: PurgeRequest) -> int:
        """Remove what ``req`` (normalized) names; returns how many messages went."""
        if req.is_full:
            return self.purge_all()
        if req.subject is None:
            removed = self._purge_range(req)
            self._compact_to(req.before_seq)
            return removed
        return self._purge_subject(req, req.subject)

    def purge_all(self) -> int:
        """Remove every message (first_seq moves past last_seq); returns how many."""
        store = self._store
        m = store._meta
        removed = m.msgs
        # Dedup records stay: JetStream keeps msg ids through a purge.
        self._delete_prefixed((self._dbs.msgs, self._dbs.sidx, self._dbs.subj, self._dbs.ttl))
        store._forget_subjects()  # their records are gone; cached counts would resurrect them
        m.msgs = m.bytes = m.num_subjects = 0
        m.first_seq = m.last_seq + 1
        return removed

    def erase_all(self) -> None:
        """Delete every record of the stream, its dedup records too (a drop)."""
        self.purge_all()
        self._delete_prefixed((self._dbs.dedup, self._dbs.dedupt))

    def _delete_prefixed(self, dbs: tuple[Any, ...]) -> None:
        """Delete every key of this stream from each of ``dbs``."""
        txn = self._store._wt()
        for db in dbs:
            cur = txn.cursor(db=db)
            found = cur.set_range(self._prefix)
            while found and cur.key().startswith(self._prefix):
                found = cur.delete()

    def _purge_range(self, req: PurgeRequest) -> int:
        """Purge without a subject: below ``before_seq``, or all but the newest ``keep``."""
        store = self._store
        m = store._meta
        budget = m.msgs - req.keep if req.keep is not None else m.msgs
        end = req.before_seq if req.before_seq is not None else m.last_seq + 1
        removed = 0
        while removed < budget and m.msgs and m.first_seq < end:
            heads = store._heads_from(store._wt_msgs(), m.first_seq, PURGE_CHUNK_MSGS)
            invariant(bool(heads) and heads[0].seq == m.first_seq, "first_seq is not stored")
            for head in heads[: budget - removed]:
                if head.seq >= end:
                    break
                store._remove(head)
                removed += 1
        return removed

    def _compact_to(self, before_seq: int | None) -> None:
        """JetStream Compact: sequences below ``before_seq`` are gone, even past the end."""
        m = self._store._meta
        if before_seq is None:
            return
        if before_seq > m.last_seq + 1:
            m.last_seq = before_seq - 1
        if m.msgs == 0:
            m.first_seq = m.last_seq + 1

    def _purge_subject(self, req: PurgeRequest, subject_filter: str) -> int:
        store = self._store
        end = req.before_seq if req.before_seq is not None else store._meta.last_seq + 1
        txn = store._wt()
        victims: list[int] = []
        for ikey in store._ikeys(txn, subject_filter):
            victims += store._index.seqs(txn, ikey, 1, end)
        victims.sort()
        if req.keep is not None:
            victims = victims[: max(0, len(victims) - req.keep)]
        for seq in victims:
            store._remove(store._head(store._wt_msgs(), seq))
        return len(victims)
