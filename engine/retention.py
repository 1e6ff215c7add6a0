"""Interest and workqueue retention: which messages a stream's consumers still hold.

``ConsumerSet`` is the consumer side of the stream's ``RetentionPolicyHook``
(``engine/stream.py``): the stream asks it ``has_interest(subject)`` on publish and
``is_needed(seq, subject)`` before removing a message; the set in turn is every consumer's
``RetentionListener``, so when a consumer settles messages (ack, term, max deliveries, an
ack-none delivery) or goes away, the set calls ``Stream.release(seq)`` or
``Stream.sweep_interest()`` and the stream removes what nobody needs any more.

Rules (JetStream's):

- limits: consumers never remove messages;
- interest: a message stays while some consumer whose filter matches it still holds it
  (not yet delivered, or delivered and unsettled); a message nobody's filter matches is not
  kept at all; deleting the last interested consumer releases its holds;
- workqueue: a message stays until the one consumer whose filter matches it settles it;
  with no such consumer it waits for one. Two consumers may never take the same subject
  (``consumer_config.check_workqueue_filters``), which ``add`` enforces again.

Every answer is a function of the consumers' replicated state, and the calls happen on the
consumers' apply path, so every replica removes the same messages. Owned by the thread that
applies the stream's and its consumers' ops; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import RetentionKind, check_workqueue_filters
from raftstream.errors import AlreadyExistsError, InvalidArgumentError

__all__ = ["ConsumerSet", "StreamReleaser"]


class StreamReleaser(Protocol):
    """The stream side of retention (``engine.stream.Stream`` is one)."""

    def release(self, seq: int) -> bool:
        """Remove ``seq`` unless the hook says it is still needed; True when removed."""
        ...

    def sweep_interest(self) -> int:
        """Interest streams: remove every message no consumer needs; returns the count."""
        ...


class ConsumerSet:
    """The consumers of one stream, answering its retention questions.

    Build it, attach it to the stream (``stream.set_retention_hook(cs)``) and to the stream
    releaser (``cs.attach(stream)``), and create every consumer with ``retention=cs`` before
    ``add``-ing it. ``retention`` is the stream's policy.
    """

    def __init__(self, *, retention: RetentionKind, stream: StreamReleaser | None = None) -> None:
        self._kind = RetentionKind(retention)
        self._stream = stream
        self._consumers: dict[str, Consumer] = {}

    def attach(self, stream: StreamReleaser) -> None:
        self._stream = stream

    @property
    def retention(self) -> RetentionKind:
        return self._kind

    def __len__(self) -> int:
        return len(self._consumers)

    def __contains__(self, name: object) -> bool:
        return name in self._consumers

    def get(self, name: str) -> Consumer | None:
        return self._consumers.get(name)

    def add(self, consumer: Consumer) -> None:
        """Track ``consumer``. Workqueue: its filters may not overlap another consumer's
        (``InvalidArgumentError``); a name already tracked is ``AlreadyExistsError``."""
        if consumer.name in self._consumers:
            raise AlreadyExistsError(f"consumer {consumer.name!r} already exists")
        if consumer.deleted:
            raise InvalidArgumentError("consumer", "is deleted")
        if self._kind is RetentionKind.WORKQUEUE:
            check_workqueue_filters(consumer.config, (c.config for c in self._consumers.values()))
        self._consumers[consumer.name] = consumer

    # -- RetentionPolicyHook (asked by the stream) ------------------------------------------

    def has_interest(self, subject: str) -> bool:
        """True when some consumer's filter matches ``subject``."""
        return any(c.matches(subject) for c in self._consumers.values())

    def is_needed(self, seq: int, subject: str) -> bool:
        """True while the retention policy keeps ``seq`` on behalf of the consumers."""
        if self._kind is RetentionKind.LIMITS:
            return True
        matching = [c for c in self._consumers.values() if c.matches(subject)]
        if self._kind is RetentionKind.WORKQUEUE and not matching:
            return True  # a work item waits for a consumer to take it
        return any(c.needs_ack(seq) for c in matching)

    # -- RetentionListener (told by the consumers) ------------------------------------------

    def released(self, consumer: Consumer, stream_seqs: Sequence[int], *, rescan: bool) -> None:
        """``consumer`` no longer holds ``stream_seqs`` (or its holds moved wholesale)."""
        if consumer.deleted:
            self._consumers.pop(consumer.name, None)
        if self._kind is RetentionKind.LIMITS or self._stream is None:
            return
        if consumer.name not in self._consumers and not consumer.deleted:
            return  # not added yet (its Start op runs before ``add``): it held nothing
        for seq in stream_seqs:
            self._stream.release(seq)
        if rescan and self._kind is RetentionKind.INTEREST:
            self._stream.sweep_interest()
