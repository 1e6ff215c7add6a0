"""The StreamStore contract, run on both stores (memory and LMDB) by the ``store_kit`` fixture.

Each test names the JetStream behaviour it pins (NATS docs: "Streams" — limits, discard
policy, purge; the JetStream API reference for STREAM.PURGE, STREAM.MSG.GET/DELETE).
"""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.engine.store import DiscardPolicy, StoreLimits, StreamStore
from raftstream.errors import InvalidArgumentError, LimitError, NotFoundError

from .conftest import StoreKit

SEC_NS = 1_000_000_000


def fill(store: StreamStore, subjects: list[str], *, now_ns: int = SEC_NS) -> list[int]:
    return [store.append(s, f"m{i}".encode(), now_ns=now_ns) for i, s in enumerate(subjects)]


# -- append, load, sequences --------------------------------------------------------------


def test_append_assigns_consecutive_sequences_from_one(store: StreamStore) -> None:
    """JetStream: a stream's first message gets sequence 1, each publish the next one."""
    assert fill(store, ["a", "b", "a"]) == [1, 2, 3]
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.num_subjects) == (1, 3, 3, 2)


def test_empty_stream_state_is_all_zero(store: StreamStore) -> None:
    """JetStream: a new stream reports first_seq = last_seq = 0 and no messages."""
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.bytes, st.num_deleted) == (0, 0, 0, 0, 0)


def test_load_returns_what_was_stored(store: StreamStore) -> None:
    """STREAM.MSG.GET by sequence returns subject, headers, payload and timestamp."""
    seq = store.append("orders.new", b"payload", headers={"k": "v"}, now_ns=7 * SEC_NS)
    msg = store.load(seq)
    assert (msg.seq, msg.subject, msg.data, msg.ts) == (seq, "orders.new", b"payload", 7 * SEC_NS)
    assert dict(msg.headers) == {"k": "v"}
    assert store.state().bytes == msg.size == len("orders.new") + 2 + len(b"payload")


def test_load_missing_sequence_is_not_found(store: StreamStore) -> None:
    """STREAM.MSG.GET of a sequence never stored answers 'no message found'."""
    fill(store, ["a"])
    with pytest.raises(NotFoundError):
        store.load(2)
    with pytest.raises(NotFoundError):
        store.load(0)


def test_append_rejects_wildcard_subject(store: StreamStore) -> None:
    """Subjects published to a stream are literal: wildcards are refused."""
    with pytest.raises(InvalidArgumentError):
        store.append("a.*", b"", now_ns=SEC_NS)
    assert store.state().msgs == 0


def test_skip_moves_next_sequence(store: StreamStore) -> None:
    """Stream first_seq / mirror skips: the next message takes the given sequence."""
    store.skip(10)
    st = store.state()
    assert (st.first_seq, st.last_seq) == (10, 9)
    assert store.append("a", b"", now_ns=SEC_NS) == 10
    with pytest.raises(InvalidArgumentError):
        store.skip(5)


# -- subject lookups ------------------------------------------------------------------------


def test_load_last_by_literal_and_wildcard(store: StreamStore) -> None:
    """STREAM.MSG.GET last_by_subj: the newest message on a subject (wildcards allowed)."""
    fill(store, ["a.1", "a.2", "b.1", "a.1"])
    assert store.load_last("a.1").seq == 4
    assert store.load_last("a.*").seq == 4
    assert store.load_last("b.>").seq == 3
    assert store.load_last(">").seq == 4
    with pytest.raises(NotFoundError):
        store.load_last("c")


def test_load_last_after_deleting_newest_falls_back(store: StreamStore) -> None:
    """last_by_subj after the newest is deleted returns the previous one on that subject."""
    fill(store, ["a", "b", "a", "b"])
    assert store.delete(3)
    assert store.load_last("a").seq == 1
    assert store.delete(1)
    with pytest.raises(NotFoundError):
        store.load_last("a")


def test_load_next_with_filter_and_start(store: StreamStore) -> None:
    """STREAM.MSG.GET next_by_subj: first message at or after seq matching the filter."""
    fill(store, ["a.x", "b.x", "a.y", "b.y", "a.x"])
    nxt = store.load_next("a.*", 2)
    assert nxt is not None and nxt.seq == 3
    nxt = store.load_next("a.x", 2)
    assert nxt is not None and nxt.seq == 5
    nxt = store.load_next(">", 0)
    assert nxt is not None and nxt.seq == 1
    assert store.load_next("c", 1) is None
    assert store.load_next(">", 6) is None


