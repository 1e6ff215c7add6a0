"""The stream state machine: JetStream's publish semantics, applied deterministically.

Every behavioural test runs on both stores (``store_kit`` from ``conftest.py``; the LMDB
variant is skipped only while ``engine/lmdbstore.py`` is absent). Each names the JetStream
behaviour it pins. Time is always the entry's ``ts_ns``; nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.engine.entries import (
    HDR_EXPECTED_LAST_MSG_ID,
    HDR_EXPECTED_LAST_SEQ,
    HDR_EXPECTED_LAST_SUBJECT_SEQ,
    HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    HDR_EXPECTED_STREAM,
    HDR_MSG_ID,
    HDR_ROLLUP,
    HDR_TTL,
    DeleteMsg,
    Entry,
    Expire,
    Publish,
    PublishOptions,
    Purge,
    UpdateConfig,
    decode,
    decode_batch,
    encode,
    encode_batch,
    parse_ttl,
    publish_options,
)
from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import DiscardPolicy
from raftstream.engine.stream import ConfigUpdated, Expired, MsgDeleted, PubAck, Purged, Stream
from raftstream.engine.stream_config import (
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
    store_limits,
)
from raftstream.engine.subjects import subject_matches
from raftstream.errors import (
    ExpectedLastMsgIdError,
    ExpectedLastSeqError,
    ExpectedLastSubjectSeqError,
    ExpectedStreamError,
    InvalidArgumentError,
    LimitError,
    NotFoundError,
    PreconditionError,
    RaftStreamError,
)

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND


class Kit:
    """Makes streams over one kind of store and reopens them (a node restart)."""

    def __init__(self, store_kit: Any) -> None:
        self.store_kit = store_kit

    def stream(self, hook: Any = None, **config: Any) -> Stream:
        config.setdefault("name", "S")
        config.setdefault("subjects", ("s.>",))
        return Stream(StreamConfig(**config), self.store_kit.make(), retention=hook)

    def reopen(self, stream: Stream, hook: Any = None) -> Stream:
        """Close and reopen the store (LMDB), then open a fresh Stream over it."""
        store = self.store_kit.reopen(stream.store, getattr(stream.store, "name", ""))
        return Stream(stream.config, store, retention=hook)


@pytest.fixture
def kit(store_kit: Any) -> Kit:
    if store_kit.kind == "lmdb":
        pytest.importorskip("raftstream.engine.lmdbstore")
    return Kit(store_kit)


def pub(s: Stream, subject: str = "s.a", data: bytes = b"x", t: int = T0, **kw: Any) -> Any:
    return s.apply(Publish(ts_ns=t, subject=subject, data=data, **kw))


def seqs(s: Stream) -> list[int]:
    return [m.seq for m in s.store.iter_from(1)]


class Consumers:
    """A plain model of the consumer engine's side of ``RetentionPolicyHook``: named
    consumers with filters and the sequences each has acked."""

    def __init__(self, **filters: str) -> None:
        self.filters = dict(filters)
        self.acked: dict[str, set[int]] = {name: set() for name in filters}

    def has_interest(self, subject: str) -> bool:
        return any(subject_matches(f, subject) for f in self.filters.values())

    def is_needed(self, seq: int, subject: str) -> bool:
        return any(
            subject_matches(f, subject) and seq not in self.acked[name]
            for name, f in self.filters.items()
        )

    def ack(self, name: str, seq: int) -> None:
        self.acked[name].add(seq)


# -- publish basics --------------------------------------------------------------------------


def test_publish_assigns_sequences_and_acks(kit: Kit) -> None:
    """PubAck{stream, seq, duplicate}: sequences start at 1 and grow by one."""
    s = kit.stream()
    assert pub(s) == PubAck(stream="S", seq=1, duplicate=False)
    assert pub(s, "s.b", b"y") == PubAck(stream="S", seq=2)
    msg = s.store.load(2)
    assert (msg.subject, msg.data, msg.ts) == ("s.b", b"y", T0)


def test_subject_must_be_captured_by_the_stream(kit: Kit) -> None:
    """A stream only stores subjects its config captures; publishes are literal subjects."""
    s = kit.stream()
    for subject in ("t.a", "s.*"):
        with pytest.raises(InvalidArgumentError) as info:
            pub(s, subject)
        assert info.value.field == "subject"
    assert s.store.state().msgs == 0


def test_first_seq_sets_the_first_sequence(kit: Kit) -> None:
    """first_seq: a new stream's first message gets that sequence."""
    s = kit.stream(first_seq=100)
    assert pub(s).seq == 100 and pub(s).seq == 101


def test_subject_transform_applies_before_storing(kit: Kit) -> None:
    """subject_transform rewrites the subject that is stored; the expected-last-subject-
    sequence check looks at the stored (transformed) subject."""
    s = kit.stream(subject_transform=SubjectTransform(src="s.*", dest="t.$1"))
    pub(s, "s.a")
    assert s.store.load(1).subject == "t.a"
    assert pub(s, "s.a", expected_last_subject_seq=1).seq == 2
    assert pub(s, "s.b.c").seq == 3 and s.store.load(3).subject == "s.b.c"


def test_leader_time_never_goes_backwards(kit: Kit) -> None:
    """Leader-stamped time: an entry stamped earlier than the last append (a new leader
    with a slower clock) is applied at the last append's time."""
    s = kit.stream()
    pub(s, t=T0 + 10 * SECOND)
    pub(s, t=T0)
    assert s.store.load(2).ts == T0 + 10 * SECOND


