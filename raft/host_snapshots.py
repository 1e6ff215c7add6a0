"""The Raft host's snapshots of its state machines, for log compaction (raft/host.py is the
host; this is one of its parts; its docstring explains "Compaction").

After a group applies, ``maybe_snapshot`` decides whether its log is worth compacting (by
entries and bytes since the last snapshot, or because the state machine asks). A state
machine with ``snapshot_job`` makes the snapshot in steps scheduled between the loop's other
callbacks (at most ``jobs_max`` jobs at once on the host); otherwise it is taken at once.
Either way the result becomes the group's ``compaction``, which the next round writes. A
job whose group is gone, halted, restored from a snapshot or stopping is abandoned
(``abandon``: its ``close`` runs). Everything here belongs to the host's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raftstream.raft.errors import InvalidArgumentError
from raftstream.raft.host_api import SnapshotJob
from raftstream.raft.host_groups import GroupState, HostShared

__all__ = ["SNAPSHOT_JOBS_MAX", "Snapshots"]

# Snapshot jobs running at once on a host, at most. A stream group's job holds an LMDB read
# transaction until it is done, and the node's store environment has 126 reader slots: a
# burst of compactions across hundreds of groups must not take them all (a job that cannot
# start halts its group). A group over the bound tries again after its next apply.
SNAPSHOT_JOBS_MAX = 8


class Snapshots:
    """When to compact a group's log, and the snapshot jobs in progress."""

    def __init__(
        self,
        shared: HostShared,
        *,
        halt: Callable[[GroupState, BaseException], None],
        jobs_max: int = SNAPSHOT_JOBS_MAX,
    ) -> None:
        self._s = shared
        self._halt = halt
        self._jobs_max = jobs_max
        self.jobs = 0  # groups with a snapshot job running (at most ``jobs_max``)

    def maybe_snapshot(self, g: GroupState) -> None:
        """After ``g`` applied: start its snapshot if its log is worth compacting."""
        if g.compaction is not None or g.snapshotting is not None:
            return
        snap_index = self._s.storage.log(g.name).snapshot_meta().index
        if g.applied == snap_index or not self._wanted(g, snap_index):
            return
        start_job = getattr(g.sm, "snapshot_job", None)  # optional (StateMachine)
        if start_job is not None:
            if self.jobs >= self._jobs_max:
                return  # tried again after the group's next apply
            try:
                g.snapshotting = start_job(g.name)
            except Exception as exc:  # the state could not be read at all
                self._halt(g, exc)
                return
            g.snapshotting_at = (g.applied, g.log_bytes)
            self.jobs += 1
            asyncio.get_running_loop().call_soon(self._step, g, g.snapshotting)
            return
        try:
            data = g.sm.snapshot(g.name)
            g.compaction = g.node.make_snapshot(g.applied, data)
        except InvalidArgumentError:
            return  # a membership change is not applied yet: try again later
        g.log_bytes, g.snap_bytes = 0, len(data)

    def _wanted(self, g: GroupState, snap_index: int) -> bool:
        cfg = self._s.config
        by_entries = g.applied - snap_index >= cfg.snapshot_entries and g.log_bytes >= g.snap_bytes
        by_bytes = g.log_bytes >= 2 * g.snap_bytes + cfg.snapshot_log_bytes_min
        if by_entries or by_bytes:
            return True
        wanted = getattr(g.sm, "compaction_wanted", None)  # optional (StateMachine)
        return wanted is not None and bool(wanted(g.name))

    def _step(self, g: GroupState, job: SnapshotJob) -> None:
        """One step of ``g``'s snapshot job, on the loop between other callbacks; the next
        is scheduled after it, and the finished snapshot is handed to the next round's
        write as the group's compaction. A job whose group is gone, halted or restored
        from a snapshot meanwhile (``abandon``) has been closed: it stops."""
        s = self._s
        if g.snapshotting is not job:
            return
        if s.stopping or g.halted or s.groups.get(g.name) is not g:
            self.abandon(g)
            return
        try:
            data = job.step()
        except Exception as exc:  # the state could not be read (a corrupt store record)
            self.abandon(g)
            self._halt(g, exc)
            return
        if data is None:
            asyncio.get_running_loop().call_soon(self._step, g, job)
            return
        self.abandon(g)
        index, logged = g.snapshotting_at
        if index <= s.storage.log(g.name).snapshot_meta().index:
            return  # a newer snapshot came meanwhile
        try:
            g.compaction = g.node.make_snapshot(index, data)
        except InvalidArgumentError:
            return  # a membership change applied meanwhile: the next trigger starts again
        g.log_bytes, g.snap_bytes = max(0, g.log_bytes - logged), len(data)
        s.dirty[g.name] = None
        s.wake.set()

    def abandon(self, g: GroupState) -> None:
        """Close ``g``'s snapshot job, if any (done, or no longer wanted)."""
        job, g.snapshotting = g.snapshotting, None
        if job is not None:
            self.jobs -= 1
            job.close()
