"""The entries a stream's Raft log carries, and their byte encoding.

Entries are plain frozen values; ``Stream.apply`` turns each into a result. Every entry
carries ``ts_ns``, the LEADER's timestamp (nanoseconds since the epoch): replicas never read
their own clock, so they all compute the same state from the same log.

Encoding (``encode``/``decode``) is a small hand-rolled binary framing built on ``struct``,
chosen over JSON because a publish is mostly an opaque payload (JSON would base64 it, +33%,
and parse it on every replica) and over protobuf because ``engine`` stays free of generated
code and grpc. Layout, all integers little-endian::

    u8 version (FORMAT_VERSION) | u8 kind | i64 ts_ns | body

A string or byte field is ``u32 length + bytes`` (strings UTF-8). A publish body starts with
a ``u16`` presence mask for its optional fields, so fields can be added in a later version
without ambiguity. ``UpdateConfig`` carries the config as JetStream JSON (``to_dict``): config
changes are rare, and this way a new config field needs no new layout. ``decode`` raises
``DataLossError`` for anything it cannot read exactly (unknown version or kind, truncation,
trailing bytes, bad UTF-8, unknown presence bits): a log entry is never half-understood.
``encode_batch``/``decode_batch`` put several entries in one Raft entry.

The second half of the module interprets a publish the way JetStream does: its options may
come as fields or as JetStream headers (``Nats-Msg-Id``, ``Nats-Expected-*``, ``Nats-Rollup``,
``Nats-TTL``); ``publish_options`` merges the two and refuses a malformed or conflicting one.
"""

from __future__ import annotations

import enum
import json
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

from raftstream.engine.store import EMPTY_HEADERS
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError, InvalidArgumentError, RaftStreamError

__all__ = [
    "BATCH_ENTRIES_MAX",
    "FORMAT_VERSION",
    "HDR_EXPECTED_LAST_MSG_ID",
    "HDR_EXPECTED_LAST_SEQ",
    "HDR_EXPECTED_LAST_SUBJECT_SEQ",
    "HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT",
    "HDR_EXPECTED_STREAM",
    "HDR_MSG_ID",
    "HDR_ROLLUP",
    "HDR_TTL",
    "TTL_MIN_NS",
    "Copy",
    "DeleteMsg",
    "Entry",
    "Expire",
    "Publish",
    "PublishOptions",
    "Purge",
    "Rollup",
    "UpdateConfig",
    "check_ttl",
    "decode",
    "decode_batch",
    "encode",
    "encode_batch",
    "parse_ttl",
    "plain_publish",
    "publish_options",
]

FORMAT_VERSION = 1


class Kind(enum.IntEnum):
    PUBLISH = 1
    DELETE_MSG = 2
    PURGE = 3
    UPDATE_CONFIG = 4
    EXPIRE = 5
    BATCH = 6
    COPY = 7
    COPY_AT = 8  # a COPY with its origin's timestamp (a mirror's): i64 origin_ts_ns first
    # A COPY whose ``Nats-Rollup`` header is applied (``Copy.rollup``): i64 origin_ts_ns
    # first (0: none), then a COPY's body.
    COPY_ROLLUP = 9