# -- deduplication ---------------------------------------------------------------------------


def test_duplicate_answers_original_sequence_and_stores_nothing(kit: Kit) -> None:
    """Nats-Msg-Id within duplicate_window: PubAck with the original seq, duplicate=true."""
    s = kit.stream()
    assert pub(s, msg_id="m1").seq == 1
    pub(s, msg_id="m2")
    assert pub(s, msg_id="m1", t=T0 + SECOND) == PubAck(stream="S", seq=1, duplicate=True)
    dup = pub(s, headers={HDR_MSG_ID: "m1"}, t=T0 + 2 * SECOND)
    assert dup == PubAck(stream="S", seq=1, duplicate=True)
    assert s.store.state().msgs == 2


def test_msg_id_is_stored_as_header(kit: Kit) -> None:
    """The msg id travels in Nats-Msg-Id, also when given as a field, as JetStream stores
    the header with the message (expected-last-msg-id reads it)."""
    s = kit.stream()
    pub(s, msg_id="m1")
    assert s.store.load(1).headers[HDR_MSG_ID] == "m1"


def test_duplicate_window_expires_by_entry_time(kit: Kit) -> None:
    """duplicate_window: a msg id is a duplicate only while its record is younger than
    the window, measured with the entries' times."""
    s = kit.stream(duplicate_window=5 * SECOND)
    pub(s, msg_id="m1")
    assert pub(s, msg_id="m1", t=T0 + 5 * SECOND - 1).duplicate
    ack = pub(s, msg_id="m1", t=T0 + 5 * SECOND)
    assert ack == PubAck(stream="S", seq=2, duplicate=False)


def test_dedup_records_are_pruned_by_entry_time(kit: Kit) -> None:
    """Ids older than the window leave the store when a later entry's time passes them."""
    s = kit.stream(duplicate_window=5 * SECOND)
    for i in range(5):
        pub(s, msg_id=f"m{i}")
    assert s.dedup_ids == 5
    pub(s, msg_id="late", t=T0 + 6 * SECOND)
    assert s.dedup_ids == 1


def test_dedup_survives_reopen(kit: Kit) -> None:
    """Dedup records are in the store: a retry after a restart is still a duplicate, and
    an id outside the window is not."""
    s = kit.stream(duplicate_window=10 * SECOND)
    pub(s, msg_id="old")
    pub(s, msg_id="m1", t=T0 + 8 * SECOND)
    pub(s, msg_id="m2", t=T0 + 9 * SECOND)
    s = kit.reopen(s)
    assert s.dedup_ids == 3
    assert pub(s, msg_id="m1", t=T0 + 11 * SECOND) == PubAck(stream="S", seq=2, duplicate=True)
    assert pub(s, msg_id="old", t=T0 + 11 * SECOND) == PubAck(stream="S", seq=4)


def test_dedup_comes_before_preconditions(kit: Kit) -> None:
    """JetStream checks the msg id first: a retried publish gets its original answer even
    though its expected-last-sequence no longer holds."""
    s = kit.stream()
    pub(s, msg_id="m1", expected_last_seq=0)
    assert pub(s, msg_id="m1", expected_last_seq=0).duplicate


def test_removed_message_still_deduplicates(kit: Kit) -> None:
    """JetStream keeps a msg id for the whole duplicate window, whatever became of its
    message: a retry after the message was deleted answers the original sequence."""
    s = kit.stream()
    pub(s, msg_id="m1")
    s.apply(DeleteMsg(ts_ns=T0, seq=1))
    assert pub(s, msg_id="m1") == PubAck(stream="S", seq=1, duplicate=True)
    assert s.store.state().msgs == 0


def test_msg_id_field_and_header_must_agree(kit: Kit) -> None:
    """Fields and JetStream headers are two spellings of one option; a conflict is refused."""
    s = kit.stream()
    with pytest.raises(InvalidArgumentError) as info:
        pub(s, msg_id="a", headers={HDR_MSG_ID: "b"})
    assert info.value.field == "msg_id"
    assert pub(s, msg_id="a", headers={HDR_MSG_ID: "a"}).seq == 1


@pytest.mark.parametrize(
    "field,value,header,text",
    [
        ("expected_stream", "S", HDR_EXPECTED_STREAM, "T"),
        ("expected_last_seq", 0, HDR_EXPECTED_LAST_SEQ, "1"),
        ("expected_last_subject_seq", 0, HDR_EXPECTED_LAST_SUBJECT_SEQ, "2"),
        ("expected_last_msg_id", "a", HDR_EXPECTED_LAST_MSG_ID, "b"),
        ("ttl_ns", 2 * SECOND, HDR_TTL, "3s"),
    ],
)
def test_option_field_and_header_conflict(
    kit: Kit, field: str, value: object, header: str, text: str
) -> None:
    """Every JetStream header option may come as a field too, but never as both disagreeing."""
    s = kit.stream(allow_msg_ttl=True)
    with pytest.raises(InvalidArgumentError) as info:
        pub(s, headers={header: text}, **{field: value})
    assert info.value.field == field
    assert s.store.state().last_seq == 0


def test_stream_hands_its_limits_to_the_store(kit: Kit) -> None:
    """Opening a stream makes its store enforce the config's limits."""
    s = kit.stream(max_msgs=3, max_age=10 * SECOND)
    assert s.store.limits == store_limits(s.config)


