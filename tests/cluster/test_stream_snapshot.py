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
