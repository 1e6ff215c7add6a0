"""Integration: push delivery over ``ConsumeService.Consume`` on a real R3 cluster.

The SDK's push subscription lands with the next issue, so this drives the proto directly:
the call attaches to a push consumer, receives every message once, answers the flow-control
request when the window fills (delivery stalls until then: FLOW_WINDOW_MSGS), and acks in
the same call, each sync ack answered with an AckResult once replicated.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig
from raftstream.engine.consumer_push import FLOW_WINDOW_MSGS
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.support.cluster import LocalCluster, run

pytestmark = pytest.mark.integration

TOTAL_MSGS = FLOW_WINDOW_MSGS + 88


def test_push_consume_with_flow_control_and_acks(cluster3: LocalCluster) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="P", subjects=("p.>",), num_replicas=3))
            await js.add_consumer(
                "P",
                ConsumerConfig(
                    durable_name="PUSH",
                    deliver_subject="deliver.push",
                    flow_control=True,
                    idle_heartbeat=1_000_000_000,
                ),
            )
            for i in range(TOTAL_MSGS):
                await js.publish_async("p.x", b"%d" % i)
            await js.publish_async_completed()
            info = await js.stream_info("P")
            assert info.cluster is not None and info.cluster.leader
            leader_addr = cluster3.addr(info.cluster.leader)
            await _consume_all(leader_addr)
            ci = await js.consumer_info("P", "PUSH")
            assert ci.delivered.stream_seq == TOTAL_MSGS and ci.num_ack_pending == 0
        finally:
            await js.close()

    run(body())


async def _consume_all(addr: str) -> None:
    requests: asyncio.Queue[pb.ConsumeRequest | None] = asyncio.Queue()
    await requests.put(pb.ConsumeRequest(start=pb.ConsumeStart(stream="P", consumer="PUSH")))

    async def gen():  # the client's side of the bidi call
        while (req := await requests.get()) is not None:
            yield req

    async with grpc.aio.insecure_channel(addr) as ch:
        call = pbg.ConsumeServiceStub(ch).Consume(gen(), timeout=60)
        got: list[bytes] = []
        acked: set[int] = set()
        flow_controls = 0
        async for resp in call:
            assert not resp.HasField("status"), resp.status
            acks = []
            for m in resp.messages:
                got.append(m.data)
                acks.append(pb.AckItem(reply=m.reply, sync=True, id=m.seq))
            if resp.HasField("flow_control"):
                flow_controls += 1
                assert len(got) == FLOW_WINDOW_MSGS * flow_controls  # stalled at the window
                reply = pb.FlowControlReply(token=resp.flow_control.token)
                await requests.put(pb.ConsumeRequest(flow_control_replies=[reply]))
            if acks:
                await requests.put(pb.ConsumeRequest(acks=acks))
            for r in resp.ack_results:
                assert not r.HasField("error"), r.error
                acked.add(r.id)
            if len(acked) == TOTAL_MSGS:
                break
        await requests.put(None)
        call.cancel()
    assert got == [b"%d" % i for i in range(TOTAL_MSGS)]  # each once, in order
    assert flow_controls == 1