@dataclass(frozen=True, slots=True, kw_only=True)
class Publish:
    """Store one message. Optional fields may also arrive as JetStream headers (see
    ``Stream``); ``None`` means "not given". ``ttl_ns`` is a per-message TTL in nanoseconds.
    ``expected_last_subject_seq_subject`` narrows the expected-last-subject-sequence check to
    a filter other than the message's subject (JetStream's
    ``Nats-Expected-Last-Subject-Sequence-Subject``)."""

    ts_ns: int
    subject: str
    data: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: EMPTY_HEADERS, hash=False)
    msg_id: str | None = None
    expected_stream: str | None = None
    expected_last_seq: int | None = None
    expected_last_subject_seq: int | None = None
    expected_last_subject_seq_subject: str | None = None
    expected_last_msg_id: str | None = None
    ttl_ns: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteMsg:
    """Remove one message. As JetStream's delete request, the bytes are erased (overwritten)
    unless ``no_erase``."""

    ts_ns: int
    seq: int
    no_erase: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Purge:
    """JetStream's purge request: ``subject`` filter, ``seq`` (exclusive upper bound) or
    ``keep`` (newest N); all None purges everything."""

    ts_ns: int
    subject: str | None = None
    seq: int | None = None
    keep: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConfig:
    """Replace the stream's configuration (checked by ``check_update`` on apply)."""

    ts_ns: int
    config: StreamConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Expire:
    """Remove messages past ``max_age`` or their TTL as of ``ts_ns``. The leader proposes one
    when the oldest deadline passes, so expiry is replicated like everything else."""

    ts_ns: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Copy:
    """Store one message copied from origin ``origin`` (a ``stream_source.source_key``) of a
    mirror or source, at origin sequence ``origin_seq``. ``prev_origin_seq`` is the origin
    sequence the proposer believed was stored last: a copy whose belief is stale (another
    leader copied meanwhile) is refused rather than stored out of order. ``skipped`` is an
    origin range the proposer saw removed before it could be copied (reported, not stored).
    ``headers`` are the origin's; the stream adds ``Nats-Stream-Source``."""

    ts_ns: int
    origin: str
    origin_seq: int
    prev_origin_seq: int
    subject: str
    data: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: EMPTY_HEADERS, hash=False)
    skipped: tuple[int, int] | None = None
    # The message's time at the origin, kept as its time here (a mirror's copy, as a
    # JetStream mirror keeps it); 0: stored at ``ts_ns``, the leader's time (a source's).
    origin_ts_ns: int = 0
    # Apply the copy's ``Nats-Rollup`` header as a publish's (on a stream that allows
    # rollups): the origin's older messages of the subject (or all) go here too. False: a
    # rollup copy is stored as it is (entries from before this field).
    rollup: bool = False


Entry = Publish | DeleteMsg | Purge | UpdateConfig | Expire | Copy

_HEAD = struct.Struct("<BBq")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
# Publish presence bits, in encoding order.
_OPTIONAL_PUBLISH = (
    ("msg_id", "s"),
    ("expected_stream", "s"),
    ("expected_last_seq", "u"),
    ("expected_last_subject_seq", "u"),
    ("expected_last_subject_seq_subject", "s"),
    ("expected_last_msg_id", "s"),
    ("ttl_ns", "i"),
)
_KNOWN_BITS = (1 << len(_OPTIONAL_PUBLISH)) - 1


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, b: bytes) -> None:
        self.parts.append(_U32.pack(len(b)))
        self.parts.append(b)

    def text(self, s: str) -> None:
        self.raw(s.encode("utf-8"))

    def value(self, kind: str, v: object) -> None:
        if kind == "s":
            self.text(cast(str, v))
        elif kind == "u":
            self.parts.append(_U64.pack(v))
        else:
            self.parts.append(_I64.pack(v))


