"""Issue 9: an audit of a real local cluster's data after a workload is clean.

A 3-node cluster of real node processes on loopback (``tests.support.cluster``) takes an
R3 stream, publishes with msg ids (some twice: deduplicated), deletes one message and acks
part of the stream through a durable consumer; every acknowledged publish goes into a client
history. The nodes are then stopped gracefully (quiescent data) and the audit of their data
directories, history included, must report no failure (a replica behind is a warning Raft
allows).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from raftstream.audit.checks import run_checks
from raftstream.audit.layout import snapshot_root
from raftstream.audit.session import load_tables
from tests.support.cluster import LocalCluster, running

pytestmark = pytest.mark.integration

MSGS = 30


async def _workload(servers: list[str]) -> list[dict[str, object]]:
    import raftstream
    from raftstream import StreamConfig

    js = await raftstream.connect(servers=servers, timeout=15)
    history: list[dict[str, object]] = []
    try:
        await js.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",), num_replicas=3))
        for i in range(MSGS):
            ack = await js.publish(f"orders.{i % 3}", b"m%d" % i, msg_id=f"id-{i}")
            history.append(
                {
                    "op": "publish",
                    "stream": "ORDERS",
                    "seq": ack.seq,
                    "msg_id": f"id-{i}",
                    "outcome": "ok",
                }
            )
        again = await js.publish("orders.0", b"m0", msg_id="id-0")
        assert again.duplicate and again.seq == 1
        assert await js.delete_msg("ORDERS", 5)
        sub = await js.pull_subscribe("orders.>", durable="C1", stream="ORDERS")
        for m in await sub.fetch(10, timeout=5):
            await m.ack_sync()
    finally:
        await js.close()
    return history


@pytest.mark.timeout(420)
def test_audit_of_a_real_cluster_is_clean(spark: SparkSession, tmp_path: Path) -> None:
    with running(LocalCluster(3)) as cluster:
        history = asyncio.run(_workload(cluster.servers))
        for name in cluster.names:
            assert cluster.stop(name) == 0
        snap = snapshot_root(cluster.root, tmp_path / "copy")
    hist = tmp_path / "history.jsonl"
    hist.write_text("".join(json.dumps(e) + "\n" for e in history))
    tables = load_tables(spark, data=str(snap), history=str(hist))
    assert tables.messages.where("stream = 'ORDERS'").count() == 3 * (MSGS - 1)
    results = run_checks(tables)
    failing = {r.rule: r.findings for r in results if r.severity == "fail" and r.count}
    assert failing == {}
    linked = tables.messages.where("raft_index IS NOT NULL").count()
    assert linked == 3 * (MSGS - 1)  # every message traced back to its Raft entry
