"""StreamConfig: JetStream's field names, defaults and rules; update and overlap rules.

Each test names the JetStream behaviour it pins (nats-server ``stream.go``:
``setStreamConfigDefaults``, ``checkStreamCfg``, ``checkStreamUpdate``, subject transforms in
``subject_transform.go``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.engine.store import UNLIMITED, DiscardPolicy, StoreLimits
from raftstream.engine.stream_config import (
    DUPLICATE_WINDOW_DEFAULT_NS,
    METADATA_BYTES_MAX,
    PLACEMENT_TAGS_MAX,
    Placement,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
    check_create,
    check_no_overlap,
    check_update,
    store_limits,
)
from raftstream.errors import InvalidArgumentError

SECOND = 1_000_000_000
MINUTE = 60 * SECOND


def invalid(field: str, **kwargs: Any) -> InvalidArgumentError:
    """Validate a config that must be refused; return the error (its field is checked)."""
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig(**kwargs).validate()
    assert info.value.field == field, info.value
    return info.value


# -- defaults --------------------------------------------------------------------------------


def test_defaults_match_jetstream() -> None:
    """setStreamConfigDefaults: subjects default to the stream name, limits to -1, one
    replica, file storage, limits retention, discard old, a 2-minute duplicate window."""
    cfg = StreamConfig(name="ORDERS").validate()
    assert cfg.subjects == ("ORDERS",)
    assert cfg.retention is RetentionPolicy.LIMITS
    assert cfg.storage is StorageType.FILE
    assert cfg.discard is DiscardPolicy.OLD
    assert cfg.num_replicas == 1
    assert cfg.duplicate_window == DUPLICATE_WINDOW_DEFAULT_NS == 2 * MINUTE
    assert cfg.max_age == 0
    for name in ("max_consumers", "max_msgs", "max_bytes", "max_msgs_per_subject"):
        assert getattr(cfg, name) == UNLIMITED
    assert cfg.max_msg_size == UNLIMITED
    assert not (cfg.sealed or cfg.deny_delete or cfg.deny_purge or cfg.allow_rollup_hdrs)


def test_zero_limits_mean_unlimited() -> None:
    """JetStream normalises 0 to -1 for max_msgs, max_bytes, max_msgs_per_subject,
    max_msg_size and max_consumers, and 0 replicas to 1."""
    cfg = StreamConfig(
        name="S",
        max_msgs=0,
        max_bytes=0,
        max_msgs_per_subject=0,
        max_msg_size=0,
        max_consumers=0,
        num_replicas=0,
    ).validate()
    assert (cfg.max_msgs, cfg.max_bytes, cfg.max_msgs_per_subject) == (-1, -1, -1)
    assert (cfg.max_msg_size, cfg.max_consumers, cfg.num_replicas) == (-1, -1, 1)


def test_duplicate_window_defaults_to_max_age_when_shorter() -> None:
    """JetStream: with max_age below 2 minutes, the default duplicate window is max_age."""
    assert StreamConfig(name="S", max_age=30 * SECOND).validate().duplicate_window == 30 * SECOND
    assert StreamConfig(name="S", max_age=10 * MINUTE).validate().duplicate_window == 2 * MINUTE


def test_explicit_subjects_are_kept() -> None:
    """A stream captures exactly the subjects it lists (the name is only the default)."""
    assert StreamConfig(name="S", subjects=("a.*", "b.>")).validate().subjects == ("a.*", "b.>")


# -- name ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "a b", "a\tb", "a.b", "a*", "a>", "a/b", "a\\b", "x\x00", "n" * 256],
    ids=["empty", "space", "tab", "dot", "star", "gt", "slash", "backslash", "nul", "256"],
)
def test_name_rules(name: str) -> None:
    """isValidName: non-empty, no whitespace, '.', '*', '>'; no path separators (names are
    directories); at most 255 bytes (JSMaxNameLen)."""
    invalid("name", name=name)


@pytest.mark.parametrize("name", ["ORDERS", "orders-v2_x", "n" * 255, "€uro"])
def test_valid_names(name: str) -> None:
    """Dashes, underscores, non-ASCII letters and 255 bytes are fine."""
    assert StreamConfig(name=name, subjects=("x",)).validate().name == name


# -- subjects --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "subjects",
    [("a..b",), ("a b",), ("a.>.b",), ("$JS.API.>",), ("a*",)],
    ids=["empty-token", "space", "gt-middle", "reserved", "partial-wildcard"],
)
def test_each_subject_must_be_valid(subjects: tuple[str, ...]) -> None:
    """checkStreamCfg: every subject is a valid filter outside the reserved $JS API space."""
    invalid("subjects", name="S", subjects=subjects)


def test_duplicate_subjects_are_refused() -> None:
    """checkStreamCfg: "duplicate subjects detected"."""
    err = invalid("subjects", name="S", subjects=("a.b", "a.b"))
    assert "duplicate" in err.rule


@pytest.mark.parametrize("pair", [("a.*", "a.b"), ("a.>", "a.b.c"), ("*.b", "a.*"), (">", "x")])
def test_overlapping_subjects_within_a_stream_are_refused(pair: tuple[str, str]) -> None:
    """checkStreamCfg: "subjects overlap" — no message may match two of a stream's subjects."""
    err = invalid("subjects", name="S", subjects=pair)
    assert "overlap" in err.rule


