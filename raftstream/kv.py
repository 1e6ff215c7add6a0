"""Key-value buckets on streams, laid out as JetStream lays them out.

A bucket ``B`` is the stream ``KV_B`` capturing ``$KV.B.>``; a key ``k`` is the subject
``$KV.B.k``; a value is a message, its revision the message's stream sequence. The stream
keeps ``history`` messages per subject (``max_msgs_per_subject``), allows rollup headers
(a purge keeps only its marker), denies deleting single messages, and discards new
messages when full. Deletes and purges are markers: an empty message with the header
``KV-Operation: DEL`` or ``KV-Operation: PURGE`` (the purge also ``Nats-Rollup: sub``).

A ``KeyValue`` belongs to the loop of its client. Writes (``put``, ``create``, ``update``,
``delete``, ``purge``) are answered once replicated on a quorum; on a timeout or a broken
connection the outcome is unknown (the write may or may not have happened, as for any
publish): read the key to find out. ``update`` is a compare-and-set on the key's last
revision (``expected_last_subject_seq``): of writers racing with the same ``last``, exactly
one wins; the others get ``KeyWrongLastSequenceError``.

Watches (``watch``, ``watchall``, and ``keys``/``history`` built on them) are ordered
consumers: the latest entry per key (or the whole history) first, then ``None`` once (the end
of the initial data), then updates as they happen.

Mirrors and sources. A mirror bucket (``mirror=``, a bucket here or, as a ``StreamSource``
with ``external``, in another cluster) is a read-only copy: its stream mirrors the origin's,
so it keeps the origin's revisions and subjects (``$KV.<origin>.<key>``), and reads and
watches find them there; a write through it goes to the origin's subject, so it reaches the
origin when the origin is in this cluster (``BucketNotFoundError`` naming the origin when
not), and the mirror shortly after. A bucket with ``sources`` takes the keys of other
buckets besides its own: each source's ``$KV.<source>.>`` is stored as ``$KV.<bucket>.>``
(unless the ``StreamSource`` filters or transforms subjects itself), under the bucket's own
revisions. A purge at the origin rolls the key up in the copy too (only its marker stays),
once every node of the cluster runs a version that does so.

Errors speak of buckets, not of their streams: a bucket that is missing (never made, or
deleted under a ``KeyValue`` or a running watch) is ``BucketNotFoundError`` naming the
bucket, a bucket that exists with other settings ``AlreadyExistsError`` naming it, and a
bad ``create_key_value`` argument ``InvalidArgumentError`` naming the argument (nothing is
sent). A stream named ``KV_B`` that was not made as a bucket (``bucket_of``) is no bucket.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from raftstream import errors
from raftstream._args import INT64_MAX, check_seconds
from raftstream.config import (
    UNLIMITED,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)
from raftstream.models import RawStreamMsg, StreamInfo
from raftstream.msg import Msg
from raftstream.ordered import OrderedSubscription, subscribe_ordered
from raftstream.subscribe import PushOptions

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = [
    "HISTORY_MAX",
    "REPLICAS_MAX",
    "KeyValue",
    "KeyValueEntry",
    "KeyValueOp",
    "KeyValueStatus",
    "KeyWatcher",
    "bucket_of",
    "bucket_statuses",
    "bucket_stream_config",
    "create_bucket",
    "delete_bucket",
    "mirrored",
    "open_bucket",
    "update_bucket",
    "validate_bucket",
    "validate_key",
]

NS_PER_S = 1_000_000_000
HISTORY_MAX = 64
STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV"
HDR_OPERATION = "KV-Operation"
HDR_ROLLUP = "Nats-Rollup"
ROLLUP_SUBJECT = "sub"
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_RESERVED_KEY_PREFIX = "_kv"
WATCH_HEARTBEAT_S = 5.0
# Limits the node holds a bucket's stream to, checked here so that a bad argument is refused
# naming the bucket's argument (``replicas``), not the stream field (``num_replicas``).
REPLICAS_MAX = 5
MAX_VALUE_SIZE_MAX = 2**31 - 1  # JetStream keeps max_msg_size in an int32
# The node's limits on names and subjects (engine/stream_config.py, engine/subjects.py),
# checked here so that a long bucket or key is refused naming ``bucket`` or ``key``, with
# the room the bucket's prefixes leave, not the stream's ``name`` or the publish's
# ``subject``.
STREAM_NAME_BYTES_MAX = 255
SUBJECT_BYTES_MAX = 4096
BUCKET_BYTES_MAX = STREAM_NAME_BYTES_MAX - len(STREAM_PREFIX)
TTL_MIN_S = 0.1  # the node's shortest max_age (100ms)
TTL_MAX_S = INT64_MAX // NS_PER_S  # max_age travels as int64 nanoseconds
STORAGE_TYPES = tuple(t.value for t in StorageType)
# A NOT_FOUND naming one of these fields is about the bucket's stream itself ("stream ... not
# found", "no stream matches subject ..."), not about a message in it.
_STREAM_MISSING_FIELDS = frozenset({"stream", "subject"})


class KeyValueOp(enum.StrEnum):
    PUT = "PUT"
    DEL = "DEL"
    PURGE = "PURGE"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyValueEntry:
    """One revision of a key. ``delta``: entries newer than this one in the watch (from the
    ack token's pending count; 0 for a direct ``get``). ``created_ns``: the stored time."""

    bucket: str
    key: str
    value: bytes
    revision: int
    created_ns: int
    operation: KeyValueOp = KeyValueOp.PUT
    delta: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyValueStatus:
    """A bucket's state: ``values`` stored (every revision and marker kept), ``history``
    per key, ``ttl_s`` (0: none), ``bytes``, its limits (``max_value_size``, ``max_bytes``:
    -1 unlimited), ``storage``, ``replicas``, and the backing stream's info (its
    ``cluster`` holds the replicas' health: leader, lag, offline)."""

    bucket: str
    values: int
    history: int
    ttl_s: float
    bytes: int
    replicas: int
    stream_info: StreamInfo
    description: str = ""
    max_value_size: int = UNLIMITED
    max_bytes: int = UNLIMITED
    storage: StorageType = StorageType.FILE

    @property
    def ttl_ns(self) -> int:
        """How long a value lives, in nanoseconds (0: forever)."""
        return self.stream_info.config.max_age

    @property
    def mirror(self) -> str | None:
        """The bucket this one mirrors (None: it is no mirror)."""
        m = self.stream_info.config.mirror
        return _origin_bucket(m.name) if m is not None else None

    @property
    def sources(self) -> tuple[str, ...]:
        """The buckets (or streams) this one takes the keys of, besides its own."""
        return tuple(
            _origin_bucket(src.name) or src.name for src in self.stream_info.config.sources
        )

    @property
    def state_known(self) -> bool:
        """False when no replica of the bucket answered (its nodes offline, or electing):
        ``values`` and ``bytes`` are then 0 without meaning ``StreamInfo.state_known``."""
        return self.stream_info.state_known

    @classmethod
    def from_stream_info(cls, bucket: str, info: StreamInfo) -> KeyValueStatus:
        c = info.config
        return cls(
            bucket=bucket,
            values=info.state.messages,
            history=c.max_msgs_per_subject,
            ttl_s=c.max_age / NS_PER_S,
            bytes=info.state.bytes,
            replicas=c.num_replicas,
            stream_info=info,
            description=c.description,
            max_value_size=c.max_msg_size,
            max_bytes=c.max_bytes,
            storage=c.storage,
        )


def validate_bucket(bucket: str) -> str:
    """A bucket name: letters, digits, ``_`` and ``-``, at most ``BUCKET_BYTES_MAX`` (its
    stream's name ``KV_<bucket>`` within the 255 bytes of a stream name)."""
    if not isinstance(bucket, str) or not _BUCKET_RE.fullmatch(bucket):
        raise errors.InvalidArgumentError(
            "bucket", f"a bucket name is letters, digits, '_' and '-' only: {bucket!r:.80}"
        )
    if len(bucket) > BUCKET_BYTES_MAX:  # ASCII only: characters are bytes
        raise errors.InvalidArgumentError(
            "bucket",
            f"must be at most {BUCKET_BYTES_MAX} characters (its stream KV_<bucket> is a "
            f"stream name of at most {STREAM_NAME_BYTES_MAX} bytes), not {len(bucket)}",
        )
    return bucket


def validate_key(key: str, *, wildcards: bool = False) -> str:
    """A key is dot-separated tokens of letters, digits and ``-/_=``; no empty token, no
    leading ``_kv``. With ``wildcards`` (watch) a token may be ``*`` and the last ``>``."""
    if not isinstance(key, str) or not key:
        raise errors.InvalidKeyError("key", "must be a non-empty string")
    tokens = key.split(".")
    for i, tok in enumerate(tokens):
        if wildcards and (tok == "*" or (tok == ">" and i == len(tokens) - 1)):
            continue
        if not tok or not _KEY_RE.fullmatch(tok):
            raise errors.InvalidKeyError(
                "key", f"not a valid key: {key!r} (tokens of letters, digits, '-/_=')"
            )
    if key.startswith(_RESERVED_KEY_PREFIX):
        raise errors.InvalidKeyError("key", f"{_RESERVED_KEY_PREFIX!r} starts reserved keys")
    return key


def _int_in(field: str, value: object, lo: int, hi: int, rule: str) -> int:
    """``value`` when it is an int (not a bool) from ``lo`` to ``hi``; else
    ``InvalidArgumentError`` naming ``field`` and ``rule``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise errors.InvalidArgumentError(field, f"{rule}, not {value!r}")
    return value


def _ttl_ns(ttl: object) -> int:
    """``ttl`` seconds (None or 0: forever) as nanoseconds, checked as the node checks
    ``max_age`` but naming ``ttl``."""
    rule = f"must be None or 0 (forever), or {TTL_MIN_S:g} to {TTL_MAX_S} seconds"
    if ttl is None:
        return 0
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise errors.InvalidArgumentError("ttl", f"{rule}, not {ttl!r}")
    if not math.isfinite(ttl) or ttl < 0 or 0 < ttl < TTL_MIN_S or ttl > TTL_MAX_S:
        raise errors.InvalidArgumentError("ttl", f"{rule}, not {ttl!r}")
    return int(ttl * NS_PER_S)


def _storage(storage: object) -> StorageType:
    if isinstance(storage, StorageType):
        return storage
    if isinstance(storage, str) and storage in STORAGE_TYPES:
        return StorageType(storage)
    allowed = ", ".join(repr(t) for t in STORAGE_TYPES)
    raise errors.InvalidArgumentError("storage", f"must be one of {allowed}, not {storage!r}")


def bucket_stream_config(
    bucket: str,
    *,
    description: str = "",
    history: int = 1,
    ttl: float | None = None,
    max_value_size: int = UNLIMITED,
    max_bytes: int = UNLIMITED,
    storage: StorageType | str = StorageType.FILE,
    replicas: int = 1,
    mirror: str | StreamSource | None = None,
    sources: Sequence[str | StreamSource] = (),
) -> StreamConfig:
    """The backing stream of a bucket (module docstring); ``ttl`` in seconds; ``mirror``
    and ``sources`` (module docstring, "Mirrors and sources"). Every argument is checked
    here: a bad one is ``InvalidArgumentError`` naming it (its ``field``) and the rule,
    before anything is sent."""
    validate_bucket(bucket)
    if mirror is not None and sources:
        raise errors.InvalidArgumentError(
            "mirror", "a bucket mirrors one bucket or takes the keys of sources, not both"
        )
    if isinstance(sources, str | StreamSource):
        sources = (sources,)
    if not isinstance(sources, Sequence):
        raise errors.InvalidArgumentError(
            "sources", f"must be a list of buckets, not {type(sources).__name__}"
        )
    mirror_src = _origin("mirror", mirror) if mirror is not None else None
    if mirror_src is not None and _origin_bucket(mirror_src.name) == bucket:
        raise errors.InvalidArgumentError("mirror", f"bucket {bucket!r} cannot mirror itself")
    source_srcs = tuple(_as_source(bucket, _origin("sources", src)) for src in sources)
    if not isinstance(description, str):
        raise errors.InvalidArgumentError(
            "description", f"must be a string, not {type(description).__name__}"
        )
    _int_in("history", history, 1, HISTORY_MAX, f"must be an integer from 1 to {HISTORY_MAX}")
    max_age = _ttl_ns(ttl)
    _int_in(
        "max_value_size",
        max_value_size,
        UNLIMITED,
        MAX_VALUE_SIZE_MAX,
        f"must be -1 or 0 (unlimited) or bytes up to {MAX_VALUE_SIZE_MAX}",
    )
    _int_in("max_bytes", max_bytes, UNLIMITED, INT64_MAX, "must be -1 or 0 (unlimited) or bytes")
    _int_in("replicas", replicas, 1, REPLICAS_MAX, f"must be an integer from 1 to {REPLICAS_MAX}")
    return StreamConfig(
        name=STREAM_PREFIX + bucket,
        description=description,
        subjects=() if mirror_src is not None else (f"{SUBJECT_PREFIX}.{bucket}.>",),
        mirror=mirror_src,
        sources=source_srcs,
        max_msgs_per_subject=history,
        max_bytes=max_bytes,
        max_age=max_age,
        max_msg_size=max_value_size,
        storage=_storage(storage),
        num_replicas=replicas,
        allow_rollup_hdrs=True,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        allow_direct=True,
    )


def _origin(field: str, origin: object) -> StreamSource:
    """The origin of a mirror or a source: a bucket's name, or a ``StreamSource`` naming the
    bucket or its stream (``KV_<bucket>``; its other fields are kept: where to start, and
    ``external`` for a bucket in another cluster)."""
    if isinstance(origin, str):
        src = StreamSource(name=origin)
    elif isinstance(origin, StreamSource):
        src = origin
    else:
        raise errors.InvalidArgumentError(
            field, f"must be a bucket name or a StreamSource, not {type(origin).__name__}"
        )
    name = src.name[len(STREAM_PREFIX) :] if src.name.startswith(STREAM_PREFIX) else src.name
    try:
        validate_bucket(name)
    except errors.InvalidArgumentError as exc:
        raise errors.InvalidArgumentError(field, exc.message) from None
    return dataclasses.replace(src, name=STREAM_PREFIX + name)


def _as_source(bucket: str, src: StreamSource) -> StreamSource:
    """A source bucket's keys taken as this bucket's: ``$KV.<origin>.>`` becomes
    ``$KV.<bucket>.>``, unless the source says which subjects it takes itself."""
    origin = _origin_bucket(src.name)
    if origin == bucket:
        raise errors.InvalidArgumentError("sources", f"bucket {bucket!r} cannot source itself")
    if src.filter_subject or src.subject_transforms:
        return src
    transform = SubjectTransform(
        src=f"{SUBJECT_PREFIX}.{origin}.>", dest=f"{SUBJECT_PREFIX}.{bucket}.>"
    )
    return dataclasses.replace(src, subject_transforms=(transform,))


def _origin_bucket(stream: str) -> str | None:
    """The bucket whose stream is named ``stream`` (None: no bucket's name)."""
    if not stream.startswith(STREAM_PREFIX):
        return None
    bucket = stream[len(STREAM_PREFIX) :]
    return bucket if _BUCKET_RE.fullmatch(bucket) else None


def mirrored(cfg: StreamConfig) -> str | None:
    """The bucket whose keys a bucket's stream ``cfg`` holds under their own subjects: the
    origin of a mirror, else None (the bucket's own subjects)."""
    return _origin_bucket(cfg.mirror.name) if cfg.mirror is not None else None


def bucket_of(cfg: StreamConfig) -> str | None:
    """The bucket whose stream ``cfg`` configures, or None when the stream is no bucket's: a
    bucket's stream is named ``KV_<bucket>``, captures exactly ``$KV.<bucket>.>`` (or, a
    mirror bucket, captures nothing and mirrors a bucket's stream), keeps 1 to
    ``HISTORY_MAX`` messages per subject and allows rollup headers (a purge is one)."""
    bucket = _origin_bucket(cfg.name)
    if bucket is None:
        return None
    if cfg.mirror is not None:
        if cfg.subjects or mirrored(cfg) is None:
            return None
    elif tuple(cfg.subjects) != (f"{SUBJECT_PREFIX}.{bucket}.>",):
        return None
    if not 1 <= cfg.max_msgs_per_subject <= HISTORY_MAX or not cfg.allow_rollup_hdrs:
        return None
    return bucket


def _stream_missing(exc: errors.RaftStreamError) -> bool:
    """Whether a NOT_FOUND is about the stream itself (gone, or never made)."""
    if isinstance(exc, errors.NoStreamMatchError):
        return True
    field = exc.details.get("field")
    return isinstance(exc, errors.NotFoundError) and field in _STREAM_MISSING_FIELDS


def _bucket_not_found(bucket: str, why: str = "") -> errors.BucketNotFoundError:
    return errors.BucketNotFoundError(f"bucket {bucket!r} not found{why}", bucket=bucket)


def _as_bucket_error(bucket: str, exc: errors.RaftStreamError) -> errors.RaftStreamError:
    """``exc``, or ``BucketNotFoundError`` naming the bucket when it says its stream is
    missing."""
    return _bucket_not_found(bucket) if _stream_missing(exc) else exc


def _operation(headers: Mapping[str, str]) -> KeyValueOp:
    op = headers.get(HDR_OPERATION)
    if op is None:
        return KeyValueOp.PUT
    try:
        return KeyValueOp(op)
    except ValueError:
        return KeyValueOp.PUT


def _wrong_last(
    key: str, last: int | None, exc: errors.RaftStreamError
) -> errors.KeyWrongLastSequenceError:
    details = {**exc.details, "key": key, "expected_last": last}
    return errors.KeyWrongLastSequenceError(
        f"key {key!r}: its last revision is not {last} ({exc.message})", **details
    )


async def _bucket_info(client: Client, bucket: str, *, timeout: float | None) -> StreamInfo:
    """The info of the bucket's stream; ``BucketNotFoundError`` when there is none or it is
    not a bucket's (``bucket_of``)."""
    validate_bucket(bucket)
    stream = STREAM_PREFIX + bucket
    try:
        info = await client.stream_info(stream, timeout=timeout)
    except errors.NotFoundError:
        raise _bucket_not_found(bucket) from None
    if bucket_of(info.config) != bucket:
        raise _bucket_not_found(bucket, f": the stream {stream!r} was not made as a bucket")
    return info


async def open_bucket(client: Client, bucket: str, *, timeout: float | None) -> KeyValue:
    """``Client.key_value``: the bucket if its stream exists and is a bucket's."""
    info = await _bucket_info(client, bucket, timeout=timeout)
    return KeyValue(client, bucket, mirror_of=mirrored(info.config))


async def delete_bucket(client: Client, bucket: str, *, timeout: float | None) -> bool:
    """``Client.delete_key_value``: delete the bucket's stream (never a stream of that name
    that is not a bucket's: ``BucketNotFoundError``)."""
    await _bucket_info(client, bucket, timeout=timeout)
    try:
        return await client.delete_stream(STREAM_PREFIX + bucket, timeout=timeout)
    except errors.NotFoundError:
        raise _bucket_not_found(bucket) from None


async def create_bucket(
    client: Client, bucket: str, cfg: StreamConfig, *, timeout: float | None
) -> KeyValue:
    """``Client.create_key_value``: make the bucket's stream ``cfg`` (from
    ``bucket_stream_config``). Idempotent for an identical bucket; ``AlreadyExistsError``
    naming the bucket (and the settings that differ) when one with other settings exists,
    or naming the stream when a stream of the bucket's stream name exists that is not a
    bucket."""
    try:
        await client.add_stream(cfg, timeout=timeout)
    except errors.AlreadyExistsError:
        raise await _bucket_exists(client, bucket, cfg, timeout=timeout) from None
    return KeyValue(client, bucket, mirror_of=mirrored(cfg))


async def update_bucket(
    client: Client, bucket: str, changes: Mapping[str, object], *, timeout: float | None
) -> KeyValue:
    """``Client.update_key_value``: change the settings ``changes`` names (``_SETTINGS``'
    argument names but ``storage``, which a stream cannot change); every other field of the
    bucket's stream stays as it is, but for the duplicate window, which a new ``ttl`` sets
    as a create sets it (2 minutes, or the TTL when shorter). The values are checked as
    ``bucket_stream_config`` checks them (naming the argument) before anything is sent."""
    if "storage" in changes:
        raise errors.InvalidArgumentError(
            "storage", "cannot be changed: a bucket keeps the storage it was made with"
        )
    unknown = sorted(set(changes) - {name for name, _ in _SETTINGS})
    if unknown:
        raise errors.InvalidArgumentError(unknown[0], "is not a bucket setting")
    given = bucket_stream_config(bucket, **changes)  # type: ignore[arg-type]
    fields = {field: getattr(given, field) for name, field in _SETTINGS if name in changes}
    if "ttl" in changes:
        # The duplicate window follows the TTL as on create: bucket_stream_config leaves it 0,
        # which the node fills in by its one rule (2 min, or the TTL when shorter). Keeping
        # the stored window instead would refuse a TTL under it, naming duplicate_window.
        fields["duplicate_window"] = given.duplicate_window
    info = await _bucket_info(client, bucket, timeout=timeout)
    await client.update_stream(dataclasses.replace(info.config, **fields), timeout=timeout)
    return KeyValue(client, bucket, mirror_of=mirrored(info.config))


# The settings a bucket is made with: its argument name -> the stream config field.
_SETTINGS = (
    ("history", "max_msgs_per_subject"),
    ("ttl", "max_age"),
    ("max_value_size", "max_msg_size"),
    ("max_bytes", "max_bytes"),
    ("storage", "storage"),
    ("replicas", "num_replicas"),
    ("description", "description"),
)


def _setting(name: str, value: object) -> str:
    if name == "ttl" and isinstance(value, int):
        return f"{value / NS_PER_S:g}s" if value else "forever"
    if name in ("max_value_size", "max_bytes") and isinstance(value, int) and value <= 0:
        return "unlimited"
    return repr(value) if name == "description" else str(value)


def _links(links: StreamSource | Sequence[StreamSource] | None) -> str:
    """A mirror or sources, by bucket (or stream) name, for messages."""
    if links is None:
        return "none"
    many = (links,) if isinstance(links, StreamSource) else tuple(links)
    return ", ".join(_origin_bucket(s.name) or s.name for s in many) or "none"


async def _bucket_exists(
    client: Client, bucket: str, wanted: StreamConfig, *, timeout: float | None
) -> errors.AlreadyExistsError:
    """The error for a create refused because the bucket's stream name is taken: what is
    there is looked up (best effort) to say what differs."""
    try:
        have: StreamConfig | None = (await client.stream_info(wanted.name, timeout=timeout)).config
    except errors.RaftStreamError:
        have = None  # deleted meanwhile, or unreachable: say what is known
    if have is not None and bucket_of(have) != bucket:
        return errors.AlreadyExistsError(
            f"bucket {bucket!r} cannot be created: a stream named {wanted.name!r} exists "
            "that is not a bucket",
            bucket=bucket,
        )
    diffs = []
    for name, field in _SETTINGS if have is not None else ():
        there, asked = getattr(have, field), getattr(wanted, field)
        if field in ("max_msg_size", "max_bytes") and asked == 0:
            asked = UNLIMITED  # the node stores 0 as unlimited
        if there != asked:
            diffs.append(f"{name} {_setting(name, there)} (asked {_setting(name, asked)})")
    if have is not None:
        for name, there_o, asked_o in (
            ("mirror", have.mirror, wanted.mirror),
            ("sources", have.sources, wanted.sources),
        ):
            if there_o != asked_o:
                diffs.append(f"{name} {_links(there_o)} (asked {_links(asked_o)})")
    differs = f": {', '.join(diffs)}" if diffs else ""
    return errors.AlreadyExistsError(
        f"bucket {bucket!r} already exists with a different configuration{differs}",
        bucket=bucket,
    )


async def bucket_statuses(client: Client, *, timeout: float | None = None) -> list[KeyValueStatus]:
    """Every bucket's state, by name: the streams that are buckets (``bucket_of``); other
    streams, ``KV_``-named or not, are left out. One listing call, so a bucket deleted
    meanwhile is simply absent."""
    out = []
    for info in await client.streams_info(timeout=timeout):
        bucket = bucket_of(info.config)
        if bucket is not None:
            out.append(KeyValueStatus.from_stream_info(bucket, info))
    return sorted(out, key=lambda s: s.bucket)


class KeyValue:
    """A bucket (module docstring). Made by ``Client.key_value`` / ``create_key_value``.
    ``mirror_of``: the bucket a mirror bucket mirrors, whose subjects its keys keep and
    where its writes go (None: no mirror)."""

    def __init__(self, client: Client, bucket: str, *, mirror_of: str | None = None) -> None:
        self._client = client
        self.bucket = validate_bucket(bucket)
        self.stream = STREAM_PREFIX + bucket
        self.mirror_of = mirror_of
        self._prefix = f"{SUBJECT_PREFIX}.{mirror_of or bucket}."

    def _subject(self, key: str, *, wildcards: bool = False) -> str:
        """The key's subject; ``InvalidKeyError`` naming ``key`` for a malformed key or one
        longer than the subject's 4096 bytes leave after ``$KV.<bucket>.``."""
        validate_key(key, wildcards=wildcards)
        room = SUBJECT_BYTES_MAX - len(self._prefix)
        if len(key) > room:  # ASCII only: characters are bytes
            raise errors.InvalidKeyError(
                "key",
                f"must be at most {room} characters in bucket {self.bucket!r} (a subject is "
                f"at most {SUBJECT_BYTES_MAX} bytes, {self._prefix!r} included), not {len(key)}",
            )
        return self._prefix + key

    def _entry(self, m: RawStreamMsg) -> KeyValueEntry:
        return KeyValueEntry(
            bucket=self.bucket,
            key=m.subject[len(self._prefix) :],
            value=m.data,
            revision=m.seq,
            created_ns=m.ts_ns,
            operation=_operation(m.headers),
        )

    # -- reads ------------------------------------------------------------------------------

    async def get(self, key: str, revision: int | None = None) -> KeyValueEntry:
        """The key's latest value, or the entry at ``revision``. ``KeyNotFoundError`` when
        there is none (for a revision: saying it is not kept, or is another key's, with
        ``details["revision"]``); ``KeyDeletedError`` (``details["revision"]``) when it is a
        delete or purge marker; ``BucketNotFoundError`` when the bucket is gone."""
        subject = self._subject(key)
        if revision is not None:
            _int_in("revision", revision, 1, INT64_MAX, f"must be an integer from 1 to {INT64_MAX}")
        try:
            if revision is None:
                raw = await self._client.get_last_msg(self.stream, subject)
            else:
                raw = await self._client.get_msg(self.stream, revision)
        except errors.NotFoundError as exc:
            if _stream_missing(exc):
                raise _bucket_not_found(self.bucket) from None
            if revision is None:
                raise errors.KeyNotFoundError(f"key {key!r} not found", key=key) from None
            raise await self._revision_not_found(key, revision) from None
        if raw.subject != subject:
            raise errors.KeyNotFoundError(
                f"revision {revision} of key {key!r} not found: revision {revision} is "
                "another key's",
                key=key,
                revision=revision,
            )
        entry = self._entry(raw)
        if entry.operation is not KeyValueOp.PUT:
            raise errors.KeyDeletedError(
                f"key {key!r} was deleted (revision {entry.revision})",
                key=key,
                revision=entry.revision,
            )
        return entry

    async def _revision_not_found(self, key: str, revision: int) -> errors.KeyNotFoundError:
        """Why ``revision`` is not there, from the bucket's state (best effort: a second
        lookup that may fail, then the reasons are given without numbers)."""
        try:
            info: StreamInfo | None = await self._client.stream_info(self.stream)
        except errors.RaftStreamError:
            info = None
        if info is not None and revision > info.state.last_seq:
            why = f"the bucket's latest revision is {info.state.last_seq}"
        else:
            n = info.config.max_msgs_per_subject if info is not None else None
            keeps = f"{n} revision{'s' if n != 1 else ''}" if n else "`history` revisions"
            why = (
                f"it is no longer kept (the bucket keeps {keeps} per key; purged and expired "
                "ones are dropped too) or it is not a revision of that key"
            )
        return errors.KeyNotFoundError(
            f"revision {revision} of key {key!r} not found: {why}", key=key, revision=revision
        )

    async def status(self) -> KeyValueStatus:
        """The bucket's state; ``BucketNotFoundError`` when it is gone."""
        try:
            info = await self._client.stream_info(self.stream)
        except errors.NotFoundError as exc:
            raise _as_bucket_error(self.bucket, exc) from None
        return KeyValueStatus.from_stream_info(self.bucket, info)

    # -- writes -----------------------------------------------------------------------------

    async def _publish(
        self,
        key: str,
        value: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        last: int | None = None,
    ) -> int:
        """Publish to the key's subject; the revision. ``KeyWrongLastSequenceError`` when
        ``last`` is not the key's last revision, ``BucketNotFoundError`` when the bucket is
        gone (no stream captures the key's subject). A ``last`` that is no revision is
        refused naming ``last``, before anything is sent."""
        subject = self._subject(key)
        if last is not None:
            _int_in(
                "last",
                last,
                0,
                INT64_MAX,
                f"must be an integer from 0 (the key has no value) to {INT64_MAX}",
            )
        try:
            ack = await self._client.publish(
                subject, value, headers=headers, expected_last_subject_seq=last
            )
        except errors.ExpectedLastSubjectSeqError as exc:
            raise _wrong_last(key, last, exc) from None
        except errors.NotFoundError as exc:
            if self.mirror_of is not None and _stream_missing(exc):
                raise _bucket_not_found(
                    self.mirror_of,
                    f" here: bucket {self.bucket!r} mirrors it and takes no writes of its own"
                    " (write to it in its cluster)",
                ) from None
            raise _as_bucket_error(self.bucket, exc) from None
        except errors.LimitError as exc:
            if exc.details.get("limit") != "max_msg_size":
                raise
            # Said in the bucket's terms: its stream's max_msg_size is the bucket's
            # max_value_size (kv edit --max-value-size), which the user set by that name.
            raise errors.LimitError(
                f"the value of key {key!r} is larger than bucket {self.bucket!r}'s "
                f"max_value_size allows ({exc})",
                limit="max_value_size",
                bucket=self.bucket,
            ) from None
        return ack.seq

    async def put(self, key: str, value: bytes) -> int:
        """Store a new revision; returns it."""
        return await self._publish(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Store ``value`` only if the key's last revision is ``last`` (0: the key has never
        been written, or its history is gone). ``KeyWrongLastSequenceError`` otherwise."""
        return await self._publish(key, value, last=last)

    async def create(self, key: str, value: bytes) -> int:
        """Store ``value`` only if the key has no value: never written, or its latest entry
        is a delete or purge marker. ``KeyExistsError`` when it holds one."""
        try:
            return await self.update(key, value, last=0)
        except errors.KeyWrongLastSequenceError:
            pass
        try:
            entry = await self.get(key)
        except errors.KeyDeletedError as deleted:
            try:
                return await self.update(key, value, last=int(deleted.details["revision"]))
            except errors.KeyWrongLastSequenceError:
                pass  # someone wrote meanwhile
        except errors.KeyNotFoundError:
            pass
        else:
            raise errors.KeyExistsError(
                f"key {key!r} exists (revision {entry.revision})", key=key, revision=entry.revision
            )
        raise errors.KeyExistsError(f"key {key!r} was written concurrently", key=key)

    async def delete(self, key: str, *, last: int | None = None) -> int:
        """Write a delete marker (history before it is kept); with ``last``, only if the key's
        last revision is ``last``. Returns the marker's revision."""
        return await self._marker(key, KeyValueOp.DEL, last)

    async def purge(self, key: str, *, last: int | None = None) -> int:
        """Write a purge marker that rolls up the key: its whole history is removed and only
        the marker stays. Returns the marker's revision."""
        return await self._marker(key, KeyValueOp.PURGE, last)

    async def _marker(self, key: str, op: KeyValueOp, last: int | None) -> int:
        headers = {HDR_OPERATION: op.value}
        if op is KeyValueOp.PURGE:
            headers[HDR_ROLLUP] = ROLLUP_SUBJECT
        return await self._publish(key, b"", headers=headers, last=last)

    # -- watches ----------------------------------------------------------------------------

    async def watch(
        self,
        keys: str = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        heartbeat: float = WATCH_HEARTBEAT_S,
    ) -> KeyWatcher:
        """Watch keys matching ``keys`` (``*`` and a final ``>`` allowed): the latest entry of
        each (``include_history``: every kept revision), then ``None`` once, then updates.
        ``ignore_deletes`` skips delete/purge markers; ``meta_only`` leaves values empty.
        ``heartbeat``: the ordered consumer's idle heartbeat, seconds. Stop it with
        ``stop()`` (or ``async with``).

        An error that ends the watch (the bucket deleted meanwhile: ``BucketNotFoundError``)
        is raised by ``updates`` only, not also given to the client's error callback, which
        gets the transient ones the watch recovers from (missed heartbeats)."""
        subject = self._subject(keys, wildcards=True)
        policy = DeliverPolicy.ALL if include_history else DeliverPolicy.LAST_PER_SUBJECT
        cfg = ConsumerConfig(
            deliver_policy=policy,
            headers_only=meta_only,
            idle_heartbeat=int(check_seconds("heartbeat", heartbeat, zero_ok=True) * NS_PER_S),
        )
        options = PushOptions(error_cb=_transient_only(self._client._error_cb))
        try:
            sub = await subscribe_ordered(
                self._client, subject, stream=self.stream, cfg=cfg, options=options
            )
        except errors.NotFoundError as exc:
            raise _as_bucket_error(self.bucket, exc) from None
        return KeyWatcher(self, sub, ignore_deletes=ignore_deletes)

    async def watchall(self, **options: bool | float) -> KeyWatcher:
        """``watch(">")``: every key."""
        return await self.watch(">", **options)  # type: ignore[arg-type]

    async def keys(self, *, timeout: float | None = None) -> list[str]:
        """Every key that holds a value (not deleted or purged), in stream order."""
        out: list[str] = []
        async with await self.watch(ignore_deletes=True, meta_only=True) as w:
            while (entry := await w.updates(timeout)) is not None:
                out.append(entry.key)
        return out

    async def history(self, key: str, *, timeout: float | None = None) -> list[KeyValueEntry]:
        """Every kept revision of ``key``, markers included, oldest first.
        ``KeyNotFoundError`` when there is none."""
        validate_key(key)
        out: list[KeyValueEntry] = []
        async with await self.watch(key, include_history=True) as w:
            while (entry := await w.updates(timeout)) is not None:
                out.append(entry)
        if not out:
            raise errors.KeyNotFoundError(f"key {key!r} not found", key=key)
        return out

    def entry_of(self, msg: Msg) -> KeyValueEntry:
        meta = msg.metadata
        return KeyValueEntry(
            bucket=self.bucket,
            key=msg.subject[len(self._prefix) :],
            value=msg.data,
            revision=meta.stream_seq,
            created_ns=meta.timestamp_ns,
            operation=_operation(msg.headers),
            delta=meta.num_pending,
        )


def _transient_only(
    forward: Callable[[errors.RaftStreamError], None],
) -> Callable[[errors.RaftStreamError], None]:
    """A watch's error callback: passes on the errors its ordered consumer recovers from
    (retriable ones); an error that ends it is left to ``KeyWatcher.updates`` to raise, so
    it is reported once (an ordered consumer retries every retriable error itself, so the
    others are exactly the ones that end it)."""

    def report(exc: errors.RaftStreamError) -> None:
        if exc.retriable:
            forward(exc)

    return report


class KeyWatcher:
    """A running watch (see ``KeyValue.watch``); owns its ordered subscription."""

    def __init__(self, kv: KeyValue, sub: OrderedSubscription, *, ignore_deletes: bool) -> None:
        self._kv = kv
        self._sub = sub
        self._ignore_deletes = ignore_deletes
        # The filter held nothing when the watch began: the end marker comes first.
        self._initial_done = sub.initial_info.num_pending == 0
        self._marker_due = self._initial_done

    @property
    def subscription(self) -> OrderedSubscription:
        return self._sub

    async def updates(self, timeout: float | None = None) -> KeyValueEntry | None:
        """The next entry, or ``None`` once at the end of the initial data. Raises
        ``DeadlineExceededError`` when nothing came within ``timeout`` seconds (None: wait),
        ``BucketNotFoundError`` once the bucket is deleted (the watch has ended),
        ``SubscriptionClosedError`` once stopped."""
        while True:
            if self._marker_due:
                self._marker_due = False
                return None
            try:
                msg = await self._sub.next_msg(timeout)
            except errors.NotFoundError as exc:
                raise _as_bucket_error(self._kv.bucket, exc) from None
            entry = self._kv.entry_of(msg)
            if not self._initial_done and entry.delta == 0:
                self._initial_done = True
                self._marker_due = True
            if self._ignore_deletes and entry.operation is not KeyValueOp.PUT:
                continue
            return entry

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> KeyValueEntry | None:
        try:
            return await self.updates(None)
        except errors.SubscriptionClosedError:
            raise StopAsyncIteration from None

    async def stop(self) -> None:
        """End the watch and delete its consumer."""
        await self._sub.unsubscribe()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
