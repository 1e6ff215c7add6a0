"""RaftHost: three hosts in one process, over the in-memory twins and over gRPC + LMDB.

Properties checked (Raft paper sections): a leader is elected per group (§5.2); proposals
are applied in the same order on every replica (State Machine Safety, §5.4.3); a follower
refuses proposals with a leader hint; after the leader is lost a new one is elected in a
higher term and the group keeps committing (§5.2); a replica restarted from its data dir
catches up, through an InstallSnapshot when the leader compacted its log (§7).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import random
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from raftstream.raft import host as host_module
from raftstream.raft.errors import (
    DataLossError,
    InvalidArgumentError,
    NotLeaderError,
    UnavailableError,
)
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.storage import GroupWrite, LmdbLogStorage, MemoryLogStorage
from raftstream.raft.transport import GrpcTransport, MemoryNetwork, MemoryTransport
from raftstream.raft.types import Entry, Message, MessageType, Role
from tests.support.polling import until
from tests.support.raft_hosts import (
    CFG,
    NODES,
    ListMachine,
    PermitStorage,
    acks_waiting,
    elected,
    leader_of,
    run,
    run_simulated,
    start_hosts,
    start_memory_cluster,
    start_stalling_hosts,
    stop_all,
)


def test_three_hosts_elect_propose_and_apply_in_the_same_order() -> None:
    async def scenario() -> None:
        _, hosts, machines = start_memory_cluster(["a", "b"])
        try:
            for g in ("a", "b"):
                lead = await elected(hosts, g)
                futures = [hosts[lead].propose(g, f"{g}-{i}".encode()) for i in range(50)]
                results = await asyncio.gather(*futures)
                assert results == list(range(1, 51))  # each entry's result from apply
                want = [f"{g}-{i}".encode() for i in range(50)]
                await until(
                    lambda g=g: all(len(m.applied.get(g, [])) == 50 for m in machines.values())
                )
                assert all(m.applied[g] == want for m in machines.values())
        finally:
            await stop_all(hosts)

    run(scenario)


class CountingStorage(MemoryLogStorage):
    """Counts write batches that only move hard states (no entries, snapshot, compaction)."""

    def __init__(self) -> None:
        super().__init__()
        self.hard_state_only = 0

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        if writes and all(
            w.hard_state is not None and not (w.entries or w.snapshot or w.compaction)
            for w in writes
        ):
            self.hard_state_only += 1
        super().write_batch(writes)


def test_a_commit_index_alone_costs_no_write_and_reaches_storage_by_the_next_tick() -> None:
    """The commit index is volatile (Raft paper, Figure 2; host.py "Commit index"): a round
    whose only change is a higher commit writes nothing (no fsync between commit and
    apply); the stored commit catches up with the next write, two ticks later at the latest."""

    async def scenario() -> None:
        cfg = HostConfig(tick_ms=200, election_tick=3, heartbeat_tick=1, liveness_ticks=5)
        hosts, stores = start_hosts(CountingStorage, cfg)
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"first")  # the leader committed in its term
            before = {n: (stores[n].hard_state_only, hosts[n].ticks) for n in NODES}
            for i in range(50):  # one at a time: each commit is a round of its own
                await hosts[lead].propose("a", b"%d" % i)
            for n in NODES:
                writes, ticks = before[n]
                # At most one sync of the commit index per tick, never one per commit.
                assert stores[n].hard_state_only - writes <= hosts[n].ticks - ticks + 1
            commit = hosts[lead].followers("a")[0]
            await until(
                lambda: all(s.log("a").hard_state().commit >= commit for s in stores.values())
            )
        finally:
            await stop_all(hosts)

    run(scenario)


class ThreadNoting(MemoryLogStorage):
    """Notes the thread of each write and whether it wrote entries."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, bool]] = []

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        entries = any(w.entries for w in writes)
        self.writes.append((threading.current_thread().name, entries))
        super().write_batch(writes)


