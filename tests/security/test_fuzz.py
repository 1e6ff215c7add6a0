"""Hostile input against a running node (issue 10): random and malformed requests of every
client RPC, built generically from the proto descriptors, and raw garbage on the wire.

What it pins (docs/limits.md):

- every call ends with a gRPC status, OK or an error code: with a deadline, gRPC's own; a
  unary or server-streaming call WITHOUT a deadline must end by the server's cap
  (``limits.request_timeout_ms`` / ``call_timeout_max_ms``) plus a generous grace;
- no request, garbage included, is an unhandled server error (INTERNAL or UNKNOWN): every
  refusal is a typed error naming the field and the rule (garbage: field ``request``);
- the node stays up and SERVING (grpc health) after every request;
- the data is unchanged by every REJECTED request: streams (config, messages, bytes,
  sequences) and durable consumers (config, ack floor) are snapshotted before each request
  and compared after it when the answer was a refusal. Accepted requests may change things
  (they are re-snapshotted); so the requests aim at a seeded stream and its consumers most
  of the time, so refusals hit real state rather than names that do not exist.

The shapes include deep nesting (JSON arrays and objects, nested ``metadata``), long lists
(``subjects``, ``filter_subjects``) and long repeated fields (issue 39).

Bounded for ``make test``: ``FUZZ_EXAMPLES`` examples (default 120) within ``FUZZ_SECONDS``
(default 40 s) of calls; ``make fuzz`` runs a longer campaign. The figures (requests tried,
status codes seen) are printed at the end.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.support.cluster import LocalCluster, running

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
SECONDS = float(os.environ.get("FUZZ_SECONDS", "40"))
# The fuzzed node's limits: small, so over-limit requests are cheap to build and send.
PAYLOAD_BYTES_MAX = 64 * 1024
HEADERS_BYTES_MAX = 4 * 1024
REQUEST_TIMEOUT_MS = 1_500
CALL_TIMEOUT_MAX_MS = 3_000
LIMITS_TOML = f"""
[limits]
payload_bytes_max = {PAYLOAD_BYTES_MAX}
headers_bytes_max = {HEADERS_BYTES_MAX}
headers_count_max = 16
pull_batch_msgs_max = 100
pull_batch_bytes_max = 1048576
pull_waiting_max = 16
request_timeout_ms = {REQUEST_TIMEOUT_MS}
call_timeout_max_ms = {CALL_TIMEOUT_MAX_MS}
"""
CALL_DEADLINE_S = (0.3, 0.8, 1.5)
SNAPSHOT_RETRY_S = 15.0
NO_DEADLINE_GRACE_S = 15.0  # generous: a noisy 2-core machine, but a hang is forever
UNHANDLED = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
# An outcome the client cannot know (the request may or may not have been applied).
AMBIGUOUS = frozenset(
    {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
)

STREAM, OTHER, PULL, PUSH = "VICTIM", "OTHER", "VC", "VP"
NAMES = [STREAM, STREAM, STREAM, OTHER, PULL, PULL, PUSH, "NEW1", "n1"]
NAMES += ["", "a.b", "*", ">", "x" * 300, "a b", "é"]
SUBJECTS = ["fz.v.a", "fz.v.a", "fz.v.>", "fz.v.*", "fz.o.a", "fz.n", ">", "*", "fz..v", "", " "]
SUBJECTS += ["$JS.API.x"]
SUBJECTS += ["a" * 5000, "fz.v.\x00", "fz.v.a b"]
ACK_TOKENS = [
    f"$JS.ACK.{STREAM}.{PULL}.1.3.3.0.0",
    f"$JS.ACK.{STREAM}.{PULL}.1.99999999999999999999.1.0.0",
    f"$JS.ACK.{STREAM}.{PUSH}.1.2.2.0.0",
    "$JS.ACK.x",
    "$JS.ACK." + "9" * 4000,
    "",
]
INT_EDGES = [0, 1, -1, 2, 100, 2**31 - 1, -(2**31), 2**32 - 1, 2**53, 2**63 - 1, -(2**63)]
UINT64_EDGES = [0, 1, 2, 5, 100, 2**32 - 1, 2**63 - 1, 2**63, 2**64 - 1]
CONFIG_KEYS = [
    "name", "subjects", "storage", "num_replicas", "max_msgs", "max_bytes", "max_msg_size",
    "discard", "retention", "duplicate_window", "max_consumers", "durable_name",
    "deliver_subject", "ack_policy", "max_waiting", "max_batch", "max_expires",
    "max_ack_pending", "filter_subject", "deliver_policy", "opt_start_seq", "idle_heartbeat",
    "flow_control", "ack_wait", "max_deliver", "backoff", "metadata", "headers_only",
    "deliver_group", "sample_freq", "bogus",
]  # fmt: skip
# No max_age, inactive_threshold or TTLs: they would change the data with time, not requests.

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
METHODS: list[MethodDescriptor] = [
    m for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods
]


def path(m: MethodDescriptor) -> str:
    return f"/{m.containing_service.full_name}/{m.name}"


BY_PATH = {path(m): m for m in METHODS}


# -- strategies, from the descriptors ----------------------------------------------------------


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (*INT_EDGES, *UINT64_EDGES) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _string(field: str) -> st.SearchStrategy[str]:
    big = st.builds(lambda c, n: c * n, st.sampled_from("a.\u00e9>"), st.integers(0, 70_000))
    if field in ("stream", "name", "consumer", "expected_stream", "durable_name"):
        special: st.SearchStrategy[str] = st.sampled_from(NAMES)
    elif "subject" in field or field in ("queue", "deliver_subject"):
        special = st.sampled_from(SUBJECTS)
    elif field == "reply":
        special = st.sampled_from(ACK_TOKENS)
    elif field == "config_json":
        special = _config_json()
    else:
        special = st.sampled_from(["", "n1", "x" * 300])
    return st.one_of(special, special, special, special, TEXT, big)


def _json_value() -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.sampled_from([*INT_EDGES, 10**30, -(10**30)]),
        st.booleans(),
        st.sampled_from(NAMES + SUBJECTS + ["file", "memory", "explicit", "none", "all"]),
        st.floats(allow_nan=False),
        st.none(),
    )
    return st.one_of(
        scalar, st.lists(scalar, max_size=3), st.dictionaries(TEXT, scalar, max_size=3)
    )


def _config_json() -> st.SearchStrategy[str]:
    config = st.dictionaries(st.sampled_from(CONFIG_KEYS), _json_value(), max_size=8)
    valid_stream = st.fixed_dictionaries(
        {
            "name": st.sampled_from(NAMES),
            "subjects": st.lists(st.sampled_from(SUBJECTS), max_size=2),
        }
    )
    valid_consumer = st.fixed_dictionaries(
        {"durable_name": st.sampled_from(NAMES), "ack_policy": st.sampled_from(["explicit", "x"])}
    )
    docs = st.one_of(config, valid_stream, valid_consumer, _json_value())
    return st.one_of(
        docs.map(json.dumps),
        st.sampled_from(["{", "[]", "null", "{}" * 1000]),
        _deep_json(),
        _long_lists(),
    )


def _nested_array(n: int) -> str:
    return "[" * n + "]" * n


def _nested_object(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def _nested_metadata(n: int) -> str:
    return '{"name":"FZ","metadata":' + '{"k":' * n + '"v"' + "}" * n + "}"


def _many_subjects(k: int) -> str:
    return json.dumps({"name": "FZ", "subjects": [f"fz.l{i}" for i in range(k)]})


def _one_subject_repeated(k: int) -> str:
    return json.dumps({"name": "FZ", "subjects": ["fz.v.>"] * k})


def _many_filters(k: int) -> str:
    return json.dumps({"durable_name": "FZL", "filter_subjects": [f"fz.v.{i}" for i in range(k)]})


def _long_description(k: int) -> str:
    return json.dumps({"name": "FZ", "description": "d" * k * 10})


# Issue 39's shapes, by kind: deep nesting (bare brackets, nested objects, a config whose
# ``metadata`` nests: the parser's depth bound must refuse them by name, never INTERNAL),
# and long lists and long repeated values.
DEEP = (_nested_array, _nested_object, _nested_metadata)
LONG = (_many_subjects, _one_subject_repeated, _many_filters, _long_description)


def _deep_json() -> st.SearchStrategy[str]:
    depth = st.sampled_from([50, 64, 65, 200, 1_000, 100_000])
    return st.one_of(*(depth.map(shape) for shape in DEEP))


def _long_lists() -> st.SearchStrategy[str]:
    n = st.sampled_from([1_001, 5_000, 20_000])
    return st.one_of(*(n.map(shape) for shape in LONG))


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t in (
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SFIXED32,
    ):
        return _ints(-(2**31), 2**31 - 1)
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return _ints(-(2**63), 2**63 - 1)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return _ints(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return _ints(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.integers(-3, 8)  # known values and unknown ones (proto3 enums are open)
    if t == FieldDescriptor.TYPE_STRING:
        return _string(f.name)
    if t == FieldDescriptor.TYPE_BYTES:
        sizes = [
            PAYLOAD_BYTES_MAX - 1,
            PAYLOAD_BYTES_MAX,
            PAYLOAD_BYTES_MAX + 1,
            4 * PAYLOAD_BYTES_MAX,
        ]
        return st.one_of(st.binary(max_size=64), st.sampled_from(sizes).map(lambda n: b"\xff" * n))
    if t == FieldDescriptor.TYPE_DOUBLE or t == FieldDescriptor.TYPE_FLOAT:
        return st.floats()
    raise AssertionError(f"no strategy for field type {t} of {f.full_name}")


def _set_field(draw: st.DrawFn, msg: Any, f: FieldDescriptor, depth: int) -> None:
    """Give field ``f`` of ``msg`` a random value (replacing what it had)."""
    msg.ClearField(f.name)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        for _ in range(draw(st.sampled_from([0, 1, 3, 40]))):
            getattr(msg, f.name)[draw(_scalar(k))] = draw(_scalar(v))
    elif f.message_type is not None:
        if depth >= 2:
            return
        for _ in range(draw(st.integers(1, 3)) if f.is_repeated else 1):
            sub = draw(messages(f.message_type, depth + 1))
            if f.is_repeated:
                getattr(msg, f.name).add().CopyFrom(sub)
            else:
                getattr(msg, f.name).CopyFrom(sub)
    elif f.is_repeated:
        if draw(st.integers(0, 9)) == 0:  # a long repeated field: one value, many times
            getattr(msg, f.name).extend([draw(_scalar(f))] * draw(st.sampled_from([500, 5_000])))
        else:
            getattr(msg, f.name).extend(draw(st.lists(_scalar(f), max_size=3)))
    else:
        setattr(msg, f.name, draw(_scalar(f)))


@st.composite
def messages(draw: st.DrawFn, desc: Descriptor, depth: int = 0) -> Any:
    """A message of type ``desc`` with a random subset of its fields set to random values."""
    msg = message_factory.GetMessageClass(desc)()
    for f in desc.fields:
        if draw(st.booleans()):
            _set_field(draw, msg, f, depth)
    return msg


@st.composite
def mutants(draw: st.DrawFn, m: MethodDescriptor) -> Any:
    """A valid request of ``m`` (``templates``) with up to three of its fields replaced by
    random values: close enough to valid to get past the first check and hit real state."""
    msg = message_factory.GetMessageClass(m.input_type)()
    msg.CopyFrom(draw(st.sampled_from(templates()[m.name])))
    some = list(m.input_type.fields)
    fields = draw(st.lists(st.sampled_from(some), max_size=3, unique=True)) if some else []
    for f in fields:
        _set_field(draw, msg, f, 0)
    return msg


def _ack_item(seq: int = 1, **kw: Any) -> pb.AckItem:
    return pb.AckItem(reply=f"$JS.ACK.{STREAM}.{PULL}.1.{seq}.{seq}.0.0", **kw)


def templates() -> dict[str, list[Any]]:
    """Valid requests of every RPC against the seeded streams and consumers."""
    new_stream = json.dumps({"name": "NEW1", "subjects": ["fz.n.>"]})
    other = json.dumps({"name": OTHER, "subjects": ["fz.o.>"], "max_msgs": 100})
    new_c = json.dumps({"durable_name": "NEWC", "ack_policy": "explicit"})
    pull = json.dumps({"durable_name": PULL, "ack_policy": "explicit", "max_ack_pending": 50})
    vc = {"stream": STREAM, "consumer": PULL}
    pubs = [pb.PublishRequest(id=i, subject="fz.v.a", data=b"x") for i in (1, 2)]
    return {
        "CreateStream": [pb.CreateStreamRequest(config_json=new_stream)],
        "UpdateStream": [pb.UpdateStreamRequest(config_json=other)],
        "DeleteStream": [pb.DeleteStreamRequest(name="NEW1")],
        "GetStreamInfo": [pb.StreamInfoRequest(name=STREAM, subjects_filter=">")],
        "ListStreams": [pb.ListStreamsRequest(subject="fz.>")],
        "StreamNames": [pb.StreamNamesRequest()],
        "PurgeStream": [pb.PurgeStreamRequest(name=OTHER, keep=1)],
        "GetMessage": [pb.GetMessageRequest(stream=STREAM, seq=1)],
        "DeleteMessage": [pb.DeleteMessageRequest(stream=OTHER, seq=1)],
        "StepDownStreamLeader": [pb.StreamStepDownRequest(stream=STREAM)],
        "CreateConsumer": [pb.CreateConsumerRequest(stream=STREAM, config_json=new_c)],
        "UpdateConsumer": [pb.UpdateConsumerRequest(stream=STREAM, config_json=pull)],
        "DeleteConsumer": [pb.DeleteConsumerRequest(stream=STREAM, consumer="NEWC")],
        "GetConsumerInfo": [pb.ConsumerInfoRequest(**vc)],
        "ListConsumers": [pb.ListConsumersRequest(stream=STREAM)],
        "ConsumerNames": [pb.ConsumerNamesRequest(stream=STREAM)],
        "PauseConsumer": [pb.PauseConsumerRequest(**vc, pause_until_ns=1)],
        "ResumeConsumer": [pb.ResumeConsumerRequest(**vc)],
        "ResetConsumer": [pb.ResetConsumerRequest(**vc, seq=1)],
        "StepDownConsumerLeader": [pb.ConsumerStepDownRequest(**vc)],
        "Publish": [pb.PublishRequest(subject="fz.v.a", data=b"x", headers={"k": "v"})],
        "PublishStream": [pb.PublishBatch(requests=pubs)],
        "Fetch": [pb.FetchRequest(**vc, batch=2, expires_ns=200_000_000)],
        "Ack": [pb.AckRequest(ack=_ack_item())],
        "AckStream": [pb.AckBatch(acks=[_ack_item(2, id=1, sync=True)])],
        "Consume": [pb.ConsumeRequest(start=pb.ConsumeStart(stream=STREAM, consumer=PUSH))],
        "GetClusterInfo": [pb.ClusterInfoRequest()],
        "StepDownMetaLeader": [pb.MetaStepDownRequest()],
        "RemovePeer": [pb.RemovePeerRequest(peer="n9")],
        "AddPeer": [pb.AddPeerRequest(peer="n9")],
    }


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, list[bytes], bool, float | None]:
    """(method path, serialized request messages, garbage?, deadline in s or None)."""
    m = draw(st.sampled_from(METHODS))
    garbage = draw(st.integers(0, 9)) == 0
    count = draw(st.integers(0, 3)) if m.client_streaming else 1
    if garbage:
        bodies = [draw(st.binary(max_size=256)) for _ in range(count)]
    else:
        one = st.one_of(messages(m.input_type), mutants(m), mutants(m))
        bodies = [draw(one).SerializeToString() for _ in range(count)]
    deadline: float | None = draw(st.sampled_from(CALL_DEADLINE_S))
    if not m.client_streaming and draw(st.integers(0, 4)) == 0:
        deadline = None  # the server's cap must end it
    return path(m), bodies, garbage, deadline


# -- the node and its state --------------------------------------------------------------------


class _FuzzCluster(LocalCluster):
    """LocalCluster whose nodes run with the fuzz limits."""

    def _write_config(self, name: str) -> Any:
        p = super()._write_config(name)
        p.write_text(p.read_text() + LIMITS_TOML)
        return p


@pytest.fixture(scope="module")
def node() -> Iterator[_FuzzCluster]:
    with running(_FuzzCluster(1)) as c:
        _seed(c.servers[0])
        yield c


def _seed(addr: str) -> None:
    with grpc.insecure_channel(addr) as ch:
        streams, consumers = pbg.StreamServiceStub(ch), pbg.ConsumerServiceStub(ch)
        publish = pbg.PublishServiceStub(ch)
        for name, subject in ((STREAM, "fz.v.>"), (OTHER, "fz.o.>")):
            cfg = {"name": name, "subjects": [subject]}
            streams.CreateStream(pb.CreateStreamRequest(config_json=json.dumps(cfg)), timeout=10)
        snapshot(ch)  # retried until both streams have their leader
        for i in range(20):
            publish.Publish(pb.PublishRequest(subject=f"fz.v.{i % 3}", data=b"%d" % i), timeout=10)
        for cfg in (
            {"durable_name": PULL, "ack_policy": "explicit"},
            {"durable_name": PUSH, "ack_policy": "explicit", "deliver_subject": "fz.push"},
        ):
            req = pb.CreateConsumerRequest(stream=STREAM, config_json=json.dumps(cfg))
            consumers.CreateConsumer(req, timeout=10)


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


@retry(
    retry=retry_if_exception(_unavailable),
    stop=stop_after_delay(SNAPSHOT_RETRY_S),
    wait=wait_fixed(0.05),
    reraise=True,
)
def snapshot(ch: grpc.Channel) -> dict[str, Any]:
    """Streams (config, messages, bytes, sequences) and durable consumers (config, ack
    floor): everything only a request may change (no ages or inactivity here). A stream
    just created may not have elected its leader yet: retried (UNAVAILABLE) a while."""
    streams, consumers = pbg.StreamServiceStub(ch), pbg.ConsumerServiceStub(ch)
    out: dict[str, Any] = {}
    names = streams.StreamNames(pb.StreamNamesRequest(), timeout=10).names
    for name in names:
        info = streams.GetStreamInfo(pb.StreamInfoRequest(name=name), timeout=10)
        s = info.state
        state = (s.messages, s.bytes, s.first_seq, s.last_seq, s.num_deleted)
        out[name] = {"config": info.config_json, "state": state, "consumers": {}}
        for c in consumers.ConsumerNames(pb.ConsumerNamesRequest(stream=name), timeout=10).names:
            ci = consumers.GetConsumerInfo(
                pb.ConsumerInfoRequest(stream=name, consumer=c), timeout=10
            )
            cfg = json.loads(ci.config_json)
            if cfg.get("durable_name"):
                out[name]["consumers"][c] = (ci.config_json, ci.ack_floor.stream_seq)
    return out


def _healthy(ch: grpc.Channel) -> bool:
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


# -- calls -------------------------------------------------------------------------------------


def call(
    ch: grpc.Channel, m: MethodDescriptor, bodies: list[bytes], deadline: float | None
) -> grpc.StatusCode:
    """Send ``bodies`` (already serialized: identity serializers) to ``m``; its final code.
    Without a deadline the call runs in a thread and must end within the server's cap and
    a grace, else the test fails (a hang)."""
    codes: list[grpc.StatusCode] = []

    def run() -> None:
        codes.append(_invoke(ch, m, bodies, deadline))

    if deadline is not None:
        run()
        return codes[0]
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(CALL_TIMEOUT_MAX_MS / 1000 + NO_DEADLINE_GRACE_S)
    if t.is_alive():
        pytest.fail(f"{path(m)} without a deadline did not end within the server's cap")
    return codes[0]


def _invoke(
    ch: grpc.Channel, m: MethodDescriptor, bodies: list[bytes], deadline: float | None
) -> grpc.StatusCode:
    try:
        if not m.client_streaming and not m.server_streaming:
            ch.unary_unary(path(m))(bodies[0], timeout=deadline)
        elif not m.client_streaming:
            for _ in ch.unary_stream(path(m))(bodies[0], timeout=deadline):
                pass
        else:
            for _ in ch.stream_stream(path(m))(iter(bodies), timeout=deadline):
                pass
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


class Campaign:
    """The figures of one run and the checks after every request."""

    def __init__(self, cluster: _FuzzCluster, ch: grpc.Channel) -> None:
        self.cluster, self.ch = cluster, ch
        self.tried = 0
        self.codes: collections.Counter[str] = collections.Counter()
        self.by_method: collections.Counter[str] = collections.Counter()
        self.before = snapshot(ch)
        self.end = time.monotonic() + SECONDS

    def check(
        self, m: MethodDescriptor, bodies: list[bytes], garbage: bool, deadline: float | None
    ) -> None:
        code = call(self.ch, m, bodies, deadline)
        self.tried += 1
        self.codes[code.name] += 1
        self.by_method[m.name] += 1
        proc = self.cluster.procs["n1"]
        assert proc.poll() is None, f"the node died after {path(m)}:\n{self.cluster.tails(60)}"
        assert _healthy(self.ch), f"the node is not SERVING after {path(m)}"
        assert code not in UNHANDLED, (
            f"{path(m)} answered {code.name} to {'garbage' if garbage else 'a request'} "
            f"(an unhandled server error, or a refusal that names nothing):\n"
            f"{self.cluster.tails(30)}"
        )
        after = snapshot(self.ch)
        if code != grpc.StatusCode.OK and code not in AMBIGUOUS:
            assert after == self.before, f"{path(m)} was refused ({code.name}) yet changed data"
        self.before = after

    def report(self) -> str:
        return (
            f"fuzz: {self.tried} requests tried; status codes seen ({len(self.codes)}): "
            f"{dict(sorted(self.codes.items()))}"
        )


@pytest.fixture(scope="module")
def campaign(node: _FuzzCluster) -> Iterator[Campaign]:
    with grpc.insecure_channel(node.servers[0]) as ch:
        c = Campaign(node, ch)
        yield c
        print(c.report())
        print(f"fuzz: requests per RPC: {dict(sorted(c.by_method.items()))}")


def test_every_rpc_with_empty_defaults_and_garbage(campaign: Campaign) -> None:
    """Every RPC at least once: its request with every field at its default (empty names,
    zero numbers) and raw garbage bytes, each answered with a status."""
    for m in METHODS:
        empty = message_factory.GetMessageClass(m.input_type)().SerializeToString()
        campaign.check(m, [empty], False, CALL_DEADLINE_S[0])
        campaign.check(m, [b"\xff\x00garbage\x12\x7f"], True, CALL_DEADLINE_S[0])
    assert set(campaign.by_method) == {m.name for m in METHODS} == set(templates())


def test_every_hostile_shape_of_a_config_ends_with_a_status(campaign: Campaign) -> None:
    """One example of each shape issue 39 added (deep nesting, long lists, long repeated
    values), as a stream's and a consumer's config, create and update: each ends with a
    status that is no unhandled error, and a refusal changes nothing."""
    shapes = [
        _nested_array(100_000),
        _nested_object(1_000),
        _nested_metadata(200),
        _many_subjects(20_000),
        _one_subject_repeated(5_000),
        _many_filters(5_000),
        _long_description(5_000),
    ]
    service = pb.DESCRIPTOR.services_by_name
    for doc in shapes:
        for svc, rpc, request in (
            ("StreamService", "CreateStream", pb.CreateStreamRequest(config_json=doc)),
            ("StreamService", "UpdateStream", pb.UpdateStreamRequest(config_json=doc)),
            (
                "ConsumerService",
                "CreateConsumer",
                pb.CreateConsumerRequest(stream=STREAM, config_json=doc),
            ),
        ):
            m = service[svc].methods_by_name[rpc]
            campaign.check(m, [request.SerializeToString()], False, CALL_DEADLINE_S[0])


def test_the_snapshot_sees_what_a_request_changes(campaign: Campaign) -> None:
    """The data check is real: what an accepted publish changes shows in it."""
    before = snapshot(campaign.ch)
    publish = pbg.PublishServiceStub(campaign.ch)
    publish.Publish(pb.PublishRequest(subject="fz.v.a", data=b"seen"), timeout=10)
    assert snapshot(campaign.ch) != before
    campaign.before = snapshot(campaign.ch)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=os.environ.get("CI") == "true",  # CI: the same examples every run
)
@given(req=requests())
def test_random_requests_end_with_a_status_and_change_nothing_when_refused(
    campaign: Campaign, req: tuple[str, list[bytes], bool, float | None]
) -> None:
    if time.monotonic() > campaign.end:
        return  # the time budget is spent: the remaining examples are no-ops
    method, bodies, garbage, deadline = req
    campaign.check(BY_PATH[method], bodies, garbage, deadline)
