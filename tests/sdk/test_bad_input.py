"""Bad input to the SDK is refused before anything is sent, with an ``InvalidArgumentError``
naming the argument or field and the rule (the bad-input review, problems P3, P7, P8, P9
and P10; docs/limits.md: "bad input gets a clear error naming the field and the rule, and
changes nothing").

Pinned here, against fake servers that record every call (``tests/support/fakes.py``):

- config types (P3): a boolean field takes True/False only (``headers_only="no"`` was stored
  and acted as true), a text field a str, a count an int, a time an int of ns from 0 to
  2**63-1 (``opt_start_time=True`` became 1 ns); as the engine's ``from_dict`` refuses them;
- times (P7): an RFC 3339 time that is no date (month 13) and a time out of the int64 range
  (10**30) are ``InvalidArgumentError`` naming the field, not ValueError/OverflowError;
- keyword arguments that are no config field: ``UnknownFieldError``, both an
  ``InvalidArgumentError`` naming the field and the ``TypeError`` Python raises for them;
- publish options of the wrong type name the option (``msg_id=5``: a bare TypeError before);
- ``nak(delay)``: seconds, a finite number from 0 to a year (``nak("5")`` built a string of a
  billion characters); ``term(reason)`` a str;
- ``fetch`` (P9): timeout finite and above 0, heartbeat finite, 0 or 10 ms to half the
  timeout, named ``heartbeat`` (not the proto's ``idle_heartbeat_ns``); batch at least 1,
  naming the node's real bound (P10);
- ``pause_consumer`` in the past is refused, as ``raftstream consumer pause`` refuses it
  (P10): JetStream would take it as a resume, silently;
- ``connect``: malformed or empty server addresses name ``servers`` (P10), at once;
- KV (P8): keys, bucket names, ``revision`` and ``last`` checked under their own names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import time
from typing import Any

import pytest

import raftstream
from raftstream import _args, errors, pull
from raftstream import config as sdk
from raftstream import kv as kv_mod
from raftstream.kv import KeyValue, bucket_stream_config
from raftstream.msg import Msg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.subscribe import push_config
from tests.support.fakes import Nodes, ack_token

NS = 1_000_000_000
INT64_MAX = 2**63 - 1


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def refused(field: str, make: Any) -> errors.InvalidArgumentError:
    """The InvalidArgumentError ``make()`` raises, checked to name ``field``."""
    with pytest.raises(errors.InvalidArgumentError) as raised:
        make()
    assert raised.value.field == field, raised.value
    return raised.value


# -- times (P7) -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "2020-13-45T00:00:00Z",  # the review's TZ1/TZ3/SDK-S21: ValueError "month must be..."
        "2021-02-29T00:00:00Z",
        "2020-01-01T25:00:00Z",
        "2020-01-01T00:00:00+25:00",
        "1969-12-31T23:59:59Z",  # before the epoch: no int64 ns the server keeps
        "2262-04-12T00:00:00Z",  # after INT64_MAX ns
        "yesterday",
    ],
)
def test_a_time_that_is_no_rfc3339_date_in_range_names_the_field(text: str) -> None:
    exc = refused("opt_start_time", lambda: sdk.parse_rfc3339_ns(text, "opt_start_time"))
    assert "RFC 3339" in exc.rule or "ns since the epoch" in exc.rule


def test_a_time_that_is_no_string_names_the_field() -> None:
    refused("pause_until", lambda: sdk.parse_rfc3339_ns(5, "pause_until"))  # type: ignore[arg-type]


@pytest.mark.parametrize("ns", [10**30, -1, INT64_MAX + 1, True, "5", 1.5])
def test_formatting_an_out_of_range_or_non_int_time_names_the_field(ns: Any) -> None:
    """SDK-S22/SDK-C11: OverflowError from datetime; TY8: a bool formatted as 1 ns."""
    refused("pause_until", lambda: sdk.format_rfc3339_ns(ns, "pause_until"))


def test_times_in_range_still_round_trip() -> None:
    for ns in (0, 1, 1_700_000_000_123_456_789, INT64_MAX):
        assert sdk.parse_rfc3339_ns(sdk.format_rfc3339_ns(ns)) == ns
    assert sdk.format_rfc3339_ns(INT64_MAX) == "2262-04-11T23:47:16.854775807Z"


def test_config_times_out_of_range_name_the_field_on_construction() -> None:
    refused("pause_until", lambda: sdk.ConsumerConfig(durable_name="d", pause_until=10**30))
    refused("opt_start_time", lambda: sdk.ConsumerConfig(opt_start_time=-5))
    mirror = {"name": "CS", "opt_start_time": 10**30}
    refused("mirror.opt_start_time", lambda: sdk.StreamConfig(name="S", mirror=mirror))
    sources = [{"name": "A"}, {"name": "B", "opt_start_time": True}]
    refused("sources[1].opt_start_time", lambda: sdk.StreamConfig(name="S", sources=sources))


def test_a_config_file_time_that_is_no_date_names_the_field() -> None:
    """The CLI's --config path (TZ1, TZ3): from_dict, not a Python traceback."""
    bad = "2020-13-45T00:00:00Z"
    refused(
        "opt_start_time",
        lambda: sdk.ConsumerConfig.from_dict(
            {"durable_name": "d", "deliver_policy": "by_start_time", "opt_start_time": bad}
        ),
    )
    refused(
        "mirror.opt_start_time",
        lambda: sdk.StreamConfig.from_dict(
            {"name": "M", "mirror": {"name": "CS", "opt_start_time": bad}}
        ),
    )
    ok = sdk.StreamConfig.from_dict(
        {"name": "M", "mirror": {"name": "CS", "opt_start_time": "2020-01-01T00:00:00Z"}}
    )
    assert ok.mirror is not None and ok.mirror.opt_start_time == 1_577_836_800 * NS


