"""TLS for clients and mutual TLS between nodes (issue 10, "TLS and mTLS").

What is pinned (docs/tls.md): the throw-away generator's certificates verify against their
CA, for the roles and names they claim; ``[tls]`` is checked at start, each refusal naming
its key; a real 3-node cluster with TLS works end to end through the SDK (an R3 stream,
publish, fetch, ack, and a request forwarded between nodes over mutual TLS); a client
without the CA, a client with a certificate of another CA and a plaintext client are
refused; the Raft service refuses a client certificate and a node speaking for another; and
a node whose certificate comes from another CA gets none of its Raft traffic through and
receives none: the others commit without it and its log stays where it was.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from grpc_health.v1 import health_pb2, health_pb2_grpc

import raftstream
from raftstream import StreamConfig, errors
from raftstream._conn import tls_credentials
from raftstream.cluster.config import load_config
from raftstream.config import StreamSource
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raft_pb2
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.raft.transport import NODE_URI_PREFIX
from raftstream.raft.transport.grpc_transport import SERVICE as RAFT_SERVICE
from raftstream.tooling.certs import CertSet, generate
from tests.support.cluster import LocalCluster, running
from tests.support.polling import until, wait_for

NODES = ("n1", "n2", "n3")
MIRROR_COPIED_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return generate(tmp_path_factory.mktemp("good"), nodes=NODES, clients=["client"])


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    """Same names, another CA: what an attacker can make without the cluster's CA key."""
    return generate(tmp_path_factory.mktemp("rogue"), nodes=NODES, clients=["client"])


def _files(certs: CertSet, node: str, ca: Path | None = None) -> tuple[Path, Path, Path]:
    pair = certs.nodes[node]
    return (ca or certs.ca, pair.cert, pair.key)


# -- the generator -------------------------------------------------------------------------


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_generated_certificates_verify_for_their_role(good: CertSet, rogue: CertSet) -> None:
    """Node certificates verify as servers for 127.0.0.1 and localhost and as clients; a
    client certificate only as a client; neither against another CA. Keys are 0600."""
    store = Store([_load(good.ca)])
    builder = PolicyBuilder().store(store)
    for name in NODES:
        node = _load(good.nodes[name].cert)
        loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
        builder.build_server_verifier(loopback).verify(node, [])
        builder.build_server_verifier(x509.DNSName("localhost")).verify(node, [])
        verified = builder.build_client_verifier().verify(node, [])
        assert f"{NODE_URI_PREFIX}{name}" in [
            g.value
            for g in verified.subjects or []
            if isinstance(g, x509.UniformResourceIdentifier)
        ]
        with pytest.raises(VerificationError):
            builder.build_server_verifier(x509.DNSName("localhost")).verify(
                _load(rogue.nodes[name].cert), []
            )
    client = _load(good.clients["client"].cert)
    builder.build_client_verifier().verify(client, [])
    with pytest.raises(VerificationError):  # no server usage: cannot pose as a node's port
        builder.build_server_verifier(x509.DNSName("localhost")).verify(client, [])
    keys = [good.ca_key, *(p.key for p in good.nodes.values()), good.clients["client"].key]
    for key in keys:
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


def test_generator_refuses_to_overwrite_and_bad_names(good: CertSet) -> None:
    with pytest.raises(errors.InvalidArgumentError) as info:
        generate(good.ca.parent, nodes=["n1"])
    assert info.value.field == "dir"
    with pytest.raises(errors.InvalidArgumentError) as info:
        generate(good.ca.parent / "x", nodes=["../n1"])
    assert info.value.field == "nodes"
    assert not (good.ca.parent / "x").exists()  # bad input changes nothing


def test_the_sdk_and_the_transport_agree_on_the_node_uri() -> None:
    from raftstream.tooling import certs

    assert certs.NODE_URI_PREFIX == NODE_URI_PREFIX


# -- [tls] configuration -------------------------------------------------------------------


def _config(tmp_path: Path, name: str, tls: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[cluster]\nname = "{name}"\nlisten = "127.0.0.1:7101"\ndata = "{tmp_path}"\n'
        f'peers = {{ {name} = "127.0.0.1:7101" }}\n\n[tls]\n{tls}'
    )
    return path


def _tls_table(ca: Path, cert: Path, key: Path) -> str:
    return f'ca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'


