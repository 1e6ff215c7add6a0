"""Raft transport: the Transport Protocol, a gRPC implementation and an in-memory twin."""

from raftstream.raft.transport.api import Inbound, MessageHandler, Transport, snapshot_failed
from raftstream.raft.transport.grpc_transport import GrpcTransport, GrpcTransportConfig
from raftstream.raft.transport.memory import MemoryNetwork, MemoryTransport
from raftstream.raft.transport.tls import NODE_URI_PREFIX, PeerTls, peer_node_names

__all__ = [
    "NODE_URI_PREFIX",
    "GrpcTransport",
    "GrpcTransportConfig",
    "Inbound",
    "MemoryNetwork",
    "MemoryTransport",
    "MessageHandler",
    "PeerTls",
    "Transport",
    "peer_node_names",
    "snapshot_failed",
]
