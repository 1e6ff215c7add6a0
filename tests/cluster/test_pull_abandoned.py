"""Integration: pulls whose client went away, durables with inactive_threshold, and a
filter edit's num_pending, on a real 3-node cluster (``cluster3``) through the SDK.

- JetStream drops a pull request whose requester is gone. Here the server learns it from
  gRPC when a Fetch call is cancelled: the request leaves the consumer at once, so it
  holds no ``max_waiting`` place and takes no message (review: t24, t25).
- JetStream 2.9+ deletes a durable consumer that sets ``inactive_threshold`` once idle
  that long; one without keeps.
- Consumer info after a filter edit counts the new filters' messages at once (review: t32).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig
from tests.support.cluster import LocalCluster, run
from tests.support.polling import retry_async

pytestmark = pytest.mark.integration

# A fetch the test abandons asks for this long: far beyond the wait below for its request
# to leave, so only the cancel can have removed it (never its expiry).
ABANDONED_FETCH_S = 25.0
GONE_WAIT_S = 15.0


async def _connect(servers: list[str]) -> raftstream.Client:
    return await raftstream.connect(servers=servers, timeout=15)


def test_abandoned_fetches_leave_max_waiting_and_take_no_messages(cluster3: LocalCluster) -> None:
    """max_waiting=2: two fetches the client gave up on (its own wait_for timed out), then
    a client closed with a fetch outstanding; each request leaves the consumer, and a live
    fetch gets the messages published after, not 409 Exceeded MaxWaiting."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        other = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="AB", subjects=("ab.>",), num_replicas=3))
            await js.add_consumer("AB", ConsumerConfig(durable_name="C", max_waiting=2))
            sub = await js.pull_subscribe_bind("AB", "C")

            async def waiting(n: int) -> None:
                assert (await js.consumer_info("AB", "C")).num_waiting == n

            for _ in range(2):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(sub.fetch(100, timeout=ABANDONED_FETCH_S), 0.5)
            await retry_async(lambda: waiting(0), timeout_s=GONE_WAIT_S)
            for i in range(3):
                await js.publish("ab.a", f"m{i}".encode())
            msgs = await sub.fetch(3, timeout=10)
            assert [m.data for m in msgs] == [b"m0", b"m1", b"m2"]
            assert all(m.metadata.num_delivered == 1 for m in msgs)
            for m in msgs:
                await m.ack_sync()

            # A client closed with a fetch outstanding.
            gone_sub = await other.pull_subscribe_bind("AB", "C")
            fetch = asyncio.ensure_future(gone_sub.fetch(5, timeout=ABANDONED_FETCH_S))
            await retry_async(lambda: waiting(1), timeout_s=GONE_WAIT_S)
            await other.close()
            await asyncio.gather(fetch, return_exceptions=True)
            await retry_async(lambda: waiting(0), timeout_s=GONE_WAIT_S)
            await js.publish("ab.a", b"after")
            (m,) = await sub.fetch(1, timeout=10)
            assert m.data == b"after" and m.metadata.num_delivered == 1
            await m.ack_sync()
            ci = await js.consumer_info("AB", "C")
            assert (ci.num_ack_pending, ci.num_redelivered, ci.num_pending) == (0, 0, 0)
        finally:
            await other.close()
            await js.close()

    run(body())


def test_durable_with_inactive_threshold_is_deleted(cluster3: LocalCluster) -> None:
    """A durable idle past its inactive_threshold is deleted by its stream leader through
    the meta group (JetStream 2.9+); a durable without one stays."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="DUR", subjects=("dur.>",), num_replicas=3))
            await js.add_consumer(
                "DUR", ConsumerConfig(durable_name="IDLE", inactive_threshold=10**9)
            )
            await js.add_consumer("DUR", ConsumerConfig(durable_name="KEEP"))

            async def gone() -> None:
                assert await js.consumer_names("DUR") == ["KEEP"]

            await retry_async(gone)
        finally:
            await js.close()

    run(body())


def test_num_pending_right_after_a_filter_edit(cluster3: LocalCluster) -> None:
    """Filter t.a (5 of 10 messages), edited to t.b, then to t.a and t.b: the consumer's
    info says 5, 5, 10 at once, with no publish after the edit (review t32)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="FE", subjects=("t.>",), num_replicas=3))
            for i in range(10):
                await js.publish("t.a" if i < 5 else "t.b", b"x")
            ci = await js.add_consumer("FE", ConsumerConfig(durable_name="C", filter_subject="t.a"))
            assert ci.num_pending == 5
            for cfg, want in (
                (replace(ci.config, filter_subject="t.b"), 5),
                (replace(ci.config, filter_subject=None, filter_subjects=("t.a", "t.b")), 10),
            ):
                edited = await js.update_consumer("FE", cfg)
                assert edited.num_pending == want
                assert (await js.consumer_info("FE", "C")).num_pending == want
        finally:
            await js.close()

    run(body())
