"""The stream group snapshot (``cluster/stream_snapshot.py``) carries the dedup records.

JetStream's duplicate window outlives the messages: a retry of a msg id whose message was
removed (deleted, acked away, limited out) within ``duplicate_window`` is still answered as
a duplicate of the original sequence. A replica caught up by a snapshot must answer the
same, or a retry reaching it after a failover would store the message twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftstream.cluster.stream_snapshot import encode_snapshot, restore_store
from raftstream.engine.entries import DeleteMsg, Publish
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


def test_a_version_2_snapshot_still_restores_without_origins(env: Any) -> None:
    import json
    import struct

    source = Stream(CFG, LmdbStreamStore(env, "src"))
    source.apply(Publish(ts_ns=1 * SEC, subject="s.a", data=b"x"))
    data = encode_snapshot(CFG, source.store, [])
    magic, _, n = struct.unpack_from("<6sBI", data, 0)
    header = json.loads(data[11 : 11 + n])
    del header["origins"]
    raw = json.dumps(header, sort_keys=True).encode()
    old = struct.pack("<6sBI", magic, 2, len(raw)) + raw + data[11 + n :]
    restored = restore_store(old, LmdbStreamStore(env, "replica"))
    assert restored.origins == {} and restored.last_seq == 1
