"""raftstream.raft."""
