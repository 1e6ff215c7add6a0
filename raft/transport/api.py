"""The contract of a Raft transport: best-effort, per-peer ordered delivery of batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from raftstream.raft.types import Message, MessageType

__all__ = ["MessageHandler", "Transport", "snapshot_failed"]

MessageHandler = Callable[[list[Message]], None]
"""Receives the messages of one incoming batch, on the transport's event loop. Must not block:
the host only queues them for its next round."""


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

    def send(self, peer: str, messages: Sequence[Message]) -> None:
        """Queue one round's messages for ``peer`` (all with ``src == node_id``, ``dst ==
        peer``). Never blocks; when the peer's queue is full the oldest batches are dropped."""
        ...

    async def close(self) -> None:
        """Stop sending and receiving; queued messages are dropped."""
        ...


def snapshot_failed(m: Message) -> Message:
    """The report of an undelivered SNAPSHOT ``m``, as if its receiver had rejected it."""
    return Message(
        MessageType.SNAPSHOT_RESP, m.group, src=m.dst, dst=m.src, term=m.term, reject=True
    )