def test_disjoint_subjects_are_accepted() -> None:
    StreamConfig(name="S", subjects=("a.*", "a.b.c", "b.>")).validate()


# -- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["max_consumers", "max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size"]
)
def test_count_limits_below_minus_one_are_refused(field: str) -> None:
    """-1 means unlimited; anything more negative is an error."""
    invalid(field, name="S", **{field: -2})
    assert getattr(StreamConfig(name="S", **{field: 7}).validate(), field) == 7


def test_max_msg_size_fits_int32() -> None:
    """JetStream keeps max_msg_size in an int32."""
    invalid("max_msg_size", name="S", max_msg_size=2**31)


def test_max_age_rules() -> None:
    """checkStreamCfg: max_age >= 0 (0 = no limit) and, when set, >= 100ms."""
    invalid("max_age", name="S", max_age=-1)
    invalid("max_age", name="S", max_age=99_999_999)
    assert StreamConfig(name="S", max_age=100_000_000).validate().max_age == 100_000_000


def test_duplicate_window_rules() -> None:
    """checkStreamCfg: the window is not negative and never larger than max_age."""
    invalid("duplicate_window", name="S", duplicate_window=-1)
    invalid("duplicate_window", name="S", max_age=MINUTE, duplicate_window=MINUTE + 1)
    cfg = StreamConfig(name="S", max_age=MINUTE, duplicate_window=MINUTE).validate()
    assert cfg.duplicate_window == MINUTE


def test_discard_new_per_subject_needs_discard_new() -> None:
    """checkStreamCfg: "discard new per subject requires discard new policy to be set"."""
    invalid(
        "discard_new_per_subject", name="S", discard_new_per_subject=True, max_msgs_per_subject=1
    )


def test_discard_new_per_subject_needs_max_msgs_per_subject() -> None:
    """checkStreamCfg: "discard new per subject requires max msgs per subject > 0"."""
    invalid(
        "discard_new_per_subject",
        name="S",
        discard_new_per_subject=True,
        discard=DiscardPolicy.NEW,
    )
    StreamConfig(
        name="S", discard_new_per_subject=True, discard=DiscardPolicy.NEW, max_msgs_per_subject=1
    ).validate()


@pytest.mark.parametrize("replicas,ok", [(1, True), (3, True), (5, True), (6, False), (-1, False)])
def test_num_replicas_one_to_five(replicas: int, ok: bool) -> None:
    """StreamMaxReplicas is 5; negative counts are refused."""
    if ok:
        assert StreamConfig(name="S", num_replicas=replicas).validate().num_replicas == replicas
    else:
        invalid("num_replicas", name="S", num_replicas=replicas)


def test_first_seq_not_negative() -> None:
    """first_seq is an unsigned sequence."""
    invalid("first_seq", name="S", first_seq=-1)


def test_description_length_limit() -> None:
    """JSMaxDescriptionLen: 4 KiB."""
    StreamConfig(name="S", description="d" * 4096).validate()
    invalid("description", name="S", description="d" * 4097)


