"""The on-disk records of the LMDB stream store: key layouts, codecs and checksums.

Every value starts with a CRC-32 (``zlib.crc32``) over the record's key and the rest of the
value. CRC-32 detects every single-bit flip and every burst up to 32 bits, which is what
storage corruption looks like; nothing here defends against a deliberate forger, so a
cryptographic hash (blake2b costs several times more per append on the hot path) buys
nothing. Covering the key catches a record that landed under the wrong key (a message record
covers its stream id through the CRC's start value and its sequence through a copy in its
head, which costs one CRC call per append instead of two). A record that fails its checksum
or does not parse raises ``DataLossError``: never wrong data.

Named DBs (a fixed set shared by every stream of a node, keys prefixed by the stream id):

- ``msgs``: ``id(4) seq(8)`` -> message record
- ``sidx``: ``id(4) subject_key(16) lo_seq(8)`` -> crc, seqs; the per-subject sequence index
  in chunks of up to ``INDEX_CHUNK_SEQS_MAX`` ascending 8-byte sequences, all >= ``lo_seq``
  and below the next chunk's ``lo_seq``
- ``subj``: ``id(4) subject_key(16)`` -> crc, count(8), subject; per-subject counts
- ``ttl``:  ``id(4) expires_at_ns(8) seq(8)`` -> seq(8); per-message TTL deadlines
- ``meta``: ``N name`` -> stream id; ``C`` -> next stream id; ``M id(4)`` -> stream meta
- ``dedup``: ``id(4) dedup_key(16)`` -> crc, seq(8), ts_ns(8), msg id; a msg id's record
- ``dedupt``: ``id(4) ts_ns(8) dedup_key(16)`` -> dedup_key(16); the records in expiry order

``subject_key`` is a 16-byte blake2b digest of the subject: subjects may be up to 4 KiB but
LMDB keys stop at 511 bytes. The ``subj`` record keeps the subject itself. Likewise a dedup
record is keyed by ``dedup_key`` (``engine/store.py``) of its msg id and keeps the id, so two
ids with one digest are told apart (the record belongs to the id it holds).

The subject index is chunked so that an append costs a list append, not an LMDB put: a
transaction rewrites each subject's last chunk once (``INDEX_CHUNK_SEQS_MAX`` keeps a chunk
under LMDB's overflow-page threshold of about 2 KB per node on 4 KiB pages).

The TTL index is key-only in spirit; its value repeats the sequence that ends the key, and a
read that finds the two disagree raises ``DataLossError``. That is its checksum: it costs
nothing (the 8 bytes are already packed for the key), and a flipped bit elsewhere in the key
leads to a message whose own CRC and deadline are checked before it is removed. The dedup
time index works the same way: its value repeats the ``dedup_key`` ending its key, and the
record it leads to must hold the time in the key.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any
from zlib import crc32

from raftstream.engine.store import (
    DEDUP_KEY_BYTES,
    EMPTY_HEADERS,
    DedupRecord,
    DiscardPolicy,
    StoredMsg,
    StoreLimits,
    dedup_key,
)
from raftstream.engine.subjects import validate_subject
from raftstream.errors import DataLossError, InvalidArgumentError

__all__ = [
    "CRC",
    "DB_NAMES",
    "ID",
    "INDEX_CHUNK_SEQS_MAX",
    "MSG_KEY",
    "SEQ",
    "MsgHead",
    "PendingMsg",
    "StoreDbs",
    "StreamMeta",
    "checked_value",
    "decode_chunk",
    "decode_count",
    "decode_dedup",
    "decode_head",
    "decode_id",
    "decode_meta",
    "decode_msg",
    "decode_record",
    "encode_chunk",
    "encode_count",
    "encode_dedup",
    "encode_headers",
    "encode_meta",
    "encode_msgs",
    "encoded_headers_size",
    "hash_of",
    "id_record",
    "msg_lead",
    "open_dbs",
    "subject_key",
    "verified_records",
    "verify_dedup_index",
    "verify_index",
]

DB_NAMES = (b"rs.msgs", b"rs.sidx", b"rs.subj", b"rs.ttl", b"rs.meta", b"rs.dedup", b"rs.dedupt")
SUBJECT_KEY_BYTES = 16
INDEX_CHUNK_SEQS_MAX = 224  # 4 + 224 * 8 bytes + a 28-byte key stays below ~2 KB
_SUBJECT_CACHE_ENTRIES_MAX = 4096

CRC = struct.Struct(">I")
ID = struct.Struct(">I")
SEQ = struct.Struct(">Q")
_COUNT = struct.Struct(">IQ")  # crc, count; the subject follows
_DEDUP = struct.Struct(">IQq")  # crc, seq, ts_ns; the msg id follows
# crc, seq, ts_ns, ttl_ns, subject bytes, encoded header bytes
_MSG_HEAD = struct.Struct(">IQqqHI")
_MSG_VARYING = struct.Struct(">Qqq")  # seq, ts_ns, ttl_ns: the head's per-message part
_MSG_LENS = struct.Struct(">HI")  # subject and header lengths: the rest of the head
MSG_KEY = struct.Struct(">IQ")  # stream id, seq
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
    dedup: Any
    dedupt: Any


def open_dbs(env: Any) -> StoreDbs:
    """Open (creating) the store's named DBs in ``env``."""
    return StoreDbs(*(env.open_db(name) for name in DB_NAMES))


