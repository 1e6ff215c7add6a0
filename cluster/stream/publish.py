"""A ``StreamGroup``'s publish batching (``cluster/stream/group.py``, "Publishes").

Each publish waits in a bounded queue (``PUBLISH_QUEUE_MSGS_MAX``); on the next loop turn
the queue is cut into Raft entries of at most ``publish_batch_entries_max`` publishes and
``publish_batch_bytes_max`` bytes, each proposed at once. A publish is answered from its
entry's apply result. Before it is queued, a publish is refused when this node does not
lead, when the queue is full, or when it would leave a replica without its storage reserve.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any

from raftstream.cluster.common.answers import answered_within
from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.entries import StreamBatch, encode
from raftstream.cluster.stream.leadership import Leadership
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.entries import Publish, plain_publish
from raftstream.engine.stream import PubAck
from raftstream.errors import LimitError, RaftStreamError

__all__ = ["Publisher"]

PUBLISH_QUEUE_MSGS_MAX = 65_536  # publishes waiting for a Raft entry, per group
STORAGE_CHECK_S = 0.05  # how long a storage room lookup stands for (``_check_storage``)


@dataclass(slots=True)
class _PendingPublish:
    entry: Publish
    size_bytes: int
    future: asyncio.Future[PubAck]


class Publisher:
    """The leader's queue of publishes, batched into Raft entries."""

    def __init__(self, core: GroupCore, leadership: Leadership) -> None:
        self._core = core
        self._d = core.d
        self._lead = leadership
        self._pubs: collections.deque[_PendingPublish] = collections.deque()
        self._flush_scheduled = False
        # Storage room this group may still take before looking again (``_check_storage``).
        self._room_left = 0
        self._room_until = 0.0
        self._room_taken = 0  # admitted since the last look, told to the node at the next

    def submit(self, entry_args: dict[str, Any]) -> asyncio.Future[PubAck]:
        """Queue one message for the next Raft entry; the future resolves to its PubAck
        once committed and applied, or to the refusal (preconditions, limits), a
        NotLeader/NoLeader error, or UnavailableError when no quorum committed it in the
        proposal timeout (ambiguous: it may be stored). Raises at once when this node does
        not lead or the queue is full."""
        self._check_room()
        entry = Publish(ts_ns=self._core.now_ns(), **entry_args)
        size = len(entry.data) + len(entry.subject) + sum(map(len, entry.headers)) + 64
        self._check_storage(size)
        return self._enqueue(entry, size)

    def submit_plain(self, subject: str, data: bytes) -> asyncio.Future[PubAck]:
        """``submit`` of a message with a subject and data only (no headers, no options):
        the common publish, without building and unpacking its arguments."""
        self._check_room()
        size = len(data) + len(subject) + 64
        self._check_storage(size)
        return self._enqueue(plain_publish(self._core.now_ns(), subject, data), size)

    async def publish(self, entry_args: dict[str, Any], timeout_s: float | None) -> PubAck:
        """``submit`` and wait, answering UNAVAILABLE shortly before ``timeout_s``."""
        ack: PubAck = await answered_within(self.submit(entry_args), timeout_s, "publish")
        return ack

    def fail(self, exc: RaftStreamError) -> None:
        """Answer every publish still queued with ``exc`` (the leader state was dropped)."""
        while self._pubs:
            p = self._pubs.popleft()
            if not p.future.done():
                p.future.set_exception(exc)

    def _check_room(self) -> None:
        if not self._lead.is_leader:
            raise self._lead.not_leader()
        if len(self._pubs) >= PUBLISH_QUEUE_MSGS_MAX:
            raise LimitError("too many publishes waiting", limit="publish_queue_msgs_max")

    def _check_storage(self, size: int) -> None:
        """Refuse a publish that would leave a replica with less than the reserve of storage
        room: ``LimitError`` naming the node, nothing proposed (``cluster/node/storage_room.py``;
        a store that fills halts the group on that node). The room is looked up at most
        every ``STORAGE_CHECK_S`` (a publish on the hot path costs a subtraction), and what
        this group admitted in between counts against it."""
        d = self._d
        left = self._room_left - size
        if left >= 0 and d.clock.monotonic() < self._room_until:
            self._room_left = left
            self._room_taken += size
            return
        d.storage_admitted(self._room_taken)
        self._room_taken = 0
        sa = d.stream_of(self._core.account, self._core.name)
        tightest = d.storage_room(sa.peers if sa is not None else (d.node_id,))
        if tightest is None:
            return
        node, room, reserve = tightest
        self._room_left = room - reserve - size
        self._room_until = d.clock.monotonic() + STORAGE_CHECK_S
        if self._room_left < 0:
            self._room_left = 0
            raise LimitError(
                f"insufficient storage: node {node} has {room} bytes of room left, and keeps "
                f"{reserve} free (limits.storage_bytes_max, or its disk): delete or purge "
                "messages, or give it more room",
                limit="storage_bytes_max",
                node=node,
            )
        self._room_taken = size

    def _enqueue(self, entry: Publish, size: int) -> asyncio.Future[PubAck]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PubAck] = loop.create_future()
        self._pubs.append(_PendingPublish(entry, size, fut))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            # Everything queued until the loop turns goes into as few entries as the limits
            # allow: this is where concurrent publishes are batched.
            loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        self._flush_scheduled = False
        limits = self._d.limits
        while self._pubs:
            batch: list[_PendingPublish] = []
            size = 0
            while self._pubs and len(batch) < limits.publish_batch_entries_max:
                p = self._pubs[0]
                if batch and size + p.size_bytes > limits.publish_batch_bytes_max:
                    break
                batch.append(self._pubs.popleft())
                size += p.size_bytes
            self._propose(batch)

    def _propose(self, batch: list[_PendingPublish]) -> None:
        live = [p for p in batch if not p.future.done()]
        if not live:
            return
        entries: tuple[EngineEntry, ...] = tuple(p.entry for p in live)
        metrics = self._d.metrics
        metrics.publish_batch_entries.observe(len(live))
        batch_entry = StreamBatch(entries)
        data = encode(batch_entry)
        replica = self._core.replica
        replica.remember(data, batch_entry)  # before proposing: it may apply at once
        try:
            fut = self._core.propose(data)
        except RaftStreamError as exc:
            replica.forget_proposed()  # not proposed: the kept entry would never apply
            hinted = self._lead.hinted(exc)
            for p in live:
                p.future.set_exception(hinted)
            return

        async def resolve() -> None:
            try:
                results = await fut
            except RaftStreamError as exc:
                metrics.proposal_failures.labels("stream").inc()
                results = [self._lead.hinted(exc)] * len(live)
            acked = 0
            for p, r in zip(live, results, strict=True):
                if p.future.done():
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    acked += 1
                    p.future.set_result(r)
            if acked:  # once per entry: a counter's inc takes a lock, per message it showed
                metrics.published.inc(acked)

        self._core.spawn(resolve())