def test_metadata_size_limit() -> None:
    """JSMaxMetadataLen: keys and values total at most 128 KiB."""
    StreamConfig(name="S", metadata={"k": "v" * (METADATA_BYTES_MAX - 1)}).validate()
    invalid("metadata", name="S", metadata={"k": "v" * METADATA_BYTES_MAX})


def test_rollup_requires_purge_permission() -> None:
    """checkStreamCfg: "roll-ups require the purge permission"."""
    err = invalid("allow_rollup_hdrs", name="S", allow_rollup_hdrs=True, deny_purge=True)
    assert "purge" in err.rule


def test_sealing_implies_jetstream_sealed_settings() -> None:
    """JetStream on seal: no age limit, discard new, deny delete and purge, no rollups."""
    cfg = StreamConfig(name="S", sealed=True, max_age=MINUTE, allow_rollup_hdrs=True).validate()
    assert cfg.max_age == 0 and cfg.discard is DiscardPolicy.NEW
    assert cfg.deny_delete and cfg.deny_purge and not cfg.allow_rollup_hdrs


def test_a_sealed_streams_limits_cannot_change() -> None:
    """A user review: editing a sealed stream's max_msgs to 1 left 1 of its 5 messages (the
    limit trimmed what sealing keeps and delete refuses). The limits that could remove
    messages are fixed from the update that seals on; the rest may still change, and
    sealing a stream with an age limit (which sealing drops) is no change of them."""
    base = StreamConfig(name="S", subjects=("s.>",), max_msgs=100, max_age=MINUTE)
    sealed = check_update(base, replace(base, sealed=True))
    for name, value in (("max_msgs", 1), ("max_bytes", 1), ("max_msgs_per_subject", 1)):
        for before in (base, sealed):  # sealing and lowering at once, or after
            with pytest.raises(InvalidArgumentError) as info:
                check_update(before, replace(sealed, **{name: value}))
            assert info.value.field == name and "sealed" in info.value.rule
        assert check_update(base, replace(base, **{name: value})).sealed is False
    assert check_update(sealed, replace(sealed, description="kept")).description == "kept"
    assert check_update(sealed, replace(sealed, num_replicas=3)).num_replicas == 3


def test_a_stream_cannot_be_created_sealed() -> None:
    """addStream: "stream configuration for create can not be sealed"."""
    with pytest.raises(InvalidArgumentError) as info:
        check_create(StreamConfig(name="S", sealed=True))
    assert info.value.field == "sealed"
    assert check_create(StreamConfig(name="S")).name == "S"


def test_store_limits_follow_the_config() -> None:
    """The stream hands its limits to the store (max_age in ns as max_age_ns)."""
    cfg = StreamConfig(
        name="S",
        max_msgs=10,
        max_bytes=1000,
        max_msgs_per_subject=2,
        max_msg_size=100,
        max_age=MINUTE,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
    ).validate()
    assert store_limits(cfg) == StoreLimits(
        max_msgs=10,
        max_bytes=1000,
        max_msgs_per_subject=2,
        max_msg_size=100,
        max_age_ns=MINUTE,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
    )


# -- subject transform -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,dest,subject,out",
    [
        ("orders.*.*", "o.$2.$1", "orders.a.b", "o.b.a"),
        ("orders.*.*", "o.{{wildcard(2)}}.{{ Wildcard( 1 ) }}", "orders.a.b", "o.b.a"),
        ("a.>", "b.>", "a.x.y", "b.x.y"),
        ("a.*.>", "b.$1.>", "a.x.y.z", "b.x.y.z"),
        ("", "all.>", "x.y", "all.x.y"),
        ("a.*", "b.$1", "c.d", "c.d"),
        # FNV-1a 32 of "a" is 0xe40c292c (3826002220); 3826002220 % 7 == 5.
        ("p.*", "part.{{partition(7,1)}}", "p.a", "part.5"),
    ],
)
def test_subject_transform_apply(src: str, dest: str, subject: str, out: str) -> None:
    """JetStream mapping: $n and {{wildcard(n)}} reference src's n-th '*', a trailing '>'
    carries what '>' matched, partition hashes with FNV-1a; a non-matching subject is kept.
    An empty src means '>'."""
    t = SubjectTransform(src=src, dest=dest)
    t.validate()
    assert t.apply(subject) == out


