"""Integration: with ``[auth]``, a mirror reads its same-cluster origin as the node acting
for the stream's account (its node token, docs/security.md): the copy completes although the
link is no user of that account. One node, one account (issue 7 with issue 10's auth).

The same node also sources an INTEREST origin (the link's explicitly acked pull consumer):
every message is copied once, and the origin keeps each message until its own consumer acked
it too (the link's acks do not remove what another consumer still needs)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

import raftstream
from raftstream.cluster.security.auth import hash_secret
from raftstream.config import StreamSource
from tests.support.cluster import LocalCluster, run, running
from tests.support.mirrors import settled

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROUNDS = 4  # bcrypt cost: low, the test checks behaviour
MSGS = 30
SETTLE_TIMEOUT_S = 60.0


def _auth_toml() -> str:
    alice, admin = hash_secret("alice-pw", rounds=ROUNDS), hash_secret("admin-pw", rounds=ROUNDS)
    return f"""
[auth.accounts.A]
[auth.accounts."$SYS"]

[[auth.users]]
user = "alice"
password = "{alice}"
account = "A"

[[auth.users]]
user = "admin"
password = "{admin}"
account = "$SYS"
"""


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    raw = base64.b64encode(b"admin:admin-pw").decode()
    c = LocalCluster(1, auth=_auth_toml(), client_metadata=(("authorization", f"Basic {raw}"),))
    with running(c, lines=30):
        yield c


async def _interest_origin(js: raftstream.Client) -> None:
    await js.add_stream(
        raftstream.StreamConfig(name="INT", subjects=("i.>",), retention="interest")
    )
    await js.add_consumer("INT", raftstream.ConsumerConfig(durable_name="C"))
    await js.add_stream(raftstream.StreamConfig(name="SRC", sources=(StreamSource(name="INT"),)))

    async def link_ready() -> bool:  # C and the link's own pull consumer
        return len(await js.consumer_names("INT")) == 2

    await settled(link_ready, "the link's consumer on INT")
    for i in range(MSGS):
        await js.publish(f"i.{i % 3}", b"%d" % i)

    async def sourced() -> bool:
        return (await js.stream_info("SRC")).state.messages == MSGS

    await settled(sourced, f"SRC holds all {MSGS} messages")
    copies = [await js.get_msg("SRC", seq) for seq in range(1, MSGS + 1)]
    assert [m.headers["Nats-Stream-Source"] for m in copies] == [
        f"INT {i + 1}" for i in range(MSGS)
    ]
    # C has not acked anything: the interest origin still holds every message.
    assert (await js.stream_info("INT")).state.messages == MSGS


def test_a_mirror_copies_its_origin_under_auth(cluster: LocalCluster) -> None:
    async def body() -> None:
        js = await raftstream.connect(
            servers=cluster.servers, timeout=20, user="alice", password="alice-pw"
        )
        try:
            await js.add_stream(raftstream.StreamConfig(name="ORIG", subjects=("o.>",)))
            await js.add_stream(
                raftstream.StreamConfig(name="MIR", mirror=StreamSource(name="ORIG"))
            )
            for i in range(MSGS):
                await js.publish("o.x", b"%d" % i)

            async def copied() -> bool:
                info = await js.stream_info("MIR")
                return info.state.last_seq == MSGS

            await settled(copied, f"MIR holds all {MSGS} messages")
            info = await js.stream_info("MIR")
            assert info.mirror is not None and info.mirror.error is None
            last = await js.get_msg("MIR", MSGS)
            assert last.data == b"%d" % (MSGS - 1)
            await _interest_origin(js)
        finally:
            await js.close()

    run(body())
