"""Deterministic simulation of several Raft groups on N nodes, all from ONE seed.

A discrete-event loop over a fake clock (integer microseconds) drives: node ticks (each
node's clock runs a little fast or slow), a packet simulator (drop, delay, duplicate,
reorder through random latency, symmetric and one-way partitions), crashes that keep only
what each node fsynced (optionally right after an fsync, before anything was sent), restarts,
disk corruption (caught by checksums: the node stops, the entry is never applied),
leadership transfers and snapshots/compaction. Clients run put/get/cas against a key-value
state machine per group (gets through ReadIndex or the log); the history is checked for
linearizability at the end, and the §5 safety checkers run on every Ready.

``Simulation(seed).run()`` raises on any violation; the message carries ``--seed N``.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from raftstream.chaos.linearizability import RegOp as Op
from raftstream.chaos.linearizability import check_register
from raftstream.raft.core import (
    ConfChangePendingError,
    RaftConfig,
    RaftNode,
    TransferInProgressError,
)
from raftstream.raft.errors import DataLossError, LimitError, NoLeaderError, NotLeaderError
from raftstream.raft.types import (
    ConfChange,
    ConfChangeType,
    EntryType,
    Message,
    MessageType,
    Ready,
    Role,
)

from .checkers import SafetyChecker
from .kv import KV, Command
from .storage import SimStorage

MS = 1000  # microseconds per millisecond


@dataclass(frozen=True)
class SimParams:
    """Everything about a run that the seed chooses."""

    nodes: int
    groups: int
    members: int  # initial voters of each group (the other nodes may join later)
    keys_per_group: int
    clients_per_group: int
    tick_us: int
    fault_us: int  # faults active
    heal_us: int  # no new faults, everything restarted, clients continue
    quiet_us: int  # no clients: the groups must converge
    ops_per_key_max: int
    snapshot_every: int  # compact after this many applied entries
    p_corrupt: float  # chance this run corrupts one stored entry
    pre_vote: bool
    check_quorum: bool
    write_us_max: int  # 0: each Ready is written at once; else writes take up to this
    commit_notices: bool  # off as in RaftHost: followers learn commits from appends/heartbeats

    @classmethod
    def from_rng(cls, rng: random.Random) -> SimParams:
        nodes = rng.choice((3, 5))
        return cls(
            nodes=nodes,
            groups=rng.choice((1, 2, 2)),
            members=3,
            keys_per_group=2,
            clients_per_group=5,
            tick_us=10 * MS,
            fault_us=rng.randrange(800, 1500) * MS,
            heal_us=500 * MS,
            quiet_us=500 * MS,
            ops_per_key_max=50,
            snapshot_every=rng.choice((5, 10, 30)),
            p_corrupt=0.3,
            pre_vote=rng.random() < 0.75,
            check_quorum=rng.random() < 0.75,
            write_us_max=rng.choice((0, 0, 500, 3 * MS)),
            commit_notices=rng.random() < 0.5,
        )


@dataclass
class Pending:
    """A client operation in flight."""

    op_id: int
    client: Client
    cmd: Command
    invoke: int
    node: str = ""
    index: int = 0  # log index of the proposal, or the read index once known
    via_read_index: bool = False
    done: bool = False


@dataclass
class Replica:
    """One group on one node: durable storage survives crashes, the rest does not."""

    node: str
    group: str
    storage: SimStorage
    raft: RaftNode | None = None
    kv: KV = field(default_factory=KV)
    applied: int = 0
    waiters: dict[int, list[Pending]] = field(default_factory=dict)
    reads: dict[bytes, Pending] = field(default_factory=dict)
    ready_reads: list[Pending] = field(default_factory=list)
    writing: Ready | None = None  # a Ready whose write is in flight


@dataclass
class Node:
    id: str
    replicas: dict[str, Replica]
    tick_us: int
    up: bool = True
    failed: bool = False  # disk corruption detected: down for good
    crash_after_fsync: bool = False
    crash_after_vote: bool = False  # bounce right after granting a vote


@dataclass
class Client:
    id: int
    group: str
    keys: list[str]
    target: str
    current: Pending | None = None


class Simulation:
    def __init__(self, seed: int, params: SimParams | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.p = params or SimParams.from_rng(self.rng)
        self.now = 0
        self._seq = 0
        self._events: list[tuple[int, int, Callable[[], None]]] = []
        self.checker = SafetyChecker()
        self.history: dict[str, list[Op]] = {}
        self.ops_issued: dict[str, int] = {}
        self.blocked: set[tuple[str, str]] = set()
        self.p_drop = 0.0
        self.p_dup = 0.0
        self.faults_on = True
        self.clients_on = True
        self.stats = {"msgs": 0, "dropped": 0, "crashes": 0, "corruptions": 0, "ops": 0}
        self.node_ids = [f"n{i}" for i in range(1, self.p.nodes + 1)]
        self.groups = [f"g{i}" for i in range(self.p.groups)]
        self.bootstrap = {
            g: tuple(sorted(self.rng.sample(self.node_ids, self.p.members))) for g in self.groups
        }
        self.stats["conf_changes"] = 0
        self.nodes: dict[str, Node] = {}
        for nid in self.node_ids:
            drift = self.rng.uniform(0.9, 1.1)  # clock skew between nodes
            reps = {g: Replica(nid, g, SimStorage()) for g in self.groups}
            self.nodes[nid] = Node(nid, reps, int(self.p.tick_us * drift))
        self._op_ids = 0
        self.clients: list[Client] = []

    # ------------------------------------------------------------------ event loop
    def at(self, delay_us: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + max(0, delay_us), self._seq, fn))

    def run_until(self, end: int) -> None:
        ev = self._events
        while ev and ev[0][0] <= end:
            t, _, fn = heapq.heappop(ev)
            self.now = t
            fn()
        self.now = end

    def fail(self, why: str) -> AssertionError:
        return AssertionError(f"{why}\nreplay with: --seed {self.seed}")

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # a checker, or an invariant of the core itself
            if "--seed" in str(e):
                raise
            raise self.fail(f"{type(e).__name__}: {e}") from e

    def _run(self) -> None:
        for nid, node in self.nodes.items():
            for g in self.groups:
                self._start_replica(node, g)
            self.at(self.rng.randrange(node.tick_us), lambda n=nid: self._tick(n))
        for g in self.groups:
            keys = [f"{g}/k{i}" for i in range(self.p.keys_per_group)]
            for _ in range(self.p.clients_per_group):
                c = Client(len(self.clients), g, keys, self.rng.choice(self.node_ids))
                self.clients.append(c)
                self.at(self.rng.randrange(50 * MS), lambda c=c: self._issue(c))
        self.at(self.rng.randrange(20 * MS), self._fault)
        t_heal = self.p.fault_us
        self.run_until(t_heal)
        self._heal_all()
        self.run_until(t_heal + self.p.heal_us)
        self.clients_on = False
        self.run_until(t_heal + self.p.heal_us + self.p.quiet_us)
        self._check_converged()
        self._check_linearizable()

    # ------------------------------------------------------------------ nodes
    def _config(self, node: Node, group: str) -> RaftConfig:
        return RaftConfig(
            id=node.id,
            group=group,
            rng=random.Random(self.rng.getrandbits(64)),
            voters=self.bootstrap[group],
            election_tick=10,
            pre_vote=self.p.pre_vote,
            check_quorum=self.p.check_quorum,
            commit_notices=self.p.commit_notices,
            heartbeat_tick=2,
            inflight_msgs_max=4,
            inflight_bytes_max=4096,
            append_bytes_max=256,
        )

    def _start_replica(self, node: Node, group: str) -> None:
        rep = node.replicas[group]
        rep.storage.verify_all()  # a restart reads and checks the whole log
        self.checker.on_restart(node.id, group, rep.storage)
        rep.raft = RaftNode(self._config(node, group), rep.storage)
        snap = rep.storage.snapshot()
        rep.kv = KV()
        rep.kv.restore(snap.data)
        rep.applied = snap.meta.index
        self.checker.on_snapshot(group, snap)

    def _tick(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.up:
            for g in self.groups:
                self._guarded(node, g, lambda r: r.tick())
        if not node.failed:
            self.at(node.tick_us, lambda: self._tick(nid))

    def _guarded(self, node: Node, group: str, fn: Callable[[RaftNode], None]) -> None:
        """Run ``fn`` on the replica, then its Ready cycle. A checksum failure stops the
        node for good: the corrupted entry is never applied nor sent."""
        rep = node.replicas[group]
        if not node.up or rep.raft is None:
            return
        try:
            fn(rep.raft)
            self._process_ready(node, rep)
        except DataLossError:
            self._crash(node, failed=True)

    def _process_ready(self, node: Node, rep: Replica) -> None:
        """The host's cycle. With ``write_us_max`` the write takes time: until it is done
        the replica keeps stepping messages and ticking (the core's contract allows it),
        and a crash meanwhile loses the write."""
        raft = rep.raft
        assert raft is not None
        while node.up and rep.writing is None and raft.has_ready():
            rd = raft.ready()
            self.checker.on_ready(node.id, rep.group, raft, rep.storage, rd)
            if self.p.write_us_max:
                rep.writing = rd
                delay = self.rng.randrange(self.p.write_us_max)
                self.at(delay, lambda rd=rd: self._write_done(node, rep, raft, rd))
                return
            if not self._finish_ready(node, rep, raft, rd):
                return

    def _write_done(self, node: Node, rep: Replica, raft: RaftNode, rd: Ready) -> None:
        if rep.raft is not raft or rep.writing is not rd:
            return  # crashed while writing: the write is lost
        rep.writing = None
        try:
            if self._finish_ready(node, rep, raft, rd):
                self._process_ready(node, rep)
        except DataLossError:
            self._crash(node, failed=True)

    def _finish_ready(self, node: Node, rep: Replica, raft: RaftNode, rd: Ready) -> bool:
        """Persist, send, apply, advance. False if the node crashed on the way."""
        rep.storage.persist(rd)  # the fsync: nothing below happens before it
        if node.crash_after_fsync:
            self._crash(node)  # crashed after the fsync, before sending anything
            return False
        for m in rd.messages:
            self._send(m)
        if node.crash_after_vote and any(
            m.type == MessageType.VOTE_RESP and not m.reject for m in rd.messages
        ):
            # The vote is out; what it promised must survive the crash (§5.2).
            self._crash(node)
            self.at(self.rng.randrange(200, 3 * MS), lambda: self._restart(node.id))
            return False
        self._apply(node, rep, rd)
        raft.advance(rd)
        self._serve_reads(rep, rd)
        self._maybe_compact(rep)
        return True

    def _apply(self, node: Node, rep: Replica, rd: Ready) -> None:
        if rd.snapshot is not None:
            rep.kv.restore(rd.snapshot.data)
            rep.applied = rd.snapshot.meta.index
            for index in [i for i in rep.waiters if i <= rep.applied]:
                for p in rep.waiters.pop(index):
                    self._finish(p, None)  # outcome unknown: it was inside the snapshot
        for e in rd.committed_entries:
            self.checker.on_apply(node.id, rep.group, e)
            rep.applied = e.index
            result: int | bool | None = None
            cmd = None
            if e.type == EntryType.NORMAL and e.data:
                cmd = Command.decode(e.data)  # raises if a damaged command got this far
                result = rep.kv.apply(cmd)
            for p in rep.waiters.pop(e.index, []):
                if cmd is not None and cmd.op_id == p.op_id:
                    self._finish(p, result)
                else:
                    self._finish(p, None, failed=True)  # another entry won that index

    def _serve_reads(self, rep: Replica, rd: Ready) -> None:
        for rs in rd.read_states:
            p = rep.reads.pop(rs.context, None)
            if p is not None and not p.done:
                p.index = rs.index
                rep.ready_reads.append(p)
        if rep.ready_reads:
            keep = []
            for p in rep.ready_reads:
                if p.done:
                    continue
                if rep.applied >= p.index:
                    self._finish(p, rep.kv.data.get(p.cmd.key, 0))
                else:
                    keep.append(p)
            rep.ready_reads = keep

    def _maybe_compact(self, rep: Replica) -> None:
        st = rep.storage
        if rep.raft is None or rep.applied - st.snapshot().meta.index < self.p.snapshot_every:
            return
        snap = rep.raft.make_snapshot(rep.applied, rep.kv.snapshot())
        self.checker.on_snapshot(rep.group, snap)
        st.compact(snap)

    def _crash(self, node: Node, *, failed: bool = False) -> None:
        node.up = False
        node.failed = node.failed or failed
        node.crash_after_fsync = node.crash_after_vote = False
        self.stats["crashes"] += 1
        for rep in node.replicas.values():
            rep.raft = None
            rep.writing = None
            pending = [p for ps in rep.waiters.values() for p in ps]
            pending += list(rep.reads.values()) + rep.ready_reads
            rep.waiters, rep.reads, rep.ready_reads = {}, {}, []
            for p in pending:
                self._finish(p, None)

    def _restart(self, nid: str) -> None:
        node = self.nodes[nid]
        if node.up or node.failed:
            return
        node.up = True
        for g in self.groups:
            try:
                self._start_replica(node, g)
            except DataLossError:
                self._crash(node, failed=True)
                return

    # ------------------------------------------------------------------ network
    def _send(self, m: Message) -> None:
        self.checker.on_send(m)
        if m.type == MessageType.APPEND_RESP and not m.reject and m.index:
            st = self.nodes[m.src].replicas[m.group].storage
            if m.index >= st.first_index() - 1:
                self.checker.on_ack(m.group, m.src, m.term, m.index, st.term(m.index))
        self.stats["msgs"] += 1
        if (m.src, m.dst) in self.blocked or self.rng.random() < self.p_drop:
            self.stats["dropped"] += 1
            return
        copies = 2 if self.rng.random() < self.p_dup else 1
        for _ in range(copies):
            delay = self.rng.randrange(200, 4 * MS)
            if self.rng.random() < 0.05:
                delay += self.rng.randrange(5 * MS, 40 * MS)  # a slow packet: reordering
            self.at(delay, lambda m=m: self._deliver(m))

    def _deliver(self, m: Message) -> None:
        node = self.nodes[m.dst]
        self._guarded(node, m.group, lambda r: r.step(m))

    # ------------------------------------------------------------------ faults
    def _fault(self) -> None:
        if not self.faults_on:
            return
        r = self.rng.random()
        ids = self.node_ids
        if r < 0.15:
            self.p_drop = self.rng.choice((0.0, 0.02, 0.1, 0.3))
            self.p_dup = self.rng.choice((0.0, 0.02, 0.1))
        elif r < 0.25:
            a = self._pick_node()  # symmetric isolation of one node
            self.blocked |= {(a, b) for b in ids if b != a} | {(b, a) for b in ids if b != a}
        elif r < 0.35:
            side = set(self.rng.sample(ids, len(ids) // 2))  # a split
            self.blocked |= {(a, b) for a in ids for b in ids if (a in side) != (b in side)}
        elif r < 0.45:
            a = self._pick_node()  # one way: a hears b, b does not hear a
            b = self.rng.choice([i for i in ids if i != a])
            self.blocked.add((a, b))
        elif r < 0.6:
            self.blocked.clear()
        elif r < 0.75:
            self._fault_crash()
        elif r < 0.78:
            self._fault_transfer()
        elif r < 0.92:
            self._fault_membership()
        elif r < 0.97 and self.rng.random() < self.p.p_corrupt:
            self._fault_corrupt()
        elif r < 1.0:
            self._fault_restart_all()
        self.at(self.rng.randrange(10 * MS, 40 * MS), self._fault)

    def _fault_restart_all(self) -> None:
        """Every node restarts at once (a power cut): elections start together, split votes
        follow, and some nodes bounce right after voting."""
        for node in self.nodes.values():
            if node.up:
                self._crash(node)
                node.crash_after_vote = self.rng.random() < 0.5
                delay = self.rng.randrange(1 * MS, 5 * MS)
                self.at(delay, lambda nid=node.id: self._restart(nid))

    def _pick_node(self) -> str:
        """A random node, half the time the leader of some group (where faults hurt)."""
        if self.rng.random() < 0.5:
            g = self.rng.choice(self.groups)
            for nid in self.node_ids:
                raft = self.nodes[nid].replicas[g].raft
                if raft is not None and raft.role == Role.LEADER:
                    return nid
        return self.rng.choice(self.node_ids)

    def _fault_crash(self) -> None:
        node = self.nodes[self._pick_node()]
        if not node.up:
            return
        if self.rng.random() < 0.3:
            node.crash_after_vote = True
            return
        if self.rng.random() < 0.3:
            node.crash_after_fsync = True  # crash at its next fsync, before sending
        else:
            self._crash(node)
        if self.rng.random() < 0.4:
            down_us = self.rng.randrange(1 * MS, 10 * MS)  # a quick bounce, mid-election
        else:
            down_us = self.rng.randrange(20 * MS, 150 * MS)
        self.at(down_us, lambda: self._restart(node.id))

    def _fault_transfer(self) -> None:
        for node in self.nodes.values():
            for g, rep in node.replicas.items():
                if node.up and rep.raft is not None and rep.raft.role == Role.LEADER:
                    voters = rep.raft.status().conf.voters
                    to = self.rng.choice([i for i in voters if i != node.id])
                    self._guarded(node, g, lambda r, to=to: r.transfer_leadership(to))
                    return

    def _leader_of(self, group: str) -> Node | None:
        for node in self.nodes.values():
            raft = node.replicas[group].raft
            if node.up and raft is not None and raft.role == Role.LEADER:
                return node
        return None

    def _fault_membership(self) -> None:
        """One single-server change: add a learner, promote one, or remove a voter (the
        leader included), keeping at least three voters. Only with check-quorum: a removed
        server that keeps campaigning is ignored thanks to the leader lease (thesis
        §4.2.3); without it plain Raft lets it disrupt the group forever."""
        if not self.p.check_quorum:
            return
        g = self.rng.choice(self.groups)
        node = self._leader_of(g)
        if node is None:
            return
        raft = node.replicas[g].raft
        assert raft is not None
        conf = raft.status().conf
        outside = [i for i in self.node_ids if i not in conf.voters + conf.learners]
        if conf.learners and self.rng.random() < 0.7:
            cc = ConfChange(ConfChangeType.ADD_VOTER, self.rng.choice(conf.learners))
        elif outside and self.rng.random() < 0.7:
            cc = ConfChange(ConfChangeType.ADD_LEARNER, self.rng.choice(outside))
        elif len(conf.voters) > 3:
            cc = ConfChange(ConfChangeType.REMOVE, self.rng.choice(conf.voters))
        else:
            return
        try:
            self._guarded(node, g, lambda r: r.propose_conf_change(cc) and None)
            self.stats["conf_changes"] += 1
        except (ConfChangePendingError, TransferInProgressError, LimitError):
            pass

    def _fault_corrupt(self) -> None:
        if self.stats["corruptions"]:
            return  # one bad disk per run: the groups keep a quorum
        node = self.nodes[self.rng.choice(self.node_ids)]
        rep = node.replicas[self.rng.choice(self.groups)]
        st = rep.storage
        has_entries = st.last_index() >= st.first_index()
        if has_entries and st.corrupt(self.rng.randrange(st.first_index(), st.last_index() + 1)):
            self.stats["corruptions"] += 1

    def _heal_all(self) -> None:
        self.faults_on = False
        self.blocked.clear()
        self.p_drop = self.p_dup = 0.0
        for nid, node in self.nodes.items():
            node.crash_after_fsync = node.crash_after_vote = False
            self._restart(nid)

    # ------------------------------------------------------------------ clients
    def _issue(self, c: Client) -> None:
        if not self.clients_on:
            return
        key = self.rng.choice(c.keys)
        if self.ops_issued.get(key, 0) >= self.p.ops_per_key_max:
            return  # this client stops: bounded histories keep the checker fast
        self.ops_issued[key] = self.ops_issued.get(key, 0) + 1
        self._op_ids += 1
        kind = self.rng.choice(("put", "put", "get", "get", "cas"))
        a, b = self.rng.randrange(1, 6), self.rng.randrange(1, 6)
        if kind == "cas":
            a = self.rng.choice((0, a))
        cmd = Command(self._op_ids, kind, key, a, b)
        p = Pending(self._op_ids, c, cmd, self.now, via_read_index=kind == "get" and a % 2 == 0)
        c.current = p
        self.stats["ops"] += 1
        self.at(0, lambda: self._attempt(p))
        self.at(300 * MS, lambda: self._finish(p, None))  # client timeout: outcome unknown

    def _attempt(self, p: Pending) -> None:
        if p.done:
            return
        node = self.nodes[p.client.target]
        rep = node.replicas[p.client.group]
        if not node.up or rep.raft is None:
            p.client.target = self.rng.choice(self.node_ids)
            self.at(5 * MS, lambda: self._attempt(p))
            return
        p.node = node.id
        try:
            self._call(node, rep, p)
        except DataLossError:
            self._crash(node, failed=True)

    def _call(self, node: Node, rep: Replica, p: Pending) -> None:
        raft = rep.raft
        assert raft is not None
        try:
            if p.via_read_index:
                ctx = f"{p.op_id}".encode()
                raft.read_index(ctx)
                rep.reads[ctx] = p
            else:
                index = raft.propose(p.cmd.encode())
                rep.waiters.setdefault(index, []).append(p)
        except NotLeaderError as e:
            p.client.target = e.leader or self.rng.choice(self.node_ids)
            self.at(1 * MS, lambda: self._attempt(p))
            return
        except (NoLeaderError, TransferInProgressError, LimitError):
            p.client.target = self.rng.choice(self.node_ids)
            self.at(10 * MS, lambda: self._attempt(p))
            return
        self._guarded(node, p.client.group, lambda r: None)

    def _finish(self, p: Pending, result: int | bool | None, *, failed: bool = False) -> None:
        if p.done:
            return
        p.done = True
        cmd = p.cmd
        known = result is not None
        if not failed and (known or cmd.kind != "get"):
            # A write with unknown outcome may or may not have happened; a read with
            # unknown outcome says nothing and is left out.
            op = Op(cmd.kind, cmd.a, cmd.b, result, p.invoke, self.now if known else None)
            self.history.setdefault(cmd.key, []).append(op)
        c = p.client
        if c.current is p:
            c.current = None
            self.at(self.rng.randrange(0, 40 * MS), lambda: self._issue(c))

    # ------------------------------------------------------------------ end checks
    def _check_converged(self) -> None:
        """Liveness once all faults are gone: every group has one leader and every live
        replica has applied everything that leader committed."""
        for g in self.groups:
            live = [n.replicas[g] for n in self.nodes.values() if n.up]
            rafts = [r.raft for r in live if r.raft is not None]
            leaders = [r for r in rafts if r.role == Role.LEADER]
            if len(leaders) != 1:
                raise self.fail(f"{g}: {len(leaders)} leaders after healing")
            st = leaders[0].status()
            members = st.conf.voters + st.conf.learners
            commit = st.commit
            lagging = [
                (r.node, r.applied) for r in live if r.node in members and r.applied < commit
            ]
            if lagging:
                raise self.fail(f"{g}: replicas behind commit {commit} after healing: {lagging}")

    def _check_linearizable(self) -> None:
        for key, ops in sorted(self.history.items()):
            if check_register(ops).ok is not True:
                lines = "\n  ".join(o.describe() for o in sorted(ops, key=lambda o: o.invoke))
                raise self.fail(f"history of {key} is not linearizable:\n  {lines}")
