"""How a pull's events become FetchResponses (``cluster/services/consume.py``): grouped as
they come, a response at most one largest message in bytes (so it fits the gRPC message
limit, docs/limits.md), ended by a terminal status or a complete batch."""

from __future__ import annotations

import asyncio

from raftstream.cluster.config import Limits
from raftstream.cluster.services.consume import _responses
from raftstream.cluster.services.convert import delivery_pb
from raftstream.cluster.stream.group import PullHandle
from raftstream.engine.consumer_pull import PullEvent, PullStatus, StatusCode
from raftstream.proto import raftstream_pb2 as pb
from tests.support.deliveries import event

LIMITS = Limits(payload_bytes_max=1000, headers_bytes_max=100)


def msg_of(e: PullEvent) -> pb.Msg:
    assert e.delivery is not None
    return delivery_pb(e.delivery)


def status(code: StatusCode) -> PullEvent:
    return PullEvent(reply="r", status=PullStatus(code=code, description=code.name))


def collect(items: list[PullEvent], batch: int) -> list[pb.FetchResponse]:
    async def run() -> list[pb.FetchResponse]:
        handle = PullHandle("r", batch, lambda reply: None)
        assert handle.put(items) == 0
        return [r async for r in _responses(handle, batch, LIMITS)]

    return asyncio.run(run())


def test_the_deliveries_grouped_until_the_status() -> None:
    """Queued deliveries go, in order, in one response with the terminal status that ends
    the pull."""
    events = [event(s) for s in (1, 2, 3)]
    (resp,) = collect([*events, status(StatusCode.REQUEST_TIMEOUT)], batch=10)
    assert list(resp.messages) == [msg_of(e) for e in events]
    assert resp.status.code == StatusCode.REQUEST_TIMEOUT


def test_a_response_holds_at_most_one_largest_message_in_bytes() -> None:
    """Four 400-byte messages under a 1100-byte bound: two per response (each response's
    counted bytes within payload_bytes_max + headers_bytes_max), none lost or reordered,
    and the pull ends once its batch is complete."""
    responses = collect([event(s, 400) for s in (1, 2, 3, 4)], batch=4)
    assert [[m.seq for m in r.messages] for r in responses] == [[1, 2], [3, 4]]
    for r in responses:
        assert sum(m.ByteSize() for m in r.messages) <= 1100


def test_a_heartbeat_does_not_end_the_pull() -> None:
    """A 100 Idle Heartbeat is sent in a response of its own and the pull goes on."""
    items = [status(StatusCode.IDLE_HEARTBEAT), event(1), status(StatusCode.NO_MESSAGES)]
    responses = collect(items, batch=5)
    assert [r.status.code for r in responses] == [StatusCode.IDLE_HEARTBEAT, 404]
    assert [m.seq for m in responses[1].messages] == [1]
