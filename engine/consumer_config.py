"""ConsumerConfig: a consumer's configuration with JetStream's field names, defaults and rules.

Units: every duration (``ack_wait``, ``backoff``, ``inactive_threshold``, ``max_expires``,
``idle_heartbeat``) is an ``int`` of nanoseconds, as JetStream's JSON carries them. The two
points in time (``opt_start_time``, ``pause_until``) are ``int`` nanoseconds since the Unix
epoch in Python and RFC 3339 strings in the JSON form, as JetStream writes them. ``0`` means
"unset" wherever JetStream omits a zero value; ``-1`` means unlimited.

Ranges: every integer is stored as a signed 64-bit integer somewhere (a pending ack's
deadline is packed as one, ``engine/consumer_state.py``), so counts and sequences are at most
``INT64_MAX``, points in time at most ``TS_NS_MAX`` and durations at most ``DURATION_MAX_NS``
(so that now plus any duration still fits). Types are checked before any rule: a bool is
neither an integer nor a string here, and a string is not a bool.

A ``ConsumerConfig`` is a frozen value, normalised and validated when built: defaults that
depend on other fields are filled in (``ack_wait`` becomes ``backoff[0]``, ``max_ack_pending``
1000 when acks are on, ``max_waiting`` 512 for pull consumers, ``inactive_threshold`` 5 s for
ephemerals), and every invalid combination raises ``InvalidArgumentError`` naming the field
and the rule. Rules that need other consumers or the stream (``check_update``,
``check_workqueue_filters``, ``check_for_stream``) are plain functions below.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from raftstream.engine.store import TS_NS_MAX
from raftstream.engine.subjects import (
    OverlapIndex,
    first_overlap,
    subjects_collide,
    validate_filter,
    validate_subject,
)
from raftstream.errors import InvalidArgumentError
from raftstream.model.policies import (
    INT64_MAX,
    NS_PER_S,
    UNLIMITED,
    AckPolicy,
    DeliverPolicy,
    ReplayPolicy,
)

__all__ = [
    "ACK_WAIT_DEFAULT_NS",
    "DESCRIPTION_BYTES_MAX",
    "DURATION_MAX_NS",
    "IDLE_HEARTBEAT_MIN_NS",
    "IMMUTABLE_FIELDS",
    "INACTIVE_THRESHOLD_EPHEMERAL_NS",
    "INT64_MAX",
    "MAX_ACK_PENDING_DEFAULT",
    "MAX_WAITING_DEFAULT",
    "NAME_BYTES_MAX",
    "NS_PER_MS",
    "NS_PER_S",
    "UNLIMITED",
    "AckPolicy",
    "ConsumerConfig",
    "DeliverPolicy",
    "ReplayPolicy",
    "RetentionKind",
    "check_for_stream",
    "check_update",
    "check_workqueue_filters",
    "format_rfc3339_ns",
    "parse_rfc3339_ns",
    "with_changes",
]

NS_PER_MS = 1_000_000
ACK_WAIT_DEFAULT_NS = 30 * NS_PER_S
MAX_ACK_PENDING_DEFAULT = 1000
MAX_WAITING_DEFAULT = 512
INACTIVE_THRESHOLD_EPHEMERAL_NS = 5 * NS_PER_S
IDLE_HEARTBEAT_MIN_NS = 100 * NS_PER_MS
# The longest duration (ns) any config may hold: 100 years of 365 days. Durations are added
# to a time in ns since the epoch and the sum kept in a signed 64-bit integer (pending ack
# deadlines, timestamps: ``TS_NS_MAX``, which is in the year 2262); with this ceiling
# "now + duration" fits until the year 2162. It is the per-message TTL ceiling too
# (``engine/entries.py`` TTL_MAX_NS; a test keeps the two equal). JetStream's own bound, Go's
# time.Duration, is about 292 years, but Go's time.Time does not overflow as an int64 sum does.
DURATION_MAX_NS = 100 * 365 * 24 * 3600 * NS_PER_S
# JetStream's JSMaxNameLen, in bytes of UTF-8 as for stream names (cluster/security/limits.py too).
NAME_BYTES_MAX = 255
DESCRIPTION_BYTES_MAX = 4096
METADATA_BYTES_MAX = 128 * 1024
REPLICAS_MAX = 5
_REPLICAS_RULE = f"must be 0 (as the stream) to {REPLICAS_MAX}"
# Characters a consumer name may not hold: they would break subjects or file paths.
_BAD_NAME_CHARS = frozenset(" \t\r\n\f\v.*>/\\")


class RetentionKind(enum.StrEnum):
    """A stream's retention policy, as far as consumers care (JetStream names)."""

    LIMITS = "limits"
    INTEREST = "interest"
    WORKQUEUE = "workqueue"


