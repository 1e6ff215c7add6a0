"""The stream group snapshot (``cluster/stream/snapshot.py``) carries the dedup records.

JetStream's duplicate window outlives the messages: a retry of a msg id whose message was
removed (deleted, acked away, limited out) within ``duplicate_window`` is still answered as
a duplicate of the original sequence. A replica caught up by a snapshot must answer the
same, or a retry reaching it after a failover would store the message twice.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from raftstream.cluster.stream.snapshot import (
    RESTORE_STAGE_BYTES,
    SnapshotWriter,
    encode_snapshot,
    restore_store,
)
from raftstream.engine.entries import DeleteMsg, Publish
from raftstream.engine.lmdbrecords import MSG_KEY, open_dbs
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.stream import PubAck, Stream
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError

SEC = 1_000_000_000
CFG = StreamConfig(name="S", subjects=("s.>",), duplicate_window=60 * SEC)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Any]:
    e = open_node_env(tmp_path / "store", sync=False)
    yield e
    e.close()


def test_a_replica_restored_from_a_snapshot_deduplicates_a_removed_messages_retry(
    env: Any,
) -> None:
    source = Stream(CFG, LmdbStreamStore(env, "src"))
    first = source.apply(Publish(ts_ns=1 * SEC, subject="s.a", data=b"x", msg_id="id-1"))
    source.apply(Publish(ts_ns=2 * SEC, subject="s.a", data=b"y", msg_id="id-2"))
    assert isinstance(first, PubAck)
    source.apply(DeleteMsg(ts_ns=3 * SEC, seq=first.seq))  # the message is gone, its id not
    data = encode_snapshot(CFG, source.store, [])

    store = LmdbStreamStore(env, "replica")
    header = restore_store(data, store)
    replica = Stream(header.config, store)
    assert store.dedup_get("id-1") is not None
    retry = replica.apply(Publish(ts_ns=4 * SEC, subject="s.a", data=b"x", msg_id="id-1"))
    assert isinstance(retry, PubAck)
    assert retry.duplicate and retry.seq == first.seq
    assert store.state().msgs == 1  # nothing stored for the retry
    fresh = replica.apply(Publish(ts_ns=5 * SEC, subject="s.a", data=b"z", msg_id="id-3"))
    assert isinstance(fresh, PubAck) and not fresh.duplicate and fresh.seq == 3


def test_a_truncated_dedup_section_is_data_loss(env: Any) -> None:
    source = Stream(CFG, LmdbStreamStore(env, "src"))
    source.apply(Publish(ts_ns=1 * SEC, subject="s.a", data=b"x", msg_id="a-long-msg-id"))
    data = encode_snapshot(CFG, source.store, [])
    cut = data.index(b"a-long-msg-id") + 4
    with pytest.raises(DataLossError):
        restore_store(data[:cut], LmdbStreamStore(env, "replica"))


def test_a_snapshot_carries_the_origin_positions_of_a_mirror(env: Any) -> None:
    """Issue 7: the replicated origin position is in the snapshot (version 3), so a replica
    caught up by one resumes copying after it, not from the start."""
    from raftstream.engine.entries import Copy
    from raftstream.engine.stream_source import StreamSource

    cfg = StreamConfig(name="M", mirror=StreamSource(name="O"))
    source = Stream(cfg, LmdbStreamStore(env, "src"))
    for seq, prev in ((3, 0), (4, 3), (9, 4)):
        source.apply(
            Copy(
                ts_ns=seq,
                origin="O",
                origin_seq=seq,
                prev_origin_seq=prev,
                subject="a",
                skipped=(1, 2) if seq == 3 else None,
            )
        )
    data = encode_snapshot(cfg, source.store, [], source.origins)
    store = LmdbStreamStore(env, "replica")
    header = restore_store(data, store)
    assert header.origins == source.origins
    assert store.state().last_seq == 9 and store.state().msgs == 3
    replica = Stream(header.config, store)
    replica.restore_origins(header.origins)
    dup = replica.apply(Copy(ts_ns=10, origin="O", origin_seq=9, prev_origin_seq=4, subject="a"))
    assert getattr(dup, "duplicate", False)


def _old_snapshot(version: int, source: Stream) -> bytes:
    """The snapshot ``source`` would have had from a release writing ``version`` (2: no
    origins, 2 and 3: messages encoded field by field, no store id)."""
    data = encode_snapshot(source.config, source.store, [], source.origins)
    _, _, n = struct.unpack_from("<6sBI", data, 0)
    header = json.loads(data[11 : 11 + n])
    del header["store_id"]
    if version == 2:
        del header["origins"]
    raw = json.dumps(header, sort_keys=True).encode()
    parts = [struct.pack("<6sBI", b"RSSTRM", version, len(raw)), raw, struct.pack("<I", 0)]
    for m in source.store.iter_from(1):
        subject = m.subject.encode()
        headers = json.dumps(dict(m.headers), sort_keys=True).encode() if m.headers else b""
        parts += [struct.pack("<Qqq", m.seq, m.ts, m.ttl_ns)]
        for chunk in (subject, headers, m.data):
            parts += [struct.pack("<I", len(chunk)), chunk]
    return b"".join(parts)


def _filled(env: Any) -> Stream:
    """A source stream with a gap, headers and a TTL: what a snapshot must carry exactly."""
    source = Stream(
        StreamConfig(name="S", subjects=("s.>",), allow_msg_ttl=True), LmdbStreamStore(env, "src")
    )
    source.apply(Publish(ts_ns=1 * SEC, subject="s.a", data=b"x"))
    source.apply(Publish(ts_ns=2 * SEC, subject="s.b", data=b"y", headers={"k": "v"}))
    source.apply(Publish(ts_ns=3 * SEC, subject="s.a", data=b"third", ttl_ns=60 * SEC))
    source.apply(Publish(ts_ns=4 * SEC, subject="s.c", data=b""))
    source.apply(DeleteMsg(ts_ns=5 * SEC, seq=2))
    return source


def _contents(store: LmdbStreamStore) -> list[tuple[Any, ...]]:
    return [(m.seq, m.subject, m.data, m.ts, dict(m.headers), m.ttl_ns) for m in store.iter_from(1)]


# A message per transaction, or all in one (the default stage holds them all).
STAGES = pytest.mark.parametrize("stage_bytes", [1, RESTORE_STAGE_BYTES], ids=["1B", "4MiB"])


@STAGES
@pytest.mark.parametrize("version", [2, 3])
def test_an_older_releases_snapshot_still_restores(
    env: Any, version: int, stage_bytes: int
) -> None:
    source = _filled(env)
    store = LmdbStreamStore(env, "replica")
    restored = restore_store(_old_snapshot(version, source), store, stage_bytes=stage_bytes)
    assert restored.origins == {} and restored.last_seq == 4
    assert _contents(store) == _contents(source.store)
    assert store.state() == source.store.state()


@STAGES
def test_a_snapshot_restores_every_message_exactly_under_the_replicas_own_id(
    env: Any, stage_bytes: int
) -> None:
    LmdbStreamStore(env, "other")  # the replica's store gets another id than the source's
    source = _filled(env)
    source.apply(DeleteMsg(ts_ns=6 * SEC, seq=4))  # the last sequence, not its message
    data = encode_snapshot(source.config, source.store, [])
    store = LmdbStreamStore(env, "replica")
    assert store.store_id != source.store.store_id
    restore_store(data, store, stage_bytes=stage_bytes)
    assert _contents(store) == _contents(source.store)
    # last_ts: the module docstring's known gap (the newest message was removed).
    assert replace(store.state(), last_ts=0) == replace(source.store.state(), last_ts=0)
    assert store.load(3).ttl_ns == 60 * SEC


_HEAP_PROBE = textwrap.dedent(
    """
    import gc, os, sys
    from raftstream.cluster.node import heap
    from raftstream.cluster.stream.snapshot import encode_snapshot, restore_store
    from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
    from raftstream.engine.stream_config import StreamConfig
    from raftstream.tooling.procfs import status_kib

    source = open_node_env(sys.argv[1] + "/source", sync=False)
    store = LmdbStreamStore(source, "S")
    for _ in range(20):
        with store.transaction():
            for n in range(2000):
                store.append(f"s.{n % 10}", os.urandom(512), now_ns=1)
    data = encode_snapshot(StreamConfig(name="S", subjects=("s.>",)), store, [])
    source.close()
    replica = open_node_env(sys.argv[1] + "/replica", sync=False)
    with LmdbStreamStore(replica, "W").transaction():
        pass
    gc.collect()
    heap.release()  # as the node does every HEAP_RELEASE_EVERY_S
    before = status_kib(os.getpid(), "RssAnon")["RssAnon"]
    restored = LmdbStreamStore(replica, "S")
    restore_store(data, restored, stage_bytes=int(sys.argv[2]))
    assert restored.state().msgs == 40_000
    gc.collect()
    heap.release()
    print(status_kib(os.getpid(), "RssAnon")["RssAnon"] - before)
    """
)


def test_restoring_a_snapshot_leaves_the_heap_as_it_was(tmp_path: Path) -> None:
    """LMDB keeps the pages a write transaction dirtied, for later ones: restored in one
    transaction, the snapshot of 40,000 messages of 512 bytes (20 MB) left the heap 31 MiB
    bigger for good, after glibc's ``malloc_trim``; in stages of 4 MiB, 7 (about a stage's
    pages, and small objects). (glibc's malloc is also told not to keep freed buffers
    itself, which it otherwise may, for the next.)"""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    grown_kib = int(
        subprocess.run(
            [sys.executable, "-c", _HEAP_PROBE, str(tmp_path), str(RESTORE_STAGE_BYTES)],
            env=env, capture_output=True, text=True, check=True, timeout=120,
        ).stdout
    )  # fmt: skip
    assert grown_kib < 12 << 10, f"the heap grew by {grown_kib} KiB"


_SNAPSHOT_PROBE = textwrap.dedent(
    """
    import gc, os, sys
    from raftstream.cluster.stream.snapshot import SnapshotWriter
    from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
    from raftstream.engine.stream_config import StreamConfig
    from raftstream.tooling.procfs import status_kib

    store = LmdbStreamStore(open_node_env(sys.argv[1], sync=False), "S")
    for _ in range(50):
        with store.transaction():
            for n in range(2000):
                store.append(f"s.{n % 10}", b"x" * 128, now_ns=1)
    gc.collect()
    before = status_kib(os.getpid(), "RssAnon")["RssAnon"]
    kept = []
    writer = SnapshotWriter(StreamConfig(name="S", subjects=("s.>",)), store, [])
    while (data := writer.step()) is None:
        # What the node makes between two steps and keeps: ~3.5 MiB in all.
        kept += [os.urandom(30 + (i * 37) % 270) for i in range(300)]
    del data, writer
    gc.collect()
    print(status_kib(os.getpid(), "RssAnon")["RssAnon"] - before)
    """
)


def test_making_a_snapshot_leaves_no_more_memory_resident_than_it_keeps(tmp_path: Path) -> None:
    """A stream's records kept as two small objects each until the end of the snapshot
    (100,000 messages of 128 bytes) left 27 MiB more resident, 3.5 of them what the probe
    keeps: the objects made between the steps held the freed objects' pools. Joined at each
    step, 3 MiB."""
    grown_kib = int(
        subprocess.run(
            [sys.executable, "-c", _SNAPSHOT_PROBE, str(tmp_path)],
            capture_output=True, text=True, check=True, timeout=120,
        ).stdout
    )  # fmt: skip
    assert grown_kib < 8 << 10, f"resident memory grew by {grown_kib} KiB"


def test_a_flipped_bit_in_a_snapshots_message_is_data_loss(env: Any) -> None:
    source = _filled(env)
    data = bytearray(encode_snapshot(source.config, source.store, []))
    at = data.rindex(b"third")  # the third message's payload
    data[at] ^= 0x01
    with pytest.raises(DataLossError, match="checksum"):
        restore_store(bytes(data), LmdbStreamStore(env, "replica"))


def test_a_corrupt_stored_message_fails_the_snapshot_not_the_restore(env: Any) -> None:
    """The records are copied without decoding, but each is verified: a store whose record
    went bad fails the compaction (the log keeps the entries) instead of writing a snapshot
    that no replica can restore."""
    source = _filled(env)
    key = MSG_KEY.pack(source.store.store_id, 3)
    dbs = open_dbs(env)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(key, db=dbs.msgs))
        value[-1] ^= 0x01
        txn.put(key, bytes(value), db=dbs.msgs)
    with pytest.raises(DataLossError, match="message record"):
        encode_snapshot(source.config, source.store, [])


def test_a_snapshot_made_in_steps_is_the_state_when_it_started(env: Any) -> None:
    """The Raft host makes a stream's snapshot in steps between applies: what applies in
    between (new messages, removals, dedup records) is not in it, and nothing is lost."""
    cfg = StreamConfig(name="S", subjects=("s.>",), duplicate_window=60 * SEC)
    source = Stream(cfg, LmdbStreamStore(env, "src"))
    for i in range(50):
        source.apply(
            Publish(ts_ns=(i + 1) * SEC, subject=f"s.{i % 3}", data=b"m%d" % i, msg_id=f"id{i}")
        )
    before = _contents(source.store)
    state = source.store.state()
    writer = SnapshotWriter(cfg, source.store, [], source.origins)
    steps = 0
    while (data := writer.step(7)) is None:
        steps += 1
        source.apply(
            Publish(ts_ns=(100 + steps) * SEC, subject="s.0", data=b"new", msg_id=f"n{steps}")
        )
        source.apply(DeleteMsg(ts_ns=(100 + steps) * SEC, seq=steps))
    assert steps > 10  # 50 dedup records and 50 messages, 7 a step
    store = LmdbStreamStore(env, "replica")
    restore_store(data, store)
    assert _contents(store) == before and store.state() == state
    assert store.dedup_get("id49") is not None and store.dedup_get("n1") is None


def test_a_group_not_all_upgraded_gets_the_version_3_snapshot_an_older_node_reads(
    env: Any,
) -> None:
    """A rolling upgrade: a leader sends its own snapshot to a replica that fell behind, so
    while one replica does not describe ``snapshot_records`` (cluster/meta/descriptions.py) the
    snapshots are made in version 3, byte for byte what the older release wrote."""
    source = _filled(env)
    old = encode_snapshot(source.config, source.store, [], source.origins, records=False)
    assert old == _old_snapshot(3, source)
    steps = SnapshotWriter(source.config, source.store, [], source.origins, records=False)
    try:
        while (stepped := steps.step(1)) is None:
            pass
    finally:
        steps.close()
    assert stepped == old
    store = LmdbStreamStore(env, "replica")
    restore_store(old, store)
    assert _contents(store) == _contents(source.store)
