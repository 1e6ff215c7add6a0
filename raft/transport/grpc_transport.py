"""The gRPC transport (grpc.aio): one client stream per peer carrying batches of every group.

Outgoing: a ``_PeerLink`` per peer owns a channel, a bounded queue of batches and one task
that keeps a ``Send`` stream open, reopening it with tenacity backoff when it breaks
(messages queued meanwhile wait, up to the queue's limits; the oldest are dropped first).
Snapshots go on their own ``InstallSnapshot`` calls, in chunks of ``chunk_bytes_max``.

Incoming: the servicer (mountable on a server the caller owns, or on one this transport
starts) hands each batch, expanded into per-group messages, to the bound handler.

Message size limits are set on both sides (channel and server options) from one value,
``message_bytes_max``; batches are cut at ``batch_bytes_max``, well under it.

With ``tls`` (``raft/transport/tls.py``) every channel is mutual TLS with the node's
certificate, and the servicer refuses (PERMISSION_DENIED) any batch or snapshot whose
``src`` the caller's verified certificate does not name as a node: a client certificate of
the same CA, or a node speaking for another, gets nothing into a Raft group. Without it,
channels are plaintext and the servicer trusts ``src``; ``config.call_metadata`` (sent on
every outgoing call) is how a node without TLS proves it is one to a server that asks (the
node's node token, checked by ``cluster/security/auth.py`` before this servicer runs).

Everything here belongs to the event loop that created it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential_jitter

from raftstream.proto import raft_pb2 as pb
from raftstream.raft.errors import InvalidArgumentError, PermissionDeniedError, RaftError
from raftstream.raft.transport.api import Inbound, MessageHandler, Transport, snapshot_failed
from raftstream.raft.transport.convert import (
    SnapshotAssembler,
    from_batch,
    snapshot_chunks,
    to_batches,
)
from raftstream.raft.transport.tls import PeerTls, peer_node_names
from raftstream.raft.types import Message, MessageType

__all__ = ["SERVICE", "GrpcTransport", "GrpcTransportConfig"]

log = logging.getLogger(__name__)

SERVICE = "raftstream.raft.v1.Raft"


@dataclass(frozen=True, slots=True, kw_only=True)
class GrpcTransportConfig:
    # One limit for both ends of every call: what a peer may send is what we accept.
    message_bytes_max: int = 64 << 20
    batch_bytes_max: int = 4 << 20
    chunk_bytes_max: int = 1 << 20
    # Sent with every outgoing call (e.g. the node token a peer without TLS asks for).
    call_metadata: tuple[tuple[str, str], ...] = ()
    snapshot_bytes_max: int = 1 << 30
    # Per peer: batches waiting for the stream, by count and by encoded bytes.
    queue_batches_max: int = 1024
    queue_bytes_max: int = 64 << 20
    snapshots_inflight_max: int = 4  # per peer
    snapshot_timeout_ms: int = 60_000
    reconnect_backoff_initial_ms: int = 20
    reconnect_backoff_max_ms: int = 500

    def __post_init__(self) -> None:
        if not 0 < self.batch_bytes_max < self.message_bytes_max:
            raise InvalidArgumentError("batch_bytes_max", "must be in (0, message_bytes_max)")
        if not 0 < self.chunk_bytes_max < self.message_bytes_max:
            raise InvalidArgumentError("chunk_bytes_max", "must be in (0, message_bytes_max)")

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.message_bytes_max),
            ("grpc.max_receive_message_length", self.message_bytes_max),
            # gRPC's own reconnect backoff would otherwise grow to minutes: keep it short so
            # a restarted peer is reached within our own (tenacity) backoff.
            ("grpc.initial_reconnect_backoff_ms", self.reconnect_backoff_initial_ms),
            ("grpc.min_reconnect_backoff_ms", self.reconnect_backoff_initial_ms),
            ("grpc.max_reconnect_backoff_ms", self.reconnect_backoff_max_ms),
        ]

    def server_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.message_bytes_max),
            ("grpc.max_receive_message_length", self.message_bytes_max),
        ]


class _PeerLink:
    """The outgoing side towards one peer: its channel, queue, stream task and snapshots."""

    def __init__(self, owner: GrpcTransport, peer: str, address: str) -> None:
        self.peer = peer
        self.address = address
        self._owner = owner
        self._cfg = owner.config
        options = self._cfg.channel_options()
        tls = owner.tls
        self._channel = (
            grpc.aio.insecure_channel(address, options=options)
            if tls is None
            else grpc.aio.secure_channel(address, tls.channel_credentials(), options=options)
        )
        self._send_rpc = self._channel.stream_unary(
            f"/{SERVICE}/Send",
            request_serializer=pb.Batch.SerializeToString,
            response_deserializer=pb.SendAck.FromString,
        )
        self._install_rpc = self._channel.stream_unary(
            f"/{SERVICE}/InstallSnapshot",
            request_serializer=pb.SnapshotChunk.SerializeToString,
            response_deserializer=pb.SnapshotAck.FromString,
        )
        self._queue: collections.deque[tuple[pb.Batch, int]] = collections.deque()
        self._queue_bytes = 0
        self._wake = asyncio.Event()
        self._snapshots: set[asyncio.Task[None]] = set()
        self.dropped_batches = 0
        self._task = asyncio.create_task(self._run(), name=f"raft-link-{peer}")

    def enqueue(self, batch: pb.Batch) -> None:
        size = batch.ByteSize()
        self._queue.append((batch, size))
        self._queue_bytes += size
        while len(self._queue) > self._cfg.queue_batches_max or (
            self._queue_bytes > self._cfg.queue_bytes_max and len(self._queue) > 1
        ):
            # Drop the oldest: Raft resends what matters, and newer messages supersede.
            _, old = self._queue.popleft()
            self._queue_bytes -= old
            self.dropped_batches += 1
        self._wake.set()

    async def _next_batch(self) -> pb.Batch:
        """The oldest queued batch, with the ones queued after it merged in while the result
        stays within ``batch_bytes_max``: one stream write instead of several (each costs
        the loop far more than the bytes do). Merging keeps every group's messages in
        order; heartbeats of the earlier batch then follow the later one's messages, a
        reordering the receiver tolerates as from the network (see convert.from_batch).
        Nothing is merged after quiesce notices: they must follow what preceded them and
        nothing sent later."""
        while not self._queue:
            self._wake.clear()
            await self._wake.wait()
        batch, size = self._queue.popleft()
        self._queue_bytes -= size
        while self._queue and not batch.quiesce:
            more, more_size = self._queue[0]
            if size + more_size > self._cfg.batch_bytes_max:
                break
            self._queue.popleft()
            self._queue_bytes -= more_size
            batch.MergeFrom(more)
            size += more_size
        return batch

    async def _run(self) -> None:
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(Exception),
                reraise=True,  # cancellation (not an Exception) ends the link as itself
                wait=wait_exponential_jitter(
                    multiplier=self._cfg.reconnect_backoff_initial_ms / 1000,
                    max=self._cfg.reconnect_backoff_max_ms / 1000,
                    jitter=self._cfg.reconnect_backoff_initial_ms / 1000,
                ),
            )
            # A stream that carried batches and then broke ends the attempt loop normally,
            # so the next outage starts again from the initial backoff.
            async for attempt in retrying:
                with attempt:
                    await self._stream_once()

    async def _stream_once(self) -> None:
        """Write batches on one Send stream until it breaks. Raises if it broke before it
        carried anything (the peer is down: back off); returns if it had worked."""
        call = self._send_rpc(metadata=self._cfg.call_metadata)
        wrote = False
        try:
            while True:
                batch = await self._next_batch()
                await call.write(batch)
                wrote = True
        except Exception as exc:
            log.debug("raft stream to %s (%s) broke: %r", self.peer, self.address, exc)
            call.cancel()
            if not wrote:
                raise

    def send_snapshot(self, m: Message) -> None:
        if len(self._snapshots) >= self._cfg.snapshots_inflight_max:
            self._owner.deliver(Inbound(self._owner.node_id, [snapshot_failed(m)]))
            return
        task = asyncio.create_task(self._stream_snapshot(m))
        self._snapshots.add(task)
        task.add_done_callback(self._snapshots.discard)

    async def _stream_snapshot(self, m: Message) -> None:
        accepted = False
        try:
            chunks = snapshot_chunks(m, self._cfg.chunk_bytes_max)
            ack = await self._install_rpc(
                chunks,
                timeout=self._cfg.snapshot_timeout_ms / 1000,
                metadata=self._cfg.call_metadata,
            )
            accepted = ack.accepted
        except Exception as exc:  # the core retries: it needs to know, not the reason
            log.info("raft snapshot of %s to %s failed: %r", m.group, self.peer, exc)
        if not accepted:
            self._owner.deliver(Inbound(self._owner.node_id, [snapshot_failed(m)]))

    async def close(self) -> None:
        tasks = [self._task, *self._snapshots]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._channel.close()


class GrpcTransport:
    """Transport over gRPC (see ``Transport`` for the contract).

    ``peers`` maps node ids to ``host:port``. Serve the Raft service either by mounting
    ``rpc_handler()`` on a server you own (built with ``config.server_options()``, and with
    ``tls.server_credentials()`` when ``tls`` is set), or with ``serve(address)``, which
    starts a server owned and stopped by this transport. ``tls``: mutual TLS on every
    channel and the peer check on every incoming call (see the module docstring).
    """

    def __init__(
        self,
        node_id: str,
        *,
        peers: Mapping[str, str] | None = None,
        config: GrpcTransportConfig | None = None,
        tls: PeerTls | None = None,
    ) -> None:
        self._node_id = node_id
        self.tls = tls
        self.config = config or GrpcTransportConfig()
        self._addresses: dict[str, str] = dict(peers or {})
        self._links: dict[str, _PeerLink] = {}
        self._unknown: set[str] = set()  # peers without an address, warned of once
        self._handler: MessageHandler | None = None
        self._server: Any = None
        self._closed = False

    @property
    def node_id(self) -> str:
        return self._node_id

    def bind(self, handler: MessageHandler) -> None:
        self._handler = handler

    def set_peer(self, node: str, address: str) -> None:
        """Add a peer or change its address (its current stream, if any, is dropped)."""
        self._addresses[node] = address
        self._unknown.discard(node)
        link = self._links.pop(node, None)
        if link is not None and link.address != address:
            asyncio.get_running_loop().create_task(link.close())
        elif link is not None:
            self._links[node] = link

    def remove_peer(self, node: str) -> None:
        """Forget a peer's address and drop its stream, if any: nothing is sent to it from
        now on (``send`` drops it, with a warning the first time), until ``set_peer`` gives
        an address again."""
        self._addresses.pop(node, None)
        link = self._links.pop(node, None)
        if link is not None:
            asyncio.get_running_loop().create_task(link.close())

    def deliver(self, inbound: Inbound) -> bool:
        """Hand an incoming batch to the bound handler; False if none is bound."""
        if self._closed or self._handler is None:
            return False
        self._handler(inbound)
        return True

    def _link(self, peer: str) -> _PeerLink | None:
        link = self._links.get(peer)
        if link is None:
            address = self._addresses.get(peer)
            if address is None:
                if peer not in self._unknown:  # (once: a forgotten node may still call)
                    self._unknown.add(peer)
                    log.warning("raft: no address for peer %s; messages dropped", peer)
                return None
            link = self._links[peer] = _PeerLink(self, peer, address)
        return link

    def send(
        self, peer: str, messages: Sequence[Message], quiesce: Sequence[tuple[str, int]] = ()
    ) -> None:
        if self._closed:
            return
        link = self._link(peer)
        if link is None:
            return
        plain = [m for m in messages if m.type != MessageType.SNAPSHOT]
        for batch in to_batches(self._node_id, peer, plain, self.config.batch_bytes_max, quiesce):
            link.enqueue(batch)
        for m in messages:
            if m.type == MessageType.SNAPSHOT:
                link.send_snapshot(m)

    # -- receiving --
    def rpc_handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Send": grpc.stream_unary_rpc_method_handler(
                    self._on_send,
                    request_deserializer=pb.Batch.FromString,
                    response_serializer=pb.SendAck.SerializeToString,
                ),
                "InstallSnapshot": grpc.stream_unary_rpc_method_handler(
                    self._on_install_snapshot,
                    request_deserializer=pb.SnapshotChunk.FromString,
                    response_serializer=pb.SnapshotAck.SerializeToString,
                ),
            },
        )

    def _allowed_sources(self, context: Any) -> frozenset[str] | None:
        """The ``src`` names the caller may use: those its verified certificate names as
        nodes; None (any) without TLS. Plaintext calls never get this far with TLS: the
        port refuses them at the handshake."""
        return None if self.tls is None else peer_node_names(context)

    async def _refuse(self, context: Any, src: str, allowed: frozenset[str]) -> NoReturn:
        """End the call with PERMISSION_DENIED: its certificate passed the CA check, so
        this is a misconfiguration or a client probing the Raft service (say which, without
        echoing the certificate)."""
        role = "a node certificate for other names" if allowed else "not a node certificate"
        log.warning("raft: refused traffic claiming to be from %r: %s", src, role)
        await _abort(context, PermissionDeniedError(f"raft traffic from {src!r} refused: {role}"))

    async def _on_send(self, requests: AsyncIterator[pb.Batch], context: Any) -> pb.SendAck:
        count = 0
        allowed = self._allowed_sources(context)
        async for batch in requests:
            if allowed is not None and batch.src not in allowed:
                await self._refuse(context, batch.src, allowed)
            count += 1
            if batch.dst != self._node_id:
                continue  # meant for whoever had this address before us
            try:
                inbound = from_batch(batch)
            except InvalidArgumentError as exc:
                log.warning("raft: dropped a batch from %s: %s", batch.src, exc)
                continue
            self.deliver(inbound)
        return pb.SendAck(batches=count)

    async def _on_install_snapshot(
        self, requests: AsyncIterator[pb.SnapshotChunk], context: Any
    ) -> pb.SnapshotAck:
        assembler = SnapshotAssembler(self._node_id, self.config.snapshot_bytes_max)
        allowed = self._allowed_sources(context)
        async for chunk in requests:
            # Only the first chunk names the sender; the check runs before anything is kept.
            if allowed is not None and chunk.src not in allowed:
                await self._refuse(context, chunk.src, allowed)
            allowed = None
            if not assembler.add(chunk):
                return pb.SnapshotAck(accepted=False)
        m = assembler.finish()
        return pb.SnapshotAck(accepted=m is not None and self.deliver(Inbound(m.src, [m])))

    async def serve(self, address: str) -> int:
        """Start a server for the Raft service on ``address``; return the bound port."""
        server = grpc.aio.server(options=self.config.server_options())
        server.add_generic_rpc_handlers((self.rpc_handler(),))
        if self.tls is None:
            port = int(server.add_insecure_port(address))
        else:
            port = int(server.add_secure_port(address, self.tls.server_credentials()))
        await server.start()
        self._server = server
        return port

    async def close(self) -> None:
        self._closed = True
        links, self._links = list(self._links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None


def _conforms(transport: GrpcTransport) -> Transport:
    """Static check (mypy) that GrpcTransport implements the Transport Protocol."""
    return transport


async def _abort(context: Any, exc: RaftError) -> NoReturn:
    """End the call with ``exc``'s status code and message. The Raft service answers only
    peers' transports (which log it), so no rich details: the client API's error details
    are the application's business, not this library's."""
    await context.abort(grpc.StatusCode[exc.code], exc.message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover
