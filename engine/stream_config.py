"""Stream configuration: JetStream's field names, defaults and rules.

``StreamConfig`` is a frozen value. ``validate()`` applies JetStream's defaults (what its
server does in ``setStreamConfigDefaults``) and checks every rule, returning the normalised
copy or raising ``InvalidArgumentError`` naming the field and the rule. ``to_dict``/``from_dict``
speak JetStream's JSON names; durations (``max_age``, ``duplicate_window``) are integers of
NANOSECONDS, exactly as in JetStream's JSON. Count and size limits use -1 for "unlimited"
(0 is accepted on input and normalised to -1, as JetStream does); ``max_age`` uses 0 for
"no age limit", as JetStream does.

Ranges: the store packs every limit as a signed 64-bit integer (``engine/lmdbrecords.py``,
the meta record), so counts, sizes and sequences are at most ``INT64_MAX``; durations are at
most ``DURATION_MAX_NS`` (100 years), so that a timestamp plus a duration still fits
(``TS_NS_MAX``); a mirror's or source's ``opt_start_time`` is at most ``TS_NS_MAX``.
``validate`` (and ``normalized``) also check every field's Python type, so a config built in
code fails like one read by ``from_dict``: ``InvalidArgumentError`` naming the field.

The ``subject_transform`` value, ``SubjectTransform``, and its mapping compiler live in
``engine/subject_transform.py`` (moved there for issue 34; re-exported here).

Lifecycle rules live beside the value: ``check_create`` (a new stream may not be sealed),
``check_update`` (which fields may change and how) and ``check_no_overlap`` (no two streams
capture the same subject; the meta group calls it with the other streams' configs).

Implemented fields: name, description, subjects, subject_transform, retention,
max_consumers, max_msgs, max_bytes, max_age, max_msgs_per_subject, max_msg_size, discard,
discard_new_per_subject, storage, num_replicas, duplicate_window, sealed, deny_delete,
deny_purge, allow_rollup_hdrs, allow_direct, first_seq, metadata, allow_msg_ttl, placement,
mirror, sources (``engine/stream_source.py``; docs/mirrors.md). A mirror has no subjects,
sources or first_seq of its own; a stream with a mirror or sources captures no subject by
default (JetStream). JetStream fields that belong to later issues (republish, ...) are
refused by ``from_dict`` with a rule saying so, rather than silently ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from raftstream.engine.consumer_config import DURATION_MAX_NS, INT64_MAX, format_rfc3339_ns
from raftstream.engine.store import TS_NS_MAX, UNLIMITED, DiscardPolicy, StoreLimits
from raftstream.engine.stream_source import (
    SOURCES_MAX,
    ExternalStream,
    SourceTransform,
    StreamSource,
    check_links,
    find_cycle,
)
from raftstream.engine.subject_transform import SubjectTransform
from raftstream.engine.subjects import (
    OverlapIndex,
    first_overlap,
    validate_stream_subject,
)
from raftstream.errors import InvalidArgumentError
from raftstream.model.placement import PLACEMENT_TAGS_MAX, Placement
from raftstream.model.policies import RetentionPolicy, StorageType

__all__ = [
    "DESCRIPTION_BYTES_MAX",
    "DUPLICATE_WINDOW_DEFAULT_NS",
    "DURATION_MAX_NS",
    "INT64_MAX",
    "MAX_AGE_MIN_NS",
    "METADATA_BYTES_MAX",
    "NAME_BYTES_MAX",
    "PLACEMENT_TAGS_MAX",
    "REPLICAS_MAX",
    "Placement",
    "RetentionPolicy",
    "StorageType",
    "StreamConfig",
    "SubjectTransform",
    "check_create",
    "check_no_cycle",
    "check_no_overlap",
    "check_stream_name",
    "check_update",
    "store_limits",
]

NS_PER_SECOND = 1_000_000_000
# JetStream's limits (server/jetstream.go, stream.go): JSMaxNameLen, JSMaxDescriptionLen,
# JSMaxMetadataLen, StreamMaxReplicas, StreamDefaultDuplicatesWindow, and the 100 ms floor
# on max_age.
NAME_BYTES_MAX = 255
DESCRIPTION_BYTES_MAX = 4 * 1024
METADATA_BYTES_MAX = 128 * 1024
REPLICAS_MAX = 5
DUPLICATE_WINDOW_DEFAULT_NS = 120 * NS_PER_SECOND
MAX_AGE_MIN_NS = 100 * 1_000_000
# How many tags a placement may require: a handful in practice; a bound keeps a hostile
# config from making placement quadratic.

# JetStream fields this version does not implement yet; from_dict names the issue they wait
# for instead of dropping them silently.
# JetStream stream fields raftstream does not implement, and why a client sending one is
# refused (with the field named) rather than having it ignored.
_UNSUPPORTED_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "mirror_direct": "JetStream's direct gets from a mirror are not supported by raftstream",
        "republish": "JetStream's republish is not supported by raftstream",
        "compression": "JetStream's stored-message compression is not supported by raftstream",
        "consumer_limits": "JetStream's stream-level consumer limits are not supported by "
        "raftstream",
        "no_ack": "JetStream's no_ack streams are not supported by raftstream: every publish "
        "is acknowledged",
        "subject_delete_marker_ttl": "JetStream's subject delete markers are not supported by "
        "raftstream",
        "template_owner": "stream templates are deprecated in JetStream and not supported by "
        "raftstream",
    }
)
# Characters JetStream refuses in names: the subject separators and wildcards (a name is used
# as a subject token) and path separators (a name is used as a directory on disk).
_NAME_FORBIDDEN = frozenset(".*>/\\")


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """A stream's configuration, with JetStream's field names and (pre-normalisation) defaults.

    Construct freely; call ``validate()`` for the normalised, checked copy the engine uses.
    ``max_age`` and ``duplicate_window`` are nanoseconds. ``metadata`` is excluded from the
    hash (it is a mapping); ``validate()`` freezes it into a read-only mapping.
    """

    name: str
    description: str = ""
    subjects: tuple[str, ...] = ()
    subject_transform: SubjectTransform | None = None
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_consumers: int = UNLIMITED
    max_msgs: int = UNLIMITED
    max_bytes: int = UNLIMITED
    max_age: int = 0  # nanoseconds; 0: no age limit
    max_msgs_per_subject: int = UNLIMITED
    max_msg_size: int = UNLIMITED  # header + payload bytes, as JetStream counts it
    discard: DiscardPolicy = DiscardPolicy.OLD
    discard_new_per_subject: bool = False
    storage: StorageType = StorageType.FILE
    num_replicas: int = 1
    duplicate_window: int = 0  # nanoseconds; 0: the default (2 min, or max_age if smaller)
    sealed: bool = False
    deny_delete: bool = False
    deny_purge: bool = False
    allow_rollup_hdrs: bool = False
    allow_direct: bool = False
    first_seq: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict, hash=False)
    allow_msg_ttl: bool = False
    placement: Placement | None = None
    mirror: StreamSource | None = None
    sources: tuple[StreamSource, ...] = ()

    def normalized(self) -> StreamConfig:
        """JetStream's defaults applied; types are checked (``InvalidArgumentError``: a value
        of the wrong type cannot be normalised), no rule is (``validate`` does both)."""
        return _normalize(self)

    def validate(self) -> StreamConfig:
        """Return the normalised config, or raise ``InvalidArgumentError(field, rule)``.

        Idempotent: ``c.validate().validate() == c.validate()``.
        """
        cfg = _normalize(self)
        _check_name(cfg.name)
        _check_subjects(cfg)
        _check_limits(cfg)
        _check_durations(cfg)
        _check_discard(cfg)
        _check_misc(cfg)
        _check_mirror(cfg)
        if cfg.subject_transform is not None:
            cfg.subject_transform.validate()
        if cfg.placement is not None:
            cfg = replace(cfg, placement=cfg.placement.validate())
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """JetStream JSON (durations in nanoseconds); ``from_dict`` reads it back equal."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, StreamSource):
                value = value.to_dict()
            elif f.name == "sources":
                value = [s.to_dict() for s in value] if value else None
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            elif isinstance(value, SubjectTransform | Placement):
                value = value.to_dict()
            if value is not None:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StreamConfig:
        """Parse JetStream JSON. Types are checked and unknown keys refused, each with an
        ``InvalidArgumentError`` naming the key; rules are checked by ``validate()``.
        A JSON ``null`` is the same as an absent key (JetStream's ``omitempty``)."""
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError("config", "must be a JSON object")
        known = {f.name for f in fields(cls)}
        for key in raw:
            if key in _UNSUPPORTED_FIELDS:
                raise InvalidArgumentError(key, _UNSUPPORTED_FIELDS[key])
            if key not in known:
                raise InvalidArgumentError(str(key), "unknown stream configuration field")
        kwargs = {k: _parse_field(k, v) for k, v in raw.items() if v is not None}
        if "name" not in kwargs:
            raise InvalidArgumentError("name", "stream name is required")
        return cls(**kwargs)


