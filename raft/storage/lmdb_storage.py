"""Raft logs of every group of a node in ONE LMDB environment.

Named databases (a fixed, small set, whatever the number of groups):

- ``groups``:    group id (utf-8) -> 4-byte prefix, a compact stand-in used in every other key
- ``entries``:   prefix + index (8 bytes big-endian) -> entry record (codec), sorted by index
- ``hardstate``: prefix -> hard state record
- ``snapmeta``:  prefix -> snapshot meta record (carries the checksum of the data)
- ``snapgen``:   prefix -> the generation (8 bytes big-endian) of the group's snapshot data
- ``snapchunks``: generation + chunk number (4 bytes, both big-endian) -> a chunk of that data
- ``snapdata``:  prefix -> snapshot data as one value: the layout before the chunks, read
  until the group's next snapshot replaces it

Snapshot data is stored in chunks small enough for LMDB to keep two to a page, never as one
value: a value bigger than half a page goes to a run of contiguous overflow pages, and a
stream snapshot of tens of MB needs thousands of them. The steady small writes of the log
between two compactions break freed runs into short ones, so each new snapshot found no run
long enough and the file grew by a snapshot per compaction (the soak saw ~390 MB an hour).
Single pages are reused whatever the fragmentation. Every snapshot written takes the next
generation, higher than any key in ``snapchunks``, so its chunks are appended (MDB_APPEND:
full pages; sorted inserts elsewhere split pages in half and leave them so).

Memory: LMDB keeps the pages a write transaction dirtied, for later transactions to reuse,
until the environment closes (it frees multi-page values at once). So a node's heap keeps
as much as its biggest write transaction ever dirtied, and a snapshot's chunks written in one
transaction stayed in the heap for good (measured: +24 MiB after two groups' 24 MiB
snapshots; deleting them costs little, as LMDB reuses the pages a deletion emptied within
the transaction). So data bigger than ``stage_bytes`` (4 MiB) is written ahead, under its
new generation, in transactions of at most that much each, before the write's transaction,
which then only points ``snapgen`` at it (smaller data goes in that transaction).

Until then the generation is an orphan, which nothing reads: if the write fails (or the
process dies first), its chunks are deleted at the start of the next ``write_batch`` or
``remove_group`` (so that a failure there stops that write before any of it), or when the
environment is next opened, which deletes every generation ``snapgen`` does not name.

Durability: the environment is opened with ``sync=True``, so ``write_batch`` returns only
after its transaction (and any written ahead) is fsynced; after kill -9, reopening finds
exactly the committed transactions (LMDB's copy-on-write B+tree never exposes a half-written
one).

Threading: one writer thread at a time (``write_batch``, ``remove_group``); reads use short
read transactions from any thread. ``close`` only once nothing else uses the storage.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import lmdb

from raftstream.raft.errors import invariant
from raftstream.raft.storage import codec
from raftstream.raft.storage.api import GroupWrite, LogStorage
from raftstream.raft.storage.base import (
    GroupState,
    LogStorageBase,
    WritePlan,
    check_unique_groups,
    plan_write,
    take_entries,
)
from raftstream.raft.storage.lmdbcheck import check_lmdb_env
from raftstream.raft.types import Entry, HardState, SnapshotMeta

__all__ = ["LmdbLogStorage", "read_snapshot_value"]

_DB_NAMES = (
    b"groups", b"entries", b"hardstate", b"snapmeta", b"snapdata", b"snapgen", b"snapchunks"
)  # fmt: skip
_GEN = 8  # bytes of a generation


def read_snapshot_value(
    txn: Any, data_db: Any, gen_db: Any | None, chunks_db: Any | None, prefix: bytes
) -> bytes:
    """The snapshot data of the group keyed ``prefix`` as stored (unverified): its chunks
    joined in order, else the single value of the older layout (``b""`` when there is none).
    ``gen_db`` and ``chunks_db`` are None for an environment written before the chunks."""
    gen = None if gen_db is None else txn.get(prefix, db=gen_db)
    if gen is None:
        return bytes(txn.get(prefix, default=b"", db=data_db))
    gen = bytes(gen)
    cur = txn.cursor(db=chunks_db)
    parts: list[bytes] = []
    found = cur.set_range(gen)
    while found and bytes(cur.key())[:_GEN] == gen:
        parts.append(bytes(cur.value()))
        found = cur.next()
    return b"".join(parts)


def _stored_generations(cur: Any) -> list[bytes]:
    """The generations that have chunks, in order (one cursor jump each)."""
    out: list[bytes] = []
    found = cur.first()
    while found:
        gen = bytes(cur.key())[:_GEN]
        out.append(gen)
        found = cur.set_range((int.from_bytes(gen, "big") + 1).to_bytes(_GEN, "big"))
    return out


def _delete_prefixed(txn: Any, db: Any, prefix: bytes) -> None:
    """Delete every key of ``db`` that starts with ``prefix``."""
    cur = txn.cursor(db=db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key())[: len(prefix)] == prefix and cur.delete():
        pass  # delete moves to the next key


class LmdbLogStorage(LogStorageBase):
    """LogStorage in an LMDB environment at ``path`` (a directory, created if missing)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        map_size_bytes: int = 1 << 30,
        readers_max: int = 126,
        sync: bool = True,
        tail_cache_entries_max: int = 1024,
        stage_bytes: int = 4 << 20,
    ) -> None:
        super().__init__(tail_cache_entries_max=tail_cache_entries_max)
        # Private to the node's user: the log holds every account's messages (0700, 0600).
        os.makedirs(path, mode=0o700, exist_ok=True)
        # LMDB mmaps the file: a truncated one would SIGBUS on first read (DataLossError here).
        check_lmdb_env(path)
        # sync=False exists for throwaway benchmarks only; it gives up durability on crash.
        self._env: Any = lmdb.open(
            os.fspath(path),
            map_size=map_size_bytes,
            max_dbs=len(_DB_NAMES),
            max_readers=readers_max,
            sync=sync,
            metasync=sync,
            mode=0o600,  # data.mdb and lock.mdb, when it creates them
        )
        dbs = [self._env.open_db(name) for name in _DB_NAMES]
        self._groups_db, self._entries_db, self._hs_db, self._meta_db, self._data_db = dbs[:5]
        self._gen_db, self._chunks_db = dbs[5:]
        self._next_prefix_id = 1
        # Two chunks (with their 12-byte keys and node headers) fit in a page.
        self._chunk_bytes = self._env.stat()["psize"] // 2 - 48
        self._stage_chunks = max(1, stage_bytes // self._chunk_bytes)
        self._next_gen = 1
        self._orphans: list[bytes] = []  # generations whose chunks are to be deleted
        self._load()
        self._sweep()

    def _load(self) -> None:
        with self._env.begin() as txn:
            # Past every generation stored or named: a group's whose data was empty has no
            # chunks, and sharing its number with the next would make those its data.
            named = {bytes(gen) for gen in txn.cursor(db=self._gen_db).iternext(keys=False)}
            stored = _stored_generations(txn.cursor(db=self._chunks_db))
            gens = named.union(stored)
            self._next_gen = max((int.from_bytes(g, "big") for g in gens), default=0) + 1
            self._orphans = [g for g in stored if g not in named]  # left by a crash
            for key, prefix in txn.cursor(db=self._groups_db):
                group = bytes(key).decode("utf-8")
                prefix = bytes(prefix)
                self._states[group] = self._load_group(txn, prefix)
                pid = int.from_bytes(prefix, "big")
                self._next_prefix_id = max(self._next_prefix_id, pid + 1)

    def _load_group(self, txn: Any, prefix: bytes) -> GroupState:
        hs_raw = txn.get(prefix, db=self._hs_db)
        hs = codec.decode_hard_state(hs_raw) if hs_raw is not None else HardState()
        meta_raw = txn.get(prefix, db=self._meta_db)
        meta = codec.decode_snapshot_meta(meta_raw)[0] if meta_raw is not None else SnapshotMeta()
        cur = txn.cursor(db=self._entries_db)
        # Position on the last key of this prefix: the first key past it, then one back.
        end = (int.from_bytes(prefix, "big") + 1).to_bytes(4, "big")
        found = cur.prev() if cur.set_range(end) else cur.last()
        if found and bytes(cur.key())[:4] == prefix:
            key = bytes(cur.key())
            last = codec.decode_entry(key, cur.value())
            invariant(last.index > meta.index, f"stale entry {last.index} below the snapshot")
            return GroupState(prefix, last.index, last.term, hs, meta)
        return GroupState(prefix, meta.index, meta.term, hs, meta)

    def read_entries(self, prefix: bytes, lo: int, hi: int, max_bytes: int | None) -> list[Entry]:
        with self._env.begin(db=self._entries_db) as txn:

            def record(index: int) -> Entry | None:
                key = codec.entry_key(prefix, index)
                raw = txn.get(key)
                return None if raw is None else codec.decode_entry(key, raw)

            return take_entries(lo, hi, max_bytes, record)

    def read_snapshot_data(self, prefix: bytes) -> bytes:
        with self._env.begin() as txn:
            meta_raw = txn.get(prefix, db=self._meta_db)
            if meta_raw is None:
                return b""
            _, data_crc = codec.decode_snapshot_meta(meta_raw)
            data = read_snapshot_value(txn, self._data_db, self._gen_db, self._chunks_db, prefix)
        return codec.verify_snapshot_data(data, data_crc)

    @property
    def env(self) -> Any:
        """The LMDB environment (for measuring its use: ``cluster/node/storage_room.py``)."""
        return self._env

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        check_unique_groups(writes)
        self._sweep()  # before this write: a failure there stops it before any of it
        plans: list[tuple[str, WritePlan]] = []
        ahead: dict[str, bytes] = {}  # group -> generation of its data written ahead
        for w in writes:
            snap = w.compaction or w.snapshot  # the one plan_write stores
            if snap is not None and len(snap.data) > self._stage_chunks * self._chunk_bytes:
                ahead[w.group] = self._write_ahead(snap.data)
        # One transaction for every group: one fsync at commit, whatever the group count.
        with self._env.begin(write=True) as txn:
            next_id = self._next_prefix_id
            for w in writes:
                state = self._states.get(w.group)
                if state is None:
                    state = GroupState(prefix=codec.group_prefix(next_id))
                    next_id += 1
                    txn.put(w.group.encode("utf-8"), state.prefix, db=self._groups_db)
                plan = plan_write(state, w, functools.partial(self._term_in, txn, state.prefix))
                self._apply(txn, plan, ahead.get(w.group))
                plans.append((w.group, plan))
        # Committed (and fsynced): only now may readers see the new bounds, and the data
        # written ahead is named (the sweep above left no other orphan).
        self._orphans.clear()
        self._next_prefix_id = next_id
        for group, plan in plans:
            self._states[group] = plan.state
            self.cache_written(group, plan)

    def _new_generation(self) -> bytes:
        gen = self._next_gen.to_bytes(_GEN, "big")
        self._next_gen += 1  # even if its transaction aborts: a gap is harmless
        return gen

    def _put_chunks(self, txn: Any, gen: bytes, view: memoryview, first: int, last: int) -> None:
        """Append the chunks ``first <= n < last`` of ``view`` under ``gen``."""
        step = self._chunk_bytes
        chunks = ((gen + n.to_bytes(4, "big"), view[n * step : (n + 1) * step])
                  for n in range(first, last))  # fmt: skip
        # An append below the last key is refused, not raised: count what went in.
        _, added = txn.cursor(db=self._chunks_db).putmulti(chunks, append=True)
        invariant(added == last - first, f"snapshot generation {gen.hex()} not the last")

    def _write_ahead(self, data: bytes) -> bytes:
        """Write ``data``'s chunks under a new generation, a stage per transaction
        (module docstring); an orphan until the write's transaction names it."""
        gen = self._new_generation()
        self._orphans.append(gen)  # what a failure from here on leaves: the next write sweeps
        view, total = memoryview(data), -(-len(data) // self._chunk_bytes)
        for first in range(0, total, self._stage_chunks):
            with self._env.begin(write=True) as txn:
                self._put_chunks(txn, gen, view, first, min(total, first + self._stage_chunks))
        return gen

    def _sweep(self) -> None:
        """Delete the orphan generations' chunks (deleting dirties few pages: LMDB reuses
        the ones a deletion emptied within the transaction)."""
        if self._orphans:
            with self._env.begin(write=True) as txn:
                for gen in self._orphans:
                    _delete_prefixed(txn, self._chunks_db, gen)
            self._orphans = []

    def _term_in(self, txn: Any, prefix: bytes, index: int) -> int:
        key = codec.entry_key(prefix, index)
        raw = txn.get(key, db=self._entries_db)
        return -1 if raw is None else codec.decode_entry(key, raw).term

    def _delete_range(self, txn: Any, prefix: bytes, lo: int, hi: int) -> None:
        """Delete entries with ``lo <= index < hi``."""
        cur = txn.cursor(db=self._entries_db)
        end = codec.entry_key(prefix, hi)
        if not cur.set_range(codec.entry_key(prefix, lo)):
            return
        while True:
            key = bytes(cur.key())
            if not key or key >= end or not cur.delete():  # delete moves to the next key
                return

    def _apply(self, txn: Any, plan: WritePlan, ahead: bytes | None) -> None:
        """Write ``plan`` in ``txn``; its snapshot's data is the generation ``ahead`` if
        that was written ahead."""
        prefix = plan.state.prefix
        if plan.compact_through is not None:
            self._delete_range(txn, prefix, 0, plan.compact_through + 1)
        if plan.truncate_from is not None:
            self._delete_range(txn, prefix, plan.truncate_from, 1 << 63)
        for e in plan.entries:
            key = codec.entry_key(prefix, e.index)
            txn.put(key, codec.encode_entry(key, e), db=self._entries_db)
        if plan.hard_state is not None:
            txn.put(prefix, codec.encode_hard_state(plan.hard_state), db=self._hs_db)
        if plan.snapshot is not None:
            snap = plan.snapshot
            txn.put(prefix, codec.encode_snapshot_meta(snap.meta, snap.data), db=self._meta_db)
            self._drop_snapshot_data(txn, prefix)
            gen = ahead
            if gen is None:
                gen = self._new_generation()
                total = -(-len(snap.data) // self._chunk_bytes)
                self._put_chunks(txn, gen, memoryview(snap.data), 0, total)
            txn.put(prefix, gen, db=self._gen_db)

    def _drop_snapshot_data(self, txn: Any, prefix: bytes) -> None:
        gen = txn.get(prefix, db=self._gen_db)
        if gen is not None:
            _delete_prefixed(txn, self._chunks_db, bytes(gen))
            txn.delete(prefix, db=self._gen_db)
        txn.delete(prefix, db=self._data_db)  # the older layout's value, if any

    def remove_group(self, group: str) -> None:
        state = self._states.get(group)
        if state is None:
            return
        self._sweep()
        with self._env.begin(write=True) as txn:
            self._delete_range(txn, state.prefix, 0, 1 << 63)
            for db in (self._hs_db, self._meta_db):
                txn.delete(state.prefix, db=db)
            self._drop_snapshot_data(txn, state.prefix)
            txn.delete(group.encode("utf-8"), db=self._groups_db)
        self._states.pop(group, None)
        self.drop_cache(group)

    def close(self) -> None:
        self._env.close()


def _conforms(storage: LmdbLogStorage) -> LogStorage:
    """Static check (mypy) that LmdbLogStorage implements the LogStorage Protocol."""
    return storage