# -- expected-* preconditions ----------------------------------------------------------------


def test_expected_stream(kit: Kit) -> None:
    """Nats-Expected-Stream: the publish must land in the named stream."""
    s = kit.stream()
    with pytest.raises(ExpectedStreamError):
        pub(s, expected_stream="OTHER")
    with pytest.raises(ExpectedStreamError):
        pub(s, headers={HDR_EXPECTED_STREAM: "OTHER"})
    assert pub(s, expected_stream="S").seq == 1


def test_expected_last_sequence(kit: Kit) -> None:
    """Nats-Expected-Last-Sequence: the stream's last sequence must be exactly this
    (0 for a stream that never stored anything)."""
    s = kit.stream()
    assert pub(s, expected_last_seq=0).seq == 1
    with pytest.raises(ExpectedLastSeqError) as info:
        pub(s, expected_last_seq=0)
    assert info.value.details["last"] == 1
    assert pub(s, headers={HDR_EXPECTED_LAST_SEQ: "1"}).seq == 2
    with pytest.raises(ExpectedLastSeqError):
        pub(s, headers={HDR_EXPECTED_LAST_SEQ: "1"})


@pytest.mark.parametrize("text", ["x", "²", "-1", "99999999999999999999", str(1 << 63)])
def test_expected_last_sequence_header_must_be_a_number(kit: Kit, text: str) -> None:
    """A malformed header is a bad request naming the header: not a digit string (a
    Unicode digit like '²' passed str.isdigit and crashed int()), or past int64 (it read as
    a wrong last sequence, a bad-input review)."""
    s = kit.stream()
    with pytest.raises(InvalidArgumentError) as info:
        pub(s, headers={HDR_EXPECTED_LAST_SEQ: text})
    assert info.value.field == HDR_EXPECTED_LAST_SEQ
    assert s.store.state().msgs == 0


def test_expected_last_subject_sequence(kit: Kit) -> None:
    """Nats-Expected-Last-Subject-Sequence: the last sequence on the publish's subject
    (0 when the subject has none) must be exactly this."""
    s = kit.stream()
    assert pub(s, "s.a", expected_last_subject_seq=0).seq == 1
    pub(s, "s.b")
    assert pub(s, "s.a", expected_last_subject_seq=1).seq == 3
    with pytest.raises(ExpectedLastSubjectSeqError):
        pub(s, "s.a", expected_last_subject_seq=1)
    with pytest.raises(ExpectedLastSubjectSeqError):
        pub(s, "s.c", headers={HDR_EXPECTED_LAST_SUBJECT_SEQ: "3"})


def test_expected_last_subject_sequence_with_its_own_subject(kit: Kit) -> None:
    """Nats-Expected-Last-Subject-Sequence-Subject: check another subject or a filter."""
    s = kit.stream()
    pub(s, "s.a")
    pub(s, "s.b")
    ok = pub(
        s,
        "s.c",
        headers={
            HDR_EXPECTED_LAST_SUBJECT_SEQ: "2",
            HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT: "s.*",
        },
    )
    assert ok.seq == 3
    with pytest.raises(ExpectedLastSubjectSeqError):
        pub(s, "s.c", expected_last_subject_seq=2, expected_last_subject_seq_subject="s.a")


def test_expected_last_msg_id(kit: Kit) -> None:
    """Nats-Expected-Last-Msg-Id: the last message's id must be this one."""
    s = kit.stream()
    pub(s, msg_id="m1")
    assert pub(s, msg_id="m2", expected_last_msg_id="m1").seq == 2
    with pytest.raises(ExpectedLastMsgIdError) as info:
        pub(s, headers={HDR_EXPECTED_LAST_MSG_ID: "m1"})
    assert info.value.details["last"] == "m2"


# -- rollup, TTL, size, limits ---------------------------------------------------------------


def test_rollup_subject(kit: Kit) -> None:
    """Nats-Rollup: sub keeps only the new message of its subject."""
    s = kit.stream(allow_rollup_hdrs=True)
    for subject in ("s.a", "s.b", "s.a"):
        pub(s, subject)
    assert pub(s, "s.a", headers={HDR_ROLLUP: "sub"}).seq == 4
    assert seqs(s) == [2, 4]


def test_rollup_all(kit: Kit) -> None:
    """Nats-Rollup: all keeps only the new message in the whole stream."""
    s = kit.stream(allow_rollup_hdrs=True)
    for subject in ("s.a", "s.b", "s.c"):
        pub(s, subject)
    pub(s, "s.a", headers={HDR_ROLLUP: "all"})
    assert seqs(s) == [4]


def test_rollup_needs_allow_rollup_hdrs(kit: Kit) -> None:
    """JetStream: "rollup not permitted" unless allow_rollup_hdrs; nothing is stored."""
    s = kit.stream()
    pub(s)
    with pytest.raises(PreconditionError) as info:
        pub(s, headers={HDR_ROLLUP: "all"})
    assert info.value.details["rule"] == "allow_rollup_hdrs"
    assert seqs(s) == [1]


def test_rollup_value_must_be_sub_or_all(kit: Kit) -> None:
    """JetStream: "rollup value invalid"."""
    with pytest.raises(InvalidArgumentError) as info:
        pub(kit.stream(allow_rollup_hdrs=True), headers={HDR_ROLLUP: "some"})
    assert info.value.field == HDR_ROLLUP


