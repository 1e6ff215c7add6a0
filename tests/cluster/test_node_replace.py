"""Integration: a node that died for good is removed, then brought back (docs/operations.md).

On a 3-node cluster an R3 stream's replica node is killed (kill -9) and removed with
``remove_peer``: with no spare node the stream stays at 2 of 3 replicas. The node then comes
back in one of two ways:

- **its data lost** (the data directory wiped: a new disk, a new machine under its name): it
  starts empty with ``--join``. Until an operator readmits it, the meta leader refuses its
  repair and the node serves nothing, saying why in its log; after ``add_peer`` it rejoins as
  a new member;
- **its data kept**: it restarts as it was, and ``add_peer`` readmits it.

Either way the meta leader then gives the stream its third replica back on that node, which
ends up holding every message: shown by making it the stream's leader and reading every
message from it.

A node that lost its data and was never removed is refused when started empty without
``--join`` (its peers saw it running: ``cluster/repair/known_peers.py``), also when the whole
cluster starts at once, and rejoins with ``--join`` alone.
"""

from __future__ import annotations

import shutil

import pytest

import raftstream
from raftstream import StreamConfig
from raftstream.cluster.repair.known_peers import CHECKING_MARKER, KNOWN_PEERS_FILE
from tests.support.cluster import LocalCluster, run, wait_logged
from tests.support.polling import retry_async, wait_for
from tests.support.replicas import lead_and_read_all, publish_numbered, removed_nodes, wait_replicas

pytestmark = pytest.mark.integration

MSGS = 30
REFUSAL_WAIT_S = 15.0


def _wait_recorded(cluster: LocalCluster, by: str, victim: str) -> None:
    """Until ``by`` has recorded ``victim`` as seen running (``cluster/repair/known_peers.py``)."""
    seen = cluster.root / by / KNOWN_PEERS_FILE
    wait_for(
        f"{by} to record {victim}",
        lambda: True if seen.exists() and victim in seen.read_text() else None,
    )


def _assert_refused(cluster: LocalCluster, victim: str) -> None:
    """``victim``, started without Raft data and without ``--join``, exited 1 saying why,
    and left no Raft environment behind."""
    assert cluster.procs[victim].wait(timeout=REFUSAL_WAIT_S) == 1
    assert "it lost its data. Start it with --join" in cluster.nodes.log_tail(victim)
    assert not (cluster.root / victim / "raft").exists()


@pytest.mark.parametrize("data", ["lost", "kept"])
def test_a_removed_node_is_readmitted_and_gets_its_replica_back(
    cluster3: LocalCluster, data: str
) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="RJ", subjects=("rj.>",), num_replicas=3))
            await publish_numbered(js, "RJ", 0, MSGS)
            victim = next(n for n in sorted(cluster3.names) if n != cluster3.wait_meta_leader())
            survivors = {n for n in cluster3.names if n != victim}
            cluster3.kill(victim)
            await retry_async(lambda: js.remove_peer(victim))
            await wait_replicas(js, "RJ", survivors)  # short: no spare node to take it
            assert await removed_nodes(js, victim) == {victim}
            assert await js.remove_peer(victim) is False  # removed already: nothing changes
            await publish_numbered(js, "RJ", MSGS, 5)  # committed by the two survivors alone

            if data == "lost":
                shutil.rmtree(cluster3.root / victim)
                cluster3.start(victim, "--join")
                # Removed: the meta leader refuses its repair, and the node serves nothing.
                wait_logged(cluster3, victim, "readmit it first", REFUSAL_WAIT_S)
                assert not cluster3.nodes.health(victim)
                # A client that knows only this node is sent to a peer, a publish without a
                # msg id too: it was UNAVAILABLE (not retried: maybe applied) though nothing
                # is applied here (a user review).
                await js.add_stream(StreamConfig(name="RX", subjects=("rx.>",)))
                only = await raftstream.connect(servers=[cluster3.addr(victim)], timeout=20)
                try:
                    assert (await only.publish("rx.a", b"via a node under repair")).seq == 1
                finally:
                    await only.close()
            else:
                cluster3.start(victim)
                wait_logged(
                    cluster3, victim, "this node was removed from the cluster", REFUSAL_WAIT_S
                )
            assert await js.add_peer(victim) is True
            cluster3.wait_serving(victim)
            await wait_replicas(js, "RJ", set(cluster3.names))

            async def none_removed() -> None:
                info = await js.cluster_info()
                assert [n.name for n in info.nodes if n.removed] == []

            await retry_async(none_removed)
            await publish_numbered(js, "RJ", MSGS + 5, 5)
            await lead_and_read_all(js, "RJ", victim, MSGS + 10)
        finally:
            await js.close()

    run(body())


