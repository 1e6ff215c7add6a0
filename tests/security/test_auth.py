"""Accounts, authentication, permissions and account limits on a real 3-node cluster
(issue 10, docs/security.md).

One cluster for the module (``LocalCluster`` with an ``[auth]`` section). Accounts A and B
both own a stream named ORDERS; B also owns BONLY with a durable consumer. Every client API
call of A against B's resources is refused NOT_FOUND or PERMISSION_DENIED and leaves B's
data as it was; calls without or with wrong credentials are UNAUTHENTICATED; a user's
permissions and an account's limits (counted by the meta leader across the cluster) hold:
a mirror or source copies only origins its user may read (and manage, for a work queue or
interest origin), and a stream list holds only the streams its caller may read.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import bcrypt
import grpc
import pytest
from click.testing import CliRunner

import raftstream
from raftstream import ConsumerConfig, StreamConfig, errors
from raftstream.cli.app import cli
from raftstream.cluster.security.auth import hash_secret, parse_auth
from raftstream.config import RetentionPolicy, StreamSource
from raftstream.kv import bucket_statuses
from raftstream.proto import raft_pb2
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import until

pytestmark = pytest.mark.integration

ROUNDS = 4  # bcrypt cost: low, the tests check behaviour
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw", "lim": "lim-pw"}
PASSWORDS["admin"] = "admin-pw"
PASSWORDS["dave"] = "dave-pw"
B_TOKEN = "b-token-0123456789"


def _auth_toml() -> str:
    h = {u: hash_secret(p, rounds=ROUNDS) for u, p in PASSWORDS.items()}
    return f"""
[auth.accounts.A]
[auth.accounts.B]
[auth.accounts.L]
max_streams = 2
max_consumers = 2
max_file_bytes = 100000
[auth.accounts."$SYS"]

[[auth.users]]
user = "alice"
password = "{h["alice"]}"
account = "A"

[[auth.users]]
user = "bob"
password = "{h["bob"]}"
account = "B"

[[auth.users]]
user = "carol"
password = "{h["carol"]}"
account = "A"
publish = ["orders.eu"]
read = ["ORDERS"]
manage = []

[[auth.users]]
user = "dave"
password = "{h["dave"]}"
account = "A"
publish = ["dave.>"]
read = ["DAVE_*", "PAYROLL", "JOBS"]
manage = ["DAVE_*"]

[[auth.users]]
user = "lim"
password = "{h["lim"]}"
account = "L"

[[auth.users]]
user = "admin"
password = "{h["admin"]}"
account = "$SYS"

[[auth.tokens]]
name = "b-ci"
token = "{hash_secret(B_TOKEN, rounds=ROUNDS)}"
account = "B"
"""


def _basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {raw}"),)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    c = LocalCluster(3, auth=_auth_toml(), client_metadata=_basic("admin", PASSWORDS["admin"]))
    with running(c, lines=30):
        yield c


async def _connect(c: LocalCluster, user: str, *, server: int = 0) -> raftstream.Client:
    # One seed server: calls that need another node are forwarded (or follow its hint).
    return await raftstream.connect(
        servers=[c.servers[server]], timeout=15, user=user, password=PASSWORDS[user]
    )


async def _b_world(c: LocalCluster) -> dict[str, Any]:
    """B's streams and consumer (made once), and what they hold."""
    b = await raftstream.connect(servers=c.servers[1:2], timeout=15, token=B_TOKEN)
    try:
        if "BONLY" not in await b.stream_names():
            await b.add_stream(StreamConfig(name="BONLY", subjects=("bonly.>",)))
            await b.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",)))
            for i in range(3):
                await b.publish("bonly.x", f"b{i}".encode())
                await b.publish("orders.eu", f"bo{i}".encode())
            await b.add_consumer("BONLY", ConsumerConfig(durable_name="C1"))
        return await _b_state(b)
    finally:
        await b.close()


