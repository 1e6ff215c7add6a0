"""raftstream.bench."""
