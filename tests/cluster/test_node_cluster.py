"""Integration: a real 3-node cluster serving the SDK (issue 5, "Tests and numbers").

Each test starts its own cluster of node processes on loopback (``cluster3``); the SDK
(``raftstream.connect``) talks to it over gRPC exactly as an application would.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

import raftstream
from raftstream import ConsumerConfig, StreamConfig, errors
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_rpc_error
from tests.support.cluster import LocalCluster, run
from tests.support.polling import retry_async, wait_for

pytestmark = pytest.mark.integration


async def _connect(servers: list[str]) -> raftstream.Client:
    return await raftstream.connect(servers=servers, timeout=15)


def test_r3_stream_publish_fetch_ack(cluster3: LocalCluster) -> None:
    """Create an R3 stream and a durable pull consumer, publish through every node (the
    non-leaders forward), fetch everything once, ack it: the consumer's ack floor reaches
    the last message and nothing is pending (issue 5: create, publish, fetch, ack)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            info = await js.add_stream(
                StreamConfig(name="ORDERS", subjects=("orders.>",), num_replicas=3)
            )
            assert info.config.num_replicas == 3
            seqs = []
            for i, server in enumerate(cluster3.servers * 10):
                other = await raftstream.connect(servers=[server], timeout=15)
                ack = await other.publish(f"orders.{i}", f"m{i}".encode())
                await other.close()
                assert ack.stream == "ORDERS" and not ack.duplicate
                seqs.append(ack.seq)
            assert seqs == list(range(1, 31))  # every publish stored once, in order
            sub = await js.pull_subscribe("orders.>", durable="C1", stream="ORDERS")
            got = []
            while len(got) < 30:
                for m in await sub.fetch(10, timeout=5):
                    got.append(m.data)
                    await m.ack_sync()
            assert got == [f"m{i}".encode() for i in range(30)]
            ci = await js.consumer_info("ORDERS", "C1")
            assert (ci.ack_floor.stream_seq, ci.num_ack_pending, ci.num_pending) == (30, 0, 0)
            si = await js.stream_info("ORDERS")
            assert si.state.messages == 30 and si.cluster is not None
            assert si.cluster.leader in cluster3.names
            assert sorted(r.name for r in si.cluster.replicas) == sorted(
                set(cluster3.names) - {si.cluster.leader}
            )
        finally:
            await js.close()

    run(body())


def test_publish_async_dedup_and_workqueue_retention(cluster3: LocalCluster) -> None:
    """Pipelined publishes are all acknowledged with distinct sequences; a repeated msg_id
    is a duplicate answering the original sequence; on a workqueue stream an acked message
    is removed on the leader (acks replicate, removal happens at apply on every replica)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(
                StreamConfig(name="WQ", subjects=("jobs.>",), num_replicas=3, retention="workqueue")
            )
            futs = [await js.publish_async("jobs.a", b"x%d" % i) for i in range(300)]
            await js.publish_async_completed()
            seqs = sorted(f.result().seq for f in futs)
            assert seqs == list(range(1, 301))
            first = await js.publish("jobs.b", b"once", msg_id="id-1")
            again = await js.publish("jobs.b", b"once", msg_id="id-1")
            assert again.duplicate and again.seq == first.seq
            sub = await js.pull_subscribe("jobs.>", durable="W", stream="WQ")
            msgs = await sub.fetch(100, timeout=5)
            for m in msgs:
                await m.ack_sync()
            si = await js.stream_info("WQ")
            assert si.state.messages == 301 - len(msgs)
        finally:
            await js.close()

    run(body())


def test_meta_requests_work_on_every_node(cluster3: LocalCluster) -> None:
    """Stream and consumer definitions sent to any node reach the meta leader (forwarded)
    and every node lists them; a second create with another config is ALREADY_EXISTS."""

    async def body() -> None:
        for i, server in enumerate(cluster3.servers):
            js = await raftstream.connect(servers=[server], timeout=15)
            await js.add_stream(StreamConfig(name=f"S{i}", subjects=(f"s{i}.>",)))
            await js.add_consumer(f"S{i}", ConsumerConfig(durable_name="D"))
            await js.close()
        for server in cluster3.servers:
            js = await raftstream.connect(servers=[server], timeout=15)
            assert sorted(await js.stream_names()) == ["S0", "S1", "S2"]
            with pytest.raises(errors.AlreadyExistsError):
                await js.add_stream(StreamConfig(name="S0", subjects=("other.>",)))
            await js.close()

    run(body())


def test_lists_give_each_leaders_state_through_any_node(cluster3: LocalCluster) -> None:
    """An R1 stream lives on one node; listed through the others (which host no replica
    of it) its messages and its consumer's pending count are still its leader's, not
    empty (found by an operator review: ``stream ls`` said 0 messages through them)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="ONE", subjects=("one.>",), num_replicas=1))
            for i in range(7):
                await js.publish("one.x", b"%d" % i)
            await js.add_consumer("ONE", ConsumerConfig(durable_name="D"))
            host = cluster3.stream_leader("ONE")
            assert host is not None
        finally:
            await js.close()
        for name in cluster3.names:
            one = await raftstream.connect(servers=[cluster3.addr(name)], timeout=15)
            try:
                (info,) = await one.streams_info()
                assert (name, info.state.messages, info.state.last_seq) == (name, 7, 7)
                (ci,) = await one.consumers_info("ONE")
                assert (name, ci.num_pending) == (name, 7)
            finally:
                await one.close()

    run(body())