def test_tls_section_is_checked_at_start(tmp_path: Path, good: CertSet, rogue: CertSet) -> None:
    """Each refusal names its key: a missing key, an unreadable file, a key of another
    certificate, a client certificate or another node's as this node's."""
    ca, cert, key = _files(good, "n1")
    cfg = load_config(_config(tmp_path, "n1", _tls_table(ca, cert, key)))
    assert cfg.tls is not None and cfg.tls.cert_file == cert
    client = good.clients["client"]
    cases = {
        "tls.key_file": _tls_table(ca, cert, rogue.nodes["n1"].key),
        "tls.ca_file": _tls_table(tmp_path / "missing.pem", cert, key),
        "tls.cert_file": _tls_table(ca, client.cert, client.key),
        "tls.unknown": _tls_table(ca, cert, key) + 'unknown = "x"\n',
    }
    for field, table in cases.items():
        with pytest.raises(errors.InvalidArgumentError) as info:
            load_config(_config(tmp_path, "n1", table))
        assert info.value.field == field, info.value
    with pytest.raises(errors.InvalidArgumentError) as info:
        load_config(_config(tmp_path, "n2", _tls_table(ca, cert, key)))  # n1's certificate
    assert info.value.field == "tls.cert_file"
    with pytest.raises(errors.InvalidArgumentError) as info:
        load_config(_config(tmp_path, "n1", f'ca_file = "{ca}"\n'))
    assert info.value.field == "tls.cert_file"
    # The flags give the same keys and win over the file.
    flags = load_config(
        _config(tmp_path, "n1", _tls_table(ca, cert, rogue.nodes["n1"].key)), tls_key_file=key
    )
    assert flags.tls is not None and flags.tls.key_file == key