def test_iter_from_and_num_pending(store: StreamStore) -> None:
    """Consumer num_pending: messages at or after a sequence matching the filter."""
    fill(store, ["a", "b", "a", "c.d", "a"])
    assert [m.seq for m in store.iter_from(2, "a")] == [3, 5]
    assert [m.seq for m in store.iter_from(1)] == [1, 2, 3, 4, 5]
    assert [m.seq for m in store.iter_from(4, "c.>")] == [4]
    assert store.num_pending(1) == 5
    assert store.num_pending(3, "a") == 2
    assert store.num_pending(2, "*") == 3
    assert store.num_pending(6) == 0


def test_iter_from_across_read_chunks(store: StreamStore) -> None:
    """iter_from reads in growing chunks (LMDB: 16, 64, 256, 256, ... records per read
    transaction): every message once, in order, for a literal subject, every subject and a
    wildcard, from any start."""
    subjects = ["a" if i % 3 else "b.x" for i in range(700)]
    fill(store, subjects)
    for start in (1, 2, 15, 17, 81, 400):
        assert [m.seq for m in store.iter_from(start)] == list(range(start, 701))
        want_a = [i + 1 for i in range(start - 1, 700) if subjects[i] == "a"]
        assert [m.seq for m in store.iter_from(start, "a")] == want_a
        want_b = [i + 1 for i in range(start - 1, 700) if subjects[i] == "b.x"]
        assert [m.seq for m in store.iter_from(start, "b.*")] == want_b
        assert [m.seq for m in store.iter_from(start, "a", expect=1)] == want_a


def test_lmdb_iter_from_reads_little_for_a_few(
    lmdb_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller that takes one message from iter_from (a consumer's fetch(1)) gets it from
    a first read of ITER_FIRST_CHUNK_MSGS records, not ITER_CHUNK_MSGS; one that says how
    many it expects (a pull's batch) reads that many first."""
    from raftstream.engine import lmdbreads
    from raftstream.engine.lmdbstore import LmdbStreamStore

    store = LmdbStreamStore(lmdb_env, "S")
    fill(store, ["a"] * 600)
    decoded = [0]
    real = lmdbreads.decode_msg

    def counting(key: bytes, raw: bytes) -> object:
        decoded[0] += 1
        return real(key, raw)

    monkeypatch.setattr(lmdbreads, "decode_msg", counting)
    for subject_filter in ("a", ">"):
        decoded[0] = 0
        it = store.iter_from(1, subject_filter)
        assert next(it).seq == 1
        assert decoded[0] == lmdbreads.ITER_FIRST_CHUNK_MSGS < lmdbreads.ITER_CHUNK_MSGS
        for expect, first_read in ((1, 1), (100, 100), (10_000, lmdbreads.ITER_CHUNK_MSGS)):
            decoded[0] = 0
            it = store.iter_from(1, subject_filter, expect=expect)
            assert next(it).seq == 1
            assert decoded[0] == first_read


def test_subjects_state_counts_per_subject(store: StreamStore) -> None:
    """STREAM.INFO subjects_filter: message count per subject."""
    fill(store, ["a.1", "a.2", "a.1", "b"])
    assert store.subjects_state("a.*") == {"a.1": 2, "a.2": 1}
    st = store.state(subjects_filter=">")
    assert dict(st.subjects) == {"a.1": 2, "a.2": 1, "b": 1}
    assert dict(store.state().subjects) == {}


# -- delete ----------------------------------------------------------------------------------


def test_delete_interior_counts_as_deleted(store: StreamStore) -> None:
    """STREAM.MSG.DELETE: interior deletes show in num_deleted; first/last stay."""
    fill(store, ["a", "b", "c"])
    assert store.delete(2, erase=True)
    assert not store.delete(2)
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.num_deleted, st.num_subjects) == (
        1,
        3,
        2,
        1,
        2,
    )
    with pytest.raises(NotFoundError):
        store.load(2)


def test_delete_first_moves_first_seq(store: StreamStore) -> None:
    """Deleting the first message moves first_seq to the next stored one."""
    fill(store, ["a", "b", "c"])
    store.delete(2)
    store.delete(1)
    assert store.state().first_seq == 3
    store.delete(3)
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.bytes) == (4, 3, 0, 0)
    assert store.append("a", b"", now_ns=SEC_NS) == 4


# -- purge -------------------------------------------------------------------------------------


def test_purge_all(store: StreamStore) -> None:
    """STREAM.PURGE with no options removes everything; first_seq = last_seq + 1."""
    fill(store, ["a", "b", "c"])
    assert store.purge() == 3
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.bytes, st.num_subjects) == (4, 3, 0, 0, 0)
    assert store.append("a", b"", now_ns=SEC_NS) == 4