def test_a_node_that_lost_its_data_refuses_to_start_empty_and_rejoins_with_join(
    cluster3: LocalCluster,
) -> None:
    """Its peers saw it running (``cluster/repair/known_peers.py``): started empty without
    ``--join`` it exits at once, creating nothing; with ``--join`` it is repaired (never
    removed, so nothing else is needed) and holds every message again."""

    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="RW", subjects=("rw.>",), num_replicas=3))
            await publish_numbered(js, "RW", 0, MSGS)
            victim = next(n for n in sorted(cluster3.names) if n != cluster3.wait_meta_leader())
            _wait_recorded(cluster3, next(n for n in cluster3.names if n != victim), victim)
            cluster3.kill(victim)
            shutil.rmtree(cluster3.root / victim)
            cluster3.start(victim)
            _assert_refused(cluster3, victim)
            await publish_numbered(js, "RW", MSGS, 5)
            cluster3.start(victim, "--join")
            cluster3.wait_serving(victim)
            await wait_replicas(js, "RW", set(cluster3.names))
            await lead_and_read_all(js, "RW", victim, MSGS + 5)
        finally:
            await js.close()

    run(body())


def test_a_wiped_node_is_caught_when_the_whole_cluster_starts_at_once(
    cluster3: LocalCluster,
) -> None:
    """Every node restarted together, one of them wiped: the others' servers answer while
    it waits (NOT_SERVING) for a majority's answer, so it is refused all the same. Killed
    while it waited, it does not take the empty Raft environment it left for its data."""
    victim = "n2"
    _wait_recorded(cluster3, "n1", victim)
    cluster3.nodes.stop_all()
    shutil.rmtree(cluster3.root / victim)
    cluster3.start(victim)  # alone: its peers are down, so it waits for their answers
    wait_for(
        f"{victim} waiting for its peers",
        lambda: (
            True
            if (cluster3.root / victim / CHECKING_MARKER).exists()
            and (cluster3.root / victim / "raft" / "data.mdb").exists()
            else None
        ),
    )
    assert not cluster3.nodes.health(victim)
    cluster3.kill(victim)  # kill -9 while it asks: its empty environment stays behind
    for name in (victim, *(n for n in cluster3.names if n != victim)):  # the wiped one first
        cluster3.start(name)
    _assert_refused(cluster3, victim)
    assert not (cluster3.root / victim / CHECKING_MARKER).exists()
    cluster3.start(victim, "--join")
    cluster3.wait_serving(victim)


def test_a_stream_whose_only_replica_went_with_a_removed_node_waits_for_it(
    cluster3: LocalCluster,
) -> None:
    """An R1 stream on a node that dies and is removed (a user review): it was re-placed on
    another node as an empty group that could never elect a leader (its only voter gone),
    listed as a known, empty stream, with "no leader yet" errors; a consumer added while
    its node was down answered TIMEOUT and was created once the node came back. Now: the
    consumer is refused at once and never made, the stream is not re-placed, its errors say
    what brings it back, and readmitting the node with its data does."""

    def _meta_leader_not(host: str) -> str | None:
        leader = cluster3.wait_meta_leader()
        return leader if leader != host else None

    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="LONE", subjects=("lone.>",)))
            for i in range(3):
                await js.publish("lone.x", b"%d" % i)
            host = cluster3.stream_leader("LONE")
            assert host is not None
            others = [n for n in cluster3.names if n != host]
            if cluster3.wait_meta_leader() == host:  # the meta leader must see it go
                await js.meta_leader_stepdown(preferred=others[0])
            leader = wait_for("a meta leader besides the host", lambda: _meta_leader_not(host))
            cluster3.kill(host)
            # The refusal rests on the meta leader's view; until it has seen the node down,
            # a consumer may still be proposed (and made once the stream is back).
            wait_logged(cluster3, leader, f"peer {host} (", REFUSAL_WAIT_S)
            quick = await raftstream.connect(servers=[cluster3.addr(n) for n in others], timeout=2)
            try:

                async def consumer_refused(why: str) -> None:
                    with pytest.raises(raftstream.errors.NoLeaderError) as err:
                        await quick.add_consumer("LONE", durable_name="late")
                    assert why in str(err.value), err.value

                await retry_async(lambda: consumer_refused(f"its node {host} is offline"))
                await retry_async(lambda: js.remove_peer(host))
                removed = f"its only replica was on node {host}, removed from the cluster"

                async def says_removed() -> None:
                    with pytest.raises(raftstream.errors.NoLeaderError) as err:
                        await quick.stream_info("LONE")
                    assert removed in str(err.value) and "peer-add" in str(err.value)

                await retry_async(says_removed)
                # The SDK retries NO_LEADER until the client's 2 s: on a loaded machine the
                # last try may not fit and end DeadlineExceeded (a flake in CI): again.
                await retry_async(lambda: consumer_refused(removed))
                (info,) = await quick.streams_info()  # not an empty stream on another node
                assert (info.config.name, info.state_known) == ("LONE", False)
            finally:
                await quick.close()
            wait_logged(cluster3, leader, "not re-placing S:$G:LONE", REFUSAL_WAIT_S)
            assert "re-placing LONE" not in cluster3.nodes.log_tail(leader, 400)

            cluster3.start(host)
            wait_logged(cluster3, host, "this node was removed from the cluster", REFUSAL_WAIT_S)
            assert await js.add_peer(host) is True
            cluster3.wait_serving(host)

            async def back() -> None:
                assert (await js.stream_info("LONE")).state.messages == 3

            await retry_async(back)
            assert await js.consumer_names("LONE") == []  # the refused one was never made
        finally:
            await js.close()

    run(body())
