"""Node descriptions: the bookkeeping behind placement by tags and free space.

Issue 5: the meta leader "places replicas (fewest assets and most free space first;
placement.tags)", which needs every peer's tags, placement cluster and free space, told by
the peer itself (cluster/meta/descriptions.py, docs/cluster-design.md "Placement").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from raftstream.cluster.config import Address, NodeConfig
from raftstream.cluster.meta.descriptions import (
    LMDB_DATA_FILE,
    LOG_FEATURE_COPY_AT,
    LOG_FEATURES,
    DescriptionBook,
    NodeDescription,
    describe_self,
    free_bytes,
    node_infos,
)
from raftstream.cluster.meta.placement import NodeInfo
from raftstream.cluster.security.auth import AuthConfig, hash_secret, parse_auth
from raftstream.cluster.services.node import (
    NodeServicer,
    describe_peer,
    knows_asker,
    led_groups,
    probe_metadata,
)
from raftstream.errors import InvalidArgumentError
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.tooling.localnet import free_port

GIB = 1 << 30


def desc(name: str = "n2", *, at_ns: int = 10, **kw: object) -> NodeDescription:
    fields: dict[str, object] = {"cluster": "c1", "tags": frozenset({"ssd"}), "free_bytes": GIB}
    fields.update(kw)
    return NodeDescription(name=name, described_ns=at_ns, **fields)  # type: ignore[arg-type]


# -- the description ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"name": "a b"}, "name"),
        ({"cluster": ""}, "cluster"),
        ({"tags": frozenset({"has space"})}, "tags"),
        ({"tags": frozenset({""})}, "tags"),
        ({"free_bytes": -1}, "free_bytes"),
        ({"version": "x\ny"}, "version"),
        ({"tags": frozenset(f"t{i}" for i in range(65))}, "tags"),
        ({"log_features": frozenset({"copy at"})}, "log_features"),
        ({"log_features": frozenset(f"f{i}" for i in range(65))}, "log_features"),
    ],
)
def test_a_description_breaking_a_rule_names_the_field(kw: dict[str, object], field: str) -> None:
    """A peer's answer is validated like config: the error names the field and the rule."""
    with pytest.raises(InvalidArgumentError) as e:
        desc(**kw)  # type: ignore[arg-type]
    assert e.value.details["field"] == field


def test_a_description_survives_the_wire() -> None:
    d = desc(
        tags=frozenset({"ssd", "az1"}),
        free_bytes=123,
        version="1.2.3",
        at_ns=77,
        log_features=frozenset({"copy_at", "b"}),
    )
    m = d.to_pb()
    assert list(m.tags) == ["az1", "ssd"]  # sorted on the wire
    assert list(m.log_features) == ["b", "copy_at"]
    assert NodeDescription.from_pb(m) == d
    # A node of a version from before log features sends none.
    m.ClearField("log_features")
    assert NodeDescription.from_pb(m).log_features == frozenset()


def test_duplicate_tags_on_the_wire_are_refused() -> None:
    m = desc().to_pb()
    m.tags.append("ssd")
    with pytest.raises(InvalidArgumentError) as e:
        NodeDescription.from_pb(m)
    assert e.value.details["field"] == "tags"


# -- the book -----------------------------------------------------------------------------------


def test_the_book_keeps_the_freshest_description_of_each_peer() -> None:
    """Answers may arrive out of order: an older one never replaces a newer one."""
    book = DescriptionBook(peers=["n2", "n3"])
    assert book.get("n2") is None
    assert book.record("n2", desc(at_ns=20, free_bytes=2 * GIB))
    assert not book.record("n2", desc(at_ns=10, free_bytes=9 * GIB))
    assert not book.record("n2", desc(at_ns=20, free_bytes=9 * GIB))
    held = book.get("n2")
    assert held is not None and held.free_bytes == 2 * GIB
    assert book.record("n2", desc(at_ns=30, tags=frozenset({"hdd"})))
    held = book.get("n2")
    assert held is not None and held.tags == {"hdd"}


