"""How much a node can still store, and the publish admission that keeps a store from filling.

A store that fills halts its stream's group on that node (the apply fails: docs/limits.md,
"When storage runs out"), and a disk that fills stops the node. JetStream refuses a publish
with "insufficient resources" before that happens; so does a stream leader here
(``StreamGroup``'s publish checks): a publish is refused, nothing proposed, when the room
left on this node or on any other replica as last described (``cluster/meta/descriptions.py``)
is below the message and ``reserve_bytes``: what is in flight, and the Raft log's copy, fit
in the reserve.

The room is the smallest of: the filesystem space left under the data directory, and, for
each LMDB environment (the Raft log, the store), its map size minus the pages its databases
use now (pages freed by a delete or a purge count as room again, unlike the data file's
size, which never shrinks). Measured at most every ``ROOM_FRESH_S`` (a read transaction and
a stat per database: tens of microseconds), so the check costs nothing per publish; the
bytes admitted since the last measure (``admitted``) count as used meanwhile, so a burst
within one interval cannot run past the reserve.

Owned by the node's event loop.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock

__all__ = ["ROOM_FRESH_S", "StorageRoom", "env_used_bytes", "reserve_bytes"]

ROOM_FRESH_S = 0.25
RESERVE_FRACTION = 16  # 1/16 of the map size ...
RESERVE_MIN_BYTES = 64 * 1024  # ... at least this ...
RESERVE_MAX_BYTES = 1024 * 1024 * 1024  # ... at most this


def reserve_bytes(map_size_bytes: int) -> int:
    """The room a leader keeps free on every replica (module docstring)."""
    return min(RESERVE_MAX_BYTES, max(RESERVE_MIN_BYTES, map_size_bytes // RESERVE_FRACTION))


def env_used_bytes(env: Any) -> int:
    """The bytes the databases of LMDB environment ``env`` use now: their pages (branch,
    leaf, overflow), the main database's included; free pages are not counted."""
    psize = int(env.stat()["psize"])

    def pages(st: dict[str, int]) -> int:
        return int(st["branch_pages"]) + int(st["leaf_pages"]) + int(st["overflow_pages"])

    with env.begin() as txn:
        total = pages(txn.stat())
        for name, _ in txn.cursor():  # the main database holds the named ones' names
            total += pages(txn.stat(env.open_db(bytes(name), txn=txn, create=False)))
    return total * psize


class StorageRoom:
    """The room left on this node (module docstring), measured at most every
    ``ROOM_FRESH_S``. ``envs``: the node's LMDB environments, each with map size
    ``map_size_bytes``."""

    def __init__(
        self,
        data_dir: Path,
        envs: list[Any],
        map_size_bytes: int,
        clock: NodeClock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._data_dir = data_dir
        self._envs = envs
        self._map_size = map_size_bytes
        self.reserve_bytes = reserve_bytes(map_size_bytes)
        self._room = 0
        self._at = float("-inf")
        self._admitted = 0  # bytes admitted since the last measure

    def room_bytes(self) -> int:
        """The room left now: the last measure less what was admitted since."""
        now = self._clock.monotonic()
        if now - self._at >= ROOM_FRESH_S:
            self._room = self.measure()
            self._at = now
            self._admitted = 0
        return self._room - self._admitted

    def admitted(self, size: int) -> None:
        """``size`` bytes were admitted (a publish proposed; twice: log and store)."""
        self._admitted += size

    def measure(self) -> int:
        """The room now (``OSError`` when the data directory cannot be examined)."""
        room = [shutil.disk_usage(self._data_dir).free]
        room.extend(max(0, self._map_size - env_used_bytes(env)) for env in self._envs)
        return min(room)
