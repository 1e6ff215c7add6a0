"""Deliberately broken nodes, to show that the whole-node simulator bites
(tests/vopr/test_vopr.py): each mutation is a context manager that breaks one promise of the
Raft host or the stream group while it is active; the simulator must catch it within the
seeds ``make test`` runs, for the right reason.

- ``ack_before_durable``: the host's log writes return before the disk has synced them (as
  a log opened with fsync off: the simulated disk's ``write_unsynced``, which a crash takes
  back), so leaders count, and followers send, acknowledgements of copies that are not
  durable (persist-before-send, raft/host_round.py; fsync-before-ack). A power cut of a
  majority then loses acknowledged entries.
- ``lazy_dropped_on_transfer``: a leadership transfer starts without taking the queued
  proposals into the log first (raft/host.py, ``transfer_leadership``): the core refuses
  them, although their callers had acted on them.
- ``apply_before_commit``: the leader applies (and answers) the entries it appends at once,
  before a quorum has them (State Machine Safety, Raft §5.4.3).
- ``quiet_never_elects``: a quiesced follower is never woken when its leader goes silent
  (raft/host_ticks.py), so an idle group whose leader dies never elects another.
- ``snapshot_without_consumers``: a stream group's snapshot omits its consumers' state
  (cluster/stream/replica.py), so a replica restored from one forgets deliveries and acks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from raftstream.cluster.stream import replica as stream_group
from raftstream.raft import host as host_module
from raftstream.raft import host_round, host_ticks
from raftstream.raft.types import Role

from . import disk

__all__ = ["MUTATIONS"]


@contextlib.contextmanager
def ack_before_durable() -> Iterator[None]:
    with mock.patch.object(disk._FaultyStorage, "write_batch", disk._FaultyStorage.write_unsynced):
        yield


@contextlib.contextmanager
def lazy_dropped_on_transfer() -> Iterator[None]:
    real = host_module.RaftHost.transfer_leadership

    def transfer(self: host_module.RaftHost, group: str, to: str) -> None:
        with mock.patch.object(self._requests, "take_proposals", lambda: None):
            real(self, group, to)

    with mock.patch.object(host_module.RaftHost, "transfer_leadership", transfer):
        yield


@contextlib.contextmanager
def apply_before_commit() -> Iterator[None]:
    real_finish = host_round.Driver._finish
    real_apply = host_round.Driver._apply_entries

    def apply_entries(self: host_round.Driver, g: Any, entries: Any) -> None:
        fresh = [e for e in entries if e.index > g.applied]  # those applied early: done
        if fresh:
            real_apply(self, g, fresh)

    def finish(self: host_round.Driver, g: Any, rd: Any, *, skip: int) -> None:
        real_finish(self, g, rd, skip=skip)
        if g.node.role == Role.LEADER and not g.halted:
            early = [e for e in rd.entries if e.index > g.applied]
            if early:  # applied (and answered) as soon as the leader appends them
                real_apply(self, g, early)

    with (
        mock.patch.object(host_round.Driver, "_apply_entries", apply_entries),
        mock.patch.object(host_round.Driver, "_finish", finish),
    ):
        yield


@contextlib.contextmanager
def quiet_never_elects() -> Iterator[None]:
    with mock.patch.object(host_ticks.Ticks, "_wake_groups_of_silent_peers", lambda s, now: None):
        yield


@contextlib.contextmanager
def snapshot_without_consumers() -> Iterator[None]:
    real = stream_group.StreamReplica._snapshot_parts

    def parts(self: stream_group.StreamReplica) -> Any:
        config, store, _, origins = real(self)
        return config, store, [], origins

    with mock.patch.object(stream_group.StreamReplica, "_snapshot_parts", parts):
        yield


MUTATIONS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "ack_before_durable": ack_before_durable,
    "lazy_dropped_on_transfer": lazy_dropped_on_transfer,
    "apply_before_commit": apply_before_commit,
    "quiet_never_elects": quiet_never_elects,
    "snapshot_without_consumers": snapshot_without_consumers,
}
