"""raftstream.proto."""
