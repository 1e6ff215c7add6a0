"""raftstream.cluster."""
