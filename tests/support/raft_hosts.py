"""RaftHost helpers: three hosts in one process over the in-memory twins (MemoryNetwork,
MemoryLogStorage), each group applied to a ``ListMachine``; elections and waits poll
(``tests.support.polling.until``), and ``run`` bounds a whole scenario.

``run_simulated`` runs a scenario on simulated time (``tests.support.simloop``), for a test
that asserts that nothing happened for a while: on a loaded machine a real clock lets a
tick come late and a peer look silent; on simulated time every timer runs when it is due
and the run is the same every time. Its hosts write on the event loop
(``start_memory_cluster(..., simulated=True)``: an ``InlineLane``, no thread, whose work
would not be waited for by a loop that jumps time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.lanes import InlineLane
from raftstream.raft.storage import GroupWrite, LogStorage, MemoryLogStorage
from raftstream.raft.transport import MemoryNetwork, MemoryTransport, Transport
from raftstream.raft.types import Entry, Message, MessageType, Role
from tests.support.polling import until
from tests.support.simloop import SimLoop, close_loop

__all__ = [
    "CFG",
    "NODES",
    "STALL_CFG",
    "ListMachine",
    "PermitStorage",
    "acks_waiting",
    "elected",
    "leader_of",
    "run",
    "run_simulated",
    "start_hosts",
    "start_memory_cluster",
    "start_stalling_hosts",
    "stop_all",
]

NODES = ("n1", "n2", "n3")
S = TypeVar("S", bound=MemoryLogStorage)
CFG = HostConfig(
    tick_ms=20, election_tick=10, heartbeat_tick=1, liveness_ticks=5, snapshot_entries=1_000_000
)


class ListMachine:
    """Appends every command to a list per group; a snapshot is the list as JSON."""

    def __init__(self) -> None:
        self.applied: dict[str, list[bytes]] = {}
        self.restores = 0

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]:
        log = self.applied.setdefault(group, [])
        out = []
        for e in entries:
            log.append(e.data)
            out.append(len(log))
        return out

    def snapshot(self, group: str) -> bytes:
        return json.dumps([d.decode() for d in self.applied.get(group, [])]).encode()

    def restore(self, group: str, data: bytes) -> None:
        self.restores += 1
        self.applied[group] = [d.encode() for d in json.loads(data)]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout=120)

    asyncio.run(bounded())


def leader_of(hosts: dict[str, RaftHost], group: str) -> str | None:
    leaders = [
        n for n, h in hosts.items() if group in h.groups() and h.status(group).role == Role.LEADER
    ]
    return leaders[0] if len(leaders) == 1 else None


async def elected(hosts: dict[str, RaftHost], group: str) -> str:
    await until(lambda: leader_of(hosts, group) is not None)
    lead = leader_of(hosts, group)
    assert lead is not None
    return lead


def run_simulated(scenario: Callable[[], Awaitable[None]]) -> None:
    """``run`` on simulated time (module docstring)."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), timeout=120)

    loop = SimLoop()
    try:
        loop.run_until_complete(bounded())
    finally:
        close_loop(loop)


def start_memory_cluster(
    groups: Sequence[str], *, simulated: bool = False
) -> tuple[MemoryNetwork, dict[str, RaftHost], dict[str, ListMachine]]:
    net = MemoryNetwork()
    hosts: dict[str, RaftHost] = {}
    machines: dict[str, ListMachine] = {}
    for n in NODES:
        storage: LogStorage = MemoryLogStorage()
        transport: Transport = MemoryTransport(n, net)
        lane = InlineLane() if simulated else None
        hosts[n] = RaftHost(n, storage=storage, transport=transport, config=CFG, lane=lane)
        machines[n] = ListMachine()
        hosts[n].start()
        for g in groups:
            hosts[n].add_group(g, voters=NODES, state_machine=machines[n])
    return net, hosts, machines


async def stop_all(hosts: dict[str, RaftHost]) -> None:
    for h in hosts.values():
        await h.stop()


def start_hosts(
    make_storage: Callable[[], S],
    cfg: HostConfig,
    *,
    machine: Callable[[], Any] = ListMachine,
    groups: Sequence[str] = ("a",),
    simulated: bool = False,
) -> tuple[dict[str, RaftHost], dict[str, S]]:
    """Three started hosts with ``groups`` on storages from ``make_storage``, each host's
    groups on one state machine from ``machine`` (``simulated``: writing on the loop, for
    ``run_simulated``)."""
    net = MemoryNetwork()
    hosts: dict[str, RaftHost] = {}
    stores: dict[str, S] = {}
    for n in NODES:
        stores[n] = make_storage()
        lane = InlineLane() if simulated else None
        transport = MemoryTransport(n, net)
        hosts[n] = RaftHost(n, storage=stores[n], transport=transport, config=cfg, lane=lane)
        hosts[n].start()
        sm = machine()
        for g in groups:
            hosts[n].add_group(g, voters=NODES, state_machine=sm)
    return hosts, stores


# Hosts whose storage the test stalls: elections slow enough that a stalled leader keeps its
# term, and every write on the writer thread (a write on the loop, as a following round's
# is, would stall the loop that all the hosts and the test share: host.py, "Following
# rounds write on the loop").
STALL_CFG = dataclasses.replace(
    CFG, election_tick=50, liveness_ticks=50, inline_follower_writes=False
)


def start_stalling_hosts(make_storage: Callable[[], S]) -> tuple[dict[str, RaftHost], dict[str, S]]:
    """``start_hosts`` on storages the test can stall (``STALL_CFG``)."""
    return start_hosts(make_storage, STALL_CFG)


def acks_waiting(host: RaftHost, index: int) -> set[str]:
    """The peers whose acknowledgement of ``index`` (or later) waits in ``host``'s inbox."""
    return {
        m.src
        for m in host._inbox
        if isinstance(m, Message) and m.type == MessageType.APPEND_RESP and m.index >= index
    }


class PermitStorage(MemoryLogStorage):
    """While ``metered``, each write waits (on the writer thread) for a permit the test
    releases: a disk the test steps one write at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.metered = False
        self.permits = threading.Semaphore(0)

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        if self.metered:
            self.permits.acquire()
        super().write_batch(writes)

    def unmeter(self) -> None:
        """Stop metering, and let a write waiting for its permit through."""
        self.metered = False
        self.permits.release()

    async def meter_when_settled(self, host: RaftHost, group: str) -> None:
        """Start metering once ``host`` has stored the commit index of all it applied: a
        tick's round writes it (host.py, "Commit index"), and metering before that stalled
        that write instead of the one the test steps (on a loaded machine: a CI flake)."""
        await until(lambda: self.log(group).hard_state().commit >= host.status(group).applied)
        self.metered = True
