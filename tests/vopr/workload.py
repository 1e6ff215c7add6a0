"""The simulation's clients: publishers and consumers calling the nodes' stream groups, as
the services do for a gRPC client, through a client link the seed can cut.

A publisher publishes unique payloads, half of them with a msg id; an outcome it did not see
(an error, a timeout, a reply lost on its link) is unknown, and only a publish with a msg id
is retried (the retry is answered with the original's sequence). A consumer client runs one
pull at a time on its own durable consumer and acks what it got: half the acks are
proposed at once (``ack_sync``), four in ten lazily (with the group's next round, as
fire-and-forget acks are), and the rest are left to redeliver after ``ack_wait``.

What the clients saw goes into the ``History`` the checkers read: each PubAck, each delivery,
each ack whose commit was confirmed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer_pull import PullEvent
from raftstream.errors import NotLeaderError, RaftStreamError

from .node import SimNode

__all__ = ["ClientParams", "History", "consumer_client", "publisher"]

CALL_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ClientParams:
    publishers: int
    consumers: int
    p_link_cut: float  # a call whose request or reply the client link loses (while faulty)
    pause_s_max: float  # between one client's calls

    @classmethod
    def from_rng(cls, rng: random.Random) -> ClientParams:
        return cls(
            publishers=rng.choice((1, 2, 3)),
            consumers=rng.choice((1, 2)),
            p_link_cut=rng.choice((0.0, 0.02, 0.05)),
            pause_s_max=rng.choice((0.005, 0.02, 0.05)),
        )


@dataclass
class History:
    """What the clients saw, and what the checkers found wrong with it."""

    acked: dict[bytes, int] = field(default_factory=dict)  # payload -> its PubAck's sequence
    acked_at: dict[int, bytes] = field(default_factory=dict)  # sequence -> payload
    acked_max: int = 0  # the highest sequence acked so far (a read must see it)
    synced_acks: dict[str, set[int]] = field(default_factory=dict)  # consumer -> sequences
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    violations: list[str] = field(default_factory=list)

    def pub_acked(self, payload: bytes, seq: int) -> None:
        self.counts["publish ok"] += 1
        prior = self.acked.setdefault(payload, seq)
        if prior != seq:
            self.violations.append(f"{payload!r} acked as seq {prior}, then as {seq}")
        self.acked_max = max(self.acked_max, seq)
        holder = self.acked_at.setdefault(seq, payload)
        if holder != payload:
            self.violations.append(f"seq {seq} acked for {holder!r} and for {payload!r}")

    def delivered(self, consumer: str, seq: int, data: bytes) -> None:
        self.counts["delivered"] += 1
        if seq in self.synced_acks.get(consumer, ()):
            self.violations.append(f"consumer {consumer}: seq {seq} delivered after its ack")
        payload = self.acked_at.get(seq)
        if payload is not None and payload != data:
            self.violations.append(f"seq {seq} delivered as {data!r}, acked as {payload!r}")


class Clients:
    """Shared by the clients of one run: the nodes, the seed's choices, the history."""

    def __init__(
        self,
        rng: random.Random,
        params: ClientParams,
        nodes: dict[str, SimNode],
        group: str,
        history: History,
        faulty: Callable[[], bool],
    ) -> None:
        self.rng = rng
        self.params = params
        self.nodes = nodes
        self.group = group
        self.history = history
        self._faulty = faulty
        self.stopping = False
        self._hint: str | None = None
        self.background: set[asyncio.Task[None]] = set()  # the simulation cancels them at its end

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def pick_node(self) -> SimNode:
        """The node a client calls: the last leader it was told of, mostly."""
        names = sorted(self.nodes)
        name = self._hint if self._hint and self.rng.random() < 0.8 else self.rng.choice(names)
        return self.nodes[name]

    def pick(self) -> StreamGroup | None:
        """The group on the node a client calls (``pick_node``)."""
        return self.pick_node().group(self.group)

    def learn(self, exc: RaftStreamError) -> None:
        if isinstance(exc, NotLeaderError) and exc.leader in self.nodes:
            self._hint = exc.leader
        else:
            self._hint = None

    def follow(self, leader: str | None) -> None:
        """Call ``leader`` next, mostly (a node that does not lead names the one it knows)."""
        self._hint = leader if leader in self.nodes else None

    def link_cut(self) -> bool:
        return self._faulty() and self.rng.random() < self.params.p_link_cut

    async def pause(self, at_least_s: float = 0.0) -> None:
        await asyncio.sleep(max(at_least_s, self.rng.uniform(0.001, self.params.pause_s_max)))


async def publisher(cl: Clients, cid: int) -> None:
    k = 0
    while not cl.stopping:
        k += 1
        payload = f"c{cid}-{k}".encode()
        msg_id = payload.decode() if cl.rng.random() < 0.5 else None
        for _ in range(20 if msg_id else 1):
            if cl.stopping or await _publish_once(cl, payload, msg_id):
                break
            await cl.pause(0.01)
        await cl.pause()