def test_purge_by_subject_filter(store: StreamStore) -> None:
    """STREAM.PURGE filter: only messages matching the (wildcard) subject are removed."""
    fill(store, ["a.1", "b", "a.2", "b"])
    assert store.purge(subject="a.*") == 2
    assert [m.seq for m in store.iter_from(1)] == [2, 4]
    assert store.state().first_seq == 2


def test_purge_up_to_sequence_is_exclusive(store: StreamStore) -> None:
    """STREAM.PURGE seq: removes messages below seq, not seq itself."""
    fill(store, ["a", "b", "a", "b"])
    assert store.purge(seq=3) == 2
    assert store.state().first_seq == 3
    assert store.load(3).subject == "a"


def test_purge_seq_past_the_end_compacts(store: StreamStore) -> None:
    """Purge seq beyond last_seq (JetStream Compact): the next message gets that seq."""
    fill(store, ["a", "b"])
    assert store.purge(seq=10) == 2
    st = store.state()
    assert (st.first_seq, st.last_seq) == (10, 9)
    assert store.append("a", b"", now_ns=SEC_NS) == 10


def test_purge_keep_newest(store: StreamStore) -> None:
    """STREAM.PURGE keep: keeps the newest N messages."""
    fill(store, ["a", "b", "a", "b", "a"])
    assert store.purge(keep=2) == 3
    assert [m.seq for m in store.iter_from(1)] == [4, 5]
    assert store.purge(keep=5) == 0


def test_purge_subject_with_keep_and_with_seq(store: StreamStore) -> None:
    """STREAM.PURGE filter+keep and filter+seq combine (keep N newest of the filter)."""
    fill(store, ["a", "b", "a", "b", "a", "b"])
    assert store.purge(subject="a", keep=1) == 2
    assert [m.seq for m in store.iter_from(1, "a")] == [5]
    assert store.purge(subject="b", seq=6) == 2
    assert [m.seq for m in store.iter_from(1)] == [5, 6]


def test_purge_seq_and_keep_are_exclusive(store: StreamStore) -> None:
    """JetStream refuses a purge request with both seq and keep."""
    fill(store, ["a"])
    with pytest.raises(InvalidArgumentError):
        store.purge(seq=2, keep=1)
    assert store.state().msgs == 1


# -- limits on append ----------------------------------------------------------------------------


def test_max_msgs_discard_old_removes_oldest(store_kit: StoreKit) -> None:
    """max_msgs with discard old: the oldest message makes room for the new one."""
    store = store_kit.make(limits=StoreLimits(max_msgs=2))
    fill(store, ["a", "b", "c"])
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs) == (2, 3, 2)


def test_max_msgs_discard_new_refuses_and_changes_nothing(store_kit: StoreKit) -> None:
    """max_msgs with discard new: the publish fails ('maximum messages exceeded')."""
    store = store_kit.make(limits=StoreLimits(max_msgs=2, discard=DiscardPolicy.NEW))
    fill(store, ["a", "b"])
    before = store.state()
    with pytest.raises(LimitError):
        store.append("c", b"x", now_ns=SEC_NS)
    assert store.state() == before


def test_max_bytes_discard_old_and_new(store_kit: StoreKit) -> None:
    """max_bytes counts subject + headers + payload; old drops oldest, new refuses."""
    old = store_kit.make(limits=StoreLimits(max_bytes=25))
    fill(old, ["aaaaaaaa"] * 3)  # 10 bytes each
    assert old.state().msgs == 2
    new = store_kit.make(limits=StoreLimits(max_bytes=25, discard=DiscardPolicy.NEW))
    fill(new, ["aaaaaaaa"] * 2)
    with pytest.raises(LimitError):
        new.append("aaaaaaaa", b"m2", now_ns=SEC_NS)
    assert new.state().msgs == 2


def test_max_msg_size_refuses(store_kit: StoreKit) -> None:
    """max_msg_size: a larger message is refused whatever the discard policy."""
    store = store_kit.make(limits=StoreLimits(max_msg_size=4))
    store.append("subject.is.not.counted", b"1234", now_ns=SEC_NS)
    with pytest.raises(LimitError):
        store.append("a", b"12345", now_ns=SEC_NS)
    with pytest.raises(LimitError):
        store.append("a", b"12", headers={"k": "vv"}, now_ns=SEC_NS)
    assert store.state().msgs == 1


