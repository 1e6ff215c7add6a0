"""Deduplication records: the store's ``dedup_*`` contract and the stream's use of it.

JetStream keeps the msg id -> sequence mapping for the whole ``duplicate_window``, whatever
becomes of the message (NATS docs, "JetStream Model Deep Dive": message deduplication; the
server's ddmap is only trimmed by time). So a client that retries a publish after its first
copy was acked from a work queue, deleted, purged or dropped by a limit gets the original
sequence with ``duplicate=true`` and nothing is stored twice. Every test here runs on both
stores (``store_kit``); the LMDB-only ones pin checksums, drop and digest collisions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftstream.engine import lmdbdedup, lmdbreads
from raftstream.engine.entries import DeleteMsg, Expire, Publish, Purge
from raftstream.engine.lmdbrecords import DB_NAMES, ID, SEQ
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.store import (
    DEDUP_EXPIRE_RECORDS_MAX,
    DedupRecord,
    DiscardPolicy,
    StoreLimits,
    StreamStore,
    dedup_key,
)
from raftstream.engine.stream import PubAck, Stream
from raftstream.engine.stream_config import RetentionPolicy, StreamConfig
from raftstream.engine.subjects import subject_matches
from raftstream.errors import (
    DataLossError,
    ExpectedLastSeqError,
    InvalidArgumentError,
    LimitError,
)

from .conftest import StoreKit

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
WINDOW = 10 * SECOND
MAP_SIZE_BYTES = 64 * 1024 * 1024


def rec(msg_id: str, seq: int, ts_ns: int) -> DedupRecord:
    return DedupRecord(msg_id=msg_id, seq=seq, ts_ns=ts_ns)


def by_expiry(*records: DedupRecord) -> list[DedupRecord]:
    return sorted(records, key=lambda r: (r.ts_ns, dedup_key(r.msg_id)))


# -- the store contract ------------------------------------------------------------------------


def test_put_get_and_replace(store: StreamStore) -> None:
    """A record answers its id with (seq, ts); a later put of the id replaces it."""
    assert store.dedup_get("a") is None
    store.dedup_put("a", 1, 5)
    store.dedup_put("b", 2, 6)
    assert store.dedup_get("a") == rec("a", 1, 5)
    store.dedup_put("a", 3, 7)
    assert store.dedup_get("a") == rec("a", 3, 7)
    assert list(store.dedup_iter()) == [rec("b", 2, 6), rec("a", 3, 7)]


def test_records_outlive_their_messages(store_kit: StoreKit) -> None:
    """JetStream keeps msg ids through delete, purge, limits and age/TTL expiry: no
    message operation removes a dedup record."""
    store = store_kit.make(limits=StoreLimits(max_msgs=3, max_age_ns=100 * SECOND))
    for i in range(6):
        seq = store.append("a" if i % 2 else "b", b"x", now_ns=T0 + i, ttl_ns=SECOND * (i % 2))
        store.dedup_put(f"id{i}", seq, T0 + i)
    expected = list(store.dedup_iter())
    assert len(expected) == 6  # max_msgs dropped three messages; their records stay
    store.delete(5)
    store.purge(subject="a")
    store.purge(seq=6)
    store.expire(T0 + 1000 * SECOND)
    store.purge()
    assert store.state().msgs == 0
    assert list(store.dedup_iter()) == expected


def test_expire_removes_older_records_oldest_first_and_bounded(store: StreamStore) -> None:
    """dedup_expire(before) removes records with ts < before (strictly), in (ts, key)
    order, at most ``limit`` per call: the same calls remove the same records anywhere."""
    records = [rec(f"m{i}", i + 1, 10 + i // 2) for i in range(6)]  # two per timestamp
    for r in records:
        store.dedup_put(r.msg_id, r.seq, r.ts_ns)
    order = by_expiry(*records)
    assert list(store.dedup_iter()) == order
    assert store.dedup_expire(10) == 0  # nothing older than 10
    assert store.dedup_expire(12, limit=3) == 3
    assert list(store.dedup_iter()) == order[3:]
    assert store.dedup_expire(12) == 1  # the rest of ts 11; ts 12 is not older than 12
    assert store.dedup_expire(2**70) == 2  # any time bound is accepted
    assert store.dedup_expire(2**70) == 0 and list(store.dedup_iter()) == []


def test_expire_after_a_record_moved_back_in_time(store: StreamStore) -> None:
    """A replaced record expires by its new time only (its old time index entry is gone)."""
    store.dedup_put("a", 1, 50)
    store.dedup_put("a", 2, 20)
    store.dedup_put("b", 3, 30)
    assert store.dedup_expire(40) == 2
    assert store.dedup_get("a") is None and store.dedup_get("b") is None
    assert store.dedup_expire(60) == 0


def test_records_roll_back_with_their_transaction(store: StreamStore) -> None:
    """A publish and its record commit together: an aborted transaction leaves neither,
    and an expiry inside it is undone too."""
    store.dedup_put("old", 1, 1)
    with pytest.raises(RuntimeError), store.transaction():
        seq = store.append("a", b"x", now_ns=T0)
        store.dedup_put("new", seq, T0)
        store.dedup_put("old", seq, T0)
        assert store.dedup_expire(T0 + 1) == 2
        raise RuntimeError("abort")
    assert store.state().msgs == 0
    assert list(store.dedup_iter()) == [rec("old", 1, 1)]
    assert store.dedup_expire(2) == 1  # the store still expires correctly afterwards


@pytest.mark.parametrize(
    "args,field",
    [
        (("", 1, 1), "msg_id"),
        (("\udc80", 1, 1), "msg_id"),  # a lone surrogate: no UTF-8 spelling
        (("a", 0, 1), "seq"),
        (("a", 1, -1), "ts_ns"),
        (("a", 1, 2**63), "ts_ns"),
    ],
)
def test_put_refuses_what_no_record_can_hold(
    store: StreamStore, args: tuple[str, int, int], field: str
) -> None:
    """An empty or non-UTF-8 id, a sequence below 1 or a time outside 63 bits is refused
    before anything is written."""
    with pytest.raises(InvalidArgumentError) as info:
        store.dedup_put(*args)
    assert info.value.field == field
    assert list(store.dedup_iter()) == []


def test_long_and_unicode_ids(store: StreamStore) -> None:
    """Msg ids are any non-empty text: long ones (past LMDB's key size) and non-ASCII."""
    long_id = "x" * 10_000
    store.dedup_put(long_id, 1, 1)
    store.dedup_put("é✓ 空白", 2, 1)
    assert store.dedup_get(long_id) == rec(long_id, 1, 1)
    assert store.dedup_get("é✓ 空白") == rec("é✓ 空白", 2, 1)
    assert store.dedup_get("x" * 9_999) is None


def test_reopen_keeps_records(store_kit: StoreKit) -> None:
    """Durability: dedup records survive a restart and expire as before."""
    store = store_kit.make(name="keep")
    store.dedup_put("a", 1, 10)
    store.dedup_put("b", 2, 20)
    store = store_kit.reopen(store, "keep")
    assert list(store.dedup_iter()) == [rec("a", 1, 10), rec("b", 2, 20)]
    assert store.dedup_expire(15) == 1
    store = store_kit.reopen(store, "keep")
    assert list(store.dedup_iter()) == [rec("b", 2, 20)]


def test_iteration_crosses_read_chunks(store_kit: StoreKit) -> None:
    """dedup_iter is complete and ordered past its read chunk size."""
    store = store_kit.make()
    n = lmdbreads.DEDUP_ITER_CHUNK_RECORDS * 2 + 7
    with store.transaction():
        for i in range(n):
            store.dedup_put(f"id{i}", i + 1, i // 3)
    got = list(store.dedup_iter())
    assert got == by_expiry(*(rec(f"id{i}", i + 1, i // 3) for i in range(n)))


# -- LMDB: drop, isolation, checksums, digest collisions ---------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> Any:
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_SIZE_BYTES)
    yield env
    env.close()


def test_drop_removes_records_and_streams_are_apart(env: Any) -> None:
    """Records belong to their stream: one id in two streams is two records, a purge keeps
    them, dropping a stream removes its records and only its."""
    a = LmdbStreamStore(env, "A")
    b = LmdbStreamStore(env, "B")
    a.dedup_put("same", 1, 1)
    b.dedup_put("same", 9, 2)
    a.purge()
    assert a.dedup_get("same") == rec("same", 1, 1)
    a.drop()
    assert b.dedup_get("same") == rec("same", 9, 2)
    again = LmdbStreamStore(env, "A")  # the name is free: a new stream without records
    assert again.dedup_get("same") is None and list(again.dedup_iter()) == []


def _raw_keys(env: Any, db_name: bytes) -> list[bytes]:
    with env.begin() as txn:
        return [k for k, _ in txn.cursor(db=env.open_db(db_name))]


def _flip(env: Any, db_name: bytes, key: bytes, offset: int) -> None:
    db = env.open_db(db_name)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(key, db=db))
        value[offset % len(value)] ^= 0x01
        txn.put(key, bytes(value), db=db)


@pytest.mark.parametrize("offset", [0, 5, 12, 20, -1])
def test_corrupted_record_is_data_loss(env: Any, offset: int) -> None:
    """A flipped bit anywhere in a dedup record (checksum, seq, time, id) is DATA_LOSS on
    every path that reads it, never a wrong answer to a publish."""
    store = LmdbStreamStore(env, "S")
    store.dedup_put("victim", 1, 1)
    store.dedup_put("other", 2, 2)
    (key,) = [k for k in _raw_keys(env, DB_NAMES[5]) if k.endswith(dedup_key("victim"))]
    _flip(env, DB_NAMES[5], key, offset)
    with pytest.raises(DataLossError):
        store.dedup_get("victim")
    with pytest.raises(DataLossError):
        list(store.dedup_iter())
    with pytest.raises(DataLossError):
        store.dedup_expire(10)
    with pytest.raises(DataLossError):
        store.dedup_put("victim", 3, 3)
    assert store.dedup_get("other") == rec("other", 2, 2)


def test_corrupted_time_index_is_data_loss(env: Any) -> None:
    """The time index repeats its record's key and must agree with the record's time."""
    store = LmdbStreamStore(env, "S")
    store.dedup_put("a", 1, 1)
    (key,) = _raw_keys(env, DB_NAMES[6])
    _flip(env, DB_NAMES[6], key, 3)
    with pytest.raises(DataLossError):
        store.dedup_expire(10)
    db = env.open_db(DB_NAMES[6])
    with env.begin(write=True) as txn:  # a well-formed entry at the wrong time
        txn.delete(key, db=db)
        moved = key[: ID.size] + SEQ.pack(0) + key[ID.size + SEQ.size :]
        txn.put(moved, key[-16:], db=db)
    with pytest.raises(DataLossError):
        list(store.dedup_iter())


def test_record_under_another_ids_key_is_data_loss(env: Any) -> None:
    """A valid record copied under another id's key is refused: the id it holds must
    have the key's digest (the checksum covers the key too)."""
    store = LmdbStreamStore(env, "S")
    store.dedup_put("a", 1, 1)
    db = env.open_db(DB_NAMES[5])
    (key,) = _raw_keys(env, DB_NAMES[5])
    with env.begin(write=True) as txn:
        txn.put(key[: ID.size] + dedup_key("b"), txn.get(key, db=db), db=db)
    with pytest.raises(DataLossError):
        store.dedup_get("b")


def test_digest_collision_is_told_apart(env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ids with one digest: the record holds its id, so the other id reads as absent
    (never as a duplicate of a publish it is not); a put of it replaces the record."""

    def collide(msg_id: str) -> bytes:
        return b"\x00" * 16  # every id has this digest

    monkeypatch.setattr(lmdbdedup, "dedup_key", collide)
    monkeypatch.setattr("raftstream.engine.lmdbrecords.dedup_key", collide)
    store = LmdbStreamStore(env, "S")
    store.dedup_put("a", 1, 1)
    assert store.dedup_get("b") is None
    store.dedup_put("b", 2, 2)
    assert store.dedup_get("a") is None
    assert list(store.dedup_iter()) == [rec("b", 2, 2)]
    assert store.dedup_expire(3) == 1


# -- the stream: deduplication across removal, restarts and time ------------------------------


class Workers:
    """A plain model of the consumer engine's ``RetentionPolicyHook`` for one work queue
    consumer (``w``) or none: acked sequences are no longer needed."""

    def __init__(self, *, interest: str | None = ">") -> None:
        self.filter = interest
        self.acked: set[int] = set()

    def has_interest(self, subject: str) -> bool:
        return self.filter is not None and subject_matches(self.filter, subject)

    def is_needed(self, seq: int, subject: str) -> bool:
        return self.has_interest(subject) and seq not in self.acked


class Kit:
    def __init__(self, store_kit: StoreKit) -> None:
        self.store_kit = store_kit

    def stream(self, hook: Any = None, **config: Any) -> Stream:
        config = {"name": "S", "subjects": ("s.>",), "duplicate_window": WINDOW, **config}
        return Stream(StreamConfig(**config), self.store_kit.make(name="S"), retention=hook)

    def reopen(self, s: Stream, hook: Any = None) -> Stream:
        store = self.store_kit.reopen(s.store, "S")
        return Stream(s.config, store, retention=hook)


@pytest.fixture
def kit(store_kit: StoreKit) -> Kit:
    return Kit(store_kit)


def pub(s: Stream, msg_id: str | None = "X", t: int = T0, **kw: Any) -> Any:
    return s.apply(Publish(ts_ns=t, subject="s.a", data=b"x", msg_id=msg_id, **kw))


def test_retry_after_workqueue_ack_is_a_duplicate(kit: Kit) -> None:
    """The bug this pins: a client retries a publish (same msg id) after the consumer acked
    the first copy from a work queue. Within the window the retry is answered with the
    original sequence and duplicate=true and NOT stored again (no second delivery); after
    the window the id is free and the publish is stored anew."""
    hook = Workers()
    s = kit.stream(hook, retention=RetentionPolicy.WORKQUEUE)
    assert pub(s) == PubAck(stream="S", seq=1)
    hook.acked.add(1)
    assert s.release(1)
    assert s.store.state().msgs == 0
    assert pub(s, t=T0 + WINDOW - 1) == PubAck(stream="S", seq=1, duplicate=True)
    assert s.store.state().msgs == 0 and s.store.state().last_seq == 1
    assert pub(s, t=T0 + WINDOW) == PubAck(stream="S", seq=2)
    assert [m.seq for m in s.store.iter_from(1)] == [2]


def test_retry_after_delete_is_a_duplicate(kit: Kit) -> None:
    """STREAM.MSG.DELETE removes the message, not its msg id."""
    s = kit.stream()
    pub(s)
    s.apply(DeleteMsg(ts_ns=T0 + SECOND, seq=1))
    assert pub(s, t=T0 + WINDOW - 1) == PubAck(stream="S", seq=1, duplicate=True)
    assert pub(s, t=T0 + WINDOW) == PubAck(stream="S", seq=2)


@pytest.mark.parametrize("purge", [Purge(ts_ns=T0), Purge(ts_ns=T0, subject="s.a")])
def test_retry_after_purge_is_a_duplicate(kit: Kit, purge: Purge) -> None:
    """STREAM.PURGE (all or by subject) removes the messages, not their msg ids."""
    s = kit.stream()
    pub(s)
    assert s.apply(purge).purged == 1
    assert pub(s, t=T0 + WINDOW - 1) == PubAck(stream="S", seq=1, duplicate=True)
    assert pub(s, t=T0 + WINDOW) == PubAck(stream="S", seq=2)


def test_retry_after_limit_dropped_the_message_is_a_duplicate(kit: Kit) -> None:
    """max_msgs (discard old) drops the oldest message; its msg id still deduplicates."""
    s = kit.stream(max_msgs=1)
    pub(s, "X")
    pub(s, "Y")
    assert [m.seq for m in s.store.iter_from(1)] == [2]
    assert pub(s, "X", t=T0 + SECOND) == PubAck(stream="S", seq=1, duplicate=True)


def test_records_survive_a_restart_after_removal(kit: Kit) -> None:
    """No rebuild from stored messages: a restarted replica deduplicates an id whose
    message is gone exactly as one that kept running."""
    s = kit.stream()
    pub(s)
    s.apply(DeleteMsg(ts_ns=T0, seq=1))
    s = kit.reopen(s)
    assert s.dedup_ids == 1
    assert pub(s, t=T0 + SECOND) == PubAck(stream="S", seq=1, duplicate=True)


def test_skipped_interest_publish_records_its_id(kit: Kit) -> None:
    """Interest retention without interest: the sequence is used and nothing stored, but
    JetStream still records the msg id, so a retry gets the same sequence."""
    s = kit.stream(Workers(interest=None), retention=RetentionPolicy.INTEREST)
    assert pub(s) == PubAck(stream="S", seq=1)
    assert pub(s, t=T0 + SECOND) == PubAck(stream="S", seq=1, duplicate=True)
    assert s.store.state().last_seq == 1


def test_refused_publish_records_nothing(kit: Kit) -> None:
    """A refused publish (a failed precondition, a full stream with discard new) leaves no
    record: its retry, once it can succeed, is stored."""
    s = kit.stream(max_msgs=1, discard=DiscardPolicy.NEW)
    with pytest.raises(ExpectedLastSeqError):
        pub(s, expected_last_seq=5)
    assert pub(s, expected_last_seq=0) == PubAck(stream="S", seq=1)
    with pytest.raises(LimitError):
        pub(s, "Y")
    assert s.store.dedup_get("Y") is None
    s.apply(DeleteMsg(ts_ns=T0, seq=1))
    assert pub(s, "Y") == PubAck(stream="S", seq=2)


def test_records_expire_by_entry_time(kit: Kit) -> None:
    """Any entry expires the records its (leader-stamped) time puts past the window; a
    record's age is measured from the entry that recorded it, not from any clock."""
    s = kit.stream()
    pub(s, "A")
    pub(s, "B", t=T0 + 5 * SECOND)
    s.apply(Expire(ts_ns=T0 + WINDOW - 1))
    assert [r.msg_id for r in s.store.dedup_iter()] == ["A", "B"]
    s.apply(Expire(ts_ns=T0 + WINDOW))
    assert [r.msg_id for r in s.store.dedup_iter()] == ["B"]
    s.apply(DeleteMsg(ts_ns=T0 + WINDOW + 5 * SECOND, seq=2))
    assert s.dedup_ids == 0


def test_expiry_per_entry_is_bounded(kit: Kit) -> None:
    """One entry expires at most DEDUP_EXPIRE_RECORDS_MAX records, so a backlog after a
    quiet spell is spread over the following entries (identically on every replica)."""
    s = kit.stream()
    n = DEDUP_EXPIRE_RECORDS_MAX + 10
    with s.store.transaction():
        for i in range(n):
            pub(s, f"id{i}")
    assert s.dedup_ids == n
    s.apply(Expire(ts_ns=T0 + WINDOW))
    assert s.dedup_ids == 10
    s.apply(Expire(ts_ns=T0 + WINDOW))
    assert s.dedup_ids == 0


def test_corrupted_record_fails_the_publish(env: Any) -> None:
    """A publish that would read a corrupted dedup record is DATA_LOSS, not a guess."""
    s = Stream(StreamConfig(name="S", subjects=("s.>",)), LmdbStreamStore(env, "S"))
    pub(s)
    (key,) = _raw_keys(env, DB_NAMES[5])
    _flip(env, DB_NAMES[5], key, 9)
    with pytest.raises(DataLossError):
        pub(s, t=T0 + SECOND)
