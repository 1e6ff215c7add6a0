"""The entries of a stream group's Raft log: a one-byte kind tag, then the kind's body.

docs/cluster-design.md: stream group entries are engine entries (``engine/entries.py``,
batched with ``encode_batch``) and consumer entries, each wrapped in a kind tag, so every
replica applies publishes, consumer definitions and consumer ops in one order.

=====  ===============  =====================================================================
tag    kind             body
=====  ===============  =====================================================================
1      STREAM           ``engine.entries.encode_batch`` bytes (one or more engine entries)
2      CONSUMER_PUT     JSON ``{"name", "config" (JetStream JSON), "ts_ns"}``: create/update
3      CONSUMER_DELETE  JSON ``{"name", "ts_ns"}``
4      CONSUMER_OPS     u16 name length, name (UTF-8), then (u32 length, ``encode_op``)*
5      LEADER           JSON ``{"term", "node"}``: a new leader's barrier (see StreamGroup)
=====  ===============  =====================================================================

Decoding raises ``DataLossError`` for anything it cannot read exactly: a replica never
half-understands its log.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import ConsumerOp, decode_op, encode_op
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.entries import decode_batch, encode_batch
from raftstream.errors import DataLossError, InvariantError, RaftStreamError

__all__ = [
    "ConsumerDelete",
    "ConsumerOps",
    "ConsumerPut",
    "GroupEntry",
    "LeaderBarrier",
    "StreamBatch",
    "decode",
    "encode",
]

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")


class Kind(enum.IntEnum):
    STREAM = 1
    CONSUMER_PUT = 2
    CONSUMER_DELETE = 3
    CONSUMER_OPS = 4
    LEADER = 5


@dataclass(frozen=True, slots=True)
class StreamBatch:
    entries: tuple[EngineEntry, ...]


@dataclass(frozen=True, slots=True)
class ConsumerPut:
    name: str
    config: ConsumerConfig
    ts_ns: int


@dataclass(frozen=True, slots=True)
class ConsumerDelete:
    name: str
    ts_ns: int


@dataclass(frozen=True, slots=True)
class ConsumerOps:
    name: str
    ops: tuple[ConsumerOp, ...]


@dataclass(frozen=True, slots=True)
class LeaderBarrier:
    term: int
    node: str
    # Which of its leader's barriers this is (``cluster/stream/group.py``): only the last
    # one proposed builds the leader copies. 0 in entries written before it existed.
    seq: int = 0


GroupEntry = StreamBatch | ConsumerPut | ConsumerDelete | ConsumerOps | LeaderBarrier


def encode(entry: GroupEntry) -> bytes:
    """The tagged bytes of ``entry`` (what is proposed to the stream's group)."""
    if isinstance(entry, StreamBatch):
        return bytes([Kind.STREAM]) + encode_batch(entry.entries)
    if isinstance(entry, ConsumerPut):
        body = {"name": entry.name, "config": entry.config.to_dict(), "ts_ns": entry.ts_ns}
        return bytes([Kind.CONSUMER_PUT]) + json.dumps(body, sort_keys=True).encode()
    if isinstance(entry, ConsumerDelete):
        body2 = {"name": entry.name, "ts_ns": entry.ts_ns}
        return bytes([Kind.CONSUMER_DELETE]) + json.dumps(body2, sort_keys=True).encode()
    if isinstance(entry, ConsumerOps):
        name = entry.name.encode()
        parts = [bytes([Kind.CONSUMER_OPS]), _U16.pack(len(name)), name]
        for op in entry.ops:
            raw = encode_op(op)
            parts.append(_U32.pack(len(raw)))
            parts.append(raw)
        return b"".join(parts)
    body3 = {"term": entry.term, "node": entry.node, "seq": entry.seq}
    return bytes([Kind.LEADER]) + json.dumps(body3, sort_keys=True).encode()


def decode(data: bytes) -> GroupEntry:
    """The entry in ``data``; ``DataLossError`` when it is not one."""
    if not data:
        raise DataLossError("empty stream group entry")
    try:
        kind = Kind(data[0])
    except ValueError:
        raise DataLossError(f"unknown stream group entry kind {data[0]}") from None
    body = data[1:]
    try:
        if kind is Kind.STREAM:
            return StreamBatch(tuple(decode_batch(body)))
        if kind is Kind.CONSUMER_OPS:
            return _decode_ops(body)
        raw = _json(body)
        if kind is Kind.CONSUMER_PUT:
            cfg = ConsumerConfig.from_dict(raw["config"])
            return ConsumerPut(str(raw["name"]), cfg, int(raw["ts_ns"]))
        if kind is Kind.CONSUMER_DELETE:
            return ConsumerDelete(str(raw["name"]), int(raw["ts_ns"]))
        return LeaderBarrier(int(raw["term"]), str(raw["node"]), int(raw.get("seq", 0)))
    except DataLossError:
        raise
    except (RaftStreamError, KeyError, TypeError, ValueError, struct.error) as exc:
        raise DataLossError(f"unreadable stream group entry ({kind.name}): {exc}") from exc


def _json(body: bytes) -> dict[str, Any]:
    raw = json.loads(body)
    if not isinstance(raw, dict):
        raise DataLossError("stream group entry body is not an object")
    return raw


def _decode_ops(body: bytes) -> ConsumerOps:
    (n,) = _U16.unpack_from(body, 0)
    pos = _U16.size
    name = body[pos : pos + n].decode()
    pos += n
    ops: list[ConsumerOp] = []
    while pos < len(body):
        (size,) = _U32.unpack_from(body, pos)
        pos += _U32.size
        if pos + size > len(body):
            raise DataLossError("truncated consumer op")
        try:
            ops.append(decode_op(body[pos : pos + size]))
        except InvariantError as exc:
            raise DataLossError(f"unreadable consumer op: {exc}") from exc
        pos += size
    return ConsumerOps(name, tuple(ops))


def ops_entry(name: str, ops: Sequence[ConsumerOp]) -> bytes:
    """Shorthand: the encoded CONSUMER_OPS entry of ``ops`` for consumer ``name``."""
    return encode(ConsumerOps(name, tuple(ops)))
