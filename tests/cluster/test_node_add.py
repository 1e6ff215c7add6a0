"""Integration: adding a node under a new name to a running cluster (docs/operations.md,
"Adding a node").

Three founders (n1..n3, each configured with the three of them) run an R3 stream. n4 is
configured with itself and one founder only. Started with ``--join`` before anyone added
it, it waits, serving nothing, and says what to do; ``add_peer("n4", address=...)`` adds it,
and it joins: the meta group takes it in as a voter (3 voters < ``meta_voters_max``), every
node lists it with its address, and an R4 stream is placed on it, n4 holding every message.
It stays a member across restarts (the founders' configs never name it; n4's names one
founder): with n2 down, the meta group's quorum (3 of 4) needs n4, and streams are still
created. A second new node gets no replica before it runs, is refused when started without
``--join`` (it would otherwise form a meta group of its own), and joins with it. Then a
founder leaves for good (``remove_peer(forget=True)``): out of the meta group and off every
node's list, also after a restart of a node whose config still names it. Bad requests
change nothing.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import raftstream
from raftstream import StreamConfig
from raftstream.cluster.services.node_book import CLUSTER_FILE
from raftstream.tooling.localcluster import NodeSpec
from raftstream.tooling.localnet import READY_TIMEOUT_S
from tests.support.cluster import LocalCluster, run, wait_logged
from tests.support.polling import retry_async, wait_for
from tests.support.replicas import lead_and_read_all, publish_numbered, wait_replicas

pytestmark = pytest.mark.integration

FOUNDERS = ("n1", "n2", "n3")
MSGS = 20
LOG_WAIT_S = 30.0


class GrowingCluster(LocalCluster):
    """Five node names; the founders are configured with each other only, a later node
    with itself and n1 (what an operator adding a machine writes)."""

    def _spec(self, name: str) -> NodeSpec:
        spec = super()._spec(name)
        names = FOUNDERS if name in FOUNDERS else (name, "n1")
        return dataclasses.replace(spec, peers={n: self.addr(n) for n in sorted(names)})


def _founders_recorded(root: Path, name: str) -> list[str]:
    return list(json.loads((root / name / CLUSTER_FILE).read_text())["meta_founders"])


def test_a_node_added_under_a_new_name_joins_and_stays_a_member() -> None:
    c = GrowingCluster(5)
    try:
        for n in FOUNDERS:
            c.start(n)
        c.nodes.wait_all_serving(FOUNDERS)
        c.wait_meta_leader()
        run(_grow(c))
    except BaseException:
        print(c.tails(60))
        raise
    finally:
        c.close()


async def _grow(c: GrowingCluster) -> None:
    js = await raftstream.connect(servers=[c.addr(n) for n in FOUNDERS], timeout=20)
    try:
        await js.add_stream(StreamConfig(name="OLD", subjects=("old.>",), num_replicas=3))
        await publish_numbered(js, "OLD", 0, MSGS)

        # Not added yet: it waits, serving nothing, and says what to do.
        c.start("n4", "--join")
        wait_logged(c, "n4", "raftstream cluster peer-add n4 --address", LOG_WAIT_S)
        assert not c.nodes.health("n4")

        assert await js.add_peer("n4", address=c.addr("n4")) is True
        assert await js.add_peer("n4", address=c.addr("n4")) is False  # nothing changes
        c.wait_serving("n4")

        async def n4_is_a_voter(via: raftstream.Client) -> None:
            info = await via.cluster_info()
            (n4,) = [n for n in info.nodes if n.name == "n4"]
            assert n4.addr == c.addr("n4") and n4.online and n4.voter, n4
            meta = info.groups[0].group
            assert {r.name for r in meta.replicas} | {meta.leader} >= {*FOUNDERS, "n4"}

        await retry_async(lambda: n4_is_a_voter(js))
        # Every founder sees it online (the meta leader among them places the next stream;
        # a CI run asked it a moment too soon: "4 replicas need 4 live nodes; 3 are up").
        for name in FOUNDERS:
            via = await raftstream.connect(servers=[c.addr(name)], timeout=20)
            try:
                await retry_async(lambda via=via: n4_is_a_voter(via))
            finally:
                await via.close()
        # Placement sees it: an R4 stream needs every node.
        await js.add_stream(StreamConfig(name="WIDE", subjects=("wide.>",), num_replicas=4))
        await publish_numbered(js, "WIDE", 0, MSGS)
        await wait_replicas(js, "WIDE", {*FOUNDERS, "n4"})
        await lead_and_read_all(js, "WIDE", "n4", MSGS)

        # A client that knows only n4 reaches everything through it.
        only = await raftstream.connect(servers=[c.addr("n4")], timeout=20)
        try:
            assert {s.config.name for s in await only.streams_info()} == {"OLD", "WIDE"}
            await retry_async(lambda: n4_is_a_voter(only))
        finally:
            await only.close()

        # Restarts: every node keeps n4 (the founders from the meta state, n4 from its own
        # record of the founders), and the meta group still needs it: with n2 down, 3 of 4.
        for n in ("n1", "n4"):
            c.stop(n)
            c.start(n)
            c.wait_serving(n)
        assert _founders_recorded(c.root, "n4") == list(FOUNDERS)
        assert _founders_recorded(c.root, "n1") == list(FOUNDERS)
        await retry_async(lambda: n4_is_a_voter(js))
        c.stop("n2")
        await retry_async(
            lambda: js.add_stream(StreamConfig(name="AFTER", subjects=("after.>",))),
            timeout_s=READY_TIMEOUT_S,
        )
        c.start("n2")
        c.wait_serving("n2")

        # A new node started without --join is refused: it did not found this cluster.
        assert await js.add_peer("n5", address=c.addr("n5")) is True
        # Added, not running yet: no replica is placed on it (it counts as down until it
        # answers), so five replicas cannot be placed, once the meta leader knows it too.
        leader = c.wait_meta_leader()
        wait_for("the meta leader to know n5", lambda: _listed(c, leader, "n5"))
        with pytest.raises((raftstream.errors.LimitError, raftstream.errors.InvalidArgumentError)):
            await js.add_stream(StreamConfig(name="R5", subjects=("r5.>",), num_replicas=5))
        c.start("n5")
        assert c.procs["n5"].wait(timeout=READY_TIMEOUT_S) == 1
        assert "did not found" in c.nodes.log_tail("n5", 200)
        assert not (c.root / "n5" / "raft").exists()
        c.start("n5", "--join")
        c.wait_serving("n5")
        info = await js.cluster_info()
        assert [n.name for n in info.nodes] == ["n1", "n2", "n3", "n4", "n5"]
        # Five voters now (meta_voters_max 5): every node votes.
        wait_for("n5 a voter", lambda: _voter(c, "n5"))

        # A founder leaves for good: killed, removed, and once its replicas moved, forgotten.
        c.kill("n2")
        await retry_async(lambda: js.remove_peer("n2"))

        async def forget() -> None:  # refused while a stream still has a replica there
            assert await js.remove_peer("n2", forget=True) is True

        await retry_async(forget, timeout_s=2 * READY_TIMEOUT_S)
        assert await js.remove_peer("n2", forget=True) is False  # nothing changes
        rest = ["n1", "n3", "n4", "n5"]

        async def n2_is_gone() -> None:
            info = await js.cluster_info()
            assert [n.name for n in info.nodes] == rest
            meta = info.groups[0].group
            assert sorted({meta.leader, *(r.name for r in meta.replicas)}) == rest

        await retry_async(n2_is_gone)
        for name in rest:  # no node dials n2 any more
            wait_logged(
                c, name, "node n2 was taken out of the cluster: no longer dialled", LOG_WAIT_S
            )
        # n1's config still names n2: restarted, it does not bring it back.
        c.stop("n1")
        c.start("n1")
        c.wait_serving("n1")

        def n1_lists_the_rest() -> bool | None:
            # Serving, it may not have applied the meta log's latest entries yet (a CI run
            # read its view a moment too soon: n1, n2, n3): once it has, n2 stays out.
            info1 = c.cluster_info("n1")
            return True if info1 is not None and [n.name for n in info1.nodes] == rest else None

        wait_for("n1's view without n2", n1_lists_the_rest)
        await publish_numbered(js, "OLD", MSGS, 5)
    finally:
        await js.close()


def _listed(c: LocalCluster, via: str, name: str) -> bool | None:
    info = c.cluster_info(via)
    return True if info is not None and any(n.name == name for n in info.nodes) else None


def _voter(c: LocalCluster, name: str) -> bool | None:
    info = c.cluster_info("n1")
    if info is None:
        return None
    return True if any(n.name == name and n.voter for n in info.nodes) else None


def test_adding_a_node_refuses_bad_requests_naming_the_field(cluster3: LocalCluster) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=20)
        try:
            before = await js.cluster_info()
            bad = [
                ("n9", "nonsense", "address"),
                ("n9", "127.0.0.1:0", "address"),
                ("n 9", "127.0.0.1:7999", "peer"),
                ("n1", "127.0.0.1:7999", "peer"),  # a node already, elsewhere
                ("n9", cluster3.addr("n2"), "address"),  # n2 serves there
            ]
            for name, addr, field in bad:
                with pytest.raises(raftstream.errors.InvalidArgumentError) as err:
                    await js.add_peer(name, address=addr)
                assert field in str(err.value), (name, addr, err.value)
            # A node already in the cluster at that very address: nothing to do.
            assert await js.add_peer("n1", address=cluster3.addr("n1")) is False
            # An unknown name without an address is neither a node to readmit nor one to add.
            with pytest.raises(raftstream.errors.InvalidArgumentError, match="--address"):
                await js.add_peer("n9")
            after = await js.cluster_info()
            assert [n.name for n in after.nodes] == [n.name for n in before.nodes]
        finally:
            await js.close()

    run(body())
