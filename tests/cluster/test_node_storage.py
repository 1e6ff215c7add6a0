"""A node's storage running out, in process (docs/limits.md, "When storage runs out").

A node whose Raft log can no longer be written stops (fail-stop).

A user review filled a node's disk: its Raft host stopped (``DiskError: No space left on
device``) but the node kept running, health SERVING, ``Online`` in cluster info and still
leader in its metrics, while every write it took failed. Now the node sees the host's
failure, says what to do (CRITICAL), goes NOT_SERVING and sets ``failed``, which makes
``run_node`` stop it (``raftstream server`` then exits 1), as Kafka stops a broker whose
log directory failed. The write failure is injected where a full disk makes it: the Raft
storage's write.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import lmdb
import pytest
from grpc_health.v1 import health_pb2

import raftstream
from raftstream.cluster.common.metrics import GROUP_LABELS, group_labels
from raftstream.cluster.config import MIB, Address, Limits, NodeConfig
from raftstream.cluster.node.node import Node
from raftstream.tooling.localnet import free_port
from tests.support.polling import until

pytestmark = pytest.mark.integration

WAIT_S = 60.0  # a hang guard, not a timed assertion


def test_a_node_whose_raft_log_cannot_be_written_stops_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    addr = Address("127.0.0.1", free_port())
    node = Node(config=NodeConfig(name="n1", listen=addr, data=tmp_path, peers={"n1": addr}))

    async def body() -> None:
        await node.start()
        try:
            js = await raftstream.connect([str(addr)], timeout=10)
            try:
                await js.add_stream(name="FULL", subjects=["full.>"])
                await js.publish("full.x", b"stored")

                def full(writes: object) -> None:
                    raise lmdb.DiskError("mdb_txn_commit: No space left on device")

                node.storage.log.write_batch = full  # type: ignore[method-assign]
                with pytest.raises(raftstream.errors.RaftStreamError):
                    await js.publish("full.x", b"refused", timeout=5)
            finally:
                await js.close()
            await asyncio.wait_for(node.failed.wait(), WAIT_S)
            health = node.server.health
            assert health is not None
            resp = await health.Check(health_pb2.HealthCheckRequest(service=""), None)
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await node.stop()

    with caplog.at_level(logging.CRITICAL, logger="raftstream.cluster.node.monitor"):
        asyncio.run(body())
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.CRITICAL]
    assert any("this node stops: its Raft log can no longer be written" in m for m in said), said


def test_a_halted_group_shows_in_the_metrics_and_no_longer_as_leader(tmp_path: Path) -> None:
    """A group whose apply failed (a full store, in a user review) halts on its node; its
    metrics kept is_leader 1, so two nodes claimed the group. Now is_leader is 0 and
    raftstream_raft_group_halted 1."""
    addr = Address("127.0.0.1", free_port())
    node = Node(config=NodeConfig(name="n1", listen=addr, data=tmp_path, peers={"n1": addr}))

    def sample(name: str, group: str) -> float | None:
        return node.metrics.registry.get_sample_value(
            name, dict(zip(GROUP_LABELS, group_labels(group), strict=True))
        )

    async def until_sample(name: str, group: str, value: float) -> None:
        """Wait (WAIT_S at most) for the gauge: they are refreshed once a second."""
        await until(
            lambda: sample(name, group) == value,
            what=f"{name}{{group={group}}} == {value}",
            timeout_s=WAIT_S,
            interval_s=0.05,
        )

    async def body() -> None:
        await node.start()
        try:
            js = await raftstream.connect([str(addr)], timeout=10)
            try:
                await js.add_stream(name="HALT", subjects=["halt.>"])
                await js.publish("halt.x", b"stored")
                (group,) = [g for g in node.groups if g.endswith(":HALT")]
                await until_sample("raftstream_raft_is_leader", group, 1.0)

                def full(*args: object) -> object:
                    raise lmdb.MapFullError("mdb_put: MDB_MAP_FULL")

                node.groups[group].replica.apply = full  # type: ignore[method-assign]
                with pytest.raises(raftstream.errors.RaftStreamError):
                    await js.publish("halt.x", b"refused", timeout=5)
            finally:
                await js.close()

            await until_sample("raftstream_raft_group_halted", group, 1.0)
            assert sample("raftstream_raft_is_leader", group) == 0.0
            # What a client is told now: the group is halted here, and why (it was NOT_FOUND,
            # "raft group ... is not running", in a bad-input review).
            js = await raftstream.connect([str(addr)], timeout=10)
            try:
                with pytest.raises(raftstream.errors.UnavailableError) as refused:
                    await js.stream_info("HALT", timeout=3)
                assert "halted on n1: MapFullError" in str(refused.value)
            finally:
                await js.close()
        finally:
            await node.stop()

    asyncio.run(body())


def test_publishes_are_refused_before_the_store_fills_and_resume_after_a_purge(
    tmp_path: Path,
) -> None:
    """A store that filled halted its stream's group (a user review: the stream stayed dead
    until every node restarted, and purge could not help). Now the leader refuses a publish
    that would leave less than the reserve (LimitError naming storage_bytes_max and the
    node), nothing halts, and after a purge (which also compacts the Raft log) publishes go
    through again."""
    addr = Address("127.0.0.1", free_port())
    cfg = NodeConfig(
        name="n1",
        listen=addr,
        data=tmp_path,
        peers={"n1": addr},
        limits=Limits(storage_bytes_max=4 * MIB),
    )
    node = Node(config=cfg)

    async def body() -> None:
        await node.start()
        try:
            async with await raftstream.connect([str(addr)], timeout=10) as js:
                await js.add_stream(name="ROOM", subjects=["room.>"])
                acked = 0
                with pytest.raises(raftstream.errors.LimitError) as info:
                    for _ in range(1000):  # 20 MB: far past the 4 MiB store
                        await js.publish("room.x", b"x" * 20_000)
                        acked += 1
                assert info.value.details["limit"] == "storage_bytes_max", info.value
                assert "insufficient storage: node n1" in str(info.value)
                assert acked > 0 and (await js.stream_info("ROOM")).state.messages == acked
                (group,) = [g for g in node.groups if g.endswith(":ROOM")]
                halted = node.metrics.registry.get_sample_value(
                    "raftstream_raft_group_halted",
                    dict(zip(GROUP_LABELS, group_labels(group), strict=True)),
                )
                assert not halted
                assert await js.purge_stream("ROOM") == acked

                async def accepted() -> None:  # once the compaction after the purge landed
                    while True:
                        try:
                            await js.publish("room.x", b"y" * 20_000)
                            return
                        except raftstream.errors.LimitError:
                            await asyncio.sleep(0.1)

                await asyncio.wait_for(accepted(), WAIT_S)
                assert (await js.stream_info("ROOM")).state.messages == 1
        finally:
            await node.stop()

    asyncio.run(body())