@pytest.mark.parametrize(
    "src,dest,field",
    [
        ("a.*", "b.$2", "subject_transform.dest"),
        ("a.*", "b.{{wildcard(0)}}", "subject_transform.dest"),
        ("a.*", "b.{{split(1,-)}}", "subject_transform.dest"),
        ("a.*", "b.{{partition(0,1)}}", "subject_transform.dest"),
        ("a.*", "b.*", "subject_transform.dest"),
        ("a.*", "b.>", "subject_transform.dest"),
        ("a.>", "b.>.c", "subject_transform.dest"),
        ("a.*", "", "subject_transform.dest"),
        ("a.*", "b..c", "subject_transform.dest"),
        ("a.*", "b.{{wildcard(1)", "subject_transform.dest"),
        ("a..b", "x", "subject_transform.src"),
    ],
)
def test_subject_transform_rules(src: str, dest: str, field: str) -> None:
    """Only the supported mapping subset is accepted; indexes must name one of src's '*'
    tokens; '>' in dest only last and only when src ends in '>'; both sides valid."""
    invalid(field, name="S", subject_transform=SubjectTransform(src=src, dest=dest))


def test_partition_stays_in_range() -> None:
    """{{partition(p,...)}} always yields a bucket in [0, p)."""
    t = SubjectTransform(src="p.*.*", dest="q.{{partition(4,1,2)}}")
    buckets = {t.apply(f"p.{i}.{j}") for i in range(20) for j in range(5)}
    assert buckets <= {f"q.{b}" for b in range(4)} and len(buckets) > 1


# -- JSON ------------------------------------------------------------------------------------

names = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij_-0123456789", min_size=1, max_size=20
)
tokens = st.sampled_from(["a", "b", "c", "orders", "x1"])
configs = st.builds(
    StreamConfig,
    name=names,
    description=st.text(max_size=20),
    subjects=st.lists(st.lists(tokens, min_size=1, max_size=3).map(".".join), max_size=3).map(
        tuple
    ),
    retention=st.sampled_from(RetentionPolicy),
    max_msgs=st.integers(-1, 10**12),
    max_bytes=st.integers(-1, 10**15),
    max_age=st.integers(0, 10**15),
    max_msgs_per_subject=st.integers(-1, 100),
    discard=st.sampled_from(DiscardPolicy),
    storage=st.sampled_from(StorageType),
    num_replicas=st.integers(0, 5),
    duplicate_window=st.integers(0, 10**12),
    sealed=st.booleans(),
    deny_delete=st.booleans(),
    allow_msg_ttl=st.booleans(),
    first_seq=st.integers(0, 10**9),
    metadata=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    subject_transform=st.none() | st.just(SubjectTransform(src="a.*", dest="b.$1")),
)


@settings(max_examples=60)
@given(configs)
def test_json_round_trip(cfg: StreamConfig) -> None:
    """to_dict speaks JetStream's JSON names; from_dict reads it back equal."""
    assert StreamConfig.from_dict(cfg.to_dict()) == cfg


@settings(max_examples=60)
@given(configs)
def test_validate_is_idempotent(cfg: StreamConfig) -> None:
    """A validated config validates to itself (the engine may re-validate freely)."""
    try:
        once = cfg.validate()
    except InvalidArgumentError:
        return
    assert once.validate() == once


def test_json_uses_jetstream_names_and_nanoseconds() -> None:
    """JetStream JSON: durations are integers of nanoseconds under max_age/duplicate_window."""
    raw = StreamConfig(name="S", max_age=MINUTE, allow_rollup_hdrs=True).validate().to_dict()
    assert raw["max_age"] == 60_000_000_000
    assert raw["duplicate_window"] == 60_000_000_000
    assert raw["allow_rollup_hdrs"] is True and raw["retention"] == "limits"
    assert raw["subjects"] == ["S"]


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"name": "S", "max_mesages": 1}, "max_mesages"),
        ({"name": "S", "mirror_direct": True}, "mirror_direct"),
        ({"name": "S", "sources": {"name": "O"}}, "sources"),
        ({"name": "S", "max_msgs": True}, "max_msgs"),
        ({"name": "S", "max_msgs": "10"}, "max_msgs"),
        ({"name": "S", "sealed": 1}, "sealed"),
        ({"name": "S", "subjects": "a.b"}, "subjects"),
        ({"name": "S", "retention": "forever"}, "retention"),
        ({"name": "S", "metadata": {"a": 1}}, "metadata"),
        ({"name": "S", "subject_transform": {"src": "a"}}, "subject_transform.dest"),
        ({"name": "S", "subject_transform": {"dest": "a", "x": 1}}, "subject_transform.x"),
        ({"subjects": ["a"]}, "name"),
    ],
)
def test_from_dict_rejects_unknown_keys_and_wrong_types(raw: dict[str, Any], field: str) -> None:
    """Unknown keys, JetStream fields raftstream does not implement and wrong JSON types are
    refused, naming the key."""
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig.from_dict(raw)
    assert info.value.field == field


