"""Forwarding a client API call to another node (the meta or a stream leader).

A node that receives a request only a leader can answer either forwards it here, one hop,
over the same public API the SDK uses, or answers NOT_LEADER with the leader's client
address. Forwarded: meta requests (create/update/delete streams and consumers, step-down,
peer removal: so a CLI pointed at any node works), publishes and acks (so ``PublishStream``
and ``AckStream`` work on whatever node the client picked). Not forwarded: reads and pull
fetches (the SDK follows the hint and talks to the leader directly).

No retries here: the one hop either answers or fails with the remote's typed error
(``from_rpc_error``), which the local servicer maps back, unchanged, to its caller; the SDK
retries. ``forwarded`` metadata marks the call so the remote never forwards it again (two
nodes that disagree about the leader would otherwise bounce a request between them).

Owned by the node's event loop. At most one channel per peer address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from raftstream.errors import NoLeaderError
from raftstream.proto.errors import from_rpc_error

__all__ = ["FORWARDED_KEY", "Forwarder", "was_forwarded"]

FORWARDED_KEY = "raftstream-forwarded"

R = TypeVar("R")


def was_forwarded(context: Any) -> bool:
    """True when the current call came from another node's forwarder."""
    md = context.invocation_metadata() or ()
    return any(k == FORWARDED_KEY for k, _ in md)


class Forwarder:
    """Channels to the other nodes' client API, keyed by address."""

    def __init__(self, *, channel_options: list[tuple[str, int]]) -> None:
        self._options = channel_options
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, addr: str) -> grpc.aio.Channel:
        """The channel to ``addr`` (made on first use, kept until ``close``)."""
        ch = self._channels.get(addr)
        if ch is None:
            ch = self._channels[addr] = grpc.aio.insecure_channel(addr, options=self._options)
        return ch

    async def unary(
        self,
        addr: str | None,
        method: str,
        request: Any,
        response_type: Callable[[bytes], R],
        *,
        timeout_s: float | None,
    ) -> R:
        """Call ``method`` (``/pkg.Service/Method``) on the node at ``addr``; its typed error
        on failure. ``addr`` None: NoLeaderError (no leader known to forward to)."""
        if addr is None:
            raise NoLeaderError("no leader known to forward the request to")
        call = self.channel(addr).unary_unary(
            method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type,
        )
        try:
            return await call(request, timeout=timeout_s, metadata=((FORWARDED_KEY, "1"),))  # type: ignore[no-any-return]
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()