def test_max_msgs_per_subject_discard_old(store_kit: StoreKit) -> None:
    """max_msgs_per_subject: the subject's oldest message goes, others stay."""
    store = store_kit.make(limits=StoreLimits(max_msgs_per_subject=2))
    fill(store, ["a", "b", "a", "a", "b"])
    assert [m.seq for m in store.iter_from(1)] == [2, 3, 4, 5]
    assert store.subjects_state() == {"a": 2, "b": 2}


def test_discard_new_per_subject(store_kit: StoreKit) -> None:
    """discard_new_per_subject: with discard new, a full subject refuses new messages."""
    limits = StoreLimits(
        max_msgs_per_subject=1, discard=DiscardPolicy.NEW, discard_new_per_subject=True
    )
    store = store_kit.make(limits=limits)
    fill(store, ["a", "b"])
    with pytest.raises(LimitError):
        store.append("a", b"", now_ns=SEC_NS)
    assert store.state().msgs == 2


def test_per_subject_limit_with_discard_new_but_not_per_subject(store_kit: StoreKit) -> None:
    """Without discard_new_per_subject, max_msgs_per_subject still drops the subject's oldest."""
    limits = StoreLimits(max_msgs_per_subject=1, discard=DiscardPolicy.NEW)
    store = store_kit.make(limits=limits)
    fill(store, ["a", "a"])
    assert [m.seq for m in store.iter_from(1)] == [2]


def test_max_age_on_append_and_expire(store_kit: StoreKit) -> None:
    """max_age: messages older than max_age (by the leader's timestamp) are removed."""
    store = store_kit.make(limits=StoreLimits(max_age_ns=10 * SEC_NS))
    store.append("a", b"", now_ns=1 * SEC_NS)
    store.append("a", b"", now_ns=5 * SEC_NS)
    store.append("a", b"", now_ns=11 * SEC_NS)  # the first is exactly max_age old: gone
    assert [m.seq for m in store.iter_from(1)] == [2, 3]
    assert store.expire(14 * SEC_NS) == 0
    assert store.expire(15 * SEC_NS) == 1
    assert store.state().first_seq == 3


def test_per_message_ttl_expires(store: StreamStore) -> None:
    """Per-message TTL (Nats-TTL, allow_msg_ttl): a message is removed at ts + ttl."""
    store.append("a", b"", now_ns=SEC_NS, ttl_ns=5 * SEC_NS)
    store.append("b", b"", now_ns=SEC_NS)
    store.append("c", b"", now_ns=2 * SEC_NS, ttl_ns=2 * SEC_NS)
    assert store.load(1).ttl_ns == 5 * SEC_NS
    assert store.expire(3 * SEC_NS) == 0
    assert store.expire(4 * SEC_NS) == 1
    assert store.expire(6 * SEC_NS) == 1
    assert [m.seq for m in store.iter_from(1)] == [2]


def test_update_limits_enforces_at_once(store_kit: StoreKit) -> None:
    """Stream update lowering limits trims the oldest messages, even with discard new."""
    store = store_kit.make(limits=StoreLimits(discard=DiscardPolicy.NEW))
    fill(store, ["a", "a", "b", "a", "b"])
    store.update_limits(
        StoreLimits(max_msgs_per_subject=2, max_msgs=3, discard=DiscardPolicy.NEW),
        now_ns=SEC_NS,
    )
    assert [m.seq for m in store.iter_from(1)] == [3, 4, 5]
    assert store.limits.max_msgs == 3


# -- transactions ----------------------------------------------------------------------------------


def test_transaction_groups_and_rolls_back(store: StreamStore) -> None:
    """A group of appends commits together; an exception rolls the whole group back."""
    with store.transaction():
        fill(store, ["a", "b"])
    with pytest.raises(RuntimeError), store.transaction():
        fill(store, ["c", "d"])
        store.delete(1)
        store.purge(subject="b")
        raise RuntimeError("abort")
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs) == (1, 2, 2)
    assert [m.subject for m in store.iter_from(1)] == ["a", "b"]
    assert store.append("e", b"", now_ns=SEC_NS) == 3


def test_refused_append_inside_transaction_keeps_the_rest(store_kit: StoreKit) -> None:
    """A LimitError refuses one append; the transaction's other appends stay."""
    store = store_kit.make(limits=StoreLimits(max_msgs=1, discard=DiscardPolicy.NEW))
    with store.transaction():
        store.append("a", b"", now_ns=SEC_NS)
        with pytest.raises(LimitError):
            store.append("b", b"", now_ns=SEC_NS)
    assert store.state().msgs == 1