# -- config types (P3) ------------------------------------------------------------------------


def _scalar_fields(cls: type) -> list[str]:
    """The fields of ``cls`` whose default is a bool, an int, a str or None (not an enum,
    a tuple or a mapping: those have checks of their own)."""
    out = []
    for f in dataclasses.fields(cls):
        default = f.default
        if default is dataclasses.MISSING or isinstance(default, enum.Enum | tuple):
            continue
        if default is None or isinstance(default, bool | int | str):
            out.append(f.name)
    return out


@pytest.mark.parametrize("cls", [sdk.StreamConfig, sdk.ConsumerConfig], ids=["stream", "consumer"])
def test_every_scalar_config_field_has_a_type_check(cls: type) -> None:
    """A field added later gets a type, or this fails: the review found three consumer
    booleans without one."""
    kinds = sdk._scalar_kinds(cls)
    scalars = set(_scalar_fields(cls)) - {"mirror", "placement", "subject_transform"}
    assert scalars <= set(kinds), sorted(scalars - set(kinds))


CONSUMER_BOOLS = ["headers_only", "flow_control", "mem_storage"]
STREAM_BOOLS = [
    "discard_new_per_subject",
    "sealed",
    "deny_delete",
    "deny_purge",
    "allow_rollup_hdrs",
    "allow_direct",
    "allow_msg_ttl",
]


@pytest.mark.parametrize("value", ["no", "false", "yes", 0, 1])
@pytest.mark.parametrize("field", CONSUMER_BOOLS)
def test_a_consumer_boolean_takes_true_or_false_only(field: str, value: object) -> None:
    """SDK-C9: headers_only="no" was accepted and delivered headers only; CF16/TY4 in a
    --config file."""
    exc = refused(field, lambda: sdk.ConsumerConfig(durable_name="d", **{field: value}))
    assert "must be a boolean" in exc.rule
    refused(field, lambda: sdk.ConsumerConfig.from_dict({"durable_name": "d", field: value}))


