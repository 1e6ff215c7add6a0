"""RaftHost.read_index: linearizable read points (ReadIndex, Raft thesis §6.4), over the
in-memory twins.

Properties: a read on the leader resolves to an index at least the last acknowledged write's,
only once this replica applied it; a leader cut off from its peers (deposed, or about to be)
never resolves a read (it fails or times out, so a caller cannot serve stale data); a
follower's read is forwarded to the leader and resolves once the follower applied the
leader's index; pending reads are bounded and fail when their group is removed.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from raftstream.raft.errors import (
    DeadlineExceededError,
    LimitError,
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
)
from raftstream.raft.host import RaftHost
from tests.support.polling import until
from tests.support.raft_hosts import (
    CFG,
    NODES,
    elected,
    run,
    start_memory_cluster,
    stop_all,
)

# What a replica that cannot confirm its leadership answers instead of a read point.
REFUSED = (NotLeaderError, NoLeaderError, DeadlineExceededError)


async def applied_when_resolved(host: RaftHost, group: str, read: asyncio.Future[int]) -> int:
    """The replica's applied index at the moment ``read`` resolved (checked in a callback,
    so nothing can apply in between)."""
    seen: list[int] = []
    read.add_done_callback(lambda _: seen.append(host.status(group).applied))
    await read
    return seen[0]


def test_a_leader_read_resolves_after_the_acknowledged_write_is_applied() -> None:
    async def scenario() -> None:
        _, hosts, machines = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"w1")
            written = hosts[lead].status("a").applied
            read = asyncio.ensure_future(hosts[lead].read_index("a", timeout_ms=5_000))
            applied = await applied_when_resolved(hosts[lead], "a", read)
            assert read.result() >= written
            assert applied >= read.result()
            assert machines[lead].applied["a"] == [b"w1"]
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_cut_off_leader_never_answers_a_read() -> None:
    async def scenario() -> None:
        net, hosts, machines = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"old")
            net.set_down(lead, True)  # as after a pause: the others elect a new leader
            # Asked at once, while it still believes it leads: no quorum confirms it.
            with pytest.raises(REFUSED):
                await hosts[lead].read_index("a", timeout_ms=3_000)
            rest = {n: h for n, h in hosts.items() if n != lead}
            new = await elected(rest, "a")
            await rest[new].propose("a", b"new")
            with pytest.raises(REFUSED):
                await hosts[lead].read_index("a", timeout_ms=1_000)
            assert machines[lead].applied["a"] == [b"old"]  # it would have answered stale
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_follower_read_is_forwarded_and_waits_for_its_own_apply() -> None:
    async def scenario() -> None:
        _, hosts, machines = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            follower = next(n for n in NODES if n != lead)
            await until(lambda: hosts[follower].leader("a") == lead)
            await hosts[lead].propose("a", b"w1")
            written = hosts[lead].status("a").applied
            read = asyncio.ensure_future(hosts[follower].read_index("a", timeout_ms=5_000))
            applied = await applied_when_resolved(hosts[follower], "a", read)
            assert read.result() >= written
            assert applied >= read.result()
            assert machines[follower].applied["a"] == [b"w1"]
        finally:
            await stop_all(hosts)

    run(scenario)


def test_pending_reads_are_bounded_and_fail_when_the_group_is_removed() -> None:
    async def scenario() -> None:
        net, hosts, _ = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            host = hosts[lead]
            host.config = dataclasses.replace(CFG, reads_pending_max=1)
            net.set_down(lead, True)  # nothing can confirm the read: it stays pending
            read = asyncio.ensure_future(host.read_index("a", timeout_ms=60_000))
            with pytest.raises(LimitError):
                host.read_index("a")
            await asyncio.sleep(0.05)  # the driver hands the read to the core
            await host.remove_group("a")
            with pytest.raises((NotFoundError, NotLeaderError, NoLeaderError)):
                await read
            assert host.reads_pending == 0
        finally:
            await stop_all(hosts)

    run(scenario)
