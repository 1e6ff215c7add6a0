"""Integration: a mirror and a source of an INTEREST origin lose nothing across link
restarts (docs/mirrors.md, "Exactly once, in order" and "Acks after commit": "a work-queue
or interest origin removes a message only after it is safely copied"; "Skipped messages":
only what the origin removed before it could be copied).

An interest origin keeps a message only while some consumer holds it, so the link's
consumer must hold its messages without a break: a session that deleted it and made it
again released everything unacked and everything published until the new one existed
(and booked that as "skipped"). Here an R3 interest origin with an R3 mirror and an R3
source takes 800 publishes at a modest rate while every link session is forced
to restart (a leader step-down of the mirror, of the source, then of the origin, whose
consumers move with it; deliveries lost in flight restart sessions too). Afterwards the
mirror holds every origin sequence and the source every origin message, exactly once and
in order, nothing is skipped, and the origin drained (each message acked by both links
once copied). Waits poll; nothing asserts on timing.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import raftstream
from raftstream.config import StreamSource
from tests.support.cluster import LocalCluster, run
from tests.support.mirrors import (
    HDR,
    assert_exactly_once,
    messages,
    origin_of,
    publish,
    settled,
    wait_copied,
)
from tests.support.polling import retry_async

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOTAL_MSGS = 800
PUBLISH_RATE_MSGS_PER_S = 150.0  # modest: the links keep up, their sessions restart anyway
LINKS = ("INTM", "INTS")


async def _step_down(js: raftstream.Client, stream: str) -> None:
    """Move ``stream``'s leadership (a new leader's link starts a new session)."""
    await retry_async(lambda: js.stream_leader_stepdown(stream, timeout=10))


def test_interest_origin_mirror_and_source_lose_nothing_across_restarts(
    cluster3: LocalCluster,
) -> None:
    c = cluster3

    async def body() -> None:
        js = await raftstream.connect(servers=c.servers, timeout=20)
        try:
            await js.add_stream(
                raftstream.StreamConfig(
                    name="INT", subjects=("i.>",), retention="interest", num_replicas=3
                )
            )
            await js.add_stream(
                raftstream.StreamConfig(
                    name="INTM", mirror=StreamSource(name="INT"), num_replicas=3
                )
            )
            await js.add_stream(
                raftstream.StreamConfig(
                    name="INTS", sources=(StreamSource(name="INT"),), num_replicas=3
                )
            )

            async def both_links_hold_interest() -> bool:
                # An interest origin keeps nothing no consumer holds: publish once both
                # links' consumers exist, so everything published is theirs to copy.
                return len(await js.consumer_names("INT")) == len(LINKS)

            await settled(both_links_hold_interest, "both links' consumers on the origin")

            start = time.monotonic()
            for i in range(TOTAL_MSGS):
                await publish(js, "i", i)
                if i == TOTAL_MSGS // 4:
                    await _step_down(js, "INTM")
                if i == TOTAL_MSGS // 2:
                    await _step_down(js, "INTS")
                if i == 3 * TOTAL_MSGS // 4:
                    await _step_down(js, "INT")  # its consumers' leadership moves with it
                pace_s = start + (i + 1) / PUBLISH_RATE_MSGS_PER_S - time.monotonic()
                await asyncio.sleep(max(0.0, pace_s))
            last = (await js.stream_info("INT")).state.last_seq
            assert last == TOTAL_MSGS
            for link in LINKS:
                await wait_copied(js, link, last)

            mirror = await messages(js, "INTM")
            assert sorted(mirror) == list(range(1, TOTAL_MSGS + 1)), "every origin sequence"
            for seq, m in mirror.items():
                assert origin_of(m) == ("INT", seq)
                assert m.data == b"m%d" % (seq - 1)
            source = await messages(js, "INTS")
            assert all(HDR in m.headers for m in source.values())
            assert [origin_of(m) for m in source.values()] == [
                ("INT", s) for s in range(1, TOTAL_MSGS + 1)
            ], "every origin message exactly once, in order"
            assert [m.data for m in source.values()] == [b"m%d" % i for i in range(TOTAL_MSGS)]
            assert_exactly_once(source, mirror, "INT")  # the mirror is the origin's copy
            for link in LINKS:
                info = await js.stream_info(link)
                state = info.mirror if info.mirror is not None else info.sources[0]
                assert state is not None
                assert (state.skipped, state.skipped_msgs) == ((), 0), f"{link}: {state}"

            async def drained() -> bool:
                return (await js.stream_info("INT")).state.messages == 0

            # Both links acked every message once it was copied: the origin let it go.
            await settled(drained, "the interest origin drained by both links' acks")
        finally:
            await js.close()

    run(body())
