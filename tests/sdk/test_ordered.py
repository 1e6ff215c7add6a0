"""Ordered consumers across failures of a real 3-node cluster.

The issue's acceptance test: every message exactly once, in order, across a kill -9 of the
stream leader (the consumer resets from the last stream sequence it handed over). And the
heartbeat paths of ADR-15 on a real server: a frozen leader (SIGSTOP) sends nothing, so a
push subscription reports missed heartbeats and an ordered one resets to the new leader.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from raftstream import errors
from raftstream.client import Client
from raftstream.ordered import OrderedSubscription
from tests.support.cluster import LocalCluster
from tests.support.polling import until

from .live import connected, run, stream

pytestmark = pytest.mark.integration

TOTAL_MSGS = 600  # more than the server's flow-control window (512)
BEFORE_KILL_MSGS = 450


async def publish_range(rs: Client, start: int, stop: int) -> None:
    """Publish ``start..stop-1`` with msg ids: retried on ambiguous failures (failover) and
    deduplicated by the stream, so each is stored exactly once."""
    for i in range(start, stop):
        await rs.publish("ord.x", b"%d" % i, msg_id=f"m{i}")


async def publish_pipelined(rs: Client, start: int, stop: int) -> None:
    """As ``publish_range``, pipelined: only while no failover is under way (a failed
    message retried later would be stored out of order)."""
    futures = [
        await rs.publish_async("ord.x", b"%d" % i, msg_id=f"m{i}") for i in range(start, stop)
    ]
    await asyncio.gather(*futures)


async def leader_of(rs: Client, name: str) -> str:
    async def probe() -> str | None:
        info = (await rs.stream_info(name)).cluster
        return info.leader if info is not None and info.leader else None

    return await until(probe, what=f"a leader for {name}")


def test_ordered_consumer_every_message_once_in_order_across_a_leader_kill(
    own_cluster: LocalCluster,
) -> None:
    async def body() -> None:
        async with connected(own_cluster) as rs:
            await stream(rs, "ORD", "ord.>")
            await publish_pipelined(rs, 0, BEFORE_KILL_MSGS)
            sub = await rs.subscribe("ord.>", ordered_consumer=True, idle_heartbeat=0.5)
            assert isinstance(sub, OrderedSubscription)
            got: list[bytes] = []
            seqs: list[int] = []
            for _ in range(BEFORE_KILL_MSGS // 2):
                msg = await sub.next_msg(30)
                got.append(msg.data)
                seqs.append(msg.metadata.stream_seq)
            leader = await leader_of(rs, "ORD")
            own_cluster.kill(leader)  # kill -9, with deliveries in flight
            await publish_range(rs, BEFORE_KILL_MSGS, TOTAL_MSGS)
            while len(got) < TOTAL_MSGS:
                msg = await sub.next_msg(30)
                got.append(msg.data)
                seqs.append(msg.metadata.stream_seq)
            assert got == [b"%d" % i for i in range(TOTAL_MSGS)]  # each once, in order
            assert seqs == list(range(1, TOTAL_MSGS + 1))
            assert sub.resets >= 1  # the kill was seen and survived by a new consumer
            assert await leader_of(rs, "ORD") != leader
            old = sub.consumer
            await sub.unsubscribe()

            async def gone() -> bool | None:
                return True if old not in await rs.consumer_names("ORD") else None

            await until(gone, what="the ordered consumer deleted")

    run(body())


def test_a_stalled_leader_misses_heartbeats_and_the_ordered_consumer_resets(
    own_cluster: LocalCluster,
) -> None:
    """ADR-15 "Heartbeats": the stream leader stalls (SIGSTOP, as a long pause would) and
    sends nothing: the push subscription reports it after 3x the interval, the ordered one
    resets (a new consumer from the next stream sequence) and, once the node is back, every
    message still comes once and in order."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(own_cluster, errs) as rs:
            await stream(rs, "FRZ", "ord.>")
            await publish_range(rs, 0, 10)
            push = await rs.subscribe("ord.x", durable="P", idle_heartbeat=0.2)
            ordered = await rs.subscribe("ord.>", ordered_consumer=True, idle_heartbeat=0.2)
            assert isinstance(ordered, OrderedSubscription)
            got = [(await ordered.next_msg(30)).data for _ in range(10)]
            for _ in range(10):
                await (await push.next_msg(30)).ack_sync()
            proc = own_cluster.procs[await leader_of(rs, "FRZ")]
            proc.send_signal(signal.SIGSTOP)
            try:
                await until(
                    lambda: _ready(missed_by(errs) >= {"P", ordered.consumer}),
                    what="both subscriptions reported a missed heartbeat",
                )
            finally:
                proc.send_signal(signal.SIGCONT)
            await publish_range(rs, 10, 20)
            got += [(await ordered.next_msg(30)).data for _ in range(10)]
            assert got == [b"%d" % i for i in range(20)]
            assert ordered.resets >= 1
            await push.unsubscribe()
            await ordered.unsubscribe()

    run(body())


def missed_by(errs: list[errors.RaftStreamError]) -> set[str]:
    return {e.details["consumer"] for e in errs if isinstance(e, errors.MissedHeartbeatError)}


async def _ready(cond: bool) -> bool | None:
    await asyncio.sleep(0)
    return True if cond else None
