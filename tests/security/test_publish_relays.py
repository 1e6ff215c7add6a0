"""Publish relays on a follower are keyed by the resolved caller and end when idle (issue 39,
finding 4; ``cluster/services/forward.py``; docs/security.md, "Threat model and review").

Before: a relay was keyed by the raw ``authorization`` text and never closed, so one valid
password spelt in many letter cases and spacings opened a ``PublishStream`` call on the
leader's node per spelling, each holding one of its ``streaming_calls_max`` places forever.
In process: a ``Forwarder`` relays to a fake leader's node that counts the open
``PublishStream`` calls and answers every publish.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raftstream.cluster.security.auth import ALL, Caller, Permissions, acting_as
from raftstream.cluster.services.forward import Forwarder
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.cluster.node_harness import free_port

IDLE_S = 0.2
WAIT_S = 5.0
_RAW = base64.b64encode(b"alice:alice-pw").decode()


def _alice(spelling: str, permissions: Permissions = ALL) -> Caller:
    return Caller(
        account="A",
        user="alice",
        permissions=permissions,
        system=False,
        credentials=(("authorization", spelling),),
    )


class _Leader(pbg.PublishServiceServicer):
    """A stream leader's node: counts PublishStream calls, acks every publish (once
    ``release`` is set)."""

    def __init__(self) -> None:
        self.opened = 0
        self.open = 0
        self.release = asyncio.Event()
        self.release.set()

    async def PublishStream(
        self, request_iterator: AsyncIterator[pb.PublishBatch], context: Any
    ) -> AsyncIterator[pb.PublishResultBatch]:
        await context.send_initial_metadata(())
        self.opened += 1
        self.open += 1
        try:
            async for batch in request_iterator:
                await self.release.wait()
                yield pb.PublishResultBatch(
                    results=[
                        pb.PublishResult(id=r.id, ack=pb.PubAck(stream="S", seq=1))
                        for r in batch.requests
                    ]
                )
        finally:
            self.open -= 1


def _with_leader(body: Callable[[Forwarder, str, _Leader], Awaitable[None]]) -> None:
    async def main() -> None:
        leader = _Leader()
        server = grpc.aio.server()
        pbg.add_PublishServiceServicer_to_server(leader, server)
        addr = f"127.0.0.1:{free_port()}"
        server.add_insecure_port(addr)
        await server.start()
        fwd = Forwarder(channel_options=[], relay_idle_s=IDLE_S)
        try:
            await body(fwd, addr, leader)
        finally:
            await fwd.close()
            await server.stop(None)

    asyncio.run(main())


async def _publish(fwd: Forwarder, addr: str, who: Caller) -> pb.PubAck:
    with acting_as(who):
        fut = fwd.relay(addr).submit(pb.PublishRequest(subject="s", data=b"x"))
    return await asyncio.wait_for(fut, WAIT_S)


async def _until(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not cond():
            await asyncio.sleep(0.02)


def test_one_caller_spelt_many_ways_holds_one_relay() -> None:
    """Every spelling of alice's credentials (the scheme's letter case, the spaces after
    it) resolves to alice: one relay, one call on the leader's node. Another user, or the
    same name with other permissions, is another identity: a relay of its own."""

    async def body(fwd: Forwarder, addr: str, leader: _Leader) -> None:
        spellings = [
            f"{scheme}{' ' * spaces}{_RAW}"
            for scheme in ("Basic", "basic", "BASIC", "bAsIc")
            for spaces in (1, 2, 5)
        ]
        for spelling in spellings:
            await _publish(fwd, addr, _alice(spelling))
        assert leader.opened == 1
        bob = Caller(account="A", user="bob", permissions=ALL, system=False)
        await _publish(fwd, addr, bob)
        await _publish(fwd, addr, _alice(spellings[0], Permissions(publish=("s",))))
        assert (leader.opened, fwd.relays_open()) == (3, 3)

    _with_leader(body)


def test_an_idle_relay_ends_its_call_and_the_next_publish_opens_another() -> None:
    async def body(fwd: Forwarder, addr: str, leader: _Leader) -> None:
        await _publish(fwd, addr, _alice(f"Basic {_RAW}"))
        await _until(lambda: leader.open == 0)  # the place on the leader's node is free
        assert fwd.relays_open() == 0
        await _publish(fwd, addr, _alice(f"basic  {_RAW}"))
        assert (leader.opened, leader.open) == (2, 1)

    _with_leader(body)


def test_a_relay_waiting_for_answers_is_not_idle() -> None:
    """A publish the leader has not answered yet keeps the relay open past ``idle_s``: its
    answer must still reach the client."""

    async def body(fwd: Forwarder, addr: str, leader: _Leader) -> None:
        leader.release.clear()
        with acting_as(_alice(f"Basic {_RAW}")):
            fut = fwd.relay(addr).submit(pb.PublishRequest(subject="s", data=b"x"))
        await asyncio.sleep(IDLE_S * 3)
        assert (leader.open, fwd.relays_open()) == (1, 1)
        leader.release.set()
        assert (await asyncio.wait_for(fut, WAIT_S)).seq == 1
        await _until(lambda: leader.open == 0)

    _with_leader(body)