class _Reader:
    """Reads one encoded entry; every read is bounds-checked (``DataLossError``)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.pos = 0

    def _need(self, n: int) -> int:
        end = self.pos + n
        if end > len(self.data):
            raise DataLossError("entry truncated", offset=self.pos)
        return end

    def take(self, n: int) -> bytes:
        end = self._need(n)
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def unpack(self, st: struct.Struct) -> int:
        end = self._need(st.size)
        (v,) = st.unpack_from(self.data, self.pos)
        self.pos = end
        return int(v)

    def raw(self) -> bytes:
        return self.take(self.unpack(_U32))

    def text(self) -> str:
        try:
            return self.raw().decode("utf-8")
        except UnicodeDecodeError:
            raise DataLossError("entry holds invalid UTF-8", offset=self.pos) from None

    def value(self, kind: str) -> object:
        if kind == "s":
            return self.text()
        return self.unpack(_U64 if kind == "u" else _I64)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise DataLossError("trailing bytes after entry", offset=self.pos)


def _encode_publish(e: Publish, w: _Writer) -> None:
    mask = 0
    for bit, (name, _) in enumerate(_OPTIONAL_PUBLISH):
        if getattr(e, name) is not None:
            mask |= 1 << bit
    w.parts.append(_U16.pack(mask))
    w.text(e.subject)
    w.raw(bytes(e.data))
    w.parts.append(_U32.pack(len(e.headers)))
    for k, v in e.headers.items():
        w.text(k)
        w.text(v)
    for bit, (name, kind) in enumerate(_OPTIONAL_PUBLISH):
        if mask & (1 << bit):
            w.value(kind, getattr(e, name))


def _decode_publish(ts_ns: int, r: _Reader) -> Publish:
    mask = r.unpack(_U16)
    if mask & ~_KNOWN_BITS:
        raise DataLossError(f"publish entry has unknown optional fields (mask {mask:#x})")
    subject = r.text()
    data = r.raw()
    headers = {}
    for _ in range(r.unpack(_U32)):
        k = r.text()
        headers[k] = r.text()
    optional = {
        name: r.value(kind)
        for bit, (name, kind) in enumerate(_OPTIONAL_PUBLISH)
        if mask & (1 << bit)
    }
    return Publish(
        ts_ns=ts_ns,
        subject=subject,
        data=data,
        headers=headers or EMPTY_HEADERS,
        **optional,  # type: ignore[arg-type]
    )


def _encode_opt_u64(w: _Writer, v: int | None) -> None:
    w.parts.append(b"\x00" if v is None else b"\x01" + _U64.pack(v))


def _decode_opt_u64(r: _Reader) -> int | None:
    flag = r.take(1)
    if flag == b"\x00":
        return None
    if flag != b"\x01":
        raise DataLossError("bad optional-field flag in entry")
    return r.unpack(_U64)


def _encode_body(entry: Entry, w: _Writer) -> Kind:
    if isinstance(entry, Publish):
        _encode_publish(entry, w)
        return Kind.PUBLISH
    if isinstance(entry, DeleteMsg):
        w.parts.append(_U64.pack(entry.seq) + (b"\x01" if entry.no_erase else b"\x00"))
        return Kind.DELETE_MSG
    if isinstance(entry, Purge):
        w.parts.append(b"\x00" if entry.subject is None else b"\x01")
        if entry.subject is not None:
            w.text(entry.subject)
        _encode_opt_u64(w, entry.seq)
        _encode_opt_u64(w, entry.keep)
        return Kind.PURGE
    if isinstance(entry, UpdateConfig):
        w.text(json.dumps(entry.config.to_dict(), sort_keys=True, separators=(",", ":")))
        return Kind.UPDATE_CONFIG
    if isinstance(entry, Copy):
        lo, hi = entry.skipped or (0, 0)
        if entry.origin_ts_ns or entry.rollup:
            w.parts.append(_I64.pack(entry.origin_ts_ns))
        w.parts.append(_U64.pack(entry.origin_seq) + _U64.pack(entry.prev_origin_seq))
        w.parts.append(_U64.pack(lo) + _U64.pack(hi))
        w.text(entry.origin)
        w.text(entry.subject)
        w.raw(bytes(entry.data))
        w.parts.append(_U32.pack(len(entry.headers)))
        for k, v in entry.headers.items():
            w.text(k)
            w.text(v)
        if entry.rollup:
            return Kind.COPY_ROLLUP
        return Kind.COPY_AT if entry.origin_ts_ns else Kind.COPY
    return Kind.EXPIRE


def encode(entry: Entry) -> bytes:
    """The entry's bytes (format ``FORMAT_VERSION``). Raises ``struct.error`` or
    ``OverflowError`` for values outside the format (negative sequences, >4 GiB fields)."""
    w = _Writer()
    kind = _encode_body(entry, w)
    return _HEAD.pack(FORMAT_VERSION, kind, entry.ts_ns) + b"".join(w.parts)


def _decode_delete(ts_ns: int, r: _Reader) -> DeleteMsg:
    seq = r.unpack(_U64)
    flag = r.take(1)
    if flag not in (b"\x00", b"\x01"):
        raise DataLossError("bad no_erase flag in entry")
    return DeleteMsg(ts_ns=ts_ns, seq=seq, no_erase=flag == b"\x01")


def _decode_purge(ts_ns: int, r: _Reader) -> Purge:
    flag = r.take(1)
    if flag not in (b"\x00", b"\x01"):
        raise DataLossError("bad subject flag in purge entry")
    subject = r.text() if flag == b"\x01" else None
    seq = _decode_opt_u64(r)
    return Purge(ts_ns=ts_ns, subject=subject, seq=seq, keep=_decode_opt_u64(r))


def _decode_update(ts_ns: int, r: _Reader) -> UpdateConfig:
    text = r.text()
    try:
        config = StreamConfig.from_dict(json.loads(text))
    except (ValueError, RaftStreamError) as exc:
        raise DataLossError(f"update entry holds an unreadable config: {exc}") from None
    return UpdateConfig(ts_ns=ts_ns, config=config)


_COPY_SEQS = struct.Struct("<QQQQ")  # origin_seq, prev_origin_seq, skipped first, last


def _decode_copy_at(ts_ns: int, r: _Reader) -> Copy:
    origin_ts_ns = r.unpack(_I64)
    if origin_ts_ns <= 0:
        raise DataLossError(f"copy entry has a bad origin timestamp {origin_ts_ns}")
    return _decode_copy(ts_ns, r, origin_ts_ns)


def _decode_copy_rollup(ts_ns: int, r: _Reader) -> Copy:
    origin_ts_ns = r.unpack(_I64)
    if origin_ts_ns < 0:
        raise DataLossError(f"copy entry has a bad origin timestamp {origin_ts_ns}")
    return _decode_copy(ts_ns, r, origin_ts_ns, rollup=True)


def _decode_copy(ts_ns: int, r: _Reader, origin_ts_ns: int = 0, *, rollup: bool = False) -> Copy:
    end = r._need(_COPY_SEQS.size)
    origin_seq, prev, lo, hi = _COPY_SEQS.unpack_from(r.data, r.pos)
    r.pos = end
    origin = r.text()
    subject = r.text()
    data = r.raw()
    headers = {}
    for _ in range(r.unpack(_U32)):
        k = r.text()
        headers[k] = r.text()
    if (lo == 0) != (hi == 0) or lo > hi:
        raise DataLossError(f"copy entry has a bad skipped range {lo}..{hi}")
    return Copy(
        ts_ns=ts_ns,
        origin=origin,
        origin_seq=origin_seq,
        prev_origin_seq=prev,
        subject=subject,
        data=data,
        headers=headers or EMPTY_HEADERS,
        skipped=(lo, hi) if lo else None,
        origin_ts_ns=origin_ts_ns,
        rollup=rollup,
    )


_DECODERS: Mapping[int, Callable[[int, _Reader], Entry]] = {
    Kind.PUBLISH: _decode_publish,
    Kind.DELETE_MSG: _decode_delete,
    Kind.PURGE: _decode_purge,
    Kind.UPDATE_CONFIG: _decode_update,
    Kind.EXPIRE: lambda ts_ns, _r: Expire(ts_ns=ts_ns),
    Kind.COPY: _decode_copy,
    Kind.COPY_AT: _decode_copy_at,
    Kind.COPY_ROLLUP: _decode_copy_rollup,
}


def _read_head(r: _Reader) -> tuple[int, int]:
    version = r.unpack(_U8)
    if version != FORMAT_VERSION:
        raise DataLossError(
            f"entry format version {version} is not supported (this node reads {FORMAT_VERSION})"
        )
    kind = r.unpack(_U8)
    return kind, r.unpack(_I64)


def decode(data: bytes) -> Entry:
    """The entry encoded in ``data``; ``DataLossError`` unless it reads exactly."""
    r = _Reader(data)
    kind, ts_ns = _read_head(r)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        what = "a batch (read it with decode_batch)" if kind == Kind.BATCH else "unknown"
        raise DataLossError(f"entry kind {kind} is {what}")
    entry = decoder(ts_ns, r)
    r.done()
    return entry


# A batch holds at most this many entries: a bound on what one Raft entry may carry.
BATCH_ENTRIES_MAX = 65_536


def encode_batch(entries: Sequence[Entry]) -> bytes:
    """Several entries in one Raft entry (the leader batches concurrent proposals):
    ``head(kind BATCH, ts_ns of the last) | u32 count | (u32 length | entry bytes)*``."""
    if not 0 < len(entries) <= BATCH_ENTRIES_MAX:
        raise InvalidArgumentError("entries", f"a batch holds 1..{BATCH_ENTRIES_MAX} entries")
    w = _Writer()
    w.parts.append(_U32.pack(len(entries)))
    for entry in entries:
        raw = _encode_plain(entry)
        w.raw(encode(entry) if raw is None else raw)
    return _HEAD.pack(FORMAT_VERSION, Kind.BATCH, entries[-1].ts_ns) + b"".join(w.parts)


def _encode_plain(e: Entry) -> bytes | None:
    """``encode(e)`` of a plain publish (no optional field, no header), in one pack; None
    for any other entry. Must give exactly ``encode``'s bytes (``_plain_publish`` reads
    them back)."""
    if (
        type(e) is not Publish
        or e.headers
        or e.msg_id is not None
        or e.expected_stream is not None
        or e.expected_last_seq is not None
        or e.expected_last_subject_seq is not None
        or e.expected_last_subject_seq_subject is not None
        or e.expected_last_msg_id is not None
        or e.ttl_ns is not None
    ):
        return None
    subject = e.subject.encode("utf-8")
    data = bytes(e.data)
    head = _PLAIN_HEAD.pack(FORMAT_VERSION, Kind.PUBLISH, e.ts_ns, _PLAIN_MASK, len(subject))
    return b"".join((head, subject, _U32.pack(len(data)), data, _NO_HEADERS))


_NO_HEADERS = _U32.pack(0)


def decode_batch(data: bytes) -> list[Entry]:
    """The entries of a batch, in order; a single (non-batch) entry reads as a list of one,
    so a log may mix both. ``DataLossError`` unless every byte reads exactly."""
    data = bytes(data)
    r = _Reader(data)
    kind, _ = _read_head(r)
    if kind != Kind.BATCH:
        return [decode(data)]
    count = r.unpack(_U32)
    if not 0 < count <= BATCH_ENTRIES_MAX:
        raise DataLossError(f"batch of {count} entries is out of bounds")
    entries: list[Entry] = []
    pos = r.pos
    for _ in range(count):
        start = pos + _U32.size
        if start > len(data):
            raise DataLossError("entry truncated", offset=pos)
        end = start + _U32.unpack_from(data, pos)[0]
        if end > len(data):
            raise DataLossError("entry truncated", offset=start)
        # The common entry (a publish of subject and data only) is read in place; any
        # other, or one that does not read exactly, goes through ``decode``.
        entry = _plain_publish(data, start, end)
        entries.append(entry if entry is not None else decode(data[start:end]))
        pos = end
    if pos != len(data):
        raise DataLossError("trailing bytes after entry", offset=pos)
    return entries


# A plain publish in place: head, mask 0, subject length; then data length, 0 headers.
_PLAIN_HEAD = struct.Struct("<BBqHI")
_PLAIN_MASK = 0


def _plain_publish(data: bytes, start: int, end: int) -> Publish | None:
    """The publish encoded in ``data[start:end]`` when it is a plain one (no optional field,
    no header) that reads exactly; None for anything else (the caller decodes it the slow,
    fully checked way, which also reports what is wrong)."""
    if end - start < _PLAIN_HEAD.size + 2 * _U32.size:
        return None
    version, kind, ts_ns, mask, n_subject = _PLAIN_HEAD.unpack_from(data, start)
    if version != FORMAT_VERSION or kind != Kind.PUBLISH or mask != _PLAIN_MASK:
        return None
    pos = start + _PLAIN_HEAD.size + n_subject
    if pos + _U32.size > end:
        return None
    data_end = pos + _U32.size + _U32.unpack_from(data, pos)[0]
    if data_end + _U32.size != end or _U32.unpack_from(data, data_end)[0] != 0:
        return None
    try:
        subject = data[start + _PLAIN_HEAD.size : pos].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return plain_publish(ts_ns, subject, data[pos + _U32.size : data_end])


# ``plain_publish`` sets every slot of ``Publish`` itself: it must know them all.
_PUBLISH_SLOTS = (
    "ts_ns",
    "subject",
    "data",
    "headers",
    "msg_id",
    "expected_stream",
    "expected_last_seq",
    "expected_last_subject_seq",
    "expected_last_subject_seq_subject",
    "expected_last_msg_id",
    "ttl_ns",
)
if Publish.__slots__ != _PUBLISH_SLOTS:  # a field was added: update plain_publish too
    raise ImportError("Publish fields changed; update entries.plain_publish")
(
    _set_ts,
    _set_subject,
    _set_data,
    _set_headers,
    _set_msg_id,
    _set_expected_stream,
    _set_expected_last_seq,
    _set_expected_last_subject_seq,
    _set_expected_last_subject_seq_subject,
    _set_expected_last_msg_id,
    _set_ttl,
) = (getattr(Publish, name).__set__ for name in _PUBLISH_SLOTS)


def plain_publish(ts_ns: int, subject: str, data: bytes) -> Publish:
    """``Publish(ts_ns=ts_ns, subject=subject, data=data)``, the same value, made ~4x
    faster: a frozen dataclass's ``__init__`` pays a guarded ``__setattr__`` per field
    (eleven here), and this runs for every message on every replica. Unrolled on purpose
    (a loop over the setters costs as much as ``__init__``)."""
    p = object.__new__(Publish)
    _set_ts(p, ts_ns)
    _set_subject(p, subject)
    _set_data(p, data)
    _set_headers(p, EMPTY_HEADERS)
    _set_msg_id(p, None)
    _set_expected_stream(p, None)
    _set_expected_last_seq(p, None)
    _set_expected_last_subject_seq(p, None)
    _set_expected_last_subject_seq_subject(p, None)
    _set_expected_last_msg_id(p, None)
    _set_ttl(p, None)
    return p


# -- Interpreting a publish: JetStream's headers and the entry's fields ---------------------

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_STREAM = "Nats-Expected-Stream"
HDR_EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
HDR_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
HDR_EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
HDR_ROLLUP = "Nats-Rollup"
HDR_TTL = "Nats-TTL"

TTL_MIN_NS = 1_000_000_000  # JetStream: a message TTL is at least one second
# A deadline (stamp + TTL) must fit the store's 63 bits for centuries yet.
TTL_MAX_NS = 100 * 365 * 24 * 3600 * 1_000_000_000
_GO_DURATION = re.compile(r"(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
_GO_DURATION_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


class Rollup(enum.StrEnum):
    """``Nats-Rollup`` values: keep only the new message of its subject, or of the stream."""

    SUBJECT = "sub"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """A publish's options after merging the entry's fields with its JetStream headers."""

    msg_id: str | None = None
    expected_stream: str | None = None
    expected_last_seq: int | None = None
    expected_last_subject_seq: int | None = None
    expected_last_subject_seq_subject: str | None = None
    expected_last_msg_id: str | None = None
    ttl_ns: int | None = None
    rollup: Rollup | None = None


def parse_ttl(text: str, field_name: str = HDR_TTL) -> int:
    """A ``Nats-TTL`` value in nanoseconds: a Go duration (``90s``, ``1h30m``, ``1.5s``) or
    whole seconds (``60``), as JetStream reads it. JetStream's ``never`` (exempt from
    ``max_age``) is refused: the store has no per-message exemption yet."""
    if text == "never":
        raise InvalidArgumentError(
            field_name, "'never' (no max_age for this message) is not supported by raftstream"
        )
    if text.isascii() and text.isdigit():
        if len(text) > 19:
            raise InvalidArgumentError(field_name, f"is too long a time: {text!r}")
        ns = int(text) * 1_000_000_000
    elif _GO_DURATION.fullmatch(text):
        total = sum(Fraction(num) * _UNIT_NS[unit] for num, unit in _GO_DURATION_PART.findall(text))
        ns = int(total)
    else:
        raise InvalidArgumentError(
            field_name, f"must be a duration like '30s' or '1h' or whole seconds: {text!r}"
        )
    return check_ttl(ns, field_name)


def check_ttl(ttl_ns: int, field_name: str = "ttl_ns") -> int:
    if ttl_ns < TTL_MIN_NS:
        raise InvalidArgumentError(field_name, "a message TTL must be at least 1s")
    if ttl_ns > TTL_MAX_NS:
        raise InvalidArgumentError(field_name, "a message TTL must be at most 100 years")
    return ttl_ns


_HEADER_INT_MAX = (1 << 63) - 1  # a sequence in a header, as the field (int64, cluster/limits)


def _header_seq(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if not text:
        return None
    # ASCII digits only: str.isdigit also takes '²', which int() refuses.
    if not (text.isascii() and text.isdigit()):
        raise InvalidArgumentError(name, f"must be a non-negative integer: {text!r}")
    if len(text) > 19 or int(text) > _HEADER_INT_MAX:
        raise InvalidArgumentError(name, f"must be at most {_HEADER_INT_MAX} (int64): {text!r}")
    return int(text)


def _merge(field_name: str, value: object, header: str, from_header: object) -> Any:
    """A field and its header may both be given only when they agree."""
    if value is not None and from_header is not None and value != from_header:
        raise InvalidArgumentError(field_name, f"conflicts with the {header} header")
    return value if value is not None else from_header


def _header_rollup(headers: Mapping[str, str]) -> Rollup | None:
    text = headers.get(HDR_ROLLUP)
    if not text:
        return None
    try:
        return Rollup(text)
    except ValueError:
        raise InvalidArgumentError(HDR_ROLLUP, f"must be 'sub' or 'all': {text!r}") from None


_NO_OPTIONS = PublishOptions()


def _no_option_fields(e: Publish) -> bool:
    """True when none of the publish's optional fields but ``msg_id`` is given."""
    return (
        e.expected_stream is None
        and e.expected_last_seq is None
        and e.expected_last_subject_seq is None
        and e.expected_last_subject_seq_subject is None
        and e.expected_last_msg_id is None
        and e.ttl_ns is None
    )


