"""JetStream's stream ``placement``: one class for the SDK (which builds it) and the node
(which validates it and places replicas by it, ``cluster/meta/placement.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from raftstream.errors import InvalidArgumentError

__all__ = ["PLACEMENT_NAME_BYTES_MAX", "PLACEMENT_TAGS_MAX", "Placement"]

PLACEMENT_TAGS_MAX = 64
PLACEMENT_NAME_BYTES_MAX = 255


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """JetStream's stream ``placement``: where the meta leader may put the replicas.

    ``cluster`` (None: any) names the cluster the replicas must be in; every tag in ``tags``
    must be among the placement tags of each chosen node. Tags are a set: ``validate`` sorts
    them (so two spellings of one set compare equal) and refuses duplicates, empty tags and
    whitespace. Placement itself (``raftstream.cluster.meta.placement``) reads these fields.
    """

    cluster: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.tags, str):
            raise InvalidArgumentError("placement.tags", "a list of tags, not one string")
        object.__setattr__(self, "tags", tuple(self.tags))

    def validate(self) -> Placement:
        """The normalised copy (tags sorted), or ``InvalidArgumentError`` naming
        ``placement.cluster`` or ``placement.tags``."""
        if self.cluster is not None:
            _check_label("placement.cluster", self.cluster)
        if len(self.tags) > PLACEMENT_TAGS_MAX:
            raise InvalidArgumentError("placement.tags", f"at most {PLACEMENT_TAGS_MAX} tags")
        for tag in self.tags:
            _check_label("placement.tags", tag)
        if len(set(self.tags)) != len(self.tags):
            raise InvalidArgumentError("placement.tags", "duplicate tag")
        return Placement(cluster=self.cluster, tags=tuple(sorted(self.tags)))

    @property
    def is_empty(self) -> bool:
        return self.cluster is None and not self.tags

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.cluster is not None:
            out["cluster"] = self.cluster
        if self.tags:
            out["tags"] = list(self.tags)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Placement:
        for key in raw:
            if key not in ("cluster", "tags"):
                raise InvalidArgumentError(f"placement.{key}", "unknown field")
        cluster = raw.get("cluster")
        if cluster is not None and not isinstance(cluster, str):
            raise InvalidArgumentError("placement.cluster", "must be a string")
        tags = raw.get("tags") or ()
        if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
            raise InvalidArgumentError("placement.tags", "must be a list of strings")
        return cls(cluster=cluster or None, tags=tuple(tags))


def _check_label(field_name: str, value: object) -> None:
    """A cluster name or a tag: a non-empty string without whitespace or control characters."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field_name, "must be a non-empty string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgumentError(field_name, "must not contain whitespace or control characters")
    if _utf8_len(field_name, value) > PLACEMENT_NAME_BYTES_MAX:
        raise InvalidArgumentError(field_name, f"must be at most {PLACEMENT_NAME_BYTES_MAX} bytes")


def _utf8_len(field_name: str, text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(field_name, "must be valid UTF-8") from None
