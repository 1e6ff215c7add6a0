"""Bounds on what a definition may ask: consumer pull bounds, cluster-wide stream and
consumer counts, subject list lengths, and stream info's per-subject detail.

Checked on create and update requests (and stream info), before the meta leader proposes;
never on apply or restore, so definitions stored before a bound still load. Refusals name
the field or limit, as everywhere in ``cluster/security/limits.py`` (the face).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from raftstream.cluster.config import Limits
from raftstream.engine.consumer_config import MAX_WAITING_DEFAULT, ConsumerConfig, with_changes
from raftstream.errors import InvalidArgumentError, LimitError

__all__ = [
    "CONSUMER_FILTER_SUBJECTS_MAX",
    "STREAM_SUBJECTS_MAX",
    "SUBJECTS_DETAIL_MAX",
    "bound_consumer",
    "check_cluster_limits",
    "check_consumer_filter_count",
    "check_consumer_limits",
    "check_stream_subject_count",
    "check_subjects_detail",
]

SUBJECTS_DETAIL_MAX = 100_000  # per-subject counts one stream info may carry
# Subjects of one stream and filter subjects of one consumer, in a create or update request
# (JetStream has no count; the overlap check of a list, and of a stream against the
# account's others, costs O(the list's tokens), so this bounds a request's work on the meta
# leader's loop and on every node that applies it). Definitions stored before the bound
# still load: it is checked on requests, never on apply or restore.
STREAM_SUBJECTS_MAX = 1_000
CONSUMER_FILTER_SUBJECTS_MAX = 1_000


def bound_consumer(cfg: ConsumerConfig, limits: Limits) -> ConsumerConfig:
    """``cfg`` within the node's pull limits: a ``max_waiting`` left at the engine's default
    is lowered to ``limits.pull_waiting_max``; one set above it, or a ``max_batch`` or
    ``max_bytes`` above the node's, is refused naming the field."""
    if cfg.max_waiting == MAX_WAITING_DEFAULT and cfg.max_waiting > limits.pull_waiting_max:
        cfg = with_changes(cfg, max_waiting=limits.pull_waiting_max)
    check_consumer_limits(cfg.max_waiting, cfg.max_batch, cfg.max_bytes, limits)
    return cfg


def check_consumer_limits(max_waiting: int, max_batch: int, max_bytes: int, limits: Limits) -> None:
    """A pull consumer's own bounds may not exceed the node's (its config is the engine's)."""
    if max_waiting > limits.pull_waiting_max:
        raise InvalidArgumentError(
            "max_waiting", f"must be at most {limits.pull_waiting_max} (limits.pull_waiting_max)"
        )
    if max_batch > limits.pull_batch_msgs_max:
        raise InvalidArgumentError(
            "max_batch",
            f"must be at most {limits.pull_batch_msgs_max} (limits.pull_batch_msgs_max)",
        )
    if max_bytes > limits.pull_batch_bytes_max:
        raise InvalidArgumentError(
            "max_bytes",
            f"must be at most {limits.pull_batch_bytes_max} (limits.pull_batch_bytes_max)",
        )


class _Counted(Protocol):
    """What ``check_cluster_limits`` counts in (the meta state)."""

    def all_streams(self) -> tuple[Any, ...]: ...

    def consumers_of(self, account: str, stream: str) -> tuple[Any, ...]: ...


def check_cluster_limits(
    state: _Counted,
    limits: Limits,
    *,
    account: str,
    stream: str | None = None,
    new_consumer: bool = False,
) -> None:
    """Refuse, ``LimitError`` naming the limit, a new stream (``stream``, created in
    ``account``; a re-create of an existing one takes no place) or a new consumer that would
    take the whole cluster, every account together, past ``streams_max``/``consumers_max``.
    The meta leader calls it before it proposes, under the admission lock (as for account
    limits), so without ``[auth]`` a client still cannot create Raft groups without bound."""
    streams = state.all_streams()
    full = stream is not None and len(streams) >= limits.streams_max
    if full and not any(sa.account == account and sa.name == stream for sa in streams):
        raise LimitError(
            f"the cluster holds streams_max ({limits.streams_max}) streams",
            limit="streams_max",
        )
    if new_consumer:
        count = sum(len(state.consumers_of(sa.account, sa.name)) for sa in streams)
        if count >= limits.consumers_max:
            raise LimitError(
                f"the cluster holds consumers_max ({limits.consumers_max}) consumers",
                limit="consumers_max",
            )


def check_subjects_detail(subjects: Mapping[str, int] | None) -> None:
    """Stream info's per-subject counts are at most ``SUBJECTS_DETAIL_MAX`` (JetStream's
    bound): a wider filter is RESOURCE_EXHAUSTED naming ``subjects_filter``."""
    if subjects is not None and len(subjects) > SUBJECTS_DETAIL_MAX:
        raise LimitError(
            f"subjects_filter: matches {len(subjects)} subjects, more than "
            f"{SUBJECTS_DETAIL_MAX}; narrow the filter",
            field="subjects_filter",
            rule="subjects_detail_max",
            limit="subjects_detail_max",
        )


def _count(raw: Mapping[str, Any], key: str, count_max: int, rule: str) -> None:
    value = raw.get(key)
    if isinstance(value, list | tuple) and len(value) > count_max:
        raise InvalidArgumentError(
            key, f"must hold at most {count_max} subjects ({rule}); {len(value)} given"
        )


def check_stream_subject_count(raw: Mapping[str, Any]) -> None:
    """A parsed stream config of a create or update request holds at most
    ``STREAM_SUBJECTS_MAX`` subjects (before ``from_dict`` checks each, or any overlap)."""
    _count(raw, "subjects", STREAM_SUBJECTS_MAX, "stream_subjects_max")


def check_consumer_filter_count(raw: Mapping[str, Any]) -> None:
    """A parsed consumer config of a create or update request holds at most
    ``CONSUMER_FILTER_SUBJECTS_MAX`` filter subjects (before ``from_dict`` checks each, or
    their overlap)."""
    _count(raw, "filter_subjects", CONSUMER_FILTER_SUBJECTS_MAX, "consumer_filter_subjects_max")
