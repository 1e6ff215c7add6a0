"""Integration: with ``[auth]``, a mirror reads its same-cluster origin as the node acting
for the stream's account (its node token, docs/security.md): the copy completes although the
link is no user of that account. One node, one account (issue 7 with issue 10's auth)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import pytest

import raftstream
from raftstream.cluster.auth import hash_secret
from raftstream.config import StreamSource

from .node_harness import LocalCluster, retry_async, run

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
    try:
        c.start_all()
        yield c
    except BaseException:
        print(c.tails())
        raise
    finally:
        c.close()


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

            deadline = asyncio.get_running_loop().time() + SETTLE_TIMEOUT_S
            while not await retry_async(copied):
                info = await js.stream_info("MIR")
                assert asyncio.get_running_loop().time() < deadline, f"not copied: {info}"
                await asyncio.sleep(0.1)
            info = await js.stream_info("MIR")
            assert info.mirror is not None and info.mirror.error is None
            last = await js.get_msg("MIR", MSGS)
            assert last.data == b"%d" % (MSGS - 1)
        finally:
            await js.close()

    run(body())
