"""Consumer configs: ranges, types, byte-counted names and the wording of start rules.

Pins the bad-input review's rule ("bad input gets a clear error naming the field and the
rule, and changes nothing") for consumers:

* P2: every integer fits int64, and every duration (``ack_wait``, each ``backoff`` value,
  ``inactive_threshold``...) is at most ``DURATION_MAX_NS`` so that now plus it still fits
  the pending deadline the consumer state packs as a signed 64-bit integer
  (``engine/consumer_state.py``).
* P3/P6: booleans must be real booleans (a JSON ``"no"`` is not false) and strings real
  strings (``{"description": 5}`` was an internal error); a bool is not an integer either.
* P4: a consumer name is at most 255 bytes of UTF-8, not 255 characters, as stream names.
* P8: ``backoff[i]`` names the element and its value; a start given too small "must be at
  least 1", while only a missing one "is required".

Each rule holds on both paths, ``from_dict`` (JSON) and the dataclass, and a refusal is
always ``InvalidArgumentError``: never ``struct.error``, ``OverflowError``, ``TypeError`` or
``AttributeError``. JetStream refuses the same inputs when decoding its JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import (
    DURATION_MAX_NS,
    IDLE_HEARTBEAT_MIN_NS,
    INT64_MAX,
    NAME_BYTES_MAX,
    NS_PER_S,
    ConsumerConfig,
    with_changes,
)
from raftstream.engine.consumer_store import LmdbConsumerStore
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.store import TS_NS_MAX
from raftstream.errors import InvalidArgumentError

PUSH: dict[str, Any] = {"deliver_subject": "deliver.here"}
MAP_BYTES = 64 * 1024 * 1024
YEAR_2100_NS = 4_102_444_800 * NS_PER_S


def wrong(value: object) -> Any:
    """``value`` as a type checker's Any: these tests pass wrong types on purpose."""
    return value


def refused(field: str, build: Callable[[], Any]) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        build()
    assert info.value.field == field, info.value
    assert info.value.rule
    return info.value


def both_paths(kwargs: dict[str, Any]) -> list[Callable[[], ConsumerConfig]]:
    """The dataclass, and the JSON form of the same values (times may be ns integers)."""
    raw = {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}
    return [lambda: ConsumerConfig(**kwargs), lambda: ConsumerConfig.from_dict(raw)]


# field, what else the field needs to be valid, smallest and largest accepted value (the
# largest + 1 is refused, as is the smallest - 1).
BOUNDS: list[tuple[str, dict[str, Any], int, int]] = [
    ("opt_start_seq", {"deliver_policy": "by_start_sequence"}, 1, INT64_MAX),
    ("opt_start_time", {"deliver_policy": "by_start_time"}, 1, TS_NS_MAX),
    ("ack_wait", {}, 0, DURATION_MAX_NS),
    ("max_deliver", {}, -1, INT64_MAX),
    ("max_ack_pending", {}, -1, INT64_MAX),
    ("max_waiting", {}, 0, INT64_MAX),
    ("max_batch", {}, 0, INT64_MAX),
    ("max_bytes", {}, 0, INT64_MAX),
    ("max_expires", {}, IDLE_HEARTBEAT_MIN_NS, DURATION_MAX_NS),
    ("inactive_threshold", {}, 0, DURATION_MAX_NS),
    ("idle_heartbeat", PUSH, IDLE_HEARTBEAT_MIN_NS, DURATION_MAX_NS),
    ("rate_limit_bps", PUSH, 0, INT64_MAX),
    ("pause_until", {}, 0, TS_NS_MAX),
    ("num_replicas", {}, 0, 5),
]
INT_FIELDS = [b[0] for b in BOUNDS]


@pytest.mark.parametrize("field,extra,low,high", BOUNDS, ids=INT_FIELDS)
def test_each_end_of_the_range_is_accepted(
    field: str, extra: dict[str, Any], low: int, high: int
) -> None:
    """The smallest and largest value each integer field allows are accepted."""
    for value in (low, high):
        for build in both_paths({**extra, field: value}):
            assert getattr(build(), field) == value or value == 0