def test_reads_inside_a_transaction_see_its_writes(store: StreamStore) -> None:
    """Within a transaction a later call sees the earlier calls' effects."""
    with store.transaction():
        seq = store.append("a", b"x", now_ns=SEC_NS)
        assert store.load(seq).data == b"x"
        assert store.load_last("a").seq == seq
        assert store.state().msgs == 1


def test_reopen_keeps_everything(store_kit: StoreKit) -> None:
    """Durability: a file-backed stream survives a restart (memory: same object)."""
    store = store_kit.make(limits=StoreLimits(max_msgs=10), name="keep")
    fill(store, ["a", "b", "a"])
    store.delete(2)
    before = store.state(subjects_filter=">")
    store = store_kit.reopen(store, "keep")
    assert store.state(subjects_filter=">") == before
    assert store.limits.max_msgs == 10
    assert store.load_last("a").seq == 3


# -- scale: iterator chunks, index chunks, long subjects -------------------------------------------


def test_many_messages_across_index_and_read_chunks(store_kit: StoreKit) -> None:
    """Subject lookups stay exact past the store's internal chunk sizes (hundreds of
    messages on one subject, interleaved with another, deletes spread over them)."""
    store = store_kit.make(name="many")
    with store.transaction():
        for i in range(1500):
            store.append("hot" if i % 5 else "cold", i.to_bytes(2, "big"), now_ns=SEC_NS)
    deleted = set(range(2, 1500, 7))
    for seq in deleted:
        store.delete(seq)
    expected = [s for s in range(1, 1501) if (s - 1) % 5 and s not in deleted]
    cold = [s for s in range(1, 1501) if not (s - 1) % 5 and s not in deleted]
    assert [m.seq for m in store.iter_from(1, "hot")] == expected
    assert store.num_pending(700, "hot") == len([s for s in expected if s >= 700])
    nxt = store.load_next("hot", 901)
    assert nxt is not None and nxt.seq == min(s for s in expected if s >= 901)
    assert store.load_last("hot").seq == expected[-1]
    store.delete(expected[-1])
    assert store.load_last("hot").seq == expected[-2]
    assert store.purge(subject="hot", keep=3) == len(expected) - 4
    assert [m.seq for m in store.iter_from(1, "hot")] == expected[-4:-1]
    store = store_kit.reopen(store, "many")
    assert [m.seq for m in store.iter_from(1, "hot")] == expected[-4:-1]
    assert store.subjects_state() == {"hot": 3, "cold": len(cold)}


def test_per_subject_limit_trims_across_chunks(store_kit: StoreKit) -> None:
    """max_msgs_per_subject keeps the newest N of a long-lived subject."""
    store = store_kit.make(limits=StoreLimits(max_msgs_per_subject=250))
    for batch in range(4):
        with store.transaction():
            for i in range(200):
                store.append("kv.key", bytes([batch, i % 256]), now_ns=SEC_NS)
    assert [m.seq for m in store.iter_from(1)] == list(range(551, 801))
    assert store.load_last("kv.key").seq == 800


def test_long_subjects_and_unicode_headers(store: StreamStore) -> None:
    """Subjects may be up to 4 KiB (beyond LMDB's 511-byte keys); headers keep UTF-8."""
    subject = ".".join(["t" * 60] * 60)  # 3659 bytes
    seq = store.append(subject, b"x", headers={"Nats-Msg-Id": "é✓"}, now_ns=SEC_NS)
    assert store.load_last(subject).seq == seq
    assert store.load(seq).headers == {"Nats-Msg-Id": "é✓"}
    assert store.subjects_state(subject) == {subject: 1}


def test_negative_time_or_ttl_is_refused(store: StreamStore) -> None:
    """Timestamps are leader-stamped nanoseconds since the epoch: never negative."""
    with pytest.raises(InvalidArgumentError):
        store.append("a", b"", now_ns=-1)
    with pytest.raises(InvalidArgumentError):
        store.append("a", b"", now_ns=SEC_NS, ttl_ns=-5)
    assert store.state().msgs == 0


def test_lmdb_header_size_from_the_encoding() -> None:
    """The LMDB store counts header bytes from their encoding: the same as headers_size for
    none, one, several, empty and multi-byte keys and values."""
    from raftstream.engine.lmdbrecords import encode_headers, encoded_headers_size
    from raftstream.engine.store import headers_size

    cases: list[dict[str, str]] = [
        {},
        {"Nats-Msg-Id": "m1"},
        {"a": "", "": "b", "ключ": "значение", "k" * 300: "v" * 5000},
    ]
    for headers in cases:
        assert encoded_headers_size(encode_headers(headers), len(headers)) == headers_size(headers)
