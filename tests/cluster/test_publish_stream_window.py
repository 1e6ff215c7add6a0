"""PublishStream with more requests in flight than the node's window (a real node).

proto/raftstream.proto, PublishStream: "the server answers every request exactly once"; and
``[limits] publish_async_pending_max`` bounds the unanswered publishes of one call (the node
stops reading until one is answered). A batch larger than that window must still be answered
in full, in order, with nothing lost or stored twice: the reader stops mid-batch and goes on
as answers free the window.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from raftstream.cluster.common.answers import answered_within
from raftstream.errors import NotLeaderError, UnavailableError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.support.cluster import LocalCluster, running, until_led

WINDOW_MSGS = 3
BATCHES = 3
BATCH_MSGS = 10  # more than the window


class _NarrowWindow(LocalCluster):
    def _write_config(self, name: str) -> Path:
        p: Path = super()._write_config(name)
        limits = f"\n[limits]\npublish_async_pending_max = {WINDOW_MSGS}\n"
        p.write_text(p.read_text() + limits)
        return p


@pytest.fixture(scope="module")
def node() -> Iterator[LocalCluster]:
    with running(_NarrowWindow(1)) as c:
        yield c


@pytest.mark.integration
def test_batches_larger_than_the_window_are_answered_in_full_in_order(
    node: LocalCluster,
) -> None:
    with grpc.insecure_channel(node.servers[0]) as ch:
        streams = pbg.StreamServiceStub(ch)
        body = json.dumps({"name": "W", "subjects": ["w.>"]})
        streams.CreateStream(pb.CreateStreamRequest(config_json=body), timeout=20)
        until_led(streams.GetStreamInfo)(pb.StreamInfoRequest(name="W"), timeout=20)

        ids = iter(range(1, BATCHES * BATCH_MSGS + 1))
        batches = [
            pb.PublishBatch(
                requests=[
                    pb.PublishRequest(id=i, subject="w.x", data=str(i).encode())
                    for i in (next(ids) for _ in range(BATCH_MSGS))
                ]
            )
            for _ in range(BATCHES)
        ]
        call = pbg.PublishServiceStub(ch).PublishStream(iter(batches), timeout=30)
        results = [r for batch in call for r in batch.results]

        assert [r.id for r in results] == list(range(1, BATCHES * BATCH_MSGS + 1))
        assert all(r.HasField("ack") for r in results), [r.error for r in results]
        assert [r.ack.seq for r in results] == list(range(1, BATCHES * BATCH_MSGS + 1))
        state = streams.GetStreamInfo(pb.StreamInfoRequest(name="W"), timeout=20).state
        assert (state.messages, state.last_seq) == (BATCHES * BATCH_MSGS, BATCHES * BATCH_MSGS)


def test_an_item_with_timeout_ns_is_answered_unavailable_before_it_ends() -> None:
    """The SDK's sync publish sets ``timeout_ns``: a publish the leader cannot commit in
    time (a lost quorum) is answered UNAVAILABLE a little before, not left to the client's
    own timeout; one that commits passes its answer through, and a late commit changes
    nothing."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stuck: asyncio.Future[str] = loop.create_future()
        answer = answered_within(stuck, 0.05, "publish")
        with pytest.raises(UnavailableError, match="not committed in time"):
            await asyncio.wait_for(answer, 1.0)
        stuck.set_exception(NotLeaderError("late"))  # retrieved: no warning at collection
        quick: asyncio.Future[str] = loop.create_future()
        answer = answered_within(quick, 5.0, "publish")
        quick.set_result("acked")
        assert await answer == "acked"

    asyncio.run(main())
