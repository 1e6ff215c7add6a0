"""Integration: what a fetch waits for, on a real 3-node cluster (``cluster3``) through the
SDK (raftstream/pull.py, "What a fetch waits for"; nats.py's ``fetch`` does the same).

- Messages already there are returned at once, even fewer than the batch: the fetch does
  not wait out its timeout for the rest, and leaves no request waiting on the consumer.
- With nothing there, the fetch waits, and gets what is published meanwhile.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig
from tests.support.cluster import LocalCluster, run
from tests.support.polling import retry_async

pytestmark = pytest.mark.integration

# Far longer than anything here takes: a fetch that waited it out would fail the bound below.
FETCH_TIMEOUT_S = 30.0
NOT_WAITED_OUT_S = FETCH_TIMEOUT_S / 2
WAITING_WAIT_S = 15.0


def test_a_fetch_returns_what_is_there_at_once_and_waits_only_when_nothing_is(
    cluster3: LocalCluster,
) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=15)
        try:
            await js.add_stream(StreamConfig(name="FA", subjects=("fa.>",), num_replicas=3))
            await js.add_consumer("FA", ConsumerConfig(durable_name="C"))
            sub = await js.pull_subscribe_bind("FA", "C")

            for i in range(3):
                await js.publish("fa.a", f"m{i}".encode())
            t0 = time.monotonic()
            msgs = await sub.fetch(100, timeout=FETCH_TIMEOUT_S)
            assert time.monotonic() - t0 < NOT_WAITED_OUT_S
            assert [m.data for m in msgs] == [b"m0", b"m1", b"m2"]
            assert (await js.consumer_info("FA", "C")).num_waiting == 0
            for m in msgs:
                await m.ack_sync()

            # Nothing there: the fetch's request waits for the batch.
            waiting = asyncio.ensure_future(sub.fetch(2, timeout=FETCH_TIMEOUT_S))

            async def one_waiting() -> None:
                assert (await js.consumer_info("FA", "C")).num_waiting == 1

            await retry_async(one_waiting, timeout_s=WAITING_WAIT_S)
            assert not waiting.done()
            await js.publish("fa.a", b"m3")
            await js.publish("fa.a", b"m4")
            later = await waiting
            assert [m.data for m in later] == [b"m3", b"m4"]
        finally:
            await js.close()

    run(body())
