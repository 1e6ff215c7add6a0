"""ConsumerConfig: JetStream's consumer field names, defaults and rules.

Each test names the JetStream behaviour it pins; every refusal must name the field and the
rule (``InvalidArgumentError.field``).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftstream.engine.consumer_config import (
    ACK_WAIT_DEFAULT_NS,
    IMMUTABLE_FIELDS,
    INACTIVE_THRESHOLD_EPHEMERAL_NS,
    MAX_ACK_PENDING_DEFAULT,
    MAX_WAITING_DEFAULT,
    NS_PER_MS,
    NS_PER_S,
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    ReplayPolicy,
    RetentionKind,
    check_for_stream,
    check_update,
    check_workqueue_filters,
    format_rfc3339_ns,
    parse_rfc3339_ns,
    with_changes,
)
from raftstream.errors import InvalidArgumentError

PUSH = {"deliver_subject": "deliver.here"}


def refused(field: str, **kwargs: Any) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as info:
        ConsumerConfig(**kwargs)
    assert info.value.field == field, info.value
    assert info.value.rule
    return info.value


# -- defaults ---------------------------------------------------------------------------------


def test_pull_defaults_are_jetstreams() -> None:
    """JetStream defaults: deliver all, explicit acks, ack_wait 30 s, max_deliver -1,
    max_ack_pending 1000, max_waiting 512 for pull, replay instant."""
    c = ConsumerConfig(durable_name="d")
    assert c.is_pull and c.is_durable
    assert c.deliver_policy is DeliverPolicy.ALL
    assert c.ack_policy is AckPolicy.EXPLICIT
    assert c.ack_wait == ACK_WAIT_DEFAULT_NS == 30 * NS_PER_S
    assert c.max_deliver == -1
    assert c.max_ack_pending == MAX_ACK_PENDING_DEFAULT == 1000
    assert c.max_waiting == MAX_WAITING_DEFAULT == 512
    assert c.replay_policy is ReplayPolicy.INSTANT
    assert c.filters == (">",)
    assert c.inactive_threshold == 0  # a durable is reaped only if it sets one


def test_ephemeral_gets_inactive_threshold_of_5s() -> None:
    """JetStream reaps an unused ephemeral after 5 s unless inactive_threshold says else."""
    assert ConsumerConfig().inactive_threshold == INACTIVE_THRESHOLD_EPHEMERAL_NS
    assert ConsumerConfig(inactive_threshold=NS_PER_S).inactive_threshold == NS_PER_S
    assert ConsumerConfig(durable_name="d", inactive_threshold=7).inactive_threshold == 7


def test_push_consumer_has_no_max_waiting() -> None:
    """max_waiting is a pull setting: a push consumer keeps 0."""
    assert ConsumerConfig(**PUSH).max_waiting == 0


def test_ack_none_means_no_ack_pending_limit() -> None:
    """With ack policy none nothing is pending, so max_ack_pending is unlimited (-1)."""
    assert ConsumerConfig(ack_policy=AckPolicy.NONE).max_ack_pending == -1
    refused("max_ack_pending", ack_policy="none", max_ack_pending=10)


def test_max_ack_pending_minus_one_is_unlimited() -> None:
    """max_ack_pending -1 means unlimited; below -1 is refused."""
    assert ConsumerConfig(max_ack_pending=-1).max_ack_pending == -1
    refused("max_ack_pending", max_ack_pending=-2)


def test_backoff_sets_ack_wait_and_repeats_last_value() -> None:
    """JetStream: ack_wait becomes backoff[0]; the n-th delivery waits backoff[n-1] and the
    last value repeats."""
    c = ConsumerConfig(ack_wait=99, backoff=(1 * NS_PER_S, 5 * NS_PER_S), max_deliver=4)
    assert c.ack_wait == NS_PER_S
    assert [c.ack_wait_for(n) for n in (1, 2, 3, 4)] == [NS_PER_S] + [5 * NS_PER_S] * 3
    assert ConsumerConfig(ack_wait=7).ack_wait_for(9) == 7


# -- identity ---------------------------------------------------------------------------------


def test_name_and_durable_must_agree() -> None:
    """JetStream: name and durable_name must be equal when both are given."""
    assert ConsumerConfig(name="a", durable_name="a").consumer_name == "a"
    refused("name", name="a", durable_name="b")


@pytest.mark.parametrize("bad", ["", "a.b", "a*", "a>", "a b", "a/b", "x" * 256, "a\x00"])
def test_bad_names_are_refused(bad: str) -> None:
    """Names become subject tokens and keys: no dots, wildcards, whitespace or separators."""
    refused("durable_name", durable_name=bad)
    refused("name", name=bad)


def test_description_and_metadata_limits() -> None:
    """description is at most 4 KiB; metadata keys are non-empty and bounded in size."""
    refused("description", description="x" * 4097)
    refused("metadata", metadata={"": "v"})
    refused("metadata", metadata={"k": "v" * (128 * 1024)})
    assert dict(ConsumerConfig(metadata={"team": "a"}).metadata) == {"team": "a"}


# -- start ------------------------------------------------------------------------------------


def test_opt_start_seq_only_with_by_start_sequence() -> None:
    """JetStream: opt_start_seq requires deliver_policy by_start_sequence, and vice versa."""
    refused("opt_start_seq", opt_start_seq=5)
    refused("opt_start_seq", deliver_policy="by_start_sequence")
    c = ConsumerConfig(deliver_policy="by_start_sequence", opt_start_seq=5)
    assert c.deliver_policy is DeliverPolicy.BY_START_SEQUENCE


def test_opt_start_time_only_with_by_start_time() -> None:
    """JetStream: opt_start_time requires deliver_policy by_start_time, and vice versa."""
    refused("opt_start_time", opt_start_time=5)
    refused("opt_start_time", deliver_policy="by_start_time")
    ConsumerConfig(deliver_policy="by_start_time", opt_start_time=5)


def test_last_per_subject_needs_a_filter() -> None:
    """JetStream: deliver_policy last_per_subject requires a filter subject."""
    refused("deliver_policy", deliver_policy="last_per_subject")
    ConsumerConfig(deliver_policy="last_per_subject", filter_subject="a.>")


def test_unknown_enum_value_is_refused() -> None:
    """Policies accept only JetStream's values; the field is named."""
    refused("deliver_policy", deliver_policy="sometimes")
    refused("ack_policy", ack_policy="maybe")
    refused("replay_policy", replay_policy="slow")