def publish_options(e: Publish) -> PublishOptions:
    """Merge a publish's fields with its JetStream headers; ``InvalidArgumentError`` naming
    the field or header when one is malformed or the two disagree. Empty headers are unset."""
    h = e.headers
    if not h and _no_option_fields(e):  # the common publish: a msg id at most
        return PublishOptions(msg_id=e.msg_id) if e.msg_id else _NO_OPTIONS
    if not h:  # no header to parse or merge
        return PublishOptions(
            msg_id=e.msg_id or None,
            expected_stream=e.expected_stream or None,
            expected_last_seq=e.expected_last_seq,
            expected_last_subject_seq=e.expected_last_subject_seq,
            expected_last_subject_seq_subject=e.expected_last_subject_seq_subject or None,
            expected_last_msg_id=e.expected_last_msg_id or None,
            ttl_ns=None if e.ttl_ns is None else check_ttl(e.ttl_ns),
        )
    ttl_text = h.get(HDR_TTL)
    return PublishOptions(
        msg_id=_merge("msg_id", e.msg_id or None, HDR_MSG_ID, h.get(HDR_MSG_ID) or None),
        expected_stream=_merge(
            "expected_stream",
            e.expected_stream or None,
            HDR_EXPECTED_STREAM,
            h.get(HDR_EXPECTED_STREAM) or None,
        ),
        expected_last_seq=_merge(
            "expected_last_seq",
            e.expected_last_seq,
            HDR_EXPECTED_LAST_SEQ,
            _header_seq(h, HDR_EXPECTED_LAST_SEQ),
        ),
        expected_last_subject_seq=_merge(
            "expected_last_subject_seq",
            e.expected_last_subject_seq,
            HDR_EXPECTED_LAST_SUBJECT_SEQ,
            _header_seq(h, HDR_EXPECTED_LAST_SUBJECT_SEQ),
        ),
        expected_last_subject_seq_subject=_merge(
            "expected_last_subject_seq_subject",
            e.expected_last_subject_seq_subject or None,
            HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
            h.get(HDR_EXPECTED_LAST_SUBJECT_SEQ_SUBJECT) or None,
        ),
        expected_last_msg_id=_merge(
            "expected_last_msg_id",
            e.expected_last_msg_id or None,
            HDR_EXPECTED_LAST_MSG_ID,
            h.get(HDR_EXPECTED_LAST_MSG_ID) or None,
        ),
        ttl_ns=_merge(
            "ttl_ns",
            None if e.ttl_ns is None else check_ttl(e.ttl_ns),
            HDR_TTL,
            parse_ttl(ttl_text) if ttl_text else None,
        ),
        rollup=_header_rollup(h),
    )
