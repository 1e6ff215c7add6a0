"""Reads of the LMDB stream store's per-subject sequence index (the ``sidx`` DB).

The index keeps each subject's sequences in ascending chunks keyed ``ikey lo_seq`` (``ikey``
is the stream id and the subject key; ``engine/lmdbrecords.py`` has the layout). Part of the
LMDB stream store (``engine/lmdbreads.py``, ``engine/lmdbstore.py``), which caches and writes
the chunks of the subjects it appends to: it hands these reads a transaction holding every
chunk they should see (its buffered chunks written first). Threading: as the store.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from raftstream.engine.lmdbrecords import SEQ, decode_chunk

__all__ = ["SEQ_MAX", "LmdbIndexReads", "seek_le"]

SEQ_MAX = b"\xff" * SEQ.size


class LmdbIndexReads:
    """Lookups in the subject index DB ``sidx``, in the transaction each call is given.
    Chunks are verified as they are read (``DataLossError`` if one is corrupt)."""

    def __init__(self, sidx: Any) -> None:
        self._db = sidx

    def last(self, txn: Any, ikey: bytes) -> int:
        """The newest sequence of the subject ``ikey`` in the index, or 0."""
        tail = self.last_chunk(txn, ikey)
        return tail[1][-1] if tail is not None else 0

    def last_chunk(self, txn: Any, ikey: bytes) -> tuple[int, list[int]] | None:
        """The subject's last stored chunk as (``lo_seq``, sequences), or None."""
        cur = txn.cursor(db=self._db)
        if not seek_le(cur, ikey, ikey + SEQ_MAX):
            return None
        key, value = cur.item()
        return int(SEQ.unpack_from(key, len(ikey))[0]), decode_chunk(key, value)

    def stored_lo(self, txn: Any, ikey: bytes, seq: int) -> int:
        """``lo_seq`` of the subject's last stored chunk starting at or below ``seq``, or 0."""
        cur = txn.cursor(db=self._db)
        if not seek_le(cur, ikey, ikey + SEQ.pack(seq)):
            return 0
        return int(SEQ.unpack_from(cur.key(), len(ikey))[0])

    def chunks(self, txn: Any, ikey: bytes, start: int) -> Iterator[list[int]]:
        """The subject's index chunks from the one that would hold ``start`` on, in order."""
        cur = txn.cursor(db=self._db)
        first = ikey + SEQ.pack(start)
        found = seek_le(cur, ikey, first) or cur.set_range(first)
        while found:
            key, value = cur.item()
            if not key.startswith(ikey) or len(key) != len(ikey) + SEQ.size:
                return
            yield decode_chunk(key, value)
            found = cur.next()

    def seqs(self, txn: Any, ikey: bytes, start: int, end: int, *, limit: int = 0) -> list[int]:
        """Sequences of the subject ``ikey`` in [start, end) (end 0: none), at most ``limit``."""
        out: list[int] = []
        for chunk in self.chunks(txn, ikey, start):
            for seq in chunk[bisect_left(chunk, start) :]:
                if end and seq >= end:
                    return out
                out.append(seq)
                if limit and len(out) >= limit:
                    return out
        return out

    def count(self, txn: Any, ikey: bytes, start: int) -> int:
        """How many sequences >= ``start`` the subject ``ikey`` has."""
        return sum(
            len(chunk) - bisect_left(chunk, start) for chunk in self.chunks(txn, ikey, start)
        )


def seek_le(cur: Any, prefix: bytes, key: bytes) -> bool:
    """Put ``cur`` on the last key <= ``key``; True when that key starts with ``prefix``."""
    # Seek to the first key >= ``key`` and step back unless it is ``key`` (or, past the end
    # of the DB, take the DB's last key).
    found = (cur.key() == key or cur.prev()) if cur.set_range(key) else cur.last()
    return bool(found) and bool(cur.key().startswith(prefix))