def _bad(field_name: str, rule: str) -> InvalidArgumentError:
    return InvalidArgumentError(field_name, rule)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerConfig:
    """One consumer's configuration (see the module docstring for units and defaults).

    Pull consumers have no ``deliver_subject``; push consumers have one. Build with keyword
    arguments; the instance is normalised and validated, or the constructor raises
    ``InvalidArgumentError``. Instances are immutable and safe to share between threads.
    """

    durable_name: str | None = None
    name: str | None = None
    description: str | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    inactive_threshold: int = 0
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL
    opt_start_seq: int = 0
    opt_start_time: int = 0
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
    pause_until: int = 0
    num_replicas: int = 0
    mem_storage: bool = False

    def __post_init__(self) -> None:
        _check_types(self)
        _coerce_enums(self)
        _check_ranges(self)
        _check_identity(self)
        _check_start(self)
        _check_acks(self)
        _check_filters(self)
        _check_pull(self)
        _check_push(self)
        _check_misc(self)

    # -- derived views ------------------------------------------------------------------------

    @property
    def is_pull(self) -> bool:
        """True for a pull consumer (no deliver subject)."""
        return not self.deliver_subject

    @property
    def is_durable(self) -> bool:
        return bool(self.durable_name)

    @property
    def consumer_name(self) -> str | None:
        """The consumer's name: ``name`` or ``durable_name`` (equal when both are set)."""
        return self.name or self.durable_name

    @property
    def filters(self) -> tuple[str, ...]:
        """Every filter as one tuple; ``(">",)`` when the consumer takes the whole stream."""
        if self.filter_subject:
            return (self.filter_subject,)
        return self.filter_subjects or (">",)

    @property
    def acks_required(self) -> bool:
        return self.ack_policy is not AckPolicy.NONE

    def ack_wait_for(self, deliveries: int) -> int:
        """The ack deadline (ns) after the ``deliveries``-th delivery of a message.

        With ``backoff`` the n-th delivery waits ``backoff[n-1]`` and the last value repeats;
        without it every delivery waits ``ack_wait``.
        """
        if not self.backoff:
            return self.ack_wait
        return self.backoff[min(deliveries, len(self.backoff)) - 1]

    def to_dict(self) -> dict[str, Any]:
        """The JetStream JSON form: zero/unset values omitted, durations in ns, times RFC 3339."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConsumerConfig:
        """Build from the JetStream JSON form; an unknown key is rejected naming the key."""
        return _from_dict(data)


# -- normalisation and validation ------------------------------------------------------------


def _set(cfg: ConsumerConfig, name: str, value: object) -> None:
    # The dataclass is frozen for users; __post_init__ is the one place that normalises it.
    object.__setattr__(cfg, name, value)


_SHOWN_CHARS_MAX = 64


def _shown(value: object) -> str:
    """``value``'s repr for an error message, cut short: a hostile value may be huge, and an
    int of more than 4300 digits has no repr at all (Python's int_max_str_digits)."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits
        if isinstance(value, int):
            return f"<an integer of {value.bit_length()} bits>"
        return "<a value too large to print>"
    return text if len(text) <= _SHOWN_CHARS_MAX else text[: _SHOWN_CHARS_MAX - 3] + "..."


def _check_types(cfg: ConsumerConfig) -> None:
    """Every field's type, before any rule reads it: a bool is not an integer and a string
    is not a bool here (Python's ``True`` is an int; a JSON ``"no"`` would be truthy)."""
    for name in _INT_FIELDS:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool):
            what = "an integer"
            if name in _TIME_FIELDS:
                what = "an RFC 3339 time or ns since the epoch"
            raise _bad(name, f"must be {what}, got {_shown(value)}")
    for name in _BOOL_FIELDS:
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise _bad(name, f"must be a boolean (true or false), got {_shown(value)}")
    for name in _STR_FIELDS:
        value = getattr(cfg, name)
        if value is not None and not isinstance(value, str):
            raise _bad(name, f"must be a string, got {_shown(value)}")
    for name in ("backoff", "filter_subjects"):
        if not isinstance(getattr(cfg, name), list | tuple):
            raise _bad(name, f"must be a list, got {_shown(getattr(cfg, name))}")
    for i, b in enumerate(cfg.backoff):
        if not isinstance(b, int) or isinstance(b, bool):
            raise _bad(f"backoff[{i}]", f"must be an integer (ns), got {_shown(b)}")
    for s in cfg.filter_subjects:
        if not isinstance(s, str):
            raise _bad("filter_subjects", f"must be a list of strings, got {_shown(s)}")
    if not isinstance(cfg.metadata, Mapping):
        raise _bad("metadata", "must be an object of strings")


