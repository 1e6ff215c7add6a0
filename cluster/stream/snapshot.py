"""The snapshot of a stream group: its config, every stored message, every consumer and
every deduplication record.

Used by Raft for log compaction and to catch up a replica that fell behind the leader's
compacted log (the leader sends it; the follower replaces its whole state with it).

Layout (integers little-endian)::

    b"RSSTRM" | u8 version | u32 header length | header (JSON)
      | u32 dedup count | dedup records | message records

The header holds the stream config (JetStream JSON), ``last_seq``, the consumers (name,
config JSON, ``encode_state`` in hex), ``origins``: a mirror's or sourcing stream's
replicated position per origin (``engine/origins.py``), without which a replica restored
from a snapshot would copy again what the snapshot already holds, and since version 4
``store_id``: the stream's id in the store that wrote the snapshot. A dedup record is ``u64
seq | i64 ts_ns | u32 n | msg id``: the duplicate window outlives the messages (a message
removed by a limit or an ack still answers a retry of its msg id as a duplicate), so a
replica restored from a snapshot must hold the records too.

A message record is, since version 4, ``u32 n | the store's own record`` (CRC, head with
the sequence, subject, headers, payload: ``engine/lmdbrecords.py``), copied from the store
verified but not decoded: a compaction costs a cursor walk and a CRC per message, not a
decode and an encode (5.5-7 µs a message before, 2-3 after, measured on 100,000 messages of
128 bytes), and its peak memory is about half (3.5 times the snapshot's bytes). The records'
CRCs are seeded with ``store_id``; restoring checks each again and stores it under the
replica's own id. Versions 2 and 3 (``u64 seq | i64 ts | i64 ttl_ns | u32 n | subject | u32
n | headers JSON | u32 n | data``; version 2 without ``origins``) are still read: a node
restarted on a new release restores the snapshot it took before. Version 3 is still written
while a replica of the group does not read 4 (a rolling upgrade: ``records=False``, chosen
by the node descriptions' ``snapshot_records``). ``restore_store`` raises
``DataLossError`` for anything it cannot read exactly.

Restoring writes the messages in transactions of about ``RESTORE_STAGE_BYTES`` (4 MiB)
each, not in one: LMDB keeps the pages a write transaction dirtied, for later ones, until
the environment closes, so one transaction left the node's heap bigger by about 1.4 times
the stream for good, after every restart and every snapshot a follower installed (100,000
messages of 512 bytes: +74 MiB, in stages +8; the probe in
``tests/cluster/test_stream_snapshot.py``, 40,000 messages: +35 MiB, in stages none). A
restore that fails part-way leaves the store part-filled; the replica halts
(``DataLossError``), and its next start drops the store and restores again
(``StreamReplica.restore``).

Known gap: the restored store's ``last_ts`` is the newest stored message's stamp, which is
below the source's when its newest message was removed; ``Stream`` floors time with it only
to defend against a lagging leader clock, so the gap matters only then.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import ConsumerState, decode_state, encode_state
from raftstream.engine.lmdbrecords import decode_record
from raftstream.engine.lmdbstore import LmdbStreamStore
from raftstream.engine.origins import OriginState, origins_from_json, origins_to_json
from raftstream.engine.store import DedupRecord, StoredMsg, StreamStore
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError, InvariantError, RaftStreamError

__all__ = [
    "RESTORE_STAGE_BYTES",
    "SNAPSHOT_STEP_RECORDS",
    "ConsumerImage",
    "SnapshotHeader",
    "SnapshotWriter",
    "encode_snapshot",
    "restore_store",
]

_MAGIC = b"RSSTRM"
_VERSION = 4
_VERSIONS_READ = (2, 3, 4)
_HEAD = struct.Struct("<6sBI")
_MSG = struct.Struct("<Qqq")
_DEDUP = struct.Struct("<Qq")
_U32 = struct.Struct("<I")
# Message bytes a transaction of ``restore_store`` writes, about (module docstring).
RESTORE_STAGE_BYTES = 4 << 20
# Records a ``SnapshotWriter`` step reads at most: a few ms of the event loop (about 2 to 3
# µs a message record, more for a dedup record).
SNAPSHOT_STEP_RECORDS = 2048


@dataclass(frozen=True, slots=True)
class ConsumerImage:
    name: str
    config: ConsumerConfig
    state: ConsumerState


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    config: StreamConfig
    last_seq: int
    consumers: tuple[ConsumerImage, ...]
    origins: dict[str, OriginState]
    version: int
    store_id: int  # the writing store's id for the stream (version 4 on; 0 before)


def encode_snapshot(
    config: StreamConfig,
    store: LmdbStreamStore,
    consumers: list[ConsumerImage],
    origins: dict[str, OriginState] | None = None,
    *,
    records: bool = True,
) -> bytes:
    """The snapshot bytes of a stream group as it is now (reads the whole store at once)."""
    writer = SnapshotWriter(config, store, consumers, origins, records=records)
    try:
        while (data := writer.step()) is None:
            pass
    finally:
        writer.close()
    return data


class SnapshotWriter:
    """Makes the snapshot of a stream group in steps, so that a large stream does not hold
    its node's event loop for the whole of it (``raft/host.py``, "Compaction"). It is the
    state when the writer was made: the header (config, consumers, origins) is encoded at
    once, and the records are read from one read transaction opened then
    (``RecordsReader``), whatever applies between the steps. ``close`` when done or
    abandoned (it ends the transaction). ``records``: version 4 (the store's records); False
    makes version 3 (each record decoded and encoded field by field), for a group whose
    replicas are not all on a version that reads 4 yet (a rolling upgrade)."""

    def __init__(
        self,
        config: StreamConfig,
        store: LmdbStreamStore,
        consumers: list[ConsumerImage],
        origins: dict[str, OriginState] | None = None,
        *,
        records: bool = True,
    ) -> None:
        self._records = records
        self._store_id = store.store_id
        header: dict[str, Any] = {
            "origins": origins_to_json(origins or {}),
            "config": config.to_dict(),
            "last_seq": store.state().last_seq,
            "consumers": [
                {
                    "name": c.name,
                    "config": c.config.to_dict(),
                    "state": encode_state(c.state).hex(),
                }
                for c in consumers
            ],
        }
        if records:
            header["store_id"] = self._store_id  # version 4: the seed of the records' CRCs
        raw = json.dumps(header, sort_keys=True).encode()
        version = _VERSION if records else 3
        self._head = [_HEAD.pack(_MAGIC, version, len(raw)), raw]
        self._dedup: list[bytes] = []
        self._dedup_count = 0
        self._msgs: list[bytes] = []
        self._dedup_done = False
        self._reader = store.records_reader()

    def step(self, records_max: int = SNAPSHOT_STEP_RECORDS) -> bytes | None:
        """Read up to ``records_max`` more records: None while there are more, then the
        snapshot's bytes. DataLossError for a stored record that fails its checks."""
        # Each step's parts are joined at once. Kept apart until the end, a stream's
        # records were two small objects each, in Python's small-object allocator, which
        # never gives back a 1 MiB arena while one object in it lives: the objects the node
        # made between the steps kept them, and its memory stayed near the snapshot's size
        # (100,000 messages of 128 bytes: +27 MiB resident, 3.5 of them kept on purpose by
        # the test's probe; joined per step, +3).
        parts: list[bytes] = []
        if not self._dedup_done:
            recs = self._reader.dedup(records_max)
            for rec in recs:
                msg_id = rec.msg_id.encode()
                parts += [_DEDUP.pack(rec.seq, rec.ts_ns), _U32.pack(len(msg_id)), msg_id]
            self._dedup.append(b"".join(parts))
            self._dedup_count += len(recs)
            self._dedup_done = len(recs) < records_max
            return None
        records = self._reader.msgs(records_max)
        if self._records:
            add, pack = parts.append, _U32.pack
            for record in records:
                add(pack(len(record)))
                add(record)
        else:
            for record in records:
                parts += _v3_parts(decode_record(self._store_id, record))
        self._msgs.append(b"".join(parts))
        if len(records) == records_max:
            return None
        self.close()
        parts = [*self._head, _U32.pack(self._dedup_count), *self._dedup, *self._msgs]
        return b"".join(parts)

    def close(self) -> None:
        self._reader.close()


def _v3_parts(m: StoredMsg) -> list[bytes]:
    """A message record of versions 2 and 3."""
    subject = m.subject.encode()
    headers = json.dumps(dict(m.headers), sort_keys=True).encode() if m.headers else b""
    parts = [_MSG.pack(m.seq, m.ts, m.ttl_ns)]
    for chunk in (subject, headers, m.data):
        parts += [_U32.pack(len(chunk)), chunk]
    return parts


def restore_store(
    data: bytes, store: StreamStore, *, stage_bytes: int = RESTORE_STAGE_BYTES
) -> SnapshotHeader:
    """Fill the EMPTY ``store`` with the snapshot's messages and dedup records, in
    transactions of about ``stage_bytes`` of messages (module docstring); return the
    header."""
    header, pos = _read_header(data)
    try:
        with store.transaction():
            dedup, pos = _dedup_records(data, pos)
            for rec in dedup:
                store.dedup_put(rec.msg_id, rec.seq, rec.ts_ns)
        msgs = _records(data, pos) if header.version < 4 else _raw(data, pos, header.store_id)
        last = store.state().last_seq  # kept here: state() per message cost a fifth
        append, skip = store.append, store.skip
        for stage in _stages(msgs, stage_bytes):
            with store.transaction():
                for m in stage:
                    if m.seq <= last:
                        raise DataLossError(f"message {m.seq} after {last}: out of order")
                    if m.seq > last + 1:
                        skip(m.seq)
                    last = append(
                        m.subject, m.data, headers=m.headers, now_ns=m.ts, ttl_ns=m.ttl_ns
                    )
                    if last != m.seq:
                        raise DataLossError(f"message {m.seq} stored at {last}")
        if header.last_seq > store.state().last_seq:
            with store.transaction():
                store.skip(header.last_seq + 1)
    except (RaftStreamError, struct.error, ValueError) as exc:
        raise DataLossError(f"stream snapshot does not restore: {exc}") from exc
    return header


def _stages(msgs: Iterator[StoredMsg], stage_bytes: int) -> Iterator[list[StoredMsg]]:
    """``msgs`` in lists of about ``stage_bytes`` of subjects and payloads (at least one)."""
    stage: list[StoredMsg] = []
    size = 0
    for m in msgs:
        stage.append(m)
        size += len(m.subject) + len(m.data)
        if size >= stage_bytes:
            yield stage
            stage, size = [], 0
    if stage:
        yield stage


def _read_header(data: bytes) -> tuple[SnapshotHeader, int]:
    try:
        magic, version, n = _HEAD.unpack_from(data, 0)
        if magic != _MAGIC or version not in _VERSIONS_READ:
            raise DataLossError("not a stream snapshot (magic or version)")
        raw: dict[str, Any] = json.loads(data[_HEAD.size : _HEAD.size + n])
        consumers = tuple(
            ConsumerImage(
                str(c["name"]),
                ConsumerConfig.from_dict(c["config"]),
                decode_state(bytes.fromhex(c["state"])),
            )
            for c in raw["consumers"]
        )
        header = SnapshotHeader(
            StreamConfig.from_dict(raw["config"]),
            int(raw["last_seq"]),
            consumers,
            origins_from_json(raw["origins"]) if version >= 3 else {},
            version,
            int(raw["store_id"]) if version >= 4 else 0,
        )
    except DataLossError:
        raise
    except (RaftStreamError, InvariantError, KeyError, TypeError, ValueError, struct.error) as exc:
        raise DataLossError(f"unreadable stream snapshot header: {exc}") from exc
    return header, _HEAD.size + n


def _dedup_records(data: bytes, pos: int) -> tuple[list[DedupRecord], int]:
    """The dedup section at ``pos``, and the position after it."""
    (count,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    out: list[DedupRecord] = []
    for _ in range(count):
        seq, ts_ns = _DEDUP.unpack_from(data, pos)
        msg_id, pos = _chunk(data, pos + _DEDUP.size)
        out.append(DedupRecord(msg_id.decode(), seq, ts_ns))
    return out, pos


def _records(data: bytes, pos: int) -> Iterator[StoredMsg]:
    end = len(data)
    while pos < end:
        seq, ts, ttl = _MSG.unpack_from(data, pos)
        pos += _MSG.size
        subject, pos = _chunk(data, pos)
        headers, pos = _chunk(data, pos)
        payload, pos = _chunk(data, pos)
        yield StoredMsg(
            seq=seq,
            subject=subject.decode(),
            data=payload,
            ts=ts,
            headers=json.loads(headers) if headers else {},
            ttl_ns=ttl,
        )


def _raw(data: bytes, pos: int, store_id: int) -> Iterator[StoredMsg]:
    """Version 4's message records: the writing store's records, each verified again."""
    end = len(data)
    while pos < end:
        record, pos = _chunk(data, pos)
        yield decode_record(store_id, record)


def _chunk(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    if pos + n > len(data):
        raise DataLossError("truncated stream snapshot record")
    return data[pos : pos + n], pos + n