def test_cluster_info_gives_each_leaders_view_through_any_node(cluster3: LocalCluster) -> None:
    """Cluster info through any node names every group's leader and its followers' lag, as
    the leader sees them: before, a node that hosts no replica of an R1 stream listed it
    without a leader, and a follower listed its fellow replicas as not current."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="ONE", subjects=("one.>",), num_replicas=1))
            await js.add_stream(StreamConfig(name="TRI", subjects=("tri.>",), num_replicas=3))
            await js.publish("one.x", b"1")
            await js.publish("tri.x", b"3")
        finally:
            await js.close()

    run(body())

    async def seen_alike() -> None:
        leaders = set()
        for name in cluster3.names:
            info = cluster3.cluster_info(name)
            assert info is not None and info.answered_by == name
            by_stream = {g.stream: g.group for g in info.groups}
            one, tri, meta = by_stream["ONE"], by_stream["TRI"], by_stream[""]
            assert (name, list(one.replicas)) == (name, [])
            leaders.add((one.leader, tri.leader, meta.leader, info.meta_leader))
            for group in (tri, meta):  # lag is known on the leader only
                current = sorted(r.name for r in group.replicas if r.current)
                assert (name, current) == (name, sorted(set(cluster3.names) - {group.leader}))
        (one_leader, tri_leader, meta_leader, named) = leaders.pop()
        assert not leaders  # every node names the same leaders
        assert one_leader and tri_leader and meta_leader == named

    run(retry_async(seen_alike))


def test_health_reflection_and_cluster_info(cluster3: LocalCluster) -> None:
    """Every node serves grpc health (SERVING) and cluster info naming the one meta leader
    and every node online."""
    leaders = set()
    for server in cluster3.servers:
        with grpc.insecure_channel(server) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
            info = pbg.ClusterServiceStub(ch).GetClusterInfo(pb.ClusterInfoRequest())
            leaders.add(info.meta_leader)
            assert sorted(n.name for n in info.nodes) == cluster3.names
    assert len(leaders) == 1 and leaders.pop() in cluster3.names


def test_max_age_expiry_is_replicated_and_metrics_served(cluster3: LocalCluster) -> None:
    """Messages past max_age go: the stream leader proposes Expire entries stamped with its
    clock, which every replica applies (replicas never read their clock). Every node serves
    its metrics (applied index, stream sizes) over HTTP."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(
                StreamConfig(name="AGE", subjects=("age.>",), num_replicas=3, max_age=10**9)
            )
            for i in range(5):
                await js.publish("age.x", b"%d" % i)

            async def expired() -> None:
                info = await js.stream_info("AGE")
                assert (info.state.messages, info.state.last_seq) == (0, 5)

            await retry_async(expired)
        finally:
            await js.close()

    run(body())
    gauges = (
        # The group id, and its account and stream apart (a query sums by stream).
        'raftstream_raft_applied_index{account="$G",group="S:$G:AGE",stream="AGE"}',
        'raftstream_stream_messages{account="$G",group="S:$G:AGE",stream="AGE"}',
    )
    for name in cluster3.names:  # gauges are refreshed once a second: wait for the new group's
        wait_for(
            f"{name}'s gauges of AGE",
            lambda name=name: all(g in cluster3.metrics(name) for g in gauges) or None,
        )
    texts = [cluster3.metrics(name) for name in cluster3.names]
    # RPC latency by method, code and reason, for a unary call the test made (its publishes
    # travel as items of the SDK's PublishStream sync lane, a call still open until close()).
    created = 'raftstream_rpc_latency_seconds_count{code="OK",method="CreateStream",reason=""}'
    assert any(created in text for text in texts)
    # Every node times its event loop's wake-ups (its lag), from the start.
    lags = [re.search(r"^raftstream_event_loop_lag_seconds_count (\S+)$", t, re.M) for t in texts]
    assert all(m is not None and float(m.group(1)) > 0 for m in lags), lags
    # A follower's NOT_LEADER is labelled so: a redirect, which an alert can leave out. (A
    # follower that does not know the leader at that moment, as one whose election timer ran
    # out under load, answers NO_LEADER: asked again.)
    leader = cluster3.stream_leader("AGE")
    follower = next(n for n in cluster3.names if n != leader)

    async def redirected() -> None:
        with pytest.raises(grpc.RpcError) as err:
            pbg.StreamServiceStub(cluster3.channel(follower)).GetStreamInfo(
                pb.StreamInfoRequest(name="AGE"), timeout=5
            )
        assert isinstance(from_rpc_error(err.value), errors.NotLeaderError), err.value

    run(retry_async(redirected))
    redirect = (
        'raftstream_rpc_latency_seconds_count{code="UNAVAILABLE",method="GetStreamInfo",'
        'reason="NOT_LEADER"}'
    )
    # Counted once the call's status went out (the client may scrape first): wait for it.
    wait_for("the redirect's count", lambda: redirect in cluster3.metrics(follower) or None)


