"""Integration: ``raftstream server --join`` when there is no running cluster to join
(docs/operations.md, "A node lost its disk" and "The REPAIR marker"; an operator review,
finding 1: ``--join`` kept in a service definition left a new cluster stuck for good).

- Every node of a new cluster started with ``--join``: each finds that every peer is empty
  too, and stops (exit 1) saying there is no cluster to join and to start the nodes without
  ``--join``; so started, they form the cluster, and ``--join`` is then ignored.
- A ``--join`` node that cannot reach every peer keeps asking, says so in its log, and writes
  nothing: stopped and started without ``--join``, it forms the cluster with the others.
- ``REPAIR`` markers an older version wrote for ``--join`` before any cluster answered (the
  review's stuck nodes, restarted without ``--join``) no longer strand them: the nodes stop
  once, the markers removed, and the next start forms the cluster.

A node whose data was lost while its cluster runs is still refused without ``--join`` and
repaired with it: ``test_node_replace.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import raftstream
from raftstream import StreamConfig
from raftstream.cluster.repair.repair import JOIN_REASON, MARKER
from raftstream.raft.storage import LmdbLogStorage
from raftstream.tooling.localnet import READY_TIMEOUT_S
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import wait_for
from tests.support.replicas import publish_numbered

pytestmark = pytest.mark.integration

# A bound for a node to stop by itself (it answers a while after its verdict, so that the
# nodes started with it find the same): generous, the machine is shared.
EXIT_WAIT_S = 2 * READY_TIMEOUT_S


@pytest.fixture
def empty3(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Three nodes with empty data directories, none started (each test starts them its
    own way). Always killed and removed afterwards; log tails printed on failure."""
    with running(LocalCluster(3), start=lambda: None, request=request) as c:
        yield c


def _assert_stopped_finding_no_cluster(cluster: LocalCluster, name: str, text: str) -> None:
    """``name`` exited 1 by itself, saying ``text``, and left no repair marker."""
    assert cluster.procs[name].wait(timeout=EXIT_WAIT_S) == 1, cluster.tails(40)
    assert text in cluster.nodes.log_tail(name, 200), cluster.tails(40)
    assert "start the nodes" in cluster.nodes.log_tail(name, 200).lower()
    assert not (cluster.root / name / MARKER).exists()


def _forms_and_takes_writes(cluster: LocalCluster) -> None:
    """Start every node without ``--join``: they form one cluster that commits writes."""
    cluster.start_all()  # every node SERVING, one meta leader known to all

    async def body() -> None:
        js = await raftstream.connect(servers=cluster.servers, timeout=20)
        try:
            await js.add_stream(StreamConfig(name="J", subjects=("j.>",), num_replicas=3))
            await publish_numbered(js, "J", 0, 5)
            assert (await js.stream_info("J")).state.messages == 5
        finally:
            await js.close()

    run(body())


def test_a_new_cluster_started_with_join_everywhere_stops_then_forms_without_it(
    empty3: LocalCluster,
) -> None:
    for name in empty3.names:
        empty3.start(name, "--join")
    for name in empty3.names:
        _assert_stopped_finding_no_cluster(empty3, name, "no cluster to join")
    _forms_and_takes_writes(empty3)
    # Once the node holds Raft data, --join is ignored: it may stay in a service definition.
    empty3.stop("n1")
    empty3.start("n1", "--join")
    empty3.wait_serving("n1")
    assert "--join ignored" in empty3.nodes.log_tail("n1", 400)


def test_a_join_with_a_peer_silent_keeps_asking_writes_nothing_and_may_drop_the_flag(
    empty3: LocalCluster,
) -> None:
    """n3 is down: n1 and n2 (``--join``) cannot tell whether a cluster runs, so they wait
    (never form one themselves) and say who does not answer. Nothing of theirs may outlive
    the wait: started again without ``--join``, all three form the cluster."""
    joiners = ("n1", "n2")
    for name in joiners:
        empty3.start(name, "--join")
    for name in joiners:
        # The old code wrote the marker at once: stop looking as soon as one exists.
        wait_for(
            f"{name} to say n3 does not answer",
            lambda name=name: (
                True
                if "n3 does not answer" in empty3.nodes.log_tail(name, 200)
                or (empty3.root / name / MARKER).exists()
                else None
            ),
            timeout_s=EXIT_WAIT_S,
        )
        assert not (empty3.root / name / MARKER).exists(), empty3.tails(40)
        assert not empty3.nodes.health(name)
        assert empty3.procs[name].poll() is None  # still waiting, not given up
    empty3.nodes.stop_all()
    _forms_and_takes_writes(empty3)


def test_join_markers_an_older_version_left_do_not_strand_a_new_cluster(
    empty3: LocalCluster,
) -> None:
    """The review's nodes after their restart without ``--join``: each holds the marker and
    the empty Raft environment an older version's ``--join`` left, and no cluster ever took
    them up. They stop once (no cluster exists, so none can be waiting for them), removing
    the markers, and then form the cluster."""
    for name in empty3.names:
        data = empty3.root / name
        data.mkdir(parents=True)
        (data / MARKER).write_text(json.dumps({"repair_id": f"old-{name}", "reason": JOIN_REASON}))
        LmdbLogStorage(data / "raft", map_size_bytes=1 << 24).close()
    for name in empty3.names:
        empty3.start(name)
    for name in empty3.names:
        _assert_stopped_finding_no_cluster(empty3, name, "no cluster to take this node in")
    _forms_and_takes_writes(empty3)
