"""The node's limits on hostile input (issue 10, docs/limits.md): the checks of
``cluster/security/limits.py`` on their own (no node), then a real node: big-but-legal messages
work end to end, bigger ones fail RESOURCE_EXHAUSTED naming the field and rule, a pull
without a deadline ends by the server's cap, and the SDK refuses locally what no node takes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import raftstream
from raftstream import errors
from raftstream.cluster.config import MIB, Limits
from raftstream.cluster.security.limits import (
    INT64_MAX,
    SUBJECTS_DETAIL_MAX,
    LimitsInterceptor,
    bound_consumer,
    check_ack,
    check_publish,
    check_request,
    check_subjects_detail,
    sanitize,
)
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.errors import InvalidArgumentError, LimitError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_rpc_error
from raftstream.publisher import PAYLOAD_BYTES_CEILING
from raftstream.tooling.localnet import free_port
from tests.support.cluster import LocalCluster, running, until_led

LIMITS = Limits()
SVC = "/raftstream.v1."
SECRET = "s3cr3t-token-value"


def refused(method: str, request: Any, field: str, limits: Limits = LIMITS) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_request(SVC + method, request, limits)
    assert info.value.field == field, info.value


# -- the checks, no node ----------------------------------------------------------------------


def test_payload_above_the_limit_is_resource_exhausted_and_not_echoed() -> None:
    """docs/limits.md: a payload above payload_bytes_max is LimitError (RESOURCE_EXHAUSTED)
    naming field data and the rule; the message carries sizes, never the payload."""
    check_publish(pb.PublishRequest(subject="a.b", data=b"x" * MIB), LIMITS)  # exactly: fine
    with pytest.raises(LimitError) as info:
        check_publish(pb.PublishRequest(subject="a.b", data=SECRET.encode() * MIB), LIMITS)
    exc = info.value
    assert exc.details["field"] == "data" and exc.details["rule"] == "payload_bytes_max"
    assert exc.details["payload_bytes_max"] == MIB and SECRET not in exc.message


def test_header_count_size_name_and_value_rules() -> None:
    """Headers: at most headers_count_max, at most headers_bytes_max in all, names printable
    ASCII without ':' or spaces, values without control characters; a value is never
    quoted back (it may be a credential)."""
    lim = Limits(headers_count_max=2, headers_bytes_max=64)
    check_publish(pb.PublishRequest(subject="a", headers={"A": "1", "B": "2"}), lim)
    with pytest.raises(LimitError) as count:
        check_publish(pb.PublishRequest(subject="a", headers={"A": "", "B": "", "C": ""}), lim)
    assert count.value.details["rule"] == "headers_count_max"
    with pytest.raises(LimitError) as size:
        check_publish(pb.PublishRequest(subject="a", headers={"A": "v" * 64}), lim)
    assert size.value.details["rule"] == "headers_bytes_max"
    for name, value in (
        ("a b", "1"),
        ("a:b", "1"),
        ("", "1"),
        ("é", "1"),
        ("Auth", SECRET + "\r\n"),
    ):
        with pytest.raises(InvalidArgumentError) as bad:
            check_publish(pb.PublishRequest(subject="a", headers={name: value}), LIMITS)
        assert bad.value.field == "headers" and SECRET not in bad.value.message


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.PublishRequest(subject=""), "subject"),
        (pb.PublishRequest(subject="a..b"), "subject"),
        (pb.PublishRequest(subject="a.*"), "subject"),
        (pb.PublishRequest(subject="a", ttl_ns=-1), "ttl_ns"),
        (pb.PublishRequest(subject="a", msg_id="m" * 5000), "msg_id"),
        (pb.PublishRequest(subject="a", expected_stream="a.b"), "expected_stream"),
        (pb.PublishRequest(subject="a", expected_last_seq=INT64_MAX + 1), "expected_last_seq"),
    ],
)
def test_publish_fields(request_: pb.PublishRequest, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        check_publish(request_, LIMITS)
    assert info.value.field == field


@pytest.mark.parametrize(
    ("method", "request_", "field"),
    [
        ("StreamService/GetStreamInfo", pb.StreamInfoRequest(name=""), "name"),
        ("StreamService/GetStreamInfo", pb.StreamInfoRequest(name="a.b"), "name"),
        ("StreamService/GetStreamInfo", pb.StreamInfoRequest(name="x" * 256), "name"),
        (
            "StreamService/GetStreamInfo",
            pb.StreamInfoRequest(name="S", subjects_filter="a.>.b"),
            "subjects_filter",
        ),
        ("StreamService/DeleteStream", pb.DeleteStreamRequest(name="a b"), "name"),
        ("StreamService/ListStreams", pb.ListStreamsRequest(subject="a..b"), "subject"),
        ("StreamService/PurgeStream", pb.PurgeStreamRequest(name="S", seq=2, keep=1), "keep"),
        ("StreamService/PurgeStream", pb.PurgeStreamRequest(name="S", keep=2**64 - 1), "keep"),
        ("StreamService/GetMessage", pb.GetMessageRequest(stream="S"), "by"),
        ("StreamService/GetMessage", pb.GetMessageRequest(stream="S", seq=2**63), "seq"),
        ("StreamService/DeleteMessage", pb.DeleteMessageRequest(stream="S"), "seq"),
        (
            "StreamService/StepDownStreamLeader",
            pb.StreamStepDownRequest(stream="S", preferred="a:b"),
            "preferred",
        ),
        (
            "ConsumerService/CreateConsumer",
            pb.CreateConsumerRequest(stream="S", action=7),
            "action",
        ),
        (
            "ConsumerService/CreateConsumer",
            pb.CreateConsumerRequest(stream="S", config_json="{" * MIB),
            "config_json",
        ),
        (
            "ConsumerService/GetConsumerInfo",
            pb.ConsumerInfoRequest(stream="S", consumer=">"),
            "consumer",
        ),
        (
            "ConsumerService/ResetConsumer",
            pb.ResetConsumerRequest(stream="S", consumer="C", seq=2**64 - 1),
            "seq",
        ),
        ("ConsumeService/Fetch", pb.FetchRequest(stream="S", consumer="C"), "batch"),
        ("ConsumeService/Fetch", pb.FetchRequest(stream="S", consumer="C", batch=10_001), "batch"),
        (
            "ConsumeService/Fetch",
            pb.FetchRequest(stream="S", consumer="C", batch=1, max_bytes=2**40),
            "max_bytes",
        ),
        (
            "ConsumeService/Fetch",
            pb.FetchRequest(stream="S", consumer="C", batch=1, expires_ns=-1),
            "expires_ns",
        ),
        (
            "ConsumeService/Fetch",
            pb.FetchRequest(stream="S", consumer="C", batch=1, expires_ns=61 * 10**9),
            "expires_ns",
        ),
        (
            "ConsumeService/Fetch",
            pb.FetchRequest(
                stream="S", consumer="C", batch=1, expires_ns=10**9, idle_heartbeat_ns=1
            ),
            "idle_heartbeat_ns",
        ),
        ("ConsumeService/Consume", pb.ConsumeRequest(), "start"),
        (
            "ConsumeService/Consume",
            pb.ConsumeRequest(start=pb.ConsumeStart(stream="S", consumer="C", queue="a b")),
            "start.queue",
        ),
        ("ClusterService/RemovePeer", pb.RemovePeerRequest(peer=""), "peer"),
        ("ClusterService/AddPeer", pb.AddPeerRequest(peer="a b"), "peer"),
    ],
)
def test_every_rpc_checks_its_fields(method: str, request_: Any, field: str) -> None:
    """Names, subjects, sequences (int64), batches, expiries, heartbeats, enums: refused
    INVALID_ARGUMENT naming the field before the request reaches a servicer."""
    refused(method, request_, field)


def test_well_formed_requests_pass() -> None:
    check_request(SVC + "StreamService/GetStreamInfo", pb.StreamInfoRequest(name="S"), LIMITS)
    fetch = pb.FetchRequest(stream="S", consumer="C", batch=10_000, expires_ns=60 * 10**9)
    check_request(SVC + "ConsumeService/Fetch", fetch, LIMITS)
    check_request(SVC + "ClusterService/GetClusterInfo", pb.ClusterInfoRequest(), LIMITS)


def test_acks_are_checked_per_item() -> None:
    ok = pb.AckItem(reply="$JS.ACK.S.C.1.5.5.0.0", kind=pb.ACK_KIND_NAK, delay_ns=10**9)
    check_ack(ok, LIMITS)
    bad = {
        "reply": pb.AckItem(reply=f"$JS.ACK.S.C.1.{2**64}.1.0.0"),
        "kind": pb.AckItem(reply="$JS.ACK.S.C.1.5.5.0.0", kind=9),
        "delay_ns": pb.AckItem(reply="$JS.ACK.S.C.1.5.5.0.0", delay_ns=-1),
        "next_batch": pb.AckItem(reply="$JS.ACK.S.C.1.5.5.0.0", next_batch=10_001),
    }
    for field, item in bad.items():
        with pytest.raises(InvalidArgumentError) as info:
            check_ack(item, LIMITS)
        assert info.value.field == field


def test_pull_consumers_stay_within_the_node_limits() -> None:
    """A consumer's max_waiting left at its default is lowered to pull_waiting_max; set
    above it, or max_batch/max_bytes above the node's, is refused by name."""
    lim = Limits(pull_waiting_max=16, pull_batch_msgs_max=100, pull_batch_bytes_max=MIB)
    assert bound_consumer(ConsumerConfig(durable_name="C"), lim).max_waiting == 16
    for field, value in (("max_waiting", 17), ("max_batch", 101), ("max_bytes", MIB + 1)):
        with pytest.raises(InvalidArgumentError) as info:
            bound_consumer(ConsumerConfig(durable_name="C", **{field: value}), lim)
        assert info.value.field == field