async def _publish_once(cl: Clients, payload: bytes, msg_id: str | None) -> bool:
    """One call; True once its PubAck was seen."""
    g = cl.pick()
    if g is None:
        cl.history.counts["publish refused (node down)"] += 1
        return False
    if cl.link_cut():  # the request or the reply is lost: the client waits out its timeout
        cl.history.counts["publish link cut"] += 1
        if cl.rng.random() < 0.5:
            cl.spawn(_unseen(g, payload, msg_id))
        await asyncio.sleep(CALL_TIMEOUT_S)
        return False
    try:
        ack = await g.publish({"subject": "q.a", "data": payload, "msg_id": msg_id}, CALL_TIMEOUT_S)
    except RaftStreamError as exc:
        cl.history.counts[f"publish {exc.code.name}"] += 1
        cl.learn(exc)
        return False
    cl.history.pub_acked(payload, ack.seq)
    return True


async def _unseen(g: StreamGroup, payload: bytes, msg_id: str | None) -> None:
    """A publish whose reply the client link lost: it may well be stored."""
    with contextlib.suppress(RaftStreamError):
        await g.publish({"subject": "q.a", "data": payload, "msg_id": msg_id}, CALL_TIMEOUT_S)


async def reader(cl: Clients) -> None:
    """Reads the stream's state as the servicers read it (``read_leader_group`` in
    cluster/services/context.py: a ready leader group, then a ReadIndex round, then the
    replica's store): each read must see every publish acknowledged before it began (a
    linearizable read; a deposed leader's stale state is a violation)."""
    while not cl.stopping:
        await cl.pause()
        node = cl.pick_node()
        g, host = node.group(cl.group), node.host
        if g is None or host is None or not g.ready:
            cl.history.counts["read refused (not ready)"] += 1
            if host is not None and cl.group in host.groups():
                cl.follow(host.leader(cl.group))
            continue
        floor = cl.history.acked_max
        try:
            await host.read_index(cl.group, timeout_ms=int(CALL_TIMEOUT_S * 1000))
        except RaftStreamError as exc:
            cl.history.counts[f"read {exc.code.name}"] += 1
            cl.learn(exc)
            continue
        last = g.replica.store.state().last_seq
        cl.history.counts["read ok"] += 1
        if last < floor:
            cl.history.violations.append(
                f"stale read on {node.name}: last seq {last}, but seq {floor} was acked"
                " before the read began"
            )


async def consumer_client(cl: Clients, name: str) -> None:
    cl.history.synced_acks.setdefault(name, set())
    while not cl.stopping:
        g = cl.pick()
        if g is None or not g.ready:
            await cl.pause(0.01)
            continue
        events = await _pull(cl, g, name)
        if events is None:
            await cl.pause(0.01)
            continue
        seqs = []
        for e in events:
            if e.delivery is not None:
                cl.history.delivered(name, e.delivery.msg.seq, e.delivery.msg.data)
                seqs.append(e.delivery.msg.seq)
        if seqs:
            await _ack(cl, g, name, seqs)
        await cl.pause()


async def _pull(cl: Clients, g: StreamGroup, name: str) -> list[PullEvent] | None:
    try:
        handle = await g.open_pull(name, {"batch": 16, "no_wait": True}, CALL_TIMEOUT_S)
    except RaftStreamError as exc:
        cl.history.counts[f"pull {exc.code.name}"] += 1
        cl.learn(exc)
        return None
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            events = await handle.take()
    except TimeoutError:
        return None
    finally:
        handle.close()
    cl.history.counts["pull ok"] += 1
    if cl.link_cut():
        cl.history.counts["pull link cut"] += 1
        return None  # delivered, never seen: redelivered after ack_wait
    return events


async def _ack(cl: Clients, g: StreamGroup, name: str, seqs: list[int]) -> None:
    how = cl.rng.random()
    if how < 0.1:
        return  # not acked: redelivered after ack_wait
    lazy = how < 0.5
    try:
        c = g.leader_consumer(name)
        # As the service does (cluster/services/consume.py, _ack_many): what the leader copy
        # has not delivered is refused, not acked.
        known = [s for s in seqs if not c.state.will_deliver(s)]

        def decide(now: int) -> list[PullEvent]:
            c.ack_many(known, now)
            return []

        await g.run(c, decide, CALL_TIMEOUT_S, lazy=lazy)
    except RaftStreamError as exc:
        cl.history.counts[f"ack {exc.code.name}"] += 1
        cl.learn(exc)
        if isinstance(exc, NotLeaderError) and " is moving to " in str(exc):
            # A consumer decision waits out a transfer before it is made (StreamGroup.run),
            # and a transfer takes the proposals already queued into the log first
            # (RaftHost.transfer_leadership): the core may refuse none of them.
            cl.history.violations.append(
                f"consumer {name}: an ack lost across a leadership transfer ({exc})"
            )
        return
    if cl.link_cut():
        cl.history.counts["ack link cut"] += 1
        return  # committed, but the client never heard: it does not count it
    cl.history.counts["ack lazy" if lazy else "ack sync"] += 1
    # A lazy op goes with the group's next round, but ``run`` still returns once it is
    # committed: either way the client saw the ack kept.
    cl.history.synced_acks[name].update(known)