@pytest.mark.parametrize("field", STREAM_BOOLS)
def test_a_stream_boolean_takes_true_or_false_only(field: str) -> None:
    refused(field, lambda: sdk.StreamConfig(name="S", **{field: "false"}))
    assert getattr(sdk.StreamConfig(name="S", **{field: True}), field) is True


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("description", 5),  # TY2 (the node answered UNKNOWN: internal error)
        ("sample_freq", 50),  # TY3
        ("durable_name", 5),
        ("filter_subject", ["a"]),
        ("deliver_group", 5),
        ("opt_start_time", True),  # TY8
        ("pause_until", "2030-01-01T00:00:00Z"),  # a str time belongs in from_dict
        ("max_deliver", "5"),
        ("ack_wait", 1.5e9),
        ("num_replicas", True),
        ("backoff[1]", [NS, 1.5]),
    ],
)
def test_a_consumer_field_of_the_wrong_type_is_named(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {"durable_name": "d", field.split("[")[0]: value}
    refused(field, lambda: sdk.ConsumerConfig(**kwargs))


@pytest.mark.parametrize(
    ("field", "value"),
    [("description", 5), ("name", 5), ("max_age", 1.5e9), ("max_msgs", "10"), ("metadata", 5)],
)
def test_a_stream_field_of_the_wrong_type_is_named(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {"name": "S", field: value}
    refused(field, lambda: sdk.StreamConfig(**kwargs))


def test_none_still_leaves_a_field_unset_and_good_types_pass() -> None:
    cfg = sdk.ConsumerConfig(
        durable_name="d", description=None, headers_only=True, sample_freq="50%", backoff=[NS]
    )
    assert cfg.to_dict()["headers_only"] is True
    assert "description" not in cfg.to_dict()
    assert sdk.StreamConfig(name="S", description=None).to_dict()["name"] == "S"  # type: ignore[arg-type]


# -- unknown keyword arguments ----------------------------------------------------------------


def test_an_unknown_config_keyword_names_the_field_and_is_still_a_type_error() -> None:
    """SDK-S8: a bare TypeError before; now InvalidArgumentError too, with a hint."""
    with pytest.raises(sdk.UnknownFieldError) as raised:
        sdk.config_with(sdk.StreamConfig, None, {"name": "S", "max_ag": 1})
    exc = raised.value
    assert isinstance(exc, errors.InvalidArgumentError) and isinstance(exc, TypeError)
    assert exc.field == "max_ag" and "did you mean 'max_age'" in exc.rule
    assert exc.code is errors.Code.INVALID_ARGUMENT and exc.reason == "INVALID_ARGUMENT"


def test_unknown_keywords_and_wrong_types_are_refused_before_sending() -> None:
    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                cfg = sdk.StreamConfig(name="S")
                cases: list[tuple[str, Any]] = [
                    ("bogus_field", rs.add_stream(name="S", bogus_field=1)),
                    ("bogus_field", rs.add_stream(cfg, bogus_field=1)),
                    ("bogus_field", rs.update_stream(cfg, bogus_field=1)),
                    ("bogus", rs.add_consumer("S", durable_name="c", bogus=1)),
                    ("headers_only", rs.add_consumer("S", durable_name="c", headers_only="no")),
                    ("deny_delete", rs.add_stream(name="S", deny_delete="yes")),
                    ("config", rs.add_stream({"name": "S"})),  # type: ignore[arg-type]
                ]
                for field, call in cases:
                    with pytest.raises(errors.InvalidArgumentError) as raised:
                        await call
                    assert raised.value.field == field
                with pytest.raises(TypeError):  # what callers catching TypeError still get
                    await rs.add_consumer("S", durable_name="c", bogus=1)
            assert node.calls == []

    run(main())


# -- publish options (P7) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("msg_id", 5),
        ("expected_stream", 5),
        ("expected_last_msg_id", b"x"),
        ("expected_last_subject_seq_subject", 5),
        ("ttl_ns", "5"),
        ("expected_last_seq", 2**64),
    ],
)
def test_a_publish_option_of_the_wrong_type_is_named(option: str, value: object) -> None:
    """publish(msg_id=5) raised TypeError: bad argument type for built-in operation."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                for call in (rs.publish, rs.publish_async):
                    with pytest.raises(errors.InvalidArgumentError) as raised:
                        await call("s", b"x", **{option: value})
                    assert raised.value.field == option
            assert node.calls == []

    run(main())


# -- acks (P7) --------------------------------------------------------------------------------


class Sent:
    """An ack sender that records what it is given."""

    def __init__(self) -> None:
        self.items: list[pb.AckItem] = []

    async def send(self, item: pb.AckItem, stream: str) -> None:
        self.items.append(item)

    async def send_sync(self, item: pb.AckItem, stream: str, *, timeout_s: float | None) -> None:
        self.items.append(item)


def _msg(sender: Sent) -> Msg:
    return Msg(subject="orders.1", data=b"x", headers=None, reply=ack_token(1), sender=sender)


@pytest.mark.parametrize(
    "delay", ["5", b"5", True, math.nan, math.inf, -1, -0.5, 366 * 86400, 10**400, [1]]
)
def test_nak_takes_a_finite_number_of_seconds_from_0_to_a_year(delay: object) -> None:
    """nak('5') multiplied the str by 10**9 (a gigabyte) before int() failed; nak(nan) was
    a ValueError. Refused naming ``delay``; nothing is sent and the message can still be
    acked."""

    async def main() -> None:
        sent = Sent()
        m = _msg(sent)
        with pytest.raises(errors.InvalidArgumentError) as raised:
            await m.nak(delay)  # type: ignore[arg-type]
        assert raised.value.field == "delay" and "seconds" in raised.value.rule
        assert sent.items == [] and not m.acked
        await m.ack()
        assert [i.kind for i in sent.items] == [pb.ACK_KIND_ACK]

    run(main())


def test_nak_still_takes_none_zero_ints_and_floats() -> None:
    async def main() -> None:
        sent = Sent()
        for delay in (None, 0, 2, 1.5, 365 * 86400):
            await _msg(sent).nak(delay)
        assert [i.delay_ns for i in sent.items] == [0, 0, 2 * NS, 3 * NS // 2, 365 * 86400 * NS]

    run(main())


def test_term_takes_a_string_reason() -> None:
    async def main() -> None:
        sent = Sent()
        m = _msg(sent)
        with pytest.raises(errors.InvalidArgumentError) as raised:
            await m.term(5)  # type: ignore[arg-type]
        assert raised.value.field == "reason" and sent.items == [] and not m.acked

    run(main())


# -- fetch (P9, P10) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"timeout": 0}, "timeout", "above 0"),
        ({"timeout": -1}, "timeout", "above 0"),
        ({"timeout": math.nan}, "timeout", "finite"),
        ({"timeout": math.inf}, "timeout", "finite"),
        ({"timeout": "5"}, "timeout", "seconds"),
        ({"heartbeat": -1}, "heartbeat", "seconds"),
        ({"heartbeat": math.nan}, "heartbeat", "finite"),
        ({"heartbeat": 0.001}, "heartbeat", "at least 0.01 seconds"),  # not idle_heartbeat_ns
        ({"heartbeat": 1.5, "timeout": 2}, "heartbeat", "half the timeout"),
        ({"batch": 0}, "batch", "limits.pull_batch_msgs_max, 10000 by default"),
        ({"batch": -1}, "batch", "at least 1"),
        ({"batch": True}, "batch", "integer"),
        ({"batch": 2**32}, "batch", "at least 1"),  # protobuf's uint32 raised a ValueError
    ],
)
def test_fetch_checks_its_arguments_before_any_request(
    kwargs: dict[str, Any], field: str, words: str
) -> None:
    """fetch(1, timeout=-1) raised 'no messages within -1.000s' without asking the server,
    heartbeat=-1 'no heartbeat for -2.000s'; fetch(0) said 'must be 1 to 2**63-1'."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                sub = rs._pull_subscription("ORDERS", "C")
                with pytest.raises(errors.InvalidArgumentError) as raised:
                    await sub.fetch(**kwargs)
                assert raised.value.field == field
                assert words in raised.value.rule, raised.value.rule
            assert node.calls == []

    run(main())


