"""Forwarding a client API call to another node (the meta or a stream leader).

A node that receives a request only a leader can answer either forwards it here, one hop,
over the same public API the SDK uses, or answers NOT_LEADER with the leader's client
address. Forwarded: meta requests (create/update/delete streams and consumers, step-down,
peer removal: so a CLI pointed at any node works), publishes and acks (so ``PublishStream``
and ``AckStream`` work on whatever node the client picked). Not forwarded: reads and pull
fetches (the SDK follows the hint and talks to the leader directly).

No retries here: the one hop either answers or fails with the remote's typed error
(``from_rpc_error``), which the local servicer maps back, unchanged, to its caller; the SDK
retries. One exception to "unchanged": when gRPC fails the hop before sending anything (it
could not connect to the leader's node, e.g. one restarted a moment ago), the caller gets
NO_LEADER, which says nothing was applied, so the SDK retries even a publish without a
msg_id (``_not_sent``; the SDK classifies its own calls the same way, ``raftstream/_conn.py``).
Answered as UNAVAILABLE it would be "outcome unknown", and such a publish is not retried.
``forwarded`` metadata marks the call so the remote never forwards it again (two nodes that
disagree about the leader would otherwise bounce a request between them).
A forwarded call keeps the caller's identity: it carries the caller's own credentials
(``cluster/security/auth.py``), which the remote resolves as it would the client's. A publish relay
is shared by the calls of one RESOLVED caller (account, user, permissions), whatever the
spelling of their credentials: keyed by the raw ``authorization`` text, one password
written in many letter cases and spacings opened a relay (a streaming call on the leader's
node, counted against its ``streaming_calls_max``) per spelling, each kept forever (issue
39, finding 4). A relay with nothing in flight for ``relay_idle_s`` ends its call.

Owned by the node's event loop. At most one channel per peer address; with the node's
``credentials`` (its mutual TLS, when configured) on every one of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc

from raftstream.cluster.security.auth_values import Permissions, caller
from raftstream.errors import (
    LimitError,
    NoLeaderError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import calls
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_error_message, from_rpc_error

__all__ = ["FORWARDED_KEY", "Forwarder", "PublishRelay", "take_batch", "was_forwarded"]

log = logging.getLogger(__name__)

RELAY_PENDING_MSGS_MAX = 65_536  # publishes relayed to one node and not answered yet
RELAY_BATCH_MSGS_MAX = 1024  # requests per PublishBatch written to the leader's node
# Bytes per PublishBatch (one request more only when alone): below every node's gRPC message
# cap (``limits.grpc_message_bytes_max``, 4 MiB at least; one request is at most a payload of
# ``payload_bytes_max`` plus its headers). 1,024 publishes of 1 MiB made a 132 MB message that
# gRPC refused, breaking the relay and every publish in it (a user review).
RELAY_BATCH_BYTES_MAX = 2 * 1024 * 1024
# A relay with no publish queued or unanswered this long ends its call on the leader's node
# (where it holds one of ``streaming_calls_max`` places); the next publish opens another.
RELAY_IDLE_S = 10.0

FORWARDED_KEY = "raftstream-forwarded"

R = TypeVar("R")


# gRPC's details when a call failed before anything was sent: no connection could be made.
_NOT_SENT_DETAILS = "failed to connect to all addresses"


def _not_sent(err: grpc.RpcError, addr: str) -> RaftStreamError | None:
    """NoLeaderError when gRPC failed ``err``'s call to ``addr`` before sending anything
    (module docstring); None when it may have been sent."""
    if err.code() == grpc.StatusCode.UNAVAILABLE and _NOT_SENT_DETAILS in (err.details() or ""):
        return NoLeaderError(f"cannot reach the leader's node at {addr}; nothing was sent")
    return None


def _refused(exc: RaftStreamError, addr: str) -> RaftStreamError:
    """What a publish relayed on a call ``addr`` refused as a whole fails with (nothing was
    sent): NOT_LEADER or NO_LEADER as it came (its hint is the caller's to follow), any
    other refusal (``streaming_calls_max``) as NO_LEADER naming it, so the client sends
    the publish again, as when the node cannot be reached (``_not_sent``), rather than
    taking a limit of a node it never called as its own."""
    if isinstance(exc, NotLeaderError | NoLeaderError):
        return exc
    return NoLeaderError(
        f"the leader's node at {addr} refused the relay ({exc.reason}: {exc.message});"
        " nothing was sent"
    )


def _forward_metadata() -> tuple[tuple[str, str], ...]:
    """The forwarded mark and the current caller's credentials (none without auth)."""
    return ((FORWARDED_KEY, "1"), *caller().credentials)


def was_forwarded(context: Any) -> bool:
    """True when the current call came from another node's forwarder."""
    md = context.invocation_metadata() or ()
    return any(k == FORWARDED_KEY for k, _ in md)


_RelayKey = tuple[str, str, str | None, Permissions]  # address, account, user, permissions


class Forwarder:
    """Channels to the other nodes' client API, keyed by address; ``credentials``: TLS
    credentials for them (None: plaintext); publish relays per address and caller, each
    ending its call once idle ``relay_idle_s``."""

    def __init__(
        self,
        *,
        channel_options: list[tuple[str, int]],
        credentials: grpc.ChannelCredentials | None = None,
        relay_idle_s: float = RELAY_IDLE_S,
    ) -> None:
        self._options = channel_options
        self._credentials = credentials
        self._relay_idle_s = relay_idle_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        # Keyed by address and the resolved caller: a relay acts for one identity, however
        # its credentials are spelt (module docstring).
        self._relays: dict[_RelayKey, PublishRelay] = {}

    def channel(self, addr: str) -> grpc.aio.Channel:
        """The channel to ``addr`` (made on first use, kept until ``close``)."""
        ch = self._channels.get(addr)
        if ch is None:
            creds, opts = self._credentials, self._options
            ch = self._channels[addr] = (
                grpc.aio.insecure_channel(addr, options=opts)
                if creds is None
                else grpc.aio.secure_channel(addr, creds, options=opts)
            )
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
            return await call(request, timeout=timeout_s, metadata=_forward_metadata())  # type: ignore[no-any-return]
        except grpc.RpcError as err:
            raise (_not_sent(err, addr) or from_rpc_error(err)) from None

    def relay(self, addr: str) -> PublishRelay:
        """The live publish relay to ``addr`` for the current caller (made on first use,
        remade after a break or once it ended idle). Callers resolved to the same account,
        user and permissions share one, which sends the first one's credentials: each
        spelling of them resolved to that identity here, and does on the leader's node."""
        who = caller()
        key = (addr, who.account, who.user, who.permissions)
        r = self._relays.get(key)
        if r is None or r.broken:
            self._drop_ended()
            r = self._relays[key] = PublishRelay(
                self.channel(addr), _forward_metadata(), addr=addr, idle_s=self._relay_idle_s
            )
        return r

    def relays_open(self) -> int:
        """The relays whose call is open now (not broken nor ended idle)."""
        return sum(1 for r in self._relays.values() if not r.broken)

    def _drop_ended(self) -> None:
        """Forget the relays whose call is over (their reader finished): the map holds at
        most one per address and caller, plus those still ending."""
        for key in [k for k, r in self._relays.items() if r.ended]:
            del self._relays[key]

    async def close(self) -> None:
        for r in self._relays.values():
            await r.close()
        self._relays.clear()
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()


_BREAK_LOGGED: dict[str, float] = {}  # peer address -> monotonic time of the last INFO line
RELAY_BREAK_LOG_EVERY_S = 30.0


def _log_break(addr: str, why: str) -> None:
    """A relay to a peer that is down breaks at every forwarded publish: say so at INFO
    once per peer per ``RELAY_BREAK_LOG_EVERY_S`` (the node's WARNING about the unreachable
    peer says the rest), at DEBUG between."""
    now = time.monotonic()
    if now - _BREAK_LOGGED.get(addr, -RELAY_BREAK_LOG_EVERY_S) >= RELAY_BREAK_LOG_EVERY_S:
        _BREAK_LOGGED[addr] = now
        log.info("publish relay to %s broke: %s", addr or "?", why)
    else:
        log.debug("publish relay to %s broke: %s", addr or "?", why)


def take_batch(
    queue: collections.deque[tuple[pb.PublishRequest, int]],
) -> list[pb.PublishRequest]:
    """The next requests of ``queue`` (request, its size) for one PublishBatch: up to
    ``RELAY_BATCH_MSGS_MAX`` of them and ``RELAY_BATCH_BYTES_MAX`` bytes (at least one)."""
    out: list[pb.PublishRequest] = []
    size = 0
    while queue and len(out) < RELAY_BATCH_MSGS_MAX:
        req, n = queue[0]
        if out and size + n > RELAY_BATCH_BYTES_MAX:
            break
        queue.popleft()
        out.append(req)
        size += n
    return out


class PublishRelay:
    """One ``PublishStream`` call to another node (marked forwarded), shared by every
    publish this node relays there: the pipelined path for ``PublishStream`` clients whose
    stream is led elsewhere (a unary hop per message would cap throughput at the hop's
    latency). Requests get relay-local ids; each result resolves its future. When the call
    breaks every unanswered future fails with UnavailableError: the outcome is unknown (a
    msg_id makes a retry safe); with NoLeaderError instead when the call never connected, so
    nothing was sent (module docstring). Nothing is written before the leader's node accepts
    the call (``raftstream.proto.calls``), so a call it refuses as a whole (NOT_LEADER while
    under repair, ``streaming_calls_max``) fails every relayed publish as not sent
    (``_refused``). With nothing queued or unanswered for ``idle_s`` the relay ends its call
    (``broken`` from then on). Owned by the node's event loop.
    """

    def __init__(
        self,
        channel: grpc.aio.Channel,
        metadata: tuple[tuple[str, str], ...],
        *,
        addr: str = "",
        idle_s: float = RELAY_IDLE_S,
    ) -> None:
        self._addr = addr
        self._idle_s = idle_s
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[pb.PubAck]] = {}
        self._queue: collections.deque[tuple[pb.PublishRequest, int]] = collections.deque()
        self._wake = asyncio.Event()
        self.broken = False
        self._accepted = False
        stub = pbg.PublishServiceStub(channel)
        self._call = stub.PublishStream(self._requests(), metadata=metadata)
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def submit(self, req: pb.PublishRequest) -> asyncio.Future[pb.PubAck]:
        """Relay ``req``; the future resolves to the remote PubAck or its typed error."""
        if self.broken:
            raise UnavailableError("publish relay broken")
        if len(self._waiting) >= RELAY_PENDING_MSGS_MAX:
            raise LimitError("too many relayed publishes pending", limit="relay_pending_msgs_max")
        rid = next(self._ids)
        relayed = pb.PublishRequest()
        relayed.CopyFrom(req)
        relayed.id = rid
        fut: asyncio.Future[pb.PubAck] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self._queue.append((relayed, relayed.ByteSize()))
        self._wake.set()
        return fut

    async def _requests(self) -> AsyncIterator[pb.PublishBatch]:
        if not await calls.accepted(self._call):
            return  # refused: _read fails every relayed publish with the status
        self._accepted = True
        while not self.broken:
            try:
                async with asyncio.timeout(self._idle_s):
                    await self._wake.wait()
            except TimeoutError:
                if not self._waiting and not self._queue:
                    # Idle: broken first, so no publish joins a call that is ending (the
                    # next one makes a new relay); then the half-close ends the call and
                    # frees its place on the leader's node.
                    self.broken = True
                    return
                continue
            self._wake.clear()
            while self._queue:
                yield pb.PublishBatch(requests=take_batch(self._queue))

    async def _read(self) -> None:
        unsent: RaftStreamError | None = None
        try:
            async for batch in self._call:
                for r in batch.results:
                    fut = self._waiting.pop(r.id, None)
                    if fut is None or fut.done():
                        continue
                    if r.HasField("ack"):
                        fut.set_result(r.ack)
                    else:
                        fut.set_exception(from_error_message(r.error))
        except grpc.RpcError as err:
            _log_break(self._addr, str(from_rpc_error(err)))
            unsent = _not_sent(err, self._addr)
            if unsent is None and not self._accepted:
                unsent = _refused(from_rpc_error(err), self._addr)
        except RaftStreamError as exc:
            _log_break(self._addr, repr(exc))
        finally:
            self._break(unsent)

    @property
    def ended(self) -> bool:
        """The call is over and its answers read (broken, and its reader finished)."""
        return self.broken and self._reader.done()

    def _break(self, unsent: RaftStreamError | None = None) -> None:
        self.broken = True
        self._wake.set()
        exc = unsent or UnavailableError(
            "the relay to the stream leader broke; the outcome is unknown"
        )
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(exc)
        self._waiting.clear()

    async def close(self) -> None:
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        self._break()
