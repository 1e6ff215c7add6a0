"""Integration: with ``[auth]`` and without ``[tls]``, adding a node by address needs the
node's proof, and no node token ever reaches a server that has not given it (issue 39,
finding 3; docs/security.md, "Threat model and review"; docs/operations.md, "Adding a
node").

The attack: a ``$SYS`` user adds ``a0`` at the address of a fake gRPC server. Before,
every node then dialled it (descriptions), and any mirror or source link (re)starting
tried it first (node addresses in name order), sending ``Bearer rs-node.<account>.<mac>``:
with it, any account. Now the meta leader asks the server to prove it holds the node key
first; the fake cannot, the add is refused, and the fake (which records the authorization
metadata of every call it receives) sees no node token, also once a mirror link runs.

The way in stays open for a real node: n4, started with ``--join`` and this cluster's
``[auth]``, proves its name and address and joins; added under another name it is refused.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

import raftstream
from raftstream import StreamConfig, errors
from raftstream.cluster.security.auth import NODE_TOKEN_PREFIX, hash_secret
from raftstream.config import StreamSource
from raftstream.proto import node_pb2 as npb
from raftstream.tooling.localcluster import NodeSpec
from tests.cluster.node_harness import LocalCluster, free_port, retry_async, run

pytestmark = pytest.mark.integration

FOUNDERS = ("n1", "n2", "n3")
PASSWORDS = {"admin": "admin-pw", "alice": "alice-pw"}
MSGS = 5
LOG_WAIT_S = 30.0
COPY_WAIT_S = 30.0


def _auth_toml() -> str:
    h = {u: hash_secret(p, rounds=4) for u, p in PASSWORDS.items()}
    return f"""
[auth.accounts.A]
[auth.accounts."$SYS"]

[[auth.users]]
user = "admin"
password = "{h["admin"]}"
account = "$SYS"

[[auth.users]]
user = "alice"
password = "{h["alice"]}"
account = "A"
"""


class _Cluster(LocalCluster):
    """n1..n3 founders configured with each other; n4 with itself and n1 (a machine an
    operator adds)."""

    def _spec(self, name: str) -> NodeSpec:
        spec = super()._spec(name)
        names = FOUNDERS if name in FOUNDERS else (name, "n1")
        return dataclasses.replace(spec, peers={n: self.addr(n) for n in sorted(names)})


class _Harvester(grpc.GenericRpcHandler):
    """A fake node: records the authorization metadata of every call, answers ``Prove``
    with a made-up proof (playing along as well as it can), and nothing else."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self._lock = threading.Lock()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        auth = tuple(str(v) for k, v in details.invocation_metadata or () if k == "authorization")
        with self._lock:
            self.calls.append((str(details.method), auth))
        if details.method != "/raftstream.node.v1.NodeService/Prove":
            return None  # UNIMPLEMENTED

        def prove(request: npb.ProveRequest, context: grpc.ServicerContext) -> npb.ProveResponse:
            return npb.ProveResponse(name="a0", address=self.address, proof=b"\x00" * 32)

        return grpc.unary_unary_rpc_method_handler(
            prove,
            request_deserializer=npb.ProveRequest.FromString,
            response_serializer=npb.ProveResponse.SerializeToString,
        )

    def node_tokens_seen(self) -> list[str]:
        with self._lock:
            return [m for m, auth in self.calls if any(NODE_TOKEN_PREFIX in a for a in auth)]


def _basic(user: str) -> tuple[tuple[str, str], ...]:
    raw = base64.b64encode(f"{user}:{PASSWORDS[user]}".encode()).decode()
    return (("authorization", f"Basic {raw}"),)


@pytest.fixture(scope="module")
def cluster() -> Iterator[_Cluster]:
    c = _Cluster(4, auth=_auth_toml(), client_metadata=_basic("admin"))
    try:
        for n in FOUNDERS:
            c.start(n)
        c.nodes.wait_all_serving(FOUNDERS)
        c.wait_meta_leader()
        yield c
    except BaseException:
        print(c.tails(60))
        raise
    finally:
        c.close()


