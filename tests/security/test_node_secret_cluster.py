"""A 3-node ``[auth]`` cluster without TLS whose node tokens are keyed by a
``node_secret_file`` (docs/security.md, "Threat model and review").

The node-to-node services then want the node token: this checks that the nodes' own calls
carry it everywhere they must. Raft (the cluster elects, replicates an R3 stream), and the
repair after data loss (a node whose Raft data is damaged asks its peers, through any of
them, to take it out of its groups and add it back: RepairNode and ReportCleared are
forwarded to the meta leader with the node token). The token a reader of the config could
derive from its hashes is refused.
"""

from __future__ import annotations

import base64
import random
import tomllib
from collections.abc import Iterator

import grpc
import pytest

import raftstream
from raftstream.chaos.nemesis import corrupt_file
from raftstream.cluster.security.auth import hash_secret, node_token, parse_auth
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from tests.support.cluster import LocalCluster, run, running
from tests.support.polling import wait_for

pytestmark = pytest.mark.integration

PASSWORD = "ops-pw"
MESSAGES = 20
REPAIR_WAIT_S = 120.0


def _auth_toml(secret_path: str) -> str:
    return f"""
[auth]
node_secret_file = "{secret_path}"

[auth.accounts.A]

[[auth.users]]
user = "ops"
password = "{hash_secret(PASSWORD, rounds=4)}"
account = "A"
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    raw = base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    c = LocalCluster(3, client_metadata=(("authorization", f"Basic {raw}"),))
    secret = c.root / "node-secret"
    secret.write_text(base64.b64encode(random.randbytes(32)).decode())
    secret.chmod(0o600)
    c.auth = _auth_toml(str(secret))
    with running(c):
        yield c


def test_a_damaged_node_is_repaired_under_auth_with_a_node_secret(cluster: LocalCluster) -> None:
    """Raft carries the node token (an R3 stream takes messages); the config-derived token
    is refused by RepairNode; n3, its Raft data truncated, is repaired by its peers (its
    repair calls carry the secret's token) and serves again as a meta voter."""

    async def publish() -> None:
        js = await raftstream.connect(cluster.servers, timeout=20, user="ops", password=PASSWORD)
        try:
            await js.add_stream(name="R3", subjects=["r3.>"], num_replicas=3)
            for i in range(MESSAGES):
                await js.publish("r3.x", f"m{i}".encode(), msg_id=f"m{i}")
        finally:
            await js.close()

    run(publish())
    derived = parse_auth(_plain_section(cluster))
    forged = (("authorization", f"Bearer {node_token(derived, 'A')}"),)
    with grpc.insecure_channel(cluster.addr("n1")) as ch:
        with pytest.raises(grpc.RpcError) as err:
            rpbg.RepairServiceStub(ch).RepairNode(
                rpb.RepairNodeRequest(node="n3", repair_id="evil"), metadata=forged, timeout=10
            )
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED

    cluster.kill("n3")
    corrupt_file(cluster.root / "n3" / "raft" / "data.mdb", random.Random(7), mode="truncate")
    cluster.start("n3")
    log = cluster.root / "n3.log"
    wait_for(
        "n3 repaired",
        lambda: "repaired: serving again" in log.read_text(errors="replace") or None,
        REPAIR_WAIT_S,
    )

    def n3_voter() -> bool | None:
        info = cluster.cluster_info("n1")
        voters = {n.name for n in info.nodes if n.voter} if info is not None else set()
        return True if voters == {"n1", "n2", "n3"} else None

    wait_for("n3 a meta voter again", n3_voter, REPAIR_WAIT_S)


def _plain_section(cluster: LocalCluster) -> dict[str, object]:
    """The cluster's [auth] section without its node_secret_file: what the hashes alone
    would key node tokens with."""
    table = tomllib.loads(cluster.auth or "")["auth"]
    return {k: v for k, v in table.items() if k != "node_secret_file"}
