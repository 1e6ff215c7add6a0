"""Raft transport: the Transport Protocol, a gRPC implementation and an in-memory twin."""