def test_following_rounds_write_on_the_loop_and_leading_ones_on_the_writer_thread() -> None:
    """host.py "Following rounds write on the loop": a follower's round (nothing to send
    early) writes on the loop; the leader's rounds with new entries write on the writer
    thread while its appends travel; with ``inline_follower_writes`` off, every write is on
    the writer thread."""

    async def scenario(inline: bool) -> None:
        cfg = dataclasses.replace(CFG, inline_follower_writes=inline)
        hosts, stores = start_hosts(ThreadNoting, cfg)
        try:
            lead = await elected(hosts, "a")
            for i in range(5):
                await hosts[lead].propose("a", b"%d" % i)
            loop_thread = threading.current_thread().name
            for n in NODES:
                with_entries = {t for t, entries in stores[n].writes if entries}
                if n == lead:
                    assert loop_thread not in with_entries
                elif inline:
                    assert with_entries == {loop_thread}, with_entries
                else:
                    assert loop_thread not in with_entries
        finally:
            await stop_all(hosts)

    run(lambda: scenario(True))
    run(lambda: scenario(False))


class EntryNoting(MemoryLogStorage):
    """Notes the commands each write carries."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[list[bytes]] = []

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        self.writes.append([e.data for w in writes for e in w.entries])
        super().write_batch(writes)


def test_a_lazy_proposal_goes_with_the_next_round_that_takes_proposals() -> None:
    """host.py "Lazy proposals": a lazy proposal stays queued through rounds that only step
    messages (a read's heartbeat round trip), goes into the same write as the next eager
    proposal, before it; alone, it commits once its linger runs out; with a linger of 0 it
    is an ordinary proposal."""

    async def scenario() -> None:
        linger_ms = 300
        cfg = HostConfig(
            tick_ms=linger_ms, election_tick=3, liveness_ticks=5, lazy_linger_ms=linger_ms
        )
        hosts, stores = start_hosts(EntryNoting, cfg)
        loop = asyncio.get_running_loop()
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"first")  # the leader committed in its term
            proposed_at = loop.time()
            lazy = asyncio.ensure_future(hosts[lead].propose("a", b"lazy", lazy=True))
            await hosts[lead].read_index("a")  # rounds that step the heartbeats' answers
            if loop.time() - proposed_at < linger_ms / 1000 / 2:  # else its linger ran out
                assert not lazy.done()
                assert all(b"lazy" not in w for w in stores[lead].writes)
            await hosts[lead].propose("a", b"eager")
            assert lazy.done()
            assert [b"lazy", b"eager"] in stores[lead].writes  # one write, in order
            await hosts[lead].propose("a", b"alone", lazy=True)  # its linger runs out
        finally:
            await stop_all(hosts)

        eager_cfg = dataclasses.replace(CFG, lazy_linger_ms=0)
        hosts, stores = start_hosts(EntryNoting, eager_cfg)
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"not lazy", lazy=True)
        finally:
            await stop_all(hosts)

    run(scenario)


def test_lazy_linger_ms_is_checked() -> None:
    HostConfig(tick_ms=100, lazy_linger_ms=0)
    HostConfig(tick_ms=100, lazy_linger_ms=100)
    for bad in (-1, 101):
        with pytest.raises(InvalidArgumentError, match="lazy_linger_ms"):
            HostConfig(tick_ms=100, lazy_linger_ms=bad)


class GatedStorage(MemoryLogStorage):
    """Its writes wait (on the writer thread) while ``gate`` is clear: a slow disk."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        self.gate.wait()
        super().write_batch(writes)


def test_the_leader_replicates_while_it_writes_and_commits_only_after_its_own_write() -> None:
    """Raft thesis §10.2.1 (host.py "The leader writes in parallel"): followers receive and
    persist an entry while the leader's own write of it is still in progress, yet the entry
    commits (and the proposal resolves) only once the leader's copy is durable."""

    async def scenario() -> None:
        hosts, stores = start_stalling_hosts(GatedStorage)
        lead = ""
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"first")
            stores[lead].gate.clear()  # the leader's disk stalls
            fut = asyncio.ensure_future(hosts[lead].propose("a", b"second"))
            index = stores[lead].log("a").last_index() + 1
            term = hosts[lead].status("a").term
            followers = [n for n in NODES if n != lead]

            def replicated() -> bool:
                return all(
                    stores[n].log("a").last_index() >= index
                    and stores[n].log("a").term(index) == term
                    for n in followers
                )

            await until(replicated)
            for _ in range(5):  # rounds on the followers and the leader's loop go on
                await asyncio.sleep(0.01)
            assert not fut.done()  # a quorum of followers has it, the leader's copy not yet
            assert stores[lead].log("a").last_index() < index
            stores[lead].gate.set()
            assert await fut == 2
        finally:
            if lead:
                stores[lead].gate.set()
            await stop_all(hosts)

    run(scenario)