def _coerce_enums(cfg: ConsumerConfig) -> None:
    for name, kind in (
        ("deliver_policy", DeliverPolicy),
        ("ack_policy", AckPolicy),
        ("replay_policy", ReplayPolicy),
    ):
        value = getattr(cfg, name)
        try:
            _set(cfg, name, kind(value))
        except ValueError:
            choices = ", ".join(m.value for m in kind)
            raise _bad(name, f"must be one of {choices}, got {_shown(value)}") from None
    _set(cfg, "backoff", tuple(cfg.backoff))
    _set(cfg, "filter_subjects", tuple(cfg.filter_subjects))
    _set(cfg, "metadata", MappingProxyType(dict(cfg.metadata)))


def _upper_bound(name: str) -> tuple[int, str]:
    """The largest value integer field ``name`` may hold, and the rule that says so."""
    if name in _TIME_FIELDS:
        return TS_NS_MAX, (
            f"must be at most {TS_NS_MAX} ns since the epoch ({format_rfc3339_ns(TS_NS_MAX)})"
        )
    if name in _DURATION_FIELDS:
        return DURATION_MAX_NS, f"must be at most {DURATION_MAX_NS} ns (100 years)"
    if name == "num_replicas":
        return REPLICAS_MAX, _REPLICAS_RULE
    return INT64_MAX, f"must be at most {INT64_MAX} (a signed 64-bit integer)"


def _check_ranges(cfg: ConsumerConfig) -> None:
    """Upper bounds, so that no value the engine cannot pack (int64) or add to a time reaches
    it. Lower bounds are rules of their own, checked with the field's other rules below."""
    for name in _INT_FIELDS:
        high, rule = _upper_bound(name)
        if getattr(cfg, name) > high:
            raise _bad(name, rule)
    for i, b in enumerate(cfg.backoff):
        if b > DURATION_MAX_NS:
            raise _bad(f"backoff[{i}]", f"must be at most {DURATION_MAX_NS} ns (100 years)")