# -- acks -------------------------------------------------------------------------------------


def test_backoff_rules() -> None:
    """Backoff needs acks, positive values, and max_deliver >= its length: equal is
    accepted, as nats-server has it since 2.10.23 (TestJetStreamConsumerBackOff,
    "backoff_with_max_deliver_equal"), despite its error text saying '>'."""
    refused("backoff[0]", backoff=(0,))
    refused("backoff", backoff=(NS_PER_S,), ack_policy="none")
    refused("max_deliver", backoff=(1, 2, 3), max_deliver=2)
    ConsumerConfig(backoff=(1, 2, 3), max_deliver=3)
    ConsumerConfig(backoff=(1, 2, 3))  # unlimited max_deliver


def test_negative_times_and_counts_are_refused() -> None:
    """Durations and times are non-negative ns; counts are integers."""
    for name in ("ack_wait", "inactive_threshold", "pause_until"):
        refused(name, **{name: -1})
    refused("max_deliver", max_deliver=-2)
    refused("max_deliver", max_deliver="3")


# -- filters ----------------------------------------------------------------------------------


def test_filter_subject_and_filter_subjects_are_exclusive() -> None:
    """JetStream: filter_subject and filter_subjects cannot both be set."""
    refused("filter_subjects", filter_subject="a", filter_subjects=("b",))


def test_filter_subjects_may_not_overlap() -> None:
    """JetStream 2.10: the filters of one consumer must not overlap each other."""
    refused("filter_subjects", filter_subjects=("a.*", "a.b"))
    refused("filter_subjects", filter_subjects=("a.>", "a.b.c"))
    c = ConsumerConfig(filter_subjects=("a.*", "b.>"))
    assert c.filters == ("a.*", "b.>")


def test_bad_filters_are_refused() -> None:
    """Filters follow the subject rules (no empty tokens, '>' last)."""
    refused("filter_subject", filter_subject="a..b")
    refused("filter_subjects", filter_subjects=("a.>.b",))


