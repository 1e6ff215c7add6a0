"""Raft transport: the Transport Protocol, a gRPC implementation and an in-memory twin."""

from raftstream.raft.transport.api import Inbound, MessageHandler, Transport, snapshot_failed
from raftstream.raft.transport.grpc_transport import GrpcTransport, GrpcTransportConfig
from raftstream.raft.transport.memory import MemoryNetwork, MemoryTransport

__all__ = [
    "GrpcTransport",
    "GrpcTransportConfig",
    "Inbound",
    "MemoryNetwork",
    "MemoryTransport",
    "MessageHandler",
    "Transport",
    "snapshot_failed",
]
