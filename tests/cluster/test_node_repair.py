"""Integration: replica changes of stream groups on real node processes (issue 5: "Stepdown
of the meta, a stream or a consumer leader; removing a dead peer makes the meta leader
re-place its replicas so the replica count is restored").

- kill -9 a replica (a follower, or the stream's leader) of an R3 stream on a 4-node cluster
  and remove it (``remove_peer``): the meta leader re-places the replica on the 4th node,
  which the stream leader adds as a learner, catches up, promotes and then drops the dead
  peer; the new replica holds every message (shown by making it the leader and reading
  every message from it);
- ``update_stream`` grows R1 to R3 and shrinks R3 to R1 through the same path, data intact;
- a stream leader step-down moves the leadership to another replica.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

import raftstream
from raftstream import StreamConfig, errors
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_rpc_error
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import retry_async, until, wait_for
from tests.support.replicas import (
    lead_and_read_all,
    publish_numbered,
    removed_nodes,
    wait_replica_count,
    wait_replicas,
)

pytestmark = pytest.mark.integration

MSGS = 40
LINGER_WATCH_S = 30  # a bound for a removed replica to be dropped (5 s without a leader)


@pytest.fixture
def cluster4(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A started 4-node cluster (killed and removed afterwards; log tails on failure)."""
    with running(LocalCluster(4), request=request) as c:
        yield c


def _dropped(cluster: LocalCluster, node: str, stream: str) -> bool | None:
    """True once ``node`` no longer hosts the stream's group: its metrics no longer list the
    group (a node stops observing a group when it stops it)."""
    try:
        text = cluster.metrics(node)
    except OSError:
        return None
    series = f'raftstream_raft_applied_index{{account="$G",group="S:$G:{stream}",'
    return True if series not in text else None


async def _ask_through_each(cluster: LocalCluster, nodes: list[str], stream: str) -> None:
    """Ask each of ``nodes`` for ``stream``'s info with a bare stub (no SDK retries), over
    and over until each dropped the group: every answer is the info or NOT_LEADER naming
    a node to ask, never NO_LEADER (which kept the SDK asking there)."""

    def all_dropped() -> bool:
        left = [n for n in nodes if not _dropped(cluster, n, stream)]
        for node in left:
            with cluster.channel(node) as ch:
                try:
                    pbg.StreamServiceStub(ch).GetStreamInfo(
                        pb.StreamInfoRequest(name=stream), timeout=10
                    )
                except grpc.RpcError as exc:
                    err = from_rpc_error(exc)
                    assert isinstance(err, errors.NotLeaderError) and err.leader_addr, (node, err)
        return not left

    await until(
        all_dropped,
        what=f"{nodes} to drop their {stream} replicas",
        timeout_s=LINGER_WATCH_S,
        interval_s=0.1,
    )


@pytest.mark.parametrize("victim_role", ["follower", "leader"])
def test_removed_dead_peer_is_re_placed_and_the_new_replica_holds_every_message(
    cluster4: LocalCluster, victim_role: str
) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster4.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="RP", subjects=("rp.>",), num_replicas=3))
            await publish_numbered(js, "RP", 0, MSGS)
            info = await js.stream_info("RP")
            assert info.cluster is not None and info.cluster.leader
            hosts = {info.cluster.leader, *(r.name for r in info.cluster.replicas)}
            assert len(hosts) == 3
            spare = next(n for n in cluster4.names if n not in hosts)
            meta_leader = cluster4.wait_meta_leader()
            # The meta leader cannot remove itself: the victim is another node.
            victim = next(n for n in sorted(hosts) if n not in (info.cluster.leader, meta_leader))
            if victim_role == "leader":  # the stream leader dies: its successor repairs
                await lead_and_read_all(js, "RP", victim, MSGS)
            survivors = [n for n in cluster4.names if n != victim]
            cluster4.kill(victim)  # kill -9
            js2 = await raftstream.connect(
                servers=[cluster4.addr(n) for n in survivors], timeout=20
            )
            try:
                await retry_async(lambda: js2.remove_peer(victim))
                await wait_replicas(js2, "RP", (hosts - {victim}) | {spare})
                assert await removed_nodes(js2, victim) == {victim}  # cluster info says so
                await publish_numbered(js2, "RP", MSGS, 5)  # the new membership commits
                await lead_and_read_all(js2, "RP", spare, MSGS + 5)
            finally:
                await js2.close()
        finally:
            await js.close()

    run(body())


def test_update_stream_grows_r1_to_r3_and_shrinks_back_data_intact(
    cluster4: LocalCluster,
) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster4.servers, timeout=20)
        try:
            cfg = StreamConfig(name="GR", subjects=("gr.>",), num_replicas=1)
            await js.add_stream(cfg)
            await publish_numbered(js, "GR", 0, MSGS)
            first = (await js.stream_info("GR")).cluster
            assert first is not None and first.leader and not first.replicas

            grown = await js.update_stream(
                StreamConfig(name="GR", subjects=("gr.>",), num_replicas=3)
            )
            assert grown.config.num_replicas == 3  # the committed config, at once
            peers = await wait_replica_count(js, "GR", 3)
            assert first.leader in peers
            newcomer = next(p for p in sorted(peers) if p != first.leader)
            await lead_and_read_all(js, "GR", newcomer, MSGS)

            await js.update_stream(StreamConfig(name="GR", subjects=("gr.>",), num_replicas=1))
            await wait_replicas(js, "GR", {first.leader})
            # A removed replica lingers on its node a while and soon knows no leader: asked
            # there, it answered NO_LEADER until the client's timeout (a user review, when
            # `stream edit --replicas 3` read the config right after a shrink). Each ask
            # through a removed node, until both dropped their replicas, must be answered.
            await _ask_through_each(cluster4, sorted(peers - {first.leader}), "GR")
            for node in peers - {first.leader}:  # the others dropped their replicas
                wait_for(f"{node} to drop GR", lambda node=node: _dropped(cluster4, node, "GR"))
            info = await retry_async(lambda: js.stream_info("GR"))
            assert info.config.num_replicas == 1
            assert info.state.messages == MSGS
            # The other replicas' logs are gone: only a Raft membership of the lone voter
            # can commit this.
            await publish_numbered(js, "GR", MSGS, 5)
            assert (await js.stream_info("GR")).state.messages == MSGS + 5
        finally:
            await js.close()

    run(body())


def test_stream_leader_step_down_moves_the_leader(cluster4: LocalCluster) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster4.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="SD", subjects=("sd.>",), num_replicas=3))
            await publish_numbered(js, "SD", 0, 5)
            before = (await js.stream_info("SD")).cluster
            assert before is not None and before.leader
            new = await retry_async(lambda: js.stream_leader_stepdown("SD"))
            assert new is not None and new != before.leader
            after = await retry_async(lambda: js.stream_info("SD"))
            assert after.cluster is not None and after.cluster.leader == new
            assert after.state.messages == 5
        finally:
            await js.close()

    run(body())