def test_from_dict_null_is_absent() -> None:
    """JetStream's omitempty: a JSON null reads as the default."""
    cfg = StreamConfig.from_dict({"name": "S", "max_msgs": None, "subject_transform": None})
    assert cfg == StreamConfig(name="S")


# -- updates ---------------------------------------------------------------------------------

BASE = StreamConfig(name="S", subjects=("s.>",))


def _with(cfg: StreamConfig, **change: Any) -> StreamConfig:
    return StreamConfig.from_dict({**cfg.to_dict(), **change})


@pytest.mark.parametrize(
    "change",
    [{"name": "T"}, {"storage": "memory"}, {"max_consumers": 5}, {"first_seq": 10}],
    ids=["name", "storage", "max_consumers", "first_seq"],
)
def test_update_refuses_immutable_fields(change: dict[str, Any]) -> None:
    """checkStreamUpdate: name, storage type, MaxConsumers and first sequence are fixed."""
    with pytest.raises(InvalidArgumentError) as info:
        check_update(BASE, _with(BASE, **change))
    assert info.value.field == next(iter(change))


def test_update_retention_between_limits_and_interest_only() -> None:
    """checkStreamUpdate (2.10+): limits <-> interest is allowed; to or from workqueue is not."""
    interest = check_update(BASE, _with(BASE, retention="interest"))
    assert interest.retention is RetentionPolicy.INTEREST
    assert check_update(interest, BASE).retention is RetentionPolicy.LIMITS
    for old, new in [(BASE, "workqueue"), (_with(BASE, retention="workqueue"), "limits")]:
        with pytest.raises(InvalidArgumentError) as info:
            check_update(old, _with(old, retention=new))
        assert info.value.field == "retention"


@pytest.mark.parametrize("flag", ["sealed", "deny_delete", "deny_purge", "allow_msg_ttl"])
def test_update_one_way_flags(flag: str) -> None:
    """checkStreamUpdate: a stream can be sealed but never unsealed; deny delete/purge
    cannot be cancelled; per-message TTL cannot be disabled once enabled."""
    on = check_update(BASE, _with(BASE, **{flag: True}))
    assert getattr(on, flag) is True
    with pytest.raises(InvalidArgumentError) as info:
        check_update(on, _with(on, **{flag: False}))
    assert info.value.field == flag


def test_update_allows_the_rest() -> None:
    """Subjects, limits, replicas, windows, description, metadata, flags may change."""
    new = _with(
        BASE,
        subjects=["s.>", "t.*"],
        max_msgs=5,
        max_age=10 * MINUTE,
        num_replicas=3,
        duplicate_window=MINUTE,
        description="d",
        metadata={"a": "b"},
        allow_rollup_hdrs=True,
        allow_direct=True,
        discard="new",
        subject_transform={"src": "t.*", "dest": "u.$1"},
    )
    assert check_update(BASE, new) == new.validate()


def test_update_validates_the_new_config() -> None:
    """An update is a config like any other: its own rules hold."""
    with pytest.raises(InvalidArgumentError) as info:
        check_update(BASE, _with(BASE, subjects=["a.*", "a.b"]))
    assert info.value.field == "subjects"


# -- overlap between streams -----------------------------------------------------------------


def test_overlap_with_another_stream_is_refused() -> None:
    """JetStream: "subjects overlap with an existing stream" (names the other stream)."""
    others = [StreamConfig(name="A", subjects=("orders.*",)), StreamConfig(name="B")]
    with pytest.raises(InvalidArgumentError) as info:
        check_no_overlap(StreamConfig(name="C", subjects=("orders.eu",)), others)
    assert info.value.field == "subjects" and "'A'" in info.value.rule
    with pytest.raises(InvalidArgumentError):
        check_no_overlap(StreamConfig(name="C", subjects=("B",)), others)  # B's default subject


