"""A node proves it holds the cluster's node key before node credentials go to it (issue 39,
finding 3; docs/security.md, "Threat model and review"; ``cluster/security/node_proof.py``).

In process: a real gRPC server with the node's ``NodeServicer`` behind its
``NodeCallsInterceptor`` (``[auth]``, no ``[tls]``), and the meta leader's check
``check_new_node`` against it. The proof binds the nonce, the name and the address; a
server with another node key, another name or another address fails it; a server that
does not answer, or runs a version without ``Prove``, is refused as not proven. ``Prove``
is the one node call that wants no node token, and the check sends no credentials.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

import grpc
import pytest

from raftstream.cluster.meta.descriptions import NodeDescription
from raftstream.cluster.security.auth import (
    AUTHORIZATION_KEY,
    AuthConfig,
    Authenticator,
    NodeCallsInterceptor,
    hash_secret,
    node_token,
    parse_auth,
)
from raftstream.cluster.security.node_proof import NONCE_BYTES, check_new_node, node_proof
from raftstream.cluster.services.node import NodeServicer
from raftstream.errors import InvalidArgumentError, PermissionDeniedError, PreconditionError
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg
from tests.cluster.node_harness import free_port

HASH = hash_secret("pw", rounds=4)


def _auth(secret: bytes | None, tmp_path_factory: pytest.TempPathFactory) -> AuthConfig:
    section: dict[str, object] = {
        "accounts": {"A": {}},
        "users": [{"user": "u", "password": HASH, "account": "A"}],
    }
    if secret is not None:
        path = tmp_path_factory.mktemp("secret") / "node-secret"
        path.write_bytes(secret)
        section["node_secret_file"] = str(path)
    return parse_auth(section)


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> AuthConfig:
    return _auth(b"s" * 32, tmp_path_factory)


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> AuthConfig:
    return _auth(b"t" * 32, tmp_path_factory)


def _describe() -> NodeDescription:
    raise OSError("not asked in these tests")


async def _serve(auth: AuthConfig | None, *, name: str, listen: str, says: str) -> grpc.aio.Server:
    interceptors = []
    if auth is not None:
        interceptors = [NodeCallsInterceptor(authenticator=Authenticator(auth), tls=False)]
    server = grpc.aio.server(interceptors=interceptors)
    npbg.add_NodeServiceServicer_to_server(
        NodeServicer(auth=auth, describe=_describe, name=name, address=says), server
    )
    server.add_insecure_port(listen)
    await server.start()
    return server


def _against(
    auth: AuthConfig | None,
    body: Callable[[str], Awaitable[None]],
    *,
    name: str = "n4",
    says: str | None = None,
) -> None:
    """Run ``body(address)`` against a node ``name`` serving on a free loopback port with
    ``auth`` (saying it serves at ``says``, its own address unless given)."""
    address = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        server = await _serve(auth, name=name, listen=address, says=says or address)
        try:
            await body(address)
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_the_proof_binds_nonce_name_address_and_key(ours: AuthConfig, theirs: AuthConfig) -> None:
    nonce = secrets.token_bytes(NONCE_BYTES)
    proof = node_proof(ours, nonce, "n4", "10.0.0.4:7101")
    assert proof == node_proof(ours, nonce, "n4", "10.0.0.4:7101")
    others = [
        node_proof(ours, secrets.token_bytes(NONCE_BYTES), "n4", "10.0.0.4:7101"),
        node_proof(ours, nonce, "n5", "10.0.0.4:7101"),
        node_proof(ours, nonce, "n4", "10.0.0.5:7101"),
        node_proof(theirs, nonce, "n4", "10.0.0.4:7101"),
    ]
    assert proof not in others
    # Never a node token: those are hex text of an HMAC under the node key itself.
    assert proof.hex() not in (node_token(ours, "A") or "")
    with pytest.raises(InvalidArgumentError):
        node_proof(ours, b"short", "n4", "10.0.0.4:7101")  # answers must not be collectable


def test_a_node_of_the_cluster_proves_its_name_and_address(ours: AuthConfig) -> None:
    async def body(address: str) -> None:
        await check_new_node(ours, name="n4", address=address)

    _against(ours, body)


def test_another_name_at_the_address_is_refused(ours: AuthConfig) -> None:
    """A relay, or a node named otherwise: the proof is for n4, not n5."""

    async def body(address: str) -> None:
        with pytest.raises(PermissionDeniedError, match="answers as node 'n4'"):
            await check_new_node(ours, name="n5", address=address)

    _against(ours, body)


def test_a_server_with_another_node_key_is_refused(ours: AuthConfig, theirs: AuthConfig) -> None:
    async def body(address: str) -> None:
        with pytest.raises(PermissionDeniedError, match="did not prove"):
            await check_new_node(ours, name="n4", address=address)

    _against(theirs, body)


def test_a_server_claiming_another_address_is_refused(ours: AuthConfig) -> None:
    """A relay passing the challenge on to a real node proves the real node's address."""

    async def body(address: str) -> None:
        with pytest.raises(PermissionDeniedError, match=r"answers as node 'n4' at '10\.9\.9\.9"):
            await check_new_node(ours, name="n4", address=address)

    _against(ours, body, says="10.9.9.9:7101")


def test_a_server_without_prove_or_not_answering_is_refused(ours: AuthConfig) -> None:
    """Nothing at the address, or a server without ``Prove`` (an older version, or not a
    raftstream node at all): FAILED_PRECONDITION saying to start the node first; the
    challenge carries no credentials at all."""
    seen: list[tuple[tuple[str, str], ...]] = []

    class Recorder(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> None:
            seen.append(tuple(details.invocation_metadata or ()))
            return None  # UNIMPLEMENTED

    async def main() -> None:
        nothing = f"127.0.0.1:{free_port()}"
        with pytest.raises(PreconditionError, match="start it first"):
            await check_new_node(ours, name="n4", address=nothing, timeout_s=1.0)
        address = f"127.0.0.1:{free_port()}"
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((Recorder(),))
        server.add_insecure_port(address)
        await server.start()
        try:
            with pytest.raises(PreconditionError, match="cannot prove it is a node"):
                await check_new_node(ours, name="n4", address=address)
        finally:
            await server.stop(None)

    asyncio.run(main())
    assert seen, "the challenge reached the server"
    assert all(k != AUTHORIZATION_KEY for md in seen for k, _ in md)


def test_prove_alone_needs_no_node_token(ours: AuthConfig) -> None:
    """``NodeCallsInterceptor``: Prove answers without credentials; every other node call
    still wants a node token."""

    async def body(address: str) -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = npbg.NodeServiceStub(channel)
            resp = await stub.Prove(npb.ProveRequest(nonce=b"x" * NONCE_BYTES), timeout=5)
            assert (resp.name, resp.address) == ("n4", address)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.LedGroups(npb.LedGroupsRequest(groups=["meta"]), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Prove(npb.ProveRequest(nonce=b"short"), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    _against(ours, body)


def test_a_node_without_auth_proves_nothing(ours: AuthConfig) -> None:
    async def body(address: str) -> None:
        with pytest.raises(PreconditionError, match="did not answer \\(FAILED_PRECONDITION\\)"):
            await check_new_node(ours, name="n4", address=address)

    _against(None, body)