def test_workqueue_filters_may_not_overlap_another_consumers() -> None:
    """JetStream: on a workqueue stream, consumers' filters must not overlap, and an
    unfiltered consumer must be alone."""
    a = ConsumerConfig(durable_name="a", filter_subject="orders.eu.*")
    b = ConsumerConfig(durable_name="b", filter_subject="orders.us.*")
    check_workqueue_filters(b, [a])
    with pytest.raises(InvalidArgumentError) as info:
        check_workqueue_filters(ConsumerConfig(durable_name="c", filter_subject="orders.>"), [a])
    assert info.value.field == "filter_subject"
    with pytest.raises(InvalidArgumentError):
        check_workqueue_filters(ConsumerConfig(durable_name="d"), [a])


def test_stream_rules_for_workqueue_and_subjects() -> None:
    """Workqueue consumers need explicit acks and deliver all; filters must hit the stream."""
    wq = RetentionKind.WORKQUEUE
    with pytest.raises(InvalidArgumentError) as info:
        check_for_stream(ConsumerConfig(ack_policy="all"), retention=wq)
    assert info.value.field == "ack_policy"
    with pytest.raises(InvalidArgumentError) as info:
        check_for_stream(ConsumerConfig(deliver_policy="new"), retention=wq)
    assert info.value.field == "deliver_policy"
    check_for_stream(ConsumerConfig(filter_subject="a.b"), retention=wq, stream_subjects=["a.*"])
    with pytest.raises(InvalidArgumentError) as info:
        check_for_stream(
            ConsumerConfig(filter_subject="z"), retention="limits", stream_subjects=["a.*"]
        )
    assert info.value.field == "filter_subject"


# -- pull and push ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["max_batch", "max_expires", "max_bytes", "max_waiting"])
def test_pull_only_fields_refused_on_push(name: str) -> None:
    """JetStream refuses pull settings on a consumer with a deliver subject."""
    refused(name, **{name: NS_PER_S}, **PUSH)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("deliver_group", "g"),
        ("rate_limit_bps", 1000),
        ("flow_control", True),
        ("idle_heartbeat", NS_PER_S),
    ],
)
def test_push_only_fields_refused_on_pull(name: str, value: object) -> None:
    """JetStream refuses push settings on a pull consumer (no deliver subject)."""
    refused(name, **{name: value})


def test_idle_heartbeat_minimum_is_100ms() -> None:
    """idle_heartbeat is at least 100 ms."""
    refused("idle_heartbeat", idle_heartbeat=99 * NS_PER_MS, **PUSH)
    ConsumerConfig(idle_heartbeat=100 * NS_PER_MS, **PUSH)


def test_flow_control_needs_heartbeat() -> None:
    """JetStream: flow control requires an idle heartbeat, to detect a stalled consumer."""
    refused("flow_control", flow_control=True, **PUSH)
    ConsumerConfig(flow_control=True, idle_heartbeat=NS_PER_S, **PUSH)


def test_heartbeat_and_flow_control_refused_with_queue_group() -> None:
    """ADR-15: heartbeats and flow control would go to random queue members."""
    refused("idle_heartbeat", deliver_group="q", idle_heartbeat=NS_PER_S, **PUSH)
    refused(
        "flow_control",
        deliver_group="q",
        flow_control=True,
        **PUSH,
    )


def test_max_expires_minimum() -> None:
    """max_expires, when set, is at least 100 ms; pull limits are non-negative."""
    refused("max_expires", max_expires=NS_PER_MS)
    refused("max_batch", max_batch=-1)


def test_deliver_subject_must_be_literal() -> None:
    """A deliver subject is published to, so it carries no wildcards."""
    refused("deliver_subject", deliver_subject="a.*")


def test_misc_rules() -> None:
    """sample_freq is a percentage, num_replicas 0..5, rate_limit_bps non-negative."""
    refused("sample_freq", sample_freq="101%")
    refused("sample_freq", sample_freq="often")
    assert ConsumerConfig(sample_freq="50%").sample_freq == "50%"
    refused("num_replicas", num_replicas=6)
    refused("rate_limit_bps", rate_limit_bps=-1, **PUSH)


# -- update -----------------------------------------------------------------------------------


