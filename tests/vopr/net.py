"""The simulated network between the nodes' Raft hosts: every batch a host sends passes
through here, and the run's seed decides its fate.

A batch is encoded to its wire form and decoded on arrival, as the gRPC transport does, then
it is dropped (``p_drop``, or a cut link), duplicated (``p_dup``), and delivered after a
latency drawn between ``latency_s_min`` and ``latency_s_max``. Per link, delivery keeps the
order of sending (the ``Transport`` contract: messages to one peer arrive in order, or not
at all), except for the ``p_reorder`` share of batches, which may overtake. Links are cut one
way at a time (``cut(src, dst)``), which makes symmetric partitions and one-way ones alike.

A SNAPSHOT that cannot be delivered comes back to its sender as a rejected SNAPSHOT_RESP
(``snapshot_failed``), as the real transport reports it.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Sequence
from dataclasses import dataclass

from raftstream.proto import raft_pb2 as pb
from raftstream.raft.transport import Inbound, MessageHandler, Transport
from raftstream.raft.transport.api import snapshot_failed
from raftstream.raft.transport.convert import from_batch, to_batches
from raftstream.raft.types import Message, MessageType

__all__ = ["NetParams", "SimNetwork", "SimTransport"]


@dataclass(frozen=True)
class NetParams:
    latency_s_min: float
    latency_s_max: float
    p_drop: float
    p_dup: float
    p_reorder: float

    @classmethod
    def from_rng(cls, rng: random.Random) -> NetParams:
        lo = rng.choice((0.0002, 0.0005, 0.001))
        return cls(
            latency_s_min=lo,
            latency_s_max=lo * rng.choice((2, 5, 20)),
            p_drop=rng.choice((0.0, 0.01, 0.05)),
            p_dup=rng.choice((0.0, 0.01)),
            p_reorder=rng.choice((0.0, 0.0, 0.02)),
        )


class SimNetwork:
    """Links between the nodes named in ``attach``; faults only while ``faulty``."""

    def __init__(self, rng: random.Random, params: NetParams) -> None:
        self._rng = rng
        self.params = params
        self.faulty = True
        self._transports: dict[str, SimTransport] = {}
        self._cut: set[tuple[str, str]] = set()
        self._last_due: dict[tuple[str, str], float] = {}
        self.stats: collections.Counter[str] = collections.Counter()

    # -- faults ----------------------------------------------------------------------------

    def cut(self, src: str, dst: str) -> None:
        """Drop every batch from ``src`` to ``dst`` until ``heal``."""
        self._cut.add((src, dst))

    def isolate(self, node: str, nodes: Sequence[str]) -> None:
        for other in nodes:
            if other != node:
                self.cut(node, other)
                self.cut(other, node)

    def heal(self) -> None:
        self._cut.clear()

    @property
    def cuts(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._cut)

    # -- delivery --------------------------------------------------------------------------

    def attach(self, transport: SimTransport) -> None:
        self._transports[transport.node_id] = transport

    def detach(self, transport: SimTransport) -> None:
        if self._transports.get(transport.node_id) is transport:
            del self._transports[transport.node_id]

    def _due(self, src: str, dst: str, now: float) -> float:
        p = self.params
        due = now + self._rng.uniform(p.latency_s_min, p.latency_s_max)
        link = (src, dst)
        if self.faulty and self._rng.random() < p.p_reorder:
            self.stats["reordered"] += 1
            return due  # may overtake what this link sent before
        due = max(due, self._last_due.get(link, 0.0))
        self._last_due[link] = due
        return due

    def send(self, src: str, dst: str, wire: bytes | Message) -> None:
        """Schedule one batch (its wire bytes) or one SNAPSHOT message from ``src``."""
        loop = asyncio.get_running_loop()
        self.stats["sent"] += 1
        copies = 1
        if (src, dst) in self._cut:
            copies = 0
            self.stats["cut"] += 1
        elif self.faulty and self._rng.random() < self.params.p_drop:
            copies = 0
            self.stats["dropped"] += 1
        elif self.faulty and self._rng.random() < self.params.p_dup:
            copies = 2
            self.stats["duplicated"] += 1
        if copies == 0 and isinstance(wire, Message):
            loop.call_at(self._due(src, src, loop.time()), self._bounce, wire)
        for _ in range(copies):
            loop.call_at(self._due(src, dst, loop.time()), self._arrive, src, dst, wire)

    def _arrive(self, src: str, dst: str, wire: bytes | Message) -> None:
        target = self._transports.get(dst)
        if (src, dst) in self._cut or target is None:
            if isinstance(wire, Message):
                self._bounce(wire)
            return
        self.stats["delivered"] += 1
        if isinstance(wire, Message):
            if not target.receive(Inbound(src, [wire])):
                self._bounce(wire)
        else:
            target.receive(from_batch(pb.Batch.FromString(wire)))

    def _bounce(self, m: Message) -> None:
        sender = self._transports.get(m.src)
        if sender is not None:
            sender.receive(Inbound(m.src, [snapshot_failed(m)]))


class SimTransport:
    """One node's end of a ``SimNetwork`` (the ``Transport`` protocol)."""

    def __init__(self, node_id: str, network: SimNetwork) -> None:
        self._node_id = node_id
        self._net = network
        self._handler: MessageHandler | None = None
        self._closed = False
        network.attach(self)

    @property
    def node_id(self) -> str:
        return self._node_id

    def bind(self, handler: MessageHandler) -> None:
        self._handler = handler

    def send(
        self, peer: str, messages: Sequence[Message], quiesce: Sequence[tuple[str, int]] = ()
    ) -> None:
        if self._closed:
            return
        plain = [m for m in messages if m.type != MessageType.SNAPSHOT]
        for batch in to_batches(self._node_id, peer, plain, 4 << 20, quiesce):
            self._net.send(self._node_id, peer, batch.SerializeToString())
        for m in messages:
            if m.type == MessageType.SNAPSHOT:
                self._net.send(self._node_id, peer, m)

    def receive(self, inbound: Inbound) -> bool:
        if self._closed or self._handler is None:
            return False
        self._handler(inbound)
        return True

    def close_now(self) -> None:
        """A crash: nothing more goes out or comes in."""
        self._closed = True
        self._net.detach(self)

    async def close(self) -> None:
        self.close_now()


def _conforms(transport: SimTransport) -> Transport:
    return transport
