"""LogStorage contract, run against LMDB and its in-memory twin.

Each test names the rule it pins: Raft §5.3 (a conflicting suffix is truncated), §7
(snapshots compact the log; a mismatching snapshot supersedes the whole log), durability
(a returned ``write_batch`` survives a reopen and kill -9), and checksums (a corrupted record
raises DataLossError, never returns data).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.raft.errors import DataLossError, InvariantError
from raftstream.raft.storage import (
    GroupWrite,
    LmdbLogStorage,
    LogCompactedError,
    LogStorage,
    LogUnavailableError,
    MemoryDisk,
    MemoryLogStorage,
    codec,
)
from raftstream.raft.types import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMeta,
)


@dataclass
class Backend:
    """Opens a storage on one persistent medium; ``reopen`` models a process restart."""

    name: str
    open: Callable[[], LogStorage]
    corrupt: Callable[[str, int], None]  # (group, entry index): flip one byte of its data

    def reopen(self, storage: LogStorage) -> LogStorage:
        storage.close()
        return self.open()


def _memory_backend() -> Backend:
    disk = MemoryDisk()

    def corrupt(group: str, index: int) -> None:
        prefix = disk.registry[group]
        raw = bytearray(disk.entries[prefix][index])
        raw[-1] ^= 0xFF
        disk.entries[prefix][index] = bytes(raw)

    return Backend("memory", lambda: MemoryLogStorage(disk), corrupt)


def _lmdb_backend(path: Path) -> Backend:
    def corrupt(group: str, index: int) -> None:
        # Called with the storage closed: LMDB forbids opening one environment twice.
        env = lmdb.open(str(path), max_dbs=8)
        prefix = env.begin(db=env.open_db(b"groups")).get(group.encode())
        entries = env.open_db(b"entries")
        with env.begin(write=True, db=entries) as txn:
            key = codec.entry_key(bytes(prefix), index)
            raw = bytearray(txn.get(key))
            raw[-1] ^= 0xFF
            txn.put(key, bytes(raw))
        env.close()

    return Backend("lmdb", lambda: LmdbLogStorage(path, map_size_bytes=64 << 20), corrupt)


@pytest.fixture(params=["memory", "lmdb"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "memory":
        return _memory_backend()
    return _lmdb_backend(tmp_path / "log")


@pytest.fixture
def storage(backend: Backend) -> Iterator[LogStorage]:
    s = backend.open()
    yield s
    s.close()


def ents(lo: int, hi: int, term: int, size: int = 8) -> tuple[Entry, ...]:
    return tuple(Entry(i, term, EntryType.NORMAL, bytes([i % 256]) * size) for i in range(lo, hi))


def test_append_and_read_back(storage: LogStorage) -> None:
    storage.write_batch([GroupWrite("g", HardState(1, "n1", 3), ents(1, 6, 1))])
    log = storage.log("g")
    assert (log.first_index(), log.last_index()) == (1, 5)
    assert log.entries(1, 6) == list(ents(1, 6, 1))
    assert log.term(0) == 0 and log.term(5) == 1 and log.term(3) == 1
    assert log.hard_state() == HardState(1, "n1", 3)
    assert storage.groups() == ["g"]


def test_entries_respect_bytes_max_but_return_at_least_one(storage: LogStorage) -> None:
    storage.write_batch([GroupWrite("g", None, ents(1, 11, 1, size=100))])
    log = storage.log("g")
    assert [e.index for e in log.entries(1, 11, bytes_max=250)] == [1, 2]
    assert [e.index for e in log.entries(3, 11, bytes_max=10)] == [3]


def test_reads_outside_the_log_raise(storage: LogStorage) -> None:
    storage.write_batch([GroupWrite("g", None, ents(1, 4, 1))])
    log = storage.log("g")
    assert log.term(4) == 0  # the core's convention: no entry there, term 0
    with pytest.raises(LogUnavailableError):
        log.entries(2, 6)
    assert log.entries(2, 2) == []


def test_conflicting_suffix_is_truncated_raft_5_3(storage: LogStorage) -> None:
    """Raft §5.3: an existing entry that conflicts with a new one goes, with all after it."""
    storage.write_batch([GroupWrite("g", None, ents(1, 8, 1))])
    storage.write_batch([GroupWrite("g", None, ents(4, 6, 2))])
    log = storage.log("g")
    assert log.last_index() == 5
    assert [(e.index, e.term) for e in log.entries(1, 6)] == [(i, 1) for i in (1, 2, 3)] + [
        (4, 2),
        (5, 2),
    ]
    assert log.term(6) == 0


def test_bad_write_changes_nothing_in_the_batch(storage: LogStorage) -> None:
    """A batch is atomic: a gap in one group's append rejects every group's write."""
    storage.write_batch([GroupWrite("a", None, ents(1, 3, 1))])
    with pytest.raises(InvariantError):
        storage.write_batch(
            [GroupWrite("a", None, ents(3, 5, 1)), GroupWrite("b", None, ents(5, 6, 1))]
        )
    assert storage.log("a").last_index() == 2
    assert storage.groups() == ["a"]
    with pytest.raises(InvariantError):
        storage.write_batch([GroupWrite("a", HardState(1, "", 9))])  # commit beyond the log


def test_compaction_keeps_the_entries_after_the_snapshot_raft_7(storage: LogStorage) -> None:
    """Raft §7: a snapshot of the applied state replaces the entries it covers, only those."""
    conf = ConfState(voters=("n1", "n2", "n3"), learners=("n4",))
    storage.write_batch([GroupWrite("g", HardState(2, "n1", 6), ents(1, 5, 1) + ents(5, 11, 2))])
    snap = Snapshot(SnapshotMeta(6, 2, conf), b"state-machine-at-6")
    storage.write_batch([GroupWrite("g", compaction=snap)])
    log = storage.log("g")
    assert (log.first_index(), log.last_index()) == (7, 10)
    assert log.term(6) == 2 and log.term(10) == 2
    assert log.snapshot() == snap and log.conf_state() == conf
    assert log.entries(7, 11) == list(ents(7, 11, 2))
    with pytest.raises(LogCompactedError):
        log.entries(6, 8)
    with pytest.raises(LogCompactedError):
        log.term(5)
    with pytest.raises(InvariantError):  # the log holds entry 8 with term 2, not 1
        storage.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(8, 1)))])


def test_installed_snapshot_replaces_the_whole_log_raft_7(storage: LogStorage) -> None:
    """Raft §7: a snapshot from the leader supersedes the log (the core restores from it)."""
    storage.write_batch([GroupWrite("g", None, ents(1, 11, 1))])
    snap = Snapshot(SnapshotMeta(8, 3, ConfState(voters=("n1",))), b"x" * 1000)
    storage.write_batch([GroupWrite("g", HardState(3, "", 8), (), snap)])
    log = storage.log("g")
    assert (log.first_index(), log.last_index(), log.term(8)) == (9, 8, 3)
    assert log.entries(9, 9) == []
    storage.write_batch([GroupWrite("g", None, ents(9, 12, 3))])
    assert [e.index for e in log.entries(9, 12)] == [9, 10, 11]


def test_everything_survives_a_reopen(backend: Backend) -> None:
    s = backend.open()
    snap = Snapshot(SnapshotMeta(3, 1, ConfState(voters=("a", "b"))), b"snap")
    s.write_batch([GroupWrite("g1", HardState(1, "a", 2), ents(1, 6, 1))])
    s.write_batch([GroupWrite("g1", HardState(2, "b", 5), ents(6, 8, 2), compaction=snap)])
    s.write_batch([GroupWrite("g2", HardState(7, "", 0), ())])
    s = backend.reopen(s)
    try:
        assert s.groups() == ["g1", "g2"]
        g1 = s.log("g1")
        assert (g1.first_index(), g1.last_index(), g1.term(3), g1.term(7)) == (4, 7, 1, 2)
        assert g1.hard_state() == HardState(2, "b", 5) and g1.snapshot() == snap
        assert s.log("g2").hard_state() == HardState(7, "", 0)
        assert s.log("g2").last_index() == 0
    finally:
        s.close()


def test_corrupted_entry_raises_data_loss_never_data(backend: Backend) -> None:
    s = backend.open()
    s.write_batch([GroupWrite("g", None, ents(1, 6, 1))])
    s.close()
    backend.corrupt("g", 3)
    s = backend.open()
    try:
        log = s.log("g")
        assert [e.index for e in log.entries(1, 3)] == [1, 2]
        with pytest.raises(DataLossError):
            log.entries(1, 6)
        with pytest.raises(DataLossError):
            log.term(3)
    finally:
        s.close()


def test_corrupted_last_entry_is_caught_on_open(backend: Backend) -> None:
    s = backend.open()
    s.write_batch([GroupWrite("g", None, ents(1, 4, 1))])
    s.close()
    backend.corrupt("g", 3)
    with pytest.raises(DataLossError):
        backend.open()


def test_tail_cache_is_bounded_and_follows_truncation() -> None:
    """Recent entries are served from memory as written; older ones come from the records
    (checksums verified), and a truncated suffix never lingers in the cache (§5.3)."""
    disk = MemoryDisk()
    s = MemoryLogStorage(disk, tail_cache_entries_max=4)
    s.write_batch([GroupWrite("g", None, ents(1, 11, 1))])
    prefix = disk.registry["g"]
    for i in (2, 9):  # damage an old and a recent record behind the storage's back
        raw = bytearray(disk.entries[prefix][i])
        raw[-1] ^= 0xFF
        disk.entries[prefix][i] = bytes(raw)
    log = s.log("g")
    assert log.entries(7, 11) == list(ents(7, 11, 1))  # the last 4: from the cache
    with pytest.raises(DataLossError):
        log.entries(1, 4)  # not cached: read, verified, refused
    s.write_batch([GroupWrite("g", None, ents(8, 9, 2))])  # truncates 9 and 10
    assert log.last_index() == 8 and log.term(8) == 2
    assert [e.term for e in log.entries(7, 9)] == [1, 2]


def test_many_groups_in_one_batch(storage: LogStorage) -> None:
    writes = [GroupWrite(f"group-{i}", HardState(1, "n1", 0), ents(1, 4, 1)) for i in range(200)]
    txn_before = _lmdb_txn_id(storage)
    storage.write_batch(writes)
    if txn_before is not None:  # LMDB: the 200 groups cost exactly one write transaction
        assert _lmdb_txn_id(storage) == txn_before + 1
    assert len(storage.groups()) == 200
    for i in (0, 99, 199):
        assert storage.log(f"group-{i}").entries(1, 4) == list(ents(1, 4, 1))
    with pytest.raises(InvariantError):
        storage.write_batch([GroupWrite("x"), GroupWrite("x")])


def _lmdb_txn_id(storage: LogStorage) -> int | None:
    if isinstance(storage, LmdbLogStorage):
        return int(storage._env.info()["last_txnid"])
    return None


def test_remove_group_is_durable_and_leaves_others(backend: Backend) -> None:
    s = backend.open()
    s.write_batch([GroupWrite(g, HardState(1, "", 1), ents(1, 3, 1)) for g in ("a", "b", "c")])
    s.remove_group("b")
    s.remove_group("b")
    assert s.groups() == ["a", "c"]
    assert s.log("b").last_index() == 0
    s = backend.reopen(s)
    try:
        assert s.groups() == ["a", "c"]
        assert s.log("c").entries(1, 3) == list(ents(1, 3, 1))
        s.write_batch([GroupWrite("b", None, ents(1, 2, 5))])
        assert s.log("b").term(1) == 5
    finally:
        s.close()


# --- snapshot data on LMDB: chunks on full pages, readable in the older layout too ---


def _snapshot_records(env: Any) -> dict[str, list[bytes]]:
    """Every key of the snapshot data DBs, by DB name."""
    out: dict[str, list[bytes]] = {}
    for name in ("snapdata", "snapgen", "snapchunks"):
        db = env.open_db(name.encode())
        with env.begin(db=db) as txn:
            out[name] = [bytes(k) for k in txn.cursor().iternext(values=False)]
    return out


@pytest.mark.parametrize("stage_bytes", [4 << 20, 64 << 10], ids=["in-the-write", "ahead"])
def test_big_snapshots_round_trip_on_full_pages_and_leave_nothing_behind(
    tmp_path: Path, stage_bytes: int
) -> None:
    """A snapshot of many pages is stored in chunks, appended on full pages: read back
    whole, replaced by a smaller one without stale chunks, its neighbours untouched, gone
    with its group. Data within a stage is written in the write's transaction, bigger data
    ahead of it in stages."""
    from raftstream.audit.readers import read_snapshot_data

    def open_storage() -> LmdbLogStorage:
        return LmdbLogStorage(tmp_path / "big", map_size_bytes=64 << 20, stage_bytes=stage_bytes)

    s = open_storage()
    datas = {g: os.urandom(300_000 + n) for n, g in enumerate("abc")}
    try:
        s.write_batch([GroupWrite(g, None, ents(1, 4, 1)) for g in datas])
        for _ in range(2):
            s.write_batch(
                [
                    GroupWrite(g, compaction=Snapshot(SnapshotMeta(3, 1), d))
                    for g, d in datas.items()
                ]
            )
        with s.env.begin() as txn:
            chunks = txn.stat(s.env.open_db(b"snapchunks"))
        assert chunks["overflow_pages"] == 0  # no value on a run of pages
        stored = chunks["leaf_pages"] * s.env.stat()["psize"]
        assert stored < 1.1 * sum(map(len, datas.values()))  # not half-empty pages
        small = Snapshot(SnapshotMeta(3, 1), b"small")
        s.write_batch([GroupWrite("b", compaction=small)])
        assert s.log("b").snapshot() == small
        assert s.log("a").snapshot().data == datas["a"]
        assert s.log("c").snapshot().data == datas["c"]
        prefix_a = s.group_state("a").prefix
        assert read_snapshot_data(s.env, prefix_a) == datas["a"]  # the audit's reader
        chunk = s.env.stat()["psize"] // 2 - 48
        n_chunks = len(_snapshot_records(s.env)["snapchunks"])
        assert n_chunks == -(-300_000 // chunk) + -(-300_002 // chunk) + 1
        s.remove_group("a")
        records = _snapshot_records(s.env)
        assert len(records["snapchunks"]) == n_chunks - -(-300_000 // chunk)
        assert prefix_a not in records["snapgen"] and records["snapdata"] == []
        s.close()
        s = open_storage()
        assert s.log("b").snapshot() == small and s.log("c").snapshot().data == datas["c"]
        s.write_batch([GroupWrite("c", compaction=Snapshot(SnapshotMeta(3, 1), b"c2"))])
        assert s.log("c").snapshot().data == b"c2"  # appended after a reopen, too
    finally:
        s.close()


def test_an_empty_snapshot_keeps_its_generation_across_a_reopen(tmp_path: Path) -> None:
    """Empty data has no chunks: its generation, the last written, is not taken again after
    a reopen (another group's chunks under it would read as its data, and be deleted with
    it)."""
    path = tmp_path / "empty"
    s = LmdbLogStorage(path, map_size_bytes=64 << 20)
    s.write_batch([GroupWrite(g, None, ents(1, 4, 1)) for g in "ab"])
    s.write_batch([GroupWrite("a", compaction=Snapshot(SnapshotMeta(2, 1), b"a" * 5000))])
    s.write_batch([GroupWrite("b", compaction=Snapshot(SnapshotMeta(3, 1), b""))])
    s.close()
    s = LmdbLogStorage(path, map_size_bytes=64 << 20)
    try:
        s.write_batch([GroupWrite("a", compaction=Snapshot(SnapshotMeta(3, 1), b"A" * 5000))])
        assert s.log("b").snapshot().data == b""
        s.write_batch([GroupWrite("b", None, ents(4, 5, 1))])
        s.write_batch([GroupWrite("b", compaction=Snapshot(SnapshotMeta(4, 1), b"b2"))])
        assert s.log("a").snapshot().data == b"A" * 5000
        assert s.log("b").snapshot().data == b"b2"
    finally:
        s.close()


def test_orphan_chunks_of_a_failed_write_are_deleted_on_the_next_open(tmp_path: Path) -> None:
    """Data written ahead of a write that then fails is in no group's snapshot (the write
    changed nothing); its chunks are deleted by the next write or, after a crash first, by
    opening the environment."""
    path = tmp_path / "orphans"
    good, bad = os.urandom(40_000), os.urandom(50_000)

    def chunk_gens(s: LmdbLogStorage) -> set[bytes]:
        return {k[:8] for k in _snapshot_records(s.env)["snapchunks"]}

    s = LmdbLogStorage(path, map_size_bytes=64 << 20, stage_bytes=8192)
    s.write_batch([GroupWrite("g", None, ents(1, 4, 1))])
    s.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(3, 1), good))])
    named = chunk_gens(s)
    with pytest.raises(InvariantError):  # a compaction past the log: refused after the data
        s.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(9, 1), bad))])
    assert s.log("g").snapshot().data == good
    assert len(chunk_gens(s) - named) == 1  # the bad data's chunks, written ahead
    s.close()  # as a crash before the next write
    s = LmdbLogStorage(path, map_size_bytes=64 << 20, stage_bytes=8192)
    try:
        assert chunk_gens(s) == named
        assert s.log("g").snapshot().data == good
        with pytest.raises(InvariantError):
            s.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(9, 1), bad))])
        s.write_batch([])
        assert chunk_gens(s) == named
    finally:
        s.close()


_HEAP_PROBE = textwrap.dedent(
    """
    import gc, os, sys
    from raftstream.tooling.procfs import status_kib
    from raftstream.raft.storage import GroupWrite
    from raftstream.raft.storage.lmdb_storage import LmdbLogStorage
    from raftstream.raft.types import Entry, Snapshot, SnapshotMeta

    s = LmdbLogStorage(sys.argv[1], map_size_bytes=1 << 30, stage_bytes=1 << 20)
    s.write_batch([GroupWrite(g, None, (Entry(1, 1, data=b"e"),)) for g in "ab"])
    before = status_kib(os.getpid(), "RssAnon")["RssAnon"]
    for _ in range(2):
        snaps = {g: Snapshot(SnapshotMeta(1, 1), os.urandom(16 << 20)) for g in "ab"}
        s.write_batch([GroupWrite(g, compaction=snap) for g, snap in snaps.items()])
        del snaps
        gc.collect()
    print(status_kib(os.getpid(), "RssAnon")["RssAnon"] - before)
    """
)


def test_the_heap_does_not_keep_the_snapshots_written(tmp_path: Path) -> None:
    """LMDB keeps every page a write transaction dirtied, for later ones: two groups' 16 MiB
    snapshots written in the write's transaction left the heap 33 MiB bigger for good;
    written ahead in stages of 1 MiB, 0.4 MiB. (glibc's malloc is told not to keep the
    freed snapshot buffers itself, which it otherwise may, reused for the next ones.)"""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, "-c", _HEAP_PROBE, str(tmp_path / "heap")],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    grown_kib = int(out.stdout)
    assert grown_kib < 4 << 10, f"the heap grew by {grown_kib} KiB"


def test_snapshot_in_the_older_single_value_layout_is_read_then_replaced(tmp_path: Path) -> None:
    """Environments written before the chunks keep the data as one value under the group's
    prefix in ``snapdata``: read as it is, and a later snapshot leaves only chunks."""
    path = tmp_path / "old"
    data = os.urandom(50_000)
    s = LmdbLogStorage(path, map_size_bytes=64 << 20)
    s.write_batch([GroupWrite("g", None, ents(1, 4, 1))])
    s.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(3, 1), data))])
    prefix = s.group_state("g").prefix
    s.close()
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:  # as the older version wrote it
        for name in (b"snapgen", b"snapchunks"):
            txn.drop(env.open_db(name, txn=txn), delete=True)
        txn.put(prefix, data, db=env.open_db(b"snapdata", txn=txn))
    env.close()
    s = LmdbLogStorage(path, map_size_bytes=64 << 20)
    try:
        assert s.log("g").snapshot().data == data
        s.write_batch([GroupWrite("g", None, ents(4, 6, 1))])
        s.write_batch([GroupWrite("g", compaction=Snapshot(SnapshotMeta(5, 1), data[:9000]))])
        assert s.log("g").snapshot().data == data[:9000]
        records = _snapshot_records(s.env)
        assert records["snapdata"] == [] and records["snapgen"] == [prefix]
    finally:
        s.close()


def test_compactions_reuse_the_file_instead_of_growing_it(tmp_path: Path) -> None:
    """A snapshot per compaction, the log written in small batches between them (as a
    stream group does): after a warm-up the environment stops growing. Stored as one value,
    the snapshot needed a run of contiguous pages that the small writes had broken up, and
    the file grew by about a snapshot every few compactions, without end."""
    s = LmdbLogStorage(tmp_path / "grow", map_size_bytes=1 << 30, sync=False)
    snap_bytes, index, used = 1_000_000, 0, []
    try:
        for r in range(40):
            for _ in range(250):  # ~1.1 MB of log: as much as the snapshot, as the host waits
                s.write_batch([GroupWrite("g", None, ents(index + 1, index + 6, 1, 900))])
                index += 5
            data = bytes(snap_bytes + (r % 3) * 8192)  # sizes vary a little, as they do
            s.write_batch(
                [GroupWrite("g", compaction=Snapshot(SnapshotMeta(index - 100, 1), data))]
            )
            used.append((s.env.info()["last_pgno"] + 1) * s.env.stat()["psize"])
    finally:
        s.close()
    assert used[-1] - used[9] <= 64 << 10, [u >> 10 for u in used[9::10]]


# --- a model-based check: random appends, overwrites and snapshots against a plain list ---

_op = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 5), st.integers(0, 2)),
    st.tuples(st.just("snapshot"), st.integers(0, 8), st.booleans(), st.just(0)),
)


@settings(max_examples=60)
@given(ops=st.lists(_op, max_size=25))
def test_random_writes_match_a_model(ops: list[tuple[str, int, int | bool, int]]) -> None:
    storage = MemoryLogStorage()
    _run_model(storage, ops)


def _run_model(storage: LogStorage, ops: list[tuple[str, int, int | bool, int]]) -> None:
    snap_index, snap_term, log = 0, 0, []  # log[k] is the term of entry snap_index + 1 + k
    for kind, a, b, c in ops:
        last = snap_index + len(log)
        last_term = log[-1] if log else snap_term
        if kind == "append":
            start = max(snap_index + 1, last + 1 - a)
            new = ents(start, start + int(b), last_term + c)
            storage.write_batch([GroupWrite("g", None, new)])
            log = log[: start - snap_index - 1] + [e.term for e in new]
        else:
            if b:  # compaction at an index of the log, with its term
                index = min(last, snap_index + a)
                term = log[index - snap_index - 1] if index > snap_index else snap_term
                snap = Snapshot(SnapshotMeta(index, term), b"s")
                storage.write_batch([GroupWrite("g", compaction=snap)])
                log = log[index - snap_index :]
            else:  # install from a leader, maybe beyond our log
                index, term = snap_index + a, last_term + 1
                snap = Snapshot(SnapshotMeta(index, term), b"i")
                storage.write_batch([GroupWrite("g", snapshot=snap)])
                log = []
            snap_index, snap_term = index, term
        view = storage.log("g")
        assert (view.first_index(), view.last_index()) == (snap_index + 1, snap_index + len(log))
        got = view.entries(snap_index + 1, snap_index + len(log) + 1)
        assert [e.term for e in got] == log


@pytest.mark.parametrize("seed", range(3))
def test_random_writes_match_a_model_on_lmdb(tmp_path: Path, seed: int) -> None:
    import random

    rng = random.Random(seed)
    ops: list[tuple[str, int, int | bool, int]] = [
        ("append", rng.randrange(7), rng.randrange(1, 6), rng.randrange(3))
        if rng.random() < 0.75
        else ("snapshot", rng.randrange(9), rng.random() < 0.5, 0)
        for _ in range(60)
    ]
    storage = LmdbLogStorage(tmp_path / "m", map_size_bytes=64 << 20)
    try:
        _run_model(storage, ops)
    finally:
        storage.close()


# --- kill -9: exactly the fsynced transactions come back ---

_WRITER = textwrap.dedent(
    """
    import sys
    from raftstream.raft.storage import GroupWrite, LmdbLogStorage
    from raftstream.raft.types import Entry, HardState
    s = LmdbLogStorage(sys.argv[1], map_size_bytes=64 << 20)
    i = 0
    while True:
        batch = [Entry(i + k + 1, 1, data=b"p" * 100) for k in range(10)]
        s.write_batch([GroupWrite(g, HardState(1, "n1", i), tuple(batch)) for g in "abc"])
        i += 10
        print(i, flush=True)
    """
)


def test_kill_9_restores_exactly_the_fsynced_batches(tmp_path: Path) -> None:
    """Every batch whose write_batch returned is back, and no batch is half there."""
    path = tmp_path / "crash"
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acked = 0
        assert proc.stdout is not None
        while acked < 300:
            acked = int(proc.stdout.readline())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    s = LmdbLogStorage(path, map_size_bytes=64 << 20)
    try:
        lasts = {s.log(g).last_index() for g in "abc"}
        assert len(lasts) == 1, "the three groups were written in one transaction"
        (last,) = lasts
        assert last >= acked and last % 10 == 0
        assert [e.index for e in s.log("a").entries(1, last + 1)] == list(range(1, last + 1))
        assert s.log("b").hard_state() == HardState(1, "n1", last - 10)
    finally:
        s.close()
