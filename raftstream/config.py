"""The SDK's stream and consumer configurations: JetStream's field names, units and defaults.

These mirror ``raftstream.engine.stream_config.StreamConfig`` and
``raftstream.engine.consumer_config.ConsumerConfig`` field for field (a test compares them),
but the SDK never imports the engine: they travel to the server as JetStream JSON
(``to_dict``), where the engine's ``from_dict`` validates them and names any field it
refuses. So these classes check nothing beyond types: the server is the one judge.

Units, as in JetStream's JSON and the engine: durations (``max_age``, ``duplicate_window``,
``ack_wait``, ``backoff``, ``inactive_threshold``, ``max_expires``, ``idle_heartbeat``) are
integers of NANOSECONDS; the points in time ``opt_start_time`` and ``pause_until`` are
integer ns since the Unix epoch here and RFC 3339 strings in the JSON. The client's create
and update calls refuse a set duration below 1 ms (``ack_wait=30`` meant in seconds would
be 30 ns), naming the field. Stream count and size
limits use -1 for unlimited. Defaults are the engine's pre-normalisation defaults; the
normalised config (defaults filled in) comes back in ``StreamInfo.config`` /
``ConsumerInfo.config``.

Values are frozen dataclasses built with keyword arguments; sequences are stored as tuples
and enum fields accept their string values. Types are checked here, each refusal an
``InvalidArgumentError`` naming the field, as the engine's ``from_dict`` would (JetStream's
JSON decoding refuses them too): an enum field takes one of its values, a boolean field
``True``/``False`` only (``headers_only="no"`` is not false), a text field a ``str``, a
count or duration an ``int`` (not a bool, not a float), a point in time an ``int`` of ns
from 0 to 2**63-1 (what an RFC 3339 time in the JSON can carry to the server). ``None``
leaves a field unset (the server's default). Every other rule is the server's. A keyword
that is no field (``add_stream(..., max_ag=1)``) is ``UnknownFieldError`` (``config_with``).
"""

from __future__ import annotations

import difflib
import enum
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TypeVar

from raftstream.errors import InvalidArgumentError
from raftstream.model.placement import Placement
from raftstream.model.policies import (
    INT64_MAX,
    NS_PER_S,
    UNLIMITED,
    AckPolicy,
    DeliverPolicy,
    DiscardPolicy,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
)

__all__ = [
    "UNLIMITED",
    "AckPolicy",
    "ConsumerConfig",
    "DeliverPolicy",
    "DiscardPolicy",
    "ExternalStream",
    "Placement",
    "ReplayPolicy",
    "RetentionPolicy",
    "StorageType",
    "StreamConfig",
    "StreamSource",
    "SubjectTransform",
    "UnknownFieldError",
    "config_with",
    "format_rfc3339_ns",
    "parse_rfc3339_ns",
]


E = TypeVar("E", bound=enum.StrEnum)
C = TypeVar("C", "StreamConfig", "ConsumerConfig")


def _set(obj: object, name: str, value: object) -> None:
    # Frozen for users; __post_init__ is the one place that coerces input types.
    object.__setattr__(obj, name, value)


def _list(value: object, name: str) -> tuple[Any, ...]:
    """``value`` (a list, tuple or other iterable, not a string) as a tuple."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgumentError(name, f"must be a list, not {type(value).__name__}")
    return tuple(value)


def _check_types(obj: object, kinds: Mapping[str, str]) -> None:
    """Refuse a set (not None) field of ``obj`` whose value is not of its kind: ``"str"``,
    ``"bool"``, ``"int"`` (a bool is no int: JSON ``true`` is not a number) or ``"time"``
    (an int of ns since the epoch, 0 to ``INT64_MAX``). ``InvalidArgumentError`` names the
    field; the rule says what the engine's says ("must be a boolean"...)."""
    for where, kind in kinds.items():
        value = getattr(obj, where)
        if value is None:
            continue
        if kind == "str" and not isinstance(value, str):
            raise InvalidArgumentError(where, f"must be a string, not {type(value).__name__}")
        if kind == "bool" and not isinstance(value, bool):
            raise InvalidArgumentError(
                where, f"must be a boolean (True or False), not {value!r:.40}"
            )
        if kind in ("int", "time") and (isinstance(value, bool) or not isinstance(value, int)):
            unit = " (ns since the epoch)" if kind == "time" else ""
            raise InvalidArgumentError(
                where, f"must be an integer{unit}, not {type(value).__name__}"
            )
        if kind == "time":
            _check_time_ns(where, value)