def test_inactive_ephemeral_consumer_is_deleted(cluster3: LocalCluster) -> None:
    """An ephemeral consumer (server-named) idle past inactive_threshold is deleted by its
    stream leader through the meta group; a durable one without inactive_threshold stays
    (one with it goes too: tests/cluster/test_pull_abandoned.py)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="EPH", subjects=("eph.>",), num_replicas=3))
            eph = await js.add_consumer("EPH", ConsumerConfig(inactive_threshold=10**9))
            await js.add_consumer("EPH", ConsumerConfig(durable_name="KEEP"))
            assert eph.name and eph.name != "KEEP"

            async def gone() -> None:
                assert await js.consumer_names("EPH") == ["KEEP"]

            await retry_async(gone)
        finally:
            await js.close()

    run(body())


def test_meta_leader_step_down_moves_leadership(cluster3: LocalCluster) -> None:
    """Asked on any node (forwarded to the meta leader), the meta leader hands leadership
    to the preferred node once it is caught up; every node then names the new leader."""
    old = cluster3.wait_meta_leader()
    target = next(n for n in cluster3.names if n != old)

    async def body() -> None:
        js = await raftstream.connect(servers=[cluster3.addr(target)], timeout=15)
        try:

            async def moved() -> None:
                await js.meta_leader_stepdown(preferred=target)
                assert (await js.cluster_info()).meta_leader == target

            await retry_async(moved)
        finally:
            await js.close()

    run(body())
    assert cluster3.wait_meta_leader() == target


def test_interest_retention_across_the_cluster(cluster3: LocalCluster) -> None:
    """Interest retention on R3: without consumers a message is not kept (its sequence is
    used); with one, it is kept until that consumer acks it, then removed (the ack is
    replicated and the removal happens at its log position on every replica)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(
                StreamConfig(name="INT", subjects=("int.>",), num_replicas=3, retention="interest")
            )
            await js.publish("int.a", b"nobody listens")
            assert (await js.stream_info("INT")).state.messages == 0
            sub = await js.pull_subscribe("int.>", durable="I", stream="INT")
            for i in range(3):
                await js.publish("int.a", b"%d" % i)
            assert (await js.stream_info("INT")).state.messages == 3
            for m in await sub.fetch(3, timeout=5):
                await m.ack_sync()
            info = await js.stream_info("INT")
            assert (info.state.messages, info.state.last_seq) == (0, 4)
        finally:
            await js.close()

    run(body())


