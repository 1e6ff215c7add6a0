"""The whole-node simulator (the VOPR idea, TigerBeetle's, in Python): N nodes' real Raft
hosts, meta groups and stream groups (a stream and its consumers, defined through the meta
group) in one process, on one simulated clock, one seed driving everything.

``Simulation(seed, workdir).run()`` plays one run and returns its ``Report``; a run that
breaks a rule raises ``SimulationFailed``, whose message starts with the seed to replay
(``python -m tests.vopr --seed N``). The same seed always plays the same run.

A run has three phases:

0. **Definitions**: the workload's stream and consumers are created through the meta
   leader.
1. **Faults** (``fault_s``): clients publish, fetch and ack, a reader reads the stream's
   state as the servicers do (each read must see every publish acked before it), and an
   admin client creates and deletes streams and consumers (``admin.py``), while a nemesis
   crashes and restarts nodes (a crash drops the writes not yet done), cuts the power of several at
   the same instant, cuts links (partitions, one-way ones, a node isolated, the leader
   isolated), makes wall clocks jump, and moves leadership; the network drops, duplicates,
   delays and reorders; disks are slow and fail writes (EIO, ENOSPC: the host stops, the
   node is restarted). Each node's clocks drift.
2. **Heal** (``heal_s``): every fault ends and every node runs; the clients go on.
3. **Quiet**: the clients stop, every replica must catch up, and the end checks run. Then
   the leader of the idle (quiesced) group is killed: another must be elected and take a
   publish, and after the old leader's restart everything is checked again.

The Raft checks run every few simulated milliseconds on the stream group and the meta group
(``checkers.RaftChecker``); the clients check every PubAck and delivery as it comes
(``workload.History``); the definitions are checked at the end (``admin.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.meta.group import META_GROUP
from raftstream.errors import RaftStreamError
from raftstream.raft.host import HostConfig
from raftstream.raft.types import Role
from tests.support.simloop import SimLoop, SimStuckError, close_loop

from .admin import Definitions, admin_client, define_workload, definition_checks, meta_converged
from .checkers import RaftChecker, final_checks
from .disk import DiskParams, SimDisk
from .net import NetParams, SimNetwork
from .node import SimClock, SimNode
from .workload import (
    CALL_TIMEOUT_S,
    ClientParams,
    Clients,
    History,
    consumer_client,
    publisher,
    reader,
)

__all__ = ["Report", "SimParams", "Simulation", "SimulationFailed"]

GROUP = stream_group_id("$G", "Q")
CHECK_EVERY_S = 0.02
CONVERGE_S_MAX = 30.0
ELECT_S_MAX = 10.0


class SimulationFailed(AssertionError):
    """A run broke a rule; the message starts with ``--seed N``."""


@dataclass(frozen=True)
class SimParams:
    """Everything about a run that the seed chooses."""

    nodes: int
    host: HostConfig
    net: NetParams
    disk: DiskParams
    clients: ClientParams
    fault_s: float
    heal_s: float
    nemesis_every_s: float
    drift_max: float  # a node's clocks run at 1 +- this

    @classmethod
    def from_rng(cls, rng: random.Random) -> SimParams:
        tick_ms = rng.choice((20, 50, 100))
        return cls(
            nodes=rng.choice((3, 3, 5)),
            host=HostConfig(
                tick_ms=tick_ms,
                election_tick=rng.choice((6, 10)),
                proposal_timeout_ms=2_000,
                snapshot_entries=rng.choice((16, 64, 10_000)),
                snapshot_log_bytes_min=1024,
                inline_follower_writes=rng.random() < 0.8,
                lazy_linger_ms=min(tick_ms, rng.choice((0, 5, 20, 50, 100))),
            ),
            net=NetParams.from_rng(rng),
            disk=DiskParams.from_rng(rng),
            clients=ClientParams.from_rng(rng),
            fault_s=rng.uniform(2.0, 4.0),
            heal_s=2.0,
            nemesis_every_s=rng.choice((0.1, 0.3, 0.6)),
            drift_max=rng.choice((0.0, 0.001, 0.01)),
        )


@dataclass
class Report:
    seed: int
    params: SimParams
    simulated_s: float = 0.0
    wall_s: float = 0.0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    raft_checks: int = 0
    entries_compared: int = 0
    end_checks: int = 0

    def digest(self) -> str:
        """What must be the same when the seed is replayed (not the wall time)."""
        text = repr((self.simulated_s, sorted(self.faults.items()), sorted(self.counts.items())))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


Mutation = Callable[[], contextlib.AbstractContextManager[Any]]


class Simulation:
    """One seeded run (module docstring). ``workdir`` holds the nodes' LMDB stores; it is
    removed at the end."""

    def __init__(self, seed: int, workdir: Path, *, params: SimParams | None = None) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self.params = params or SimParams.from_rng(random.Random(self._rng.getrandbits(64)))
        self._workdir = workdir
        self.report = Report(seed, self.params)
        self.history = History()
        self._checker = RaftChecker(GROUP)
        self._meta_checker = RaftChecker(META_GROUP)
        self.definitions = Definitions()
        self._faulty = True
        self._restarts: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- running ------------------------------------------------------------------------

    def run(self) -> Report:
        loop = SimLoop()
        started = time.perf_counter()
        try:
            loop.run_until_complete(self._main())
        except SimulationFailed:
            raise
        except (SimStuckError, RaftStreamError, AssertionError, RuntimeError) as exc:
            raise SimulationFailed(f"--seed {self.seed}: {type(exc).__name__}: {exc}") from exc
        finally:
            self.report.simulated_s = round(loop.time(), 6)
            self.report.wall_s = time.perf_counter() - started
            close_loop(loop)
            shutil.rmtree(self._workdir, ignore_errors=True)
        return self.report

    def _fail(self, what: list[str]) -> None:
        if what:
            self.history.violations += what
            shown = "; ".join(what[:5])
            raise SimulationFailed(
                f"--seed {self.seed}: {shown} (at {asyncio.get_running_loop().time():.3f} s)"
            )

    async def _main(self) -> None:
        p = self.params
        self._net = SimNetwork(random.Random(self._rng.getrandbits(64)), p.net)
        self._nodes = self._make_nodes()
        try:
            for node in self._nodes.values():
                await self._start(node)
            # The workload's stream and consumers, defined through the meta group.
            await define_workload(self._nodes, p.clients.consumers)
            clients = Clients(
                random.Random(self._rng.getrandbits(64)),
                p.clients,
                self._nodes,
                GROUP,
                self.history,
                lambda: self._faulty,
            )
            self._spawn(self._monitor())
            self._spawn(self._check_loop())
            workers = (
                [self._spawn(publisher(clients, i)) for i in range(p.clients.publishers)]
                + [
                    self._spawn(consumer_client(clients, f"C{i}"))
                    for i in range(p.clients.consumers)
                ]
                + [self._spawn(reader(clients))]
            )
            admin = self._spawn(
                admin_client(
                    self._nodes,
                    random.Random(self._rng.getrandbits(64)),
                    self.definitions,
                    p.nemesis_every_s * 1.5,
                )
            )
            await self._nemesis(p.fault_s)
            admin.cancel()
            await self._heal()
            await asyncio.sleep(p.heal_s)
            clients.stopping = True
            await self._settle(workers)
            for t in list(clients.background):
                t.cancel()
            await self._end_checks()
            await self._quiescent_leader_dies(clients)
            await self._end_checks()
        finally:
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for node in self._nodes.values():
                await node.close()
        self.report.counts.update(self.history.counts)
        self.report.counts.update({f"define {k}": v for k, v in self.definitions.counts.items()})
        self.report.raft_checks = self._checker.checks + self._meta_checker.checks
        self.report.entries_compared = (
            self._checker.entries_compared + self._meta_checker.entries_compared
        )

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        return task

    def _make_nodes(self) -> dict[str, SimNode]:
        p = self.params
        names = tuple(f"n{i}" for i in range(1, p.nodes + 1))
        nodes = {}
        for name in names:
            rng = random.Random(self._rng.getrandbits(64))
            drift = 1 + rng.uniform(-p.drift_max, p.drift_max)
            nodes[name] = SimNode(
                name,
                rng=rng,
                disk=SimDisk(random.Random(rng.getrandbits(64)), p.disk),
                net=self._net,
                clock=SimClock(drift, rng.uniform(0, 1000)),
                host_config=p.host,
                peers=names,
                store_dir=self._workdir / name,
            )
        return nodes

    # -- background work --------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Each node's monitor (cluster/node/monitor.py), and the restart of a host that failed."""
        tick_s = self.params.host.tick_ms / 1000
        while True:
            for node in self._nodes.values():
                if node.host is None:
                    continue
                if node.host.failure is not None:
                    self.report.faults["host failed (disk error)"] += 1
                    await node.crash()
                    self._restart_later(node, 0.05)
                    continue
                for group in (GROUP, META_GROUP):
                    st = node.status(group)
                    if st is not None and st.halted:
                        self._fail([f"{node.name}: {group} halted (a failed apply or step)"])
                node.monitor()
            await asyncio.sleep(tick_s)

    async def _check_loop(self) -> None:
        while True:
            self._fail(self._checker.check(list(self._nodes.values())))
            self._fail(self._meta_checker.check(list(self._nodes.values())))
            await asyncio.sleep(CHECK_EVERY_S)

    async def _start(self, node: SimNode) -> None:
        """Start ``node``; a start whose first write fails (EIO, ENOSPC on a faulty disk)
        leaves it down, to be started again shortly, as a supervisor would."""
        try:
            await node.start()
        except (OSError, RaftStreamError):
            self.report.faults["start failed (disk error)"] += 1
            await node.crash()
            self._restart_later(node, 0.05)

    def _restart_later(self, node: SimNode, delay_s: float) -> None:
        if node.name in self._restarts:
            return

        def due() -> None:
            self._restarts.pop(node.name, None)
            if node.host is None:
                self._spawn(self._start(node))

        self._restarts[node.name] = asyncio.get_running_loop().call_later(delay_s, due)

    # -- faults -------------------------------------------------------------------------------

    async def _nemesis(self, duration_s: float) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + duration_s
        rng = random.Random(self._rng.getrandbits(64))
        names = sorted(self._nodes)
        while loop.time() < end:
            await asyncio.sleep(rng.uniform(0, 2 * self.params.nemesis_every_s))
            kind = rng.choice(
                (
                    "crash",
                    "crash",
                    "power loss",
                    "partition",
                    "one-way",
                    "isolate leader",
                    "heal network",
                    "clock jump",
                    "transfer",
                    "transfer",
                    "nothing",
                )
            )
            self.report.faults[kind] += 1
            if kind == "crash":
                node = self._nodes[rng.choice(names)]
                await self._writes_in_flight(rng, [node])
                await node.crash()
                self._restart_later(node, rng.uniform(0.05, 1.5))
            elif kind == "power loss":
                # Several nodes at the same instant (a rack, a data centre): every write
                # not yet done on any of them is lost at once.
                hit = rng.sample(names, rng.randrange(2, len(names) + 1))
                await self._writes_in_flight(rng, [self._nodes[n] for n in hit])
                for name in hit:
                    self._nodes[name].cut_power()
                for name in hit:
                    await self._nodes[name].crash()
                    self._restart_later(self._nodes[name], rng.uniform(0.05, 1.0))
            elif kind == "partition":
                side = set(rng.sample(names, rng.randrange(1, len(names))))
                for a in side:
                    for b in set(names) - side:
                        self._net.cut(a, b)
                        self._net.cut(b, a)
            elif kind == "one-way":
                a, b = rng.sample(names, 2)
                self._net.cut(a, b)
            elif kind == "isolate leader":
                leader = self._leader()
                if leader is not None:
                    self._net.isolate(leader, names)
            elif kind == "heal network":
                self._net.heal()
            elif kind == "clock jump":
                jump_s = rng.choice((-1, 1)) * rng.uniform(0.1, 60)
                self._nodes[rng.choice(names)].clock.jump(jump_s)
            elif kind == "transfer":
                self._transfer(rng, names)

    async def _writes_in_flight(self, rng: random.Random, nodes: list[SimNode]) -> None:
        """Half the time, a crash waits (up to 50 ms) for a moment when one of ``nodes`` has
        writes in flight: the moments a crash can lose something, and the rarest."""
        if rng.random() < 0.5:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + 0.05
        while loop.time() < until and not any(n.writes_in_flight() for n in nodes):
            await asyncio.sleep(0.0005)

    def _transfer(self, rng: random.Random, names: list[str]) -> None:
        leader = self._leader()
        if leader is None:
            return
        host = self._nodes[leader].host
        to = rng.choice([n for n in names if n != leader])
        if host is not None:
            with contextlib.suppress(RaftStreamError):
                host.transfer_leadership(GROUP, to)

    def _leader(self) -> str | None:
        for node in self._nodes.values():
            st = node.status(GROUP)
            if st is not None and st.role == Role.LEADER:
                return node.name
        return None

    async def _heal(self) -> None:
        self._faulty = False
        self._net.faulty = False
        self._net.heal()
        for node in self._nodes.values():
            node.disk.faulty = False
            handle = self._restarts.pop(node.name, None)
            if handle is not None:
                handle.cancel()
            if node.host is None:
                await self._start(node)

    # -- the end ------------------------------------------------------------------------------

    async def _settle(self, workers: list[asyncio.Task[Any]]) -> None:
        """The clients' last calls end within their timeout; then every replica catches up."""
        done, pending = await asyncio.wait(workers, timeout=3 * CALL_TIMEOUT_S + 1)
        for t in done:
            t.result()  # a client's own bug surfaces here
        for t in pending:
            t.cancel()
        await self._converged()

    async def _converged(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONVERGE_S_MAX
        while loop.time() < deadline:
            sts = [n.status(GROUP) for n in self._nodes.values()]
            leaders = [s for s in sts if s is not None and s.role == Role.LEADER]
            if (
                all(s is not None for s in sts)
                and len(leaders) == 1
                and len({s.applied for s in sts if s is not None}) == 1
            ):
                return
            await asyncio.sleep(0.05)
        self._fail(
            [
                f"no convergence within {CONVERGE_S_MAX} s of healing: {self._statuses()}"
                f"; the leader's view: {self._follower_view()}"
            ]
        )

    def _follower_view(self) -> str:
        leader = self._leader()
        host = self._nodes[leader].host if leader is not None else None
        if host is None:
            return "none"
        commit, infos = host.followers(GROUP)
        logs = {
            n.name: (lg.last_index() if (lg := n.storage_log(GROUP)) else None)
            for n in self._nodes.values()
        }
        return f"commit {commit}, followers {infos}, last indexes {logs}"

    def _leader_group(self) -> Any:
        leader = self._leader()
        return self._nodes[leader].group(GROUP) if leader is not None else None

    def _statuses(self) -> str:
        out = []
        for n in self._nodes.values():
            st = n.status(GROUP)
            out.append(
                f"{n.name}: down"
                if st is None
                else f"{n.name}: {st.role.name} term {st.term} applied {st.applied}"
                + (" quiet" if st.quiet else "")
            )
        return ", ".join(out)

    async def _end_checks(self) -> None:
        self.report.end_checks += 1
        nodes = list(self._nodes.values())
        self._fail(self._checker.check(nodes))
        self._fail(self._meta_checker.check(nodes))
        self._fail(final_checks(nodes, GROUP, self.history))
        # The definitions: the same meta state everywhere, none lost or resurrected.
        self._fail(await meta_converged(nodes, CONVERGE_S_MAX))
        self._fail(definition_checks(nodes, self.definitions))
        self._fail(list(self.history.violations))
        # Then liveness: the leader's group serves (its barrier applied, its consumers'
        # leader copies built), as a node's clients need it to.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ELECT_S_MAX
        while not ((g := self._leader_group()) is not None and g.ready):
            if loop.time() > deadline:
                self._fail([f"the leader's stream group is not ready: {self._statuses()}"])
            await asyncio.sleep(0.02)

    async def _quiescent_leader_dies(self, clients: Clients) -> None:
        """The idle group's leader dies: another is elected and takes a publish."""
        loop = asyncio.get_running_loop()
        if self.params.host.quiesce:
            deadline = loop.time() + ELECT_S_MAX
            while loop.time() < deadline and not all(
                (st := n.status(GROUP)) is not None and st.quiet for n in self._nodes.values()
            ):
                await asyncio.sleep(0.05)
        leader = self._leader()
        if leader is None:
            self._fail([f"no leader in the quiet phase: {self._statuses()}"])
            return
        await self._nodes[leader].crash()
        self.report.faults["quiescent leader killed"] += 1
        deadline = loop.time() + ELECT_S_MAX
        while True:
            g = self._leader_group()
            if g is not None and g.ready:
                break
            if loop.time() > deadline:
                self._fail(
                    [
                        f"no new leader {ELECT_S_MAX} s after the quiescent leader {leader}"
                        f" died: {self._statuses()}"
                    ]
                )
            await asyncio.sleep(0.02)
        try:
            ack = await g.publish({"subject": "q.a", "data": b"probe"}, 5.0)
        except RaftStreamError as exc:
            self._fail([f"the new leader took no publish: {exc!r}"])
            return
        self.history.pub_acked(b"probe", ack.seq)
        await self._start(self._nodes[leader])
        await self._converged()