def test_a_tls_key_readable_by_others_is_warned_about(
    tmp_path: Path, good: CertSet, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/tls.md: the key file is readable by the node only. A key readable by group or
    others is a WARNING at start naming the file and its mode (the node still starts);
    0600 (what ``raftstream certs`` writes) is quiet. Before, its mode was never checked."""
    ca, cert, key = _files(good, "n1")
    copy = tmp_path / "n1-key.pem"
    shutil.copyfile(key, copy)
    path = _config(tmp_path, "n1", _tls_table(ca, cert, copy))
    caplog.set_level(logging.WARNING, logger="raftstream.cluster.config")

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "readable by group" in r.getMessage()]

    copy.chmod(0o644)
    assert load_config(path).tls is not None
    said = warned()
    assert len(said) == 1 and str(copy) in said[0] and "0644" in said[0], said
    caplog.clear()
    copy.chmod(0o600)
    load_config(path)
    assert warned() == []


def test_sdk_tls_arguments_are_checked(good: CertSet, rogue: CertSet) -> None:
    assert tls_credentials() is None
    with pytest.raises(errors.InvalidArgumentError) as info:
        tls_credentials(cert=b"-----BEGIN CERTIFICATE-----")
    assert info.value.field == "tls_key"
    with pytest.raises(errors.InvalidArgumentError) as info:
        tls_credentials(ca="/nonexistent/ca.pem")
    assert info.value.field == "tls_ca"
    mine = good.clients["client"]
    assert tls_credentials(ca=good.ca, cert=mine.cert, key=mine.key) is not None
    # Another certificate's key: gRPC would only log "Invalid private key" and then fail
    # every connection as if the node were unreachable.
    cases = [
        (rogue.clients["client"].key, "tls_key", "does not match the key of tls_cert"),
        (good.ca, "tls_key", "must hold an unencrypted PEM private key"),
    ]
    for key, field, rule in cases:
        with pytest.raises(errors.InvalidArgumentError) as info:
            tls_credentials(ca=good.ca, cert=mine.cert, key=key)
        assert (info.value.field, info.value.rule) == (field, rule)
    with pytest.raises(errors.InvalidArgumentError) as info:
        tls_credentials(ca=good.ca, cert=mine.key, key=mine.key)
    assert (info.value.field, info.value.rule) == ("tls_cert", "must hold a PEM certificate")


def test_cli_tls_options_reach_the_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--tls-* after the command, before it, or from $RAFTSTREAM_TLS_*: the command's own
    wins, then the group's, then the environment (docs/cli.md). Checked through the error
    an unreadable file gives, before anything is sent: a usage error (exit 2)."""
    from click.testing import CliRunner

    from raftstream.cli.app import cli

    runner = CliRunner()

    def error(args: list[str]) -> str:
        result = runner.invoke(cli, args)
        assert result.exit_code == 2, result.output
        return str(result.output)

    env_ca, group_ca, own_ca = (str(tmp_path / f"{n}.pem") for n in ("env", "group", "own"))
    monkeypatch.setenv("RAFTSTREAM_TLS_CA", env_ca)
    assert env_ca in error(["stream", "ls"])
    assert group_ca in error(["--tls-ca", group_ca, "stream", "ls"])
    assert own_ca in error(["--tls-ca", group_ca, "stream", "ls", "--tls-ca", own_ca])
    monkeypatch.delenv("RAFTSTREAM_TLS_CA")
    monkeypatch.setenv("RAFTSTREAM_TLS_CERT", env_ca)
    assert "tls_key" in error(["stream", "ls"])  # a certificate needs its key


# -- a real cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster(good: CertSet) -> Iterator[LocalCluster]:
    client = good.clients["client"]
    c = LocalCluster(
        3,
        tls={n: _files(good, n) for n in NODES},
        client_tls=(good.ca, client.cert, client.key),
    )
    with running(c, lines=30):
        yield c


async def _connect(servers: list[str], **tls: object) -> raftstream.Client:
    return await raftstream.connect(servers=servers, timeout=15, **tls)  # type: ignore[arg-type]


async def _refused(servers: list[str], **tls: object) -> errors.RaftStreamError:
    with pytest.raises(errors.UnavailableError) as info:
        await raftstream.connect(
            servers=servers,
            timeout=1.0,
            connect_timeout=0.5,
            **tls,  # type: ignore[arg-type]
        )
    return info.value


@pytest.mark.integration
def test_tls_cluster_end_to_end_and_refusals(
    tls_cluster: LocalCluster, good: CertSet, rogue: CertSet
) -> None:
    """An R3 stream created through a node that is not the meta leader (forwarded over
    mutual TLS), publish, fetch, ack; a mirror of it (its link connects to the cluster as
    the node, over TLS) copies everything; then the refused clients."""
    client = good.clients["client"]
    ok = {"tls_ca": good.ca, "tls_cert": client.cert, "tls_key": client.key.read_bytes()}
    leader = tls_cluster.wait_meta_leader()
    follower = next(n for n in NODES if n != leader)

    async def body() -> None:
        js = await _connect([tls_cluster.addr(follower)], **ok)
        try:
            await js.add_stream(StreamConfig(name="ORDERS", subjects=("orders.>",), num_replicas=3))
            acks = [await js.publish(f"orders.{i}", f"m{i}".encode()) for i in range(5)]
            assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
            sub = await js.pull_subscribe("orders.>", durable="C1", stream="ORDERS")
            got: list[bytes] = []
            while len(got) < 5:
                for m in await sub.fetch(5, timeout=5):
                    got.append(m.data)
                    await m.ack_sync()
            assert got == [f"m{i}".encode() for i in range(5)]
            ci = await js.consumer_info("ORDERS", "C1")
            assert (ci.ack_floor.stream_seq, ci.num_ack_pending) == (5, 0)
            mirror = StreamConfig(name="COPY", mirror=StreamSource(name="ORDERS"))
            await js.add_stream(mirror)

            async def copied() -> bool:
                return (await js.stream_info("COPY")).state.messages >= 5

            await until(  # generous: a stuck link
                copied,
                what="COPY holds 5 copies",
                timeout_s=MIRROR_COPIED_TIMEOUT_S,
                interval_s=0.1,
            )
        finally:
            await js.close()
        servers = tls_cluster.servers
        await _refused(servers)  # plaintext
        await _refused(servers, tls_cert=client.cert, tls_key=client.key)  # no CA
        foreign = rogue.clients["client"]
        await _refused(servers, tls_ca=good.ca, tls_cert=foreign.cert, tls_key=foreign.key)
        await _refused(servers, tls_ca=good.ca)  # the CA, but no client certificate

    asyncio.run(body())
    with grpc.insecure_channel(tls_cluster.addr("n1")) as ch:  # plaintext, raw gRPC
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _raft_send(addr: str, creds: tuple[Path, Path, Path], src: str, dst: str) -> grpc.StatusCode:
    """One Raft ``Send`` call carrying an empty batch from ``src``; its status code."""
    ca, cert, key = (p.read_bytes() for p in creds)
    channel_creds = grpc.ssl_channel_credentials(ca, key, cert)
    with grpc.secure_channel(addr, channel_creds) as ch:
        send = ch.stream_unary(
            f"/{RAFT_SERVICE}/Send",
            request_serializer=raft_pb2.Batch.SerializeToString,
            response_deserializer=raft_pb2.SendAck.FromString,
        )
        try:
            send(iter([raft_pb2.Batch(src=src, dst=dst)]), timeout=5)
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_raft_service_accepts_node_certificates_only(
    tls_cluster: LocalCluster, good: CertSet, rogue: CertSet
) -> None:
    """A client certificate of the cluster CA and a node speaking for another are refused
    by the Raft service; another CA's node certificate is refused at the handshake; a node
    speaking for itself is heard (an empty batch to another id is a harmless no-op)."""
    addr = tls_cluster.addr("n1")
    client = good.clients["client"]
    as_client = (good.ca, client.cert, client.key)
    assert _raft_send(addr, as_client, "client", "n1") == grpc.StatusCode.PERMISSION_DENIED
    assert _raft_send(addr, as_client, "n2", "n1") == grpc.StatusCode.PERMISSION_DENIED
    n3 = _files(good, "n3")
    assert _raft_send(addr, n3, "n2", "nobody") == grpc.StatusCode.PERMISSION_DENIED
    assert _raft_send(addr, n3, "n3", "nobody") == grpc.StatusCode.OK
    foreign = _files(rogue, "n2", ca=good.ca)
    assert _raft_send(addr, foreign, "n2", "nobody") == grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
def test_node_services_refuse_client_certificates(tls_cluster: LocalCluster, good: CertSet) -> None:
    """The repair and node-description services, like Raft, are for node certificates: a
    client certificate of the cluster CA gets PERMISSION_DENIED (before the fix, RepairNode
    from a client made the meta leader take a healthy node out of the meta group)."""
    client = good.clients["client"]
    ca, cert, key = (p.read_bytes() for p in (good.ca, client.cert, client.key))
    creds = grpc.ssl_channel_credentials(ca, key, cert)
    with grpc.secure_channel(tls_cluster.addr("n1"), creds) as ch:
        calls = [
            lambda: rpbg.RepairServiceStub(ch).RepairNode(
                rpb.RepairNodeRequest(node="n3", repair_id="evil"), timeout=10
            ),
            lambda: npbg.NodeServiceStub(ch).Describe(npb.DescribeRequest(asker="x"), timeout=10),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    info = tls_cluster.cluster_info("n1")
    assert info is not None and {n.name for n in info.nodes if n.voter} == set(NODES)


def _wait(cluster: LocalCluster, what: str, probe: Callable[[], bool | None]) -> None:
    """``wait_for``, printing the ends of the nodes' logs when it times out."""
    try:
        wait_for(what, probe)
    except TimeoutError:
        print(cluster.tails(60))
        raise


def _metric(cluster: LocalCluster, node: str, name: str, group: str) -> float | None:
    account, stream = group.split(":", 2)[1:]
    prefix = f'{name}{{account="{account}",group="{group}",stream="{stream}"}} '
    for line in cluster.metrics(node).splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


@pytest.mark.integration
def test_node_with_a_foreign_certificate_never_joins(
    tls_cluster: LocalCluster, good: CertSet, rogue: CertSet
) -> None:
    """n2 restarts with a certificate of another CA (it still trusts the cluster CA): the
    others commit new messages without it, its stream replica gets none of them and it
    stays offline to them (its Raft traffic and theirs are refused at the handshake)."""
    client = good.clients["client"]
    ok = {"tls_ca": good.ca, "tls_cert": client.cert, "tls_key": client.key}
    group = "S:$G:ROGUE"

    async def publish(count: int) -> None:
        js = await _connect([tls_cluster.addr("n1"), tls_cluster.addr("n3")], **ok)
        try:
            for i in range(count):
                await js.publish(f"rogue.{i}", b"x")
        finally:
            await js.close()

    async def create() -> None:
        js = await _connect(tls_cluster.servers, **ok)
        try:
            await js.add_stream(StreamConfig(name="ROGUE", subjects=("rogue.>",), num_replicas=3))
        finally:
            await js.close()

    asyncio.run(create())
    asyncio.run(publish(2))
    _wait(tls_cluster, "n2 to store 2", lambda: _stored(tls_cluster, "n2", group) == 2 or None)

    tls_cluster.kill("n2")
    tls_cluster.tls["n2"] = _files(rogue, "n2", ca=good.ca)
    tls_cluster.start("n2")
    # Up again with its replica. It holds at most the 2 messages: what it applies after a
    # restart depends on the commit index it learns (Raft does not require it durable), and
    # it cannot learn anything from the others any more.
    _wait(
        tls_cluster,
        "rogue n2 running its replica",
        lambda: _stored(tls_cluster, "n2", group) is not None or None,
    )
    asyncio.run(publish(3))
    leader = tls_cluster.stream_leader("ROGUE")
    assert leader in ("n1", "n3")

    def n3_current_n2_behind() -> bool | None:
        info = tls_cluster.cluster_info(str(leader))
        if info is None:
            return None
        for g in info.groups:
            if g.stream == "ROGUE":
                reps = {r.name: r for r in g.group.replicas}
                other = "n3" if leader == "n1" else "n1"
                if reps[other].current and not reps["n2"].current:
                    return True
        return None

    _wait(tls_cluster, "the good follower caught up", n3_current_n2_behind)
    stored = _stored(tls_cluster, "n2", group)
    assert stored is not None and stored <= 2  # nothing of the 3 new messages reached it

    def n2_offline() -> bool | None:
        info = tls_cluster.cluster_info(str(leader))
        nodes = {n.name: n.online for n in info.nodes} if info is not None else {}
        return True if nodes.get("n2") is False else None

    _wait(tls_cluster, "n2 reported offline by the leader", n2_offline)


def _stored(cluster: LocalCluster, node: str, group: str) -> float | None:
    try:
        return _metric(cluster, node, "raftstream_stream_messages", group)
    except OSError:
        return None
