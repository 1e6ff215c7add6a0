"""Byte layouts of the stored Raft records, each guarded by a CRC-32 checked on every read.

Shared by the LMDB storage and its in-memory twin, so both detect corruption the same way.
A record that fails its checksum raises ``DataLossError``: its bytes are never returned as
data, so a corrupted entry can never reach a state machine.

Layouts (big-endian; ``crc`` covers everything after it, plus the record's key where noted):

- entry:      crc:u32 | term:u64 | type:u8 | data          (crc also covers the 12-byte key)
- hard state: crc:u32 | term:u64 | commit:u64 | vote utf-8
- snap meta:  crc:u32 | index:u64 | term:u64 | data_crc:u32 | conf
- conf:       n_voters:u16 | n_learners:u16 | (len:u16 | utf-8) per node
"""

from __future__ import annotations

import struct
import zlib

from raftstream.raft.errors import DataLossError
from raftstream.raft.types import ConfState, Entry, EntryType, HardState, SnapshotMeta

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "decode_entry",
    "decode_hard_state",
    "decode_snapshot_meta",
    "encode_entry",
    "encode_hard_state",
    "encode_snapshot_meta",
    "entry_key",
    "group_prefix",
    "verify_snapshot_data",
]

_PREFIX = struct.Struct(">I")
_KEY = struct.Struct(">IQ")
_ENTRY_HEAD = struct.Struct(">IQB")
_HARD = struct.Struct(">IQQ")
_SNAP_HEAD = struct.Struct(">IQQI")
_CONF_HEAD = struct.Struct(">HH")
_U16 = struct.Struct(">H")

ENTRY_OVERHEAD_BYTES = _KEY.size + _ENTRY_HEAD.size  # stored bytes beyond an entry's data


def group_prefix(prefix_id: int) -> bytes:
    """The 4-byte key prefix of a group's records (compact stand-in for the group id)."""
    return _PREFIX.pack(prefix_id)


def entry_key(prefix: bytes, index: int) -> bytes:
    """Key of one entry: group prefix + index, 8 bytes big-endian so keys sort by index."""
    return prefix + index.to_bytes(8, "big")


def encode_entry(key: bytes, entry: Entry) -> bytes:
    body = _ENTRY_HEAD.pack(0, entry.term, int(entry.type))[4:] + entry.data
    crc = zlib.crc32(body, zlib.crc32(key))
    return _PREFIX.pack(crc) + body


def decode_entry(key: bytes, value: bytes | memoryview) -> Entry:
    """Decode and verify one entry record; raise DataLossError if it fails its checksum."""
    raw = bytes(value)
    if len(raw) < _ENTRY_HEAD.size:
        raise DataLossError("raft entry record truncated", key=key.hex())
    crc, term, etype = _ENTRY_HEAD.unpack_from(raw)
    if zlib.crc32(raw[4:], zlib.crc32(key)) != crc:
        raise DataLossError("raft entry failed its checksum", key=key.hex())
    index = int.from_bytes(key[-8:], "big")
    try:
        kind = EntryType(etype)
    except ValueError:  # only reachable with a colliding checksum; still never data
        raise DataLossError("raft entry has an unknown type", key=key.hex()) from None
    return Entry(index=index, term=term, type=kind, data=raw[_ENTRY_HEAD.size :])


def encode_hard_state(hs: HardState) -> bytes:
    body = _HARD.pack(0, hs.term, hs.commit)[4:] + hs.vote.encode("utf-8")
    return _PREFIX.pack(zlib.crc32(body)) + body


def decode_hard_state(value: bytes | memoryview) -> HardState:
    raw = bytes(value)
    if len(raw) < _HARD.size:
        raise DataLossError("raft hard state record truncated")
    crc, term, commit = _HARD.unpack_from(raw)
    if zlib.crc32(raw[4:]) != crc:
        raise DataLossError("raft hard state failed its checksum")
    return HardState(term=term, vote=raw[_HARD.size :].decode("utf-8"), commit=commit)


def _encode_conf(conf: ConfState) -> bytes:
    parts = [_CONF_HEAD.pack(len(conf.voters), len(conf.learners))]
    for node in (*conf.voters, *conf.learners):
        raw = node.encode("utf-8")
        parts.append(_U16.pack(len(raw)) + raw)
    return b"".join(parts)


def _decode_conf(raw: bytes) -> ConfState:
    n_voters, n_learners = _CONF_HEAD.unpack_from(raw)
    pos = _CONF_HEAD.size
    nodes: list[str] = []
    for _ in range(n_voters + n_learners):
        (size,) = _U16.unpack_from(raw, pos)
        nodes.append(raw[pos + 2 : pos + 2 + size].decode("utf-8"))
        pos += 2 + size
    return ConfState(voters=tuple(nodes[:n_voters]), learners=tuple(nodes[n_voters:]))


def encode_snapshot_meta(meta: SnapshotMeta, data: bytes) -> bytes:
    """Encode snapshot metadata together with the checksum of the snapshot's data."""
    body = _SNAP_HEAD.pack(0, meta.index, meta.term, zlib.crc32(data))[4:] + _encode_conf(meta.conf)
    return _PREFIX.pack(zlib.crc32(body)) + body


def decode_snapshot_meta(value: bytes | memoryview) -> tuple[SnapshotMeta, int]:
    """Return (meta, crc of the snapshot data); raise DataLossError on a bad checksum."""
    raw = bytes(value)
    if len(raw) < _SNAP_HEAD.size + _CONF_HEAD.size:
        raise DataLossError("raft snapshot meta record truncated")
    crc, index, term, data_crc = _SNAP_HEAD.unpack_from(raw)
    if zlib.crc32(raw[4:]) != crc:
        raise DataLossError("raft snapshot meta failed its checksum")
    conf = _decode_conf(raw[_SNAP_HEAD.size :])
    return SnapshotMeta(index=index, term=term, conf=conf), data_crc


def verify_snapshot_data(data: bytes, data_crc: int) -> bytes:
    """Return ``data`` if it matches the checksum kept in its metadata, else DataLossError."""
    if zlib.crc32(data) != data_crc:
        raise DataLossError("raft snapshot data failed its checksum")
    return data
