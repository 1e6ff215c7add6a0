"""Raft benchmarks over real gRPC on loopback (`make bench-raft`)."""