def test_a_heartbeat_a_retry_would_shrink_below_the_nodes_minimum_is_left_out() -> None:
    """The node refuses 0 < idle_heartbeat_ns < 10 ms; a retry with little time left halves
    its expiry, so the interval is dropped rather than sent below the minimum."""
    assert pull._heartbeat_ns(0.5, 4 * NS) == NS // 2
    assert pull._heartbeat_ns(0.5, 400_000_000) == 200_000_000
    assert pull._heartbeat_ns(0.5, 15_000_000) == 0
    assert pull._heartbeat_ns(None, 4 * NS) == 0


def test_push_seconds_options_are_checked_too() -> None:
    refused("idle_heartbeat", lambda: push_config(None, durable=None, idle_heartbeat=math.nan,
                                                   flow_control=False, deliver_policy=None,
                                                   inactive_threshold=None))  # fmt: skip
    refused("inactive_threshold", lambda: push_config(None, durable=None, idle_heartbeat=None,
                                                       flow_control=False, deliver_policy=None,
                                                       inactive_threshold="60"))  # fmt: skip


# -- pause in the past (P10) ------------------------------------------------------------------


def test_pause_consumer_refuses_a_time_that_is_not_in_the_future() -> None:
    """SDK's pause_consumer(..., 1) was accepted: JetStream takes it as "not paused", and a
    pause until 1970 stayed in the config. The CLI refused the same (TZ5)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                for until in (0, 1, int(time.time()), time.time_ns() - NS):
                    with pytest.raises(errors.InvalidArgumentError) as raised:
                        await rs.pause_consumer("S", "C", until)
                    assert raised.value.field == "pause_until_ns"
                    assert "resume_consumer" in raised.value.rule
            assert node.calls == []

    run(main())


# -- servers (P10) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "servers",
    [
        ",,,",  # CLI7: silently fell back to 127.0.0.1:7101
        "127.0.0.1:7101,,127.0.0.1:7102",
        ["nohostport"],  # CLI1/SDK-CONN: NotConnectedError after the connect timeout
        ["127.0.0.1:99999"],
        ["127.0.0.1:0"],
        ["127.0.0.1:"],
        [":7101"],
        ["::1:7101"],  # IPv6 without brackets
        ["nats://127.0.0.1:7101"],  # a URL: refused for its scheme (was "IPv6 ... brackets")
        ["host name:7101"],
        [""],
        [],
        [5],
        5,
    ],
)
def test_connect_refuses_malformed_server_addresses_at_once(servers: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(errors.InvalidArgumentError) as raised:
            await raftstream.connect(servers, timeout=5, connect_timeout=2)
        assert raised.value.field == "servers"
        assert loop.time() - started < 1.0  # refused, not waited for

    run(main())


def test_well_formed_server_addresses_pass() -> None:
    assert _args.check_servers("a:1, b:2") == ["a:1", "b:2"]
    assert _args.check_servers(["[::1]:7101", "localhost:65535"]) == [
        "[::1]:7101",
        "localhost:65535",
    ]


def test_a_queue_name_states_its_rule() -> None:
    """SB6: 'not a valid queue name', with no rule."""
    for bad in ("q 1", "", "q.1", "q*", "q>", "q\t", 5):
        exc = refused("queue", lambda bad=bad: _args.check_queue_name(bad))
        assert "whitespace" in exc.rule and "'.'" in exc.rule
    assert _args.check_queue_name("workers-1") == "workers-1"


# -- KV (P8) ----------------------------------------------------------------------------------


class NoCalls:
    """A client stand-in for ``KeyValue``: any call is a test failure (the checks must come
    first)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"KeyValue called client.{name} before checking its arguments")


