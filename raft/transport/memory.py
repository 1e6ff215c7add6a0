"""The in-memory twin of the gRPC transport: same batching and wire conversion, no sockets.

Batches go through the protobuf conversion (and a serialize/parse round trip), so tests on
the twin exercise the same coalescing as the real thing. Delivery is asynchronous (scheduled
on the event loop, never re-entrant) and a node can be taken down to drop its traffic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from raftstream.proto import raft_pb2 as pb
from raftstream.raft.transport.api import Inbound, MessageHandler, Transport, snapshot_failed
from raftstream.raft.transport.convert import from_batch, to_batches
from raftstream.raft.types import Message, MessageType

__all__ = ["MemoryNetwork", "MemoryTransport"]

log = logging.getLogger(__name__)


class MemoryNetwork:
    """The transports of one test, by node id. Owned by one event loop."""

    def __init__(self) -> None:
        self._nodes: dict[str, MemoryTransport] = {}
        self._down: set[str] = set()
        self._muted: set[str] = set()
        self.batches_sent = 0

    def attach(self, transport: MemoryTransport) -> None:
        self._nodes[transport.node_id] = transport

    def detach(self, node: str) -> None:
        self._nodes.pop(node, None)

    def set_down(self, node: str, down: bool) -> None:
        """A down node neither sends nor receives (its links are cut both ways)."""
        if down:
            self._down.add(node)
        else:
            self._down.discard(node)

    def set_muted(self, node: str, muted: bool) -> None:
        """A muted node still receives, but what it sends is lost: how its peers see a
        node whose event loop is stalled (it reads what queued once it runs again)."""
        if muted:
            self._muted.add(node)
        else:
            self._muted.discard(node)

    def route(self, src: str, dst: str) -> MemoryTransport | None:
        if src in self._down or dst in self._down or src in self._muted:
            return None
        return self._nodes.get(dst)


class MemoryTransport:
    """Transport over a MemoryNetwork (see ``Transport`` for the contract)."""

    def __init__(
        self, node_id: str, network: MemoryNetwork, *, batch_bytes_max: int = 4 << 20
    ) -> None:
        self._node_id = node_id
        self._network = network
        self._batch_bytes_max = batch_bytes_max
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
        loop = asyncio.get_running_loop()
        plain = [m for m in messages if m.type != MessageType.SNAPSHOT]
        for batch in to_batches(self._node_id, peer, plain, self._batch_bytes_max, quiesce):
            wire = batch.SerializeToString()
            self._network.batches_sent += 1
            loop.call_soon(self._deliver_batch, peer, wire)
        for m in messages:
            if m.type == MessageType.SNAPSHOT:
                loop.call_soon(self._deliver_snapshot, peer, m)

    def _deliver_batch(self, peer: str, wire: bytes) -> None:
        target = self._network.route(self._node_id, peer)
        if target is not None:
            target.receive(from_batch(pb.Batch.FromString(wire)))

    def _deliver_snapshot(self, peer: str, m: Message) -> None:
        target = self._network.route(self._node_id, peer)
        if target is None or not target.receive(Inbound(self._node_id, [m])):
            self.receive(Inbound(self._node_id, [snapshot_failed(m)]))

    def receive(self, inbound: Inbound) -> bool:
        """Hand ``inbound`` to the bound handler; False if nobody is listening."""
        if self._closed or self._handler is None:
            return False
        self._handler(inbound)
        return True

    async def close(self) -> None:
        self._closed = True
        self._network.detach(self._node_id)


def _conforms(transport: MemoryTransport) -> Transport:
    """Static check (mypy) that MemoryTransport implements the Transport Protocol."""
    return transport