def test_entries_durable_before_a_write_are_applied_while_it_runs() -> None:
    """host.py "Applying during the write": a leader's round that writes new entries
    applies the older entries it commits (durable on a quorum, its own copy included) while
    that write is still in progress, and the new entries only after it."""

    async def scenario() -> None:
        hosts, stores = start_stalling_hosts(PermitStorage)
        lead = ""
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"first")
            store = stores[lead]
            await store.meter_when_settled(hosts[lead], "a")
            first = asyncio.ensure_future(hosts[lead].propose("a", b"A"))
            index = store.log("a").last_index() + 1
            followers = {n for n in NODES if n != lead}

            # Both acknowledgements of A wait in the leader's inbox.
            await until(lambda: acks_waiting(hosts[lead], index) == followers)
            second = asyncio.ensure_future(hosts[lead].propose("a", b"B"))
            await asyncio.sleep(0)  # B is queued for the same round as the acknowledgements
            store.permits.release()  # A's write completes; the round writing B blocks
            # Applied, and answered, during B's write (the bound is against a hang only).
            assert await asyncio.wait_for(first, 30) == 2
            assert store.log("a").last_index() == index and not second.done()
            store.unmeter()
            assert await second == 3
        finally:
            if lead:
                stores[lead].unmeter()
            await stop_all(hosts)

    run(scenario)


class HeartbeatMute(MemoryTransport):
    """A memory transport that drops the HEARTBEAT messages it sends while ``mute``."""

    mute = False

    def send(
        self, peer: str, messages: Sequence[Message], quiesce: Sequence[tuple[str, int]] = ()
    ) -> None:
        if self.mute:
            messages = [m for m in messages if m.type != MessageType.HEARTBEAT]
        super().send(peer, messages, quiesce)


def test_a_group_with_commit_notices_tells_followers_a_commit_without_a_heartbeat() -> None:
    """host.py "Commit notices": a group added with ``commit_notices=True`` (the meta group,
    whose followers answer listings) has its leader tell the followers a new commit index
    at once; with heartbeats muted they still apply what the leader committed."""

    async def scenario() -> None:
        net = MemoryNetwork()
        cfg = dataclasses.replace(CFG, election_tick=50, liveness_ticks=50)
        hosts: dict[str, RaftHost] = {}
        links: dict[str, HeartbeatMute] = {}
        machines: dict[str, ListMachine] = {}
        for n in NODES:
            links[n] = HeartbeatMute(n, net)
            machines[n] = ListMachine()
            hosts[n] = RaftHost(n, storage=MemoryLogStorage(), transport=links[n], config=cfg)
            hosts[n].start()
            hosts[n].add_group("meta", voters=NODES, state_machine=machines[n], commit_notices=True)
        try:
            lead = await elected(hosts, "meta")
            await hosts[lead].propose("meta", b"1")
            await until(lambda: all(m.applied.get("meta") == [b"1"] for m in machines.values()))
            for link in links.values():
                link.mute = True
            await hosts[lead].propose("meta", b"2")
            # Bounded by run's ceiling only: without the notice no message would tell them.
            await until(
                lambda: all(m.applied.get("meta") == [b"1", b"2"] for m in machines.values())
            )
        finally:
            await stop_all(hosts)

    run(scenario)


class SendLog(MemoryTransport):
    """A memory transport that counts the batches it sends, per peer."""

    def __init__(self, node_id: str, network: MemoryNetwork) -> None:
        super().__init__(node_id, network)
        self.sent: collections.Counter[str] = collections.Counter()

    def send(
        self, peer: str, messages: Sequence[Message], quiesce: Sequence[tuple[str, int]] = ()
    ) -> None:
        self.sent[peer] += 1
        super().send(peer, messages, quiesce)


