"""The SDK's config dataclasses stay in step with the engine's (the server's judge).

The SDK may not import the engine (docs/architecture.md: the SDK talks gRPC only), so it keeps its
own StreamConfig/ConsumerConfig with JetStream's field names; these tests (which may import
the engine) pin that the names, the defaults and the JSON form agree.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from raftstream import config as sdk
from raftstream import errors
from raftstream.engine import consumer_config as eng_consumer
from raftstream.engine import stream_config as eng_stream
from raftstream.engine import stream_source as eng_source
from raftstream.models import MsgMetadata


def _defaults(cls: type) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize(
    ("sdk_cls", "engine_cls"),
    [
        (sdk.StreamConfig, eng_stream.StreamConfig),
        (sdk.ConsumerConfig, eng_consumer.ConsumerConfig),
        (sdk.StreamSource, eng_source.StreamSource),
        (sdk.ExternalStream, eng_source.ExternalStream),
    ],
    ids=["stream", "consumer", "stream_source", "external_stream"],
)
def test_field_names_and_defaults_match_the_engine(sdk_cls: type, engine_cls: type):
    assert [f.name for f in dataclasses.fields(sdk_cls)] == [
        f.name for f in dataclasses.fields(engine_cls)
    ]
    assert _defaults(sdk_cls) == _defaults(engine_cls)


def test_every_engine_stream_json_key_is_an_sdk_field():
    engine_keys = set(eng_stream.StreamConfig(name="S").validate().to_dict())
    assert engine_keys <= {f.name for f in dataclasses.fields(sdk.StreamConfig)}


def test_a_stream_config_survives_sdk_to_engine_to_sdk():
    cfg = sdk.StreamConfig(
        name="ORDERS",
        subjects=["orders.>"],
        retention="workqueue",
        max_age=3600 * 10**9,
        discard=sdk.DiscardPolicy.NEW,
        max_msgs_per_subject=10,
        discard_new_per_subject=True,
        num_replicas=3,
        metadata={"team": "a"},
        subject_transform=sdk.SubjectTransform(src="orders.*", dest="o.$1"),
        allow_msg_ttl=True,
        placement=sdk.Placement(cluster="east", tags=["ssd", "az1"]),
    )
    engine = eng_stream.StreamConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert engine.to_dict() == cfg.to_dict()
    normalised = engine.validate().to_dict()
    assert sdk.StreamConfig.from_dict(normalised).to_dict() == normalised


def test_a_consumer_config_survives_sdk_to_engine_to_sdk():
    cfg = sdk.ConsumerConfig(
        durable_name="worker",
        deliver_policy="by_start_time",
        opt_start_time=1_700_000_000_123_456_789,
        ack_wait=5 * 10**9,
        backoff=[10**9, 2 * 10**9],
        max_deliver=5,
        filter_subjects=["orders.a", "orders.b"],
        max_batch=100,
        max_expires=10**9,
        pause_until=1_800_000_000 * 10**9,
        metadata={"k": "v"},
    )
    engine = eng_consumer.ConsumerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    back = sdk.ConsumerConfig.from_dict(json.loads(json.dumps(engine.to_dict())))
    assert back.to_dict() == engine.to_dict()
    assert back.opt_start_time == cfg.opt_start_time
    assert back.backoff == cfg.backoff
    assert back.ack_wait == engine.ack_wait == 10**9  # the engine's rule: backoff[0]


def test_unknown_keys_from_a_newer_server_are_ignored():
    cfg = sdk.StreamConfig.from_dict({"name": "S", "some_future_field": 1})
    assert cfg.name == "S"
    ccfg = sdk.ConsumerConfig.from_dict({"durable_name": "d", "priority_groups": ["x"]})
    assert ccfg.durable_name == "d"


def test_a_bad_enum_value_or_a_lone_string_names_the_field():
    with pytest.raises(errors.InvalidArgumentError) as raised:
        sdk.StreamConfig(name="S", retention="sometimes")
    assert raised.value.field == "retention"
    with pytest.raises(errors.InvalidArgumentError) as raised:
        sdk.StreamConfig(name="S", subjects="orders.>")
    assert raised.value.field == "subjects"


V2 = "$JS.ACK.hub.ACC.ORDERS.worker.3.41.17.1700000000000000000.5"


def test_ack_token_metadata_v2_v1_and_reserved_tokens():
    """ADR-15: the 11-token form (domain and account), tokens past the 11th ignored, and the
    9-token legacy form; domain '_' means none."""
    meta = MsgMetadata.from_reply(V2)
    assert (meta.domain, meta.account, meta.stream, meta.consumer) == (
        "hub",
        "ACC",
        "ORDERS",
        "worker",
    )
    assert (meta.num_delivered, meta.stream_seq, meta.consumer_seq) == (3, 41, 17)
    assert (meta.timestamp_ns, meta.num_pending) == (1_700_000_000_000_000_000, 5)
    assert MsgMetadata.from_reply(V2 + ".future.tokens") == meta
    v1 = MsgMetadata.from_reply("$JS.ACK.ORDERS.worker.3.41.17.1700000000000000000.5")
    assert (v1.domain, v1.account, v1.stream_seq) == (None, None, 41)
    assert MsgMetadata.from_reply(V2.replace(".hub.", "._.")).domain is None


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "_INBOX.x",
        "$JS.ACK.ORDERS.worker.3.41.17.1700",  # 8 tokens
        "$JS.ACK.a.b.ORDERS.worker.3.41.17.1",  # 10 tokens
        "$JS.ACK._.ACC.ORDERS.worker.x.41.17.1.5",  # non-numeric delivered count
        "$JS.ACK._.ACC.ORDERS.worker.+3.41.17.1.5",
        "$JS.ACK._.ACC..worker.3.41.17.1.5",  # empty stream token
    ],
)
def test_malformed_ack_tokens_are_refused(reply: str):
    with pytest.raises(errors.InvalidArgumentError) as raised:
        MsgMetadata.from_reply(reply)
    assert raised.value.field == "reply"


def test_engine_ack_tokens_parse_to_the_same_metadata():
    """The engine builds the tokens the node sends; the SDK reads them back the same."""
    from raftstream.engine.ack import build_ack_subject, parse_ack_subject

    token = build_ack_subject(
        stream="S",
        consumer="C",
        num_delivered=2,
        stream_seq=9,
        consumer_seq=4,
        timestamp=123,
        num_pending=7,
        account="$G",
    )
    ours, theirs = MsgMetadata.from_reply(token), parse_ack_subject(token)
    assert (ours.stream, ours.consumer, ours.num_delivered, ours.stream_seq) == (
        theirs.stream,
        theirs.consumer,
        theirs.num_delivered,
        theirs.stream_seq,
    )
    assert (ours.consumer_seq, ours.timestamp_ns, ours.num_pending, ours.account, ours.domain) == (
        theirs.consumer_seq,
        theirs.timestamp,
        theirs.num_pending,
        theirs.account,
        theirs.domain,
    )


def test_list_fields_refuse_a_non_list_naming_the_field() -> None:
    for make, field in (
        (lambda: sdk.StreamConfig(name="X", subjects=None), "subjects"),  # type: ignore[arg-type]
        (lambda: sdk.ConsumerConfig(durable_name="d", backoff=5), "backoff"),  # type: ignore[arg-type]
        (lambda: sdk.ConsumerConfig(durable_name="d", filter_subjects="a.b"), "filter_subjects"),
    ):
        with pytest.raises(errors.InvalidArgumentError) as err:
            make()
        assert err.value.field == field