def test_overlap_check_skips_the_stream_itself() -> None:
    """An update passes every stream, itself included: its old subjects never conflict."""
    mine = StreamConfig(name="A", subjects=("orders.*",))
    check_no_overlap(mine, [mine, StreamConfig(name="B", subjects=("x.>",))])


# -- placement (the cluster issue) -----------------------------------------------------------


def test_placement_round_trips_through_jetstream_json() -> None:
    """JetStream's ``placement: {cluster, tags}`` is read and written back; tags are a set,
    so their order is normalised and two spellings of one set compare equal."""
    raw = {"name": "ORDERS", "placement": {"cluster": "east", "tags": ["ssd", "az1"]}}
    cfg = StreamConfig.from_dict(raw).validate()
    assert cfg.placement == Placement(cluster="east", tags=("az1", "ssd"))
    assert cfg.to_dict()["placement"] == {"cluster": "east", "tags": ["az1", "ssd"]}
    assert StreamConfig.from_dict(cfg.to_dict()).validate() == cfg
    other = StreamConfig(name="ORDERS", placement=Placement(cluster="east", tags=("ssd", "az1")))
    assert other.validate() == cfg


def test_empty_placement_is_no_placement() -> None:
    """An empty placement constrains nothing: it normalises to None and is not written."""
    cfg = StreamConfig(name="ORDERS", placement=Placement()).validate()
    assert cfg.placement is None
    assert "placement" not in cfg.to_dict()
    assert StreamConfig.from_dict({"name": "ORDERS", "placement": {}}).validate() == cfg


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        (Placement(tags=("ssd", "ssd")), "placement.tags"),
        (Placement(tags=("",)), "placement.tags"),
        (Placement(tags=("a b",)), "placement.tags"),
        (Placement(tags=tuple(f"t{i}" for i in range(PLACEMENT_TAGS_MAX + 1))), "placement.tags"),
        (Placement(cluster=""), "placement.cluster"),
        (Placement(cluster="east\n"), "placement.cluster"),
    ],
)
def test_placement_rules_name_the_field(placement: Placement, field: str) -> None:
    """Tags: non-empty, no whitespace, no duplicates, a bounded count; the cluster likewise."""
    invalid(field, name="ORDERS", placement=placement)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"placement": ["ssd"]}, "placement"),
        ({"placement": {"tags": "ssd"}}, "placement.tags"),
        ({"placement": {"tags": [1]}}, "placement.tags"),
        ({"placement": {"cluster": 3}}, "placement.cluster"),
        ({"placement": {"zone": "a"}}, "placement.zone"),
    ],
)
def test_placement_json_types_are_checked(raw: dict[str, Any], field: str) -> None:
    """from_dict type-checks placement and refuses unknown placement keys, naming them."""
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig.from_dict({"name": "ORDERS", **raw})
    assert info.value.field == field


def test_placement_may_change_on_update() -> None:
    """Placement is not immutable (JetStream moves a stream whose placement changes): the
    meta leader re-places the replicas that no longer qualify."""
    old = StreamConfig(name="ORDERS", placement=Placement(tags=("ssd",)))
    new = StreamConfig(name="ORDERS", placement=Placement(tags=("hdd",)))
    assert check_update(old, new).placement == Placement(tags=("hdd",))


@pytest.mark.parametrize(
    "key",
    [
        "mirror_direct",
        "republish",
        "compression",
        "consumer_limits",
        "no_ack",
        "subject_delete_marker_ttl",
        "template_owner",
    ],
)
def test_unsupported_jetstream_fields_are_refused_in_users_words(key: str) -> None:
    """A JetStream field raftstream does not implement is refused naming the field, in words
    about JetStream and raftstream (never the project's own work items)."""
    with pytest.raises(InvalidArgumentError) as info:
        StreamConfig.from_dict({"name": "S", key: True})
    assert info.value.field == key
    text = str(info.value)
    assert "raftstream" in text and "JetStream" in text
    assert "issue" not in text and "yet" not in text
