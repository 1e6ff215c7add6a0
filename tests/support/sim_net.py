"""A synchronous in-memory cluster of RaftNodes for one group: the test bench of the
paper tests. Messages are delivered in FIFO rounds until the cluster is quiet; filters
drop traffic between chosen nodes. Storage is the in-memory log (MemoryGroupLog), written from each
Ready exactly as a driver would (persist, then send, then apply, then advance)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from raftstream.raft.core import RaftConfig, RaftNode
from raftstream.raft.storage import MemoryGroupLog
from raftstream.raft.types import Entry, EntryType, Message, ReadState, Ready, Snapshot


@dataclass
class Replica:
    """One node: its durable storage, its RaftNode, and what it applied."""

    id: str
    storage: MemoryGroupLog
    node: RaftNode
    applied: list[Entry] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    installed: list[Snapshot] = field(default_factory=list)

    def persist(self, rd: Ready) -> None:
        # Persist before anything of this Ready is sent (the driver contract).
        if rd.snapshot is not None:
            self.storage.apply_snapshot(rd.snapshot)
        self.storage.append(rd.entries)
        if rd.hard_state is not None:
            self.storage.set_hard_state(rd.hard_state)

    def apply(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.installed.append(rd.snapshot)
        self.applied.extend(rd.committed_entries)
        self.read_states.extend(rd.read_states)

    def data(self) -> list[bytes]:
        """Applied commands (no-ops and conf changes left out)."""
        return [e.data for e in self.applied if e.type == EntryType.NORMAL and e.data]


Filter = Callable[[Message], bool]  # True: drop


class Network:
    def __init__(
        self,
        ids: Iterable[str],
        *,
        group: str = "g",
        seed: int = 0,
        voters: Iterable[str] | None = None,
        learners: Iterable[str] = (),
        **cfg: Any,
    ) -> None:
        self.ids = list(ids)
        self.group = group
        self.seed = seed
        self.cfg = cfg
        self.voters = tuple(voters) if voters is not None else tuple(self.ids)
        self.learners = tuple(learners)
        self.replicas: dict[str, Replica] = {}
        self.filters: list[Filter] = []
        self.sent: list[Message] = []  # every message delivered, for inspection
        # Rewrites (or drops, returning None) a message in flight: for scripted scenarios.
        self.transform: Callable[[Message], Message | None] | None = None
        self.queue: list[Message] = []
        for i in self.ids:
            self.add(i, MemoryGroupLog())

    def add(
        self,
        id: str,
        storage: MemoryGroupLog,
        *,
        voters: tuple[str, ...] | None = None,
        learners: tuple[str, ...] | None = None,
        applied: int = 0,
    ) -> Replica:
        config = RaftConfig(
            id=id,
            group=self.group,
            rng=random.Random(f"{self.seed}/{id}"),
            voters=self.voters if voters is None else voters,
            learners=self.learners if learners is None else learners,
            applied=applied,
            **self.cfg,
        )
        rep = Replica(id, storage, RaftNode(config, storage))
        self.replicas[id] = rep
        return rep

    def restart(self, id: str) -> Replica:
        """Crash ``id`` and start it again from what it persisted."""
        return self.add(id, self.replicas[id].storage)

    def __getitem__(self, id: str) -> RaftNode:
        return self.replicas[id].node

    # -- traffic --
    def drain(self, id: str) -> list[Message]:
        """Run ``id``'s Ready cycle until it has nothing left; returns messages to send."""
        rep = self.replicas[id]
        out: list[Message] = []
        while rep.node.has_ready():
            rd = rep.node.ready()
            rep.persist(rd)
            out.extend(rd.messages)
            rep.apply(rd)
            rep.node.advance(rd)
        return out

    def collect(self) -> None:
        for i in list(self.replicas):
            self.queue.extend(self.drain(i))

    def deliver(self, m: Message) -> None:
        if any(f(m) for f in self.filters) or m.dst not in self.replicas:
            return
        if self.transform is not None:
            changed = self.transform(m)
            if changed is None:
                return
            m = changed
        self.sent.append(m)
        self.replicas[m.dst].node.step(m)

    def stabilize(self, max_rounds: int = 1000) -> None:
        """Deliver messages until no node has anything more to say."""
        for _ in range(max_rounds):
            self.collect()
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            for m in batch:
                self.deliver(m)
        raise AssertionError("network did not settle")

    def tick(self, id: str, n: int = 1) -> None:
        for _ in range(n):
            self.replicas[id].node.tick()

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for rep in self.replicas.values():
                rep.node.tick()
            self.stabilize()

    def elect(self, id: str) -> None:
        self[id].campaign()
        self.stabilize()

    def propose(self, id: str, data: bytes) -> int:
        index = self[id].propose(data)
        self.stabilize()
        return index

    # -- faults --
    def isolate(self, id: str) -> Filter:
        f: Filter = lambda m: m.src == id or m.dst == id  # noqa: E731
        self.filters.append(f)
        return f

    def cut(self, a: str, b: str) -> Filter:
        f: Filter = lambda m: {m.src, m.dst} == {a, b}  # noqa: E731
        self.filters.append(f)
        return f

    def heal(self) -> None:
        self.filters.clear()

    def leader(self) -> str | None:
        leaders = [i for i, r in self.replicas.items() if r.node.role.name == "LEADER"]
        terms = {i: self[i].term for i in leaders}
        if not leaders:
            return None
        return max(leaders, key=lambda i: terms[i])
