"""raftstream.chaos."""
