"""The node's monitor: leadership changes, readiness, a failed Raft host, and the metrics.

``RaftHost`` has no callback for leadership changes, so ``NodeMonitor.run`` looks every half
tick: each stream group checks its leadership (``cluster/node/groups.py``), the meta group's
leader is logged and the reconciler poked when it changes, the nodes the meta state added
or forgot are dialled or dropped (``cluster/node/peers.py``), readiness follows whether a
meta leader is known (``readiness``), and the gauges are refreshed every
``METRICS_EVERY_S``. A Raft host that stopped on its own (its log write failed) stops the
node serving and sets ``failed`` (``check_host``). Owned by the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from raftstream.cluster.common.metrics import ConsumerNumbers, NodeMetrics
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.group import META_GROUP, MetaGroup
from raftstream.cluster.node import heap
from raftstream.cluster.node.groups import NodeGroups
from raftstream.cluster.node.peers import PEER_DOWN_AFTER_S, NodePeers
from raftstream.cluster.node.repair import NodeRepair
from raftstream.cluster.node.server import READY_SERVICE, NodeServer
from raftstream.cluster.node.storage import NodeStorage
from raftstream.cluster.services.context import ServiceContext
from raftstream.errors import InvariantError, RaftStreamError
from raftstream.raft.host import RaftHost

__all__ = ["METRICS_EVERY_S", "READY_GRACE_S", "NodeMonitor", "readiness", "release_heap"]

log = logging.getLogger(__name__)

METRICS_EVERY_S = 1.0  # how often the gauges are refreshed (cluster/common/metrics.py)
# A ready node stays ready this long without a meta leader: an election takes 0.6-1.2 s
# (and a split vote one more round), a lost majority longer.
READY_GRACE_S = 2.0


def readiness(*, was_ready: bool, meta_leader_known: bool, missing_s: float) -> bool:
    """Whether a node is ready (``READY_SERVICE``): it knows a meta leader, or it was ready
    and has known none for less than ``READY_GRACE_S`` (an election: a load balancer taking
    every node out of service for each one would turn a meta election into an outage of
    the data path, which does not need the meta group)."""
    return meta_leader_known or (was_ready and missing_s < READY_GRACE_S)


async def release_heap() -> None:
    """Give freed memory back to the system now and then (``cluster/node/heap.py``)."""
    while True:
        await asyncio.sleep(heap.HEAP_RELEASE_EVERY_S)
        await asyncio.to_thread(heap.release)


class NodeMonitor:
    """The node's monitor (module docstring). ``failed`` is set here when the Raft host
    failed; ``stopped`` is the node's, set when it stops (no longer ready)."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        host: RaftHost,
        meta: MetaGroup,
        metrics: NodeMetrics,
        ctx: ServiceContext,
        groups: NodeGroups,
        peers: NodePeers,
        repair: NodeRepair,
        server: NodeServer,
        storage: NodeStorage,
        failed: asyncio.Event,
        stopped: asyncio.Event,
    ) -> None:
        self._config = config
        self._host = host
        self._meta = meta
        self._metrics = metrics
        self._ctx = ctx
        self._groups = groups
        self._peers = peers
        self._repair = repair
        self._server = server
        self._storage = storage
        self._failed = failed
        self._stopped = stopped
        # The meta state's added and forgotten nodes, as last taken (``learn_nodes``).
        self._nodes_seen: tuple[Mapping[str, str], frozenset[str]] = ({}, frozenset())
        self._live_peers: frozenset[str] = frozenset()  # as the meta leader last saw them
        self._removed = False  # this node, in the applied meta state (``_note_removed``)
        self._ready = False  # READY_SERVICE's status
        self._no_meta_leader_since: float | None = None  # monotonic; None: one is known
        self._meta_leader_warned = False
        self._meta_leader: str | None = None

    async def run(self) -> None:
        """Leadership changes (RaftHost has no callback for them): look every tick. Ends
        when the Raft host failed (``check_host``)."""
        tick_s = self._config.raft.tick_ms / 1000
        loop = asyncio.get_running_loop()
        metrics_due = 0.0
        while True:
            asleep = loop.time()
            await asyncio.sleep(tick_s / 2)
            self._metrics.loop_lag.observe(max(0.0, loop.time() - asleep - tick_s / 2))
            if await self.check_host():
                return
            observe = loop.time() >= metrics_due
            if observe:
                metrics_due = loop.time() + METRICS_EVERY_S
            self._groups.check_leadership(observe=observe)
            if not self._repair.meta_started:
                continue  # under repair, not yet back in the meta group
            await self._meta_tick(observe)

    async def _meta_tick(self, observe: bool) -> None:
        """What a tick looks at once the meta group runs here."""
        state = self._meta.state
        seen = (state.added_nodes, state.forgotten_nodes)
        if seen != self._nodes_seen:
            self._nodes_seen = seen
            self._peers.learn_nodes(*seen)
        st = self._host.status(META_GROUP)
        me = self._config.name
        await self._set_ready(bool(st.leader))
        if observe:
            self._metrics.observe_group(
                META_GROUP, applied=st.applied, term=st.term, leader=st.leader == me
            )
        if st.leader == me:
            live = frozenset(n for n in self._ctx.nodes.names() if self._ctx.peer_live(n))
            if live != self._live_peers:
                # A node that came online (back, readmitted, repaired) may take the
                # replicas of groups left short: the meta leader plans again.
                self._live_peers = live
                self._meta.poke()
        self._note_removed()
        if st.leader != self._meta_leader:
            self._meta_leader = st.leader
            self._meta.poke()  # a new meta leader resumes any interrupted repair
            self._metrics.leader_changed(META_GROUP)
            log.info(
                "meta leader is %s", st.leader or "-", extra={"group": META_GROUP, "term": st.term}
            )
        if observe:
            self._storage.observe(self._metrics, self._groups.groups)
            self._observe_led(st.leader == me)

    async def check_host(self) -> bool:
        """True once the Raft host stopped on its own: then this node stops serving (health
        NOT_SERVING, so clients and peers go elsewhere and its leaderships move) and
        ``failed`` is set. Kept running, it looked healthy (Online, SERVING, its last
        leaderships in the metrics) while every write it took failed (a user review: a full
        disk); stopped, it is plainly down, as Kafka stops a broker whose log dir failed."""
        exc = self._host.failure
        if exc is None or self._failed.is_set():
            return exc is not None
        log.critical(
            "this node stops: its Raft log can no longer be written (%r). Free disk space "
            "or fix the disk under %s, then start it again: it catches up from its peers",
            exc,
            self._config.data,
        )
        with contextlib.suppress(InvariantError):
            await self._server.set_health("", False)
        self._failed.set()
        return True

    def _note_removed(self) -> None:
        """Say so when this node is taken out of the cluster or readmitted: a removed node
        keeps running but hosts nothing (docs/operations.md)."""
        removed = self._config.name in self._meta.state.removed_peers
        if removed == self._removed:
            return
        self._removed = removed
        if removed:
            log.warning(
                "this node was removed from the cluster (peer-remove): no replica is placed"
                " on it until it is readmitted (raftstream cluster peer-add %s)",
                self._config.name,
            )
        else:
            log.info("this node was readmitted to the cluster (peer-add)")

    async def _set_ready(self, meta_leader_known: bool) -> None:
        """``READY_SERVICE``'s health status: SERVING while this node knows a meta leader
        (so it can create, change and place streams and consumers), through an election
        (``readiness``); ``""`` stays the process's liveness. A meta leader missing for
        ``PEER_DOWN_AFTER_S`` is logged once as a WARNING (an election takes less)."""
        now = self._ctx.clock.monotonic()
        if meta_leader_known:
            if self._meta_leader_warned:
                log.info("the meta group has a leader again", extra={"group": META_GROUP})
            self._no_meta_leader_since = None
            self._meta_leader_warned = False
        elif self._no_meta_leader_since is None:
            self._no_meta_leader_since = now
        elif not self._meta_leader_warned and now - self._no_meta_leader_since >= (
            PEER_DOWN_AFTER_S
        ):
            self._meta_leader_warned = True
            log.warning(
                "no meta leader for %.0f s: streams and consumers cannot be created, changed"
                " or placed until a majority of the nodes is back (unreachable: %s)",
                PEER_DOWN_AFTER_S,
                ", ".join(self._peers.reported_down()) or "none seen yet",
                extra={"group": META_GROUP},
            )
        missing_s = 0.0 if self._no_meta_leader_since is None else now - self._no_meta_leader_since
        ready = (
            readiness(
                was_ready=self._ready, meta_leader_known=meta_leader_known, missing_s=missing_s
            )
            and not self._failed.is_set()
            and not self._stopped.is_set()
        )
        if ready == self._ready:
            return
        self._ready = ready
        await self._server.set_health(READY_SERVICE, ready)

    def _observe_led(self, meta_leader: bool) -> None:
        """The metrics only a group's leader knows: replica lag and consumer backlogs."""
        lags: dict[tuple[str, str], int] = {}
        consumers: dict[tuple[str, str], ConsumerNumbers] = {}
        now = self._ctx.clock.time_ns()
        groups = self._groups.groups
        led = [g.group for g in groups.values() if g.ready]
        for group in [META_GROUP, *led] if meta_leader else led:
            with contextlib.suppress(RaftStreamError):  # a group just removed
                for peer, lag in self._host.peer_lags(group).items():
                    lags[(group, peer)] = lag
        for g in groups.values():
            for c in g.led_consumers():
                i = c.info(now)
                consumers[(g.group, c.name)] = ConsumerNumbers(
                    pending=i.num_pending,
                    ack_pending=i.num_ack_pending,
                    redelivered=i.num_redelivered,
                    waiting=i.num_waiting,
                    delivered_seq=i.delivered.stream_seq,
                    ack_floor_seq=i.ack_floor.stream_seq,
                )
        self._metrics.observe_led(lags, consumers)
