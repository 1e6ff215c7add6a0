"""Integration: placement by tags uses every node's own description (issue 5).

Issue 5: the meta leader "places replicas (fewest assets and most free space first;
placement.tags)". Tags live in each node's own config, so the meta leader learns the other
nodes' tags from their descriptions (cluster/meta/descriptions.py); before that, a tagged stream
could only land on the meta leader itself. The cluster runs with ``[auth]`` and ``[tls]``:
nodes ask each other for descriptions over mutual TLS with a node token (docs/security.md).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import raftstream
from raftstream import Placement, StreamConfig
from raftstream.cli.app import cli
from raftstream.cluster.security.auth import hash_secret
from raftstream.errors import InvalidArgumentError
from raftstream.models import StreamInfo
from raftstream.tooling.certs import generate
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import retry_async, wait_for

pytestmark = pytest.mark.integration

TAGS = {"n1": ["ssd"], "n2": ["hdd"], "n3": ["az1", "hdd"]}  # sorted, as configs keep them
ROUNDS = 4  # bcrypt cost: low, the test checks behaviour
USERS = {"alice": ("alice-pw", "A"), "admin": ("admin-pw", "$SYS")}


def _auth_toml() -> str:
    text = '[auth.accounts.A]\n[auth.accounts."$SYS"]\n'
    for user, (password, account) in USERS.items():
        hashed = hash_secret(password, rounds=ROUNDS)
        text += f'\n[[auth.users]]\nuser = "{user}"\npassword = "{hashed}"\naccount = "{account}"\n'
    return text


@pytest.fixture
def tagged(tmp_path: Path) -> Iterator[LocalCluster]:
    certs = generate(tmp_path, nodes=list(TAGS), clients=["client"])
    client = certs.clients["client"]
    basic = base64.b64encode(b"admin:admin-pw").decode()
    c = LocalCluster(
        3,
        tags=TAGS,
        tls={n: (certs.ca, certs.nodes[n].cert, certs.nodes[n].key) for n in TAGS},
        client_tls=(certs.ca, client.cert, client.key),
        auth=_auth_toml(),
        client_metadata=(("authorization", f"Basic {basic}"),),
    )
    with running(c):
        yield c


def _hosts(info: StreamInfo) -> set[str]:
    cl = info.cluster
    if cl is None or cl.leader is None:
        return set()
    return {cl.leader, *(r.name for r in cl.replicas)}


def _described_by(c: LocalCluster, name: str) -> bool | None:
    """True once ``name``'s cluster info carries every node's tags (its prober heard all)."""
    info = c.cluster_info(name)
    if info is None:
        return None
    got = {n.name: list(n.tags) for n in info.nodes if n.described and n.free_bytes > 0}
    return True if got == TAGS else None


def test_tagged_streams_land_on_the_tagged_nodes_not_the_meta_leader(
    tagged: LocalCluster,
) -> None:
    """An R1 stream with placement.tags=["ssd"] lands on n1, the only ssd node, while n1 is
    NOT the meta leader; an R2 with "hdd" lands on exactly n2 and n3; a tag no node carries
    is refused naming num_replicas. Cluster info and `raftstream cluster info` show tags."""
    c = tagged

    tls = c.client_tls
    assert tls is not None
    ca, cert, key = tls

    async def connect(user: str) -> raftstream.Client:
        password = USERS[user][0]
        return await raftstream.connect(
            servers=c.servers,
            timeout=15,
            tls_ca=ca,
            tls_cert=cert,
            tls_key=key,
            user=user,
            password=password,
        )

    async def body() -> None:
        if c.wait_meta_leader() == "n1":
            admin = await connect("admin")  # a meta step-down is for $SYS users
            try:
                await admin.meta_leader_stepdown(preferred="n2")
            finally:
                await admin.close()
        js = await connect("alice")
        try:
            leader = wait_for("a meta leader other than n1", lambda: _not_n1(c))
            wait_for(f"{leader} heard every node's description", lambda: _described_by(c, leader))
            ssd = await js.add_stream(
                StreamConfig(name="FAST", subjects=("fast.>",), placement=Placement(tags=("ssd",)))
            )
            assert ssd.cluster is not None
            await js.add_stream(
                StreamConfig(
                    name="BULK",
                    subjects=("bulk.>",),
                    num_replicas=2,
                    placement=Placement(tags=("hdd",)),
                )
            )
            with pytest.raises(InvalidArgumentError) as e:
                await js.add_stream(
                    StreamConfig(
                        name="NONE", subjects=("none.>",), placement=Placement(tags=("nvme",))
                    )
                )
            assert e.value.details["field"] == "placement.tags"  # no node has the tag
            fast = await _settled(js, "FAST", 1)
            bulk = await _settled(js, "BULK", 2)
            assert fast == {"n1"}
            assert bulk == {"n2", "n3"}
        finally:
            await js.close()

    run(body())
    args = ["cluster", "info", "-s", ",".join(c.servers), "--user", "alice"]
    args += ["--password", "alice-pw", "--tls-ca", str(ca), "--tls-cert", str(cert)]
    out = CliRunner().invoke(cli, [*args, "--tls-key", str(key)])
    assert out.exit_code == 0, out.output
    rows = {line.split()[0]: line for line in out.output.splitlines() if line[:2] in TAGS}
    assert " ssd " in rows["n1"] and " az1,hdd " in rows["n3"]


def _not_n1(c: LocalCluster) -> str | None:
    leader = c.wait_meta_leader()
    return leader if leader != "n1" else None


async def _settled(js: raftstream.Client, stream: str, replicas: int) -> set[str]:
    """The nodes hosting ``stream`` once its group has a leader and all its replicas."""

    async def hosts() -> set[str]:
        got = _hosts(await js.stream_info(stream))
        if len(got) != replicas:
            raise AssertionError(f"stream {stream} on {sorted(got)}, not yet {replicas}")
        return got

    result: set[str] = await retry_async(hosts)
    return result
