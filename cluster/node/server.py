"""The node's gRPC server: every service on one port, its interceptors, and its health.

One ``grpc.aio`` server on ``listen`` serves the client API (``raftstream.v1``), the Raft
service (``raftstream.raft.v1``, from ``raft/transport``), the repair and node services,
grpc health checking and server reflection, with message sizes bounded by
``limits.grpc_message_bytes_max`` and every client request checked, and put under a
deadline, by ``cluster/security/limits.py``. With ``[tls]`` the port speaks TLS only and requires a
CA-signed certificate from every caller (docs/tls.md).

Health: the standard gRPC health service answers for ``""`` (the process serves its API:
liveness) and for ``READY_SERVICE`` (readiness: ``cluster/node/monitor.py``).
Owned by the node's event loop.
"""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raftstream.cluster.common.metrics import LatencyInterceptor, NodeMetrics
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.node.process import cannot_listen
from raftstream.cluster.repair.repair import RepairGate, RepairServicer
from raftstream.cluster.security.auth import Authenticator, AuthInterceptor, NodeCallsInterceptor
from raftstream.cluster.security.limits import LimitsInterceptor
from raftstream.cluster.services.cluster import ClusterServicer
from raftstream.cluster.services.consume import ConsumeServicer
from raftstream.cluster.services.consumers import ConsumerServicer
from raftstream.cluster.services.context import ServiceContext
from raftstream.cluster.services.node import NodeServicer
from raftstream.cluster.services.publish import PublishServicer
from raftstream.cluster.services.streams import StreamServicer
from raftstream.errors import InvariantError
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.raft.transport.tls import PeerTls

__all__ = ["READY_SERVICE", "NodeServer"]

READY_SERVICE = "raftstream.ready"  # health service: SERVING while a meta leader is known
_SERVICE_NAMES = (
    "raftstream.v1.StreamService",
    "raftstream.v1.ConsumerService",
    "raftstream.v1.PublishService",
    "raftstream.v1.ConsumeService",
    "raftstream.v1.ClusterService",
    "raftstream.raft.v1.Raft",
    "raftstream.node.v1.NodeService",
)


class NodeServer:
    """The node's gRPC server (module docstring), built and started by ``start``."""

    def __init__(self, *, config: NodeConfig, metrics: NodeMetrics) -> None:
        self._config = config
        self._metrics = metrics
        self._tls: PeerTls | None = None
        self.server: Any = None  # once built: ``stop`` stops it from then on
        self.health: health.aio.HealthServicer | None = None
        self.bound_port = 0

    async def start(
        self,
        *,
        ctx: ServiceContext,
        gate: RepairGate,
        node_servicer: NodeServicer,
        raft_handler: grpc.GenericRpcHandler,
        tls: PeerTls | None,
        options: list[tuple[str, int]],
    ) -> None:
        """Build the server and start it on ``listen``; ``OSError`` when the port cannot
        be bound (the server built is left for ``abandon``). ``gate``: the repair gate (no
        answers while repaired or checking whether the node lost its data); ``tls``: the
        node's TLS (None: plaintext); ``options``: the channel options both the server and
        the node's channels use (``cluster/security/limits.py``'s ``server_options``)."""
        self._tls = tls
        interceptors: tuple[Any, ...] = (LatencyInterceptor(self._metrics), gate)
        auth_cfg = self._config.auth
        auth = None if auth_cfg is None else Authenticator(auth_cfg)
        mtls = tls is not None
        if auth is not None or mtls:  # Raft, repair, descriptions: nodes only
            interceptors = (*interceptors, NodeCallsInterceptor(authenticator=auth, tls=mtls))
        if auth is not None:  # who calls: resolved once per call, refused early
            interceptors = (*interceptors, AuthInterceptor(auth, node_certificates=mtls))
        # Limits after latency (a refused request is observed with its status code) and
        # after authentication (an unknown caller learns nothing about request rules).
        interceptors = (*interceptors, LimitsInterceptor(self._config.limits))
        # No SO_REUSEPORT (gRPC's default on Linux): a second node on a taken port must
        # fail, not share it.
        server_opts = [*options, ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=server_opts, interceptors=interceptors)
        pbg.add_StreamServiceServicer_to_server(StreamServicer(ctx), server)
        pbg.add_ConsumerServiceServicer_to_server(ConsumerServicer(ctx), server)
        pbg.add_PublishServiceServicer_to_server(PublishServicer(ctx), server)
        pbg.add_ConsumeServiceServicer_to_server(ConsumeServicer(ctx), server)
        pbg.add_ClusterServiceServicer_to_server(ClusterServicer(ctx), server)
        rpbg.add_RepairServiceServicer_to_server(RepairServicer(ctx), server)
        npbg.add_NodeServiceServicer_to_server(node_servicer, server)
        server.add_generic_rpc_handlers((raft_handler,))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = (
            *_SERVICE_NAMES,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, server)
        self.server = server  # from here on ``start`` stops it if anything fails
        await self._bind(server)
        await server.start()

    async def _bind(self, server: Any) -> None:
        listen = str(self._config.listen)
        try:
            if self._tls is None:
                self.bound_port = int(server.add_insecure_port(listen))
            else:
                creds = self._tls.server_credentials()
                self.bound_port = int(server.add_secure_port(listen, creds))
        except RuntimeError:  # gRPC's "Failed to bind", naming no cause
            self.bound_port = 0
        if self.bound_port == 0:
            raise cannot_listen(listen)

    def health_servicer(self) -> health.aio.HealthServicer:
        h = self.health
        if h is None:
            raise InvariantError("the health service starts with the server")
        return h

    async def set_health(self, service: str, serving: bool) -> None:
        """Set ``service``'s health status (``""``: liveness, ``READY_SERVICE``)."""
        status = health_pb2.HealthCheckResponse
        await self.health_servicer().set(service, status.SERVING if serving else status.NOT_SERVING)

    async def stop(self, grace_s: float) -> None:
        """Graceful: health goes NOT_SERVING, the server stops taking calls and those in
        flight get ``grace_s``."""
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(grace=grace_s)

    async def abandon(self) -> None:
        """A start that failed: stop the server built, if any, at once (left to the garbage
        collector, it would print a traceback at exit)."""
        if self.server is not None:
            await self.server.stop(None)
