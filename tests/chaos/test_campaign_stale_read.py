"""Reads must be linearizable across a leader's pause (issue 8, the KV workload's
linearizability check; Raft §6.4: a leader must confirm it still leads before answering a
read-only query, or it may return stale data after being deposed).

Found by the chaos pause nemesis (seed 7): a stream leader stopped with SIGSTOP longer than
the election timeout is replaced; a new value is written through the new leader; when the
old leader resumes, it answers a ``get_last_msg`` queued on it with the OLD value. Here the
old leader is also cut from its peers (per-link proxies), so nothing tells it that it was
deposed before it reads.
"""

from __future__ import annotations

import asyncio

import pytest

import raftstream
from raftstream import errors
from raftstream.chaos.cluster import ChaosCluster
from tests.support.polling import wait_for

STREAM = "KV"
SUBJECT = "kv.k0"


def new_leader(cluster: ChaosCluster, old: str) -> str | None:
    for name in cluster.names:
        if name == old:
            continue
        info = cluster.cluster_info(name)
        for g in info.groups if info is not None else ():
            if g.stream == STREAM and g.group.leader and g.group.leader != old:
                return str(g.group.leader)
    return None


async def read_through_deposed_leader(cluster: ChaosCluster) -> bytes | None:
    """The value the old leader answers after resuming (None: it refused to answer)."""
    servers = [cluster.nodes[n].addr for n in cluster.names]
    async with await raftstream.connect(servers, timeout=10.0) as admin:
        await admin.add_stream(name=STREAM, subjects=["kv.>"], num_replicas=3)
        await admin.publish(SUBJECT, b"old", msg_id="old")
        old = wait_for("a KV leader", lambda: cluster.stream_leader(STREAM))
        async with await raftstream.connect([cluster.nodes[old].addr], timeout=5.0) as pinned:
            cluster.pause(old)
            cluster.cut([(old, n) for n in cluster.names if n != old])
            cluster.cut([(n, old) for n in cluster.names if n != old])
            leader = await asyncio.to_thread(
                wait_for, "a new KV leader", lambda: new_leader(cluster, old)
            )
            others = [cluster.nodes[leader].addr]
            async with await raftstream.connect(others, timeout=10.0) as fresh:
                await fresh.publish(SUBJECT, b"new", msg_id="new")
            read = asyncio.create_task(pinned.get_last_msg(STREAM, SUBJECT))
            await asyncio.sleep(0.2)  # the request is queued on the stopped process
            cluster.resume(old)
            try:
                return (await read).data
            except errors.RaftStreamError:
                return None


@pytest.mark.integration
def test_deposed_leader_does_not_serve_a_stale_read(cluster: ChaosCluster) -> None:
    value = asyncio.run(read_through_deposed_leader(cluster))
    assert value != b"old", "the deposed leader answered with the value it was deposed with"