def test_message_ttl_expires_by_entry_time(kit: Kit) -> None:
    """Nats-TTL (allow_msg_ttl): the message goes once its TTL passes, as of an entry's
    time; the field and the header are equivalent."""
    s = kit.stream(allow_msg_ttl=True)
    pub(s, headers={HDR_TTL: "2s"})
    pub(s, ttl_ns=5 * SECOND)
    pub(s)
    assert s.apply(Expire(ts_ns=T0 + 2 * SECOND - 1)) == Expired(expired=0)
    assert s.apply(Expire(ts_ns=T0 + 2 * SECOND)) == Expired(expired=1)
    pub(s, t=T0 + 5 * SECOND)  # expiry also runs before a publish
    assert seqs(s) == [3, 4]


def test_message_ttl_needs_allow_msg_ttl(kit: Kit) -> None:
    """JetStream: "per-message TTL is disabled" unless allow_msg_ttl."""
    s = kit.stream()
    for kw in ({"ttl_ns": 5 * SECOND}, {"headers": {HDR_TTL: "5s"}}):
        with pytest.raises(PreconditionError) as info:
            pub(s, **kw)
        assert info.value.details["rule"] == "allow_msg_ttl"


@pytest.mark.parametrize(
    "text,ns",
    [("1s", SECOND), ("60", 60 * SECOND), ("1m30s", 90 * SECOND), ("1.5s", 3 * SECOND // 2)],
)
def test_ttl_header_formats(text: str, ns: int) -> None:
    """Nats-TTL is a Go duration or whole seconds."""
    assert parse_ttl(text) == ns


@pytest.mark.parametrize(
    "text", ["500ms", "0", "-1s", "soon", "never", "²", "101y", "99999999999999999999", "876001h"]
)
def test_ttl_header_invalid(text: str) -> None:
    """JetStream: a TTL under one second is invalid; 'never' is not supported here yet;
    beyond 100 years the deadline would not fit the store."""
    with pytest.raises(InvalidArgumentError) as info:
        parse_ttl(text)
    assert info.value.field == HDR_TTL


def test_max_age_expires_by_entry_time(kit: Kit) -> None:
    """max_age: messages older than max_age at the entry's time are removed before the new
    message is stored; an Expire entry does it without a publish."""
    s = kit.stream(max_age=10 * SECOND)
    pub(s)
    pub(s, t=T0 + 5 * SECOND)
    pub(s, t=T0 + 10 * SECOND)
    assert seqs(s) == [2, 3]
    assert s.apply(Expire(ts_ns=T0 + 15 * SECOND)) == Expired(expired=1)
    assert seqs(s) == [3]


@pytest.mark.parametrize("batched", [False, True], ids=["alone", "in-caller-transaction"])
def test_refused_entry_still_expires_and_writes_nothing_else(kit: Kit, batched: bool) -> None:
    """Expiry is due by the entry's time whatever the entry's fate: a refused publish
    removes what max_age says is gone and stores nothing, alone or batched by the caller."""
    s = kit.stream(max_age=10 * SECOND)
    pub(s)
    pub(s, t=T0 + 5 * SECOND)
    late = Publish(ts_ns=T0 + 11 * SECOND, subject="s.a", expected_last_seq=99)
    if batched:
        with s.store.transaction(), pytest.raises(ExpectedLastSeqError):
            s.apply(late)
    else:
        with pytest.raises(ExpectedLastSeqError):
            s.apply(late)
    assert seqs(s) == [2]
    assert s.store.state().last_seq == 2
    assert s.apply(Expire(ts_ns=T0 + 11 * SECOND)) == Expired(expired=0)


def test_max_msg_size_counts_headers_and_payload(kit: Kit) -> None:
    """max_msg_size: header + payload bytes above the limit are refused."""
    s = kit.stream(max_msg_size=10)
    assert pub(s, data=b"0123456789").seq == 1
    with pytest.raises(LimitError):
        pub(s, data=b"01234567890")
    with pytest.raises(LimitError):
        pub(s, data=b"01234", headers={"k": "vvvvv"})
    assert seqs(s) == [1]


def test_limits_discard_old_and_new(kit: Kit) -> None:
    """max_msgs with discard old drops the oldest; with discard new refuses the new one."""
    old = kit.stream(max_msgs=2)
    for _ in range(3):
        pub(old)
    assert seqs(old) == [2, 3]
    new = kit.stream(name="N", max_msgs=2, discard=DiscardPolicy.NEW)
    pub(new)
    pub(new)
    with pytest.raises(LimitError):
        pub(new)
    assert seqs(new) == [1, 2]


# -- delete, purge, sealed, deny -------------------------------------------------------------


def test_delete_msg(kit: Kit) -> None:
    """Deleting a stored message removes it; an absent one is NOT_FOUND."""
    s = kit.stream()
    pub(s)
    pub(s)
    assert s.apply(DeleteMsg(ts_ns=T0, seq=1)) == MsgDeleted(seq=1)
    assert seqs(s) == [2]
    with pytest.raises(NotFoundError):
        s.apply(DeleteMsg(ts_ns=T0, seq=1, no_erase=True))
    with pytest.raises(InvalidArgumentError):
        s.apply(DeleteMsg(ts_ns=T0, seq=0))


def test_purge_forms(kit: Kit) -> None:
    """JetStream purge request: by subject filter, keep the newest N, below a sequence,
    or everything; seq and keep together are refused."""
    s = kit.stream()
    for subject in ("s.a", "s.b", "s.a", "s.b", "s.a"):
        pub(s, subject)
    assert s.apply(Purge(ts_ns=T0, subject="s.a", keep=1)) == Purged(purged=2)
    assert seqs(s) == [2, 4, 5]
    assert s.apply(Purge(ts_ns=T0, seq=4)) == Purged(purged=1)
    with pytest.raises(InvalidArgumentError):
        s.apply(Purge(ts_ns=T0, seq=5, keep=1))
    assert s.apply(Purge(ts_ns=T0)) == Purged(purged=2)
    assert s.store.state().msgs == 0


def test_sealed_refuses_publish_delete_purge(kit: Kit) -> None:
    """A sealed stream refuses publishes, deletes and purges."""
    s = kit.stream()
    pub(s)
    s.apply(UpdateConfig(ts_ns=T0, config=StreamConfig(name="S", subjects=("s.>",), sealed=True)))
    for entry in (
        Publish(ts_ns=T0, subject="s.a"),
        DeleteMsg(ts_ns=T0, seq=1),
        Purge(ts_ns=T0),
    ):
        with pytest.raises(PreconditionError) as info:
            s.apply(entry)
        assert info.value.details["rule"] == "sealed"
    assert seqs(s) == [1]


def test_deny_delete_and_deny_purge(kit: Kit) -> None:
    """deny_delete refuses message deletes; deny_purge refuses purges."""
    s = kit.stream(deny_delete=True, deny_purge=True)
    pub(s)
    with pytest.raises(PreconditionError) as info:
        s.apply(DeleteMsg(ts_ns=T0, seq=1))
    assert info.value.details["rule"] == "deny_delete"
    with pytest.raises(PreconditionError) as info:
        s.apply(Purge(ts_ns=T0))
    assert info.value.details["rule"] == "deny_purge"
    assert seqs(s) == [1]


# -- config updates --------------------------------------------------------------------------


def test_update_applies_new_limits_at_once(kit: Kit) -> None:
    """A stream update that lowers max_msgs trims the stream immediately."""
    s = kit.stream()
    for _ in range(5):
        pub(s)
    cfg = StreamConfig(name="S", subjects=("s.>",), max_msgs=2)
    result = s.apply(UpdateConfig(ts_ns=T0, config=cfg))
    assert result == ConfigUpdated(config=cfg.validate())
    assert seqs(s) == [4, 5]


def test_update_of_subjects_and_transform_applies_to_the_next_publish(kit: Kit) -> None:
    """A stream update that changes ``subjects`` or ``subject_transform`` governs the very
    next publish: a subject captured before and dropped now is refused, a new one is
    captured, and the new transform (or none) decides the stored subject."""
    s = kit.stream(subject_transform=SubjectTransform(src="s.*", dest="t.$1"))
    assert pub(s, "s.a").seq == 1 and s.store.load(1).subject == "t.a"
    cfg = StreamConfig(
        name="S",
        subjects=("s.>", "u.>"),
        subject_transform=SubjectTransform(src="s.*", dest="v.$1"),
    )
    s.apply(UpdateConfig(ts_ns=T0, config=cfg))
    assert pub(s, "s.a").seq == 2 and s.store.load(2).subject == "v.a"
    assert pub(s, "u.a").seq == 3
    s.apply(UpdateConfig(ts_ns=T0, config=StreamConfig(name="S", subjects=("u.>",))))
    with pytest.raises(InvalidArgumentError):
        pub(s, "s.a")
    assert pub(s, "u.a").seq == 4 and s.store.load(4).subject == "u.a"


def test_many_distinct_subjects_stay_captured(kit: Kit) -> None:
    """More distinct subjects than the stream's per-config subject cache holds: every one
    is still captured and stored under its own subject (the cache only saves work)."""
    s = kit.stream()
    n = 5000
    with s.store.transaction():
        for i in range(n):
            assert pub(s, f"s.k{i}", t=T0 + i).seq == i + 1
    assert s.store.state().num_subjects == n
    assert s.store.load(n).subject == f"s.k{n - 1}"
    with pytest.raises(InvalidArgumentError):
        pub(s, "t.k1")


def test_publish_options_without_headers() -> None:
    """A publish without headers: its fields are its options; empty strings are unset and a
    TTL is still checked (the common case with at most a msg id takes a shortcut)."""
    assert publish_options(Publish(ts_ns=T0, subject="s.a")) == PublishOptions()
    assert publish_options(Publish(ts_ns=T0, subject="s.a", msg_id="")) == PublishOptions()
    got = publish_options(Publish(ts_ns=T0, subject="s.a", msg_id="m1"))
    assert got == PublishOptions(msg_id="m1")
    got = publish_options(Publish(ts_ns=T0, subject="s.a", msg_id="m1", expected_stream=""))
    assert got == PublishOptions(msg_id="m1")
    got = publish_options(Publish(ts_ns=T0, subject="s.a", expected_last_seq=0))
    assert got == PublishOptions(expected_last_seq=0)
    with pytest.raises(InvalidArgumentError):
        publish_options(Publish(ts_ns=T0, subject="s.a", ttl_ns=1))


def test_update_refused_leaves_config_unchanged(kit: Kit) -> None:
    """An update breaking checkStreamUpdate's rules changes nothing."""
    s = kit.stream()
    before = s.config
    with pytest.raises(InvalidArgumentError):
        s.apply(UpdateConfig(ts_ns=T0, config=StreamConfig(name="S", storage=StorageType.MEMORY)))
    assert s.config == before


def test_update_growing_duplicate_window(kit: Kit) -> None:
    """After the window grows, ids still recorded deduplicate within the new window; ids
    that had expired under the old window stay expired (JetStream does not bring them
    back), identically on a replica that reopens its store after the update."""
    s = kit.stream(duplicate_window=2 * SECOND)
    pub(s, msg_id="m0")
    pub(s, msg_id="m1", t=T0 + 5 * SECOND)  # m0 expires at this entry
    wider = StreamConfig(name="S", subjects=("s.>",), duplicate_window=60 * SECOND)
    s.apply(UpdateConfig(ts_ns=T0 + 6 * SECOND, config=wider))
    s = kit.reopen(s)
    assert pub(s, msg_id="m1", t=T0 + 9 * SECOND) == PubAck(stream="S", seq=2, duplicate=True)
    assert pub(s, msg_id="m0", t=T0 + 9 * SECOND) == PubAck(stream="S", seq=3)


# -- retention hook --------------------------------------------------------------------------


def test_interest_without_consumers_stores_nothing(kit: Kit) -> None:
    """Interest retention with no interested consumer: the sequence is used and acked but
    the message is not kept (JetStream skips it)."""
    s = kit.stream(retention=RetentionPolicy.INTEREST)
    assert pub(s) == PubAck(stream="S", seq=1)
    assert pub(s) == PubAck(stream="S", seq=2)
    state = s.store.state()
    assert state.msgs == 0 and state.last_seq == 2


def test_interest_stores_what_consumers_want(kit: Kit) -> None:
    """RetentionPolicyHook.has_interest decides, per subject, on interest streams."""
    s = kit.stream(retention=RetentionPolicy.INTEREST, hook=Consumers(c1="s.a"))
    pub(s, "s.a")
    pub(s, "s.b")
    pub(s, "s.a")
    assert seqs(s) == [1, 3]


def test_interest_message_removed_when_every_interested_consumer_acked(kit: Kit) -> None:
    """Interest retention: a message goes once all consumers whose filter matches it acked."""
    hook = Consumers(c1="s.*", c2="s.a")
    s = kit.stream(retention=RetentionPolicy.INTEREST, hook=hook)
    pub(s, "s.a")
    pub(s, "s.b")
    hook.ack("c1", 1)
    assert not s.release(1)
    hook.ack("c2", 1)
    assert s.release(1)
    hook.ack("c1", 2)
    assert s.release(2)
    assert seqs(s) == []
    assert not s.release(2)  # already gone: harmless


def test_sweep_after_last_interested_consumer_goes(kit: Kit) -> None:
    """Deleting the last interested consumer releases its holds (JetStream
    checkInterestState)."""
    hook = Consumers(c1="s.a", c2="s.b")
    s = kit.stream(retention=RetentionPolicy.INTEREST, hook=hook)
    pub(s, "s.a")
    pub(s, "s.b")
    del hook.filters["c1"]
    assert s.sweep_interest() == 1
    assert seqs(s) == [2]


def test_workqueue_keeps_until_acked(kit: Kit) -> None:
    """Workqueue retention stores without consumers and removes a message once acked."""
    hook = Consumers()
    s = kit.stream(retention=RetentionPolicy.WORKQUEUE, hook=hook)
    pub(s)
    pub(s)
    assert s.sweep_interest() == 0  # no consumer: messages wait for one
    hook.filters["w"] = ">"
    hook.acked["w"] = set()
    assert not s.release(1)
    hook.ack("w", 1)
    assert s.release(1)
    assert seqs(s) == [2]


def test_skipped_interest_sequence_counts_as_last_sequence(kit: Kit) -> None:
    """JetStream's last sequence includes a sequence used by a publish nobody wanted, so
    Nats-Expected-Last-Sequence sees it."""
    s = kit.stream(retention=RetentionPolicy.INTEREST, hook=Consumers(c="s.a"))
    pub(s, "s.b")
    with pytest.raises(ExpectedLastSeqError):
        pub(s, "s.a", expected_last_seq=0)
    assert pub(s, "s.a", expected_last_seq=1).seq == 2


def test_sealed_stream_keeps_acked_messages(kit: Kit) -> None:
    """A sealed stream removes nothing: not by delete, purge or age, nor by acks."""
    hook = Consumers(c="s.>")
    s = kit.stream(retention=RetentionPolicy.INTEREST, hook=hook)
    pub(s)
    sealed = StreamConfig(
        name="S", subjects=("s.>",), retention=RetentionPolicy.INTEREST, sealed=True
    )
    s.apply(UpdateConfig(ts_ns=T0, config=sealed))
    hook.ack("c", 1)
    assert not s.release(1)
    del hook.filters["c"]
    assert s.sweep_interest() == 0
    assert seqs(s) == [1]


def test_limits_retention_ignores_acks(kit: Kit) -> None:
    """Limits retention: acknowledgements never remove messages."""
    hook = Consumers(c="s.>")
    s = kit.stream(hook=hook)
    pub(s)
    hook.ack("c", 1)
    assert not s.release(1)
    assert seqs(s) == [1]


# -- encoding --------------------------------------------------------------------------------

texts = st.text(max_size=12)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
publishes = st.builds(
    Publish,
    ts_ns=i64,
    subject=texts,
    data=st.binary(max_size=64),
    headers=st.dictionaries(texts, texts, max_size=3),
    msg_id=st.none() | texts,
    expected_stream=st.none() | texts,
    expected_last_seq=st.none() | u64,
    expected_last_subject_seq=st.none() | u64,
    expected_last_subject_seq_subject=st.none() | texts,
    expected_last_msg_id=st.none() | texts,
    ttl_ns=st.none() | i64,
)
entries: st.SearchStrategy[Entry] = st.one_of(
    publishes,
    st.builds(DeleteMsg, ts_ns=i64, seq=u64, no_erase=st.booleans()),
    st.builds(
        Purge, ts_ns=i64, subject=st.none() | texts, seq=st.none() | u64, keep=st.none() | u64
    ),
    st.builds(Expire, ts_ns=i64),
    st.builds(
        UpdateConfig,
        ts_ns=i64,
        config=st.builds(
            StreamConfig,
            name=texts,
            subjects=st.lists(texts, max_size=2).map(tuple),
            max_msgs=st.integers(-5, 100),
            metadata=st.dictionaries(texts, texts, max_size=2),
            sealed=st.booleans(),
        ),
    ),
)


@settings(max_examples=150)
@given(entries)
def test_encode_decode_round_trip(entry: Entry) -> None:
    """Every entry reads back equal from its bytes."""
    assert decode(encode(entry)) == entry


@settings(max_examples=60)
@given(entries, st.data())
def test_decode_refuses_truncated_or_padded_bytes(entry: Entry, data: st.DataObject) -> None:
    """A log entry is read exactly or not at all: any cut or extra byte is DATA_LOSS."""
    raw = encode(entry)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(RaftStreamError) as info:
        decode(raw[:cut])
    assert info.value.reason == "DATA_LOSS"
    with pytest.raises(RaftStreamError):
        decode(raw + b"\x00")


@settings(max_examples=40)
@given(st.lists(entries, min_size=1, max_size=5))
def test_batch_round_trip(batch: list[Entry]) -> None:
    """A batch of entries (one Raft entry) reads back as the same entries in order; a single
    entry reads as a batch of one, so a log may mix both."""
    assert decode_batch(encode_batch(batch)) == batch
    assert decode_batch(encode(batch[0])) == [batch[0]]


def test_batch_is_not_a_single_entry() -> None:
    """decode refuses a batch rather than reading its first entry; batches are never empty."""
    raw = encode_batch([Expire(ts_ns=1), Expire(ts_ns=2)])
    with pytest.raises(RaftStreamError) as info:
        decode(raw)
    assert info.value.reason == "DATA_LOSS"
    with pytest.raises(RaftStreamError):
        decode_batch(raw[:-1])
    with pytest.raises(InvalidArgumentError):
        encode_batch([])


@pytest.mark.parametrize("index,value", [(0, 2), (1, 99)], ids=["version", "kind"])
def test_decode_refuses_unknown_version_and_kind(index: int, value: int) -> None:
    """The format is versioned: an unknown version or entry kind is refused, not guessed."""
    raw = bytearray(encode(Expire(ts_ns=1)))
    raw[index] = value
    with pytest.raises(RaftStreamError) as info:
        decode(bytes(raw))
    assert info.value.reason == "DATA_LOSS"


# -- determinism -----------------------------------------------------------------------------

DET_CONFIG = StreamConfig(
    name="D",
    subjects=("s.>",),
    max_msgs=8,
    max_msgs_per_subject=3,
    max_age=20 * SECOND,
    duplicate_window=6 * SECOND,
    allow_rollup_hdrs=True,
    allow_msg_ttl=True,
)


def rarely(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """None three times out of four: most publishes carry no precondition."""
    return st.sampled_from([False, False, False, True]).flatmap(
        lambda on: strategy if on else st.none()
    )


@st.composite
def entry_logs(draw: st.DrawFn) -> list[Entry]:
    """A leader's log: mostly publishes with ids, preconditions and rollups, some deletes,
    purges, expiries and config changes; time mostly moves forward, sometimes back."""
    t = T0
    log: list[Entry] = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.integers(-SECOND, 3 * SECOND))
        kind = draw(st.sampled_from(["pub"] * 6 + ["del", "purge", "expire", "update"]))
        if kind == "pub":
            headers = draw(st.sampled_from([{}, {HDR_ROLLUP: "sub"}, {HDR_TTL: "2s"}]))
            log.append(
                Publish(
                    ts_ns=t,
                    subject=draw(st.sampled_from(["s.a", "s.b", "s.c", "t.x"])),
                    data=draw(st.binary(max_size=8)),
                    headers=headers,
                    msg_id=draw(st.none() | st.sampled_from(["m1", "m2", "m3", "m4"])),
                    expected_last_seq=draw(rarely(st.integers(0, 10))),
                    expected_last_subject_seq=draw(rarely(st.integers(0, 10))),
                    expected_last_msg_id=draw(rarely(st.sampled_from(["m1", "m2"]))),
                )
            )
        elif kind == "del":
            log.append(DeleteMsg(ts_ns=t, seq=draw(st.integers(0, 12))))
        elif kind == "purge":
            subject = draw(st.none() | st.just("s.a"))
            if draw(st.booleans()):
                log.append(Purge(ts_ns=t, subject=subject, keep=1))
            else:
                log.append(Purge(ts_ns=t, subject=subject, seq=draw(st.integers(1, 12))))
        elif kind == "expire":
            log.append(Expire(ts_ns=t))
        else:
            window = draw(st.integers(1, 10)) * SECOND
            cfg = StreamConfig.from_dict({**DET_CONFIG.to_dict(), "duplicate_window": window})
            log.append(UpdateConfig(ts_ns=t, config=cfg))
    return log


def outcome(s: Stream, raw: bytes) -> object:
    try:
        return s.apply(decode(raw))
    except RaftStreamError as err:
        return (type(err).__name__, str(err))


def snapshot(s: Stream) -> tuple[object, ...]:
    """Everything replicated: counters, messages, dedup records (in expiry order), config."""
    st_ = s.store.state()
    msgs = [
        (m.seq, m.subject, m.data, m.ts, dict(m.headers), m.ttl_ns) for m in s.store.iter_from(1)
    ]
    dedup = list(s.store.dedup_iter())
    return (st_.first_seq, st_.last_seq, st_.msgs, st_.bytes, st_.last_ts, msgs, dedup, s.config)


@settings(max_examples=40)
@given(entry_logs(), st.integers(1, 8))
def test_two_replicas_apply_the_same_log_identically(log: list[Entry], restart_every: int) -> None:
    """Replicated state machine: two replicas applying the same encoded entries produce the
    same results and errors and end in the same state (dedup records included), also when
    one of them reopens its stream every few entries."""
    raws = [encode(e) for e in log]
    a = Stream(DET_CONFIG, MemoryStreamStore())
    b = Stream(DET_CONFIG, MemoryStreamStore())
    for i, raw in enumerate(raws):
        if i and i % restart_every == 0:
            b = Stream(b.config, b.store)
        assert outcome(a, raw) == outcome(b, raw), f"entry {i}: {log[i]}"
    assert snapshot(a) == snapshot(b)


@settings(max_examples=30)
@given(entry_logs(), st.integers(1, 8))
def test_batched_apply_agrees_with_one_by_one(log: list[Entry], batch_size: int) -> None:
    """A replica that applies entries in batches inside one store transaction (as the node
    does, one fsync per batch) answers and ends like one that applies them one by one:
    a refused entry changes the same things (only expiry) either way."""
    raws = [encode(e) for e in log]
    single = Stream(DET_CONFIG, MemoryStreamStore())
    batched = Stream(DET_CONFIG, MemoryStreamStore())
    expected = [outcome(single, r) for r in raws]
    got: list[object] = []
    for start in range(0, len(raws), batch_size):
        with batched.store.transaction():
            got.extend(outcome(batched, r) for r in raws[start : start + batch_size])
    assert got == expected
    assert snapshot(batched) == snapshot(single)


@pytest.fixture(scope="module")
def lmdb_module() -> Any:
    return pytest.importorskip("raftstream.engine.lmdbstore")


@settings(max_examples=20)
@given(entry_logs(), st.integers(2, 8))
def test_batched_lmdb_replica_agrees_with_memory_replica(
    lmdb_module: Any, log: list[Entry], batch_size: int
) -> None:
    """The node's way of applying: several entries in one LMDB write transaction (reads
    inside it see the batch's earlier appends) gives the same answers and state as a memory
    replica applying them one by one."""
    raws = [encode(e) for e in log]
    mem = Stream(DET_CONFIG, MemoryStreamStore())
    expected = [outcome(mem, r) for r in raws]
    with tempfile.TemporaryDirectory() as tmp:
        env = lmdb_module.open_node_env(Path(tmp) / "node", map_size_bytes=64 * 1024 * 1024)
        try:
            disk = Stream(DET_CONFIG, lmdb_module.LmdbStreamStore(env, "D"))
            got: list[object] = []
            for start in range(0, len(raws), batch_size):
                with disk.store.transaction():
                    got.extend(outcome(disk, r) for r in raws[start : start + batch_size])
            assert got == expected
            assert snapshot(disk) == snapshot(mem)
        finally:
            env.close()


def _lmdb_replica(mod: Any, path: Path) -> Iterator[Stream]:
    """An LMDB-backed replica that restarts (closes and reopens its environment) whenever
    the caller asks for the next Stream."""
    env = mod.open_node_env(path, map_size_bytes=64 * 1024 * 1024)
    try:
        stream = Stream(DET_CONFIG, mod.LmdbStreamStore(env, "D"))
        while True:
            yield stream
            config = stream.config
            env.close()
            env = mod.open_node_env(path, map_size_bytes=64 * 1024 * 1024)
            stream = Stream(config, mod.LmdbStreamStore(env, "D"))
    finally:
        env.close()


@settings(max_examples=20)
@given(entry_logs(), st.integers(1, 8))
def test_restarted_lmdb_replica_agrees_with_memory_replica(
    lmdb_module: Any, log: list[Entry], restart_every: int
) -> None:
    """Determinism across restarts and stores: an LMDB replica that restarts every few
    entries (reading its dedup records from disk) answers and ends exactly like a memory
    replica that never restarted."""
    raws = [encode(e) for e in log]
    mem = Stream(DET_CONFIG, MemoryStreamStore())
    with tempfile.TemporaryDirectory() as tmp:
        replica = _lmdb_replica(lmdb_module, Path(tmp) / "node")
        disk = next(replica)
        for i, raw in enumerate(raws):
            if i and i % restart_every == 0:
                disk = next(replica)
            assert outcome(disk, raw) == outcome(mem, raw), f"entry {i}: {log[i]}"
        assert snapshot(disk) == snapshot(mem)
        replica.close()