def test_immutable_fields_refused_on_update() -> None:
    """JetStream refuses updates to the start, ack and replay policies, names, max_waiting
    and storage; each refusal names the field."""
    old = ConsumerConfig(durable_name="d")
    changes: dict[str, Any] = {
        "deliver_policy": "new",
        "ack_policy": "all",
        "replay_policy": "original",
        "max_waiting": 10,
        "mem_storage": True,
    }
    for name, value in changes.items():
        assert name in IMMUTABLE_FIELDS
        with pytest.raises(InvalidArgumentError) as info:
            check_update(old, with_changes(old, **{name: value}))
        assert info.value.field == name


def test_switching_pull_and_push_is_refused() -> None:
    """JetStream: an update may not turn a pull consumer into a push one."""
    old = ConsumerConfig(durable_name="d")
    with pytest.raises(InvalidArgumentError) as info:
        check_update(old, ConsumerConfig(durable_name="d", **PUSH))
    assert info.value.field == "deliver_subject"


def test_mutable_fields_update() -> None:
    """ack_wait, max_deliver, max_ack_pending, description, filters and the deliver subject
    may change."""
    old = ConsumerConfig(durable_name="d", deliver_subject="x")
    new = ConsumerConfig(
        durable_name="d",
        deliver_subject="y",
        ack_wait=NS_PER_S,
        max_deliver=3,
        max_ack_pending=5,
        description="new",
        filter_subject="a.b",
    )
    check_update(old, new)


# -- JSON -------------------------------------------------------------------------------------


def test_json_uses_jetstream_names_ns_and_rfc3339() -> None:
    """JSON form: JetStream names, durations in ns, times RFC 3339, zero values omitted."""
    c = ConsumerConfig(
        durable_name="d",
        deliver_policy="by_start_time",
        opt_start_time=1_700_000_000_123_456_789,
        backoff=(NS_PER_S, 2 * NS_PER_S),
        filter_subjects=("a.*", "b"),
    )
    d = c.to_dict()
    assert d["opt_start_time"] == "2023-11-14T22:13:20.123456789Z"
    assert d["ack_wait"] == NS_PER_S and d["backoff"] == [NS_PER_S, 2 * NS_PER_S]
    assert d["deliver_policy"] == "by_start_time" and d["ack_policy"] == "explicit"
    assert "description" not in d  # unset values are omitted, as JetStream does
    assert ConsumerConfig.from_dict(d) == c


def test_from_dict_rejects_unknown_keys_naming_them() -> None:
    """An unknown key is refused, naming the key."""
    with pytest.raises(InvalidArgumentError) as info:
        ConsumerConfig.from_dict({"durable_name": "d", "ack_waitt": 5})
    assert info.value.field == "ack_waitt"


def test_from_dict_accepts_ns_integers_for_times() -> None:
    """Times may also be given as ns integers."""
    c = ConsumerConfig.from_dict({"pause_until": 5 * NS_PER_S})
    assert c.pause_until == 5 * NS_PER_S


def test_rfc3339_parsing() -> None:
    """RFC 3339 with fractions and offsets, as JetStream writes times."""
    assert parse_rfc3339_ns("1970-01-01T00:00:01Z") == NS_PER_S
    assert parse_rfc3339_ns("1970-01-01T01:00:00.5+01:00") == NS_PER_S // 2
    with pytest.raises(InvalidArgumentError):
        parse_rfc3339_ns("yesterday")


_configs = st.builds(
    ConsumerConfig,
    durable_name=st.one_of(st.none(), st.sampled_from(["a", "b-1", "C_2"])),
    ack_policy=st.sampled_from(list(AckPolicy)),
    ack_wait=st.integers(0, 10**12),
    max_deliver=st.integers(-1, 50).filter(lambda n: n != 0) | st.just(0),
    filter_subjects=st.sampled_from([(), ("a.*",), ("a.*", "b.>")]),
    headers_only=st.booleans(),
    pause_until=st.integers(0, 2**62),
    description=st.one_of(st.none(), st.text(max_size=20)),
)


@given(_configs)
def test_json_round_trip(c: ConsumerConfig) -> None:
    """to_dict/from_dict are inverses for every valid config."""
    assert ConsumerConfig.from_dict(c.to_dict()) == c


@given(st.integers(0, 2**63 - 1))
def test_rfc3339_round_trip(ns: int) -> None:
    """Times keep nanosecond precision through their text form."""
    assert parse_rfc3339_ns(format_rfc3339_ns(ns)) == ns
