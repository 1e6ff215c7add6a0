"""How a push step becomes ConsumeResponses (``cluster/services/push.py``): deliveries
grouped up to one largest message in bytes per response, so every response fits the gRPC
message limit (docs/limits.md), with the flow-control request and the heartbeat in the last.

Regression: a push consumer without flow control put a whole step (up to 256 deliveries) in
one response; 80 messages of 1 MB made an 80 MB response, over the 64 MiB gRPC limit, so
the call failed, and every redelivery of those messages failed the same way."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from raftstream.cluster.common.clock import SYSTEM_CLOCK
from raftstream.cluster.config import Limits
from raftstream.cluster.services.push import PushSession
from raftstream.engine.consumer_push import Heartbeat, PushStep
from raftstream.proto import raftstream_pb2 as pb
from tests.support.deliveries import delivery

LIMITS = Limits(payload_bytes_max=1000, headers_bytes_max=100)


async def no_ack(*_: Any) -> None:
    return None


def responses(step: PushStep) -> list[pb.ConsumeResponse]:
    async def run() -> list[pb.ConsumeResponse]:
        ctx: Any = SimpleNamespace(config=SimpleNamespace(limits=LIMITS), clock=SYSTEM_CLOCK)
        session = PushSession(ctx, no_ack)
        await session._send(step)
        out = []
        while not session._out.empty():
            out.append(session._out.get_nowait())
        return out

    return asyncio.run(run())


def test_a_push_step_is_split_into_responses_of_one_largest_message() -> None:
    """Five 400-byte deliveries under an 1100-byte bound: two per response, in order, none
    lost; the flow-control request and the heartbeat come with the last response."""
    step = PushStep(
        deliveries=tuple(delivery(s, 400) for s in range(1, 6)),
        flow_control="fc.1",
        heartbeat=Heartbeat(last_consumer_seq=5, last_stream_seq=5),
    )
    out = responses(step)
    assert [[m.seq for m in r.messages] for r in out] == [[1, 2], [3, 4], [5]]
    for r in out:
        assert sum(m.ByteSize() for m in r.messages) <= 1100
    assert [r.HasField("flow_control") for r in out] == [False, False, True]
    assert [r.HasField("heartbeat") for r in out] == [False, False, True]
    assert out[-1].flow_control.token == "fc.1"


def test_small_deliveries_stay_in_one_response_and_a_large_one_goes_alone() -> None:
    """Small deliveries share a response; one larger than the bound still goes (alone)."""
    out = responses(PushStep(deliveries=(delivery(1, 10), delivery(2, 10), delivery(3, 2000))))
    assert [[m.seq for m in r.messages] for r in out] == [[1, 2], [3]]