@pytest.fixture
def harvester() -> Iterator[_Harvester]:
    address = f"127.0.0.1:{free_port()}"
    fake = _Harvester(address)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((fake,))
    server.add_insecure_port(address)
    server.start()
    try:
        yield fake
    finally:
        server.stop(None)


async def _connect(c: LocalCluster, user: str) -> raftstream.Client:
    servers = [c.addr(n) for n in FOUNDERS]
    return await raftstream.connect(servers, timeout=20, user=user, password=PASSWORDS[user])


def test_a_sys_user_cannot_send_node_tokens_to_an_address_of_its_choice(
    cluster: _Cluster, harvester: _Harvester
) -> None:
    """The add is refused (PERMISSION_DENIED naming the rule), changes nothing, and the
    fake sees no node token: not from the challenge, the nodes' probers, nor a mirror link
    started after it (whose origin is this cluster's)."""

    refusal: list[errors.RaftStreamError] = []
    nodes: set[str] = set()
    done: list[bool] = []

    async def attack() -> None:
        admin = await _connect(cluster, "admin")
        alice = await _connect(cluster, "alice")
        try:
            try:
                await admin.add_peer("a0", address=harvester.address)
            except errors.RaftStreamError as exc:
                refusal.append(exc)
            nodes.update(n.name for n in (await admin.cluster_info()).nodes)
            # A mirror link starts now (R1, on whichever node), reading a local origin
            # with A's node token; it copies what was published.
            await alice.add_stream(StreamConfig(name="ORIG", subjects=("orig.>",)))
            for i in range(MSGS):
                await alice.publish("orig.x", f"m{i}".encode())
            await alice.add_stream(StreamConfig(name="COPY", mirror=StreamSource(name="ORIG")))

            async def copied() -> None:
                state = (await alice.stream_info("COPY")).state
                assert state.messages == MSGS, state

            with contextlib.suppress(AssertionError):  # checked below, after the tokens
                await retry_async(copied, timeout_s=COPY_WAIT_S)
                done.append(True)
        finally:
            await admin.close()
            await alice.close()

    run(attack())
    assert harvester.calls, "the meta leader's challenge reached the fake"
    assert harvester.node_tokens_seen() == []
    # Not the $SYS caller's own credentials either: the challenge carries none.
    assert all(not auth for _, auth in harvester.calls), harvester.calls
    (refused,) = refusal
    assert isinstance(refused, errors.PermissionDeniedError), refused
    assert "did not prove" in str(refused)
    assert nodes == set(FOUNDERS)
    assert done, "the mirror link copied its origin"


def test_a_real_node_proves_itself_and_joins(cluster: _Cluster) -> None:
    """n4, started first with --join and this cluster's [auth], proves its name and
    address to the meta leader and joins; added under another name it is refused."""
    cluster.start("n4", "--join")
    deadline = time.monotonic() + LOG_WAIT_S
    while "peer-add n4 --address" not in cluster.nodes.log_tail("n4", 400):
        assert time.monotonic() < deadline, cluster.tails(40)
        time.sleep(0.1)

    async def add() -> None:
        admin = await _connect(cluster, "admin")
        try:
            with pytest.raises(errors.PermissionDeniedError, match="answers as node 'n4'"):
                await admin.add_peer("n5", address=cluster.addr("n4"))
            assert await admin.add_peer("n4", address=cluster.addr("n4")) is True

            async def n4_online() -> None:
                info = await admin.cluster_info()
                (n4,) = [n for n in info.nodes if n.name == "n4"]
                assert n4.online and n4.addr == cluster.addr("n4"), n4
                assert "n5" not in {n.name for n in info.nodes}

            await retry_async(n4_online)
        finally:
            await admin.close()

    run(add())
    cluster.wait_serving("n4")
