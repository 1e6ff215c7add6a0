"""The on-disk records of the LMDB stream store: key layouts, codecs and checksums.

Every value starts with a CRC-32 (``zlib.crc32``) over the record's key and the rest of the
value. CRC-32 detects every single-bit flip and every burst up to 32 bits, which is what
storage corruption looks like; nothing here defends against a deliberate forger, so a
cryptographic hash (blake2b costs several times more per append on the hot path) buys
nothing. Covering the key catches a record that landed under the wrong key. A record that
fails its checksum or does not parse raises ``DataLossError``: never wrong data.

Named DBs (a fixed set shared by every stream of a node, keys prefixed by the stream id):

- ``msgs``: ``id(4) seq(8)`` -> message record
- ``sidx``: ``id(4) subject_key(16) seq(8)`` -> seq(8); the per-subject sequence index
- ``subj``: ``id(4) subject_key(16)`` -> crc, count(8), subject; per-subject counts
- ``ttl``:  ``id(4) expires_at_ns(8) seq(8)`` -> seq(8); per-message TTL deadlines
- ``meta``: ``N name`` -> stream id; ``C`` -> next stream id; ``M id(4)`` -> stream meta

``subject_key`` is a 16-byte blake2b digest of the subject: subjects may be up to 4 KiB but
LMDB keys stop at 511 bytes. The ``subj`` record keeps the subject itself.

The two index DBs are key-only in spirit; their value repeats the sequence that ends the key,
and a read that finds the two disagree raises ``DataLossError``. That is their checksum: it
costs nothing on the append path (the 8 bytes are already packed for the key), and what a
CRC of the key would add is covered by the cross-check every index lookup makes: the message
an index entry leads to carries its own CRC, and its subject must hash to the entry's key.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from zlib import crc32

from raftstream.engine.store import (
    EMPTY_HEADERS,
    DiscardPolicy,
    StoredMsg,
    StoreLimits,
)
from raftstream.engine.subjects import validate_subject
from raftstream.errors import DataLossError, InvalidArgumentError

__all__ = [
    "CRC",
    "DB_NAMES",
    "ID",
    "SEQ",
    "MsgHead",
    "StoreDbs",
    "StreamMeta",
    "checked_value",
    "decode_count",
    "decode_head",
    "decode_id",
    "decode_meta",
    "decode_msg",
    "encode_count",
    "encode_headers",
    "encode_meta",
    "encode_msg",
    "hash_of",
    "id_record",
    "open_dbs",
    "subject_key",
    "verify_index",
]

DB_NAMES = (b"rs.msgs", b"rs.sidx", b"rs.subj", b"rs.ttl", b"rs.meta")
SUBJECT_KEY_BYTES = 16
_SUBJECT_CACHE_MAX = 4096

CRC = struct.Struct(">I")
ID = struct.Struct(">I")
SEQ = struct.Struct(">Q")
_COUNT = struct.Struct(">IQ")  # crc, count; the subject follows
# crc, ts_ns, ttl_ns, size (StoredMsg.size), subject bytes, encoded header bytes
_MSG_HEAD = struct.Struct(">IqqQHI")
_MSG_BODY = struct.Struct(">qqQHI")  # _MSG_HEAD after the crc
_HDR_COUNT = struct.Struct(">H")
_HDR_PAIR = struct.Struct(">HI")
_META_VERSION = 1
# crc, version, first_seq, last_seq, msgs, bytes, last_ts, num_subjects,
# max_msgs, max_bytes, max_msgs_per_subject, max_msg_size, max_age_ns, discard new,
# discard_new_per_subject
_META = struct.Struct(">IBQQQQqQqqqqqBB")


@dataclass(frozen=True, slots=True)
class StoreDbs:
    """Handles of the stream store's named DBs in one environment."""

    msgs: Any
    sidx: Any
    subj: Any
    ttl: Any
    meta: Any


def open_dbs(env: Any) -> StoreDbs:
    """Open (creating) the store's named DBs in ``env``."""
    return StoreDbs(*(env.open_db(name) for name in DB_NAMES))


@lru_cache(maxsize=_SUBJECT_CACHE_MAX)
def subject_key(subject: str) -> tuple[bytes, bytes]:
    """Validate a literal subject once and return (utf-8 bytes, 16-byte index key)."""
    validate_subject(subject)
    raw = subject.encode()
    return raw, hashlib.blake2b(raw, digest_size=SUBJECT_KEY_BYTES).digest()


@lru_cache(maxsize=_SUBJECT_CACHE_MAX)
def hash_of(subject: bytes) -> bytes:
    """The index key of a stored subject; DataLossError if the stored bytes are no subject."""
    try:
        return subject_key(subject.decode())[1]
    except (UnicodeDecodeError, InvalidArgumentError) as exc:
        raise DataLossError(f"stored subject is not a valid subject: {subject!r}") from exc


def _loss(what: str, key: bytes) -> DataLossError:
    return DataLossError(f"stream store: {what} failed its checksum (key {key.hex()})", key=key)


def checked_value(key: bytes, value: bytes) -> None:
    """Raise DataLossError unless ``value`` starts with the CRC of key + rest of value."""
    if len(value) < CRC.size or CRC.unpack_from(value)[0] != crc32(
        memoryview(value)[CRC.size :], crc32(key)
    ):
        raise _loss("record", key)


def verify_index(key: bytes, value: bytes) -> None:
    """Raise DataLossError unless an index record's value repeats the sequence in its key."""
    if value != key[-SEQ.size :]:
        raise _loss("index record", key)