async def _b_state(b: raftstream.Client) -> dict[str, Any]:
    state: dict[str, Any] = {"names": sorted(await b.stream_names())}
    for name in ("BONLY", "ORDERS"):
        si = await b.stream_info(name)
        state[name] = (si.state.messages, si.state.first_seq, si.state.last_seq)
    state["consumers"] = await b.consumer_names("BONLY")
    state["msg1"] = (await b.get_msg("BONLY", 1)).data
    return state


# -- isolation -------------------------------------------------------------------------------


def _cfg_json(cfg: StreamConfig | ConsumerConfig) -> str:
    return json.dumps(cfg.to_dict())


ACK_REPLY = "$JS.ACK.BONLY.C1.1.1.1.0.0"
ACK_REPLY_B = "$JS.ACK._.B.BONLY.C1.1.1.1.0.0.x"
_B_CALLS: list[tuple[str, str, Any]] = [
    ("StreamService", "GetStreamInfo", pb.StreamInfoRequest(name="BONLY")),
    ("StreamService", "PurgeStream", pb.PurgeStreamRequest(name="BONLY")),
    ("StreamService", "DeleteStream", pb.DeleteStreamRequest(name="BONLY")),
    ("StreamService", "GetMessage", pb.GetMessageRequest(stream="BONLY", seq=1)),
    ("StreamService", "DeleteMessage", pb.DeleteMessageRequest(stream="BONLY", seq=1)),
    ("StreamService", "StepDownStreamLeader", pb.StreamStepDownRequest(stream="BONLY")),
    (
        "StreamService",
        "UpdateStream",
        pb.UpdateStreamRequest(
            config_json=_cfg_json(StreamConfig(name="BONLY", subjects=("bonly.>",), max_msgs=1))
        ),
    ),
    ("ConsumerService", "GetConsumerInfo", pb.ConsumerInfoRequest(stream="BONLY", consumer="C1")),
    ("ConsumerService", "DeleteConsumer", pb.DeleteConsumerRequest(stream="BONLY", consumer="C1")),
    (
        "ConsumerService",
        "CreateConsumer",
        pb.CreateConsumerRequest(
            stream="BONLY", config_json=_cfg_json(ConsumerConfig(durable_name="SPY"))
        ),
    ),
    (
        "ConsumerService",
        "UpdateConsumer",
        pb.UpdateConsumerRequest(
            stream="BONLY",
            config_json=_cfg_json(ConsumerConfig(durable_name="C1", description="x")),
        ),
    ),
    ("ConsumerService", "ListConsumers", pb.ListConsumersRequest(stream="BONLY")),
    ("ConsumerService", "ConsumerNames", pb.ConsumerNamesRequest(stream="BONLY")),
    (
        "ConsumerService",
        "PauseConsumer",
        pb.PauseConsumerRequest(stream="BONLY", consumer="C1", pause_until_ns=2**62),
    ),
    ("ConsumerService", "ResumeConsumer", pb.ResumeConsumerRequest(stream="BONLY", consumer="C1")),
    ("ConsumerService", "ResetConsumer", pb.ResetConsumerRequest(stream="BONLY", consumer="C1")),
    (
        "ConsumerService",
        "StepDownConsumerLeader",
        pb.ConsumerStepDownRequest(stream="BONLY", consumer="C1"),
    ),
    ("ConsumeService", "Ack", pb.AckRequest(ack=pb.AckItem(reply=ACK_REPLY, sync=True))),
    # An ack token naming B's account (the long form) still acts in the caller's account.
    ("ConsumeService", "Ack", pb.AckRequest(ack=pb.AckItem(reply=ACK_REPLY_B, sync=True))),
    ("PublishService", "Publish", pb.PublishRequest(subject="bonly.x", data=b"spy")),
]
_REFUSED = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED}


