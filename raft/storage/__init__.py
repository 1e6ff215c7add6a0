"""Raft log storage: the LogStorage Protocol, an LMDB implementation and an in-memory twin."""