def test_a_peer_untracked_is_pinged_no_more_unless_a_group_counts_it() -> None:
    """``untrack_peer`` (a node taken out of the cluster for good): a node that only sent
    this host a batch is pinged every tick until untracked, then never; a member of a group
    here is left as it is."""

    async def scenario() -> None:
        net = MemoryNetwork()
        links = {n: SendLog(n, net) for n in NODES}
        hosts = {n: RaftHost(n, storage=MemoryLogStorage(), transport=links[n], config=CFG)
                 for n in NODES}  # fmt: skip
        for h in hosts.values():
            h.start()
            h.add_group("a", voters=NODES, state_machine=ListMachine())
        outsider = MemoryTransport("x", net)
        outsider.bind(lambda inbound: None)
        try:
            await elected(hosts, "a")
            outsider.send("n1", [])
            await until(lambda: links["n1"].sent["x"] >= 3)  # pinged every tick
            assert hosts["n1"].untrack_peer("n2") is False  # a member of "a"
            assert hosts["n1"].untrack_peer("x") is True
            after = links["n1"].sent["x"]
            seen = links["n1"].sent["n2"]
            await until(lambda: links["n1"].sent["n2"] >= seen + 5)  # five more ticks
            assert links["n1"].sent["x"] == after
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_follower_refuses_proposals_with_a_leader_hint() -> None:
    async def scenario() -> None:
        _, hosts, _ = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            follower = next(n for n in NODES if n != lead)
            await until(lambda: hosts[follower].leader("a") == lead)
            with pytest.raises(NotLeaderError) as err:
                await hosts[follower].propose("a", b"x")
            assert err.value.leader == lead
        finally:
            await stop_all(hosts)

    run(scenario)


def test_leadership_transfer_and_leader_change_callbacks() -> None:
    """Leadership transfer (thesis §3.10) to a chosen voter; every replica reports the new
    leader through its callback; the leader's view of followers shows them caught up."""

    async def scenario() -> None:
        net = MemoryNetwork()
        seen: dict[str, list[tuple[str | None, Role]]] = {n: [] for n in NODES}
        hosts = {}
        for n in NODES:
            hosts[n] = RaftHost(
                n, storage=MemoryLogStorage(), transport=MemoryTransport(n, net), config=CFG
            )
            hosts[n].start()
            hosts[n].add_group(
                "a",
                voters=NODES,
                state_machine=ListMachine(),
                on_leader_change=lambda g, lead, role, n=n: seen[n].append((lead, role)),
            )
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"x")
            commit, followers = hosts[lead].followers("a")
            assert {f.name for f in followers} == set(NODES) - {lead}
            await until(lambda: all(f.match == commit for f in hosts[lead].followers("a")[1]))
            assert hosts[lead].voters("a") == NODES
            target = next(n for n in NODES if n != lead)
            with pytest.raises(NotLeaderError):
                hosts[target].transfer_leadership("a", target)
            hosts[lead].transfer_leadership("a", target)
            await until(lambda: leader_of(hosts, "a") == target)
            await until(lambda: all(seen[n] and seen[n][-1][0] == target for n in NODES))
            assert seen[target][-1] == (target, Role.LEADER)
        finally:
            await stop_all(hosts)

    run(scenario)


def test_after_leader_loss_a_new_leader_commits_in_a_higher_term() -> None:
    async def scenario() -> None:
        net, hosts, machines = start_memory_cluster(["a"])
        try:
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"before")
            old_term = hosts[lead].status("a").term
            net.set_down(lead, True)  # the leader is cut off from everyone
            rest = {n: h for n, h in hosts.items() if n != lead}
            new = await elected(rest, "a")
            assert new != lead and rest[new].status("a").term > old_term
            await rest[new].propose("a", b"after")
            await until(
                lambda: all(
                    m.applied["a"] == [b"before", b"after"]
                    for n, m in machines.items()
                    if n != lead
                )
            )
            net.set_down(lead, False)  # the old leader rejoins as a follower and catches up
            await until(lambda: machines[lead].applied["a"] == [b"before", b"after"])
            await until(lambda: hosts[lead].status("a").role == Role.FOLLOWER)
        finally:
            await stop_all(hosts)

    run(scenario)


