"""Node-to-node services and node tokens (docs/security.md, "Threat model and review").

In-process gRPC servers, no cluster: the node-calls guard (``NodeCallsInterceptor``) keeps
the repair and Raft services to nodes under ``[auth]`` without TLS (a client must not make
the meta leader take a healthy node out of the cluster); the Raft transport sends the node
token it needs; a ``node_secret_file`` keys node tokens so that the config's bcrypt hashes
no longer mint them; under ``[tls]`` a node token is accepted only from a node certificate,
and a node certificate is one with the URI SAN ``urn:raftstream:node:<name>`` and both the
server and client auth usages (docs/tls.md), nothing less.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftstream.cluster.security.auth import (
    BCRYPT_CHECKS_PENDING_MAX,
    Authenticator,
    AuthInterceptor,
    Caller,
    NodeCallsInterceptor,
    bcrypt_cost,
    caller,
    cluster_metadata,
    hash_secret,
    node_token,
    parse_auth,
)
from raftstream.errors import InvalidArgumentError, UnauthenticatedError, UnavailableError
from raftstream.proto import raft_pb2
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.raft.transport import GrpcTransport, GrpcTransportConfig, PeerTls
from raftstream.raft.transport.api import Inbound
from raftstream.raft.transport.grpc_transport import SERVICE as RAFT_SERVICE
from raftstream.raft.transport.tls import certificate_node_names
from raftstream.raft.types import Message, MessageType
from raftstream.tooling.certs import CertSet, generate
from raftstream.tooling.localnet import free_port


def _auth_table(secret_file: Path | None = None) -> dict[str, Any]:
    table: dict[str, Any] = {
        "accounts": {"A": {}, "B": {}},
        "users": [{"user": "alice", "password": hash_secret("alice-pw", rounds=4), "account": "A"}],
    }
    if secret_file is not None:
        table["node_secret_file"] = str(secret_file)
    return table


class _Repair(rpbg.RepairServiceServicer):  # type: ignore[misc]
    """Records who reached it: a refused call must never get here."""

    def __init__(self) -> None:
        self.callers: list[Caller] = []

    async def RepairNode(self, request: rpb.RepairNodeRequest, context: Any) -> Any:
        self.callers.append(caller())
        return rpb.RepairNodeResponse(phase=rpb.REPAIR_PHASE_REMOVING)


@asynccontextmanager
async def _server(
    interceptors: tuple[Any, ...],
    repair: _Repair,
    transport: GrpcTransport | None = None,
    *,
    credentials: grpc.ServerCredentials | None = None,
) -> AsyncIterator[str]:
    """A server with the repair service, ``_Streams`` and ``transport``'s Raft service;
    plaintext, or TLS with ``credentials``."""
    server = grpc.aio.server(interceptors=interceptors)
    rpbg.add_RepairServiceServicer_to_server(repair, server)
    pbg.add_StreamServiceServicer_to_server(_Streams(), server)
    if transport is not None:
        server.add_generic_rpc_handlers((transport.rpc_handler(),))
    address = f"127.0.0.1:{free_port()}"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {raw}"),)


def test_repair_service_wants_a_node_token_under_auth(caplog: pytest.LogCaptureFixture) -> None:
    """A client (no credentials, a user's password, a forged or another key's node token)
    cannot call RepairNode: UNAUTHENTICATED, and the servicer never runs. A node token
    passes, and the node it stands for is the bound caller (a forward carries it on). The
    refusals are logged (rate-limited), never with what was sent."""
    auth = parse_auth(_auth_table())
    other = parse_auth({**_auth_table(), "accounts": {"A": {}, "B": {}, "C": {}}})
    refused = [
        (),
        _basic("alice", "alice-pw"),
        (("authorization", "Bearer rs-node.A.0000"),),
        (("authorization", f"Bearer {node_token(other, 'A')}"),),
    ]
    repair = _Repair()

    async def body() -> None:
        guard = NodeCallsInterceptor(authenticator=Authenticator(auth), tls=False)
        async with _server((guard,), repair) as addr, grpc.aio.insecure_channel(addr) as ch:
            stub = rpbg.RepairServiceStub(ch)
            req = rpb.RepairNodeRequest(node="n2", repair_id="x")
            for md in refused:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.RepairNode(req, metadata=md, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert repair.callers == []
            await stub.RepairNode(req, metadata=cluster_metadata(auth), timeout=5)
            assert [c.credentials for c in repair.callers] == [cluster_metadata(auth)]

    asyncio.run(body())
    warnings = [r.getMessage() for r in caplog.records if "node-to-node call" in r.getMessage()]
    assert warnings and not any("alice" in w or "rs-node" in w for w in warnings)


def test_repair_service_wants_a_node_certificate_under_tls() -> None:
    """With [tls] the guard asks for a node certificate: a plaintext (test) server has
    none to show, so even a valid node token is PERMISSION_DENIED."""
    auth = parse_auth(_auth_table())
    repair = _Repair()

    async def body() -> None:
        guard = NodeCallsInterceptor(authenticator=Authenticator(auth), tls=True)
        async with _server((guard,), repair) as addr, grpc.aio.insecure_channel(addr) as ch:
            stub = rpbg.RepairServiceStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.RepairNode(
                    rpb.RepairNodeRequest(node="n2"), metadata=cluster_metadata(auth), timeout=5
                )
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert repair.callers == []

    asyncio.run(body())


def _append(src: str, dst: str) -> Message:
    return Message(type=MessageType.APPEND, src=src, dst=dst, group="g", term=1)


def test_raft_service_wants_the_node_token_under_auth() -> None:
    """Raft traffic without the node token is refused before any message is delivered; a
    transport configured with ``cluster_metadata`` gets its messages through."""
    auth = parse_auth(_auth_table())
    got: list[Inbound] = []

    async def body() -> None:
        receiver = GrpcTransport("n1")
        receiver.bind(got.append)
        guard = NodeCallsInterceptor(authenticator=Authenticator(auth), tls=False)
        async with _server((guard,), _Repair(), receiver) as addr:
            plain = GrpcTransport("n2", peers={"n1": addr})
            signed = GrpcTransport(
                "n3",
                peers={"n1": addr},
                config=GrpcTransportConfig(call_metadata=cluster_metadata(auth)),
            )
            try:
                plain.send("n1", [_append("n2", "n1")])
                signed.send("n1", [_append("n3", "n1")])
                for _ in range(500):  # bounded: a refused stream never delivers
                    if got:
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.2)  # room for the refused one to (wrongly) arrive
            finally:
                await plain.close()
                await signed.close()
                await receiver.close()

    asyncio.run(body())
    assert {m.src for inbound in got for m in inbound.messages} == {"n3"}


def test_node_secret_file_keys_node_tokens(tmp_path: Path) -> None:
    """With node_secret_file, a token derived from the section (what anyone who reads the
    config could compute) is refused and the secret's token is accepted; a short or
    missing secret file is refused at load, naming the key, never the contents."""
    secret = tmp_path / "node-secret"
    secret.write_text("s" * 40 + "\n")
    keyed = parse_auth(_auth_table(secret))
    unkeyed = parse_auth(_auth_table())
    assert node_token(keyed, "A") != node_token(unkeyed, "A")
    auth = Authenticator(keyed)
    assert auth.node_account(f"Bearer {node_token(keyed, 'A')}") == "A"
    assert auth.node_account(f"Bearer {node_token(unkeyed, 'A')}") is None
    assert "s" * 40 not in repr(keyed)
    short = tmp_path / "short"
    short.write_text("tooshort")
    for path in (short, tmp_path / "missing"):
        with pytest.raises(InvalidArgumentError) as err:
            parse_auth(_auth_table(path))
        assert err.value.field == "auth.node_secret_file"
        assert "tooshort" not in str(err.value)


class _Streams(pbg.StreamServiceServicer):  # type: ignore[misc]
    async def StreamNames(self, request: Any, context: Any) -> Any:
        return pb.StreamNamesResponse(names=[caller().account])


def test_node_token_needs_a_node_certificate_under_tls() -> None:
    """Under [tls] (node_certificates) a node token on a connection without a node
    certificate is UNAUTHENTICATED on the client API; a user's credentials still work."""
    auth = parse_auth(_auth_table())

    async def body() -> None:
        server = grpc.aio.server(
            interceptors=(AuthInterceptor(Authenticator(auth), node_certificates=True),)
        )
        pbg.add_StreamServiceServicer_to_server(_Streams(), server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pbg.StreamServiceStub(ch)
                token = (("authorization", f"Bearer {node_token(auth, 'B')}"),)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.StreamNames(pb.StreamNamesRequest(), metadata=token, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                ok = await stub.StreamNames(
                    pb.StreamNamesRequest(), metadata=_basic("alice", "alice-pw"), timeout=5
                )
                assert list(ok.names) == ["A"]
        finally:
            await server.stop(None)

    asyncio.run(body())


def test_an_unknown_user_is_checked_against_the_costliest_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/security.md, "Threat model and review": with hashes of different bcrypt costs
    (a cost raised later, per-user ``--cost``), an unknown user's decoy check uses the
    costliest configured hash, chosen once at start, so no real user's refusal takes
    longer than an unknown name's. Which hash is checked is asserted, not timed (the first
    configured user has the cheapest hash: the old decoy)."""
    table = _auth_table()
    table["users"].append({"user": "ops", "password": hash_secret("p", rounds=6), "account": "B"})
    table["tokens"] = [{"name": "ci", "token": hash_secret("t", rounds=5), "account": "B"}]
    config = parse_auth(table)
    dearest = config.users["ops"].secret_hash
    assert bcrypt_cost(config.users["alice"].secret_hash) == 4 and bcrypt_cost(dearest) == 6
    checks: list[bytes] = []
    real = bcrypt.checkpw

    def recorded(secret: bytes, hashed: bytes) -> bool:
        checks.append(hashed)
        return bool(real(secret, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", recorded)
    auth = Authenticator(config)
    with pytest.raises(UnauthenticatedError):
        asyncio.run(auth.resolve(_basic("mallory", "wrong")))
    assert checks == [dearest]


def test_an_unknown_user_costs_a_bcrypt_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong password of a known user and any password of an unknown one cost the same
    one bcrypt check (counted, not timed): refusals do not tell which user names exist."""
    checks: list[bytes] = []
    real = bcrypt.checkpw

    def counted(secret: bytes, hashed: bytes) -> bool:
        checks.append(hashed)
        return bool(real(secret, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    auth = Authenticator(parse_auth(_auth_table()))

    async def body() -> None:
        for user in ("alice", "mallory"):
            with pytest.raises(UnauthenticatedError):
                await auth.resolve(_basic(user, "wrong"))
            assert len(checks) == 1, user
            checks.clear()

    asyncio.run(body())


def test_credential_checks_under_way_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With BCRYPT_CHECKS_PENDING_MAX checks running or queued (bcrypt held here), one more
    credential is refused UNAVAILABLE (retriable) at once instead of queueing; the held
    ones end UNAUTHENTICATED once bcrypt answers, and a later check runs again."""
    gate = threading.Event()
    real = bcrypt.checkpw

    def held(secret: bytes, hashed: bytes) -> bool:
        gate.wait(60)  # bounded: the test releases it
        return bool(real(secret, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", held)
    auth = Authenticator(parse_auth(_auth_table()))

    async def body() -> None:
        tasks = [
            asyncio.ensure_future(auth.resolve(_basic("alice", f"wrong{i}")))
            for i in range(BCRYPT_CHECKS_PENDING_MAX)
        ]
        for _ in range(1000):  # until every task reached its check
            if auth._pending == BCRYPT_CHECKS_PENDING_MAX:
                break
            await asyncio.sleep(0.005)
        with pytest.raises(UnavailableError):
            await auth.resolve(_basic("alice", "one-more"))
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, UnauthenticatedError) for r in results)
        with pytest.raises(UnauthenticatedError):
            await auth.resolve(_basic("alice", "later"))

    asyncio.run(body())


# -- what a node certificate is --------------------------------------------------------------

_NODE_URI = "urn:raftstream:node:n1"


def _issue(
    certs: CertSet, tmp_path: Path, name: str, sans: list[x509.GeneralName], *, node_usages: bool
) -> tuple[Path, Path, Path]:
    """A certificate signed by ``certs``' CA (ca, cert, key paths): client auth only, or
    with ``node_usages`` server and client auth, as docs/tls.md asks of a node's."""
    ca = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    ca_key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if node_usages:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return (certs.ca, cert_path, key_path)


def test_only_a_uri_san_with_both_usages_makes_a_node_certificate(tmp_path: Path) -> None:
    """docs/tls.md: a node certificate carries the URI SAN ``urn:raftstream:node:<name>``
    and the server and client auth usages. Signed by the cluster CA, a client-auth-only
    certificate with that URI SAN, and one with both usages but the string as a DNS SAN,
    are no node: the repair service and the Raft service refuse them PERMISSION_DENIED
    (nothing reaches either), and a node token from them is UNAUTHENTICATED on the client
    API. Before the fix both passed (every SAN type counted, usages were ignored). A node
    certificate of ``raftstream certs`` passes; its client certificate does not."""
    certs = generate(tmp_path / "certs", nodes=["n1", "n2"], clients=["alice"])
    uri = [x509.UniformResourceIdentifier(_NODE_URI)]
    dns = [x509.DNSName(_NODE_URI), x509.DNSName("localhost")]
    impostors = {
        "client-usage-uri-san": _issue(certs, tmp_path, "c-uri", uri, node_usages=False),
        "node-usages-dns-san": _issue(certs, tmp_path, "c-dns", dns, node_usages=True),
        "generated-client": (certs.ca, certs.clients["alice"].cert, certs.clients["alice"].key),
    }
    node = (certs.ca, certs.nodes["n1"].cert, certs.nodes["n1"].key)
    for creds in impostors.values():
        assert certificate_node_names(creds[1].read_bytes()) == frozenset()
    assert certificate_node_names(node[1].read_bytes()) == {"n1"}

    auth = parse_auth(_auth_table())
    n2 = certs.nodes["n2"]
    tls = PeerTls(
        ca_pem=certs.ca.read_bytes(), cert_pem=n2.cert.read_bytes(), key_pem=n2.key.read_bytes()
    )
    repair = _Repair()
    delivered: list[Inbound] = []

    async def calls(addr: str, creds: tuple[Path, Path, Path]) -> list[grpc.StatusCode]:
        """RepairNode, a Raft batch from n1, and a node token on the client API."""
        ca, cert, key = (p.read_bytes() for p in creds)
        codes = []
        channel_creds = grpc.ssl_channel_credentials(ca, key, cert)
        async with grpc.aio.secure_channel(addr, channel_creds) as ch:
            send = ch.stream_unary(
                f"/{RAFT_SERVICE}/Send",
                request_serializer=raft_pb2.Batch.SerializeToString,
                response_deserializer=raft_pb2.SendAck.FromString,
            )
            token = (("authorization", f"Bearer {node_token(auth, 'A')}"),)
            for call in (
                rpbg.RepairServiceStub(ch).RepairNode(rpb.RepairNodeRequest(node="n2"), timeout=5),
                send(iter([raft_pb2.Batch(src="n1", dst="n2")]), timeout=5),
                pbg.StreamServiceStub(ch).StreamNames(
                    pb.StreamNamesRequest(), metadata=token, timeout=5
                ),
            ):
                try:
                    await call
                    codes.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as err:
                    codes.append(err.code())
        return codes

    async def body() -> None:
        receiver = GrpcTransport("n2", tls=tls)
        receiver.bind(delivered.append)
        interceptors = (
            NodeCallsInterceptor(authenticator=Authenticator(auth), tls=True),
            AuthInterceptor(Authenticator(auth), node_certificates=True),
        )
        async with _server(
            interceptors, repair, receiver, credentials=tls.server_credentials()
        ) as addr:
            refused = [
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.StatusCode.UNAUTHENTICATED,
            ]
            for what, creds in impostors.items():
                assert await calls(addr, creds) == refused, what
            assert repair.callers == []
            assert await calls(addr, node) == [grpc.StatusCode.OK] * 3
            assert len(repair.callers) == 1
        await receiver.close()

    asyncio.run(body())


def test_a_node_started_with_a_certificate_its_peers_refuse_is_stopped_at_start(
    tmp_path: Path,
) -> None:
    """A node certificate without both usages passed the start-up check (it looked at the
    URI SAN only), then every call of the node was PERMISSION_DENIED by its peers: the
    ``[tls]`` check now refuses it at start, naming the key and the rule."""
    from raftstream.cluster.security.tls import parse_tls

    certs = generate(tmp_path / "certs", nodes=["n1"], clients=[])
    uri = [x509.UniformResourceIdentifier(_NODE_URI)]
    ca, cert, key = _issue(certs, tmp_path, "c-uri", uri, node_usages=False)
    table = {"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key)}
    with pytest.raises(InvalidArgumentError) as info:
        parse_tls(table, "n1")
    assert info.value.field == "tls.cert_file"
    assert "serverAuth and clientAuth" in str(info.value)
    ca, cert, key = _issue(certs, tmp_path, "n-uri", uri, node_usages=True)
    table = {"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key)}
    assert parse_tls(table, "n1") is not None
