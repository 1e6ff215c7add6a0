"""Connections of one client: gRPC channels, leader hints, and the retrying call.

A ``Router`` belongs to the event loop of the client that made it; nothing here is
thread-safe. It keeps one ``grpc.aio`` channel per server address (the seed servers plus
leaders learned from hints, at most ``channels_max``) and, per route (a stream's name), the
address of the leader the last NOT_LEADER hint named (at most ``leader_hints_max`` routes,
least recently learned dropped first).

``call`` runs one RPC with tenacity: every attempt gets the time left of the caller's
timeout as its gRPC deadline, and attempts stop when that time is spent. What is retried:

- NOT_LEADER and NO_LEADER: the server refused before applying anything, so a retry is
  safe for every call. A NOT_LEADER hint (``leader_addr``) sends the next attempt there.
- a server we could not connect to (nothing was sent): the next attempt tries the next one.
  A hinted leader, or a seed when there are others, is given up as soon as its connection
  is refused (a leader just killed: the seeds know the new one); a lone seed is waited for
  up to ``connect_timeout_s`` (it may be restarting). The wait to connect does not count in
  what the next attempt needs left (below).
- any other retriable error (UNAVAILABLE mid-call, a server-side timeout) only when the call
  is ``idempotent``: such a failure is ambiguous, the request may have been applied.

The last error is raised, typed (``raftstream.errors``), when attempts stop (a last attempt
that could not connect gives way to an earlier NOT_LEADER/NO_LEADER; a timed-out one names
it, see ``_telling``). Waits between
attempts grow from 10 ms to at most ``RETRY_WAIT_MAX_S`` (100 ms): during an election every
attempt meets NO_LEADER, and a longer wait would be added whole to the failover a client
sees (with 500 ms, a 0.6 s election became a 1.2 s failover in the chaos runs). An attempt
refused by a live node costs it little. A retry starts only with as much of the timeout
left as the attempt before it took, and at least ``ATTEMPT_TIME_MIN_S`` (50 ms): a last
attempt with less could only time out, and its "deadline exceeded" would hide the real
cause (with a quorum lost, a node takes ~0.2 s to find no leader to forward to, and each
attempt ends NO_LEADER until one is cut short).

A server that does not answer in time (the attempt's deadline passed: a node paused or cut
off by the network, which a connection does not notice) loses what routes to it: the
route's leader hint is dropped, and a seed server is passed over for the next one, so the
next call asks elsewhere and learns the new leader, as it would after the node's
connection was refused.

TLS: with ``credentials`` (``tls_credentials``) every channel is TLS, the server's
certificate checked against the given CA (else the system's roots) and the client's
certificate presented when one is given. A server that refuses the handshake (a plaintext
client, an untrusted CA, no or a foreign client certificate) is, to the client, a server it
cannot connect to: ``NotConnectedError`` (given up at once when there are other servers).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential,
    wait_random,
)

from raftstream import errors
from raftstream._args import check_seconds, check_servers
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import from_rpc_error

__all__ = ["NotConnectedError", "Router", "Stubs", "TlsSource", "not_sent", "tls_credentials"]

T = TypeVar("T")

MESSAGE_BYTES_MAX = 65 * 1024 * 1024 + 64 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    # Reconnect quickly after a node restarts: a client waits at most its timeout anyway.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # The largest message any node may send (its payload and headers ceilings, 64 MiB and
    # 1 MiB, and an envelope): a node's own limits are lower or equal.
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
)
RETRY_WAIT_INITIAL_S = 0.01
RETRY_WAIT_MAX_S = 0.1
ATTEMPT_TIME_MIN_S = 0.05  # a retry starts only with this much of the caller's timeout left
PEM_BYTES_MAX = 1 << 20  # a CA bundle, certificate chain or key file larger than this is refused

TlsSource = str | os.PathLike[str] | bytes
"""A PEM file's path, or its contents as bytes."""


