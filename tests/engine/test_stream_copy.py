"""The stream state machine's ``Copy`` entries: the replicated origin positions of mirrors
and sources (``engine/stream.py``, ``engine/origins.py``; docs/mirrors.md).

Pins issue 7: a mirror keeps its origin's sequence numbers (origin gaps stay gaps) and is
read-only; each copied message carries ``Nats-Stream-Source: <origin> <seq>``; a copy at or
below the replicated position is a duplicate (stored once), one whose ``prev_origin_seq`` is
not the position is refused (nothing stored past a hole); skipped ranges are recorded.
"""

from __future__ import annotations

import pytest

from raftstream.engine.entries import (
    HDR_ROLLUP,
    Copy,
    Expire,
    Kind,
    Publish,
    UpdateConfig,
    decode,
    encode,
)
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.origins import HDR_STREAM_SOURCE, OriginState
from raftstream.engine.stream import Copied, PubAck, Stream
from raftstream.engine.stream_config import StreamConfig
from raftstream.engine.stream_source import ExternalStream, StreamSource, source_key
from raftstream.errors import DataLossError, InvalidArgumentError, NotFoundError, PreconditionError

MIRROR = StreamConfig(name="M", mirror=StreamSource(name="O"))
EXT = StreamSource(name="O", external=ExternalStream(api=("h:1",)))
SOURCING = StreamConfig(
    name="S", subjects=("own.>",), sources=(StreamSource(name="O"), StreamSource(name="P"), EXT)
)


def _copy(origin: str, seq: int, prev: int, **kw: object) -> Copy:
    return Copy(ts_ns=seq, origin=origin, origin_seq=seq, prev_origin_seq=prev, subject="a", **kw)  # type: ignore[arg-type]


def test_a_mirror_keeps_origin_sequences_and_gaps() -> None:
    s = Stream(MIRROR, MemoryStreamStore())
    assert s.apply(_copy("O", 4, 0, data=b"x")) == Copied(origin_seq=4, seq=4)
    assert s.apply(_copy("O", 7, 4, data=b"y")) == Copied(origin_seq=7, seq=7)
    st = s.store.state()
    assert (st.first_seq, st.last_seq, st.msgs) == (4, 7, 2)
    with pytest.raises(NotFoundError):
        s.store.load(5)  # deleted in the origin: a gap here too
    assert s.store.load(7).headers[HDR_STREAM_SOURCE] == "O 7"
    assert s.origins == {"O": OriginState(last_seq=7)}


def test_a_copy_at_or_below_the_position_is_a_duplicate_and_stores_nothing() -> None:
    s = Stream(MIRROR, MemoryStreamStore())
    s.apply(_copy("O", 1, 0))
    s.apply(_copy("O", 2, 1))
    assert s.apply(_copy("O", 2, 1)) == Copied(origin_seq=2, seq=0, duplicate=True)
    assert s.apply(_copy("O", 1, 0)) == Copied(origin_seq=1, seq=0, duplicate=True)
    assert s.store.state().msgs == 2


def test_a_copy_past_a_hole_is_refused_and_changes_nothing() -> None:
    """The proposer believed 3 was stored last; it is 2: it missed something."""
    s = Stream(MIRROR, MemoryStreamStore())
    s.apply(_copy("O", 1, 0))
    s.apply(_copy("O", 2, 1))
    with pytest.raises(PreconditionError) as info:
        s.apply(_copy("O", 5, 3))
    assert info.value.details["rule"] == "origin_seq"
    assert s.store.state().last_seq == 2
    assert s.origins["O"].last_seq == 2


def test_skipped_ranges_are_recorded_with_their_count() -> None:
    s = Stream(MIRROR, MemoryStreamStore())
    s.apply(_copy("O", 10, 0, skipped=(1, 9)))
    s.apply(_copy("O", 15, 10, skipped=(11, 12)))
    o = s.origins["O"]
    assert o.skipped == ((1, 9), (11, 12)) and o.skipped_msgs == 11 and o.last_seq == 15