def test_an_ack_of_a_sequence_not_delivered_is_refused(cluster3: LocalCluster) -> None:
    """A pull's deliveries leave before their Deliver op commits, so a leader change can
    lose a delivery a client holds; the new leader delivers that message again. An ack of
    a sequence the consumer has not delivered (what such a client's late ack is to the new
    leader) is refused with FAILED_PRECONDITION over ``Ack`` and, per item, over
    ``AckStream``, and changes nothing: confirming it would be an acked message that is
    then delivered (docs/cluster-design.md)."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="UND", subjects=("und.>",), num_replicas=3))
            for i in range(3):
                await js.publish("und.a", b"%d" % i)
            sub = await js.pull_subscribe("und.>", durable="U", stream="UND")
            [first] = await sub.fetch(1, timeout=5)
            meta = first.metadata
            ahead = first.reply.rsplit(".", 5)[0] + f".1.3.{meta.consumer_seq + 1}.1.0"
            leader = cluster3.stream_leader("UND")
            assert leader is not None
            stub = pbg.ConsumeServiceStub(cluster3.channel(leader))
            with pytest.raises(grpc.RpcError) as refused:
                stub.Ack(pb.AckRequest(ack=pb.AckItem(reply=ahead, sync=True)), timeout=15)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "has not delivered stream sequence 3" in (refused.value.details() or "")
            batch = pb.AckBatch(
                acks=[
                    pb.AckItem(reply=first.reply, sync=True, id=1),
                    pb.AckItem(reply=ahead, sync=True, id=2),
                ]
            )
            results = [r for b in stub.AckStream(iter([batch]), timeout=15) for r in b.results]
            by_id = {r.id: r for r in results}
            assert set(by_id) == {1, 2}
            assert not by_id[1].HasField("error")
            assert by_id[2].error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
            ci = await js.consumer_info("UND", "U")
            assert (ci.ack_floor.stream_seq, ci.num_ack_pending, ci.num_pending) == (1, 0, 2)
            rest = await sub.fetch(2, timeout=5)
            assert [m.metadata.stream_seq for m in rest] == [2, 3]
            assert all(m.metadata.num_delivered == 1 for m in rest)
        finally:
            await js.close()

    run(body())


def test_a_next_ack_answers_at_most_one_response_of_messages(cluster3: LocalCluster) -> None:
    """A +NXT ack's AckResponse is one gRPC message: it holds messages only up to one
    largest message in bytes (JetStream's max_bytes: the next one ends it with 409) and at
    most 256 however many ``next_batch`` asks for; the rest stay for the next pull."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="NXT", subjects=("nxt.>",), num_replicas=1))
            await js.publish_async("nxt.a", b"x")
            for _ in range(2):
                await js.publish_async("nxt.b", b"y" * 700_000)
            for _ in range(300):
                await js.publish_async("nxt.a", b"x")
            await js.publish_async_completed()
            sub = await js.pull_subscribe("nxt.>", durable="N", stream="NXT")
            [first] = await sub.fetch(1, timeout=5)
            leader = cluster3.stream_leader("NXT")
            assert leader is not None
            stub = pbg.ConsumeServiceStub(cluster3.channel(leader))

            def next_after(reply: str) -> pb.AckResponse:
                item = pb.AckItem(reply=reply, kind=pb.ACK_KIND_NEXT, next_batch=5000)
                resp: pb.AckResponse = stub.Ack(pb.AckRequest(ack=item), timeout=15)
                return resp

            by_bytes = next_after(first.reply)
            assert [m.seq for m in by_bytes.messages] == [2]  # the second 700 KB one: 409
            assert by_bytes.status.code == 409
            by_count = next_after(by_bytes.messages[0].reply)
            assert [m.seq for m in by_count.messages] == list(range(3, 259))
            rest = [m.metadata.stream_seq for m in await sub.fetch(100, timeout=5)]
            assert rest == list(range(259, 304))
        finally:
            await js.close()

    run(body())


def test_creating_an_existing_stream_again_needs_no_live_nodes(cluster3: LocalCluster) -> None:
    """Adding a stream (or a KV bucket) that exists with the same config answers it, as in
    JetStream, even while too few nodes are up to place it anew: an app that creates its
    streams at start must start while a node is down (found by a user review: it failed
    LIMIT "3 replicas need 3 live nodes"). Another config is ALREADY_EXISTS, not LIMIT."""
    cfg = StreamConfig(name="IDEM", subjects=("idem.>",), num_replicas=3)

    async def setup() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(cfg)
            await js.create_key_value("CFG", history=3, replicas=3)
        finally:
            await js.close()

    run(setup())
    meta_leader = cluster3.wait_meta_leader()
    victim = next(n for n in cluster3.names if n != meta_leader)
    cluster3.kill(victim)
    live = [cluster3.addr(n) for n in cluster3.names if n != victim]

    async def body() -> None:
        js = await _connect(live)
        try:
            tries = itertools.count()

            async def seen_down() -> None:  # a new R3 stream cannot be placed now
                name = f"NEW{next(tries)}"  # (one placed before the node was seen down stays)
                new = StreamConfig(name=name, subjects=(f"{name.lower()}.>",), num_replicas=3)
                try:
                    await js.add_stream(new)
                except errors.LimitError:
                    return
                raise AssertionError(f"{name} was placed: {victim} not seen down yet")

            await retry_async(seen_down)
            info = await js.add_stream(cfg)
            assert (info.config.name, info.config.num_replicas) == ("IDEM", 3)
            kv = await js.create_key_value("CFG", history=3, replicas=3)
            assert kv.bucket == "CFG"
            with pytest.raises(errors.AlreadyExistsError) as err:
                await js.add_stream(
                    StreamConfig(name="IDEM", subjects=("other.>",), num_replicas=3)
                )
            assert (
                "(subjects differs: update the stream to change it: raftstream stream edit, "
                "or the SDK's update_stream)"
            ) in str(err.value)
        finally:
            await js.close()

    run(body())


def test_a_stream_whose_only_replica_is_down_says_so(cluster3: LocalCluster) -> None:
    """An R1 stream on a node that is down: a node that does not host it answered NOT_LEADER
    "not hosted here" pointing at the dead node, and the client went there and back until
    its time ran out (a user review). Now it answers NO_LEADER naming the offline node."""

    async def setup() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="LONE", subjects=("lone.>",), num_replicas=1))
            await js.publish("lone.x", b"1")
        finally:
            await js.close()

    run(setup())
    host = cluster3.stream_leader("LONE")
    assert host is not None
    cluster3.kill(host)
    asker = next(n for n in cluster3.names if n != host)

    async def offline() -> None:  # once the asker has seen the host down
        js = await raftstream.connect(servers=[cluster3.addr(asker)], timeout=1)
        try:
            await js.stream_info("LONE")
        except errors.NoLeaderError as err:
            assert f"has no replica online: its node {host} is offline" in str(err), err
            return
        finally:
            await js.close()
        raise AssertionError("stream info answered with its only replica down")

    run(retry_async(offline))

    async def listed() -> None:  # listed, its state unknown rather than an empty stream
        js = await raftstream.connect(servers=[cluster3.addr(asker)], timeout=5)
        try:
            (info,) = await js.streams_info()
        finally:
            await js.close()
        assert (info.config.name, info.state_known) == ("LONE", False)

    run(listed())


