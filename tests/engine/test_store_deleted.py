"""``StreamStore.deleted(limit)``: the sequences a stream info's ``deleted_details`` lists.

JetStream's stream info with ``deleted_details`` fills ``state.deleted`` with the sequences
between the first and last that hold no message, ``num_deleted`` of them. Review: raftstream
answered ``num_deleted=9`` and ``deleted=()``. Both stores, the same answers.
"""

from __future__ import annotations

from collections.abc import Iterator

from raftstream.engine.store import StreamStore, missing_seqs

NOW = 1_000
SCAN = 1_000_000


def _fill(store: StreamStore, count: int, subjects: tuple[str, ...] = ("a",)) -> None:
    with store.transaction():
        for i in range(count):
            store.append(subjects[i % len(subjects)], b"x", now_ns=NOW)


def test_nothing_deleted_lists_nothing(store: StreamStore) -> None:
    assert store.deleted(10, scan_msgs_max=SCAN) == []
    _fill(store, 5)
    assert store.deleted(10, scan_msgs_max=SCAN) == []


def test_interior_deletes_are_listed_in_order_and_match_num_deleted(store: StreamStore) -> None:
    _fill(store, 20)
    for seq in (9, 3, 4, 15, 16, 17):
        assert store.delete(seq)
    assert store.delete(1)  # the first moves: 1 is before first_seq, not a deleted one
    st = store.state()
    assert st.first_seq == 2 and st.num_deleted == 6
    assert store.deleted(100, scan_msgs_max=SCAN) == [3, 4, 9, 15, 16, 17]


def test_removed_from_the_end_counts_as_deleted(store: StreamStore) -> None:
    """last_seq stays when the newest messages go: they are gaps up to it (num_deleted)."""
    _fill(store, 10)
    assert store.delete(10) and store.delete(9) and store.delete(5)
    st = store.state()
    assert (st.last_seq, st.num_deleted) == (10, 3)
    assert store.deleted(100, scan_msgs_max=SCAN) == [5, 9, 10]


def test_a_subject_purge_leaves_its_sequences_as_deleted(store: StreamStore) -> None:
    _fill(store, 10, subjects=("a", "b"))  # a: odd sequences, b: even
    assert store.purge(subject="b") == 5
    st = store.state()
    assert (st.first_seq, st.last_seq, st.num_deleted) == (1, 10, 5)
    assert store.deleted(100, scan_msgs_max=SCAN) == [2, 4, 6, 8, 10]


def test_the_limit_keeps_the_lowest(store: StreamStore) -> None:
    _fill(store, 50)
    for seq in range(2, 50, 2):
        store.delete(seq)
    assert store.deleted(3, scan_msgs_max=SCAN) == [2, 4, 6]
    assert store.deleted(0, scan_msgs_max=SCAN) == []
    assert len(store.deleted(1000, scan_msgs_max=SCAN)) == store.state().num_deleted == 24


def test_inside_a_transaction_the_buffered_appends_are_seen(store: StreamStore) -> None:
    with store.transaction():
        _fill(store, 6)
        store.delete(3)
        assert store.deleted(10, scan_msgs_max=SCAN) == [3]
    assert store.deleted(10, scan_msgs_max=SCAN) == [3]


def test_missing_seqs_stops_reading_once_it_has_them() -> None:
    """A stream whose gaps are all near its start is not walked to its end."""
    read: list[int] = []

    def stored() -> Iterator[int]:
        for seq in [1, 2, 5, 6, *range(7, 1_000_000)]:
            read.append(seq)
            yield seq

    got = missing_seqs(stored(), first_seq=1, last_seq=999_999, missing=2, limit=100, scan_max=SCAN)
    assert got == [3, 4]
    assert len(read) < 10
    # A wide gap is cut at the limit, not materialised whole.
    wide = missing_seqs(
        [1, 10**12], first_seq=1, last_seq=10**12, missing=10**12 - 2, limit=3, scan_max=SCAN
    )
    assert wide == [2, 3, 4]


def test_the_walk_stops_after_scan_msgs_max_with_the_lowest_found(store: StreamStore) -> None:
    """A bounded walk (it runs on the node's event loop): what it found below where it
    stopped, still the lowest; never a sequence that holds a message."""
    _fill(store, 40)
    for seq in (5, 6, 20, 35, 40):
        store.delete(seq)
    assert store.deleted(100, scan_msgs_max=10) == [5, 6]
    assert store.deleted(100, scan_msgs_max=4) == []
    assert store.deleted(100, scan_msgs_max=SCAN) == [5, 6, 20, 35, 40]
