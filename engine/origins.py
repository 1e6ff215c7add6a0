"""What a mirror or sourcing stream remembers of each origin, as REPLICATED state.

For each link (``stream_source.source_key``) the stream keeps the last origin sequence it
stored (``last_seq``) and the origin ranges it could not copy because the origin had
removed them first (``skipped``, newest last, at most ``SKIPPED_RANGES_MAX`` kept;
``skipped_msgs`` counts them all). Every replica updates it in the same ``Copy`` entry as
the message it stores, so a new leader resumes after exactly ``last_seq``: this is the
exactly-once argument of docs/mirrors.md. It travels in the stream snapshot
(``cluster/stream/snapshot.py``) and is rebuilt from the log on restart like the store.

``HDR_STREAM_SOURCE`` is JetStream's header on a copied message, ``"<origin> <seq>"``; the
audit (``audit/tables.py``) reads the origin and sequence from its first two fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raftstream.errors import DataLossError

__all__ = [
    "HDR_STREAM_SOURCE",
    "SKIPPED_RANGES_MAX",
    "OriginState",
    "origins_from_json",
    "origins_to_json",
]

HDR_STREAM_SOURCE = "Nats-Stream-Source"
# Skipped ranges kept per origin (the count of skipped messages is kept in full).
SKIPPED_RANGES_MAX = 16


@dataclass(frozen=True, slots=True)
class OriginState:
    """One link's replicated position. ``skipped``: (first, last) origin sequences, both
    inclusive."""

    last_seq: int = 0
    skipped: tuple[tuple[int, int], ...] = field(default=())
    skipped_msgs: int = 0

    def after_copy(self, origin_seq: int, skipped: tuple[int, int] | None) -> OriginState:
        """The state once ``origin_seq`` is stored, ``skipped`` (if any) recorded first."""
        if skipped is None:
            return OriginState(origin_seq, self.skipped, self.skipped_msgs)
        lo, hi = skipped
        ranges = (*self.skipped, (lo, hi))[-SKIPPED_RANGES_MAX:]
        return OriginState(origin_seq, ranges, self.skipped_msgs + hi - lo + 1)


def origins_to_json(origins: Mapping[str, OriginState]) -> dict[str, Any]:
    return {
        key: {
            "last_seq": o.last_seq,
            "skipped": [list(r) for r in o.skipped],
            "skipped_msgs": o.skipped_msgs,
        }
        for key, o in sorted(origins.items())
    }


def origins_from_json(raw: object) -> dict[str, OriginState]:
    """The inverse of ``origins_to_json``; ``DataLossError`` when it does not read."""
    if not isinstance(raw, Mapping):
        raise DataLossError("origins: not an object")
    out: dict[str, OriginState] = {}
    try:
        for key, o in raw.items():
            ranges = tuple((int(lo), int(hi)) for lo, hi in o["skipped"])
            out[str(key)] = OriginState(int(o["last_seq"]), ranges, int(o["skipped_msgs"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataLossError(f"origins: unreadable ({exc})") from exc
    return out