@pytest.mark.parametrize("field,extra,low,high", BOUNDS, ids=INT_FIELDS)
def test_one_past_each_end_is_refused_naming_the_field(
    field: str, extra: dict[str, Any], low: int, high: int
) -> None:
    """One past either end is refused naming the field (P2): above int64 the engine could not
    pack it; above the duration ceiling now + it would not fit."""
    for value in (low - 1, high + 1):
        if value == 0 and field in ("opt_start_seq", "opt_start_time"):
            continue  # 0 is "not given" (tested below)
        for build in both_paths({**extra, field: value}):
            refused(field, build)


def test_backoff_elements_are_durations_named_by_index() -> None:
    """Each backoff value is a duration: 1 ns to DURATION_MAX_NS; a refusal names
    ``backoff[i]`` and, when it is too small, the value (P8)."""
    for build in both_paths({"backoff": (1, DURATION_MAX_NS)}):
        assert build().backoff == (1, DURATION_MAX_NS)
    for build in both_paths({"backoff": (1, DURATION_MAX_NS + 1)}):
        refused("backoff[1]", build)
    for build in both_paths({"backoff": (-1,)}):
        err = refused("backoff[0]", build)
        assert str(err) == "backoff[0]: -1 must be a positive number of ns"
    for build in both_paths({"backoff": (5, 0)}):
        assert str(refused("backoff[1]", build)) == "backoff[1]: 0 must be a positive number of ns"


def test_range_rules_say_the_bound() -> None:
    """The message says which bound was broken, in the field's unit."""
    err = refused("max_deliver", lambda: ConsumerConfig(max_deliver=2**63))
    assert err.rule == "must be at most 9223372036854775807 (a signed 64-bit integer)"
    err = refused("ack_wait", lambda: ConsumerConfig(ack_wait=DURATION_MAX_NS + 1))
    assert err.rule == f"must be at most {DURATION_MAX_NS} ns (100 years)"
    err = refused("pause_until", lambda: ConsumerConfig.from_dict({"pause_until": 2**63}))
    assert "2262-04-11T23:47:16.854775807Z" in err.rule


@settings(max_examples=200)
@given(
    st.sampled_from(BOUNDS),
    st.integers(min_value=2**63) | st.integers(max_value=-(2**63) - 1),
)
def test_any_integer_outside_int64_is_refused(
    bound: tuple[str, dict[str, Any], int, int], value: int
) -> None:
    """However far outside int64 (even past Python's 4300-digit repr limit), the refusal is
    InvalidArgumentError naming the field."""
    field, extra, _, _ = bound
    for build in both_paths({**extra, field: value}):
        refused(field, build)


@settings(max_examples=200)
@given(st.data())
def test_any_integer_inside_the_range_is_accepted(data: st.DataObject) -> None:
    """Every value from the smallest to the largest allowed is accepted on both paths."""
    field, extra, low, high = data.draw(st.sampled_from(BOUNDS))
    value = data.draw(st.integers(low, high))
    for build in both_paths({**extra, field: value}):
        build()


@settings(max_examples=100)
@given(st.lists(st.integers(1, DURATION_MAX_NS), min_size=1, max_size=5))
def test_any_backoff_inside_the_ceiling_is_accepted(backoff: list[int]) -> None:
    """A backoff of durations from 1 ns to the ceiling is accepted; ack_wait is its first."""
    assert ConsumerConfig(backoff=tuple(backoff)).ack_wait == backoff[0]
    assert ConsumerConfig.from_dict({"backoff": backoff}).ack_wait == backoff[0]


def test_the_largest_durations_fit_the_stored_pending_deadline(tmp_path: Path) -> None:
    """P2: ack_wait and backoff at their ceiling, delivered in the year 2100, give a pending
    deadline the LMDB consumer store packs (signed 64-bit) and reads back after a restart."""
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    store = LmdbStreamStore(env, "S")
    store.append("a", b"x", now_ns=YEAR_2100_NS)
    config = ConsumerConfig(
        durable_name="c",
        backoff=(DURATION_MAX_NS,),
        inactive_threshold=DURATION_MAX_NS,
        pause_until=0,
    )
    c = Consumer.create(
        stream="S",
        name="c",
        config=config,
        store=store,
        now_ns=YEAR_2100_NS,
        state_store=LmdbConsumerStore(env=env),
    )
    assert [d.stream_seq for d in c.fetch(1, YEAR_2100_NS)] == [1]
    c.progress(1, YEAR_2100_NS)
    env.close()
    env = open_node_env(tmp_path / "node", map_size_bytes=MAP_BYTES)
    try:
        again = Consumer.open(
            stream="S",
            name="c",
            store=LmdbStreamStore(env, "S"),
            state_store=LmdbConsumerStore(env=env),
        )
        assert again.state.pending[1].deadline_ns == YEAR_2100_NS + DURATION_MAX_NS
    finally:
        env.close()


