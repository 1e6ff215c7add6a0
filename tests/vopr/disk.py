"""The simulated disks: a node's Raft log storage and the write lane its host writes through.

``SimDisk`` is what survives a crash: the ``MemoryDisk`` under the node's ``MemoryLogStorage``
(raft/storage/memory.py), which holds exactly what was written, as an fsynced LMDB would.
``open()`` makes the storage a (re)started host reads; while the disk is ``faulty`` a write
fails with EIO or ENOSPC (``p_error``) before changing anything, as LMDB's commit is atomic.

A write made without waiting for its fsync (a bug: see ``mutations.ack_before_durable``)
goes through ``write_unsynced``: visible at once, kept only once the drawn fsync time has
passed; a crash before then takes it back (``lose_unsynced``), as a power cut loses what
was still in the page cache.

``SimLane`` is the write lane (raft/lanes.py's ``WriteLane``) of one run of a host: jobs run
one at a time, in order, each taking a drawn fsync time (sometimes a slow one). A crash
(``crash``) drops the jobs not yet done: their writes never reach the disk, the writes "not
yet synced" that a power cut loses. A write the host makes on the loop itself (a follower's
inline write, host.py) reaches the disk at once, as it does for real.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raftstream.raft.errors import UnavailableError
from raftstream.raft.lanes import WriteLane
from raftstream.raft.storage import GroupWrite, MemoryLogStorage
from raftstream.raft.storage.memory import MemoryDisk

__all__ = ["DiskParams", "SimDisk", "SimLane"]


@dataclass(frozen=True)
class DiskParams:
    fsync_s_min: float
    fsync_s_max: float
    p_slow: float  # a write that takes ``slow_s`` instead
    slow_s: float
    p_error: float  # a write that fails (EIO, ENOSPC) while the disk is faulty

    @classmethod
    def from_rng(cls, rng: random.Random) -> DiskParams:
        lo = rng.choice((0.0005, 0.001, 0.003))
        return cls(
            fsync_s_min=lo,
            fsync_s_max=lo * rng.choice((2, 4)),
            p_slow=rng.choice((0.0, 0.01, 0.03)),
            slow_s=rng.choice((0.05, 0.2, 0.5)),
            p_error=rng.choice((0.0, 0.0, 0.002)),
        )


@dataclass
class _Undo:
    # group -> (prefix, entries, hard state, snapshot meta, snapshot data) before the write
    groups: dict[str, tuple[Any, ...]]
    next_prefix_id: int


class _FaultyStorage(MemoryLogStorage):
    def __init__(self, disk: SimDisk) -> None:
        super().__init__(disk.memory)
        self._sim = disk

    def write_batch(self, writes: Sequence[GroupWrite]) -> None:
        self._write(writes)

    def _write(self, writes: Sequence[GroupWrite]) -> None:
        self._sim.before_write()
        super().write_batch(writes)
        self._sim.writes += 1

    def write_unsynced(self, writes: Sequence[GroupWrite]) -> None:
        """``write_batch`` whose fsync has not happened yet (module docstring)."""
        undo = self._sim.undo_of(writes)
        self._write(writes)
        self._sim.unsynced.append(undo)
        asyncio.get_running_loop().call_later(self._sim.fsync_s(), self._sim.synced, undo)


class SimDisk:
    """One node's durable Raft log (module docstring)."""

    def __init__(self, rng: random.Random, params: DiskParams) -> None:
        self._rng = rng
        self.params = params
        self.memory = MemoryDisk()
        self.faulty = True
        self.writes = 0
        self.errors: collections.Counter[str] = collections.Counter()

        self.unsynced: list[_Undo] = []  # writes not yet synced, oldest first

    def open(self) -> MemoryLogStorage:
        return _FaultyStorage(self)

    def undo_of(self, writes: Sequence[GroupWrite]) -> _Undo:
        """What ``writes`` will replace, to put back if the node crashes before a sync."""
        m = self.memory
        groups = {}
        for w in writes:
            prefix = m.registry.get(w.group)
            groups[w.group] = (
                prefix,
                None if prefix is None else dict(m.entries.get(prefix, {})),
                None if prefix is None else m.hard_states.get(prefix),
                None if prefix is None else m.snap_metas.get(prefix),
                None if prefix is None else m.snap_data.get(prefix),
            )
        return _Undo(groups, m.next_prefix_id)

    def synced(self, undo: _Undo) -> None:
        if undo in self.unsynced:  # else a crash took it back already
            # Syncs are in order: this one makes every earlier write durable too.
            del self.unsynced[: self.unsynced.index(undo) + 1]

    def lose_unsynced(self) -> int:
        """A crash: every write not yet synced is undone, newest first; how many."""
        lost = len(self.unsynced)
        m = self.memory
        for undo in reversed(self.unsynced):
            for group, (prefix, entries, hs, meta, data) in undo.groups.items():
                if prefix is None:  # the write made the group: it never existed
                    gone = m.registry.pop(group, None)
                    for table in (m.entries, m.hard_states, m.snap_metas, m.snap_data):
                        if gone is not None:
                            table.pop(gone, None)
                    continue
                m.entries[prefix] = entries if entries is not None else {}
                for table, value in (
                    (m.hard_states, hs),
                    (m.snap_metas, meta),
                    (m.snap_data, data),
                ):
                    if value is None:
                        table.pop(prefix, None)
                    else:
                        table[prefix] = value
            m.next_prefix_id = undo.next_prefix_id
        self.unsynced.clear()
        return lost

    def before_write(self) -> None:
        if self.faulty and self._rng.random() < self.params.p_error:
            code = self._rng.choice((errno.EIO, errno.ENOSPC))
            self.errors[errno.errorcode[code]] += 1
            raise OSError(code, f"simulated {errno.errorcode[code]}")

    def fsync_s(self) -> float:
        p = self.params
        if self.faulty and self._rng.random() < p.p_slow:
            return p.slow_s
        return self._rng.uniform(p.fsync_s_min, p.fsync_s_max)


class SimLane:
    """The write lane of one run of a host (module docstring)."""

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk
        self._jobs: collections.deque[
            tuple[Callable[..., Any], tuple[Any, ...], asyncio.Future[Any]]
        ] = collections.deque()
        self._crashed = False
        self._closed = False
        self.lost = 0  # jobs a crash dropped

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._crashed or self._closed:
            fut.set_exception(UnavailableError("write lane closed"))
            return fut
        self._jobs.append((fn, args, fut))
        if len(self._jobs) == 1:
            loop.call_later(self._disk.fsync_s(), self._run_next)
        return fut

    def _run_next(self) -> None:
        if self._crashed or not self._jobs:
            return
        self._run_one()
        if self._jobs:
            asyncio.get_running_loop().call_later(self._disk.fsync_s(), self._run_next)

    @property
    def pending(self) -> int:
        """Jobs queued and not yet done: writes a crash now would lose."""
        return len(self._jobs)

    def crash(self) -> None:
        """Power off: the queued writes never happen; their waiters learn it at once."""
        self._crashed = True
        while self._jobs:
            _, _, fut = self._jobs.popleft()
            self.lost += 1
            if not fut.done():
                fut.set_exception(UnavailableError("crashed before the write"))

    def close(self) -> None:
        # A graceful stop: what was queued is written now (the real lane's shutdown waits).
        self._closed = True
        while self._jobs and not self._crashed:
            self._run_one()

    def _run_one(self) -> None:
        """The oldest job, its outcome handed to its waiter."""
        fn, args, fut = self._jobs.popleft()
        try:
            result = fn(*args)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(result)


def _conforms(lane: SimLane) -> WriteLane:
    return lane
