"""Integration: restarts rebuild a node from its own data (issue 5, "Tests and numbers").

- a follower killed while the stream moves on catches up when it comes back, by snapshot
  once the others compacted the entries it missed (``snapshot_entries`` is tiny here), and
  can then lead the stream with every message and the consumer's state;
- a whole cluster stopped gracefully (SIGTERM: exit code 0) and started again serves the
  same streams, messages and consumer positions (meta log -> assignments -> stream groups);
- a second process started on a running node's data directory is refused before it touches
  anything (the directory's lock).
"""

from __future__ import annotations

import subprocess

import pytest

import raftstream
from raftstream import ConsumerConfig, StreamConfig
from raftstream.tooling.localcluster import config_argv
from tests.support.cluster import LocalCluster, run
from tests.support.polling import retry_async, wait_for

pytestmark = pytest.mark.integration

SNAPSHOT_ENTRIES = 20


async def _setup(servers: list[str]) -> str:
    """An R3 stream with 10 messages and a consumer that acked the first 5; its leader."""
    js = await raftstream.connect(servers=servers, timeout=20)
    try:
        await js.add_stream(StreamConfig(name="R", subjects=("r.>",), num_replicas=3))
        await js.add_consumer("R", ConsumerConfig(durable_name="C"))
        for i in range(10):
            await js.publish("r.a", b"%d" % i)
        sub = await js.pull_subscribe("r.>", durable="C", stream="R")
        for m in await sub.fetch(5, timeout=5):
            await m.ack_sync()
        info = await js.stream_info("R")
        assert info.cluster is not None and info.cluster.leader
        return info.cluster.leader
    finally:
        await js.close()


def test_follower_catches_up_by_snapshot() -> None:
    c = LocalCluster(3, raft={"snapshot_entries": SNAPSHOT_ENTRIES})
    try:
        c.start_all()
        leader = run(_setup(c.servers))
        follower = next(n for n in c.names if n != leader)
        c.kill(follower)

        async def publish_more() -> None:
            js = await raftstream.connect(servers=c.servers, timeout=20)
            for i in range(10, 10 + 5 * SNAPSHOT_ENTRIES):  # one Raft entry each
                await retry_async(lambda i=i: js.publish("r.b", b"%d" % i, msg_id=f"b{i}"))
            await js.close()

        run(publish_more())
        # Restart the others too: the leader's transport would otherwise still hold the
        # appends it queued for the dead follower, and deliver the entries without a
        # snapshot. After a restart only the compacted logs remain.
        for name in c.names:
            if name != follower:
                assert c.stop(name) == 0
        for name in c.names:
            c.start(name)
        for name in c.names:
            c.wait_serving(name)

        async def lead_from_follower() -> None:
            js = await raftstream.connect(servers=c.servers, timeout=20)
            try:
                # Leadership moves only to a caught-up replica (Raft §3.10 transfer).
                async def move() -> None:
                    await js.stream_leader_stepdown("R", preferred=follower)

                async def moved() -> str:
                    info = await js.stream_info("R")
                    if info.cluster is None or info.cluster.leader != follower:
                        await move()
                        raise AssertionError("not moved yet")
                    return info.cluster.leader

                await retry_async(moved)
                info = await js.stream_info("R")
                assert info.state.messages == 10 + 5 * SNAPSHOT_ENTRIES
                ci = await js.consumer_info("R", "C")
                assert ci.ack_floor.stream_seq == 5 and ci.delivered.stream_seq == 5
            finally:
                await js.close()

        run(lead_from_follower())
        log = (c.root / f"{follower}.log").read_text()
        assert "restored a snapshot from the leader" in log  # caught up by snapshot
        # Of the store's records: every replica described that it reads them.
        assert "restored a snapshot from the leader (version 4)" in log
    except BaseException:
        print(c.tails())
        raise
    finally:
        c.close()


def test_whole_cluster_restart_rebuilds_from_own_data(cluster3: LocalCluster) -> None:
    run(_setup(cluster3.servers))
    for name in cluster3.names:
        assert cluster3.stop(name) == 0  # graceful stop on SIGTERM
    for name in cluster3.names:
        cluster3.start(name)
    for name in cluster3.names:
        cluster3.wait_serving(name)
    cluster3.wait_meta_leader()
    wait_for("the stream's leader", lambda: cluster3.stream_leader("R"))

    async def check() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            info = await retry_async(lambda: js.stream_info("R"))
            assert info.state.messages == 10 and info.state.last_seq == 10
            ci = await retry_async(lambda: js.consumer_info("R", "C"))
            assert ci.ack_floor.stream_seq == 5 and ci.num_ack_pending == 0
            sub = await js.pull_subscribe("r.>", durable="C", stream="R")
            msgs = await sub.fetch(5, timeout=5)
            assert [m.metadata.stream_seq for m in msgs] == [6, 7, 8, 9, 10]
        finally:
            await js.close()

    run(check())


def test_a_second_node_on_a_running_nodes_data_is_refused_and_touches_nothing() -> None:
    """The same config started twice: the second process must not scrub and rebuild the
    store of the one that runs (it used to, before it found the port taken), and it says
    who holds the directory."""
    c = LocalCluster(1)
    try:
        c.start_all()
        run(_publish_one(c.servers))
        store = c.root / "n1" / "store" / "data.mdb"
        inode = store.stat().st_ino
        second = subprocess.run(
            config_argv(c.config_path("n1")), capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1
        pid = c.procs["n1"].pid
        assert f"is in use by another raftstream node (pid {pid})" in second.stderr
        assert "Traceback" not in second.stderr
        assert store.stat().st_ino == inode  # the running node's store is untouched
        assert run(_count(c.servers)) == 1  # and it still serves it
    finally:
        c.close()


async def _publish_one(servers: list[str]) -> None:
    async with await raftstream.connect(servers=servers, timeout=20) as js:
        await js.add_stream(StreamConfig(name="L", subjects=("l.>",)))
        await js.publish("l.a", b"x")


async def _count(servers: list[str]) -> int:
    async with await raftstream.connect(servers=servers, timeout=20) as js:
        return (await js.stream_info("L")).state.messages