def test_a_refused_change_leaves_the_config_as_it_was() -> None:
    """with_changes builds a new, validated config: a refused change raises before anything
    is replaced (the meta layer proposes only a config that was built)."""
    config = ConsumerConfig(durable_name="d", ack_wait=NS_PER_S)
    refused("ack_wait", lambda: with_changes(config, ack_wait=2**64))
    refused("backoff[0]", lambda: with_changes(config, backoff=(10**30,)))
    assert config.ack_wait == NS_PER_S and config.backoff == ()


# -- types ---------------------------------------------------------------------------------------

BOOL_FIELDS = ["headers_only", "flow_control", "mem_storage"]
STR_FIELDS = [
    "durable_name",
    "name",
    "description",
    "filter_subject",
    "sample_freq",
    "deliver_subject",
    "deliver_group",
]


@pytest.mark.parametrize("name", [f.name for f in fields(ConsumerConfig)])
def test_every_field_refuses_a_value_of_no_json_type(name: str) -> None:
    """No field escapes the type check: a value of no JSON type is refused naming it."""
    refused(name, lambda: ConsumerConfig(**{name: object()}))


@pytest.mark.parametrize("field", BOOL_FIELDS)
@pytest.mark.parametrize("value", ["no", "false", "true", 0, 1, None, [True]])
def test_booleans_must_be_booleans(field: str, value: object) -> None:
    """P3: {"headers_only": "no"} delivered headers only; JetStream refuses a non-bool."""
    for build in both_paths({field: value}):
        err = refused(field, build)
        assert "boolean" in err.rule


def test_true_booleans_are_accepted() -> None:
    for build in both_paths({"headers_only": True, "mem_storage": True}):
        c = build()
        assert c.headers_only is True and c.mem_storage is True
    hb = {**PUSH, "idle_heartbeat": NS_PER_S, "flow_control": True}
    for build in both_paths(hb):
        assert build().flow_control is True


@pytest.mark.parametrize("field", STR_FIELDS)
@pytest.mark.parametrize("value", [5, True, 1.5, ["a"], {"a": "b"}])
def test_strings_must_be_strings(field: str, value: object) -> None:
    """P6: {"description": 5} and {"sample_freq": 50} were internal errors."""
    for build in both_paths({field: value}):
        err = refused(field, build)
        assert "string" in err.rule


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", [True, False, "5", 1.0])
def test_a_bool_or_string_is_not_an_integer(field: str, value: object) -> None:
    """Python's True is an int; JSON's is not: {"opt_start_time": true} was 1 ns (P3)."""
    for build in both_paths({field: value}):
        refused(field, build)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"backoff": 5}, "backoff"),
        ({"backoff": (True,)}, "backoff[0]"),
        ({"backoff": (1, "2")}, "backoff[1]"),
        ({"backoff": (1.5,)}, "backoff[0]"),
        ({"filter_subjects": ("a", 5)}, "filter_subjects"),
        ({"metadata": {"a": 1}}, "metadata"),
        ({"deliver_policy": ["all"]}, "deliver_policy"),
    ],
)
def test_lists_and_maps_hold_the_right_types(kwargs: dict[str, Any], field: str) -> None:
    for build in both_paths(kwargs):
        refused(field, build)


def test_a_huge_value_is_named_without_printing_it_whole() -> None:
    """An int past Python's 4300-digit repr limit, or a long string, is refused with a short
    message (printing it would raise ValueError, or send megabytes back)."""
    err = refused("backoff[0]", lambda: ConsumerConfig(backoff=(-(10**5000),)))
    assert "bits" in err.rule and len(str(err)) < 200
    err = refused("ack_wait", lambda: ConsumerConfig(ack_wait=wrong("x" * 10**6)))
    assert len(str(err)) < 200


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
KEYS = st.sampled_from([f.name for f in fields(ConsumerConfig)])