def test_publishes_to_a_mirror_are_refused_until_it_is_promoted() -> None:
    s = Stream(MIRROR, MemoryStreamStore())
    s.apply(_copy("O", 3, 0))
    with pytest.raises(PreconditionError) as info:
        s.apply(Publish(ts_ns=5, subject="M", data=b"x"))
    assert info.value.details["rule"] == "mirror"
    assert s.store.state().msgs == 1
    s.apply(UpdateConfig(ts_ns=6, config=StreamConfig(name="M")))
    ack = s.apply(Publish(ts_ns=7, subject="M", data=b"x"))
    assert isinstance(ack, PubAck) and ack.seq == 4
    with pytest.raises(InvalidArgumentError):  # no longer a mirror: copies are refused
        s.apply(_copy("O", 4, 3))


def test_sources_interleave_with_own_publishes_each_origin_once() -> None:
    s = Stream(SOURCING, MemoryStreamStore())
    s.apply(_copy("O", 1, 0))
    s.apply(Publish(ts_ns=2, subject="own.x"))
    s.apply(_copy("P", 1, 0))
    s.apply(_copy(source_key(EXT), 1, 0))
    s.apply(_copy("O", 2, 1))
    s.apply(_copy("O", 2, 1))  # a redelivery: stored once
    headers = [m.headers.get(HDR_STREAM_SOURCE) for m in s.store.iter_from(1)]
    assert headers == ["O 1", None, "P 1", "O 1", "O 2"]  # the external O is named O too
    assert {k: v.last_seq for k, v in s.origins.items()} == {"O": 2, "P": 1, "O@h:1": 1}


def test_a_copy_from_an_origin_not_configured_is_refused() -> None:
    s = Stream(SOURCING, MemoryStreamStore())
    with pytest.raises(InvalidArgumentError) as info:
        s.apply(_copy("Q", 1, 0))
    assert info.value.field == "origin"


def test_source_transforms_rename_subjects() -> None:
    from raftstream.engine.stream_source import SourceTransform

    src = StreamSource(name="O", subject_transforms=(SourceTransform(src="a", dest="b.a"),))
    s = Stream(StreamConfig(name="S", sources=(src,)), MemoryStreamStore())
    s.apply(_copy("O", 1, 0))
    assert s.store.load(1).subject == "b.a"


def test_the_copy_entry_round_trips() -> None:
    e = Copy(
        ts_ns=9,
        origin="O@h:1",
        origin_seq=12,
        prev_origin_seq=10,
        subject="a.b",
        data=b"\x00\x01",
        headers={"k": "v"},
        skipped=(11, 11),
    )
    assert decode(encode(e)) == e
    plain = Copy(ts_ns=1, origin="O", origin_seq=1, prev_origin_seq=0, subject="a")
    assert decode(encode(plain)) == plain
    # With the origin's time: its own kind; an entry without it keeps the old layout.
    at = Copy(ts_ns=9, origin="O", origin_seq=3, prev_origin_seq=2, subject="a", origin_ts_ns=5)
    assert decode(encode(at)) == at
    assert encode(at)[1] == Kind.COPY_AT
    assert encode(plain)[1] == Kind.COPY


def test_a_rollup_copy_round_trips_in_its_own_kind() -> None:
    for origin_ts_ns in (0, 5):
        e = Copy(ts_ns=9, origin="O", origin_seq=3, prev_origin_seq=2, subject="a",
                 headers={HDR_ROLLUP: "sub"}, origin_ts_ns=origin_ts_ns, rollup=True)  # fmt: skip
        assert decode(encode(e)) == e
        assert encode(e)[1] == Kind.COPY_ROLLUP


def _rollup_copy(origin: str, seq: int, prev: int, subject: str, how: str | None) -> Copy:
    headers = {HDR_ROLLUP: how} if how else {}
    return Copy(ts_ns=seq, origin=origin, origin_seq=seq, prev_origin_seq=prev,
                subject=subject, headers=headers, rollup=True)  # fmt: skip


def test_a_rollup_copy_rolls_up_as_its_origin_did() -> None:
    """A copy that says to (``rollup``) applies ``Nats-Rollup`` on a stream allowing rollups:
    the subject's (or every) older message goes, as at the origin; a mirror keeps sequences."""
    s = Stream(StreamConfig(name="M", mirror=StreamSource(name="O"), allow_rollup_hdrs=True),
               MemoryStreamStore())  # fmt: skip
    for seq, subject in [(1, "k"), (2, "j"), (3, "k")]:
        s.apply(_rollup_copy("O", seq, seq - 1, subject, None))
    s.apply(_rollup_copy("O", 4, 3, "k", "sub"))
    assert [s.store.load(q).subject for q in (2, 4)] == ["j", "k"]
    for gone in (1, 3):
        with pytest.raises(NotFoundError):
            s.store.load(gone)
    s.apply(_rollup_copy("O", 5, 4, "j", "all"))
    st = s.store.state()
    assert (st.first_seq, st.last_seq, st.msgs) == (5, 5, 1)


