"""Integration: a push subscription keeps delivering across leader changes (real R3 cluster).

- Flow control across a leader change (step-down, kill -9): the new leader's push plan
  starts afresh and asks for flow control again once a window (``FLOW_WINDOW_MSGS``) is out.
  JetStream's flow-control reply subjects are unique and delivery carries on; here the new
  leader asked with the token the old one had used (``$JS.FC.P.D.1``), the SDK had answered
  that token already and ignored it, and delivery stopped for good.
- A hung leader (SIGSTOP: its connections stay open, it answers nothing): the subscription
  reports ``MissedHeartbeatError`` after 3 intervals and attaches to the node that leads
  now, as a JetStream consumer's new leader pushes to the deliver subject; it waited on the
  hung node's call for good.

Every wait is bounded generously (a hang guard on a shared machine), never timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

import raftstream
from raftstream import StreamConfig, errors
from raftstream._push import PushSubscription
from raftstream.engine.consumer_push import FLOW_WINDOW_MSGS
from tests.support.cluster import LocalCluster, run
from tests.support.polling import until

pytestmark = pytest.mark.integration


BODY_LIMIT_S = 180.0
WAIT_S = 60.0  # a hang guard for one message or one condition
# More than a window on each side of the leader change: the old leader asks (and is
# answered) once, the new one must ask and be answered too.
BEFORE_MSGS = FLOW_WINDOW_MSGS + 100
TOTAL_MSGS = 2 * BEFORE_MSGS
HEARTBEAT_S = 0.3


def limited(body: Awaitable[Any]) -> Any:
    return run(asyncio.wait_for(body, BODY_LIMIT_S))


async def publish(js: raftstream.Client, subject: str, start: int, stop: int) -> None:
    """Messages ``start..stop-1``, pipelined, each with a msg_id (a retry is deduplicated)."""
    for i in range(start, stop):
        await js.publish_async(subject, b"%d" % i, msg_id=f"m{i}")
    await js.publish_async_completed(timeout=WAIT_S)


async def take(sub: PushSubscription, seen: set[int], until: int, *, ack: bool) -> None:
    """Receive until stream sequences 1..``until`` were all seen (redeliveries allowed)."""
    while len(seen) < until:
        msg = await sub.next_msg(WAIT_S)
        seen.add(msg.metadata.stream_seq)
        if ack:
            await msg.ack()


async def stream_leader(js: raftstream.Client, stream: str, *, not_: str | None) -> str:
    async def probe() -> str | None:
        try:
            info = (await js.stream_info(stream, timeout=5)).cluster
        except errors.RaftStreamError:
            return None
        leader = info.leader if info is not None else None
        return leader if leader and leader != not_ else None

    return await until(probe, what=f"a leader of {stream} other than {not_}")


@pytest.mark.parametrize("change", ["step-down", "kill"])
def test_flow_control_goes_on_after_a_leader_change(cluster3: LocalCluster, change: str) -> None:
    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        js = await raftstream.connect(cluster3.servers, timeout=20, error_cb=errs.append)
        try:
            await js.add_stream(StreamConfig(name="P", subjects=("p.>",), num_replicas=3))
            sub = await js.subscribe(
                "p.>", durable="D", idle_heartbeat=HEARTBEAT_S, flow_control=True
            )
            await publish(js, "p.x", 0, BEFORE_MSGS)
            seen: set[int] = set()
            await take(sub, seen, BEFORE_MSGS, ack=True)  # answers the old leader's request

            async def all_acked() -> bool | None:
                info = await js.consumer_info("P", "D")
                return True if info.ack_floor.stream_seq == BEFORE_MSGS else None

            await until(all_acked, what="every message before the change acked")
            old = await stream_leader(js, "P", not_=None)
            if change == "kill":
                cluster3.kill(old)
            else:
                await js.stream_leader_stepdown("P", timeout=20)
            await stream_leader(js, "P", not_=old)
            await publish(js, "p.x", BEFORE_MSGS, TOTAL_MSGS)
            # The new leader stalls after a window until its request is answered.
            await take(sub, seen, TOTAL_MSGS, ack=True)
            assert seen == set(range(1, TOTAL_MSGS + 1))
            assert not [e for e in errs if isinstance(e, errors.ConflictError)]
            await sub.unsubscribe()
        finally:
            await js.close()

    limited(body())


def test_a_push_subscription_moves_off_a_hung_leader(cluster3: LocalCluster) -> None:
    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        js = await raftstream.connect(cluster3.servers, timeout=20, error_cb=errs.append)
        try:
            await js.add_stream(StreamConfig(name="H", subjects=("h.>",), num_replicas=3))
            sub = await js.subscribe("h.>", durable="D", idle_heartbeat=HEARTBEAT_S)
            await publish(js, "h.x", 0, 10)
            seen: set[int] = set()
            while len(seen) < 10:
                msg = await sub.next_msg(WAIT_S)
                await msg.ack_sync()  # replicated: the next leader delivers after them
                seen.add(msg.metadata.stream_seq)
            hung = await stream_leader(js, "H", not_=None)
            cluster3.nodes.pause(hung)
            try:
                await _publish_elsewhere(cluster3, hung, 10, 20)
                # No acks here: the client's acks may still be routed to the hung node.
                await take(sub, seen, 20, ack=False)
                assert seen == set(range(1, 21))
                assert any(isinstance(e, errors.MissedHeartbeatError) for e in errs)
            finally:
                cluster3.nodes.resume(hung)
            await sub.unsubscribe()
        finally:
            await js.close()

    limited(body())


async def _publish_elsewhere(cluster: LocalCluster, hung: str, start: int, stop: int) -> None:
    """Publish from a client of the other nodes, once one of them leads the stream (a call
    to the hung node would wait out its whole deadline)."""
    others = [cluster.addr(n) for n in cluster.names if n != hung]
    pub = await raftstream.connect(others, timeout=20)
    try:
        await stream_leader(pub, "H", not_=hung)
        await publish(pub, "h.x", start, stop)
    finally:
        await pub.close()
