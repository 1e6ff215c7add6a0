"""The replicated record of repairs after data loss: part of the meta state.

A node whose Raft data failed its checks rejoins every group it was in as a fresh member
(docs/cluster-design.md, "Repair after data loss"). The meta group records where each such
repair stands, so that every node, and every later meta or stream leader, takes the same
decisions from the same applied state:

- ``RepairStart`` (applied only after the node is out of the meta group's membership) opens
  a repair ``repair_id`` of ``node`` at ``meta_term``; a new id replaces an older repair;
- ``RepairCleared`` notes that a stream group's leader has the node out of that group's
  membership, at the leader's term: only then may the node rejoin that group, and only at
  that term or later;
- ``RepairDone`` closes it.

Refusals (a stale or unknown repair id) are ``ConflictError``/``NotFoundError`` with the
state unchanged. Pure: no IO, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.meta.entries import RepairCleared, RepairDone, RepairStart
from raftstream.errors import ConflictError, DataLossError, NotFoundError

__all__ = ["RepairBook", "RepairRecord", "RepairRecorded"]


@dataclass(frozen=True, slots=True)
class RepairRecord:
    """One node's repair: its id, the meta term it restarted the meta group at, the groups
    whose leaders have it out of their membership (group -> term), and whether it is over."""

    repair_id: str
    meta_term: int
    cleared: Mapping[str, int] = field(default_factory=dict)
    done: bool = False

    def may_rejoin(self, group: str) -> int | None:
        """The term at which the node may rejoin ``group`` empty, or None: not yet."""
        return self.cleared.get(group)


@dataclass(frozen=True, slots=True)
class RepairRecorded:
    """The result of a repair entry: the node's record after it applied."""

    node: str
    record: RepairRecord


class RepairBook:
    """node -> ``RepairRecord`` (see the module docstring). Owned by ``MetaState``."""

    def __init__(self) -> None:
        self._records: dict[str, RepairRecord] = {}

    def get(self, node: str) -> RepairRecord | None:
        return self._records.get(node)

    def pending(self) -> dict[str, RepairRecord]:
        """The repairs not over yet, by node."""
        return {n: r for n, r in self._records.items() if not r.done}

    def apply(self, entry: RepairStart | RepairCleared | RepairDone) -> RepairRecorded:
        validate_node_name(entry.node, "node")
        if isinstance(entry, RepairStart):
            rec = self._records.get(entry.node)
            if rec is None or rec.repair_id != entry.repair_id:
                rec = RepairRecord(entry.repair_id, entry.meta_term)
                self._records[entry.node] = rec
            return RepairRecorded(entry.node, rec)
        rec = self._current(entry.node, entry.repair_id)
        if isinstance(entry, RepairCleared):
            if rec.done:
                raise ConflictError(f"repair {entry.repair_id} of {entry.node} is over")
            if entry.group not in rec.cleared:
                rec = replace(rec, cleared={**rec.cleared, entry.group: entry.term})
        else:
            rec = replace(rec, done=True)
        self._records[entry.node] = rec
        return RepairRecorded(entry.node, rec)

    def _current(self, node: str, repair_id: str) -> RepairRecord:
        rec = self._records.get(node)
        if rec is None:
            raise NotFoundError(f"no repair of {node} is recorded", field="node")
        if rec.repair_id != repair_id:
            raise ConflictError(f"repair {repair_id} of {node} was replaced by {rec.repair_id}")
        return rec

    # -- snapshots -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Canonical JSON form (sorted by node when dumped with sorted keys)."""
        return {
            node: {
                "repair_id": r.repair_id,
                "meta_term": r.meta_term,
                "cleared": dict(sorted(r.cleared.items())),
                "done": r.done,
            }
            for node, r in sorted(self._records.items())
        }

    @classmethod
    def from_json(cls, raw: object) -> RepairBook:
        """Read ``to_json``'s form back; ``DataLossError`` for anything else."""
        book = cls()
        if not isinstance(raw, dict):
            raise DataLossError("meta snapshot: repairs is not an object")
        try:
            for node, r in raw.items():
                cleared = {str(g): int(t) for g, t in dict(r["cleared"]).items()}
                book._records[str(node)] = RepairRecord(
                    str(r["repair_id"]), int(r["meta_term"]), cleared, bool(r["done"])
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataLossError(f"meta snapshot: bad repair record: {exc!r}") from None
        return book

    def __bool__(self) -> bool:
        return bool(self._records)
