"""The snapshot of a stream group: its config, every stored message, every consumer and
every deduplication record.

Used by Raft for log compaction and to catch up a replica that fell behind the leader's
compacted log (the leader sends it; the follower replaces its whole state with it).

Layout (integers little-endian)::

    b"RSSTRM" | u8 version | u32 header length | header (JSON)
      | u32 dedup count | dedup records | message records

The header holds the stream config (JetStream JSON), ``last_seq``, the consumers (name,
config JSON, ``encode_state`` in hex) and, since version 3, ``origins``: a mirror's or
sourcing stream's replicated position per origin (``engine/origins.py``), without which a
replica restored from a snapshot would copy again what the snapshot already holds. Version 2
(no ``origins``: a stream that copies nothing) is still read. A dedup record is ``u64 seq |
i64 ts_ns | u32 n | msg id``: the duplicate window outlives the messages (a message removed
by a limit or an ack still answers a retry of its msg id as a duplicate), so a replica
restored from a snapshot must hold the records too. A message record is ``u64 seq | i64 ts |
i64 ttl_ns | u32 n | subject | u32 n | headers JSON | u32 n | data``. ``restore_store``
raises ``DataLossError`` for anything it cannot read exactly. Version 1 (no dedup section)
is no longer read: a snapshot only travels between replicas of one release.

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
from raftstream.engine.origins import OriginState, origins_from_json, origins_to_json
from raftstream.engine.store import DedupRecord, StoredMsg, StreamStore
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError, InvariantError, RaftStreamError

__all__ = ["ConsumerImage", "SnapshotHeader", "encode_snapshot", "restore_store"]

_MAGIC = b"RSSTRM"
_VERSION = 3
_VERSIONS_READ = (2, 3)
_HEAD = struct.Struct("<6sBI")
_MSG = struct.Struct("<Qqq")
_DEDUP = struct.Struct("<Qq")
_U32 = struct.Struct("<I")


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


def encode_snapshot(
    config: StreamConfig,
    store: StreamStore,
    consumers: list[ConsumerImage],
    origins: dict[str, OriginState] | None = None,
) -> bytes:
    """The snapshot bytes of a stream group as it is now (reads the whole store)."""
    header = {
        "origins": origins_to_json(origins or {}),
        "config": config.to_dict(),
        "last_seq": store.state().last_seq,
        "consumers": [
            {"name": c.name, "config": c.config.to_dict(), "state": encode_state(c.state).hex()}
            for c in consumers
        ],
    }
    raw = json.dumps(header, sort_keys=True).encode()
    parts = [_HEAD.pack(_MAGIC, _VERSION, len(raw)), raw]
    parts += _dedup_parts(store)
    for m in store.iter_from(1):
        subject = m.subject.encode()
        headers = json.dumps(dict(m.headers), sort_keys=True).encode() if m.headers else b""
        parts += [_MSG.pack(m.seq, m.ts, m.ttl_ns), _U32.pack(len(subject)), subject]
        parts += [_U32.pack(len(headers)), headers, _U32.pack(len(m.data)), m.data]
    return b"".join(parts)


def _dedup_parts(store: StreamStore) -> list[bytes]:
    """The dedup section: its count, then one record per msg id (expiry order)."""
    parts: list[bytes] = [b""]
    count = 0
    for rec in store.dedup_iter():
        msg_id = rec.msg_id.encode()
        parts += [_DEDUP.pack(rec.seq, rec.ts_ns), _U32.pack(len(msg_id)), msg_id]
        count += 1
    parts[0] = _U32.pack(count)
    return parts


def restore_store(data: bytes, store: StreamStore) -> SnapshotHeader:
    """Fill the EMPTY ``store`` with the snapshot's messages and dedup records (in one
    transaction); return the header."""
    header, pos = _read_header(data)
    try:
        with store.transaction():
            dedup, pos = _dedup_records(data, pos)
            for rec in dedup:
                store.dedup_put(rec.msg_id, rec.seq, rec.ts_ns)
            for m in _records(data, pos):
                if m.seq > store.state().last_seq + 1:
                    store.skip(m.seq)
                store.append(m.subject, m.data, headers=m.headers, now_ns=m.ts, ttl_ns=m.ttl_ns)
            if header.last_seq > store.state().last_seq:
                store.skip(header.last_seq + 1)
    except (RaftStreamError, struct.error, ValueError) as exc:
        raise DataLossError(f"stream snapshot does not restore: {exc}") from exc
    return header


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


def _chunk(data: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(data, pos)
    pos += _U32.size
    if pos + n > len(data):
        raise DataLossError("truncated stream snapshot record")
    return data[pos : pos + n], pos + n