def test_a_rollup_copy_is_stored_as_it_is_where_rollups_do_not_apply() -> None:
    """Older entries (``rollup`` false), a stream not allowing rollups, or a header that is
    no rollup: the copy is stored, nothing removed (refusing it would stop the link)."""
    allowed = StreamConfig(name="M", mirror=StreamSource(name="O"), allow_rollup_hdrs=True)
    cases = [
        (allowed, Copy(ts_ns=2, origin="O", origin_seq=2, prev_origin_seq=1, subject="k",
                       headers={HDR_ROLLUP: "sub"})),
        (MIRROR, _rollup_copy("O", 2, 1, "k", "sub")),
        (allowed, _rollup_copy("O", 2, 1, "k", "bogus")),
    ]  # fmt: skip
    for cfg, second in cases:
        s = Stream(cfg, MemoryStreamStore())
        s.apply(_rollup_copy("O", 1, 0, "k", None))
        assert s.apply(second) == Copied(origin_seq=2, seq=2)
        assert s.store.state().msgs == 2


def test_a_copy_at_with_no_origin_time_is_data_loss() -> None:
    raw = bytearray(
        encode(
            Copy(ts_ns=9, origin="O", origin_seq=3, prev_origin_seq=2, subject="a", origin_ts_ns=5)
        )
    )
    raw[10:18] = (0).to_bytes(8, "little")  # after version, kind and ts_ns: origin_ts_ns
    with pytest.raises(DataLossError):
        decode(bytes(raw))


def test_a_mirror_stores_each_copy_at_its_origin_time() -> None:
    """As a JetStream mirror: the origin's times, so max_age, start times and stream info
    read the times the messages were published (``Stream._copy_ts``)."""
    s = Stream(MIRROR, MemoryStreamStore())
    s.apply(_copy("O", 1, 0, origin_ts_ns=3))
    s.apply(
        Copy(ts_ns=100, origin="O", origin_seq=2, prev_origin_seq=1, subject="a", origin_ts_ns=50)
    )
    assert [s.store.load(q).ts for q in (1, 2)] == [3, 50]
    # Never below the last stored time, should an origin's times ever go back.
    s.apply(
        Copy(ts_ns=200, origin="O", origin_seq=3, prev_origin_seq=2, subject="a", origin_ts_ns=7)
    )
    assert s.store.load(3).ts == 50
    # A copy without the origin's time (an older proposer's) is stamped with the entry's.
    s.apply(Copy(ts_ns=300, origin="O", origin_seq=4, prev_origin_seq=3, subject="a"))
    assert s.store.load(4).ts == 300


def test_a_source_stamps_its_copies_with_the_entry_time() -> None:
    """Sources interleave with other origins and their own publishes: the entry's time."""
    s = Stream(SOURCING, MemoryStreamStore())
    s.apply(
        Copy(ts_ns=100, origin="O", origin_seq=1, prev_origin_seq=0, subject="a", origin_ts_ns=5)
    )
    assert s.store.load(1).ts == 100


def test_a_mirror_expires_old_copies_by_their_origin_time() -> None:
    """max_age counts from the origin's time: a fresh mirror of an old origin keeps only
    what is younger than max_age, as the origin does."""
    second = 1_000_000_000
    cfg = StreamConfig(name="M", mirror=StreamSource(name="O"), max_age=10 * second)
    s = Stream(cfg, MemoryStreamStore())
    now = 1_000 * second
    s.apply(
        Copy(
            ts_ns=now,
            origin="O",
            origin_seq=1,
            prev_origin_seq=0,
            subject="a",
            origin_ts_ns=now - 60 * second,
        )
    )
    s.apply(
        Copy(
            ts_ns=now,
            origin="O",
            origin_seq=2,
            prev_origin_seq=1,
            subject="a",
            origin_ts_ns=now - 5 * second,
        )
    )
    s.apply(Expire(ts_ns=now + 1))
    st = s.store.state()
    assert (st.first_seq, st.msgs) == (2, 1)
