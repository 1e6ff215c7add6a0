"""What a key-value bucket is, with no client (``raftstream.kv`` says how buckets are laid
out on streams): the names and limits, the checks of a bucket's arguments, its backing
stream's config (``bucket_stream_config``) and which streams are buckets (``bucket_of``),
the values a bucket reports (``KeyValueEntry``, ``KeyValueStatus``), and the errors that
name a bucket rather than its stream. ``raftstream.kv`` re-exports the public names.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from raftstream import errors
from raftstream._args import INT64_MAX
from raftstream.config import (
    UNLIMITED,
    DiscardPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)
from raftstream.models import StreamInfo

NS_PER_S = 1_000_000_000
HISTORY_MAX = 64
STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV"
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_RESERVED_KEY_PREFIX = "_kv"
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
        return origin_bucket(m.name) if m is not None else None

    @property
    def sources(self) -> tuple[str, ...]:
        """The buckets (or streams) this one takes the keys of, besides its own."""
        return tuple(origin_bucket(src.name) or src.name for src in self.stream_info.config.sources)

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


def int_in(field: str, value: object, lo: int, hi: int, rule: str) -> int:
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
    if mirror_src is not None and origin_bucket(mirror_src.name) == bucket:
        raise errors.InvalidArgumentError("mirror", f"bucket {bucket!r} cannot mirror itself")
    source_srcs = tuple(_as_source(bucket, _origin("sources", src)) for src in sources)
    if not isinstance(description, str):
        raise errors.InvalidArgumentError(
            "description", f"must be a string, not {type(description).__name__}"
        )
    int_in("history", history, 1, HISTORY_MAX, f"must be an integer from 1 to {HISTORY_MAX}")
    max_age = _ttl_ns(ttl)
    int_in(
        "max_value_size",
        max_value_size,
        UNLIMITED,
        MAX_VALUE_SIZE_MAX,
        f"must be -1 or 0 (unlimited) or bytes up to {MAX_VALUE_SIZE_MAX}",
    )
    int_in("max_bytes", max_bytes, UNLIMITED, INT64_MAX, "must be -1 or 0 (unlimited) or bytes")
    int_in("replicas", replicas, 1, REPLICAS_MAX, f"must be an integer from 1 to {REPLICAS_MAX}")
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
    origin = origin_bucket(src.name)
    if origin == bucket:
        raise errors.InvalidArgumentError("sources", f"bucket {bucket!r} cannot source itself")
    if src.filter_subject or src.subject_transforms:
        return src
    transform = SubjectTransform(
        src=f"{SUBJECT_PREFIX}.{origin}.>", dest=f"{SUBJECT_PREFIX}.{bucket}.>"
    )
    return dataclasses.replace(src, subject_transforms=(transform,))


def origin_bucket(stream: str) -> str | None:
    """The bucket whose stream is named ``stream`` (None: no bucket's name)."""
    if not stream.startswith(STREAM_PREFIX):
        return None
    bucket = stream[len(STREAM_PREFIX) :]
    return bucket if _BUCKET_RE.fullmatch(bucket) else None


def mirrored(cfg: StreamConfig) -> str | None:
    """The bucket whose keys a bucket's stream ``cfg`` holds under their own subjects: the
    origin of a mirror, else None (the bucket's own subjects)."""
    return origin_bucket(cfg.mirror.name) if cfg.mirror is not None else None


def bucket_of(cfg: StreamConfig) -> str | None:
    """The bucket whose stream ``cfg`` configures, or None when the stream is no bucket's: a
    bucket's stream is named ``KV_<bucket>``, captures exactly ``$KV.<bucket>.>`` (or, a
    mirror bucket, captures nothing and mirrors a bucket's stream), keeps 1 to
    ``HISTORY_MAX`` messages per subject and allows rollup headers (a purge is one)."""
    bucket = origin_bucket(cfg.name)
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


def stream_missing(exc: errors.RaftStreamError) -> bool:
    """Whether a NOT_FOUND is about the stream itself (gone, or never made)."""
    if isinstance(exc, errors.NoStreamMatchError):
        return True
    field = exc.details.get("field")
    return isinstance(exc, errors.NotFoundError) and field in _STREAM_MISSING_FIELDS


def bucket_not_found(bucket: str, why: str = "") -> errors.BucketNotFoundError:
    return errors.BucketNotFoundError(f"bucket {bucket!r} not found{why}", bucket=bucket)


def as_bucket_error(bucket: str, exc: errors.RaftStreamError) -> errors.RaftStreamError:
    """``exc``, or ``BucketNotFoundError`` naming the bucket when it says its stream is
    missing."""
    return bucket_not_found(bucket) if stream_missing(exc) else exc