def _parse_int(key: str, value: object) -> int:
    # bool is an int in Python; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(key, "must be an integer")
    return value


def _parse_bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(key, "must be a boolean")
    return value


def _parse_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(key, "must be a string")
    return value


def _parse_enum(key: str, value: object, kind: type[enum.StrEnum]) -> Any:
    allowed = [m.value for m in kind]
    if not isinstance(value, str) or value not in allowed:
        raise InvalidArgumentError(key, f"must be one of {allowed}")
    return kind(value)


def _parse_str_map(key: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidArgumentError(key, "must be an object of string keys and string values")
    return dict(value)


def _parse_subjects(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(s, str) for s in value):
        raise InvalidArgumentError(key, "must be a list of strings")
    return tuple(value)


_ENUMS: Mapping[str, type[enum.StrEnum]] = MappingProxyType(
    {"retention": RetentionPolicy, "discard": DiscardPolicy, "storage": StorageType}
)
_STRS = frozenset({"name", "description"})
_INTS = (
    "max_consumers",
    "max_msgs",
    "max_bytes",
    "max_age",
    "max_msgs_per_subject",
    "max_msg_size",
    "num_replicas",
    "duplicate_window",
    "first_seq",
)
_BOOLS = frozenset(
    {
        "discard_new_per_subject",
        "sealed",
        "deny_delete",
        "deny_purge",
        "allow_rollup_hdrs",
        "allow_direct",
        "allow_msg_ttl",
    }
)


def _parse_field(key: str, value: object) -> Any:
    """One JSON field to its Python value, type-checked (rules come later, in validate)."""
    if key in _ENUMS:
        return _parse_enum(key, value, _ENUMS[key])
    if key in _STRS:
        return _parse_str(key, value)
    if key in _BOOLS:
        return _parse_bool(key, value)
    if key == "subjects":
        return _parse_subjects(key, value)
    if key == "metadata":
        return _parse_str_map(key, value)
    if key == "subject_transform":
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(key, "must be an object with 'src' and 'dest'")
        return SubjectTransform.from_dict(value)
    if key == "mirror":
        return StreamSource.from_dict(value, "mirror")
    if key == "sources":
        if not isinstance(value, list | tuple):
            raise InvalidArgumentError(key, "must be a list of sources")
        return tuple(StreamSource.from_dict(v, f"sources[{i}]") for i, v in enumerate(value))
    if key == "placement":
        if not isinstance(value, Mapping):
            raise InvalidArgumentError(key, "must be an object with 'cluster' and/or 'tags'")
        return Placement.from_dict(value)
    return _parse_int(key, value)


def _check_types(cfg: StreamConfig) -> dict[str, Any]:
    """Every field's type, as ``from_dict`` checks the JSON's; returns the enum fields as
    members (a config built in code may spell them as strings)."""
    for name in _INTS:
        _parse_int(name, getattr(cfg, name))
    for name in _STRS:
        _parse_str(name, getattr(cfg, name))
    for name in _BOOLS:
        _parse_bool(name, getattr(cfg, name))
    if isinstance(cfg.subjects, str):
        raise InvalidArgumentError("subjects", "a list of subjects, not one string")
    _parse_subjects("subjects", cfg.subjects)
    _parse_str_map("metadata", cfg.metadata)
    _check_parts_types(cfg)
    return {name: _parse_enum(name, getattr(cfg, name), kind) for name, kind in _ENUMS.items()}


def _check_parts_types(cfg: StreamConfig) -> None:
    """The nested values' types: transform, placement, mirror and sources."""
    t = cfg.subject_transform
    if t is not None and (
        not isinstance(t, SubjectTransform)
        or not isinstance(t.src, str)
        or not isinstance(t.dest, str)
    ):
        raise InvalidArgumentError("subject_transform", "must be a SubjectTransform of strings")
    p = cfg.placement
    if p is not None and (
        not isinstance(p, Placement)
        or not (p.cluster is None or isinstance(p.cluster, str))
        or not isinstance(p.tags, list | tuple)
    ):
        raise InvalidArgumentError("placement", "must be a Placement (a cluster name and tags)")
    if cfg.mirror is not None:
        _check_link_types("mirror", cfg.mirror)
    if not isinstance(cfg.sources, list | tuple):
        raise InvalidArgumentError("sources", "must be a list of sources")
    for i, src in enumerate(cfg.sources):
        _check_link_types(f"sources[{i}]", src)


def _check_link_types(where: str, src: object) -> None:
    if not isinstance(src, StreamSource):
        raise InvalidArgumentError(where, "must be a StreamSource")
    _parse_str(f"{where}.name", src.name)
    _parse_int(f"{where}.opt_start_seq", src.opt_start_seq)
    _parse_int(f"{where}.opt_start_time", src.opt_start_time)
    if src.filter_subject is not None:
        _parse_str(f"{where}.filter_subject", src.filter_subject)
    if not isinstance(src.subject_transforms, list | tuple) or not all(
        isinstance(t, SourceTransform) and isinstance(t.src, str) and isinstance(t.dest, str)
        for t in src.subject_transforms
    ):
        raise InvalidArgumentError(
            f"{where}.subject_transforms", "must be a list of {src, dest} string pairs"
        )
    ext = src.external
    if ext is not None and (
        not isinstance(ext, ExternalStream) or not isinstance(ext.api, list | tuple)
    ):
        raise InvalidArgumentError(f"{where}.external", "must be an ExternalStream (api: a list)")


def _normalize(cfg: StreamConfig) -> StreamConfig:
    """JetStream's ``setStreamConfigDefaults``, plus what sealing implies."""
    enums = _check_types(cfg)

    def unlimited(v: int) -> int:
        return UNLIMITED if v == 0 else v

    max_age = cfg.max_age
    discard = enums.pop("discard")
    deny_delete, deny_purge, rollup = cfg.deny_delete, cfg.deny_purge, cfg.allow_rollup_hdrs
    if cfg.sealed:
        # JetStream: a sealed stream keeps what it has forever and refuses every change.
        max_age, discard = 0, DiscardPolicy.NEW
        deny_delete, deny_purge, rollup = True, True, False
    window = cfg.duplicate_window
    if window == 0:
        window = DUPLICATE_WINDOW_DEFAULT_NS
        if 0 < max_age < window:
            window = max_age
    return replace(
        cfg,
        # JetStream: a stream that mirrors or sources captures no subject unless told to.
        subjects=tuple(cfg.subjects)
        or (() if cfg.mirror is not None or cfg.sources else (cfg.name,)),
        sources=tuple(cfg.sources),
        max_consumers=unlimited(cfg.max_consumers),
        max_msgs=unlimited(cfg.max_msgs),
        max_bytes=unlimited(cfg.max_bytes),
        max_msgs_per_subject=unlimited(cfg.max_msgs_per_subject),
        max_msg_size=unlimited(cfg.max_msg_size),
        num_replicas=cfg.num_replicas or 1,
        duplicate_window=window,
        max_age=max_age,
        discard=discard,
        deny_delete=deny_delete,
        deny_purge=deny_purge,
        allow_rollup_hdrs=rollup,
        metadata=MappingProxyType(dict(cfg.metadata)),
        # An empty placement places like no placement: one spelling, so configs compare equal.
        placement=None if cfg.placement is None or cfg.placement.is_empty else cfg.placement,
        **enums,
    )


def _utf8_len(field_name: str, text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(field_name, "must be valid UTF-8") from None


def _check_name(name: str) -> None:
    check_stream_name(name, "name")


def check_stream_name(name: str, field_name: str) -> None:
    """JetStream's ``isValidName`` plus its path-separator and length rules."""
    if not name:
        raise InvalidArgumentError(field_name, "stream name is required")
    if any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidArgumentError(field_name, "must not contain whitespace or control characters")
    bad = sorted(set(name) & _NAME_FORBIDDEN)
    if bad:
        raise InvalidArgumentError(
            field_name,
            f"must not contain {''.join(bad)!r} ('.', '*', '>', '/', '\\' are refused)",
        )
    if _utf8_len(field_name, name) > NAME_BYTES_MAX:
        raise InvalidArgumentError(field_name, f"must be at most {NAME_BYTES_MAX} bytes")


def _check_mirror(cfg: StreamConfig) -> None:
    """A mirror is an exact, read-only copy: nothing of its own beside the origin."""
    if len(cfg.sources) > SOURCES_MAX:
        raise InvalidArgumentError("sources", f"at most {SOURCES_MAX} sources")
    check_links("sources", cfg.sources, cfg.name)
    for i, src in enumerate(cfg.sources):
        _check_start_range(f"sources[{i}]", src)
    if cfg.mirror is None:
        return
    check_links("mirror", (cfg.mirror,), cfg.name)
    _check_start_range("mirror", cfg.mirror)
    if cfg.subjects:
        raise InvalidArgumentError("subjects", "a mirror has no subjects of its own")
    if cfg.sources:
        raise InvalidArgumentError("sources", "a mirror cannot also have sources")
    if cfg.first_seq:
        raise InvalidArgumentError("first_seq", "a mirror keeps its origin's sequences")
    if cfg.subject_transform is not None:
        raise InvalidArgumentError("subject_transform", "a mirror stores subjects unchanged")
    if cfg.mirror.subject_transforms:
        raise InvalidArgumentError(
            "mirror.subject_transforms", "a mirror stores subjects unchanged"
        )


def _check_start_range(where: str, src: StreamSource) -> None:
    """Where a link starts fits what the link's state packs: an int64 sequence, a time."""
    if src.opt_start_seq > INT64_MAX:
        raise InvalidArgumentError(f"{where}.opt_start_seq", _INT64_RULE)
    if src.opt_start_time > TS_NS_MAX:
        raise InvalidArgumentError(
            f"{where}.opt_start_time",
            f"must be at most {TS_NS_MAX} ns since the epoch ({format_rfc3339_ns(TS_NS_MAX)})",
        )


def _check_subjects(cfg: StreamConfig) -> None:
    """Each subject valid for a user stream; no duplicates; no two overlapping."""
    for s in cfg.subjects:
        validate_stream_subject(s, "subjects")
    seen: set[str] = set()
    for s in cfg.subjects:
        if s in seen:
            raise InvalidArgumentError("subjects", f"duplicate subject {s!r}")
        seen.add(s)
    pair = first_overlap(cfg.subjects)  # O(tokens), not O(n^2) pairs: issue 39
    if pair is not None:
        raise InvalidArgumentError("subjects", f"subjects overlap: {pair[0]!r} and {pair[1]!r}")


_INT64_RULE = f"must be at most {INT64_MAX} (a signed 64-bit integer)"
_DURATION_RULE = f"must be at most {DURATION_MAX_NS} ns (100 years)"


def _check_limits(cfg: StreamConfig) -> None:
    """Counts and sizes: -1 (unlimited) or positive, after 0 was normalised to -1; each fits
    the int64 the store packs it in."""
    for name in ("max_consumers", "max_msgs", "max_bytes", "max_msgs_per_subject"):
        if getattr(cfg, name) < UNLIMITED:
            raise InvalidArgumentError(name, "must be -1 (unlimited) or positive")
        if getattr(cfg, name) > INT64_MAX:
            raise InvalidArgumentError(name, _INT64_RULE)
    if cfg.max_msg_size < UNLIMITED:
        raise InvalidArgumentError("max_msg_size", "must be -1 (unlimited) or positive")
    if cfg.max_msg_size > 2**31 - 1:
        # JetStream keeps it in an int32.
        raise InvalidArgumentError("max_msg_size", "must fit in 32 bits")
    if cfg.first_seq < 0:
        raise InvalidArgumentError("first_seq", "must not be negative")
    if cfg.first_seq > INT64_MAX:
        raise InvalidArgumentError("first_seq", _INT64_RULE)
    if cfg.num_replicas < 0:
        raise InvalidArgumentError("num_replicas", "must not be negative")
    if cfg.num_replicas > REPLICAS_MAX:
        raise InvalidArgumentError("num_replicas", f"at most {REPLICAS_MAX} replicas")


def _check_durations(cfg: StreamConfig) -> None:
    """``max_age`` and ``duplicate_window`` (nanoseconds), each at most ``DURATION_MAX_NS``:
    a message's timestamp plus either must still fit in int64."""
    if cfg.max_age < 0:
        raise InvalidArgumentError("max_age", "must not be negative (0: no age limit)")
    if 0 < cfg.max_age < MAX_AGE_MIN_NS:
        raise InvalidArgumentError("max_age", "must be at least 100ms (100000000 ns) when set")
    if cfg.max_age > DURATION_MAX_NS:
        raise InvalidArgumentError(
            "max_age", f"must be at most {DURATION_MAX_NS} ns (100 years; 0: no age limit)"
        )
    if cfg.duplicate_window < 0:
        raise InvalidArgumentError("duplicate_window", "must not be negative")
    if cfg.duplicate_window > DURATION_MAX_NS:
        raise InvalidArgumentError("duplicate_window", _DURATION_RULE)
    if cfg.max_age > 0 and cfg.duplicate_window > cfg.max_age:
        raise InvalidArgumentError("duplicate_window", "must not be larger than max_age")


def _check_discard(cfg: StreamConfig) -> None:
    if not cfg.discard_new_per_subject:
        return
    if cfg.discard is not DiscardPolicy.NEW:
        raise InvalidArgumentError("discard_new_per_subject", "requires discard 'new'")
    if cfg.max_msgs_per_subject <= 0:
        raise InvalidArgumentError(
            "discard_new_per_subject", "requires max_msgs_per_subject to be set (> 0)"
        )


def _check_misc(cfg: StreamConfig) -> None:
    """Description and metadata sizes; the rollup/purge pairing."""
    if _utf8_len("description", cfg.description) > DESCRIPTION_BYTES_MAX:
        raise InvalidArgumentError("description", f"must be at most {DESCRIPTION_BYTES_MAX} bytes")
    size = sum(_utf8_len("metadata", k) + _utf8_len("metadata", v) for k, v in cfg.metadata.items())
    if size > METADATA_BYTES_MAX:
        raise InvalidArgumentError(
            "metadata", f"keys and values must total at most {METADATA_BYTES_MAX} bytes"
        )
    if cfg.allow_rollup_hdrs and cfg.deny_purge:
        # A rollup is a purge; JetStream: "roll-ups require the purge permission".
        raise InvalidArgumentError("allow_rollup_hdrs", "rollups require purge (deny_purge set)")


def check_create(config: StreamConfig) -> StreamConfig:
    """Rules for a new stream: ``validate()`` plus "a stream cannot be created sealed"."""
    cfg = config.validate()
    if cfg.sealed:
        raise InvalidArgumentError("sealed", "a stream cannot be created sealed")
    return cfg


def check_update(old: StreamConfig, new: StreamConfig) -> StreamConfig:
    """Validate ``new`` as an update of ``old``; return the normalised new config.

    Immutable, as in JetStream: ``name``, ``storage``, ``max_consumers``, ``first_seq``.
    ``mirror`` may only be removed (the mirror becomes a normal stream, keeping its
    messages), never added to an existing stream or changed to another origin.
    ``retention`` may switch between limits and interest but never to or from workqueue
    (a work queue's one-consumer-per-subject guarantee cannot be retrofitted). One-way
    switches: ``sealed``, ``deny_delete``, ``deny_purge`` and ``allow_msg_ttl`` can be turned
    on but never off. A sealed stream's ``max_msgs``, ``max_bytes`` and
    ``max_msgs_per_subject`` are fixed, from the update that seals it on: a lower one would
    trim what sealing keeps. Everything else may change (subjects, limits, replicas,
    windows...).

    The rules about the change are checked before ``new``'s own rules (``validate``), so a
    refused change is reported as such even when it also leaves ``new`` malformed: adding a
    mirror to a stream with subjects names ``mirror`` ("cannot be added to an existing
    stream"), not ``subjects`` ("a mirror has no subjects of its own").
    """
    before = old.validate()
    # Normalised (defaults, what sealing implies) but not validated: the change rules
    # compare values only, and must speak first.
    _check_change(before, new.normalized())
    return new.validate()


# Limits whose change may remove messages: fixed on a sealed stream (``_check_change``).
# Not ``max_age``: sealing sets it to 0 (forever), which removes nothing.
_SEALED_LIMITS = ("max_msgs", "max_bytes", "max_msgs_per_subject")


def _check_change(before: StreamConfig, after: StreamConfig) -> None:
    """``check_update``'s rules about what changed, ``before`` valid, ``after`` normalised."""
    for name in ("name", "storage", "max_consumers", "first_seq"):
        if getattr(before, name) != getattr(after, name):
            raise InvalidArgumentError(name, "cannot be changed by an update")
    if before.retention != after.retention and RetentionPolicy.WORKQUEUE in (
        before.retention,
        after.retention,
    ):
        raise InvalidArgumentError("retention", "cannot change to or from workqueue")
    one_way = {
        "sealed": "a sealed stream cannot be unsealed",
        "deny_delete": "cannot be turned off once set",
        "deny_purge": "cannot be turned off once set",
        "allow_msg_ttl": "per-message TTL cannot be disabled once enabled",
    }
    for name, rule in one_way.items():
        if getattr(before, name) and not getattr(after, name):
            raise InvalidArgumentError(name, rule)
    if after.sealed:
        # What sealing promises (JetStream: no message is removed, by limits or the API): a
        # lower limit would trim the stream on every replica, so none changes once sealed,
        # nor in the update that seals (seal in an update of its own).
        for name in _SEALED_LIMITS:
            if getattr(before, name) != getattr(after, name):
                raise InvalidArgumentError(
                    name, "cannot change on a sealed stream (it keeps every message it has)"
                )
    if after.mirror is not None and before.mirror != after.mirror:
        rule = (
            "cannot be added to an existing stream"
            if before.mirror is None
            else "cannot be changed (remove it to promote the mirror)"
        )
        raise InvalidArgumentError("mirror", rule)


def check_no_overlap(config: StreamConfig, others: Iterable[StreamConfig]) -> None:
    """Refuse ``config`` when one of its subjects overlaps a subject of another stream.

    ``others`` are the other streams' configs (a config with ``config``'s name is skipped, so
    the meta group may pass every stream on an update). Subjects are taken after
    normalisation, so a stream with no subjects captures its own name. O(the others'
    subject tokens): each is one query of an index of ``config``'s subjects.
    """
    mine = OverlapIndex(config.normalized().subjects)
    for other in others:
        if other.name == config.name:
            continue
        for theirs in other.normalized().subjects:
            s = mine.first_colliding(theirs)
            if s is not None:
                raise InvalidArgumentError(
                    "subjects",
                    f"subject {s!r} overlaps {theirs!r} of stream {other.name!r}",
                )


def _origins(config: StreamConfig) -> tuple[str, ...]:
    """The same-cluster streams ``config`` copies from (external ones leave the cluster)."""
    links = (config.mirror,) if config.mirror is not None else config.sources
    return tuple(s.name for s in links if s is not None and s.external is None)


def check_no_cycle(config: StreamConfig, others: Iterable[StreamConfig]) -> None:
    """Refuse ``config`` when its mirror or sources close a cycle among the account's
    streams (``others``; one named like ``config`` is skipped): copying would loop forever.
    The error names ``mirror`` or ``sources`` and the cycle."""
    links = {o.name: _origins(o) for o in others if o.name != config.name}
    links[config.name] = _origins(config)
    path = find_cycle(config.name, links)
    if path is None:
        return
    field_name = "mirror" if config.mirror is not None else "sources"
    raise InvalidArgumentError(field_name, "a mirror/source cycle: " + " -> ".join(path))


def store_limits(config: StreamConfig) -> StoreLimits:
    """The limits a stream with ``config`` asks its store to enforce on append."""
    return StoreLimits(
        max_msgs=config.max_msgs,
        max_bytes=config.max_bytes,
        max_msgs_per_subject=config.max_msgs_per_subject,
        max_msg_size=config.max_msg_size,
        max_age_ns=config.max_age,
        discard=config.discard,
        discard_new_per_subject=config.discard_new_per_subject,
    )