@settings(max_examples=300)
@given(st.dictionaries(KEYS, JSON | st.integers(-(2**70), 2**70), max_size=6))
def test_any_json_config_is_accepted_or_refused_with_invalid_argument(raw: dict[str, Any]) -> None:
    """Arbitrary JSON values under the config's keys never raise anything but
    InvalidArgumentError; an accepted config round-trips through its JSON form."""
    try:
        c = ConsumerConfig.from_dict(raw)
    except InvalidArgumentError as exc:
        assert exc.field and exc.rule
        return
    assert ConsumerConfig.from_dict(c.to_dict()) == c


# -- names count bytes (P4) ---------------------------------------------------------------------


@pytest.mark.parametrize("field", ["durable_name", "name", "deliver_group"])
def test_names_are_at_most_255_bytes_of_utf8(field: str) -> None:
    """'Ü' is 2 bytes and '😀' 4: 127 'Ü' plus one ASCII is 255 bytes and accepted, 128 'Ü'
    (128 characters, 256 bytes) is refused, as is 64 '😀' (only 64 characters)."""
    extra = PUSH if field == "deliver_group" else {}
    for ok in ("Ü" * 127 + "x", "😀" * 63 + "abc", "x" * NAME_BYTES_MAX):
        assert len(ok.encode()) == NAME_BYTES_MAX
        for build in both_paths({**extra, field: ok}):
            assert getattr(build(), field) == ok
    for bad in ("Ü" * 128, "😀" * 64, "x" * (NAME_BYTES_MAX + 1)):
        for build in both_paths({**extra, field: bad}):
            err = refused(field, build)
            assert err.rule == "must be at most 255 bytes"


def test_a_name_that_is_not_utf8_is_refused() -> None:
    """A lone surrogate cannot be encoded: refused naming the field, not UnicodeEncodeError."""
    refused("durable_name", lambda: ConsumerConfig(durable_name="a\ud800"))
    refused("description", lambda: ConsumerConfig(description="a\ud800"))
    refused("metadata", lambda: ConsumerConfig(metadata={"k": "\ud800"}))


# -- the start rules' wording (P8) --------------------------------------------------------------


def test_a_missing_start_is_required_by_its_policy() -> None:
    """No opt_start_seq / opt_start_time at all: "is required by deliver_policy ..."."""
    for policy, field in (
        ("by_start_sequence", "opt_start_seq"),
        ("by_start_time", "opt_start_time"),
    ):
        for build in both_paths({"deliver_policy": policy}):
            err = refused(field, build)
            assert err.rule == f"is required by deliver_policy {policy}"


@pytest.mark.parametrize(
    "raw,field",
    [
        ({"deliver_policy": "by_start_sequence", "opt_start_seq": 0}, "opt_start_seq"),
        ({"deliver_policy": "by_start_time", "opt_start_time": 0}, "opt_start_time"),
        (
            {"deliver_policy": "by_start_time", "opt_start_time": "1970-01-01T00:00:00Z"},
            "opt_start_time",
        ),
        (
            {"deliver_policy": "by_start_time", "opt_start_time": "1969-12-31T23:59:59Z"},
            "opt_start_time",
        ),
        ({"deliver_policy": "by_start_time", "opt_start_time": -1}, "opt_start_time"),
        ({"opt_start_time": "1900-01-01T00:00:00Z"}, "opt_start_time"),
    ],
)
def test_a_start_given_too_small_must_be_at_least_1(raw: dict[str, Any], field: str) -> None:
    """A start that was given (0, before 1970) is too small, not missing: the rule says
    "must be at least 1", never "is required"."""
    err = refused(field, lambda: ConsumerConfig.from_dict(raw))
    assert "must be at least 1" in err.rule and "required" not in err.rule


def test_a_pre_1970_start_time_in_code_must_be_at_least_1() -> None:
    err = refused(
        "opt_start_time",
        lambda: ConsumerConfig(deliver_policy=wrong("by_start_time"), opt_start_time=-5),
    )
    assert err.rule.startswith("must be at least 1 ns since the epoch") and "-5" in err.rule


def test_a_zero_start_with_another_policy_is_still_unset() -> None:
    """JetStream's omitempty: 0 with a policy that takes no start reads as not given."""
    c = ConsumerConfig.from_dict({"opt_start_seq": 0, "opt_start_time": 0})
    assert c.opt_start_seq == 0 and c.opt_start_time == 0
