"""The cheap paths of the store under the stream state machine, on both stores.

``Stream.apply`` calls ``expire`` and reads ``last_ts`` for every entry, and nests
transactions inside the caller's batch, so the stores answer those without work when they
can: ``last_seq``/``last_ts`` are plain properties, ``expire`` returns at once while no TTL
deadline is reached and the first message is younger than ``max_age`` (the stores remember
both), and a nested ``transaction()`` joins for free. These tests pin that the shortcuts never
skip a removal that is due, including after a rolled-back transaction, and (LMDB) that an
expiry with nothing due leaves the transaction's appends buffered.
"""

from __future__ import annotations

import pytest

from raftstream.engine.store import StoreLimits, StreamStore

from .conftest import StoreKit

SEC_NS = 1_000_000_000


def _seqs(store: StreamStore) -> list[int]:
    return [m.seq for m in store.iter_from(1)]


def _same_as_state(store: StreamStore) -> None:
    st = store.state()
    assert (store.last_seq, store.last_ts) == (st.last_seq, st.last_ts)


# -- last_seq / last_ts ----------------------------------------------------------------------


def test_last_seq_and_last_ts_follow_state(store: StreamStore) -> None:
    """The properties are ``state()``'s counters: after appends, a skip, a removal of the
    last message, inside a transaction and after a rollback."""
    _same_as_state(store)
    assert (store.last_seq, store.last_ts) == (0, 0)
    store.append("a", b"x", now_ns=3 * SEC_NS)
    store.skip(10)
    store.append("b", b"y", now_ns=5 * SEC_NS)
    assert (store.last_seq, store.last_ts) == (10, 5 * SEC_NS)
    store.delete(10)
    _same_as_state(store)
    with store.transaction():
        store.append("c", b"z", now_ns=7 * SEC_NS)
        assert (store.last_seq, store.last_ts) == (11, 7 * SEC_NS)
        _same_as_state(store)
    with pytest.raises(RuntimeError), store.transaction():
        store.append("d", b"w", now_ns=9 * SEC_NS)
        raise RuntimeError("abort")
    assert (store.last_seq, store.last_ts) == (11, 7 * SEC_NS)
    _same_as_state(store)


def test_nested_transaction_joins_and_rolls_back_with_the_outer(store: StreamStore) -> None:
    """A block opened inside another joins it: an error leaving the inner block and then the
    outer one undoes both blocks' writes; a nested block that ends normally commits nothing
    by itself."""
    store.append("a", b"x", now_ns=SEC_NS)
    with pytest.raises(RuntimeError), store.transaction():
        store.append("b", b"y", now_ns=SEC_NS)
        with store.transaction():
            store.append("c", b"z", now_ns=SEC_NS)
        with store.transaction():
            raise RuntimeError("abort")
    assert _seqs(store) == [1] and store.last_seq == 1
    with store.transaction():
        with store.transaction():
            store.append("b", b"y", now_ns=SEC_NS)
        store.append("c", b"z", now_ns=SEC_NS)
    assert _seqs(store) == [1, 2, 3]


# -- expire: nothing due, and everything due still removed ------------------------------------


def test_expire_with_nothing_due_removes_nothing(store_kit: StoreKit) -> None:
    """No age limit and no TTL: expire removes nothing at any time; with an age limit it
    removes nothing before the first message is max_age old, and that one exactly then."""
    plain = store_kit.make()
    plain.append("a", b"", now_ns=SEC_NS)
    assert plain.expire(10**6 * SEC_NS) == 0 and _seqs(plain) == [1]
    aged = store_kit.make(limits=StoreLimits(max_age_ns=10 * SEC_NS))
    aged.append("a", b"", now_ns=SEC_NS)
    aged.append("b", b"", now_ns=2 * SEC_NS)
    assert aged.expire(11 * SEC_NS - 1) == 0
    assert aged.expire(11 * SEC_NS) == 1 and _seqs(aged) == [2]