def tls_credentials(
    *, ca: TlsSource | None = None, cert: TlsSource | None = None, key: TlsSource | None = None
) -> grpc.ChannelCredentials | None:
    """Channel credentials from PEM paths or bytes; None (plaintext) when none is given.

    ``ca``: the CA(s) that signed the servers' certificates (None: the system's roots).
    ``cert`` and ``key``: this client's certificate (chain) and key, both or neither (a
    cluster with TLS requires them). Raises ``InvalidArgumentError`` naming the argument
    (``tls_ca``, ``tls_cert``, ``tls_key``) when a file cannot be read, the pair is
    incomplete or the key is not the certificate's; the file's contents never appear in the
    error.
    """
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        missing = "tls_key" if key is None else "tls_cert"
        raise errors.InvalidArgumentError(missing, "tls_cert and tls_key go together")
    cert_pem, key_pem = _pem("tls_cert", cert), _pem("tls_key", key)
    if cert_pem is not None and key_pem is not None:
        _check_pair(cert_pem, key_pem)
    return grpc.ssl_channel_credentials(
        root_certificates=_pem("tls_ca", ca), private_key=key_pem, certificate_chain=cert_pem
    )


def _check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    """``InvalidArgumentError`` unless ``key_pem`` is the private key of ``cert_pem``'s first
    certificate (gRPC would only log "Invalid private key" and fail every connection)."""
    # Imported here: only clients that use TLS pay for it.
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        leaf = x509.load_pem_x509_certificates(cert_pem)[0]
    except ValueError:
        raise errors.InvalidArgumentError("tls_cert", "must hold a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):  # TypeError: encrypted (no way to ask for a passphrase)
        raise errors.InvalidArgumentError(
            "tls_key", "must hold an unencrypted PEM private key"
        ) from None
    if private.public_key() != leaf.public_key():
        raise errors.InvalidArgumentError("tls_key", "does not match the key of tls_cert")


def _pem(field: str, source: TlsSource | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    try:
        with open(source, "rb") as fh:
            data = fh.read(PEM_BYTES_MAX + 1)
    except OSError as exc:
        raise errors.InvalidArgumentError(
            field, f"cannot read {os.fspath(source)!r}: {exc.strerror}"
        ) from None
    if len(data) > PEM_BYTES_MAX or b"-----BEGIN " not in data:
        raise errors.InvalidArgumentError(field, f"{os.fspath(source)!r} is not a PEM file")
    return data


# gRPC fails a call with this text when no connection could be picked for it: the request
# never left the client, so a retry is safe even for a call that is not idempotent.
_NOT_SENT_DETAILS = "failed to connect to all addresses"


class Stubs:
    """The service stubs of one channel (made once per channel: stubs are not free)."""

    __slots__ = ("addr", "channel", "cluster", "consume", "consumers", "publish", "streams")

    def __init__(self, addr: str, channel: grpc.aio.Channel) -> None:
        self.addr = addr
        self.channel = channel
        self.streams = pbg.StreamServiceStub(channel)
        self.consumers = pbg.ConsumerServiceStub(channel)
        self.publish = pbg.PublishServiceStub(channel)
        self.consume = pbg.ConsumeServiceStub(channel)
        self.cluster = pbg.ClusterServiceStub(channel)


NotConnectedError = errors.NotConnectedError  # public in raftstream.errors


def _is_transport_failure(exc: errors.RaftStreamError) -> bool:
    """UNAVAILABLE without raftstream details: the connection, not a server's answer."""
    return type(exc) in (errors.UnavailableError, NotConnectedError)


def not_sent(err: grpc.RpcError, addr: str) -> NotConnectedError | None:
    """``NotConnectedError`` when gRPC failed ``err``'s call before sending it (the channel had
    lost its connection between ``connect`` and the call, e.g. the server just died)."""
    code, details = err.code(), err.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE and _NOT_SENT_DETAILS in details:
        return NotConnectedError(f"cannot connect to {addr}: {details}", addr=addr)
    return None


GRPC_DEADLINE = "Deadline Exceeded"  # the details of a call whose deadline gRPC enforced


def _telling(last: errors.RaftStreamError, refusal: errors.RaftStreamError | None) -> Exception:
    """What a call whose attempts stopped raises: its last error, unless that says less than
    an earlier server's refusal (NOT_LEADER/NO_LEADER: nothing applied). A last attempt
    that could not connect sent nothing, so the refusal stands instead; one that ran out of
    time is ambiguous and stays, naming the refusal before it (with a quorum lost, the
    servers left keep refusing, and a last attempt can find the one it reaches still
    waiting for a leader when its time runs out)."""
    if refusal is None or refusal is last:
        return last
    if isinstance(last, NotConnectedError):
        return refusal
    if isinstance(last, errors.DeadlineExceededError):
        last.message = f"{last.message} (before that: {refusal.reason}: {refusal.message})"
        last.details["before"] = refusal.reason
    return last


async def _ready(ch: grpc.aio.Channel, wait_s: float, *, give_up_on_failure: bool) -> bool:
    """Whether ``ch`` connects within ``wait_s``; with ``give_up_on_failure``, False as soon
    as a connection attempt fails (TRANSIENT_FAILURE: refused, or the handshake failed)
    rather than waiting through gRPC's reconnect backoff."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    state = ch.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if give_up_on_failure and state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            return False
        left = deadline - loop.time()
        if left <= 0:
            return False
        try:
            async with asyncio.timeout(left):
                await ch.wait_for_state_change(state)
        except TimeoutError:
            return False
        state = ch.get_state(try_to_connect=True)
    return True


class _Attempts:
    """The retry policy and bookkeeping of one ``Router.call`` (module docstring): its
    deadline, what the next attempt needs left (``room``: as long as the last attempt took,
    at least ``ATTEMPT_TIME_MIN_S``), where it goes, and the errors seen (the last attempt's,
    and the latest NOT_LEADER/NO_LEADER refusal)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        timeout_s: float,
        idempotent: bool,
        addr: str | None,
    ) -> None:
        self.loop = loop
        self.timeout_s = timeout_s
        self.deadline = loop.time() + timeout_s
        self.idempotent = idempotent
        self.next_addr = addr
        self.took = 0.0  # how long the last attempt took
        self.refusal: errors.RaftStreamError | None = None  # the latest NOT_LEADER/NO_LEADER
        self.previous: errors.RaftStreamError | None = None  # the last attempt's error
        self._backoff = wait_exponential(
            multiplier=RETRY_WAIT_INITIAL_S, max=RETRY_WAIT_MAX_S
        ) + wait_random(0, RETRY_WAIT_INITIAL_S)

    def retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=self.stop,
            wait=self.wait,
            retry=retry_if_exception(self.should_retry),
            reraise=True,
        )

    def should_retry(self, exc: BaseException) -> bool:
        if not isinstance(exc, errors.RaftStreamError):
            return False
        if isinstance(exc, errors.NotLeaderError | errors.NoLeaderError | NotConnectedError):
            return True
        return self.idempotent and exc.retriable

    def room(self) -> float:
        """What the next attempt needs left (module docstring)."""
        return max(ATTEMPT_TIME_MIN_S, self.took)

    def wait(self, state: RetryCallState) -> float:
        # The attempt after the sleep still gets its room (see ``stop``).
        return max(0.0, min(self._backoff(state), self.deadline - self.loop.time() - self.room()))

    def stop(self, state: RetryCallState) -> bool:
        # Too little left for another attempt: the last attempt's error is raised.
        return self.deadline - self.loop.time() < self.room()