def test_the_book_refuses_answers_from_strangers_and_impostors() -> None:
    """An answer naming another node (a peer address pointing at the wrong node) or from a
    node that is not a configured peer is refused, and changes nothing."""
    book = DescriptionBook(peers=["n2", "n3"])
    book.record("n3", desc("n3", at_ns=5))
    with pytest.raises(InvalidArgumentError):
        book.record("n3", desc("n2", at_ns=50))
    with pytest.raises(InvalidArgumentError):
        book.record("n9", desc("n9", at_ns=50))
    assert book.get("n3") == desc("n3", at_ns=5)
    assert book.get("n2") is None and book.get("n9") is None


def test_the_book_says_whether_every_peer_reads_a_log_feature() -> None:
    """A rolling upgrade: a leader proposes a new kind of entry only when every replica
    said it reads it; one that said nothing of it (an older version) does not; one not
    heard from yet is not known (None)."""
    book = DescriptionBook(peers=["n2", "n3"])
    new = frozenset({LOG_FEATURE_COPY_AT})
    assert book.all_read([], LOG_FEATURE_COPY_AT) is True
    assert book.all_read(["n2", "n3"], LOG_FEATURE_COPY_AT) is None
    book.record("n2", desc("n2", log_features=new))
    assert book.all_read(["n2"], LOG_FEATURE_COPY_AT) is True
    assert book.all_read(["n2", "n3"], LOG_FEATURE_COPY_AT) is None
    book.record("n3", desc("n3"))  # an older version: no log features
    assert book.all_read(["n2", "n3"], LOG_FEATURE_COPY_AT) is False
    book.record("n3", desc("n3", at_ns=11, log_features=new))  # upgraded
    assert book.all_read(["n2", "n3"], LOG_FEATURE_COPY_AT) is True
    assert book.all_read(["n2", "n3"], "later") is False


def test_a_snapshot_does_not_change_with_later_records() -> None:
    book = DescriptionBook(peers=["n2"])
    book.record("n2", desc(at_ns=1))
    snap = book.snapshot()
    book.record("n2", desc(at_ns=2))
    assert snap["n2"].described_ns == 1


# -- free space ---------------------------------------------------------------------------------


def test_free_bytes_is_the_room_left_in_the_fullest_lmdb_map(tmp_path: Path) -> None:
    """Map size minus the data file's size, the smallest over the maps, when that is less
    than the filesystem's free space; a full map (file at or past its size) leaves 0."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / LMDB_DATA_FILE).write_bytes(b"x" * 4096)
    (b / LMDB_DATA_FILE).write_bytes(b"x" * 1024)
    assert free_bytes(tmp_path, [(a, 10_000), (b, 10_000)]) == 10_000 - 4096
    assert free_bytes(tmp_path, [(a, 4000)]) == 0


def test_free_bytes_is_the_filesystem_free_space_when_maps_have_room(tmp_path: Path) -> None:
    """A map whose file does not exist yet has all its room; then the filesystem decides."""
    got = free_bytes(tmp_path, [(tmp_path / "missing", 1 << 62)])
    st = os.statvfs(tmp_path)
    assert 0 < got <= st.f_blocks * st.f_frsize


def test_describe_self_carries_the_config(tmp_path: Path) -> None:
    cfg = config(tmp_path, tags=("ssd", "az1"))
    d = describe_self(cfg, free_bytes(tmp_path, [(tmp_path / "raft", 1 << 20)]))
    assert (d.name, d.cluster, d.tags) == ("n1", "east", {"ssd", "az1"})
    assert 0 < d.free_bytes <= 1 << 20 and d.described_ns > 0
    assert d.log_features == LOG_FEATURES and LOG_FEATURE_COPY_AT in d.log_features


def config(tmp_path: Path, *, tags: tuple[str, ...] = ()) -> NodeConfig:
    peers = {f"n{i}": Address("127.0.0.1", 7100 + i) for i in (1, 2, 3)}
    return NodeConfig(
        name="n1",
        listen=peers["n1"],
        data=tmp_path,
        peers=peers,
        cluster_name="east",
        tags=tags,
    )


# -- placement's view ---------------------------------------------------------------------------


def test_node_infos_use_each_peers_description_and_default_the_unknown(tmp_path: Path) -> None:
    """A described peer is placed by what it said; one not heard from yet is treated as
    before descriptions existed: this node's cluster, no tags, no free space."""
    cfg = config(tmp_path, tags=("hdd",))
    own = NodeDescription(
        name="n1", cluster="east", tags=frozenset({"hdd"}), free_bytes=3 * GIB, described_ns=1
    )
    peers = {"n2": desc("n2", cluster="west", tags=frozenset({"ssd"}), free_bytes=7 * GIB)}
    infos = node_infos(
        config=cfg, nodes=list(cfg.peers), own=own, peers=peers, live=lambda n: n != "n2"
    )
    assert infos == [
        NodeInfo(name="n1", cluster="east", tags=frozenset({"hdd"}), free_bytes=3 * GIB),
        NodeInfo(
            name="n2", cluster="west", tags=frozenset({"ssd"}), free_bytes=7 * GIB, live=False
        ),
        NodeInfo(name="n3", cluster="east", described=False),
    ]