class LockstepRng(random.Random):
    """A host rng that gives every core the same seed, so every voter draws the same
    election timeouts and times out on the same tick as the others, and that delays this
    host's election ticks by ``delay`` of a tick."""

    def __init__(self, delay: float) -> None:
        super().__init__(0)
        self.delay = delay

    def getrandbits(self, k: int) -> int:
        return 7

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.delay


def test_voters_timing_out_on_the_same_tick_do_not_split_the_vote() -> None:
    """Elections between ticks: the tick starting an election is delayed by part of a tick,
    so voters whose timeouts fall on the same tick stand one after the other. Without it
    these hosts, started together and drawing the same timeouts, split every vote."""

    async def scenario() -> None:
        net = MemoryNetwork()
        cfg = dataclasses.replace(CFG, tick_ms=100, election_tick=5, liveness_ticks=5)
        hosts: dict[str, RaftHost] = {}
        for n, delay in zip(NODES, (0.0, 0.3, 0.6), strict=True):
            hosts[n] = RaftHost(
                n,
                storage=MemoryLogStorage(),
                transport=MemoryTransport(n, net),
                config=cfg,
                rng=LockstepRng(delay),
            )
            hosts[n].start()
            hosts[n].add_group("a", voters=NODES, state_machine=ListMachine())
        try:
            lead = await elected(hosts, "a")
            assert (lead, hosts[lead].status("a").term) == ("n1", 1)
            net.set_down(lead, True)
            rest = {n: h for n, h in hosts.items() if n != lead}
            new = await elected(rest, "a")
            assert (new, rest[new].status("a").term) == ("n2", 2)  # no split vote in term 2
        finally:
            await stop_all(hosts)

    run(scenario)


def test_idle_groups_quiesce_and_wake_on_a_proposal_or_a_dead_leader() -> None:
    """Quiescence changes only timing: an idle group stops ticking everywhere, a proposal
    wakes and commits it, and a leader that goes silent is still replaced (§5.2). On
    simulated time: "no Ready in ten ticks" failed on a loaded machine, where a late tick
    made a peer look silent and woke the groups."""

    async def scenario() -> None:
        net, hosts, machines = start_memory_cluster(["a", "b"], simulated=True)
        try:
            for g in ("a", "b"):
                lead = await elected(hosts, g)
                await hosts[lead].propose(g, b"1")
            await until(lambda: all(h.status(g).quiet for h in hosts.values() for g in "ab"))
            rounds = {n: h.rounds for n, h in hosts.items()}
            ticks = {n: h.ticks for n, h in hosts.items()}
            await until(lambda: all(h.ticks >= ticks[n] + 10 for n, h in hosts.items()))
            # Ten ticks later: quiet groups produced no Ready at all (only liveness pings).
            assert {n: h.rounds for n, h in hosts.items()} == rounds
            lead = await elected(hosts, "a")
            await hosts[lead].propose("a", b"2")  # wakes "a", leaves "b" quiet
            await until(lambda: all(m.applied["a"] == [b"1", b"2"] for m in machines.values()))
            assert all(h.status("b").quiet for h in hosts.values())
            lead_b = await elected(hosts, "b")
            net.set_down(lead_b, True)
            rest = {n: h for n, h in hosts.items() if n != lead_b}
            new = await elected(rest, "b")
            await rest[new].propose("b", b"3")
            await until(lambda: all(machines[n].applied["b"] == [b"1", b"3"] for n in rest))
        finally:
            await stop_all(hosts)

    run_simulated(scenario)


