"""A stream's replicas on a real cluster (``tests.support.cluster``): publishing numbered
messages with msg ids, waiting for the replica set a membership change should give, moving
the leadership to a node and reading every message from it, and the nodes cluster info
marks removed. Every call retries while the cluster is electing (``retry_async``)."""

from __future__ import annotations

from typing import Any

import raftstream
from tests.support.polling import NeverHappened, retry_async, until

__all__ = [
    "lead_and_read_all",
    "publish_numbered",
    "removed_nodes",
    "replicas",
    "wait_replica_count",
    "wait_replicas",
]


async def publish_numbered(js: raftstream.Client, stream: str, start: int, count: int) -> None:
    """Messages ``start`` .. ``start + count - 1`` (data ``b"<i>"``, msg id ``m<i>``) on
    ``<stream>.x``, each retried with the same id until acknowledged."""
    for i in range(start, start + count):
        await retry_async(lambda i=i: js.publish(f"{stream.lower()}.x", b"%d" % i, msg_id=f"m{i}"))


async def replicas(js: raftstream.Client, stream: str) -> set[str]:
    """The stream's leader and CURRENT replicas (caught up, in the Raft group)."""
    info = await js.stream_info(stream)
    c = info.cluster
    if c is None or c.leader is None:
        return set()
    return {c.leader, *(r.name for r in c.replicas if r.current)}


async def wait_replicas(js: raftstream.Client, stream: str, want: set[str]) -> None:
    async def check() -> None:
        got = await replicas(js, stream)
        if got != want:
            raise AssertionError(f"replicas {sorted(got)}, want {sorted(want)}")

    await retry_async(check)


async def wait_replica_count(js: raftstream.Client, stream: str, count: int) -> set[str]:
    async def check() -> set[str]:
        got = await replicas(js, stream)
        if len(got) != count:
            raise AssertionError(f"replicas {sorted(got)}, want {count}")
        return got

    result: set[str] = await retry_async(check)
    return result


async def lead_and_read_all(js: raftstream.Client, stream: str, node: str, total: int) -> None:
    """Make ``node`` the leader, then read every message from its store."""

    async def move() -> None:
        info = await js.stream_info(stream)
        if info.cluster is None or info.cluster.leader != node:
            await js.stream_leader_stepdown(stream, preferred=node)
            raise AssertionError("leadership moving")

    await retry_async(move)
    info = await retry_async(lambda: js.stream_info(stream))
    assert info.cluster is not None and info.cluster.leader == node
    assert info.state.messages == total
    for seq in range(1, total + 1):
        m = await retry_async(lambda seq=seq: js.get_msg(stream, seq))
        assert m.data == b"%d" % (seq - 1)


async def removed_nodes(js: Any, expect: str, wait_s: float = 10.0) -> set[str]:
    """The nodes cluster info marks removed, once ``expect`` is among them (the answering
    node applies the meta log a moment after the leader), or as they are after ``wait_s``."""

    async def removed() -> set[str]:
        info = await retry_async(js.cluster_info)
        return {n.name for n in info.nodes if n.removed}

    try:
        found: set[str] = await until(
            removed,
            what=f"{expect} marked removed",
            accept=lambda names: expect in names,
            timeout_s=wait_s,
            interval_s=0.1,
        )
    except NeverHappened:
        return await removed()
    return found
