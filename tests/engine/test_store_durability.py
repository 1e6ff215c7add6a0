"""Durability of the LMDB stream store: what was committed survives a restart, and stored
bytes that changed behind the store's back are reported as DATA_LOSS, never returned.

Pins the issue's "write, close the environment, reopen, everything is there; a corrupted
record is detected", and JetStream's file-storage promise that a restarted server has the
stream as it was (state, messages, subjects, limits) and keeps numbering where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftstream.engine.lmdbrecords import (
    DB_NAMES,
    MSG_KEY,
    SEQ,
    decode_id,
    encode_chunk,
    subject_key,
)
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.store import DiscardPolicy, StoreLimits
from raftstream.errors import DataLossError, LimitError

SEC_NS = 1_000_000_000
MAP_SIZE_BYTES = 64 * 1024 * 1024
MARKER = b"raftstream-durability-marker-0123456789"


def _stream_id(env: Any, name: str) -> int:
    key = b"N" + name.encode()
    with env.begin() as txn:
        return decode_id(key, txn.get(key, db=env.open_db(DB_NAMES[4])))


def _flip(env: Any, db_name: bytes, key: bytes, offset: int) -> None:
    """Flip one bit of a stored value with a raw LMDB write, as a bad disk would."""
    db = env.open_db(db_name)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(key, db=db))
        value[offset % len(value)] ^= 0x01
        txn.put(key, bytes(value), db=db)


def _fill(store: LmdbStreamStore) -> None:
    for i in range(30):
        subject = f"orders.{i % 3}"
        headers = {"Nats-Msg-Id": f"id-{i}"} if i % 2 else {}
        store.append(subject, f"payload-{i}".encode(), headers=headers, now_ns=(i + 1) * SEC_NS)
    store.delete(5)
    store.purge(subject="orders.2", keep=4)


def test_reopen_restores_every_stream(tmp_path: Path) -> None:
    """A restart finds each stream of the node as it was, and numbering continues."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    limits = StoreLimits(max_msgs=100, discard=DiscardPolicy.NEW, max_age_ns=3600 * SEC_NS)
    a = LmdbStreamStore(env, "A", limits=limits)
    b = LmdbStreamStore(env, "B")
    _fill(a)
    with b.transaction():
        for i in range(10):
            b.append("b", bytes([i]) * 100, now_ns=SEC_NS, ttl_ns=60 * SEC_NS)
    before_a = (a.state(subjects_filter=">"), list(a.iter_from(1)))
    before_b = (b.state(subjects_filter=">"), list(b.iter_from(1)))
    env.close()

    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    a = LmdbStreamStore(env, "A")
    b = LmdbStreamStore(env, "B")
    assert (a.state(subjects_filter=">"), list(a.iter_from(1))) == before_a
    assert (b.state(subjects_filter=">"), list(b.iter_from(1))) == before_b
    assert a.limits == limits
    assert a.load_last("orders.1").data == b"payload-28"
    assert a.append("orders.0", b"next", now_ns=40 * SEC_NS) == 31
    assert b.expire(61 * SEC_NS) == 10  # TTL deadlines survived the restart too
    env.close()


def test_aborted_transaction_is_not_there_after_reopen(tmp_path: Path) -> None:
    """Only committed transactions are durable: an aborted one leaves nothing behind."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    store.append("a", b"kept", now_ns=SEC_NS)
    with pytest.raises(RuntimeError), store.transaction():
        store.append("a", b"lost", now_ns=SEC_NS)
        raise RuntimeError("crash before commit")
    env.close()
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    assert [m.data for m in store.iter_from(1)] == [b"kept"]
    env.close()


@pytest.mark.parametrize("offset", [0, 5, 13, 40, -1])
def test_flipped_bit_in_a_message_is_data_loss(tmp_path: Path, offset: int) -> None:
    """A flipped bit anywhere in a message record (checksum, head, subject, headers,
    payload) is DATA_LOSS on every read path, never a different message."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    store.append("a.b", b"x" * 32, headers={"k": "v"}, now_ns=SEC_NS)
    seq = store.append("a.b", b"y" * 32, headers={"k": "v"}, now_ns=SEC_NS)
    _flip(env, DB_NAMES[0], MSG_KEY.pack(_stream_id(env, "S"), seq), offset)
    with pytest.raises(DataLossError):
        store.load(seq)
    with pytest.raises(DataLossError):
        store.load_last("a.b")
    with pytest.raises(DataLossError):
        list(store.iter_from(1))
    with pytest.raises(DataLossError):
        store.delete(seq)
    assert store.load(1).data == b"x" * 32  # the intact record still reads
    env.close()