def encode_headers(headers: Mapping[str, str]) -> bytes:
    if not headers:
        return b""
    parts = [_HDR_COUNT.pack(len(headers))]
    for k, v in headers.items():
        kb, vb = k.encode(), v.encode()
        parts += (_HDR_PAIR.pack(len(kb), len(vb)), kb, vb)
    return b"".join(parts)


def _decode_headers(raw: bytes, key: bytes) -> Mapping[str, str]:
    if not raw:
        return EMPTY_HEADERS
    try:
        (n,) = _HDR_COUNT.unpack_from(raw)
        pos = _HDR_COUNT.size
        out: dict[str, str] = {}
        for _ in range(n):
            klen, vlen = _HDR_PAIR.unpack_from(raw, pos)
            pos += _HDR_PAIR.size
            k = raw[pos : pos + klen].decode()
            v = raw[pos + klen : pos + klen + vlen].decode()
            pos += klen + vlen
            out[k] = v
    except (struct.error, UnicodeDecodeError) as exc:
        raise _loss("message headers", key) from exc
    if pos != len(raw):
        raise _loss("message headers", key)
    return out


def encode_msg(
    key: bytes, subject: bytes, hdrs: bytes, data: bytes, *, ts: int, ttl: int, size: int
) -> bytes:
    """A message record: head, subject, encoded headers, payload; CRC over key + the rest."""
    body = b"".join((_MSG_BODY.pack(ts, ttl, size, len(subject), len(hdrs)), subject, hdrs, data))
    return CRC.pack(crc32(body, crc32(key))) + body


@dataclass(frozen=True, slots=True)
class MsgHead:
    """What removal needs from a message record, without decoding its payload."""

    seq: int
    subject: bytes
    ts: int
    ttl: int
    size: int


def decode_head(key: bytes, value: bytes) -> MsgHead:
    """Verify the record and return its head (DataLossError when it fails)."""
    checked_value(key, value)
    if len(value) < _MSG_HEAD.size:
        raise _loss("message record", key)
    _, ts, ttl, size, slen, hlen = _MSG_HEAD.unpack_from(value)
    end = _MSG_HEAD.size + slen
    if end + hlen > len(value):
        raise _loss("message record", key)
    return MsgHead(SEQ.unpack_from(key, ID.size)[0], value[_MSG_HEAD.size : end], ts, ttl, size)


def decode_msg(key: bytes, value: bytes) -> StoredMsg:
    """Verify and decode a whole message record."""
    head = decode_head(key, value)
    start = _MSG_HEAD.size + len(head.subject)
    hlen = _MSG_HEAD.unpack_from(value)[5]
    try:
        subject = head.subject.decode()
    except UnicodeDecodeError as exc:
        raise _loss("message subject", key) from exc
    headers = _decode_headers(value[start : start + hlen], key)
    return StoredMsg(head.seq, subject, value[start + hlen :], head.ts, headers, head.ttl)


def id_record(key: bytes, stream_id: int) -> bytes:
    """A stream id (registry entry or the next-id counter) with its CRC."""
    body = ID.pack(stream_id)
    return CRC.pack(crc32(body, crc32(key))) + body


def decode_id(key: bytes, value: bytes) -> int:
    checked_value(key, value)
    if len(value) != CRC.size + ID.size:
        raise _loss("stream id record", key)
    return int(ID.unpack_from(value, CRC.size)[0])


def encode_count(key: bytes, count: int, subject: bytes) -> bytes:
    body = _COUNT.pack(0, count)[CRC.size :] + subject
    return CRC.pack(crc32(body, crc32(key))) + body


def decode_count(key: bytes, value: bytes) -> tuple[int, bytes]:
    """(count, subject bytes) of a ``subj`` record."""
    checked_value(key, value)
    if len(value) < _COUNT.size:
        raise _loss("subject record", key)
    return _COUNT.unpack_from(value)[1], value[_COUNT.size :]


@dataclass(slots=True)
class StreamMeta:
    """A stream's counters and limits as persisted; ``first_seq``..``last_seq`` as StreamState."""

    first_seq: int = 0
    last_seq: int = 0
    msgs: int = 0
    bytes: int = 0
    last_ts: int = 0
    num_subjects: int = 0
    limits: StoreLimits = field(default_factory=StoreLimits)


def encode_meta(key: bytes, m: StreamMeta) -> bytes:
    lim = m.limits
    body = _META.pack(
        0,
        _META_VERSION,
        m.first_seq,
        m.last_seq,
        m.msgs,
        m.bytes,
        m.last_ts,
        m.num_subjects,
        lim.max_msgs,
        lim.max_bytes,
        lim.max_msgs_per_subject,
        lim.max_msg_size,
        lim.max_age_ns,
        lim.discard is DiscardPolicy.NEW,
        lim.discard_new_per_subject,
    )[CRC.size :]
    return CRC.pack(crc32(body, crc32(key))) + body


def decode_meta(key: bytes, value: bytes) -> StreamMeta:
    checked_value(key, value)
    if len(value) != _META.size:
        raise _loss("stream meta", key)
    f = _META.unpack(value)
    if f[1] != _META_VERSION:
        raise _loss(f"stream meta version {f[1]}", key)
    limits = StoreLimits(
        max_msgs=f[8],
        max_bytes=f[9],
        max_msgs_per_subject=f[10],
        max_msg_size=f[11],
        max_age_ns=f[12],
        discard=DiscardPolicy.NEW if f[13] else DiscardPolicy.OLD,
        discard_new_per_subject=bool(f[14]),
    )
    return StreamMeta(f[2], f[3], f[4], f[5], f[6], f[7], limits)