def _name_deadline(last: errors.RaftStreamError, timeout_s: float) -> None:
    """gRPC's own words for a call past its deadline say neither whose answer was late nor
    after how long: say both."""
    if isinstance(last, errors.DeadlineExceededError) and last.message == GRPC_DEADLINE:
        where = last.details.get("addr", "the server")
        last.message = f"no answer from {where} within {timeout_s:g}s (the timeout)"


class Router:
    """The channels, leader hints and retry policy of one client (see the module docstring).

    ``servers`` are ``host:port`` seed addresses, tried in turn (``InvalidArgumentError``
    naming ``servers`` for a malformed one: ``_args.check_servers``). ``connect_timeout_s``
    bounds how long one attempt waits for a channel to connect before moving to the next
    server.
    ``credentials``: TLS for every channel (``tls_credentials``); None: plaintext.
    ``interceptors``: on every channel (``raftstream/_auth.py``: the caller's credentials).
    """

    def __init__(
        self,
        servers: Sequence[str],
        *,
        connect_timeout_s: float,
        channels_max: int = 64,
        leader_hints_max: int = 1024,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        self._credentials = credentials
        self._interceptors = list(interceptors) or None
        self._servers = list(dict.fromkeys(check_servers(servers)))
        self._current = 0
        self._connect_timeout_s = connect_timeout_s
        self._channels_max = max(channels_max, len(self._servers))
        self._leader_hints_max = leader_hints_max
        self._channels: OrderedDict[str, Stubs] = OrderedDict()
        self._hints: OrderedDict[str, str] = OrderedDict()
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()  # channel closes in progress
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first call

    def _check_usable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail at once, not after a timeout: a closed client (``ClientClosedError``, which
        is not retried), or a call from another event loop than the client's (gRPC's aio
        channels belong to one loop: the call would hang until its deadline, or fail with
        a bare RuntimeError)."""
        if self._closed:
            raise errors.ClientClosedError("the client is closed")
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise errors.PreconditionError(
                "the client belongs to another event loop: use it from the loop it was "
                "connected in (or connect a client per loop)"
            )

    @property
    def servers(self) -> tuple[str, ...]:
        return tuple(self._servers)

    def hint(self, route: str) -> str | None:
        """The leader address last hinted for ``route``, if any."""
        return self._hints.get(route)

    def target(self, route: str | None) -> str:
        """The address a call on ``route`` goes to now: its hinted leader, else the current
        server."""
        hinted = self._hints.get(route) if route is not None else None
        return hinted or self._servers[self._current]

    def _stubs(self, addr: str) -> Stubs:
        stubs = self._channels.get(addr)
        if stubs is None:
            if self._closed:
                raise errors.ClientClosedError("the client is closed")
            self._evict_channel()
            stubs = Stubs(addr, self._channel(addr))
            self._channels[addr] = stubs
        self._channels.move_to_end(addr)
        return stubs

    def _channel(self, addr: str) -> grpc.aio.Channel:
        icp = self._interceptors
        if self._credentials is None:
            return grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS, interceptors=icp)
        return grpc.aio.secure_channel(
            addr, self._credentials, options=CHANNEL_OPTIONS, interceptors=icp
        )

    def _evict_channel(self) -> None:
        """Close the least recently used non-seed channel when the pool is full."""
        if len(self._channels) < self._channels_max:
            return
        for addr in self._channels:
            if addr not in self._servers:
                stubs = self._channels.pop(addr)
                # Its calls fail UNAVAILABLE; the pool bound keeps a hint storm from leaking.
                task = asyncio.get_running_loop().create_task(stubs.channel.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
                return

    def learn(self, route: str | None, exc: errors.RaftStreamError) -> str | None:
        """Update hints from a failure; the address the next attempt should use, if any.
        ``call`` learns from its own attempts; an owner of a stream call (``Pipeline``)
        refused as a whole learns from the refusal with this."""
        if isinstance(exc, errors.NotLeaderError) and exc.leader_addr:
            if route is not None:
                self._hints[route] = exc.leader_addr
                self._hints.move_to_end(route)
                while len(self._hints) > self._leader_hints_max:
                    self._hints.popitem(last=False)
            return exc.leader_addr
        unanswered = isinstance(exc, errors.DeadlineExceededError)
        if route is not None and (unanswered or isinstance(exc, errors.UnavailableError)):
            self._hints.pop(route, None)
        if _is_transport_failure(exc) or (
            unanswered and exc.details.get("addr") == self._servers[self._current]
        ):
            self._current = (self._current + 1) % len(self._servers)
        return None

    async def connect(
        self, route: str | None, *, timeout_s: float, addr: str | None = None
    ) -> Stubs:
        """A connected channel: to ``addr``, else the hinted leader of ``route``, else the
        current server. Raises ``NotConnectedError`` (nothing sent) when it cannot connect
        within ``min(timeout_s, connect_timeout_s)``, and moves on to the next server."""
        self._check_usable(asyncio.get_running_loop())
        target = addr or self.target(route)
        stubs = self._stubs(target)
        ch = stubs.channel
        state = ch.get_state(try_to_connect=True)
        if state == grpc.ChannelConnectivity.READY:
            return stubs
        wait_s = min(timeout_s, self._connect_timeout_s)
        # A hinted leader, or one seed among several, that refuses the connection is given
        # up at once: another place can answer (a seed knows the new leader). A lone seed
        # is waited for: it may be restarting.
        elsewhere = target not in self._servers or len(self._servers) > 1
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE and elsewhere:
            wait_s = 0.0  # known down: try another server now rather than wait for a retry
        if not await _ready(ch, wait_s, give_up_on_failure=elsewhere):
            exc = NotConnectedError(f"cannot connect to {target}", addr=target)
            self.learn(route, exc)
            raise exc
        return stubs

    async def call(
        self,
        route: str | None,
        invoke: Callable[[Stubs, float], Awaitable[T]],
        *,
        timeout_s: float,
        idempotent: bool,
        addr: str | None = None,
    ) -> T:
        """Run ``invoke(stubs, time_left_s)`` with retries (see the module docstring).
        The first attempt goes to ``addr`` when given (a hint learned outside the call),
        else as ``connect`` chooses.

        ``invoke`` must pass ``time_left_s`` as the RPC's ``timeout``; it may raise
        ``grpc.RpcError`` or a typed error (hints are learned from either). Raises the typed error
        of the last attempt (``_telling``), or ``DeadlineExceededError`` if no attempt could
        start in time.
        """
        check_seconds("timeout", timeout_s)  # NaN, infinity and non-numbers too
        loop = asyncio.get_running_loop()
        self._check_usable(loop)
        attempts = _Attempts(loop, timeout_s=timeout_s, idempotent=idempotent, addr=addr)
        try:
            async for attempt in attempts.retrying():
                with attempt:
                    return await self._attempt(route, invoke, attempts)
        except errors.RaftStreamError as last:
            _name_deadline(last, timeout_s)
            raise _telling(last, attempts.refusal) from None
        raise errors.InvariantError("tenacity ended without a result")  # pragma: no cover

    async def _attempt(
        self, route: str | None, invoke: Callable[[Stubs, float], Awaitable[T]], at: _Attempts
    ) -> T:
        """One attempt of ``call``: connect (``connect``), then ``invoke`` with the time
        left. Records in ``at`` the time it took (from the end of the connect, or from a
        connect that failed: nothing was sent), its error and where the next one goes."""
        loop = at.loop
        started = loop.time()
        left_s = at.deadline - started
        if left_s <= 0:
            # The wait overran (a loaded machine): the last attempt's error says more than
            # a bare timeout.
            if at.previous is not None:
                raise at.previous
            raise errors.DeadlineExceededError(f"no answer within {at.timeout_s:.3f}s")
        try:
            try:
                stubs = await self.connect(route, timeout_s=left_s, addr=at.next_addr)
            except NotConnectedError:
                # Not the hinted address again: connect learnt where to go next. Nothing was
                # sent: the wait to connect is not what the next attempt needs left (``room``).
                at.next_addr = None
                started = loop.time()
                raise
            at.next_addr = None
            started = loop.time()  # the attempt's room: the call, not the connect
            return await self._invoke(route, invoke, stubs, at)
        except errors.RaftStreamError as exc:
            at.previous = exc
            raise
        finally:
            at.took = loop.time() - started

    async def _invoke(
        self,
        route: str | None,
        invoke: Callable[[Stubs, float], Awaitable[T]],
        stubs: Stubs,
        at: _Attempts,
    ) -> T:
        """``invoke`` on a connected channel; a failure is typed, and learnt from."""
        try:
            return await invoke(stubs, max(at.deadline - at.loop.time(), 0.001))
        except grpc.RpcError as err:
            exc = not_sent(err, stubs.addr) or from_rpc_error(err)
            self._failed(route, exc, stubs.addr, at)
            raise exc from None
        except errors.RaftStreamError as exc:  # invoke mapped it already
            self._failed(route, exc, stubs.addr, at)
            raise

    def _failed(
        self, route: str | None, exc: errors.RaftStreamError, addr: str, at: _Attempts
    ) -> None:
        exc.details.setdefault("addr", addr)
        if isinstance(exc, errors.NotLeaderError | errors.NoLeaderError):
            at.refusal = exc
        at.next_addr = self.learn(route, exc)

    async def close(self) -> None:
        """Close every channel; calls in flight fail with CANCELLED."""
        self._closed = True
        channels, self._channels = list(self._channels.values()), OrderedDict()
        await asyncio.gather(*(s.channel.close() for s in channels), return_exceptions=True)
