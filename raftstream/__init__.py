"""raftstream: a replicated stream store in the family of NATS JetStream.

The package root stays light: importing ``raftstream.engine`` or ``raftstream.raft`` must not
pull in grpc or asyncio, so the client SDK's names are loaded lazily on first use.
"""

from __future__ import annotations

from raftstream.errors import Code, RaftStreamError

__all__ = ["Code", "RaftStreamError"]
