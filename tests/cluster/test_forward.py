"""Forwarding to a node that cannot be reached: nothing was sent, so the caller gets
NO_LEADER (retriable by the SDK even for a publish without a msg id), not the ambiguous
UNAVAILABLE of a hop that failed mid-way (cluster/forward.py)."""

from __future__ import annotations

import asyncio

import pytest

from raftstream.cluster.forward import Forwarder
from raftstream.errors import NoLeaderError
from raftstream.localnet import free_port
from raftstream.proto import raftstream_pb2 as pb


def _nobody() -> str:
    return f"127.0.0.1:{free_port()}"  # a free port: nothing listens there


def test_a_unary_hop_that_never_connected_is_no_leader() -> None:
    async def main() -> None:
        fwd = Forwarder(channel_options=[])
        try:
            with pytest.raises(NoLeaderError, match="nothing was sent"):
                await fwd.unary(
                    _nobody(),
                    "/raftstream.v1.PublishService/Publish",
                    pb.PublishRequest(subject="a", data=b"x"),
                    pb.PubAck.FromString,
                    timeout_s=5.0,
                )
        finally:
            await fwd.close()

    asyncio.run(main())


def test_relayed_publishes_that_never_connected_are_no_leader() -> None:
    async def main() -> None:
        fwd = Forwarder(channel_options=[])
        try:
            relay = fwd.relay(_nobody())
            futs = [relay.submit(pb.PublishRequest(subject="a", data=b"%d" % i)) for i in range(3)]
            for fut in futs:
                with pytest.raises(NoLeaderError, match="nothing was sent"):
                    await asyncio.wait_for(fut, 10.0)
            assert relay.broken
        finally:
            await fwd.close()

    asyncio.run(main())
