"""Integration: mirrors and sources between real node processes (issue 7, "Tests").

- one cluster: an R3 origin, an R3 mirror and an R1 source of it, while a publisher runs,
  kill -9 the mirror's leader, then the origin's leader (each restarted after); afterwards
  the mirror equals the origin message for message and sequence for sequence (an origin
  gap made before copying stays a gap), and the source holds every origin message exactly
  once (the ``Nats-Stream-Source`` header names origin and sequence); removing the mirror
  setting promotes the mirror to a stream that takes publishes; and a mirror of an
  origin whose limits removed messages before the mirror existed reports them as skipped;
- two clusters: a source whose origin is a WORK QUEUE in a second cluster (``external``),
  while that cluster's only node is stopped and restarted mid-stream: every origin message
  exactly once, in order, and the origin empty at the end (the link acks only what it
  committed, and the work queue removes what is acked); the link reports its state.

Waits poll (``wait_for``/``retry_async``); nothing asserts on timing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import raftstream
from raftstream import errors
from raftstream.config import ExternalStream, StreamSource
from tests.support.cluster import LocalCluster, run, running
from tests.support.mirrors import (
    HDR,
    assert_exactly_once,
    messages,
    origin_of,
    publish,
    settled,
    wait_copied,
)
from tests.support.polling import retry_async, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOTAL_MSGS = 180


@pytest.fixture
def cluster1(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A second, one-node cluster (another cluster's origin)."""
    with running(LocalCluster(1), request=request) as c:
        yield c


def test_mirror_and_source_survive_kill9_of_both_leaders(cluster3: LocalCluster) -> None:
    c = cluster3

    async def body() -> None:
        js = await raftstream.connect(servers=c.servers, timeout=20)
        try:
            await js.add_stream(
                raftstream.StreamConfig(name="ORIG", subjects=("o.>",), num_replicas=3)
            )
            for i in range(10):
                await publish(js, "o", i)
            await js.delete_msg("ORIG", 3)  # an origin gap before any copy: stays a gap
            await js.add_stream(
                raftstream.StreamConfig(
                    name="MIR", mirror=StreamSource(name="ORIG"), num_replicas=3
                )
            )
            await js.add_stream(
                raftstream.StreamConfig(name="SRC", sources=(StreamSource(name="ORIG"),))
            )
            with pytest.raises(errors.RaftStreamError):
                await js.publish("MIR", b"x")  # a mirror captures nothing, takes no publish
            await js.add_stream(raftstream.StreamConfig(name="LIM", max_msgs=5))
            for i in range(20):
                await js.publish("LIM", b"%d" % i)  # limits remove 1..15 before any copy
            await js.add_stream(
                raftstream.StreamConfig(name="LIMM", mirror=StreamSource(name="LIM"))
            )

            for i in range(10, TOTAL_MSGS):
                await publish(js, "o", i)
                if i == TOTAL_MSGS // 3:
                    victim = wait_for("a mirror leader", lambda: c.stream_leader("MIR"))
                    c.kill(victim)
                    c.start(victim)
                if i == 2 * TOTAL_MSGS // 3:
                    victim = wait_for("an origin leader", lambda: c.stream_leader("ORIG"))
                    c.kill(victim)
                    c.start(victim)
            last = (await js.stream_info("ORIG")).state.last_seq
            await wait_copied(js, "MIR", last)
            await wait_copied(js, "SRC", last)

            origin = await messages(js, "ORIG")
            mirror = await messages(js, "MIR")
            assert sorted(mirror) == sorted(origin), "sequence for sequence"
            assert 3 not in mirror
            for seq, m in mirror.items():
                assert origin_of(m) == ("ORIG", seq)
                assert (m.subject, m.data) == (origin[seq].subject, origin[seq].data)
                assert m.ts_ns == origin[seq].ts_ns, "a mirror keeps the origin's times"
            assert_exactly_once(await messages(js, "SRC"), origin, "ORIG")
            info = await js.stream_info("MIR")
            assert info.mirror is not None and info.mirror.name == "ORIG"
            assert info.mirror.skipped_msgs == 0  # a deleted message is a gap, not skipped
            await wait_copied(js, "LIMM", 20)
            limm = await js.stream_info("LIMM")
            assert limm.mirror is not None
            assert (limm.mirror.skipped, limm.mirror.skipped_msgs) == (((1, 15),), 15)
            assert sorted(await messages(js, "LIMM")) == list(range(16, 21))

            # Removing the mirror setting promotes it: its copy stays, publishes are taken.
            promoted = await js.update_stream(raftstream.StreamConfig(name="MIR", num_replicas=3))
            assert promoted.config.mirror is None and promoted.config.subjects == ("MIR",)
            ack = await retry_async(lambda: js.publish("MIR", b"own"))
            assert ack.stream == "MIR" and ack.seq == last + 1
        finally:
            await js.close()

    run(body())


def test_source_from_a_work_queue_of_another_cluster_survives_its_node_restarting(
    cluster3: LocalCluster, cluster1: LocalCluster
) -> None:
    remote = cluster1

    async def body() -> None:
        there = await raftstream.connect(servers=remote.servers, timeout=20)
        here = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            await there.add_stream(
                raftstream.StreamConfig(name="FAR", subjects=("f.>",), retention="workqueue")
            )
            ext = ExternalStream(api=tuple(remote.servers))
            await here.add_stream(
                raftstream.StreamConfig(
                    name="NEAR",
                    subjects=("near.>",),
                    sources=(StreamSource(name="FAR", external=ext),),
                    num_replicas=3,
                )
            )
            for i in range(TOTAL_MSGS // 2):
                await publish(there, "f", i)
                await here.publish("near.own", b"own")  # the stream's own messages too
                if i == TOTAL_MSGS // 4:
                    node = remote.names[0]
                    assert remote.stop(node) == 0
                    remote.start(node)
                    remote.wait_serving(node)
            last = (await there.stream_info("FAR")).state.last_seq
            await wait_copied(here, "NEAR", last)
            near = await messages(here, "NEAR")
            copies = [m for m in near.values() if HDR in m.headers]
            assert len(near) - len(copies) == TOTAL_MSGS // 2
            assert [origin_of(m) for m in copies] == [
                ("FAR", i + 1) for i in range(TOTAL_MSGS // 2)
            ], "every origin message exactly once, in order"
            assert [m.data for m in copies] == [b"m%d" % i for i in range(TOTAL_MSGS // 2)]

            async def drained() -> bool:
                return (await there.stream_info("FAR")).state.messages == 0

            # The work queue keeps a message until the link acked it, after its commit.
            await settled(drained, "the work queue drained by the link's acks")
            info = await here.stream_info("NEAR")
            (link,) = info.sources
            assert link.external == tuple(remote.servers) and link.running
            assert link.last_origin_seq == last
        finally:
            await there.close()
            await here.close()

    run(body())
