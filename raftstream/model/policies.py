"""The kinds of a stream's and a consumer's config fields (JetStream's values, as they travel
in ``config_json``), and the constants of their units."""

from __future__ import annotations

import enum

__all__ = [
    "INT64_MAX",
    "NS_PER_S",
    "UNLIMITED",
    "AckPolicy",
    "DeliverPolicy",
    "DiscardPolicy",
    "ReplayPolicy",
    "RetentionPolicy",
    "StorageType",
]

UNLIMITED = -1  # a limit that is not set
NS_PER_S = 1_000_000_000  # durations travel in nanoseconds
INT64_MAX = 2**63 - 1  # the server keeps times and counts in int64


class RetentionPolicy(enum.StrEnum):
    """When messages leave the stream besides limits: never, on interest, or once consumed."""

    LIMITS = "limits"
    INTEREST = "interest"
    WORKQUEUE = "workqueue"


class StorageType(enum.StrEnum):
    FILE = "file"
    MEMORY = "memory"


class DiscardPolicy(enum.StrEnum):
    """What a full stream does with a new message: drop the oldest, or refuse the new one."""

    OLD = "old"
    NEW = "new"


class DeliverPolicy(enum.StrEnum):
    ALL = "all"
    LAST = "last"
    NEW = "new"
    BY_START_SEQUENCE = "by_start_sequence"
    BY_START_TIME = "by_start_time"
    LAST_PER_SUBJECT = "last_per_subject"


class AckPolicy(enum.StrEnum):
    NONE = "none"
    ALL = "all"
    EXPLICIT = "explicit"


class ReplayPolicy(enum.StrEnum):
    INSTANT = "instant"
    ORIGINAL = "original"