def _check_time_ns(field_name: str, ns: int) -> None:
    if not 0 <= ns <= INT64_MAX:
        raise InvalidArgumentError(
            field_name,
            f"must be 0 (unset) to {INT64_MAX} ns since the epoch "
            f"(1970-01-01T00:00:00Z to {_INT64_MAX_TIME}), not {ns}",
        )


def _mapping(value: object, name: str) -> MappingProxyType[str, Any]:
    """``value`` (a mapping) as a read-only copy; ``InvalidArgumentError`` otherwise."""
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            name, f"must be a mapping of strings to strings, not {type(value).__name__}"
        )
    return MappingProxyType(dict(value))


def _prefixed(prefix: str, exc: InvalidArgumentError) -> InvalidArgumentError:
    """``exc`` with its field under ``prefix`` (``mirror.`` + ``opt_start_time``)."""
    return InvalidArgumentError(prefix + exc.field, exc.rule)


class UnknownFieldError(InvalidArgumentError, TypeError):
    """A keyword argument that is no field of the config (``add_stream(bogus_field=1)``).

    An ``InvalidArgumentError`` naming the field, like every other refused argument, and a
    ``TypeError`` too, which is what Python raises for an unexpected keyword argument and
    what code written against earlier versions of this SDK catches. Raised before anything
    is sent; it never travels over the wire (the server answers ``InvalidArgumentError``).
    """


def config_with(cls: type[C], config: C | None, params: Mapping[str, Any]) -> C:
    """``config`` (a StreamConfig or ConsumerConfig; None: the defaults) with ``params``
    (JetStream field names) applied; ``UnknownFieldError`` naming the first key that is no
    field of ``cls``, with the closest field name when one is close."""
    names = [f.name for f in fields(cls)]
    for key in params:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UnknownFieldError(key, f"not a field of {cls.__name__}{hint}")
    if config is None:
        return cls(**params)
    if not isinstance(config, cls):
        raise InvalidArgumentError(
            "config", f"must be a {cls.__name__}, not {type(config).__name__}"
        )
    return replace(config, **params) if params else config