async def _unary(ch: grpc.aio.Channel, service: str, method: str, req: Any, md: Any) -> Any:
    call = ch.unary_unary(
        f"/raftstream.v1.{service}/{method}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )
    return await call(req, timeout=10, metadata=md)


async def _streamed_codes(ch: grpc.aio.Channel, md: Any) -> list[grpc.StatusCode]:
    """Fetch (server streaming) and Consume (bidi) on B's consumer: their status codes."""
    codes = []
    consume = pbg.ConsumeServiceStub(ch)
    fetch = consume.Fetch(
        pb.FetchRequest(stream="BONLY", consumer="C1", batch=1, no_wait=True),
        timeout=10,
        metadata=md,
    )

    async def start() -> AsyncIterator[pb.ConsumeRequest]:
        yield pb.ConsumeRequest(start=pb.ConsumeStart(stream="BONLY", consumer="C1"))
        await asyncio.sleep(5)  # keep the request side open until the server answers

    for call in (fetch, consume.Consume(start(), timeout=10, metadata=md)):
        try:
            async for _ in call:
                pass
        except grpc.RpcError as err:
            codes.append(err.code())
        else:
            codes.append(grpc.StatusCode.OK)
    return codes


def test_one_account_cannot_touch_another_accounts_streams(cluster: LocalCluster) -> None:
    """Issue 10: "two accounts with the same stream name; every API call of one account
    against the other's resources is refused" (NOT_FOUND or PERMISSION_DENIED, never the
    data), and B's data is unchanged afterwards."""

    async def body() -> None:
        before = await _b_world(cluster)
        a = await _connect(cluster, "alice")
        try:
            await a.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",)))
            ack = await a.publish("orders.eu", b"a0")  # A's ORDERS, not B's
            assert (ack.stream, ack.seq) == ("ORDERS", 1)
            assert await a.stream_names() == ["ORDERS"]
            assert [s.config.name for s in await a.streams_info()] == ["ORDERS"]
            assert (await a.stream_info("ORDERS")).state.messages == 1
            assert await a.purge_stream("ORDERS") == 1  # purges A's, see B's count below
            info = await a.cluster_info()
            assert {g.account for g in info.groups if g.stream} == {"A"}
        finally:
            await a.close()
        md = _basic("alice", PASSWORDS["alice"])
        async with grpc.aio.insecure_channel(cluster.servers[0]) as ch:
            for service, method, req in _B_CALLS:
                with pytest.raises(grpc.RpcError) as err:
                    await _unary(ch, service, method, req, md)
                assert err.value.code() in _REFUSED, (method, err.value.code())
                assert "b0" not in (err.value.details() or "")
            assert set(await _streamed_codes(ch, md)) <= _REFUSED
        b = await raftstream.connect(servers=cluster.servers[2:], timeout=15, token=B_TOKEN)
        try:
            assert await _b_state(b) == before
            assert before["ORDERS"][0] == 3 and before["consumers"] == ["C1"]
        finally:
            await b.close()

    run(body())


def test_system_account_sees_every_account_in_cluster_info(cluster: LocalCluster) -> None:
    async def body() -> None:
        await _b_world(cluster)
        admin = await _connect(cluster, "admin")
        try:
            info = await admin.cluster_info()
            assert "B" in {g.account for g in info.groups if g.stream}
        finally:
            await admin.close()

    run(body())


# -- authentication --------------------------------------------------------------------------


def test_node_to_node_services_refuse_clients(cluster: LocalCluster) -> None:
    """A client cannot call the repair or Raft services (docs/security.md, "Threat model
    and review"): without the node token, RepairNode for a healthy node is UNAUTHENTICATED
    (before the fix it made the meta leader take n3 out of the meta group), and so is a
    Raft batch; the meta group still counts every node afterwards."""
    md = _basic("admin", PASSWORDS["admin"])  # even $SYS is a client, not a node

    async def body() -> None:
        async with grpc.aio.insecure_channel(cluster.servers[0]) as ch:
            repair = rpbg.RepairServiceStub(ch)
            for creds in ((), md):
                with pytest.raises(grpc.RpcError) as err:
                    await repair.RepairNode(
                        rpb.RepairNodeRequest(node="n3", repair_id="evil"),
                        metadata=creds,
                        timeout=10,
                    )
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            send = ch.stream_unary(
                "/raftstream.raft.v1.Raft/Send",
                request_serializer=raft_pb2.Batch.SerializeToString,
                response_deserializer=raft_pb2.SendAck.FromString,
            )
            with pytest.raises(grpc.RpcError) as err:
                await send(iter([raft_pb2.Batch(src="n2", dst="n1")]), metadata=md, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        admin = await _connect(cluster, "admin")
        try:
            info = await admin.cluster_info()
            assert {n.name for n in info.nodes if n.voter} == {"n1", "n2", "n3"}
        finally:
            await admin.close()

    run(body())


@pytest.mark.parametrize(
    "creds",
    [
        {},
        {"user": "alice", "password": "wrong"},
        {"user": "mallory", "password": "alice-pw"},
        {"token": "not-the-token"},
    ],
)
def test_missing_or_wrong_credentials_are_unauthenticated(
    cluster: LocalCluster, creds: dict[str, str]
) -> None:
    async def body() -> None:
        c = await raftstream.connect(servers=cluster.servers, timeout=5, **creds)
        try:
            with pytest.raises(errors.UnauthenticatedError):
                await c.stream_names()
            with pytest.raises(errors.UnauthenticatedError):
                await c.publish("orders.eu", b"x")
        finally:
            await c.close()

    run(body())


# -- permissions -----------------------------------------------------------------------------


def test_user_permissions_hold(cluster: LocalCluster) -> None:
    """carol (account A) may publish to orders.eu only, read ORDERS, manage nothing, and is
    not the system account."""

    async def body() -> None:
        a = await _connect(cluster, "alice")
        try:
            await a.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",)))
        finally:
            await a.close()
        carol = await _connect(cluster, "carol", server=2)
        try:
            ack = await carol.publish("orders.eu", b"c")
            assert ack.stream == "ORDERS"
            with pytest.raises(errors.PermissionDeniedError):
                await carol.publish("orders.us", b"c")
            assert (await carol.stream_info("ORDERS")).state.last_seq == ack.seq
            # A pull through an ephemeral consumer is reading; a durable one is managing.
            sub = await carol.pull_subscribe("orders.eu", stream="ORDERS")
            assert [m.data for m in await sub.fetch(1, timeout=5)] == [b"c"]
            with pytest.raises(errors.PermissionDeniedError):
                await carol.add_consumer("ORDERS", ConsumerConfig(durable_name="D"))
            for forbidden in (
                carol.purge_stream("ORDERS"),
                carol.delete_stream("ORDERS"),
                carol.add_stream(StreamConfig(name="CAROL", subjects=("carol.>",))),
                carol.meta_leader_stepdown(),
                carol.remove_peer("n1"),
                carol.add_peer("n1"),
            ):
                with pytest.raises(errors.PermissionDeniedError):
                    await forbidden
            assert (await carol.stream_info("ORDERS")).state.last_seq == ack.seq
        finally:
            await carol.close()

    run(body())


async def _a_world(c: LocalCluster) -> None:
    """A's streams (made once by alice): ORDERS; PAYROLL (R3: every node has a replica)
    and SECRET with limits retention; JOBS, a work queue; each with 3 messages; and the
    key-value bucket ``cfg``."""
    a = await _connect(c, "alice")
    try:
        if "JOBS" in await a.stream_names():
            return
        await a.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",)))
        await a.add_stream(StreamConfig(name="PAYROLL", subjects=("payroll.>",), num_replicas=3))
        await a.add_stream(StreamConfig(name="SECRET", subjects=("secret.>",)))
        await a.add_stream(
            StreamConfig(name="JOBS", subjects=("jobs.>",), retention=RetentionPolicy.WORKQUEUE)
        )
        for i in range(3):
            for subject in ("payroll.ceo", "secret.x", "jobs.run"):
                await a.publish(subject, f"{subject} {i}".encode())
        kv = await a.create_key_value("cfg")
        await kv.put("db.password", b"S3cr3t")
    finally:
        await a.close()


def test_a_mirror_or_source_needs_read_on_its_origin(cluster: LocalCluster) -> None:
    """docs/security.md "Permissions": a stream whose mirror or sources name a stream of
    this cluster needs read on every origin, and manage on a work queue or interest origin
    (the link's consumer changes what it keeps); the refusal names the field and nothing
    is created or changed. Before, only manage on the new stream's name was checked: dave
    copied SECRET, which he may not read, and drained the work queue JOBS (review finding
    1). dave: read DAVE_*, PAYROLL, JOBS; manage DAVE_*."""

    def sourcing(name: str, *origins: str) -> StreamConfig:
        subjects = (f"dave.{name.lower()}",)
        return StreamConfig(
            name=name, subjects=subjects, sources=tuple(StreamSource(name=o) for o in origins)
        )

    refused = [
        (StreamConfig(name="DAVE_COPY", mirror=StreamSource(name="SECRET")), "mirror.name"),
        (sourcing("DAVE_JOBS", "JOBS"), "sources[0].name"),  # read, but not manage
        (sourcing("DAVE_SRC", "PAYROLL", "SECRET"), "sources[1].name"),
    ]

    async def body() -> None:
        await _a_world(cluster)
        dave = await _connect(cluster, "dave", server=1)
        try:
            for cfg, field in refused:
                with pytest.raises(errors.PermissionDeniedError) as err:
                    await dave.add_stream(cfg)
                assert err.value.details.get("field") == field, cfg.name
            await dave.add_stream(sourcing("DAVE_PLAIN"))
            with pytest.raises(errors.PermissionDeniedError) as err:
                await dave.update_stream(sourcing("DAVE_PLAIN", "SECRET"))
            assert err.value.details.get("field") == "sources[0].name"
            assert (await dave.stream_info("DAVE_PLAIN")).config.sources == ()
            names = set(await dave.stream_names())
            assert not names & {"DAVE_COPY", "DAVE_JOBS", "DAVE_SRC"}
            # read on a limits origin is enough: its copy takes nothing from it
            await dave.add_stream(
                StreamConfig(name="DAVE_PAY", mirror=StreamSource(name="PAYROLL"))
            )

            async def copied() -> bool:
                return (await dave.stream_info("DAVE_PAY")).state.messages >= 3

            await until(copied, what="DAVE_PAY holds 3 copies", timeout_s=60, interval_s=0.1)
        finally:
            await dave.close()
        alice = await _connect(cluster, "alice")
        try:
            jobs = await alice.stream_info("JOBS")
            assert (jobs.state.messages, jobs.state.consumer_count) == (3, 0)
        finally:
            await alice.close()

    run(body())


def test_a_stream_list_holds_only_readable_streams(cluster: LocalCluster) -> None:
    """docs/security.md "Permissions": stream infos in a list (``stream ls``, ``kv ls``)
    are the streams the caller may read; names stay the account's. Through every node (the
    leader, a follower of the R3 PAYROLL, a node without SECRET's replica): before, carol
    (read ORDERS) got every stream's config and state (review finding 3)."""

    async def body() -> None:
        await _a_world(cluster)
        for server in range(3):
            carol = await _connect(cluster, "carol", server=server)
            try:
                assert [s.config.name for s in await carol.streams_info()] == ["ORDERS"]
                names = set(await carol.stream_names())
                assert {"ORDERS", "PAYROLL", "SECRET", "JOBS", "KV_cfg"} <= names
                assert await bucket_statuses(carol) == []
            finally:
                await carol.close()
        alice = await _connect(cluster, "alice", server=2)
        try:
            assert "cfg" in [b.bucket for b in await bucket_statuses(alice)]
            assert "SECRET" in [s.config.name for s in await alice.streams_info()]
        finally:
            await alice.close()

    run(body())


# -- account limits --------------------------------------------------------------------------


def test_account_limits_are_counted_across_the_cluster(cluster: LocalCluster) -> None:
    """Account L: max_streams 2, max_consumers 2, max_file_bytes 100000. Creates go through
    different nodes; the meta leader counts them all: the third is RESOURCE_EXHAUSTED."""

    async def attempt(make: Callable[[raftstream.Client], Awaitable[Any]], server: int) -> Any:
        c = await _connect(cluster, "lim", server=server)
        try:
            return await make(c)
        finally:
            await c.close()

    def stream(name: str, **kw: Any) -> StreamConfig:
        return StreamConfig(name=name, subjects=(f"{name.lower()}.>",), **kw)

    async def body() -> None:
        with pytest.raises(errors.InvalidArgumentError) as bad:  # storage limit: max_bytes
            await attempt(lambda c: c.add_stream(stream("L0")), 0)
        assert bad.value.field == "max_bytes"
        await attempt(lambda c: c.add_stream(stream("L1", max_bytes=40_000)), 0)
        with pytest.raises(errors.LimitError) as full:
            await attempt(lambda c: c.add_stream(stream("L2", max_bytes=70_000)), 1)
        assert full.value.details.get("limit") == "max_file_bytes"
        await attempt(lambda c: c.add_stream(stream("L2", max_bytes=40_000)), 1)
        with pytest.raises(errors.LimitError) as full:
            await attempt(lambda c: c.add_stream(stream("L3", max_bytes=1_000)), 2)
        assert full.value.details.get("limit") == "max_streams"
        await attempt(lambda c: c.add_consumer("L1", ConsumerConfig(durable_name="K1")), 2)
        await attempt(lambda c: c.add_consumer("L2", ConsumerConfig(durable_name="K2")), 0)
        with pytest.raises(errors.LimitError) as full:
            await attempt(lambda c: c.add_consumer("L1", ConsumerConfig(durable_name="K3")), 1)
        assert full.value.details.get("limit") == "max_consumers"
        names = await attempt(lambda c: c.stream_names(), 2)
        assert sorted(names) == ["L1", "L2"]

    run(body())


# -- command line ----------------------------------------------------------------------------


def test_cli_sends_credentials_from_flags_and_environment(cluster: LocalCluster) -> None:
    """docs/cli.md: --user/--password/--token on every client command, or
    $RAFTSTREAM_USER/_PASSWORD/_TOKEN; without them the node refuses UNAUTHENTICATED."""
    run(_b_world(cluster))
    servers = ",".join(cluster.servers)
    runner = CliRunner()
    bare = runner.invoke(cli, ["stream", "ls", "-n", "-s", servers], env=_NO_CREDS_ENV)
    assert bare.exit_code == 1 and "UNAUTHENTICATED" in bare.output
    by_flag = runner.invoke(
        cli, ["stream", "ls", "-n", "-s", servers, "--token", B_TOKEN], env=_NO_CREDS_ENV
    )
    assert by_flag.exit_code == 0, by_flag.output
    assert by_flag.output.split() == ["BONLY", "ORDERS"]
    env = {**_NO_CREDS_ENV, "RAFTSTREAM_USER": "bob", "RAFTSTREAM_PASSWORD": PASSWORDS["bob"]}
    by_env = runner.invoke(cli, ["-s", servers, "stream", "ls", "-n"], env=env)
    assert by_env.exit_code == 0, by_env.output
    assert by_env.output.split() == ["BONLY", "ORDERS"]


def test_cluster_balance_moves_only_its_users_account_and_refuses_a_system_user(
    cluster: LocalCluster,
) -> None:
    """``cluster balance`` steps leaders down by stream name, in its user's account: a
    ``$SYS`` user sees every account's groups and could move none of them, so it is refused
    with a sentence saying why (rather than "Balanced" over streams it cannot touch); a
    user of one account plans over what it sees."""
    run(_b_world(cluster))
    servers = ",".join(cluster.servers)
    runner = CliRunner()
    admin = {**_NO_CREDS_ENV, "RAFTSTREAM_USER": "admin", "RAFTSTREAM_PASSWORD": PASSWORDS["admin"]}
    refused = runner.invoke(cli, ["cluster", "balance", "-s", servers], env=admin)
    assert refused.exit_code == 1, refused.output
    assert "run it as a user of each account" in refused.output
    b = runner.invoke(
        cli,
        ["cluster", "balance", "--dry-run", "--json", "-s", servers, "--token", B_TOKEN],
        env=_NO_CREDS_ENV,
    )
    assert b.exit_code == 0, b.output
    assert sum(json.loads(b.output)["leaders_before"].values()) >= 2  # B's BONLY and ORDERS


def test_system_operations_refuse_other_accounts_for_an_online_node(
    cluster: LocalCluster,
) -> None:
    """docs/security.md: only $SYS users step the meta leader down or remove or readmit a
    peer, whatever the state of the node: a user of account A is refused PERMISSION_DENIED
    for an online node, not told to stop it first."""
    servers = ",".join(cluster.servers)
    runner = CliRunner()
    carol = {**_NO_CREDS_ENV, "RAFTSTREAM_USER": "carol", "RAFTSTREAM_PASSWORD": PASSWORDS["carol"]}
    for args in (
        ["peer-remove", "n3", "-f", "--online"],
        ["peer-add", "n3"],
        ["step-down"],
    ):
        out = runner.invoke(cli, ["cluster", *args, "-s", servers], env=carol)
        assert out.exit_code == 1, (args, out.output)
        assert "PERMISSION_DENIED" in out.output, (args, out.output)
    run(_assert_online_and_kept(cluster, "n3"))


def test_peer_remove_of_an_online_node_is_refused_for_permission_first(
    cluster: LocalCluster,
) -> None:
    """A user review: ``cluster peer-remove n3 -f`` by a user of an ordinary account, n3
    online, said FAILED_PRECONDITION (stop it first, or pass --online), and only with
    --online PERMISSION_DENIED. The permission comes first."""
    runner = CliRunner()
    carol = {**_NO_CREDS_ENV, "RAFTSTREAM_USER": "carol", "RAFTSTREAM_PASSWORD": PASSWORDS["carol"]}
    args = ["cluster", "peer-remove", "n3", "-f", "-s", ",".join(cluster.servers)]
    out = runner.invoke(cli, args, env=carol)
    assert out.exit_code == 1, out.output
    assert "PERMISSION_DENIED" in out.output and "FAILED_PRECONDITION" not in out.output
    run(_assert_online_and_kept(cluster, "n3"))


async def _assert_online_and_kept(c: LocalCluster, node: str) -> None:
    admin = await _connect(c, "admin")
    try:
        info = await admin.cluster_info()
        (n,) = [n for n in info.nodes if n.name == node]
        assert n.online and not n.removed
    finally:
        await admin.close()


_NO_CREDS_ENV: dict[str, str | None] = {
    "RAFTSTREAM_USER": None,
    "RAFTSTREAM_PASSWORD": None,
    "RAFTSTREAM_TOKEN": None,
}


def test_cli_hash_password_makes_a_hash_the_config_accepts() -> None:
    result = CliRunner().invoke(cli, ["auth", "hash-password", "--cost", "4"], input="s3cret\n")
    assert result.exit_code == 0, result.output
    hashed = result.output.strip()
    assert bcrypt.checkpw(b"s3cret", hashed.encode())
    parse_auth(
        {
            "accounts": {"A": {}},
            "users": [{"user": "u", "password": hashed, "account": "A"}],
        }
    )
    empty = CliRunner().invoke(cli, ["auth", "hash-password"], input="\n")
    assert empty.exit_code == 1


# -- the node acting for an account ----------------------------------------------------------


def test_inactive_ephemeral_consumer_is_deleted_in_its_account(cluster: LocalCluster) -> None:
    """An ephemeral consumer past its inactive_threshold is deleted by its stream leader
    through the meta leader, which the node asks as the consumer's account (B here, not the
    default account) with its node token: without it the request would be refused."""

    async def body() -> None:
        await _b_world(cluster)
        b = await raftstream.connect(servers=cluster.servers, timeout=15, token=B_TOKEN)
        try:
            # Long enough that the listing below comes first even on a loaded machine (at
            # 300 ms it once did not, and the consumer was already gone: a race of the test).
            info = await b.add_consumer("BONLY", ConsumerConfig(inactive_threshold=2_000_000_000))
            assert info.name in await b.consumer_names("BONLY")

            async def gone() -> bool:
                return info.name not in await b.consumer_names("BONLY")

            await until(gone, what=f"{info.name} removed as inactive", timeout_s=30, interval_s=0.1)
            assert "C1" in await b.consumer_names("BONLY")  # the durable one stays
        finally:
            await b.close()

    run(body())
