"""Deterministic simulation of raftstream's Raft core (see sim.py)."""