# -- the service --------------------------------------------------------------------------------


def auth_config() -> AuthConfig:
    hashed = hash_secret("pw", rounds=4)
    return parse_auth(
        {"accounts": {"A": {}}, "users": [{"user": "u", "password": hashed, "account": "A"}]}
    )


@contextlib.asynccontextmanager
async def serve(
    auth: AuthConfig | None, known: frozenset[str] = frozenset()
) -> AsyncIterator[npbg.NodeServiceStub]:
    server = grpc.aio.server()
    d = desc("n1", tags=frozenset({"ssd"}))
    servicer = NodeServicer(
        auth=auth,
        describe=lambda: d,
        knows=known.__contains__,
        led=lambda groups: [pb.GroupInfo(name=g, leader="n1") for g in groups if g != "other"],
    )
    npbg.add_NodeServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield npbg.NodeServiceStub(ch)
    finally:
        await server.stop(None)


def test_describe_answers_without_auth() -> None:
    async def body() -> None:
        async with serve(None) as stub:
            md = probe_metadata(None)
            got = await describe_peer(stub, asker="n2", metadata=md, timeout_s=5)
            assert got.name == "n1" and got.tags == {"ssd"}

    asyncio.run(body())


def test_describe_says_whether_it_saw_the_asker_running() -> None:
    """What a node without Raft data asks before it starts (cluster/repair/known_peers.py); a peer
    that cannot be asked gives no answer (None), which is not a "no"."""

    async def body() -> None:
        md = probe_metadata(None)
        async with serve(None, known=frozenset({"n2"})) as stub:
            assert await knows_asker(stub, asker="n2", metadata=md, timeout_s=5) is True
            assert await knows_asker(stub, asker="n3", metadata=md, timeout_s=5) is False
        async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}") as ch:
            gone = npbg.NodeServiceStub(ch)
            assert await knows_asker(gone, asker="n2", metadata=md, timeout_s=1) is None

    asyncio.run(body())


def test_with_auth_only_a_node_token_gets_a_description() -> None:
    """With [auth], Describe wants a node token (docs/security.md): no credentials, a
    user's password, or a forged token are UNAUTHENTICATED; the prober's token passes."""
    auth = auth_config()
    basic = base64.b64encode(b"u:pw").decode()
    refused = [
        (),
        (("authorization", f"Basic {basic}"),),
        (("authorization", "Bearer rs-node.A.0000"),),
    ]

    async def body() -> None:
        async with serve(auth) as stub:
            for md in refused:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Describe(npb.DescribeRequest(asker="n2"), metadata=md, timeout=5)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            md = probe_metadata(auth)
            got = await describe_peer(stub, asker="n2", metadata=md, timeout_s=5)
            assert got.name == "n1"

    asyncio.run(body())


def test_led_groups_answers_nodes_only_and_nothing_when_unreachable() -> None:
    """LedGroups (cluster info's question to a group's leader) wants a node token with
    [auth], like Describe; a peer that cannot be asked answers no group."""
    auth = auth_config()

    async def body() -> None:
        async with serve(auth) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.LedGroups(npb.LedGroupsRequest(groups=["meta"]), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            md = probe_metadata(auth)
            got = await led_groups(stub, ["meta", "other"], metadata=md, timeout_s=5)
            assert [(g.name, g.leader) for g in got] == [("meta", "n1")]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}") as ch:
            gone = npbg.NodeServiceStub(ch)
            assert await led_groups(gone, ["meta"], metadata=md, timeout_s=1) == []

    asyncio.run(body())
