"""Integration: what an operator's stop and probes see (a day-2 operations review).

- a node stopped with SIGTERM first hands the leaderships it holds to its peers (lame duck,
  as NATS and etcd do), so a rolling restart costs clients a redirect, not an election;
- the health service ``raftstream.ready`` is SERVING only while the node knows a meta
  leader (readiness), while ``""`` stays the process's liveness; a peer that stops answering
  is logged as unreachable and shows in ``raftstream_peer_up``.
"""

from __future__ import annotations

import re
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import raftstream
from raftstream import StreamConfig, errors
from raftstream.config import StreamSource
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_rpc_error
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import until, wait_for

pytestmark = pytest.mark.integration

READY = "raftstream.ready"


def _health(c: LocalCluster, name: str, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(c.channel(name))
    return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


def _log(c: LocalCluster, name: str) -> str:
    return (c.root / f"{name}.log").read_text(errors="replace")


async def _stream(servers: list[str], name: str) -> None:
    js = await raftstream.connect(servers=servers, timeout=20)
    try:
        await js.add_stream(
            StreamConfig(name=name, subjects=(f"{name.lower()}.>",), num_replicas=3)
        )
        await js.publish(f"{name.lower()}.x", b"1")
    finally:
        await js.close()


def test_a_stopped_leader_hands_its_leaderships_over_first(cluster3: LocalCluster) -> None:
    run(_stream(cluster3.servers, "HAND"))
    leader = wait_for("a stream leader", lambda: cluster3.stream_leader("HAND"))
    assert cluster3.stop(leader) == 0
    text = _log(cluster3, leader)
    assert "SIGTERM received: stopping" in text
    handed = re.search(r"handed (\d+) of (\d+) leaderships over", text)
    assert handed is not None, text[-2000:]
    assert int(handed.group(2)) >= 1 and handed.group(1) == handed.group(2)
    assert "left to an election" not in text
    others = [n for n in cluster3.names if n != leader]
    assert wait_for("a new leader", lambda: cluster3.stream_leader("HAND")) in others
    # Back, it sees no leader change (it starts at the current term), and still shows the
    # counter, at 0: it was missing until a first change (a rate needs the series).
    cluster3.start(leader)
    cluster3.wait_serving(leader)
    series = (
        'raftstream_raft_leader_changes_total{account="$G",group="S:$G:HAND",stream="HAND"} 0.0'
    )
    wait_for("the leader-change counter", lambda: series in cluster3.metrics(leader) or None)


async def _mirrors(servers: list[str]) -> None:
    js = await raftstream.connect(servers=servers, timeout=20)
    try:
        for i in range(3):
            await js.add_stream(StreamConfig(name=f"O{i}", subjects=(f"o{i}.>",), num_replicas=3))
            await js.publish(f"o{i}.x", b"1")
            await js.add_stream(
                StreamConfig(name=f"M{i}", mirror=StreamSource(name=f"O{i}"), num_replicas=3)
            )
        for i in range(3):
            await js.publish(f"o{i}.x", b"2")
        for i in range(3):
            await until(
                lambda i=i: js.stream_info(f"M{i}"),
                what=f"M{i} to copy its second message",
                accept=lambda info: info.state.last_seq >= 2,
                interval_s=0.05,
            )
    finally:
        await js.close()


def test_a_whole_cluster_with_mirrors_stopped_at_once_stops_cleanly() -> None:
    """A user review: SIGTERM to all three nodes together took 6-6.6 s per node, a mirror
    link waiting about 4 s for its origin, stopping too, to delete the consumer it made
    there. The streams now close together and each link's cleanup is cut off after
    ``LINK_CLOSE_WAIT_S`` (its bound is tested in test_mirror_link_close.py; how long a stop
    takes is not asserted here, on a shared machine): every node still stops cleanly."""
    with running(LocalCluster(3)) as c:
        run(_mirrors(c.servers))
        procs = dict(c.procs)
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(timeout=60)
        assert {n: p.returncode for n, p in procs.items()} == dict.fromkeys(procs, 0)
        for name in procs:
            assert "node stopped" in _log(c, name)


def test_readiness_follows_the_meta_leader_and_lost_peers_are_reported(
    cluster3: LocalCluster,
) -> None:
    """Also: a stream whose majority is down says so, rather than "no leader yet"."""
    run(_stream(cluster3.servers, "QUORUM"))
    wait_for(
        "every node ready",
        lambda: (
            all(
                _health(cluster3, n, READY) == health_pb2.HealthCheckResponse.SERVING
                for n in cluster3.names
            )
            or None
        ),
    )
    survivor, *gone = cluster3.names
    for name in gone:
        cluster3.kill(name)
    wait_for(
        "the survivor not ready",
        lambda: (
            _health(cluster3, survivor, READY) == health_pb2.HealthCheckResponse.NOT_SERVING or None
        ),
    )
    # Alive all the same: a load balancer's liveness check must not restart it.
    assert _health(cluster3, survivor, "") == health_pb2.HealthCheckResponse.SERVING
    for name in gone:
        wait_for(
            f"{name} reported unreachable",
            lambda n=name: (
                (
                    f"peer {n} " in _log(cluster3, survivor)
                    and "is unreachable" in _log(cluster3, survivor)
                )
                or None
            ),
        )
        assert f'raftstream_peer_up{{peer="{name}"}} 0.0' in cluster3.metrics(survivor)
    wait_for(
        "the no-meta-leader warning",
        lambda: "no meta leader for" in _log(cluster3, survivor) or None,
    )
    with pytest.raises(grpc.RpcError) as err:
        _health(cluster3, survivor, "no.such.service")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as err:
        pbg.StreamServiceStub(cluster3.channel(survivor)).GetStreamInfo(
            pb.StreamInfoRequest(name="QUORUM"), timeout=5
        )
    refusal = from_rpc_error(err.value)
    assert isinstance(refusal, errors.NoLeaderError), refusal
    down = ", ".join(gone)
    assert f"2 of its 3 replicas ({down}) are offline, and electing one needs 2" in str(refusal)
