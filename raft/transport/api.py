"""The contract of a Raft transport: best-effort, per-peer ordered delivery of batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from raftstream.raft.types import Message, MessageType

__all__ = ["Inbound", "MessageHandler", "Transport", "snapshot_failed"]


@dataclass(frozen=True, slots=True)
class Inbound:
    """What one incoming batch brought from node ``src`` (an empty one is a liveness ping).
    ``src`` is this node's own id for reports the transport makes up itself (a snapshot that
    could not be delivered): they say nothing about the peer being alive."""

    src: str
    messages: list[Message] = field(default_factory=list)
    quiesce: list[tuple[str, int]] = field(default_factory=list)  # (group, leader's term)


MessageHandler = Callable[[Inbound], None]
"""Receives each incoming batch, on the transport's event loop. Must not block: the host only
queues the messages for its next round."""


class Transport(Protocol):
    """Moves the messages of every group between this node and its peers.

    Owned by one asyncio event loop: every method is called on it, and the handler is called
    on it. Delivery is best effort (Raft tolerates loss, duplication and delay): messages to one
    peer arrive in the order sent, or not at all. A SNAPSHOT message is streamed separately; if
    it cannot be delivered, the transport hands its own node a rejected SNAPSHOT_RESP for that
    group (see ``snapshot_failed``), so the leader's core knows to retry.
    """

    @property
    def node_id(self) -> str: ...

    def bind(self, handler: MessageHandler) -> None:
        """Set the receiver of incoming messages; before it is bound, they are dropped."""
        ...

    def send(
        self, peer: str, messages: Sequence[Message], quiesce: Sequence[tuple[str, int]] = ()
    ) -> None:
        """Queue one round's messages for ``peer`` (all with ``src == node_id``, ``dst ==
        peer``) and the groups this node quiesced. With nothing at all, sends an empty batch
        (a liveness ping). Never blocks; when the peer's queue is full the oldest batches
        are dropped."""
        ...

    async def close(self) -> None:
        """Stop sending and receiving; queued messages are dropped."""
        ...


def snapshot_failed(m: Message) -> Message:
    """The report of an undelivered SNAPSHOT ``m``, as if its receiver had rejected it."""
    return Message(
        MessageType.SNAPSHOT_RESP, m.group, src=m.dst, dst=m.src, term=m.term, reject=True
    )
