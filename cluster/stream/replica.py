"""The replicated state machine of one stream group: the stream, its consumers, in one log.

Ownership: a ``StreamGroup`` belongs to the node's event loop. ``RaftHost`` calls ``apply``,
``snapshot`` and ``restore`` on that loop, in log order; the leader-side operations
(``cluster/stream/group.py``) run there too.

Replicas (every node of the group) apply the entries of ``cluster/stream/entries.py``:

- STREAM: engine entries (publish, delete, purge, config, expire) in ONE store transaction;
  a refused entry (limits, preconditions) is its result, the others still apply;
- CONSUMER_PUT / CONSUMER_DELETE: a consumer defined in the meta group, *sequenced* here by
  the stream leader, so every replica creates it at the same position among the messages;
- CONSUMER_OPS: deliveries, acks, naks... decided by the leader; acks cause interest and
  workqueue removals through ``ConsumerSet`` at the same log position on every replica;
- LEADER: a new leader's barrier (below).

Leader copies. The engine's ``Consumer`` decides on the leader and applies each decision at
once (``take_ops`` hands them out for replication). The leader therefore keeps a second,
in-memory copy of each consumer that runs AHEAD of the log by the ops in flight, while the
replica copy (the one every node has, the one in snapshots) follows the committed log only.
The copies are made when the leader's barrier entry applies: every entry before it is
applied by then, and every consumer op after it in this term is the copy's own. Any change
of leadership or term drops the copies (their in-flight ops may never commit).

Durability: the engine store is a cache of the Raft log, rebuilt on every start from the
group's snapshot and the committed entries after it (the node wipes the store environment
at start, see ``cluster/node/node.py``), so it needs no fsync of its own: what is acknowledged
is what the Raft log fsynced on a quorum.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.stream.entries import (
    ConsumerDelete,
    ConsumerOps,
    ConsumerPut,
    GroupEntry,
    LeaderBarrier,
    StreamBatch,
    decode,
)
from raftstream.cluster.stream.snapshot import (
    ConsumerImage,
    SnapshotWriter,
    encode_snapshot,
    restore_store,
)
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import RetentionKind
from raftstream.engine.consumer_pull import PullEvent
from raftstream.engine.consumer_state import decode_state, encode_state
from raftstream.engine.lmdbstore import LmdbStreamStore
from raftstream.engine.origins import OriginState
from raftstream.engine.retention import ConsumerSet
from raftstream.engine.stream import Stream
from raftstream.engine.stream_config import RetentionPolicy, StreamConfig
from raftstream.errors import (
    NotFoundError,
    RaftStreamError,
)
from raftstream.raft.types import Entry

__all__ = ["StreamReplica"]

log = logging.getLogger(__name__)

# At most this many of the leader's own proposals are kept decoded (``remember``).
DECODED_MAX = 4096


def _retention_kind(config: StreamConfig) -> RetentionKind:
    return RetentionKind(RetentionPolicy(config.retention).value)


class StreamReplica:
    """The replica state of stream group ``assignment.group`` on node ``node_id``.

    ``env`` is the node's store environment (LMDB); the replica owns its store in it.
    ``on_barrier(term, seq)`` is called when this node's own barrier of ``term`` applies;
    ``on_events(events)`` gets pull events that the replica's applies produced for waiting
    requests on the leader copies (a consumer deleted: 409 Consumer Deleted).
    ``records_snapshots()``: whether every replica reads snapshots of the store's own
    records (``cluster/stream/snapshot.py``, version 4); else they are made in version 3.
    """

    def __init__(
        self,
        *,
        node_id: str,
        assignment: StreamAssignment,
        env: Any,
        metrics: NodeMetrics,
        on_barrier: Callable[[int, int], None],
        on_applied: Callable[[], None],
        records_snapshots: Callable[[], bool] = lambda: True,
    ) -> None:
        self.node_id = node_id
        self.group = assignment.group
        self.account = assignment.account
        self.name = assignment.name
        self._env = env
        self._metrics = metrics
        self._on_barrier = on_barrier
        self._on_applied = on_applied
        self._records_snapshots = records_snapshots
        self._store = LmdbStreamStore(env, self.group)
        self._store_fresh()
        self.applied = 0
        self.starting = False  # True while the host adds the group (restores its own snapshot)
        self.stream = Stream(assignment.config, self._store)
        self.consumers: dict[str, Consumer] = {}
        self._cset = self._new_cset(assignment.config)
        # The leader's own proposals, decoded already, by their bytes (see ``remember``).
        self._decoded: dict[bytes, GroupEntry] = {}
        self._compact_wanted = False  # a purge applied since the last snapshot

    # -- construction ------------------------------------------------------------------------

    def _store_fresh(self) -> None:
        """Start from an empty store: the state is rebuilt from the Raft log (module doc)."""
        if self._store.state().last_seq or self._store.state().msgs:
            self._store.drop()
            self._store = LmdbStreamStore(self._env, self.group)

    def _new_cset(self, config: StreamConfig) -> ConsumerSet:
        cset = ConsumerSet(retention=_retention_kind(config), stream=self.stream)
        self.stream.set_retention_hook(cset)
        return cset

    @property
    def store(self) -> LmdbStreamStore:
        return self._store

    def close(self, *, drop: bool) -> None:
        """Close the store; ``drop`` deletes its data (the group left this node)."""
        if drop:
            self._store.drop()
        else:
            self._store.close()

    # -- the state machine (RaftHost) --------------------------------------------------------

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]:
        """Apply committed entries in order; one result per entry (see the module doc).
        Anything but a refusal raises and halts the group (the replica would diverge)."""
        results = [self._apply_one(self._decoded_entry(e.data)) for e in entries]
        if entries:
            self.applied = entries[-1].index
        self._metrics.commits.labels("stream").inc(len(entries))
        self._on_applied()
        return results

    def _decoded_entry(self, data: bytes) -> GroupEntry:
        """``decode(data)``, or the entry this node proposed as ``data`` (``remember``)."""
        entry = self._decoded.pop(data, None)
        return decode(data) if entry is None else entry

    def remember(self, data: bytes, entry: GroupEntry) -> None:
        """Keep ``entry``, just encoded as ``data`` by this node, so that applying ``data``
        need not decode it again. Safe whatever commits: the key is the bytes themselves and
        ``decode(encode(entry)) == entry``, so a hit is exactly what decoding would give."""
        if len(self._decoded) >= DECODED_MAX:
            self._decoded.clear()  # proposals that never applied (leadership lost)
        self._decoded[data] = entry

    def forget_proposed(self) -> None:
        """Drop the kept entries (leadership lost: they may never apply here)."""
        self._decoded.clear()

    def _apply_one(self, entry: GroupEntry) -> Any:
        if isinstance(entry, StreamBatch):
            return self._apply_stream(entry)
        if isinstance(entry, ConsumerOps):
            c = self.consumers.get(entry.name)
            # Ops of a consumer deleted meanwhile: ignored, identically on every replica.
            return c.apply_many(entry.ops) if c is not None else None
        if isinstance(entry, ConsumerPut):
            return self._apply_put(entry)
        if isinstance(entry, ConsumerDelete):
            return self._apply_delete(entry)
        self._apply_barrier(entry)
        return None

    def _apply_stream(self, batch: StreamBatch) -> list[Any]:
        old_config = self.stream.config
        # One store transaction for the whole batch: no fsync of its own (module doc). A
        # refused entry is its result; plain publishes take the engine's fast path.
        purges = self.stream.purges
        out: list[Any] = self.stream.apply_batch(batch.entries)
        if self.stream.purges != purges:
            # What the purge removed is still in the Raft log (and its last snapshot): a
            # snapshot now, small after the purge, frees that storage (compaction_wanted).
            self._compact_wanted = True
        if self.stream.config.retention != old_config.retention:
            self._cset = self._rebuild_cset()
        return out

    def _rebuild_cset(self) -> ConsumerSet:
        cset = self._new_cset(self.stream.config)
        for c in self.consumers.values():
            cset.add(c)
        return cset

    def _apply_put(self, put: ConsumerPut) -> Any:
        c = self.consumers.get(put.name)
        if c is not None:
            c.update_config(put.config)
            self.stream.sweep_interest()  # the filter may have changed (interest retention)
            return None
        c = Consumer.create(
            stream=self.name,
            name=put.name,
            config=put.config,
            store=self._store,
            now_ns=put.ts_ns,
            retention=self._cset,
        )
        try:
            self._cset.add(c)
        except RaftStreamError as refusal:
            return refusal
        self.consumers[put.name] = c
        return None

    def _apply_delete(self, d: ConsumerDelete) -> Any:
        c = self.consumers.pop(d.name, None)
        if c is None:
            return NotFoundError(f"consumer {d.name!r} not found", field="name")
        c.delete()
        return None

    def _apply_barrier(self, b: LeaderBarrier) -> None:
        if b.node == self.node_id:
            self._on_barrier(b.term, b.seq)

    def compaction_wanted(self, group: str) -> bool:
        """The Raft host's optional hook: compact the log now (after a purge)."""
        return self._compact_wanted

    def snapshot(self, group: str) -> bytes:
        return encode_snapshot(*self._snapshot_parts(), records=self._records_snapshots())

    def snapshot_job(self, group: str) -> SnapshotWriter:
        """The Raft host's optional hook: the snapshot made in steps (``SnapshotWriter``).
        In the version every replica reads (``records_snapshots``: a rolling upgrade)."""
        return SnapshotWriter(*self._snapshot_parts(), records=self._records_snapshots())

    def _snapshot_parts(
        self,
    ) -> tuple[StreamConfig, LmdbStreamStore, list[ConsumerImage], dict[str, OriginState]]:
        self._compact_wanted = False
        images = [
            ConsumerImage(n, self.consumers[n].config, self.consumers[n].state)
            for n in sorted(self.consumers)
        ]
        return self.stream.config, self._store, images, self.stream.origins

    def restore(self, group: str, data: bytes) -> None:
        """Replace the whole state by the snapshot's (DataLossError: the replica halts)."""
        self._store.drop()
        self._store = LmdbStreamStore(self._env, self.group)
        header = restore_store(data, self._store)
        self.stream = Stream(header.config, self._store)
        self.stream.restore_origins(header.origins)
        self.consumers = {}
        self._cset = self._new_cset(header.config)
        for img in header.consumers:
            c = Consumer(
                stream=self.name,
                name=img.name,
                config=img.config,
                store=self._store,
                state=img.state,
                retention=self._cset,
            )
            self._cset.add(c)
            self.consumers[img.name] = c
        # At start the host restores the node's own snapshot, later one the leader sent;
        # either may be old (one is taken every snapshot_entries), and the log after it is
        # applied next: said, or "last_seq 0" read as an empty stream (a user review).
        source = "its own snapshot" if self.starting else "a snapshot from the leader"
        # A stream just made restores its empty first snapshot: nothing worth a line.
        empty = header.last_seq == 0 and not header.consumers
        log.log(
            logging.DEBUG if empty else logging.INFO,
            "restored %s (version %d), taken at last_seq %d with %d consumers; the log after it"
            " is applied next",
            source,
            header.version,
            header.last_seq,
            len(header.consumers),
            extra={"node": self.node_id, "group": self.group},
        )

    # -- for the leader ----------------------------------------------------------------------

    def leader_copy(self, name: str) -> Consumer:
        """A fresh leader copy of consumer ``name``: the replica's state, recording ops."""
        c = self.consumers[name]
        return Consumer(
            stream=self.name,
            name=name,
            config=c.config,
            store=self._store,
            state=decode_state(encode_state(c.state)),
            record_ops=True,
        )


def drain_events(consumers: Sequence[Consumer]) -> list[PullEvent]:
    """Leadership lost: every waiting request of the leader copies gets 409."""
    out: list[PullEvent] = []
    for c in consumers:
        if not c.deleted:
            out.extend(c.leadership_lost())
    return out
