"""raftstream.audit."""
