"""Conversion between ``raft.types`` and the ``raftstream.raft.v1`` wire form.

Pure functions, no IO. ``to_batches`` packs one round's messages for one peer into as few
``Batch`` protos as the size limit allows, coalescing heartbeats into their compact form;
``from_batch`` expands a batch back into per-group messages (see proto/raft.proto for the
coalescing rules). Snapshots are chunked by ``snapshot_chunks`` and reassembled by the
receiver; they never ride in a batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from raftstream.proto import raft_pb2 as pb
from raftstream.raft.errors import InvalidArgumentError, invariant
from raftstream.raft.transport.api import Inbound
from raftstream.raft.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

__all__ = [
    "SnapshotAssembler",
    "batch_messages",
    "from_batch",
    "message_from_pb",
    "message_to_pb",
    "snapshot_chunks",
    "to_batches",
]

_HEARTBEATS = (MessageType.HEARTBEAT, MessageType.HEARTBEAT_RESP)


def _meta_to_pb(meta: SnapshotMeta) -> pb.SnapshotMeta:
    conf = pb.ConfState(voters=list(meta.conf.voters), learners=list(meta.conf.learners))
    return pb.SnapshotMeta(index=meta.index, term=meta.term, conf=conf)


def _meta_from_pb(meta: pb.SnapshotMeta) -> SnapshotMeta:
    conf = ConfState(voters=tuple(meta.conf.voters), learners=tuple(meta.conf.learners))
    return SnapshotMeta(index=meta.index, term=meta.term, conf=conf)


def message_to_pb(m: Message) -> pb.Message:
    """The wire form of ``m`` without its node ids (the batch or chunk carries them) and
    without snapshot data (streamed in chunks)."""
    out = pb.Message(
        type=pb.MessageType.ValueType(m.type),  # the IntEnum values are the proto's
        group=m.group,
        term=m.term,
        log_term=m.log_term,
        index=m.index,
        commit=m.commit,
        reject=m.reject,
        reject_hint=m.reject_hint,
        context=m.context,
    )
    if m.entries:
        out.entries.extend(
            pb.Entry(index=e.index, term=e.term, type=pb.EntryType.ValueType(e.type), data=e.data)
            for e in m.entries
        )
    if m.snapshot is not None:
        out.snapshot.CopyFrom(_meta_to_pb(m.snapshot.meta))
    return out


def message_from_pb(
    p: pb.Message, src: str, dst: str, snapshot_data: bytes | None = None
) -> Message:
    """Rebuild a message; ``snapshot_data`` is the reassembled data of a SNAPSHOT message.

    Raises InvalidArgumentError on an unknown message or entry type (a newer peer, or a
    corrupted frame): the caller drops the batch rather than guess.
    """
    try:
        mtype = MessageType(p.type)
        entries = tuple(Entry(e.index, e.term, EntryType(e.type), e.data) for e in p.entries)
    except ValueError as exc:
        raise InvalidArgumentError("type", f"unknown raft message or entry type: {exc}") from exc
    snapshot = None
    if p.HasField("snapshot"):
        snapshot = Snapshot(meta=_meta_from_pb(p.snapshot), data=snapshot_data or b"")
    return Message(
        type=mtype,
        group=p.group,
        src=src,
        dst=dst,
        term=p.term,
        log_term=p.log_term,
        index=p.index,
        entries=entries,
        commit=p.commit,
        reject=p.reject,
        reject_hint=p.reject_hint,
        snapshot=snapshot,
        context=p.context,
    )


def _compact_heartbeat(m: Message) -> pb.Heartbeat | None:
    """The compact form of a heartbeat (or response), or None if ``m`` carries more."""
    if m.type not in _HEARTBEATS:
        return None
    if m.log_term or m.index or m.entries or m.reject or m.reject_hint or m.snapshot:
        return None
    return pb.Heartbeat(group=m.group, term=m.term, commit=m.commit, context=m.context)


def to_batches(
    src: str,
    dst: str,
    messages: Sequence[Message],
    batch_bytes_max: int,
    quiesce: Sequence[tuple[str, int]] = (),
) -> list[pb.Batch]:
    """Pack ``messages`` (all from ``src`` to ``dst``, none a SNAPSHOT) into batches of at
    most ``batch_bytes_max`` encoded bytes each; a single larger message gets a batch of its
    own (the gRPC message size limit is the caller's last line). Order is kept per group.
    Always at least one batch: an empty one is a liveness ping."""
    cur = pb.Batch(src=src, dst=dst)
    cur.quiesce.extend(pb.Heartbeat(group=g, term=t) for g, t in quiesce)
    batches: list[pb.Batch] = []
    size, items = cur.ByteSize(), len(quiesce)
    for m in messages:
        if m.src != src or m.dst != dst or m.type == MessageType.SNAPSHOT:
            invariant(False, f"{m.type.name} {m.src}->{m.dst} in a {src}->{dst} batch")
        hb = _compact_heartbeat(m)
        item: pb.Heartbeat | pb.Message = hb if hb is not None else message_to_pb(m)
        # Field tag and length prefix, roughly; a heartbeat's size is nearly its group id.
        item_bytes = len(m.group) + 32 if hb is not None else item.ByteSize() + 8
        if items and size + item_bytes > batch_bytes_max:
            batches.append(cur)
            cur, size, items = pb.Batch(src=src, dst=dst), 0, 0
        if isinstance(item, pb.Heartbeat):
            target = cur.heartbeats if m.type == MessageType.HEARTBEAT else cur.heartbeat_responses
            target.append(item)
        else:
            cur.messages.append(item)
        size += item_bytes
        items += 1
    batches.append(cur)
    return batches


def from_batch(batch: pb.Batch) -> Inbound:
    """Expand a batch: ordinary messages, then one HEARTBEAT (or HEARTBEAT_RESP) per group.

    Heartbeats carry no entries, so moving them after the batch's other messages changes
    nothing a core can observe beyond the reordering the network may do anyway.
    """
    return Inbound(batch.src, batch_messages(batch), [(q.group, q.term) for q in batch.quiesce])


def batch_messages(batch: pb.Batch) -> list[Message]:
    src, dst = batch.src, batch.dst
    out = [message_from_pb(p, src, dst) for p in batch.messages]
    for kind, beats in (
        (MessageType.HEARTBEAT, batch.heartbeats),
        (MessageType.HEARTBEAT_RESP, batch.heartbeat_responses),
    ):
        out.extend(
            Message(kind, h.group, src, dst, term=h.term, commit=h.commit, context=h.context)
            for h in beats
        )
    return out


def snapshot_chunks(m: Message, chunk_bytes_max: int) -> Iterator[pb.SnapshotChunk]:
    """The chunks of a SNAPSHOT message: the first carries the message and total size."""
    invariant(m.type == MessageType.SNAPSHOT and m.snapshot is not None, "not a snapshot")
    invariant(chunk_bytes_max > 0, "chunk_bytes_max must be positive")
    data = m.snapshot.data if m.snapshot is not None else b""
    yield pb.SnapshotChunk(
        src=m.src,
        dst=m.dst,
        message=message_to_pb(m),
        total_bytes=len(data),
        offset=0,
        data=data[:chunk_bytes_max],
    )
    for offset in range(chunk_bytes_max, len(data), chunk_bytes_max):
        yield pb.SnapshotChunk(offset=offset, data=data[offset : offset + chunk_bytes_max])


class SnapshotAssembler:
    """Reassembles the chunks of one snapshot as they arrive, within ``bytes_max``.

    ``add`` returns False as soon as the stream is unacceptable (addressed to another node,
    too large, out of order, or overflowing its announced size); ``finish`` returns the
    SNAPSHOT message, or None if the stream ended short or was never acceptable.
    """

    def __init__(self, node_id: str, bytes_max: int) -> None:
        self._node_id = node_id
        self._bytes_max = bytes_max
        self._head: pb.SnapshotChunk | None = None
        self._parts: list[bytes] = []
        self._received = 0

    def add(self, chunk: pb.SnapshotChunk) -> bool:
        if self._head is None:
            if chunk.dst != self._node_id or chunk.total_bytes > self._bytes_max:
                return False
            self._head = chunk
        total = self._head.total_bytes
        if chunk.offset != self._received or self._received + len(chunk.data) > total:
            return False
        self._parts.append(chunk.data)
        self._received += len(chunk.data)
        return True

    def finish(self) -> Message | None:
        head = self._head
        if head is None or self._received != head.total_bytes:
            return None
        if head.message.type != pb.SNAPSHOT or not head.message.HasField("snapshot"):
            return None
        data = b"".join(self._parts)
        try:
            return message_from_pb(head.message, head.src, head.dst, snapshot_data=data)
        except InvalidArgumentError:
            return None