def _utf8_len(field_name: str, text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate
        raise _bad(field_name, "must be valid UTF-8") from None


def _check_name(value: str | None, field_name: str) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value:
        raise _bad(field_name, "must be a non-empty string when set")
    # Bytes, not characters: the name is a key and a subject token everywhere else
    # (check_stream_name, cluster/security/limits.py), which count UTF-8 bytes.
    if _utf8_len(field_name, value) > NAME_BYTES_MAX:
        raise _bad(field_name, f"must be at most {NAME_BYTES_MAX} bytes")
    if any(c in _BAD_NAME_CHARS or not c.isprintable() for c in value):
        raise _bad(field_name, "must not contain whitespace, '.', '*', '>', '/' or '\\'")


def _check_identity(cfg: ConsumerConfig) -> None:
    _check_name(cfg.durable_name, "durable_name")
    _check_name(cfg.name, "name")
    if cfg.durable_name and cfg.name and cfg.durable_name != cfg.name:
        raise _bad("name", "must equal durable_name when both are set")
    if cfg.description == "":
        _set(cfg, "description", None)  # JetStream omits an empty description
    if (
        cfg.description is not None
        and _utf8_len("description", cfg.description) > DESCRIPTION_BYTES_MAX
    ):
        raise _bad("description", f"must be at most {DESCRIPTION_BYTES_MAX} bytes")
    size = 0
    for k, v in cfg.metadata.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise _bad("metadata", "keys must be non-empty strings and values strings")
        size += _utf8_len("metadata", k) + _utf8_len("metadata", v)
    if size > METADATA_BYTES_MAX:
        raise _bad("metadata", f"must be at most {METADATA_BYTES_MAX} bytes in all")
    if cfg.inactive_threshold < 0:
        raise _bad("inactive_threshold", "must not be negative (ns)")
    if cfg.inactive_threshold == 0 and not cfg.is_durable:
        # JetStream reaps unused ephemerals after 5 s unless told otherwise.
        _set(cfg, "inactive_threshold", INACTIVE_THRESHOLD_EPHEMERAL_NS)


# What a start given too small breaks; 0 in Python (the default) is "not given", and says
# "is required" instead when the deliver policy needs it.
_START_SEQ_MIN_RULE = "must be at least 1 (the first stream sequence to deliver)"
_START_TIME_MIN_RULE = "must be at least 1 ns since the epoch (after 1970-01-01T00:00:00Z)"


def _check_start(cfg: ConsumerConfig) -> None:
    policy = cfg.deliver_policy
    if cfg.opt_start_seq < 0:
        raise _bad("opt_start_seq", "must not be negative")
    if cfg.opt_start_time < 0:  # before 1970: a value was given, so it is not "required"
        raise _bad("opt_start_time", f"{_START_TIME_MIN_RULE}, got {_shown(cfg.opt_start_time)}")
    if policy is DeliverPolicy.BY_START_SEQUENCE:
        if cfg.opt_start_seq == 0:
            raise _bad("opt_start_seq", "is required by deliver_policy by_start_sequence")
    elif cfg.opt_start_seq:
        raise _bad("opt_start_seq", "is only allowed with deliver_policy by_start_sequence")
    if policy is DeliverPolicy.BY_START_TIME:
        if cfg.opt_start_time <= 0:
            raise _bad("opt_start_time", "is required by deliver_policy by_start_time")
    elif cfg.opt_start_time:
        raise _bad("opt_start_time", "is only allowed with deliver_policy by_start_time")
    if policy is DeliverPolicy.LAST_PER_SUBJECT and not (cfg.filter_subject or cfg.filter_subjects):
        raise _bad("deliver_policy", "last_per_subject requires filter_subject or filter_subjects")


def _check_acks(cfg: ConsumerConfig) -> None:
    if cfg.ack_wait < 0:
        raise _bad("ack_wait", "must not be negative (ns)")
    for i, b in enumerate(cfg.backoff):
        if b <= 0:
            raise _bad(f"backoff[{i}]", f"{_shown(b)} must be a positive number of ns")
    if cfg.backoff:
        if cfg.ack_policy is AckPolicy.NONE:
            raise _bad("backoff", "requires acks (ack_policy all or explicit)")
        # JetStream: the first backoff value is the ack wait of the first delivery.
        _set(cfg, "ack_wait", cfg.backoff[0])
    elif cfg.ack_wait == 0:
        _set(cfg, "ack_wait", ACK_WAIT_DEFAULT_NS)
    if cfg.max_deliver == 0:
        _set(cfg, "max_deliver", UNLIMITED)
    if cfg.max_deliver < UNLIMITED:
        raise _bad("max_deliver", "must be positive or -1 (unlimited)")
    # JetStream (nats-server 2.10.23+, 2.11; PR #6154) refuses only fewer deliveries than
    # backoff values: max_deliver == len(backoff) is accepted, although its error text still
    # reads "max deliver is required to be > length of backoff values".
    if cfg.backoff and cfg.max_deliver != UNLIMITED and cfg.max_deliver < len(cfg.backoff):
        raise _bad("max_deliver", "must be >= the number of backoff values")
    _check_max_ack_pending(cfg)


def _check_max_ack_pending(cfg: ConsumerConfig) -> None:
    if cfg.max_ack_pending < UNLIMITED:
        raise _bad("max_ack_pending", "must be positive or -1 (unlimited)")
    if cfg.ack_policy is AckPolicy.NONE:
        if cfg.max_ack_pending > 0:
            raise _bad("max_ack_pending", "has no meaning with ack_policy none")
        _set(cfg, "max_ack_pending", UNLIMITED)
    elif cfg.max_ack_pending == 0:
        _set(cfg, "max_ack_pending", MAX_ACK_PENDING_DEFAULT)


def _check_filters(cfg: ConsumerConfig) -> None:
    if cfg.filter_subject is not None:
        if cfg.filter_subjects:
            raise _bad("filter_subjects", "cannot be used together with filter_subject")
        validate_filter(cfg.filter_subject, "filter_subject")
    subjects = cfg.filter_subjects
    for s in subjects:
        validate_filter(s, "filter_subjects")
    pair = first_overlap(subjects)  # O(tokens), not O(n^2) pairs: issue 39
    if pair is not None:
        raise _bad("filter_subjects", f"filters may not overlap: {pair[0]!r} and {pair[1]!r}")


def _check_pull(cfg: ConsumerConfig) -> None:
    for name in ("max_batch", "max_expires", "max_bytes"):
        value = getattr(cfg, name)
        if value < 0:
            raise _bad(name, "must not be negative (0: no limit)")
        if value and not cfg.is_pull:
            raise _bad(name, "is a pull-only field; this consumer has a deliver_subject")
    if cfg.max_waiting < 0:
        raise _bad("max_waiting", "must not be negative")
    if not cfg.is_pull:
        if cfg.max_waiting:
            raise _bad("max_waiting", "is a pull-only field; this consumer has a deliver_subject")
        return
    if cfg.max_waiting == 0:
        _set(cfg, "max_waiting", MAX_WAITING_DEFAULT)
    if cfg.max_expires and cfg.max_expires < IDLE_HEARTBEAT_MIN_NS:
        raise _bad("max_expires", "must be at least 100 ms (ns) when set")


def _check_push(cfg: ConsumerConfig) -> None:
    if cfg.deliver_subject is not None:
        validate_subject(cfg.deliver_subject, "deliver_subject")
    if cfg.idle_heartbeat < 0:
        raise _bad("idle_heartbeat", "must not be negative (ns)")
    if cfg.is_pull:
        for name in ("deliver_group", "rate_limit_bps"):
            if getattr(cfg, name):
                raise _bad(name, "is a push-only field; set deliver_subject")
        if cfg.flow_control:
            raise _bad("flow_control", "is a push-only field; set deliver_subject")
        if cfg.idle_heartbeat:
            raise _bad("idle_heartbeat", "is a push-only field; pull requests carry their own")
        return
    if cfg.deliver_group is not None:
        _check_name(cfg.deliver_group, "deliver_group")
        if cfg.idle_heartbeat:
            raise _bad("idle_heartbeat", "not allowed with deliver_group (a queue group)")
        if cfg.flow_control:
            raise _bad("flow_control", "not allowed with deliver_group (a queue group)")
    if cfg.idle_heartbeat and cfg.idle_heartbeat < IDLE_HEARTBEAT_MIN_NS:
        raise _bad("idle_heartbeat", "must be at least 100 ms (ns)")
    if cfg.flow_control and not cfg.idle_heartbeat:
        raise _bad("flow_control", "requires idle_heartbeat")
    if cfg.rate_limit_bps < 0:
        raise _bad("rate_limit_bps", "must not be negative (bits per second)")


_SAMPLE_RE = re.compile(r"^(\d{1,3})%?$")


def _check_misc(cfg: ConsumerConfig) -> None:
    if cfg.sample_freq:
        m = _SAMPLE_RE.match(cfg.sample_freq)
        if m is None or int(m.group(1)) > 100:
            raise _bad("sample_freq", "must be a percentage 0-100, like '50' or '50%'")
    if cfg.pause_until < 0:
        raise _bad("pause_until", "must not be negative (ns since the epoch)")
    if not 0 <= cfg.num_replicas <= REPLICAS_MAX:
        raise _bad("num_replicas", _REPLICAS_RULE)


# -- rules that need more than one config -----------------------------------------------------

# Fields that an update may not change (JetStream refuses the same ones); switching between
# pull and push is refused too (checked on deliver_subject presence, whose value may change).
IMMUTABLE_FIELDS: tuple[str, ...] = (
    "durable_name",
    "name",
    "deliver_policy",
    "opt_start_seq",
    "opt_start_time",
    "ack_policy",
    "replay_policy",
    "max_waiting",
    "mem_storage",
    "deliver_group",
)


def check_update(old: ConsumerConfig, new: ConsumerConfig) -> None:
    """Refuse an update that changes an immutable field or switches pull/push.

    Raises ``InvalidArgumentError`` naming the first field that may not change; returns
    nothing when the update is allowed. Both configs are already valid on their own.
    """
    if old.is_pull != new.is_pull:
        raise _bad("deliver_subject", "can not switch a consumer between pull and push")
    for name in IMMUTABLE_FIELDS:
        if getattr(old, name) != getattr(new, name):
            raise _bad(name, "can not be changed on update")


def check_workqueue_filters(config: ConsumerConfig, others: Iterable[ConsumerConfig]) -> None:
    """On a workqueue stream no two consumers may take the same subject.

    ``others`` are the stream's other consumers (not ``config`` itself). A consumer without a
    filter takes every subject, so it must be alone. Raises ``InvalidArgumentError``.
    """
    mine = config.filters
    index = OverlapIndex(mine)  # O(the others' filter tokens), not mine x theirs pairs
    for other in others:
        hits = 0
        for b in other.filters:
            hits |= index.colliding(b)
        if hits:
            a = mine[(hits & -hits).bit_length() - 1]  # the first of mine that overlaps
            b = next(b for b in other.filters if subjects_collide(a, b))
            raise _bad(
                "filter_subject",
                f"overlaps consumer {other.consumer_name!r} on a workqueue stream "
                f"({a!r} and {b!r}); workqueue consumers need disjoint filters",
            )


def check_for_stream(
    config: ConsumerConfig,
    *,
    retention: RetentionKind,
    stream_subjects: Iterable[str] | None = None,
    others: Iterable[ConsumerConfig] = (),
) -> None:
    """Rules that depend on the stream the consumer is added to.

    Workqueue streams take explicit acks, deliver everything from the start, and need
    disjoint filters across consumers. When ``stream_subjects`` is given, every filter must
    match some subject the stream captures. Raises ``InvalidArgumentError``.
    """
    if retention is RetentionKind.WORKQUEUE:
        if config.ack_policy is not AckPolicy.EXPLICIT:
            raise _bad("ack_policy", "a workqueue stream requires explicit acks")
        if config.deliver_policy is not DeliverPolicy.ALL:
            raise _bad("deliver_policy", "a workqueue stream requires deliver_policy all")
        check_workqueue_filters(config, others)
    if stream_subjects is not None:
        captured = OverlapIndex(tuple(stream_subjects))
        for f in config.filters:
            if f != ">" and not captured.colliding(f):
                raise _bad("filter_subject", f"{f!r} matches no subject of the stream")


# -- JSON form --------------------------------------------------------------------------------

# Every field by type (a test checks that each field is in exactly one group). Integers are
# counts or sequences (int64), durations (ns, at most DURATION_MAX_NS) or times (ns since the
# epoch, at most TS_NS_MAX); every backoff element is a duration too.
_INT_FIELDS = (
    "inactive_threshold",
    "opt_start_seq",
    "opt_start_time",
    "ack_wait",
    "max_deliver",
    "max_ack_pending",
    "rate_limit_bps",
    "max_waiting",
    "max_batch",
    "max_expires",
    "max_bytes",
    "idle_heartbeat",
    "pause_until",
    "num_replicas",
)
_TIME_FIELDS = frozenset({"opt_start_time", "pause_until"})
_DURATION_FIELDS = frozenset({"inactive_threshold", "ack_wait", "max_expires", "idle_heartbeat"})
_BOOL_FIELDS = ("headers_only", "flow_control", "mem_storage")
_STR_FIELDS = (
    "durable_name",
    "name",
    "description",
    "filter_subject",
    "sample_freq",
    "deliver_subject",
    "deliver_group",
)
_KNOWN = frozenset(f.name for f in fields(ConsumerConfig))


def _to_dict(cfg: ConsumerConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value in (None, "", 0, False, (), {}) and not isinstance(value, enum.Enum):
            continue
        if f.name in _TIME_FIELDS:
            out[f.name] = format_rfc3339_ns(value)
        elif isinstance(value, enum.Enum):
            out[f.name] = value.value
        elif isinstance(value, tuple):
            out[f.name] = list(value)
        elif isinstance(value, Mapping):
            out[f.name] = dict(value)
        else:
            out[f.name] = value
    return out


def _from_dict(data: Mapping[str, Any]) -> ConsumerConfig:
    if not isinstance(data, Mapping):
        raise _bad("config", "must be a JSON object")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _KNOWN:
            raise _bad(str(key), "is not a consumer configuration field")
        if key in _TIME_FIELDS and isinstance(value, str):
            value = parse_rfc3339_ns(value, key)
        elif key in ("backoff", "filter_subjects"):
            if not isinstance(value, list | tuple):
                raise _bad(key, "must be a list")
            value = tuple(value)
        elif key == "metadata" and not isinstance(value, Mapping):
            raise _bad(key, "must be an object of strings")
        kwargs[key] = value
    _check_given_start(kwargs)
    return ConsumerConfig(**kwargs)


def _check_given_start(kwargs: Mapping[str, Any]) -> None:
    """A start the JSON gives as 0 (or as 1970-01-01T00:00:00Z) for a policy that needs one:
    too small, not missing. (In Python 0 is the default, so ``__post_init__`` cannot tell.)"""
    policy = kwargs.get("deliver_policy")
    for name, needs, rule in (
        ("opt_start_seq", DeliverPolicy.BY_START_SEQUENCE, _START_SEQ_MIN_RULE),
        ("opt_start_time", DeliverPolicy.BY_START_TIME, _START_TIME_MIN_RULE),
    ):
        value = kwargs.get(name)
        if policy == needs and type(value) is int and value == 0:
            raise _bad(name, f"{rule} with deliver_policy {needs.value}, got 0")


_RFC3339_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})$"
)


def parse_rfc3339_ns(text: str, field_name: str = "time") -> int:
    """Nanoseconds since the epoch from an RFC 3339 time with up to 9 fractional digits."""
    m = _RFC3339_RE.match(text)
    if m is None:
        raise _bad(field_name, f"must be an RFC 3339 time, got {_shown(text)}")
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    try:
        seconds = int(datetime.fromisoformat(m.group(1) + zone).timestamp())
    except (ValueError, OverflowError):
        raise _bad(field_name, f"must be an RFC 3339 time, got {_shown(text)}") from None
    frac = int((m.group(2) or "0").ljust(9, "0"))
    return seconds * NS_PER_S + frac


def format_rfc3339_ns(ns: int) -> str:
    """RFC 3339 in UTC with nanoseconds, as JetStream writes times (trailing zeros dropped)."""
    seconds, frac = divmod(ns, NS_PER_S)
    text = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        text += "." + f"{frac:09d}".rstrip("0")
    return text + "Z"


def with_changes(config: ConsumerConfig, **changes: Any) -> ConsumerConfig:
    """A copy of ``config`` with ``changes`` applied, validated again."""
    return replace(config, **changes)
