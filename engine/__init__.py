"""raftstream.engine."""