def test_a_stalled_leader_keeps_its_quiesced_groups() -> None:
    """A leader silent for longer than the liveness bound but shorter than an election
    timeout (a long apply or snapshot on its loop, a loaded machine) wakes its followers'
    quiesced groups; once it is heard again, having sent nothing for them, they go back to
    quiet instead of electing another leader for idle groups (a soak under load: the meta
    group's term reached 15 in 31 minutes with no fault)."""

    async def scenario() -> None:
        net, hosts, _ = start_memory_cluster(["a", "b", "c", "d"])
        try:
            for g in "abcd":
                lead = await elected(hosts, g)
                await hosts[lead].propose(g, b"1")
            await until(lambda: all(h.status(g).quiet for h in hosts.values() for g in "abcd"))
            terms = {g: hosts[n].status(g).term for n in NODES for g in "abcd"}
            liveness_s = CFG.liveness_ticks * CFG.tick_ms / 1000
            election_s = CFG.election_tick * CFG.tick_ms / 1000
            for _ in range(3):
                for n in NODES:  # each node stalls in turn: it leads some of the groups
                    net.set_muted(n, True)
                    await asyncio.sleep(liveness_s + (election_s - liveness_s) / 4)
                    net.set_muted(n, False)
                    await asyncio.sleep(election_s * 3)
            after = {g: hosts[n].status(g).term for n in NODES for g in "abcd"}
            assert after == terms
            await until(lambda: all(h.status(g).quiet for h in hosts.values() for g in "abcd"))
        finally:
            await stop_all(hosts)

    run(scenario)


# --- real gRPC and LMDB on loopback ---


class GrpcNode:
    """One host with its LMDB data dir and gRPC transport; restartable on the same port."""

    def __init__(self, name: str, data_dir: Path, config: HostConfig) -> None:
        self.name = name
        self.data_dir = data_dir
        self.config = config
        self.port = 0
        self.machine = ListMachine()
        self.host: RaftHost | None = None
        self._transport: GrpcTransport | None = None
        self._storage: LmdbLogStorage | None = None

    async def start(self, peers: dict[str, int]) -> None:
        self._storage = LmdbLogStorage(self.data_dir, map_size_bytes=64 << 20)
        self._transport = GrpcTransport(self.name)
        self.port = await self._transport.serve(f"127.0.0.1:{self.port}")
        peers[self.name] = self.port
        self.host = RaftHost(
            self.name, storage=self._storage, transport=self._transport, config=self.config
        )
        self.host.start()

    def connect(self, peers: dict[str, int]) -> None:
        assert self._transport is not None
        for n, port in peers.items():
            if n != self.name:
                self._transport.set_peer(n, f"127.0.0.1:{port}")

    async def stop(self) -> None:
        if self.host is not None:
            await self.host.stop()
        if self._transport is not None:
            await self._transport.close()
        if self._storage is not None:
            self._storage.close()
        self.host, self._transport, self._storage = None, None, None


def test_grpc_lmdb_hosts_restart_one_and_it_catches_up_via_snapshot(tmp_path: Path) -> None:
    cfg = HostConfig(tick_ms=20, election_tick=10, heartbeat_tick=1, snapshot_entries=30)
    groups = ("g1", "g2", "g3")

    async def scenario() -> None:
        nodes = {n: GrpcNode(n, tmp_path / n, cfg) for n in NODES}
        peers: dict[str, int] = {}
        try:
            for node in nodes.values():
                await node.start(peers)
            for node in nodes.values():
                node.connect(peers)
                assert node.host is not None
                for g in groups:
                    node.host.add_group(g, voters=NODES, state_machine=node.machine)
            hosts = {n: node.host for n, node in nodes.items() if node.host is not None}
            for g in groups:
                lead = await elected(hosts, g)
                await asyncio.gather(
                    *(hosts[lead].propose(g, f"{g}:{i}".encode()) for i in range(10))
                )
            # Stop a follower of g1, then move g1 far past it: the leader compacts its log.
            lead = await elected(hosts, "g1")
            victim = next(n for n in NODES if n != lead)
            await nodes[victim].stop()
            rest = {n: h for n, h in hosts.items() if n != victim}
            lead = await elected(rest, "g1")
            await asyncio.gather(
                *(rest[lead].propose("g1", f"g1:{i}".encode()) for i in range(10, 100))
            )
            await until(lambda: rest[lead].status("g1").snapshot_index > 10)
            # Restart it from its data dir, with a state machine that starts empty.
            node = nodes[victim]
            node.machine = ListMachine()
            await node.start(peers)
            node.connect(peers)
            assert node.host is not None
            for g in groups:
                node.host.add_group(g, voters=NODES, state_machine=node.machine)
            want = [f"g1:{i}".encode() for i in range(100)]
            await until(lambda: node.machine.applied.get("g1") == want)
            assert node.machine.restores >= 1  # it caught up through a snapshot
            for g in ("g2", "g3"):
                await until(lambda g=g: len(node.machine.applied.get(g, [])) == 10)
                assert node.machine.applied[g] == [f"{g}:{i}".encode() for i in range(10)]
        finally:
            for node in nodes.values():
                await node.stop()

    run(scenario)