def test_a_key_is_bounded_by_what_the_bucket_prefix_leaves_of_a_subject() -> None:
    """KP18: a 5000-byte key gave 'subject: must be at most 4096 bytes', and the real limit
    is 4096 minus '$KV.<bucket>.'."""
    kv = KeyValue(NoCalls(), "CONFIG")  # type: ignore[arg-type]
    room = 4096 - len("$KV.CONFIG.")
    assert kv._subject("k" * room) == "$KV.CONFIG." + "k" * room
    exc = refused("key", lambda: kv._subject("k" * (room + 1)))
    assert isinstance(exc, errors.InvalidKeyError) and str(room) in exc.rule

    async def main() -> None:
        for call in (
            kv.put("k" * 5000, b"v"),
            kv.get("k" * 5000),
            kv.update("k" * 5000, b"v", 1),
            kv.delete("k" * 5000),
            kv.watch("k." * 2500 + ">"),
        ):
            with pytest.raises(errors.InvalidKeyError) as raised:
                await call
            assert raised.value.field == "key"

    run(main())


def test_a_bucket_name_is_bounded_by_its_stream_name() -> None:
    """K11/SDK-K20: 'name: must be at most 255 bytes' (the stream's field); the bucket's
    limit is 255 minus 'KV_'."""
    assert kv_mod.BUCKET_BYTES_MAX == 252
    bucket_stream_config("B" * 252)
    exc = refused("bucket", lambda: bucket_stream_config("B" * 253))
    assert "252" in exc.rule
    refused("bucket", lambda: KeyValue(NoCalls(), "B" * 300))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("revision", lambda kv: kv.get("k", revision=2**63)),
        ("revision", lambda kv: kv.get("k", revision=0)),
        ("last", lambda kv: kv.update("k", b"v", -1)),
        ("last", lambda kv: kv.update("k", b"v", 2**63)),
        ("last", lambda kv: kv.update("k", b"v", "1")),
        ("last", lambda kv: kv.delete("k", last=-1)),
        ("last", lambda kv: kv.purge("k", last=True)),
    ],
)
def test_revisions_are_checked_under_their_own_names(field: str, call: Any) -> None:
    """KG4: 'revision: must be a positive integer, not 9999...' (it is positive);
    KP12: 'expected_last_subject_seq: ...' for the update's ``last``."""

    async def main() -> None:
        kv = KeyValue(NoCalls(), "CONFIG")  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgumentError) as raised:
            await call(kv)
        assert raised.value.field == field
        assert str(INT64_MAX) in raised.value.rule

    run(main())


@pytest.mark.parametrize("heartbeat", ["5", math.nan, math.inf, -1])
def test_a_watch_heartbeat_is_a_finite_number_of_seconds(heartbeat: object) -> None:
    """The same multiplication as nak's: a str heartbeat became a string of 5 * 10**9."""

    async def main() -> None:
        kv = KeyValue(NoCalls(), "CONFIG")  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidArgumentError) as raised:
            await kv.watch(">", heartbeat=heartbeat)  # type: ignore[arg-type]
        assert raised.value.field == "heartbeat"

    run(main())