def test_max_age_sees_a_new_first_message(store_kit: StoreKit) -> None:
    """When the first message goes (delete, or expiry), the age check uses the new first
    message's time, not the old one's."""
    store = store_kit.make(limits=StoreLimits(max_age_ns=10 * SEC_NS))
    store.append("a", b"", now_ns=SEC_NS)
    store.append("b", b"", now_ns=5 * SEC_NS)
    store.append("c", b"", now_ns=6 * SEC_NS)
    assert store.expire(2 * SEC_NS) == 0  # the first message's time is known from here on
    store.delete(1)
    assert store.expire(15 * SEC_NS - 1) == 0
    assert store.expire(15 * SEC_NS) == 1
    assert store.expire(16 * SEC_NS - 1) == 0
    assert store.expire(16 * SEC_NS) == 1 and store.state().msgs == 0


def test_max_age_after_a_rolled_back_expiry(store_kit: StoreKit) -> None:
    """An expiry undone by an aborted transaction leaves the old first message due."""
    store = store_kit.make(limits=StoreLimits(max_age_ns=10 * SEC_NS))
    store.append("a", b"", now_ns=SEC_NS)
    store.append("b", b"", now_ns=5 * SEC_NS)
    with pytest.raises(RuntimeError), store.transaction():
        assert store.expire(12 * SEC_NS) == 1
        raise RuntimeError("abort")
    assert _seqs(store) == [1, 2]
    assert store.expire(11 * SEC_NS) == 1 and _seqs(store) == [2]


def test_ttl_of_a_later_append_is_honoured(store: StreamStore) -> None:
    """An expiry that found no TTL (or a later deadline) does not hide a TTL appended
    afterwards: an earlier deadline added later is still met exactly."""
    store.append("a", b"", now_ns=SEC_NS)
    assert store.expire(2 * SEC_NS) == 0  # no message has a TTL
    store.append("b", b"", now_ns=2 * SEC_NS, ttl_ns=10 * SEC_NS)  # due at 12 s
    assert store.expire(3 * SEC_NS) == 0
    store.append("c", b"", now_ns=3 * SEC_NS, ttl_ns=2 * SEC_NS)  # due at 5 s
    assert store.expire(5 * SEC_NS - 1) == 0
    assert store.expire(5 * SEC_NS) == 1 and _seqs(store) == [1, 2]
    assert store.expire(12 * SEC_NS - 1) == 0
    assert store.expire(12 * SEC_NS) == 1 and _seqs(store) == [1]
    assert store.expire(10**6 * SEC_NS) == 0


def test_ttl_after_a_rolled_back_expiry(store: StreamStore) -> None:
    """A TTL expiry undone by an aborted transaction leaves the message due (the store
    forgets what the aborted expiry learnt about deadlines)."""
    store.append("a", b"", now_ns=SEC_NS, ttl_ns=5 * SEC_NS)  # due at 6 s
    with pytest.raises(RuntimeError), store.transaction():
        assert store.expire(7 * SEC_NS) == 1
        raise RuntimeError("abort")
    assert _seqs(store) == [1]
    assert store.expire(6 * SEC_NS) == 1 and _seqs(store) == []


def test_ttl_appended_in_an_aborted_transaction_is_gone(store: StreamStore) -> None:
    """A TTL message rolled back is not expired later (nothing to remove, no error)."""
    store.append("a", b"", now_ns=SEC_NS)
    with pytest.raises(RuntimeError), store.transaction():
        store.append("b", b"", now_ns=SEC_NS, ttl_ns=2 * SEC_NS)
        raise RuntimeError("abort")
    assert store.expire(10 * SEC_NS) == 0 and _seqs(store) == [1]


def test_ttl_survives_reopen(store_kit: StoreKit) -> None:
    """A reopened store expires the TTLs it holds at their deadlines."""
    store = store_kit.make(name="TTL")
    store.append("a", b"", now_ns=SEC_NS, ttl_ns=5 * SEC_NS)
    assert store.expire(2 * SEC_NS) == 0
    store = store_kit.reopen(store, "TTL")
    assert store.expire(6 * SEC_NS - 1) == 0
    assert store.expire(6 * SEC_NS) == 1 and store.state().msgs == 0


