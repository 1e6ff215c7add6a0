"""Corruption of a node's Raft log while it is down (issue 8: "corruption detected on the
damaged node, which never serves or spreads bad data").

A one-node cluster (through the chaos harness) takes some messages, is killed, has its
Raft LMDB file damaged, and is started again: with no peer to be repaired from, it must
refuse to serve, saying why (``DataLossError``), rather than serve what is left or die of a
signal, and leave its data where it is. (A node with peers is repaired from them:
``test_repair.py``.)
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import raftstream
from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.nemesis import corrupt_file
from tests.support.chaos import started_cluster
from tests.support.polling import wait_for

MESSAGES = 300
EXIT_WAIT_S = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    """One node (this module's tests damage its only copy), started as conftest's are."""
    with started_cluster(tmp_path, 1) as c:
        yield c


async def fill(addr: str) -> None:
    async with await raftstream.connect([addr], timeout=10.0) as client:
        await client.add_stream(name="Q", subjects=["q.>"], num_replicas=1)
        for i in range(MESSAGES):
            await client.publish("q.v", str(i).encode() * 20, msg_id=f"m{i}")


def restart_damaged(cluster: ChaosCluster, mode: str) -> tuple[int | None, str]:
    asyncio.run(fill(cluster.nodes["n1"].addr))
    cluster.kill("n1")
    corrupt_file(cluster.nodes["n1"].data / "raft" / "data.mdb", random.Random(1), mode=mode)
    cluster.start_node("n1", wait=False)
    code = wait_for("n1 to exit", lambda: cluster.exited("n1"), EXIT_WAIT_S)
    return code, cluster.log_tail("n1", 80)


@pytest.mark.integration
def test_truncated_raft_log_is_refused_not_a_crash(cluster: ChaosCluster) -> None:
    code, log = restart_damaged(cluster, "truncate")
    assert code is not None and code > 0, f"exit {code}\n{log}"
    assert "DataLossError" in log, log
    assert not (cluster.nodes["n1"].data / "quarantine").exists()