@lru_cache(maxsize=_SUBJECT_CACHE_ENTRIES_MAX)
def subject_key(subject: str) -> tuple[bytes, bytes]:
    """Validate a literal subject once and return (utf-8 bytes, 16-byte index key)."""
    validate_subject(subject)
    raw = subject.encode()
    return raw, hashlib.blake2b(raw, digest_size=SUBJECT_KEY_BYTES).digest()


@lru_cache(maxsize=_SUBJECT_CACHE_ENTRIES_MAX)
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


def encode_chunk(key: bytes, seqs: list[int]) -> bytes:
    """A subject index chunk: CRC over key + the packed sequences."""
    body = struct.pack(f">{len(seqs)}Q", *seqs)
    return CRC.pack(crc32(body, crc32(key))) + body


def decode_chunk(key: bytes, value: bytes) -> list[int]:
    """The sequences of an index chunk (never empty); DataLossError when it fails."""
    checked_value(key, value)
    n, rest = divmod(len(value) - CRC.size, SEQ.size)
    if rest or n == 0 or n > INDEX_CHUNK_SEQS_MAX:
        raise _loss("subject index chunk", key)
    return list(struct.unpack_from(f">{n}Q", value, CRC.size))


def verify_index(key: bytes, value: bytes) -> None:
    """Raise DataLossError unless an index record's value repeats the sequence in its key."""
    if value != key[-SEQ.size :]:
        raise _loss("index record", key)


def verify_dedup_index(key: bytes, value: bytes) -> None:
    """Raise DataLossError unless a dedup time index value repeats the key's dedup_key."""
    if len(key) != ID.size + SEQ.size + DEDUP_KEY_BYTES or value != key[-DEDUP_KEY_BYTES:]:
        raise _loss("dedup time index record", key)


def encode_dedup(key: bytes, seq: int, ts_ns: int, msg_id: bytes) -> bytes:
    """A dedup record: CRC over key + (seq, ts_ns, msg id)."""
    body = _DEDUP.pack(0, seq, ts_ns)[CRC.size :] + msg_id
    return CRC.pack(crc32(body, crc32(key))) + body


def decode_dedup(key: bytes, value: bytes) -> DedupRecord:
    """Verify a dedup record: its checksum, and that the id it holds has the key's digest
    (so a record is never read as another id's). DataLossError when either fails."""
    checked_value(key, value)
    if len(value) <= _DEDUP.size:
        raise _loss("dedup record", key)
    _, seq, ts_ns = _DEDUP.unpack_from(value)
    try:
        msg_id = value[_DEDUP.size :].decode()
    except UnicodeDecodeError as exc:
        raise _loss("dedup record id", key) from exc
    if key[ID.size :] != dedup_key(msg_id):
        raise _loss("dedup record id", key)
    return DedupRecord(msg_id, seq, ts_ns)


def encode_headers(headers: Mapping[str, str]) -> bytes:
    if not headers:
        return b""
    parts = [_HDR_COUNT.pack(len(headers))]
    for k, v in headers.items():
        kb, vb = k.encode(), v.encode()
        parts += (_HDR_PAIR.pack(len(kb), len(vb)), kb, vb)
    return b"".join(parts)


def encoded_headers_size(encoded: bytes, count: int) -> int:
    """``headers_size`` of ``count`` headers from their ``encode_headers`` bytes: the
    encoding less its framing (what ``decode_head`` computes back), without re-encoding
    every key and value to count them."""
    if not count:
        return 0
    return len(encoded) - _HDR_COUNT.size - _HDR_PAIR.size * count


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


PendingMsg = tuple[int, bytes, bytes, int, int]
"""An append not yet encoded: (seq, ``msg_lead``, payload, ts_ns, ttl_ns)."""


def msg_lead(subject: bytes, hdrs: bytes) -> bytes:
    """The part of a message record after seq/ts/ttl and before the payload: the lengths, the
    subject and the encoded headers. Without headers it is the same for every message of a
    subject, so the store computes it once per subject."""
    return b"".join((_MSG_LENS.pack(len(subject), len(hdrs)), subject, hdrs))


