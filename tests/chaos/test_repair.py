"""Repair after data loss (issue 8: "corruption detected on the damaged node, which never
serves or spreads bad data and is repaired from its peers"; docs/cluster-design.md, "Repair
after data loss").

Three real nodes behind the chaos harness's proxies take acknowledged messages on an R3
stream; a follower is killed, its Raft LMDB file damaged (bit flips, then truncation), and
it is started again. It must detect the damage (quarantine the environment, not serve while
it is repaired), come back as a member of the meta group and of the stream's group, and
hold every acknowledged message at its acknowledged sequence in its own store, as its peers
do.
"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

import raftstream
from raftstream.chaos.campaign import read_node_contents
from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.nemesis import corrupt_file
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from tests.support.polling import wait_for

STREAM = "Q"
BEFORE = 300  # acknowledged before the damage
AFTER = 50  # acknowledged while the damaged node is down or being repaired
REPAIR_WAIT_S = 90.0
CATCH_UP_WAIT_S = 60.0


async def publish(servers: list[str], lo: int, hi: int, acked: dict[int, int]) -> None:
    """Publish values lo..hi-1 (msg ids, so retries are deduplicated); record seq -> value."""
    async with await raftstream.connect(servers, timeout=15.0) as client:
        if lo == 0:
            await client.add_stream(name=STREAM, subjects=["q.>"], num_replicas=3)
        for i in range(lo, hi):
            ack = await client.publish("q.v", str(i).encode(), msg_id=f"m{i}")
            acked[ack.seq] = i


def answer_while_repaired(cluster: ChaosCluster, name: str) -> None:
    """A client call to a node under repair is refused UNAVAILABLE (it answers nothing from
    its empty state); if it answers, the repair must be over."""
    with grpc.insecure_channel(cluster.nodes[name].addr) as ch:
        try:
            pbg.ClusterServiceStub(ch).GetClusterInfo(pb.ClusterInfoRequest(), timeout=5.0)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return
    wait_for(
        f"{name} to say it is repaired",
        lambda: "repaired: serving again" in cluster.log_tail(name, 400) or None,
        10.0,
    )


def members(cluster: ChaosCluster, via: str, stream: str | None) -> set[str]:
    """Voters of the stream's group (or of the meta group) as its leader reports them."""
    info = cluster.cluster_info(via)
    out: set[str] = set()
    for g in info.groups if info is not None else ():
        if (stream is None and not g.stream) or (stream is not None and g.stream == stream):
            out |= {r.name for r in g.group.replicas if r.current}
            if g.group.leader:
                out.add(str(g.group.leader))
    return out


@pytest.mark.integration
def test_damaged_follower_is_repaired_from_its_peers(cluster: ChaosCluster) -> None:
    servers = [cluster.nodes[n].addr for n in cluster.names]
    acked: dict[int, int] = {}
    asyncio.run(publish(servers, 0, BEFORE, acked))
    leader = wait_for("a stream leader", lambda: cluster.stream_leader(STREAM))
    victim = next(n for n in cluster.names if n != leader)
    cluster.kill(victim)
    data_file = cluster.nodes[victim].data / "raft" / "data.mdb"
    rng = random.Random(8)
    corrupt_file(data_file, rng, mode="flip")
    corrupt_file(data_file, rng, mode="truncate")
    others = [cluster.nodes[n].addr for n in cluster.names if n != victim]
    asyncio.run(publish(others, BEFORE, BEFORE + AFTER // 2, acked))

    cluster.start_node(victim, wait=False)
    wait_for(
        f"{victim} to quarantine its data",
        lambda: "quarantined" in cluster.log_tail(victim, 200) or None,
        REPAIR_WAIT_S,
    )
    answer_while_repaired(cluster, victim)
    # Writes go on while it is repaired; it must not serve until it is.
    asyncio.run(publish(others, BEFORE + AFTER // 2, BEFORE + AFTER, acked))
    cluster.wait_serving(victim, timeout_s=REPAIR_WAIT_S)
    log = cluster.log_tail(victim, 400)
    assert "DataLossError" in log, log
    assert "repaired: serving again" in log, log
    quarantine = cluster.nodes[victim].data / "quarantine"
    assert any(quarantine.iterdir()), "the damaged environment is kept for inspection"
    assert not (cluster.nodes[victim].data / "REPAIR").exists()

    def back_everywhere() -> bool | None:
        lead = cluster.stream_leader(STREAM)
        meta = cluster.meta_leader()
        if lead is None or meta is None:
            return None
        ok = victim in members(cluster, lead, STREAM) and victim in members(cluster, meta, None)
        return (ok and cluster.replicas_current(STREAM)) or None

    wait_for(f"{victim} back in the meta and stream groups", back_everywhere, CATCH_UP_WAIT_S)
    for name in cluster.names:
        cluster.stop(name)
    contents = read_node_contents(cluster)
    assert set(contents) == set(cluster.names)
    for name, streams in contents.items():
        stored = {seq: value for seq, (_, value) in streams[STREAM].items()}
        missing = {s: v for s, v in acked.items() if stored.get(s) != v}
        assert not missing, f"{name} lacks acknowledged messages {sorted(missing)[:10]}"