def test_compaction_waits_for_a_log_as_large_as_the_last_snapshot() -> None:
    """``snapshot_entries`` entries are not enough once a snapshot is larger than they are
    (a soak review: a whole stream was written every 10,000 small entries); enough bytes are,
    whatever the count (a mirror's few large entries kept a log 15 times its stream). On
    simulated time: its "no snapshot yet" wait is the same on a loaded machine."""
    cfg = HostConfig(
        tick_ms=20,
        election_tick=10,
        heartbeat_tick=1,
        snapshot_entries=10,
        snapshot_log_bytes_min=1_000,
    )

    async def scenario() -> None:
        hosts, _ = start_hosts(MemoryLogStorage, cfg, simulated=True)
        try:
            lead = await elected(hosts, "a")
            h = hosts[lead]
            for _i in range(10):
                await h.propose("a", b"x" * 20)
            await until(lambda: h.status("a").snapshot_index > 0)  # the first: by entries
            first = h.status("a").snapshot_index
            for _i in range(12):  # 12 entries, 12 bytes: far below the snapshot's size
                await h.propose("a", b"y")
            await asyncio.sleep(0.2)
            assert h.status("a").snapshot_index == first
            while h.status("a").snapshot_index == first:  # bytes reach the snapshot's size
                await h.propose("a", b"z" * 50)
            second = h.status("a").snapshot_index
            assert second - first < 30
            proposed = 0  # few entries, but more than 2 x snapshot + 1,000 bytes
            while h.status("a").snapshot_index == second:
                await h.propose("a", b"w" * 4_000)
                proposed += 1
            assert proposed < cfg.snapshot_entries
        finally:
            await stop_all(hosts)

    run_simulated(scenario)


class SteppedMachine(ListMachine):
    """A ``ListMachine`` whose snapshots are made in ``steps`` steps (``snapshot_job``),
    recording in ``timeline`` every step and every apply; ``fail`` makes a step raise."""

    def __init__(self, steps: int, *, fail: bool = False) -> None:
        super().__init__()
        self.steps = steps
        self.fail = fail
        self.timeline: list[str] = []
        self.jobs: list[SteppedJob] = []
        self.open_max = 0  # the most jobs open at once (counted when each one starts)

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]:
        self.timeline.append("apply")
        return super().apply(group, entries)

    def snapshot(self, group: str) -> bytes:
        raise AssertionError("the host uses snapshot_job when there is one")

    def snapshot_job(self, group: str) -> SteppedJob:
        job = SteppedJob(self, ListMachine.snapshot(self, group))
        self.jobs.append(job)
        self.open_max = max(self.open_max, sum(not j.closed for j in self.jobs))
        return job


class SteppedJob:
    def __init__(self, machine: SteppedMachine, data: bytes) -> None:
        self._m = machine
        self._data = data  # the state as of the job's start
        self.left = machine.steps
        self.closed = False

    def step(self) -> bytes | None:
        assert not self.closed
        self._m.timeline.append("step")
        if self._m.fail:
            raise DataLossError("a stored record failed its checksum")
        self.left -= 1
        return self._data if self.left <= 0 else None

    def close(self) -> None:
        self.closed = True


def start_stepped_hosts(
    cfg: HostConfig, steps: int, *, fail: bool = False, groups: Sequence[str] = ("a",)
) -> tuple[dict[str, RaftHost], dict[str, SteppedMachine], dict[str, MemoryLogStorage]]:
    made: list[SteppedMachine] = []

    def machine() -> SteppedMachine:
        made.append(SteppedMachine(steps, fail=fail))
        return made[-1]

    hosts, stores = start_hosts(MemoryLogStorage, cfg, machine=machine, groups=groups)
    return hosts, dict(zip(NODES, made, strict=True)), stores


STEPPED_CFG = HostConfig(
    tick_ms=20, election_tick=10, heartbeat_tick=1, snapshot_entries=10, snapshot_log_bytes_min=1
)


