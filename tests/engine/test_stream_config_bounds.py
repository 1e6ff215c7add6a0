"""Stream configs: every integer fits what the store packs it in, and every type is checked.

Pins the bad-input review's rule ("bad input gets a clear error naming the field and the
rule, and changes nothing"), problem P1: an integer above int64 in a stream config was
committed and then broke the stream group (``struct.error`` packing the store's meta record,
``engine/lmdbrecords.py``). JetStream refuses such values when its JSON decoder reads them
into int64 fields. Each rule is checked on both paths, ``from_dict`` (JSON) and the
dataclass built in code, and a refusal is always ``InvalidArgumentError`` naming the field:
never ``struct.error``, ``OverflowError``, ``TypeError`` or ``AttributeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.engine.consumer_config import format_rfc3339_ns
from raftstream.engine.entries import TTL_MAX_NS, Publish, UpdateConfig
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.store import TS_NS_MAX
from raftstream.engine.stream import Stream
from raftstream.engine.stream_config import (
    DURATION_MAX_NS,
    INT64_MAX,
    MAX_AGE_MIN_NS,
    Placement,
    RetentionPolicy,
    StreamConfig,
    SubjectTransform,
    check_create,
    check_update,
)
from raftstream.engine.stream_source import StreamSource
from raftstream.errors import InvalidArgumentError

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
INT32_MAX = 2**31 - 1
MAP_BYTES = 64 * 1024 * 1024


def wrong(value: object) -> Any:
    """``value`` as a type checker's Any: these tests pass wrong types on purpose."""
    return value


# A field's value in both spellings: (dataclass kwargs, JSON object), beside name "S".
Spell = Callable[[int], tuple[dict[str, Any], dict[str, Any]]]


def top(name: str) -> Spell:
    return lambda v: ({name: v}, {name: v})


def mirror_seq(v: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"mirror": StreamSource(name="O", opt_start_seq=v)}, {
        "mirror": {"name": "O", "opt_start_seq": v}
    }


def source_time(v: int) -> tuple[dict[str, Any], dict[str, Any]]:
    # The JSON carries a time as RFC 3339, as JetStream writes it.
    text = format_rfc3339_ns(v) if v <= TS_NS_MAX else "2262-04-11T23:47:16.854775808Z"
    return {"sources": (StreamSource(name="O", opt_start_time=v),)}, {
        "sources": [{"name": "O", "opt_start_time": text}]
    }


# field (as the error names it), how to spell it, the values just inside its range, the
# values just outside.
BOUNDS: list[tuple[str, Spell, tuple[int, ...], tuple[int, ...]]] = [
    ("max_msgs", top("max_msgs"), (-1, 1, INT64_MAX), (-2, INT64_MAX + 1)),
    ("max_bytes", top("max_bytes"), (-1, 1, INT64_MAX), (-2, INT64_MAX + 1)),
    (
        "max_msgs_per_subject",
        top("max_msgs_per_subject"),
        (-1, 1, INT64_MAX),
        (-2, INT64_MAX + 1),
    ),
    ("max_consumers", top("max_consumers"), (-1, 1, INT64_MAX), (-2, INT64_MAX + 1)),
    ("max_msg_size", top("max_msg_size"), (-1, 1, INT32_MAX), (-2, INT32_MAX + 1)),
    ("max_age", top("max_age"), (0, MAX_AGE_MIN_NS, DURATION_MAX_NS), (-1, DURATION_MAX_NS + 1)),
    (
        "duplicate_window",
        top("duplicate_window"),
        (0, 1, DURATION_MAX_NS),
        (-1, DURATION_MAX_NS + 1),
    ),
    ("first_seq", top("first_seq"), (0, 1, INT64_MAX), (-1, INT64_MAX + 1)),
    ("num_replicas", top("num_replicas"), (0, 5), (-1, 6)),
    ("mirror.opt_start_seq", mirror_seq, (0, 1, INT64_MAX), (-1, INT64_MAX + 1)),
    ("sources[0].opt_start_time", source_time, (0, 1, TS_NS_MAX), (TS_NS_MAX + 1,)),
]
INSIDE = [(f, spell, v) for f, spell, ok, _ in BOUNDS for v in ok]
OUTSIDE = [(f, spell, v) for f, spell, _, bad in BOUNDS for v in bad]


def both_paths(spell: Spell, value: int) -> list[Callable[[], StreamConfig]]:
    kwargs, raw = spell(value)
    return [
        lambda: StreamConfig(name="S", **kwargs).validate(),
        lambda: check_create(StreamConfig(name="S", **kwargs)),
        lambda: StreamConfig.from_dict({"name": "S", **raw}).validate(),
    ]


def refused(field: str, build: Callable[[], Any]) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        build()
    assert info.value.field == field, info.value
    assert info.value.rule
    return info.value


