"""A simulated node: the real ``RaftHost``, the real meta group (``MetaGroup``) and the real
``StreamGroup`` of each stream the meta state places on it, assembled as cluster/node/node.py
and its parts assemble them, on the simulation's edges: its disk (``SimDisk``, ``SimLane``),
its end of the network (``SimTransport``), its clocks (drifting at their own rate; the wall
clock also jumps), and a real LMDB store environment in the run's directory (the store is a
cache the group rebuilds from its log at every start).

The stream groups follow the meta state as ``NodeGroups`` has them follow it
(cluster/node/groups.py, ``reconcile``): a stream added in this run's log starts as one of
its group's first members, one known from before joins, and one deleted stops and drops its
store.

``start`` and ``crash`` may repeat: a crash drops the writes not yet done, cuts the node off
the network at once, and stops everything without a hand-over; a start rebuilds the host and
the groups from what the disk kept.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.raft_errors import app_error
from raftstream.cluster.config import Limits
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.group import META_GROUP, MetaGroup
from raftstream.cluster.meta.placement import NodeInfo
from raftstream.cluster.stream.deps import GroupDeps
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.lmdbstore import open_node_env
from raftstream.raft.clock import Timer
from raftstream.raft.host import GroupStatus, HostConfig, RaftHost
from raftstream.raft.storage import LogStorage
from raftstream.raft.storage.api import GroupLog
from tests.support.simloop import EPOCH_NS

from .disk import SimDisk, SimLane
from .net import SimNetwork, SimTransport

__all__ = ["SimClock", "SimNode"]


class SimClock:
    """One node's clocks on the simulation's time: monotonic seconds at ``rate`` (a drift of
    a few parts in a thousand), and a wall clock that also jumps (``jump``). Serves both the
    host (raft/clock.py's ``Clock``) and the stream groups (cluster/common/clock.py's
    ``NodeClock``)."""

    def __init__(self, rate: float, offset_s: float) -> None:
        self.rate = rate
        self.offset_s = offset_s
        self.wall_offset_ns = 0

    def now(self) -> float:
        return asyncio.get_running_loop().time() * self.rate + self.offset_s

    def monotonic(self) -> float:
        return self.now()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """``callback`` once ``now() >= when`` (the Clock contract): the loop time is
        rounded up until the drifted clock reads ``when`` there, or a host that re-arms a
        timer not yet due by a rounding error would spin at one simulated instant."""
        loop = asyncio.get_running_loop()
        at = (when - self.offset_s) / self.rate
        while at * self.rate + self.offset_s < when:
            at = math.nextafter(at, math.inf)
        return loop.call_at(at, callback)

    def time_ns(self) -> int:
        return EPOCH_NS + int(self.now() * 1e9) + self.wall_offset_ns

    def jump(self, seconds: float) -> None:
        """The wall clock jumps (an NTP step, an operator); monotonic time does not."""
        self.wall_offset_ns += int(seconds * 1e9)


class SimMeta:
    """The stream groups' ``MetaView`` (cluster/stream/deps.py) over the node's meta group,
    as ``NodeGroups`` is one: no consumer in a simulation has an inactive threshold, so
    nothing asks for a deletion."""

    def __init__(self, meta: MetaGroup) -> None:
        self._meta = meta

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        return self._meta.consumers_of(account, stream)

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        return self._meta.stream_of(account, stream)

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        return None


class SimNode:
    """One node of a simulation (module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        rng: random.Random,
        disk: SimDisk,
        net: SimNetwork,
        clock: SimClock,
        host_config: HostConfig,
        peers: Sequence[str],
        store_dir: Path,
    ) -> None:
        self.name = name
        self._rng = rng
        self.disk = disk
        self._net = net
        self.clock = clock
        self._host_config = host_config
        self.peers = tuple(peers)
        self.meta: MetaGroup | None = None
        self._reconciling = asyncio.Lock()
        self._env = open_node_env(store_dir, sync=False)
        self._metrics = NodeMetrics(name)
        self.host: RaftHost | None = None
        self._stopping: RaftHost | None = None  # cut off, not yet stopped (``crash``)
        self.storage: LogStorage | None = None
        self.groups: dict[str, StreamGroup] = {}
        self._lane: SimLane | None = None
        self._transport: SimTransport | None = None
        self.starts = 0
        self.crashes = 0
        self.lost_writes = 0

    @property
    def up(self) -> bool:
        return self.host is not None

    def group(self, group: str) -> StreamGroup | None:
        return self.groups.get(group) if self.host is not None else None

    async def start(self) -> None:
        self._lane = SimLane(self.disk)
        self._transport = SimTransport(self.name, self._net)
        self.storage = self.disk.open()
        host = RaftHost(
            self.name,
            storage=self.storage,
            transport=self._transport,
            config=self._host_config,
            rng=random.Random(self._rng.getrandbits(64)),
            map_error=app_error,
            clock=self.clock,
            lane=self._lane,
        )
        host.start()
        self.host = host
        self.starts += 1
        meta = MetaGroup(
            node_id=self.name,
            host=host,
            metrics=self._metrics,
            proposal_timeout_ms=self._host_config.proposal_timeout_ms,
            client_addr=lambda node: None,
            reconcile=self._reconcile,
            nodes=lambda: [NodeInfo(name=n, cluster="sim") for n in self.peers],
            clock=self.clock,
        )
        self.meta = meta
        stored = self.storage.groups()
        replay_to = self.storage.log(META_GROUP).hard_state().commit if META_GROUP in stored else 0
        meta.start(self.peers, len(self.peers), replay_to)

    async def _reconcile(self, wanted_streams: tuple[StreamAssignment, ...]) -> None:
        """``NodeGroups.reconcile`` for the simulation (module docstring)."""
        host, meta = self.host, self.meta
        if host is None or meta is None:
            return
        async with self._reconciling:
            if self.host is not host:
                return  # crashed meanwhile
            wanted = {sa.group: sa for sa in wanted_streams}
            existing = {sa.group for sa in meta.state.all_streams()}
            for group in [g for g in self.groups if g not in wanted and g not in existing]:
                g = self.groups.pop(group)
                await host.remove_group(group)
                await g.close(drop=True)
            for group, sa in wanted.items():
                if group in self.groups:
                    continue
                g = StreamGroup(self._deps(host, meta), sa)
                g.replica.starting = True
                try:
                    if group in meta.fresh_groups:
                        await host.create_group(group, voters=sa.peers, state_machine=g.replica)
                    else:
                        host.join_group(group, state_machine=g.replica)
                finally:
                    g.replica.starting = False
                self.groups[group] = g
            for g in self.groups.values():
                g.reconcile()

    def _deps(self, host: RaftHost, meta: MetaGroup) -> GroupDeps:
        return GroupDeps(
            node_id=self.name,
            host=host,
            env=self._env,
            limits=Limits(),
            metrics=self._metrics,
            proposal_timeout_ms=self._host_config.proposal_timeout_ms,
            meta=SimMeta(meta),
            clock=self.clock,
        )

    def monitor(self) -> None:
        """What the node's monitor does each tick for its groups (cluster/node/monitor.py,
        ``NodeGroups.check_leadership`` and ``reconcile``)."""
        for g in self.groups.values():
            g.check_leadership()
            g.reconcile()

    def writes_in_flight(self) -> int:
        """Writes a crash now would lose: queued on the lane, or written but not synced."""
        lane = self._lane if self.host is not None else None
        return (lane.pending if lane is not None else 0) + len(self.disk.unsynced)

    def cut_power(self) -> bool:
        """The instant of a crash: the writes not yet done are dropped and the node is off
        the network; whether it was up. ``crash`` finishes it (``await``)."""
        host, lane, transport = self.host, self._lane, self._transport
        if host is None or lane is None or transport is None:
            return False
        self.host = None
        self._stopping = host
        self.crashes += 1
        lane.crash()
        self.lost_writes += lane.lost + self.disk.lose_unsynced()
        transport.close_now()
        return True

    async def crash(self) -> None:
        """Power off (module docstring): the cut, then everything stopped without a
        hand-over."""
        self.cut_power()
        host, self._stopping = self._stopping, None
        if host is None:
            return
        meta, self.meta = self.meta, None
        if meta is not None:
            await meta.stop()
        await host.stop()
        for g in self.groups.values():
            await g.close(drop=False)
        self.groups.clear()

    async def close(self) -> None:
        await self.crash()
        self._env.close()

    def status(self, group: str) -> GroupStatus | None:
        if self.host is None or group not in self.host.groups():
            return None
        return self.host.status(group)

    def storage_log(self, group: str) -> GroupLog | None:
        """The Raft log of ``group`` as this run of the node stores it (None when down)."""
        if self.host is None or self.storage is None or group not in self.storage.groups():
            return None
        return self.storage.log(group)