# -- LMDB: an expiry with nothing due keeps the batch buffered --------------------------------


def test_lmdb_expire_with_nothing_due_keeps_appends_buffered(store_kit: StoreKit) -> None:
    """The batching contract of the publish path: expire() with nothing due, even with an
    age limit set and a TTL pending, writes none of the transaction's buffered appends (the
    store writes them in one batch at commit). Reads the store's buffer: white-box."""
    if store_kit.kind != "lmdb":
        pytest.skip("the memory store has no write buffer")
    store = store_kit.make(limits=StoreLimits(max_age_ns=60 * SEC_NS))
    store.append("a", b"", now_ns=SEC_NS, ttl_ns=30 * SEC_NS)
    store.expire(SEC_NS)  # learns the deadlines (commits its own transaction)
    with store.transaction():
        for i in range(10):
            store.append("b", b"x", now_ns=(2 + i) * SEC_NS)
            assert store.expire((2 + i) * SEC_NS) == 0
        assert len(store._pend_msgs) == 10  # type: ignore[attr-defined]
    assert store.state().msgs == 11
    assert store.expire(31 * SEC_NS) == 1 and store.state().msgs == 10


# -- limits inside a batch: removals at the front, appends still buffered ----------------------


def test_limits_remove_written_messages_under_buffered_appends(store_kit: StoreKit) -> None:
    """max_msgs in one transaction of appends: the oldest (written) messages go one per
    append until the buffered ones are all that is left, then those go too; first_seq,
    counts, reads and a reopen agree at every step."""
    store = store_kit.make(limits=StoreLimits(max_msgs=3), name="LIM")
    for i in range(3):
        store.append("a", b"w", now_ns=(1 + i) * SEC_NS)
    with store.transaction():  # no read in between: the appends stay buffered
        for seq in range(4, 9):
            store.append("b", b"b", now_ns=seq * SEC_NS)
        st = store.state()
        assert (st.first_seq, st.last_seq, st.msgs, st.first_ts) == (6, 8, 3, 6 * SEC_NS)
    with store.transaction():  # a read after each append
        for seq in range(9, 14):
            store.append("c", b"c", now_ns=seq * SEC_NS)
            st = store.state()
            assert (st.first_seq, st.last_seq, st.msgs) == (seq - 2, seq, 3)
            assert st.first_ts == (seq - 2) * SEC_NS
        assert _seqs(store) == [11, 12, 13]
        assert store.subjects_state() == {"c": 3}
    store = store_kit.reopen(store, "LIM")
    st = store.state()
    assert (st.first_seq, st.last_seq, st.msgs, st.num_subjects) == (11, 13, 3, 1)
    assert [m.data for m in store.iter_from(1)] == [b"c"] * 3


def test_max_age_and_bytes_in_one_batch(store_kit: StoreKit) -> None:
    """max_age and max_bytes enforced on every append of one transaction behave as with
    one transaction per append."""
    limits = StoreLimits(max_age_ns=5 * SEC_NS, max_bytes=10 * (1 + 4))
    batched, single = store_kit.make(limits=limits), store_kit.make(limits=limits)
    stamps = [SEC_NS * t for t in (1, 2, 2, 3, 8, 9, 9, 9, 10, 20, 21, 22)]
    states = []
    for i, ts in enumerate(stamps):
        single.append("a", b"%04d" % i, now_ns=ts)
        states.append(single.state())
    with batched.transaction():  # after: two LMDB write transactions may not overlap
        for i, ts in enumerate(stamps):
            batched.append("a", b"%04d" % i, now_ns=ts)
            assert batched.state() == states[i]
    assert [m.data for m in batched.iter_from(1)] == [m.data for m in single.iter_from(1)]
    assert batched.expire(30 * SEC_NS) == single.expire(30 * SEC_NS)
    assert batched.state() == single.state()