def _samples(text: str, metric: str, **labels: str) -> dict[tuple[str, ...], float]:
    """``metric``'s samples in a /metrics page whose labels include ``labels``, keyed by
    the values of the rest of their labels (sorted by label name)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                rest = tuple(v for k, v in sorted(s.labels.items()) if k not in labels)
                out[rest] = s.value
    return out


def test_the_stream_leader_exports_consumer_backlogs_and_replica_lag(
    cluster3: LocalCluster,
) -> None:
    """What an operator alerts on: each consumer's backlog (num_pending, num_ack_pending)
    and how far each replica is behind, exported by the group's leader alone (a sum over the
    cluster counts each once), and gone with the consumer."""
    group = "S:$G:LAG"

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="LAG", subjects=("lag.>",), num_replicas=3))
            await js.add_consumer("LAG", ConsumerConfig(durable_name="W", ack_wait=60 * 10**9))
            for i in range(10):
                await js.publish("lag.x", b"%d" % i)
            sub = await js.pull_subscribe_bind("LAG", "W")
            got = await sub.fetch(4, timeout=5)
            assert len(got) == 4
            leader = cluster3.stream_leader("LAG")
            assert leader is not None

            async def exported() -> None:
                text = cluster3.metrics(leader)
                g = {"group": group, "account": "$G", "stream": "LAG"}
                c = {**g, "consumer": "W"}
                assert _samples(text, "raftstream_consumer_pending_messages", **c) == {(): 6}
                assert _samples(text, "raftstream_consumer_ack_pending_messages", **c) == {(): 4}
                assert _samples(text, "raftstream_consumer_delivered_stream_sequence", **c) == {
                    (): 4
                }
                lags = _samples(text, "raftstream_raft_peer_lag_entries", **g)
                assert set(lags) == {(n,) for n in cluster3.names if n != leader}
                assert set(lags.values()) == {0}
                for other in (n for n in cluster3.names if n != leader):
                    text = cluster3.metrics(other)
                    assert not _samples(text, "raftstream_consumer_pending_messages", **c)
                    assert not _samples(text, "raftstream_raft_peer_lag_entries", **g)

            await retry_async(exported)
            await js.delete_consumer("LAG", "W")

            async def gone() -> None:
                text = cluster3.metrics(leader)
                assert not _samples(
                    text, "raftstream_consumer_pending_messages", group=group, consumer="W"
                )

            await retry_async(gone)
        finally:
            await js.close()

    run(body())


def test_pause_is_the_consumers_pause_until_as_in_jetstream(cluster3: LocalCluster) -> None:
    """Pause and resume are updates of config.pause_until (JetStream 2.11): consumer info
    shows the pause in the config, an update carrying another pause_until moves it, and an
    edit of another field that carries it keeps the consumer paused."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="PZ", subjects=("pz.>",), num_replicas=3))
            await js.add_consumer("PZ", ConsumerConfig(durable_name="C"))
            await js.publish("pz.x", b"1")
            until = time.time_ns() + 3600 * 10**9
            paused = await js.pause_consumer("PZ", "C", until)
            assert paused.paused
            info = await js.consumer_info("PZ", "C")
            assert info.paused and info.config.pause_until == until
            edited = dataclasses.replace(info.config, max_ack_pending=5)
            info = await js.update_consumer("PZ", edited)
            assert info.paused and info.config.max_ack_pending == 5
            sub = await js.pull_subscribe_bind("PZ", "C")
            with pytest.raises(errors.DeadlineExceededError):
                await sub.fetch(1, timeout=1)
            info = await js.update_consumer("PZ", dataclasses.replace(info.config, pause_until=0))
            assert not info.paused and info.config.pause_until == 0
            assert [m.data for m in await sub.fetch(1, timeout=5)] == [b"1"]
            info = await js.update_consumer(
                "PZ", dataclasses.replace(info.config, pause_until=until)
            )
            assert info.paused
            await js.resume_consumer("PZ", "C")
            info = await js.consumer_info("PZ", "C")
            assert not info.paused and info.config.pause_until == 0
        finally:
            await js.close()

    run(body())


