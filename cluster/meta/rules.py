"""The meta state's rules for consumers and the refusals of a create that exists already.

Pure functions of configs and assignments, used by ``MetaState``'s applies
(``cluster/meta/state.py``) and by the servicers, which check the same rules before they propose:
a consumer's replicas, workqueue rules and filters against its stream
(``check_consumer_rules``), and ``AlreadyExistsError`` naming the fields that differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.engine.consumer_config import ConsumerConfig, RetentionKind, check_for_stream
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import AlreadyExistsError, InvalidArgumentError

__all__ = [
    "check_consumer_rules",
    "consumer_exists_error",
    "consumer_name",
    "stream_exists_error",
    "subjects_undescribed",
]


def consumer_name(config: ConsumerConfig) -> str:
    name = config.consumer_name
    if name is None:
        raise InvalidArgumentError(
            "name", "a meta entry needs the consumer's name (the leader names ephemerals)"
        )
    return name


def subjects_undescribed(cfg: StreamConfig) -> bool:
    """Whether a stream stores subjects its ``subjects`` do not describe (a subject
    transform, a mirror, sources): consumer filters are then not checked against them."""
    return cfg.subject_transform is not None or cfg.mirror is not None or bool(cfg.sources)


def check_consumer_rules(
    sa: StreamAssignment, config: ConsumerConfig, others: Iterable[ConsumerConfig]
) -> None:
    """The rules that depend on the stream: replicas, workqueue, filters in its subjects."""
    replicas = sa.config.num_replicas
    if config.num_replicas not in (0, replicas):
        raise InvalidArgumentError(
            "num_replicas",
            f"must be 0 or the stream's {replicas}: a consumer replicates through its "
            "stream's group",
        )
    # With a subject transform the stream stores rewritten subjects, which its ``subjects``
    # do not describe; filters are then not checked against them (they may name either).
    # Nor are they for a mirror (no subjects; it stores its origin's) or a stream with
    # sources (it stores theirs too), as JetStream does (LOG_FEATURE_LINKED_FILTERS).
    subjects = None if subjects_undescribed(sa.config) else sa.config.subjects
    check_for_stream(
        config,
        retention=RetentionKind(sa.config.retention),
        stream_subjects=subjects,
        others=others,
    )


def stream_exists_error(have: StreamConfig, asked: StreamConfig) -> AlreadyExistsError:
    """A create of stream ``asked`` refused because it exists as ``have``: names the fields
    that differ (both configs normalised by ``check_create``)."""
    differs = _differing(have, asked)
    return AlreadyExistsError(
        f"stream {asked.name!r} already exists with a different configuration "
        f"({', '.join(differs)} differ{'s' if len(differs) == 1 else ''}: "
        "update the stream to change it: raftstream stream edit, or the SDK's update_stream)",
        field="name",
        differs=",".join(differs),
    )


def consumer_exists_error(
    name: str, have: ConsumerConfig, asked: ConsumerConfig
) -> AlreadyExistsError:
    """A create of consumer ``name`` as ``asked`` refused because it exists as ``have``:
    names the fields that differ, as ``stream_exists_error`` does."""
    differs = _differing(have, asked)
    return AlreadyExistsError(
        f"consumer {name!r} already exists with a different configuration "
        f"({', '.join(differs)} differ{'s' if len(differs) == 1 else ''}: "
        "update the consumer to change it: raftstream consumer edit, or the SDK's "
        "update_consumer)",
        field="durable_name" if asked.durable_name else "name",
        differs=",".join(differs),
    )


def _differing(have: Any, asked: Any) -> list[str]:
    """The fields of two configs of one dataclass whose values differ, in field order."""
    return [
        f.name for f in dataclasses.fields(asked) if getattr(asked, f.name) != getattr(have, f.name)
    ]
