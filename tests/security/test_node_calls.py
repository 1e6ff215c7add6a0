"""Node-to-node services and node tokens (docs/security.md, "Threat model and review").

In-process gRPC servers, no cluster: the node-calls guard (``NodeCallsInterceptor``) keeps
the repair and Raft services to nodes under ``[auth]`` without TLS (a client must not make
the meta leader take a healthy node out of the cluster); the Raft transport sends the node
token it needs; a ``node_secret_file`` keys node tokens so that the config's bcrypt hashes
no longer mint them; under ``[tls]`` a node token is accepted only from a node certificate.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import pytest

from raftstream.cluster.auth import (
    BCRYPT_CHECKS_PENDING_MAX,
    Authenticator,
    AuthInterceptor,
    Caller,
    NodeCallsInterceptor,
    caller,
    cluster_metadata,
    hash_secret,
    node_token,
    parse_auth,
)
from raftstream.errors import InvalidArgumentError, UnauthenticatedError, UnavailableError
from raftstream.localnet import free_port
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.raft.transport import GrpcTransport, GrpcTransportConfig
from raftstream.raft.transport.api import Inbound
from raftstream.raft.types import Message, MessageType


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
    interceptors: tuple[Any, ...], repair: _Repair, transport: GrpcTransport | None = None
) -> AsyncIterator[str]:
    server = grpc.aio.server(interceptors=interceptors)
    rpbg.add_RepairServiceServicer_to_server(repair, server)
    if transport is not None:
        server.add_generic_rpc_handlers((transport.rpc_handler(),))
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
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
