"""Integration: kill -9 the stream leader, the client's first server, under publish_async.

raftstream/publisher.py: "a leader failover under ``publish_async`` costs time, not errors,
for messages with a ``msg_id``". The client publishes to the leader's node directly (first
in its list); the kill breaks its ``PublishStream`` mid-write, which grpc.aio reports as
INTERNAL "Internal error from Core". That was not taken for a broken connection, and a
batch or more of messages failed (1024 of them stored). Now every future resolves to a
PubAck and the stream holds each msg_id exactly once, at the sequence its ack names.

The payload is padded so that the kill lands while a write is in progress (the failure
above) rather than between writes (UNAVAILABLE "Socket closed", handled before). Every
wait is a hang guard, never a timed assertion.
"""

from __future__ import annotations

import asyncio

import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig
from tests.support.cluster import LocalCluster, run
from tests.support.polling import retry_async

pytestmark = pytest.mark.integration

BODY_LIMIT_S = 240.0
TOTAL_MSGS = 20_000
KILL_AT_MSG = TOTAL_MSGS // 4  # queued by then, and the first batch acked
PAD = b"x" * 4000
FETCH_MSGS = 1000
FETCH_WAIT_S = 5.0
ACK_WAIT_NS = 600 * 10**9  # nothing is redelivered while the test reads


def _payload(i: int) -> bytes:
    return b"%d:" % i + PAD


async def _leader(js: raftstream.Client, stream: str) -> str:
    async def ask() -> str:
        info = await js.stream_info(stream)
        if info.cluster is None or not info.cluster.leader:
            raise LookupError("no leader yet")
        return info.cluster.leader

    return str(await retry_async(ask))


async def _publish_and_kill(
    js: raftstream.Client, cluster: LocalCluster, leader: str
) -> list[asyncio.Future[raftstream.PubAck]]:
    futures: list[asyncio.Future[raftstream.PubAck]] = []
    killed = False
    for i in range(TOTAL_MSGS):
        futures.append(await js.publish_async("kl.x", _payload(i), msg_id=f"m{i}"))
        if not killed and i >= KILL_AT_MSG and futures[0].done():
            cluster.kill(leader)  # kill -9 while batches are being written to it
            killed = True
    assert killed, "the leader was never killed: no ack came before the last publish"
    return futures


async def _stored(js: raftstream.Client, count: int) -> dict[int, bytes]:
    """Every message of KL, read once through a pull consumer (nothing acked): stream
    sequence -> ``msg_id|payload``."""
    config = ConsumerConfig(durable_name="READ", max_ack_pending=-1, ack_wait=ACK_WAIT_NS)
    sub = await js.pull_subscribe("kl.>", stream="KL", config=config)
    stored: dict[int, bytes] = {}
    while len(stored) < count:
        for m in await retry_async(lambda: sub.fetch(FETCH_MSGS, timeout=FETCH_WAIT_S)):
            entry = m.headers["Nats-Msg-Id"].encode() + b"|" + m.data
            if stored.setdefault(m.metadata.stream_seq, entry) != entry:
                raise AssertionError(f"seq {m.metadata.stream_seq} changed")
    return stored


def test_publish_async_with_msg_ids_survives_killing_the_clients_leader(
    cluster3: LocalCluster,
) -> None:
    async def body() -> None:
        async with await raftstream.connect(cluster3.servers, timeout=20) as js:
            await js.add_stream(StreamConfig(name="KL", subjects=("kl.>",), num_replicas=3))
            leader = await _leader(js, "KL")
        first = [cluster3.addr(leader)] + [cluster3.addr(n) for n in cluster3.names if n != leader]
        async with await raftstream.connect(first, timeout=20) as js:
            futures = await _publish_and_kill(js, cluster3, leader)
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            failed = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
            assert not failed, f"{len(failed)} publishes failed, first: {failed[:3]}"
            seqs = [o.seq for o in outcomes if isinstance(o, raftstream.PubAck)]
            assert len(set(seqs)) == TOTAL_MSGS  # one sequence per msg_id

            info = await retry_async(lambda: js.stream_info("KL"))
            assert info.state.messages == TOTAL_MSGS  # no copy stored twice
            assert (info.state.first_seq, info.state.last_seq) == (1, TOTAL_MSGS)
            stored = await _stored(js, TOTAL_MSGS)
            for i, seq in enumerate(seqs):
                assert stored[seq] == f"m{i}|".encode() + _payload(i), (i, seq)

    run(asyncio.wait_for(body(), BODY_LIMIT_S))