def _enum(kind: type[E], value: object, name: str) -> E:
    try:
        return kind(str(value))
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise InvalidArgumentError(name, f"must be one of {choices}, got {value!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubjectTransform:
    """JetStream's ``subject_transform``: stored subject = ``dest`` applied to ``src``."""

    src: str
    dest: str

    def to_dict(self) -> dict[str, str]:
        return {"src": self.src, "dest": self.dest}


@dataclass(frozen=True, slots=True, kw_only=True)
class ExternalStream:
    """An origin in another cluster: that cluster's client ``host:port`` addresses."""

    api: tuple[str, ...]

    def __post_init__(self) -> None:
        if isinstance(self.api, str):
            _set(self, "api", tuple(a.strip() for a in self.api.split(",") if a.strip()))
        _set(self, "api", tuple(self.api))

    def to_dict(self) -> dict[str, Any]:
        return {"api": list(self.api)}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSource:
    """A mirror's or a source's origin (docs/mirrors.md): the stream ``name``, where to
    start (``opt_start_seq``, or ``opt_start_time`` in ns since the epoch), which subjects
    (``filter_subject`` or ``subject_transforms``), and ``external`` for another cluster."""

    name: str
    opt_start_seq: int = 0
    opt_start_time: int = 0
    filter_subject: str | None = None
    subject_transforms: tuple[SubjectTransform, ...] = ()
    external: ExternalStream | None = None

    def __post_init__(self) -> None:
        _check_types(self, _scalar_kinds(type(self)))
        _set(
            self,
            "subject_transforms",
            tuple(
                SubjectTransform(**t) if isinstance(t, Mapping) else t
                for t in self.subject_transforms
            ),
        )
        if isinstance(self.external, Mapping):
            _set(self, "external", ExternalStream(api=self.external.get("api", ())))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.opt_start_seq:
            out["opt_start_seq"] = self.opt_start_seq
        if self.opt_start_time:
            out["opt_start_time"] = format_rfc3339_ns(self.opt_start_time, "opt_start_time")
        if self.filter_subject is not None:
            out["filter_subject"] = self.filter_subject
        if self.subject_transforms:
            out["subject_transforms"] = [t.to_dict() for t in self.subject_transforms]
        if self.external is not None:
            out["external"] = self.external.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StreamSource:
        """Read JetStream JSON; unknown keys are ignored (a newer server's fields)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        if isinstance(kwargs.get("opt_start_time"), str):
            kwargs["opt_start_time"] = parse_rfc3339_ns(kwargs["opt_start_time"], "opt_start_time")
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """A stream's configuration (see the module docstring for units and defaults)."""

    name: str
    description: str = ""
    subjects: tuple[str, ...] = ()
    subject_transform: SubjectTransform | None = None
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_consumers: int = UNLIMITED
    max_msgs: int = UNLIMITED
    max_bytes: int = UNLIMITED
    max_age: int = 0  # ns; 0: no age limit
    max_msgs_per_subject: int = UNLIMITED
    max_msg_size: int = UNLIMITED
    discard: DiscardPolicy = DiscardPolicy.OLD
    discard_new_per_subject: bool = False
    storage: StorageType = StorageType.FILE
    num_replicas: int = 1
    duplicate_window: int = 0  # ns; 0: the server's default (2 min, or max_age if smaller)
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

    def __post_init__(self) -> None:
        _check_types(self, _scalar_kinds(type(self)))
        if isinstance(self.mirror, Mapping):
            _set(self, "mirror", _source(self.mirror, "mirror."))
        if isinstance(self.sources, Mapping | str):
            raise InvalidArgumentError("sources", "a list of sources, not one")
        _set(
            self,
            "sources",
            tuple(
                _source(s, f"sources[{i}].") if isinstance(s, Mapping) else s
                for i, s in enumerate(_list(self.sources, "sources"))
            ),
        )
        if isinstance(self.subjects, str):
            raise InvalidArgumentError("subjects", "a list of subjects, not one string")
        _set(self, "subjects", _list(self.subjects, "subjects"))
        _set(self, "retention", _enum(RetentionPolicy, self.retention, "retention"))
        _set(self, "discard", _enum(DiscardPolicy, self.discard, "discard"))
        _set(self, "storage", _enum(StorageType, self.storage, "storage"))
        _set(self, "metadata", _mapping(self.metadata, "metadata"))
        if isinstance(self.subject_transform, Mapping):
            _set(self, "subject_transform", SubjectTransform(**self.subject_transform))
        if isinstance(self.placement, Mapping):
            _set(self, "placement", Placement(**self.placement))

    def to_dict(self) -> dict[str, Any]:
        """JetStream JSON, every field but an unset ``subject_transform``/``placement``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "sources" and not value):
                continue
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> StreamConfig:
        """Read JetStream JSON (as the server sends it). Keys this SDK does not know are
        ignored, so a newer server's fields do not break an older client."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known and v is not None}
        return cls(**kwargs)


def _source(raw: Mapping[str, Any], prefix: str) -> StreamSource:
    """A mirror or source from JSON, a refusal naming it (``mirror.opt_start_time``)."""
    try:
        return StreamSource.from_dict(raw)
    except InvalidArgumentError as exc:
        raise _prefixed(prefix, exc) from None


def _plain(value: object) -> object:
    """A config value in its JSON form."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, SubjectTransform | Placement | StreamSource):
        return value.to_dict()
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """A consumer's configuration (see the module docstring for units and defaults).

    A pull consumer has no ``deliver_subject``; a push consumer has one (over gRPC it names
    the push subscription rather than a NATS subject). An ephemeral consumer has neither
    ``durable_name`` nor ``name``; the server chooses its name.
    """

    durable_name: str | None = None
    name: str | None = None
    description: str | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    inactive_threshold: int = 0
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    opt_start_seq: int = 0
    opt_start_time: int = 0  # ns since the epoch
    ack_policy: AckPolicy = AckPolicy.EXPLICIT
    ack_wait: int = 0
    max_deliver: int = 0
    backoff: tuple[int, ...] = ()
    max_ack_pending: int = 0
    filter_subject: str | None = None
    filter_subjects: tuple[str, ...] = ()
    replay_policy: ReplayPolicy = ReplayPolicy.INSTANT
    rate_limit_bps: int = 0
    sample_freq: str | None = None
    headers_only: bool = False
    max_waiting: int = 0
    max_batch: int = 0
    max_expires: int = 0
    max_bytes: int = 0
    deliver_subject: str | None = None
    deliver_group: str | None = None
    idle_heartbeat: int = 0
    flow_control: bool = False
    pause_until: int = 0  # ns since the epoch
    num_replicas: int = 0
    mem_storage: bool = False

    def __post_init__(self) -> None:
        _check_types(self, _scalar_kinds(type(self)))
        _set(self, "deliver_policy", _enum(DeliverPolicy, self.deliver_policy, "deliver_policy"))
        _set(self, "ack_policy", _enum(AckPolicy, self.ack_policy, "ack_policy"))
        _set(self, "replay_policy", _enum(ReplayPolicy, self.replay_policy, "replay_policy"))
        _set(self, "backoff", _list(self.backoff, "backoff"))
        if isinstance(self.filter_subjects, str):
            raise InvalidArgumentError("filter_subjects", "a list of subjects, not one string")
        _set(self, "filter_subjects", _list(self.filter_subjects, "filter_subjects"))
        for i, step in enumerate(self.backoff):
            if isinstance(step, bool) or not isinstance(step, int):
                raise InvalidArgumentError(
                    f"backoff[{i}]", f"must be an integer of ns, not {type(step).__name__}"
                )
        _set(self, "metadata", _mapping(self.metadata, "metadata"))

    @property
    def is_pull(self) -> bool:
        return not self.deliver_subject

    def to_dict(self) -> dict[str, Any]:
        """JetStream JSON: unset (zero, empty, None) values omitted, as JetStream omits them,
        so the server applies its defaults; times as RFC 3339."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value in (None, "", 0, False, (), {}) and not isinstance(value, enum.Enum):
                continue
            if f.name in _TIME_FIELDS:
                out[f.name] = format_rfc3339_ns(value, f.name)
            else:
                out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ConsumerConfig:
        """Read JetStream JSON; unknown keys are ignored (see ``StreamConfig.from_dict``)."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known or value is None:
                continue
            if key in _TIME_FIELDS and isinstance(value, str):
                value = parse_rfc3339_ns(value, key)
            kwargs[key] = value
        return cls(**kwargs)


_TIME_FIELDS = frozenset({"opt_start_time", "pause_until"})
_RFC3339_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$"
)


# The type each scalar field must have when set (``_check_types``); the engine's
# ``_parse_field`` (streams) and ``_from_dict`` (consumers) refuse the same.
_KINDS: dict[type, Mapping[str, str]] = {}  # _scalar_kinds, per config class


def _scalar_kinds(cls: type) -> Mapping[str, str]:
    """The scalar fields of config dataclass ``cls`` by kind, read from its annotations
    (``str``/``str | None``: "str", ``bool``: "bool", ``int``: "int", or "time" for the
    ``_TIME_FIELDS``), so a field added to a config is checked without another list."""
    cached = _KINDS.get(cls)
    if cached is not None:
        return cached
    kinds: dict[str, str] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if hint in (str, str | None):
            kinds[name] = "str"
        elif hint is bool:
            kinds[name] = "bool"
        elif hint is int:
            kinds[name] = "time" if name in _TIME_FIELDS else "int"
    _KINDS[cls] = MappingProxyType(kinds)
    return _KINDS[cls]


def parse_rfc3339_ns(text: str, field_name: str = "time") -> int:
    """Nanoseconds since the epoch from an RFC 3339 time (up to 9 fractional digits), from
    1970-01-01T00:00:00Z to 2262-04-11T23:47:16.854775807Z (int64 ns, as the server keeps
    times). ``InvalidArgumentError`` naming ``field_name`` otherwise, also for a time of the
    right shape that is no date (``2020-13-45T00:00:00Z``) and for a value that is no
    string."""
    if not isinstance(text, str):
        raise InvalidArgumentError(
            field_name, f"must be an RFC 3339 time string, not {type(text).__name__}"
        )
    m = _RFC3339_RE.match(text)
    if m is None:
        raise InvalidArgumentError(field_name, f"must be an RFC 3339 time, got {text!r}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        base = datetime.fromisoformat(m.group(1) + zone)
        seconds = int(base.timestamp())
    except (ValueError, OverflowError) as exc:  # month 13, day 45, hour 25, offset 25:00
        why = str(exc) if len(str(exc)) <= 40 else "no such date, time or offset"
        raise InvalidArgumentError(
            field_name, f"must be an RFC 3339 time, got {text!r} ({why})"
        ) from None
    ns = seconds * NS_PER_S + int((m.group(2) or "0").ljust(9, "0"))
    _check_time_ns(field_name, ns)
    return ns


def format_rfc3339_ns(ns: int, field_name: str = "time") -> str:
    """RFC 3339 in UTC with nanoseconds, as JetStream writes times. ``ns`` is an int from 0
    to ``INT64_MAX`` (``InvalidArgumentError`` naming ``field_name`` otherwise: a bool is
    no time, and 10**30 is no OverflowError)."""
    if isinstance(ns, bool) or not isinstance(ns, int):
        raise InvalidArgumentError(
            field_name, f"must be an integer of ns since the epoch, not {type(ns).__name__}"
        )
    _check_time_ns(field_name, ns)
    return _format(ns)


def _format(ns: int) -> str:
    seconds, frac = divmod(ns, NS_PER_S)
    text = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


_INT64_MAX_TIME = _format(INT64_MAX)
