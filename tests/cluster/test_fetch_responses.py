"""How a pull's events become FetchResponses (``cluster/services_consume.py``): grouped as
they come, a response at most one largest message in bytes (so it fits the gRPC message
limit, docs/limits.md), ended by a terminal status or a complete batch; deliveries arrive
encoded by the ``PullHandle``'s encoder (made while their Deliver op committed) or are
encoded there, the same messages either way."""

from __future__ import annotations

import asyncio
from typing import Any

from raftstream.cluster.config import Limits
from raftstream.cluster.convert import delivery_pb, encoded_delivery
from raftstream.cluster.services_consume import _responses
from raftstream.cluster.stream_leader import PullHandle
from raftstream.engine.consumer_pull import PullEvent, PullStatus, StatusCode, delivery_event
from raftstream.engine.store import StoredMsg
from raftstream.proto import raftstream_pb2 as pb

LIMITS = Limits(payload_bytes_max=1000, headers_bytes_max=100)


def event(seq: int, data_bytes: int = 10) -> PullEvent:
    return delivery_event(
        "r",
        stream="S",
        consumer="c",
        msg=StoredMsg(seq, "a.b", b"x" * data_bytes, 1_000 + seq),
        consumer_seq=seq,
        deliveries=1,
        num_pending=0,
        headers_only=False,
        domain=None,
        account="$G",
    )


def msg_of(e: PullEvent) -> pb.Msg:
    assert e.delivery is not None
    return delivery_pb(e.delivery)


def encoded(e: PullEvent) -> tuple[pb.Msg, int]:
    assert e.delivery is not None
    return encoded_delivery(e.delivery)


def status(code: StatusCode) -> PullEvent:
    return PullEvent(reply="r", status=PullStatus(code=code, description=code.name))


def collect(items: list[tuple[PullEvent, Any]], batch: int) -> list[pb.FetchResponse]:
    async def run() -> list[pb.FetchResponse]:
        handle = PullHandle("r", batch, lambda reply: None)
        assert handle.put(items) == 0
        return [r async for r in _responses(handle, batch, LIMITS)]

    return asyncio.run(run())


def test_encoded_or_not_the_same_messages_grouped_until_the_status() -> None:
    """Deliveries encoded ahead and ones encoded on the way give the same messages, in
    order, in one response with the terminal status that ends the pull."""
    events = [event(s) for s in (1, 2, 3)]
    items: list[tuple[PullEvent, Any]] = [
        (events[0], encoded(events[0])),
        (events[1], None),
        (events[2], encoded(events[2])),
        (status(StatusCode.REQUEST_TIMEOUT), None),
    ]
    (resp,) = collect(items, batch=10)
    assert list(resp.messages) == [msg_of(e) for e in events]
    assert resp.status.code == StatusCode.REQUEST_TIMEOUT


def test_a_response_holds_at_most_one_largest_message_in_bytes() -> None:
    """Four 400-byte messages under a 1100-byte bound: two per response (each response's
    counted bytes within payload_bytes_max + headers_bytes_max), none lost or reordered,
    and the pull ends once its batch is complete."""
    items: list[tuple[PullEvent, Any]] = [(event(s, 400), None) for s in (1, 2, 3, 4)]
    responses = collect(items, batch=4)
    assert [[m.seq for m in r.messages] for r in responses] == [[1, 2], [3, 4]]
    for r in responses:
        assert sum(m.ByteSize() for m in r.messages) <= 1100


def test_a_heartbeat_does_not_end_the_pull() -> None:
    """A 100 Idle Heartbeat is sent in a response of its own and the pull goes on."""
    items: list[tuple[PullEvent, Any]] = [
        (status(StatusCode.IDLE_HEARTBEAT), None),
        (event(1), None),
        (status(StatusCode.NO_MESSAGES), None),
    ]
    responses = collect(items, batch=5)
    assert [r.status.code for r in responses] == [StatusCode.IDLE_HEARTBEAT, 404]
    assert [m.seq for m in responses[1].messages] == [1]