def test_record_moved_to_another_key_is_data_loss(tmp_path: Path) -> None:
    """The checksum covers the key: a valid record under the wrong sequence is refused."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    store.append("a", b"one", now_ns=SEC_NS)
    store.append("a", b"two", now_ns=SEC_NS)
    sid = _stream_id(env, "S")
    db = env.open_db(DB_NAMES[0])
    with env.begin(write=True) as txn:
        txn.put(MSG_KEY.pack(sid, 2), txn.get(MSG_KEY.pack(sid, 1), db=db), db=db)
    with pytest.raises(DataLossError):
        store.load(2)
    env.close()


def test_corrupt_index_chunk_is_data_loss(tmp_path: Path) -> None:
    """A flipped bit in the subject index fails last_by_subject instead of a wrong answer."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    for _ in range(3):
        store.append("orders", b"x", now_ns=SEC_NS)
    sid = _stream_id(env, "S")
    ikey = MSG_KEY.pack(sid, 0)[:4] + subject_key("orders")[1] + SEQ.pack(1)
    _flip(env, DB_NAMES[1], ikey, 9)
    with pytest.raises(DataLossError):
        store.load_last("orders")
    env.close()


def test_index_pointing_at_another_subject_is_data_loss(tmp_path: Path) -> None:
    """A subject index chunk that checks out (valid checksum) but points at a message of
    another subject is DATA_LOSS where the index is followed (a consumer's scan of a
    literal filter, last and next by subject), never the other subject's message."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    store.append("orders", b"o", now_ns=SEC_NS)
    store.append("other", b"x", now_ns=SEC_NS)
    ikey = MSG_KEY.pack(_stream_id(env, "S"), 0)[:4] + subject_key("orders")[1] + SEQ.pack(1)
    db = env.open_db(DB_NAMES[1])  # before the write transaction: it would open its own
    with env.begin(write=True) as txn:
        txn.put(ikey, encode_chunk(ikey, [1, 2]), db=db)
    env.close()
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    with pytest.raises(DataLossError):
        list(store.iter_from(1, "orders"))
    with pytest.raises(DataLossError):
        store.load_last("orders")
    with pytest.raises(DataLossError):
        store.load_next("orders", 2)
    assert store.load_next("orders", 1).data == b"o"  # the entry that is right still reads
    env.close()


def test_corrupt_meta_is_data_loss_on_open(tmp_path: Path) -> None:
    """The stream's meta record is checked when the stream opens."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    LmdbStreamStore(env, "S").append("a", b"x", now_ns=SEC_NS)
    _flip(env, DB_NAMES[4], b"M" + MSG_KEY.pack(_stream_id(env, "S"), 0)[:4], 10)
    with pytest.raises(DataLossError):
        LmdbStreamStore(env, "S")
    env.close()


def test_corruption_in_the_data_file_is_data_loss(tmp_path: Path) -> None:
    """A bit flipped in data.mdb itself (outside LMDB) is caught when the record is read."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    seq = store.append("a", MARKER, now_ns=SEC_NS)
    env.close()
    data_file = tmp_path / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    at = raw.find(MARKER)
    assert at >= 0 and raw.find(MARKER, at + 1) < 0  # exactly one copy on disk
    raw[at + 7] ^= 0x10
    data_file.write_bytes(bytes(raw))
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    store = LmdbStreamStore(env, "S")
    with pytest.raises(DataLossError):
        store.load(seq)
    env.close()


def test_streams_share_an_environment_without_touching_each_other(tmp_path: Path) -> None:
    """One environment per node, many streams: purging or dropping one leaves the others."""
    env = open_node_env(tmp_path, map_size_bytes=MAP_SIZE_BYTES)
    a = LmdbStreamStore(env, "A")
    b = LmdbStreamStore(env, "B")
    for i in range(5):
        a.append("same.subject", b"a", now_ns=SEC_NS)
        b.append("same.subject", bytes([i]), now_ns=SEC_NS)
    a.purge()
    assert b.state().msgs == 5
    assert b.load_last("same.subject").data == bytes([4])
    b.drop()
    c = LmdbStreamStore(env, "B")  # the name is free again: a new, empty stream
    assert c.state().msgs == 0 and c.state().last_seq == 0
    assert a.append("same.subject", b"a", now_ns=SEC_NS) == 6
    env.close()


def test_full_environment_refuses_and_keeps_what_was_there(tmp_path: Path) -> None:
    """A node out of storage refuses the write (a limit), and the stream stays usable."""
    env = open_node_env(tmp_path, map_size_bytes=1024 * 1024)
    store = LmdbStreamStore(env, "S")
    store.append("a", b"kept", now_ns=SEC_NS)
    with pytest.raises(LimitError), store.transaction():
        for _ in range(2000):
            store.append("a", b"z" * 1000, now_ns=SEC_NS)
    assert store.state().msgs == 1
    assert store.append("a", b"after", now_ns=SEC_NS) == 2
    env.close()
