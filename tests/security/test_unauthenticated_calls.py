"""Issue 39, finding 6: requests without credentials were received and decoded in full
before their refusal (4.4 MB ``PublishRequest``s from hundreds of callers: the node grew
from 0.13 to 4.85 GB). And its "Also": no one user may hold every call a node has.

What closes the class (cluster/security/auth.py ``AuthInterceptor``; docs/security.md,
docs/limits.md "Calls and credentials"): a call whose credentials do not resolve is refused before
its request is read (a request-streaming refusal handler: grpc.aio would receive and decode a unary
request before any unary behaviour ran), and a user with ``user_calls_max`` calls open on the node
has its next one refused RESOURCE_EXHAUSTED, unread too, while other users go on.

In-process: a gRPC server with the node's auth interceptor in front of one client API
method whose request deserializer and handler count what reaches them.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from raftstream.cluster.security.auth import Authenticator, AuthInterceptor, hash_secret, parse_auth

METHOD = "/raftstream.v1.PublishService/Publish"
BIG = b"x" * (4 * 1024 * 1024)  # the size of the finding's requests
GUARD_S = 30  # a hung test fails here instead of hanging CI; no assertion on it
USER_CALLS = 2  # user_calls_max here


def _basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    value = base64.b64encode(f"{user}:{password}".encode()).decode()
    return (("authorization", f"Basic {value}"),)


ALICE = _basic("alice", "alice-pw")
BOB = _basic("bob", "bob-pw")


class _Publish:
    """One client API method that counts decoded requests and handler runs; a handler run
    waits for ``release`` when the request says ``hold``."""

    def __init__(self) -> None:
        self.decoded = 0
        self.handled = 0
        self.release = asyncio.Event()

    def decode(self, raw: bytes) -> bytes:
        self.decoded += 1
        return raw

    async def handle(self, request: bytes, context: Any) -> bytes:
        self.handled += 1
        if request == b"hold":
            await self.release.wait()
        return b"ok"

    def handler(self) -> grpc.GenericRpcHandler:
        method = grpc.unary_unary_rpc_method_handler(self.handle, request_deserializer=self.decode)
        return grpc.method_handlers_generic_handler(
            "raftstream.v1.PublishService", {"Publish": method}
        )


@asynccontextmanager
async def _served() -> AsyncIterator[tuple[_Publish, grpc.aio.Channel]]:
    table = {
        "accounts": {"A": {}, "B": {}},
        "users": [
            {"user": "alice", "password": hash_secret("alice-pw", rounds=4), "account": "A"},
            {"user": "bob", "password": hash_secret("bob-pw", rounds=4), "account": "B"},
        ],
        "user_calls_max": USER_CALLS,
    }
    service = _Publish()
    server = grpc.aio.server(
        interceptors=(AuthInterceptor(Authenticator(parse_auth(table))),),
        options=[("grpc.max_receive_message_length", 8 * 1024 * 1024)],
    )
    server.add_generic_rpc_handlers((service.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
    )
    try:
        yield service, channel
    finally:
        await channel.close()
        await server.stop(None)


async def _call(
    channel: grpc.aio.Channel, request: bytes, metadata: tuple[tuple[str, str], ...] = ()
) -> grpc.StatusCode:
    try:
        await channel.unary_unary(METHOD)(request, metadata=metadata, timeout=GUARD_S)
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def test_calls_without_valid_credentials_are_refused_unread() -> None:
    """No credentials, a wrong password, an unknown user, unreadable credentials: each 4 MB
    request is UNAUTHENTICATED and neither decoded nor handled."""

    async def scenario() -> None:
        async with _served() as (service, channel):
            refused = await asyncio.gather(
                *(_call(channel, BIG) for _ in range(20)),
                _call(channel, BIG, _basic("alice", "wrong")),
                _call(channel, BIG, _basic("mallory", "alice-pw")),
                _call(channel, BIG, (("authorization", "Basic !!"),)),
            )
            assert set(refused) == {grpc.StatusCode.UNAUTHENTICATED}
            assert (service.decoded, service.handled) == (0, 0)
            assert await _call(channel, BIG, ALICE) == grpc.StatusCode.OK  # it does read these
            assert (service.decoded, service.handled) == (1, 1)

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_user_at_user_calls_max_is_refused_unread_and_others_go_on() -> None:
    """user_calls_max: alice's calls beyond it are RESOURCE_EXHAUSTED before their request
    is read; bob's calls still run; alice's places come back when her calls end."""

    async def scenario() -> None:
        async with _served() as (service, channel):
            held = [
                asyncio.ensure_future(_call(channel, b"hold", ALICE)) for _ in range(USER_CALLS)
            ]
            while service.handled < USER_CALLS:
                await asyncio.sleep(0.01)
            decoded = service.decoded

            over = await asyncio.gather(*(_call(channel, BIG, ALICE) for _ in range(5)))
            assert set(over) == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert (service.decoded, service.handled) == (decoded, USER_CALLS)

            assert await _call(channel, b"bob's", BOB) == grpc.StatusCode.OK
            assert service.handled == USER_CALLS + 1

            service.release.set()
            assert set(await asyncio.gather(*held)) == {grpc.StatusCode.OK}
            assert await _call(channel, b"again", ALICE) == grpc.StatusCode.OK

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))