def encode_msgs(stream_id: int, pending: list[PendingMsg]) -> list[tuple[bytes, bytes]]:
    """Message records (key, value) for a batch of appends of one stream.

    A value is the CRC, then the head (which repeats the sequence), subject, encoded headers
    and payload. The CRC starts from the CRC of the stream id, so it covers the whole key.
    One tight loop per batch: this is the store's append cost, done at flush time.
    """
    pack_key, pack_head, pack_crc, join = MSG_KEY.pack, _MSG_VARYING.pack, CRC.pack, b"".join
    seed = crc32(ID.pack(stream_id))
    out = []
    for seq, lead, data, ts, ttl in pending:
        body = join((pack_head(seq, ts, ttl), lead, data))
        out.append((pack_key(stream_id, seq), pack_crc(crc32(body, seed)) + body))
    return out


@dataclass(frozen=True, slots=True)
class MsgHead:
    """What removal needs from a message record, without decoding its payload."""

    seq: int
    subject: bytes
    ts: int
    ttl: int
    size: int


def _verified(key: bytes, value: bytes) -> tuple[int, int, int, int, int]:
    """(seq, ts, ttl, subject length, headers length) of a message record whose CRC, key
    and lengths check out; DataLossError otherwise."""
    if len(value) < _MSG_HEAD.size:
        raise _loss("message record", key)
    crc, seq, ts, ttl, slen, hlen = _MSG_HEAD.unpack_from(value)
    if crc != crc32(memoryview(value)[CRC.size :], crc32(key[: ID.size])):
        raise _loss("message record", key)
    if key[ID.size :] != SEQ.pack(seq) or _MSG_HEAD.size + slen + hlen > len(value):
        raise _loss("message record", key)
    return seq, ts, ttl, slen, hlen


def decode_head(key: bytes, value: bytes) -> MsgHead:
    """Verify the record and return its head (DataLossError when it fails)."""
    seq, ts, ttl, slen, hlen = _verified(key, value)
    end = _MSG_HEAD.size + slen
    # StoredMsg.size: subject + header keys/values (the encoding less its framing) + payload.
    size = len(value) - _MSG_HEAD.size
    if hlen:
        if hlen < _HDR_COUNT.size:
            raise _loss("message headers", key)
        size -= _HDR_COUNT.size + _HDR_PAIR.size * _HDR_COUNT.unpack_from(value, end)[0]
    return MsgHead(seq, value[_MSG_HEAD.size : end], ts, ttl, size)


def verified_records(prefix: bytes, items: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The message records of ``items`` (a cursor's (key, value) pairs from the stream's
    first key on) up to the first key of another stream, each checked without decoding
    it: its CRC (over the whole value, so a flipped length fails it too), its head's size,
    and the sequence in its head against its key. What a snapshot copies
    (``cluster/stream/snapshot.py``); ``decode_record`` checks the rest (the subject and
    header lengths, the encodings) when it is restored. DataLossError when one fails.
    Cheaper than ``_verified`` per record (no unpack of the head): it is a compaction's
    whole per-message cost."""
    seed = crc32(prefix)
    head, at, unpack = _MSG_HEAD.size, CRC.size, CRC.unpack_from
    out: list[bytes] = []
    for key, value in items:
        if not key.startswith(prefix):
            break
        if (
            len(value) < head
            or unpack(value)[0] != crc32(memoryview(value)[at:], seed)
            or key[ID.size :] != value[at : at + SEQ.size]
        ):
            raise _loss("message record", key)
        out.append(value)
    return out


def decode_record(stream_id: int, value: bytes) -> StoredMsg:
    """Verify and decode a message record of the store whose stream id is ``stream_id``
    (``verified_records``' output, perhaps another node's): ``decode_msg`` with the key the
    record names."""
    if len(value) < _MSG_HEAD.size:
        raise DataLossError("truncated message record")
    return decode_msg(ID.pack(stream_id) + value[CRC.size : CRC.size + SEQ.size], value)


def decode_msg(key: bytes, value: bytes) -> StoredMsg:
    """Verify and decode a whole message record: ``decode_head``'s checks with the decoding
    (no ``MsgHead`` in between: this runs for every message a consumer reads)."""
    seq, ts, ttl, slen, hlen = _verified(key, value)
    start = _MSG_HEAD.size + slen
    end = start + hlen
    try:
        subject = value[_MSG_HEAD.size : start].decode()
    except UnicodeDecodeError as exc:
        raise _loss("message subject", key) from exc
    headers = _decode_headers(value[start:end], key) if hlen else EMPTY_HEADERS
    return StoredMsg(seq, subject, value[end:], ts, headers, ttl)


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