def test_limits_config_rules() -> None:
    """The payload is never above 64 MiB, headers never above 1 MiB, the default deadline
    never above the cap; the gRPC message size follows from them."""
    for kwargs, field in (
        (
            {"payload_bytes_max": 64 * MIB + 1, "publish_batch_bytes_max": 128 * MIB},
            "payload_bytes_max",
        ),
        ({"headers_bytes_max": MIB + 1, "publish_batch_bytes_max": 8 * MIB}, "headers_bytes_max"),
        ({"request_timeout_ms": 10, "call_timeout_max_ms": 9}, "request_timeout_ms"),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            Limits(**kwargs)
        assert info.value.field == f"limits.{field}"
    top = Limits(
        payload_bytes_max=64 * MIB, headers_bytes_max=MIB, publish_batch_bytes_max=65 * MIB
    )
    assert top.grpc_message_bytes_max <= raftstream._conn.MESSAGE_BYTES_MAX  # the SDK reads it


def test_stream_info_subject_counts_are_bounded() -> None:
    check_subjects_detail({f"s.{i}": 1 for i in range(SUBJECTS_DETAIL_MAX)})
    with pytest.raises(LimitError) as info:
        check_subjects_detail({f"s.{i}": 1 for i in range(SUBJECTS_DETAIL_MAX + 1)})
    assert info.value.details["field"] == "subjects_filter"


def test_sanitize_keeps_a_short_escaped_prefix() -> None:
    out = sanitize("a\r\n" + "b" * 100)
    assert out.startswith("'a\\r\\n") and out.endswith("...") and len(out) < 45


# -- a real node ------------------------------------------------------------------------------


class _HeldFetch(pbg.ConsumeServiceServicer):  # type: ignore[misc]
    """A Fetch that stays open until ``release`` is set (no messages)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def Fetch(self, request: Any, context: Any) -> Any:
        self.started.set()
        await self.release.wait()
        yield pb.FetchResponse()


def test_streaming_calls_are_capped_per_node() -> None:
    """With streaming_calls_max open streaming calls (here 1, a Fetch held open), one more
    (a Fetch, or a bidirectional AckStream) is RESOURCE_EXHAUSTED naming the limit, before
    its servicer runs; once the open one ends its place is free again."""
    held = _HeldFetch()
    fetch = pb.FetchRequest(stream="S", consumer="C", batch=1)

    async def body() -> None:
        limits = Limits(streaming_calls_max=1)
        server = grpc.aio.server(interceptors=(LimitsInterceptor(limits),))
        pbg.add_ConsumeServiceServicer_to_server(held, server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.ConsumeServiceStub(ch)
                first = stub.Fetch(fetch, timeout=30)
                await held.started.wait()

                async def acks() -> Any:
                    yield pb.AckBatch()

                for call in (stub.Fetch(fetch, timeout=30), stub.AckStream(acks(), timeout=30)):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        async for _ in call:
                            pass
                    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert from_rpc_error(err.value).details["limit"] == "streaming_calls_max"
                held.release.set()
                assert len([r async for r in first]) == 1
                again = [r async for r in stub.Fetch(fetch, timeout=30)]
                assert len(again) == 1
        finally:
            await server.stop(None)

    asyncio.run(body())


CALL_TIMEOUT_MAX_MS = 2_000
STREAMS_MAX = 6  # the module's other tests make 4 streams and 2 consumers
CONSUMERS_MAX = 4


class _CappedCluster(LocalCluster):
    """Default limits, but a short server cap on calls (so a test can wait it out)."""

    def _write_config(self, name: str) -> Any:
        p = super()._write_config(name)
        cap = f"request_timeout_ms = 1000\ncall_timeout_max_ms = {CALL_TIMEOUT_MAX_MS}\n"
        cap += f"streams_max = {STREAMS_MAX}\nconsumers_max = {CONSUMERS_MAX}\n"
        p.write_text(p.read_text() + "\n[limits]\n" + cap)
        return p


@pytest.fixture(scope="module")
def node() -> Iterator[LocalCluster]:
    c = _CappedCluster(1)
    with running(c):
        yield c


def _create(ch: grpc.Channel, name: str, subjects: list[str], **cfg: Any) -> None:
    body = json.dumps({"name": name, "subjects": subjects, **cfg})
    pbg.StreamServiceStub(ch).CreateStream(pb.CreateStreamRequest(config_json=body), timeout=20)
    info = pb.StreamInfoRequest(name=name)
    until_led(pbg.StreamServiceStub(ch).GetStreamInfo)(info, timeout=20)


@pytest.mark.integration
def test_big_but_legal_messages_go_through_and_bigger_ones_are_refused(node: LocalCluster) -> None:
    """1 MiB payloads with headers are published and fetched (three in one pull: each
    response fits the gRPC limit); 1 MiB + 1 is RESOURCE_EXHAUSTED naming data and
    payload_bytes_max, and stores nothing."""
    with grpc.insecure_channel(node.servers[0], options=raftstream._conn.CHANNEL_OPTIONS) as ch:
        _create(ch, "BIG", ["big.>"])
        publish = pbg.PublishServiceStub(ch)
        headers = {"h": "v" * 1000}
        for _ in range(3):
            publish.Publish(
                pb.PublishRequest(subject="big.a", data=b"x" * MIB, headers=headers), timeout=20
            )
        with pytest.raises(grpc.RpcError) as info:
            publish.Publish(pb.PublishRequest(subject="big.a", data=b"x" * (MIB + 1)), timeout=20)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        exc = from_rpc_error(info.value)
        assert exc.details["field"] == "data" and exc.details["rule"] == "payload_bytes_max"
        streams = pbg.StreamServiceStub(ch)
        assert (
            streams.GetStreamInfo(pb.StreamInfoRequest(name="BIG"), timeout=20).state.messages == 3
        )
        consumer = json.dumps({"durable_name": "C", "ack_policy": "none"})
        pbg.ConsumerServiceStub(ch).CreateConsumer(
            pb.CreateConsumerRequest(stream="BIG", config_json=consumer), timeout=20
        )
        fetch = pb.FetchRequest(stream="BIG", consumer="C", batch=3, expires_ns=1_500_000_000)
        responses = list(pbg.ConsumeServiceStub(ch).Fetch(fetch, timeout=20))
        got = [m for r in responses for m in r.messages]
        assert [len(m.data) for m in got] == [MIB] * 3 and got[0].headers == headers
        assert len(responses) >= 2  # grouped only up to one largest message per response
        # A stream's own max_msg_size still applies below the node's limit.
        _create(ch, "SMALL", ["small.>"], max_msg_size=10)
        with pytest.raises(grpc.RpcError) as small:
            publish.Publish(pb.PublishRequest(subject="small.a", data=b"x" * 11), timeout=20)
        assert small.value.code() != grpc.StatusCode.OK


@pytest.mark.integration
def test_a_pull_without_a_deadline_ends_by_the_server_cap(node: LocalCluster) -> None:
    """A Fetch with neither a client deadline nor expires, on an empty stream, waits at
    most the server's cap (call_timeout_max_ms) and ends with 408 Request Timeout, not a
    hang; a longer expires is refused naming the field. (No client deadline here: a hang
    would be caught by pytest's own timeout, never by a timed assertion.)"""
    with grpc.insecure_channel(node.servers[0]) as ch:
        _create(ch, "IDLE", ["idle.>"])
        consumer = json.dumps({"durable_name": "C", "ack_policy": "explicit"})
        pbg.ConsumerServiceStub(ch).CreateConsumer(
            pb.CreateConsumerRequest(stream="IDLE", config_json=consumer), timeout=20
        )
        consume = pbg.ConsumeServiceStub(ch)
        fetch = pb.FetchRequest(stream="IDLE", consumer="C", batch=1)
        statuses = [(r.status.code, r.status.description) for r in consume.Fetch(fetch)]
        assert statuses == [(408, "Request Timeout")]
        too_long = pb.FetchRequest(
            stream="IDLE", consumer="C", batch=1, expires_ns=(CALL_TIMEOUT_MAX_MS + 1) * 10**6
        )
        with pytest.raises(grpc.RpcError) as info:
            list(consume.Fetch(too_long))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert from_rpc_error(info.value).details.get("grpc_code") == "INVALID_ARGUMENT"
        assert "expires_ns" in (info.value.details() or "")


@pytest.mark.integration
def test_the_sdk_refuses_locally_what_no_node_takes(node: LocalCluster) -> None:
    """The SDK fails fast, with the node's error type, on a payload above 64 MiB, and
    above the node's limit once it learned it from a refusal (publish_async then raises
    at once instead of queueing)."""

    async def body() -> None:
        rs = await raftstream.connect(node.servers, timeout=20)
        try:
            await rs.add_stream(name="SDKLIM", subjects=["sdklim.>"])
            with pytest.raises(errors.LimitError) as ceiling:
                await rs.publish("sdklim.a", b"x" * (PAYLOAD_BYTES_CEILING + 1))
            assert ceiling.value.details["payload_bytes_max"] == PAYLOAD_BYTES_CEILING
            fut = await rs.publish_async("sdklim.a", b"x" * (MIB + 1))  # queued: sent
            with pytest.raises(errors.LimitError):
                await fut  # the node's refusal, which carries its limit
            with pytest.raises(errors.LimitError) as learned:
                await rs.publish_async("sdklim.a", b"x" * (MIB + 1))  # refused before queueing
            assert learned.value.details["payload_bytes_max"] == MIB
            assert (await rs.publish("sdklim.a", b"x" * MIB)).seq == 1
        finally:
            await rs.close()

    asyncio.run(asyncio.wait_for(body(), 120))


@pytest.mark.integration
def test_streams_and_consumers_are_capped_cluster_wide(node: LocalCluster) -> None:
    """Without [auth] (one account, no account limits) a client still cannot create
    streams or consumers without bound: past streams_max / consumers_max the create is
    RESOURCE_EXHAUSTED naming the limit and creates nothing; a re-create of an existing
    stream at the cap is still answered (it takes no new place)."""
    streams = pbg.StreamServiceStub
    with grpc.insecure_channel(node.servers[0]) as ch:
        made: list[str] = []

        def create(name: str) -> None:
            body = json.dumps({"name": name, "subjects": [f"{name.lower()}.>"]})
            streams(ch).CreateStream(pb.CreateStreamRequest(config_json=body), timeout=20)

        try:
            with pytest.raises(grpc.RpcError) as full:
                for i in range(STREAMS_MAX + 1):
                    create(f"CAP{i}")
                    made.append(f"CAP{i}")
            assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert from_rpc_error(full.value).details["limit"] == "streams_max"
            names = streams(ch).StreamNames(pb.StreamNamesRequest(), timeout=20)
            assert names.page.total == STREAMS_MAX and f"CAP{len(made)}" not in names.names
            create(made[0])  # idempotent re-create: no new place
            consumers = pbg.ConsumerServiceStub(ch)
            with pytest.raises(grpc.RpcError) as many:
                for i in range(CONSUMERS_MAX + 1):
                    cfg = json.dumps({"durable_name": f"D{i}", "ack_policy": "none"})
                    consumers.CreateConsumer(
                        pb.CreateConsumerRequest(stream=made[0], config_json=cfg), timeout=20
                    )
            assert many.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert from_rpc_error(many.value).details["limit"] == "consumers_max"
        finally:
            for name in made:
                streams(ch).DeleteStream(pb.DeleteStreamRequest(name=name), timeout=20)