@pytest.mark.parametrize("field,spell,value", INSIDE, ids=[f"{f}={v}" for f, _, v in INSIDE])
def test_a_value_just_inside_the_range_is_accepted(field: str, spell: Spell, value: int) -> None:
    """The largest (and smallest) value each field allows is accepted on both paths."""
    for build in both_paths(spell, value):
        build()


@pytest.mark.parametrize("field,spell,value", OUTSIDE, ids=[f"{f}={v}" for f, _, v in OUTSIDE])
def test_a_value_just_outside_the_range_is_refused_naming_the_field(
    field: str, spell: Spell, value: int
) -> None:
    """One past each end is refused with InvalidArgumentError naming the field (P1)."""
    for build in both_paths(spell, value):
        refused(field, build)


def test_the_int64_and_duration_rules_say_the_bound() -> None:
    """The message states the rule broken, with the bound, as JetStream users expect."""
    err = refused("max_msgs", lambda: StreamConfig(name="S", max_msgs=2**63).validate())
    assert str(err) == "max_msgs: must be at most 9223372036854775807 (a signed 64-bit integer)"
    err = refused("max_age", lambda: StreamConfig(name="S", max_age=10**23).validate())
    assert f"at most {DURATION_MAX_NS} ns (100 years" in err.rule
    err = refused(
        "mirror.opt_start_time",
        lambda: StreamConfig(
            name="S", mirror=StreamSource(name="O", opt_start_time=TS_NS_MAX + 1)
        ).validate(),
    )
    assert "2262-04-11T23:47:16.854775807Z" in err.rule


def test_duration_ceiling_leaves_room_for_a_timestamp() -> None:
    """DURATION_MAX_NS is chosen so "now + duration" fits the int64 the store keeps times in
    for over a century yet (until the year 2162)."""
    year_2162_ns = 6_000_000_000 * SECOND
    assert year_2162_ns + DURATION_MAX_NS <= TS_NS_MAX
    # One ceiling for every duration: a message's TTL (Nats-TTL) is bounded the same way.
    assert DURATION_MAX_NS == TTL_MAX_NS


INT_FIELDS = [
    "max_msgs",
    "max_bytes",
    "max_msgs_per_subject",
    "max_consumers",
    "max_msg_size",
    "max_age",
    "duplicate_window",
    "first_seq",
    "num_replicas",
]


@settings(max_examples=150)
@given(
    st.sampled_from(INT_FIELDS),
    st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1),
)
def test_any_integer_outside_int64_is_refused(field: str, value: int) -> None:
    """Whatever the field and however far outside int64, the refusal names the field."""
    refused(field, lambda: StreamConfig(name="S", **{field: value}).validate())
    refused(field, lambda: StreamConfig.from_dict({"name": "S", field: value}).validate())


@settings(max_examples=150)
@given(
    st.sampled_from(["max_msgs", "max_bytes", "max_msgs_per_subject", "max_consumers"]),
    st.integers(-1, INT64_MAX),
    st.integers(0, DURATION_MAX_NS),
)
def test_any_count_and_duration_inside_the_range_is_accepted(
    field: str, count: int, window: int
) -> None:
    """Every count in -1..int64 and every duplicate window up to the ceiling is accepted (0
    means unlimited / the default, as in JetStream)."""
    cfg = StreamConfig(name="S", **{field: count}, duplicate_window=window).validate()
    assert getattr(cfg, field) == (count or -1)
    assert StreamConfig.from_dict(cfg.to_dict()).validate() == cfg


# -- types: a config built in code is checked like one read from JSON --------------------------


@pytest.mark.parametrize("name", [f.name for f in fields(StreamConfig)])
def test_every_field_refuses_a_value_of_no_json_type(name: str) -> None:
    """No field escapes the type check: a value of no JSON type is refused naming it, on the
    dataclass path, instead of a TypeError or AttributeError from some rule."""
    kwargs: dict[str, Any] = {"name": "S", name: object()}
    refused(name, lambda: StreamConfig(**kwargs).validate())
    refused(name, lambda: StreamConfig(**kwargs).normalized())


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"max_msgs": "5"}, "max_msgs"),
        ({"max_msgs": True}, "max_msgs"),  # bool is an int in Python, not in JSON
        ({"max_age": 1.5}, "max_age"),
        ({"first_seq": False}, "first_seq"),
        ({"sealed": "no"}, "sealed"),
        ({"deny_purge": 0}, "deny_purge"),
        ({"allow_msg_ttl": "false"}, "allow_msg_ttl"),
        ({"description": 5}, "description"),
        ({"subjects": "a.b"}, "subjects"),
        ({"subjects": ("a", 5)}, "subjects"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"retention": "forever"}, "retention"),
        ({"subject_transform": SubjectTransform(src=wrong(5), dest="x")}, "subject_transform"),
        ({"mirror": {"name": "O"}}, "mirror"),
        ({"sources": ({"name": "O"},)}, "sources[0]"),
        ({"sources": StreamSource(name="O")}, "sources"),
        ({"mirror": StreamSource(name="O", opt_start_seq=wrong("1"))}, "mirror.opt_start_seq"),
        ({"mirror": StreamSource(name="O", opt_start_time=True)}, "mirror.opt_start_time"),
        ({"mirror": StreamSource(name=wrong(5))}, "mirror.name"),
        (
            {"sources": (StreamSource(name="O", filter_subject=wrong(5)),)},
            "sources[0].filter_subject",
        ),
    ],
)
def test_wrong_types_in_code_are_refused_naming_the_field(
    kwargs: dict[str, Any], field: str
) -> None:
    """Wrong types built in code get the same named refusal as wrong JSON types."""
    refused(field, lambda: StreamConfig(name="S", **kwargs).validate())


