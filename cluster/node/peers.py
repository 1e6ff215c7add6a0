"""The other nodes as this one sees them: who is up, what each said of itself, where to
reach each.

``NodePeers`` probes every peer's health each ``PEER_PROBE_INTERVAL_S`` and asks a serving peer for
its description (tags, free space, log features: ``cluster/meta/descriptions.py``); a peer whose
probes failed for ``PEER_DOWN_AFTER_S`` is down (placement, cluster info, hints). It dials the nodes
the meta state adds and stops dialling the ones it forgets (``learn_nodes``). It is the servicers'
``PeerView`` (``cluster/services/context.py``) and the stream groups' ``ClusterLinks`` and
``ReplicaFeatures`` (``cluster/stream/deps.py``). Owned by the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.descriptions import LOG_FEATURES, DescriptionBook, NodeDescription
from raftstream.cluster.node.storage import NodeStorage
from raftstream.cluster.repair.known_peers import KnownPeers
from raftstream.cluster.security.auth import node_token
from raftstream.cluster.services.forward import Forwarder
from raftstream.cluster.services.node import describe_peer, led_groups, probe_metadata
from raftstream.cluster.services.node_book import NodeBook
from raftstream.errors import InvalidArgumentError
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.host import RaftHost
from raftstream.raft.transport import GrpcTransport

__all__ = ["PEER_DOWN_AFTER_S", "PEER_PROBE_INTERVAL_S", "PEER_PROBE_TIMEOUT_S", "NodePeers"]

log = logging.getLogger(__name__)

PEER_PROBE_INTERVAL_S = 0.5
PEER_PROBE_TIMEOUT_S = 1.0
PEER_DOWN_AFTER_S = 3.0  # a peer whose probes failed this long is down (placement, info)


class NodePeers:
    """Peer liveness, descriptions and addresses (module docstring). ``transport`` is the
    Raft transport, told each peer's address; ``host`` the Raft host (a forgotten node is
    untracked there before it is no longer dialled)."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        nodes: NodeBook,
        metrics: NodeMetrics,
        descriptions: DescriptionBook,
        known_peers: KnownPeers,
        storage: NodeStorage,
        forwarder: Forwarder,
        transport: GrpcTransport,
        host: RaftHost,
        clock: NodeClock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._config = config
        self._nodes = nodes
        self._metrics = metrics
        self._descriptions = descriptions
        self._known_peers = known_peers
        self._storage = storage
        self._forwarder = forwarder
        self._transport = transport
        self._host = host
        self._seen: dict[str, int] = {}
        self._failing: dict[str, float] = {}  # peer -> monotonic time probes began to fail
        self._reported_down: set[str] = set()
        self._dialled: dict[str, str] = dict(nodes.peers())  # what the transport was told

    # -- PeerView (cluster/services/context.py) ----------------------------------------------------

    def seen_ns(self) -> Mapping[str, int]:
        return self._seen

    def down(self, name: str) -> bool:
        since = self._failing.get(name)
        return since is not None and self._clock.monotonic() - since >= PEER_DOWN_AFTER_S

    def describe_self(self) -> NodeDescription:
        return self._storage.describe_self()

    def descriptions(self) -> Mapping[str, NodeDescription]:
        return self._descriptions.snapshot()

    async def led_groups(
        self, peer: str, groups: Sequence[str], timeout_s: float
    ) -> list[pb.GroupInfo]:
        addr = self._nodes.address(peer)
        if addr is None:
            return []
        stub = npbg.NodeServiceStub(self._forwarder.channel(str(addr)))
        metadata = probe_metadata(self._config.auth)
        return await led_groups(stub, groups, metadata=metadata, timeout_s=timeout_s)

    # -- ClusterLinks and ReplicaFeatures (cluster/stream/deps.py) ---------------------------

    def client_addr(self, node: str) -> str | None:
        return self._nodes.address(node)

    def cluster_addrs(self) -> tuple[str, ...]:
        """This cluster's client API addresses (a mirror/source link to a local origin)."""
        return tuple(a for a in self._nodes.addresses().values() if a)

    def link_token(self, account: str) -> str | None:
        return node_token(self._config.auth, account)

    def replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        """Whether this node and each other of ``peers`` read log entries of ``feature``:
        the others as they last described themselves (``cluster/meta/descriptions.py``); None
        while one has not described itself yet."""
        if feature not in LOG_FEATURES:
            return False
        me = self._config.name
        return self._descriptions.all_read([p for p in peers if p != me], feature)

    # -- the node's own uses ----------------------------------------------------------------

    def up_for_clients(self) -> tuple[str, str] | None:
        """A peer not known down, as (name, client address): where a refused client goes."""
        for name, addr in self._nodes.peers().items():
            if not self.down(name):
                return name, addr
        return None

    def reported_down(self) -> list[str]:
        """The peers said to be unreachable (sorted)."""
        return sorted(self._reported_down)

    def learn_nodes(self, added: Mapping[str, str], forgotten: frozenset[str]) -> None:
        """Take the meta state's added and forgotten nodes: dial each new node (or new
        address) from now on and ask it to describe itself; probe a forgotten one no more."""
        self._nodes.set_added(added, forgotten)
        peers = self._nodes.peers()
        for name, addr in peers.items():
            if name not in self._dialled and name not in self._seen:
                # Down until it answers: placement must not put replicas on a node that
                # was added but may not run yet (the nodes this one knew at start, from its
                # config or its record, get the usual grace: they are probably up).
                self._failing.setdefault(name, self._clock.monotonic() - PEER_DOWN_AFTER_S)
                self._reported_down.add(name)  # (no "unreachable" warning for that)
            if self._dialled.get(name) != addr:
                log.info("node %s serves on %s", name, addr)
                self._transport.set_peer(name, addr)
                self._dialled[name] = addr
        for name in forgotten & self._dialled.keys():
            if name in peers or not self._host.untrack_peer(name):
                continue  # a replica here still counts it: dialled until the next restart
            log.info("node %s was taken out of the cluster: no longer dialled", name)
            self._transport.remove_peer(name)
            del self._dialled[name]
            self._failing.pop(name, None)
            self._reported_down.discard(name)
        self._descriptions.add_peers(peers)

    async def probe(self) -> None:
        """Who is up (placement, cluster info): a health check per peer per interval, then,
        from a serving peer, its description (tags, free space: cluster/meta/descriptions.py).
        Runs until cancelled."""
        stubs: dict[str, health_pb2_grpc.HealthStub] = {}
        describers: dict[str, npbg.NodeServiceStub] = {}
        dialled: dict[str, str] = {}
        metadata = probe_metadata(self._config.auth)
        while True:
            peers = self._nodes.peers()  # a node added to the cluster is probed from now on
            for n, a in peers.items():
                if dialled.get(n) != a:
                    dialled[n] = a
                    stubs[n] = health_pb2_grpc.HealthStub(self._forwarder.channel(a))
                    describers[n] = npbg.NodeServiceStub(self._forwarder.channel(a))
            await asyncio.gather(
                *(self._probe_one(n, stubs[n], describers[n], metadata) for n in peers)
            )
            await asyncio.sleep(PEER_PROBE_INTERVAL_S)

    async def _probe_one(
        self,
        name: str,
        stub: health_pb2_grpc.HealthStub,
        describer: npbg.NodeServiceStub,
        metadata: tuple[tuple[str, str], ...],
    ) -> None:
        ok = False
        with contextlib.suppress(grpc.RpcError):
            resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=PEER_PROBE_TIMEOUT_S)
            ok = resp.status == health_pb2.HealthCheckResponse.SERVING
        if ok:
            self._seen[name] = self._clock.time_ns()
            self._failing.pop(name, None)
            if name in self._reported_down:
                self._reported_down.discard(name)
                log.info("peer %s is reachable again", name)
            self._metrics.peer_up.labels(name).set(1)
            await self._describe(name, describer, metadata)
        else:
            self._failing.setdefault(name, self._clock.monotonic())
            if self.down(name) and name not in self._reported_down:
                self._reported_down.add(name)
                self._metrics.peer_up.labels(name).set(0)
                log.warning(
                    "peer %s (%s) is unreachable: no health answer for %.0f s; the"
                    " groups it holds replicas of are short a member",
                    name,
                    self._nodes.address(name),
                    PEER_DOWN_AFTER_S,
                )

    async def _describe(
        self, name: str, stub: npbg.NodeServiceStub, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        """Record ``name``'s description; a failed call keeps the last one (the next round
        asks again), a description that breaks a rule is logged and not believed."""
        try:
            desc = await describe_peer(
                stub, asker=self._config.name, metadata=metadata, timeout_s=PEER_PROBE_TIMEOUT_S
            )
            self._descriptions.record(name, desc)
            self._known_peers.add(name)  # it ran with Raft data (cluster/repair/known_peers.py)
        except grpc.RpcError as exc:
            log.debug("peer %s did not describe itself: %s", name, exc.code())
        except InvalidArgumentError as exc:
            log.warning("peer %s described itself wrongly: %s", name, exc)