def test_a_snapshot_job_runs_in_steps_between_applies_and_compacts_where_it_started() -> None:
    """A stream group's snapshot is made in steps (a large stream stalled its node for the
    whole encoding): the group goes on applying between them, and the compaction is at the
    index the job started from, holding the state as of then."""

    async def scenario() -> None:
        hosts, machines, stores = start_stepped_hosts(STEPPED_CFG, steps=200)
        try:
            lead = await elected(hosts, "a")
            h, m = hosts[lead], machines[lead]
            for i in range(10):
                await h.propose("a", f"e{i}".encode())
            await until(lambda: bool(m.jobs))
            i = 10
            while h.status("a").snapshot_index == 0:
                await h.propose("a", f"e{i}".encode())
                i += 1
            first_step, last_step = m.timeline.index("step"), len(m.timeline) - 1
            while m.timeline[last_step] != "step":
                last_step -= 1
            assert "apply" in m.timeline[first_step:last_step]  # applies went on meanwhile
            assert m.jobs[0].closed
            snap = stores[lead].log("a").snapshot()
            taken = json.loads(snap.data)
            applied = [d.decode() for d in m.applied["a"]]
            assert taken == applied[: len(taken)] and len(taken) < len(applied)
            assert snap.meta.index < h.status("a").applied
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_snapshot_job_is_closed_when_its_group_is_removed_or_the_host_stops() -> None:
    async def scenario() -> None:
        hosts, machines, _ = start_stepped_hosts(STEPPED_CFG, steps=10**9)
        try:
            lead = await elected(hosts, "a")
            for i in range(10):
                await hosts[lead].propose("a", f"e{i}".encode())
            await until(lambda: all(m.jobs for m in machines.values()))
            follower = next(n for n in NODES if n != lead)
            await hosts[follower].remove_group("a")
            assert machines[follower].jobs[0].closed
            steps = machines[follower].timeline.count("step")
            await asyncio.sleep(0.1)
            assert machines[follower].timeline.count("step") == steps  # no step after close
            await hosts[lead].stop()
            assert machines[lead].jobs[0].closed
        finally:
            await stop_all(hosts)

    run(scenario)


def test_a_snapshot_job_that_fails_halts_its_group() -> None:
    async def scenario() -> None:
        hosts, _, _ = start_stepped_hosts(STEPPED_CFG, steps=3, fail=True)
        try:
            lead = await elected(hosts, "a")
            with contextlib.suppress(UnavailableError):  # the group halts under them
                for i in range(10):
                    await hosts[lead].propose("a", f"e{i}".encode())
            await until(lambda: hosts[lead].status("a").halted)
            assert hosts[lead].status("a").snapshot_index == 0
        finally:
            await stop_all(hosts)

    run(scenario)


def test_snapshot_jobs_at_once_are_bounded_and_the_others_start_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each stream group's job holds a read transaction of the node's store environment,
    which has a bounded number of reader slots: a host runs ``SNAPSHOT_JOBS_MAX`` at once,
    and a group over the bound starts its job after a later apply."""
    monkeypatch.setattr(host_module, "SNAPSHOT_JOBS_MAX", 1)

    async def scenario() -> None:
        hosts, machines, _ = start_stepped_hosts(STEPPED_CFG, steps=40, groups=("a", "b"))
        try:
            lead_a = await elected(hosts, "a")
            leaders = {"a": lead_a, "b": await elected(hosts, "b")}
            i = 0
            while not all(hosts[lead_a].status(g).snapshot_index > 0 for g in ("a", "b")):
                # Together, so both groups fall due for compaction in the same round (both
                # apply on lead_a, a member of each): without the bound their jobs overlap.
                await asyncio.gather(
                    *(hosts[leaders[g]].propose(g, f"e{i}".encode()) for g in ("a", "b"))
                )
                i += 1
            # Counted by the machine as each job starts, not sampled between proposals (a
            # job's steps could all run while one proposal was awaited: CI saw 0 that way).
            m = machines[lead_a]
            assert m.open_max == 1 and len(m.jobs) >= 2
            assert hosts[lead_a].snapshot_jobs == sum(not j.closed for j in m.jobs)
        finally:
            await stop_all(hosts)

    run(scenario)