def test_an_update_with_a_wrong_type_is_refused_naming_the_field() -> None:
    """check_update normalises before its change rules; a wrong type there is named too."""
    old = StreamConfig(name="S", subjects=("s.>",))
    refused("max_msgs", lambda: check_update(old, StreamConfig(name="S", max_msgs=wrong("5"))))
    refused("max_msgs", lambda: check_update(old, StreamConfig(name="S", max_msgs=2**64)))


def test_enum_fields_given_as_strings_in_code_become_members() -> None:
    """A config built in code may spell an enum as its JSON string; validate returns the
    member, so identity comparisons in the engine hold."""
    cfg = StreamConfig(name="S", retention=wrong("workqueue")).validate()
    assert cfg.retention is RetentionPolicy.WORKQUEUE


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
KEYS = st.sampled_from([f.name for f in fields(StreamConfig)])


@settings(max_examples=300)
@given(st.dictionaries(KEYS, JSON | st.integers(-(2**70), 2**70), max_size=6))
def test_any_json_config_is_accepted_or_refused_with_invalid_argument(raw: dict[str, Any]) -> None:
    """Arbitrary JSON values under the config's keys never raise anything but
    InvalidArgumentError (no struct.error, OverflowError, TypeError, AttributeError)."""
    raw.setdefault("name", "S")
    try:
        cfg = check_create(StreamConfig.from_dict(raw))
    except InvalidArgumentError as exc:
        assert exc.field and exc.rule
        return
    assert check_create(StreamConfig.from_dict(cfg.to_dict())) == cfg


# -- and nothing changes: the store never sees a value it cannot pack ------------------------


def test_the_largest_accepted_limits_are_stored_and_reopened(tmp_path: Path) -> None:
    """At every bound the LMDB store packs its meta record (the struct that failed in P1)
    and reads it back after a restart."""
    cfg = StreamConfig(
        name="S",
        subjects=("s.>",),
        max_msgs=INT64_MAX,
        max_bytes=INT64_MAX,
        max_msgs_per_subject=INT64_MAX,
        max_consumers=INT64_MAX,
        max_age=DURATION_MAX_NS,
        duplicate_window=DURATION_MAX_NS,
    )
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    s = Stream(cfg, LmdbStreamStore(env, "S"))
    s.apply(Publish(ts_ns=T0, subject="s.a", data=b"x", msg_id="m1"))
    env.close()
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    try:
        reopened = Stream(cfg, LmdbStreamStore(env, "S"))
        assert reopened.store.state().msgs == 1
    finally:
        env.close()


@pytest.mark.parametrize(
    "change",
    [
        {"max_msgs": INT64_MAX + 1},
        {"max_bytes": 2**64},
        {"max_age": DURATION_MAX_NS + 1},
        {"duplicate_window": 10**30},
        {"max_msgs_per_subject": "5"},
    ],
)
def test_a_refused_update_changes_nothing(tmp_path: Path, change: dict[str, Any]) -> None:
    """P1's E12: an update with a value the store cannot pack is refused before it reaches
    the store; the stream keeps its config, takes publishes and reopens."""
    cfg = StreamConfig(name="S", subjects=("s.>",), max_msgs=10)
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    s = Stream(cfg, LmdbStreamStore(env, "S"))
    before = s.config
    s.apply(Publish(ts_ns=T0, subject="s.a", data=b"x"))
    with pytest.raises(InvalidArgumentError) as info:
        s.apply(UpdateConfig(ts_ns=T0, config=StreamConfig(name="S", subjects=("s.>",), **change)))
    assert info.value.field == next(iter(change))
    assert s.config == before
    s.apply(Publish(ts_ns=T0 + 1, subject="s.a", data=b"y"))
    env.close()
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    try:
        assert Stream(cfg, LmdbStreamStore(env, "S")).store.state().msgs == 2
    finally:
        env.close()


def test_a_placement_built_with_one_string_of_tags_is_refused_naming_the_field() -> None:
    """``Placement`` is the SDK's and the engine's one class (raftstream.model): a string
    where the tags go is refused as it is built, naming ``placement.tags``."""
    with pytest.raises(InvalidArgumentError) as info:
        Placement(tags=wrong("ab"))
    assert info.value.field == "placement.tags"