def test_an_update_changing_an_immutable_field_is_told_so_first(cluster3: LocalCluster) -> None:
    """A consumer update that is refused, and that changes a field an update may not change,
    names that field (as a stream update does): `consumer edit --ack none` on a consumer
    with max_ack_pending was told `max_ack_pending: has no meaning with ack_policy none`
    (a bad-input review). Nothing changes."""

    async def body() -> None:
        js = await _connect(cluster3.servers)
        try:
            await js.add_stream(StreamConfig(name="IM", subjects=("im.>",)))
            before = await js.add_consumer(
                "IM", ConsumerConfig(durable_name="C", max_ack_pending=50)
            )
            merged = {**before.config.to_dict(), "ack_policy": "none"}
            stub = pbg.ConsumerServiceStub(cluster3.channel(cluster3.wait_meta_leader()))
            with pytest.raises(grpc.RpcError) as info:
                stub.UpdateConsumer(
                    pb.UpdateConsumerRequest(stream="IM", config_json=json.dumps(merged)),
                    timeout=10,
                )
            err = from_rpc_error(info.value)
            assert isinstance(err, errors.InvalidArgumentError)
            assert err.details.get("field") == "ack_policy", err
            assert "can not be changed" in str(err)
            after = await js.consumer_info("IM", "C")
            assert after.config == before.config
        finally:
            await js.close()

    run(body())
