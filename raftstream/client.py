"""The raftstream client: ``connect`` and the ``Client`` it returns.

A ``Client`` talks to the nodes over gRPC only (``raftstream.v1``) and belongs to the event
loop that called ``connect``; use it from that loop only. Close it with ``await close()`` or
``async with``; closing fails whatever is still pending (publish_async futures, queued acks).

Every call takes an optional ``timeout`` in seconds (default: the client's), passed as the
deadline of every RPC; retries (tenacity) happen within it. Calls follow NOT_LEADER hints to
the leader's address and retry NO_LEADER and unreachable servers; calls that are safe to
repeat (reads, creates of an identical config, updates) also retry other retriable failures.
Calls that are not (deletes, purges, a publish without ``msg_id``) do not, because their
outcome is then unknown: they may have been applied. Errors are ``raftstream.errors`` types.

The ``Client`` is made of parts, one module per concern, each reaching the cluster through
the one retrying call of ``raftstream._client_core``: stream management
(``raftstream._client_streams``), consumer management (``raftstream._client_consumers``) and
cluster operations, leaderships and peers (``raftstream._client_cluster``). Publishing,
subscriptions and key-value buckets stay here, handing off to ``raftstream.publisher``,
``raftstream.subscribe`` and ``raftstream.kv``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Self

import grpc

from raftstream import errors
from raftstream import subscribe as _workflow
from raftstream._args import check_payload, check_servers, check_subject
from raftstream._auth import credential_interceptors
from raftstream._client_cluster import ClusterAPI
from raftstream._client_consumers import ConsumersAPI
from raftstream._client_streams import StreamsAPI
from raftstream._conn import Router, Stubs, TlsSource, tls_credentials
from raftstream._push import PENDING_BYTES_MAX, PENDING_MSGS_MAX, MsgCallback, PushSubscription
from raftstream._registry import SubscriptionRegistry
from raftstream.config import UNLIMITED, ConsumerConfig, DeliverPolicy, StorageType, StreamSource
from raftstream.kv import (
    KeyValue,
    bucket_stream_config,
    create_bucket,
    delete_bucket,
    open_bucket,
    update_bucket,
)
from raftstream.models import ConsumerInfo, PubAck
from raftstream.msg import Acker
from raftstream.ordered import check_ordered_options, subscribe_ordered
from raftstream.publisher import Publisher, options_of
from raftstream.pull import PullSubscription

__all__ = ["Client", "connect"]

log = logging.getLogger("raftstream.client")

DEFAULT_SERVERS = ("127.0.0.1:7101",)
PUBLISH_ASYNC_PENDING_MSGS_MAX = 4000
ACK_PENDING_MSGS_MAX = 16384


ERROR_LOG_REPEAT_S = 10.0  # the default error_cb logs one error repeated this long once


class _ErrorLog:
    """The default ``error_cb``: logs each error as a warning, but an error repeating the
    last one within ``ERROR_LOG_REPEAT_S`` only once, then how many more came (hundreds
    of fire-and-forget acks fail alike when a stream loses its leader)."""

    def __init__(self) -> None:
        self._last: tuple[str, str] | None = None
        self._since = 0.0
        self._repeats = 0

    def __call__(self, exc: errors.RaftStreamError) -> None:
        key, now = (str(exc), exc.reason), time.monotonic()
        if key == self._last and now - self._since < ERROR_LOG_REPEAT_S:
            self._repeats += 1
            return
        self._flush()
        self._last, self._since = key, now
        # A callback's own exception keeps its traceback in the log.
        cause = exc.__cause__ if isinstance(exc, errors.CallbackError) else None
        log.warning("raftstream: %s (%s)", exc, exc.reason, exc_info=cause)

    def _flush(self) -> None:
        if self._repeats and self._last is not None:
            text, reason = self._last
            log.warning("raftstream: %s (%s): %d more times", text, reason, self._repeats)
        self._repeats = 0


async def connect(
    servers: Sequence[str] | str = DEFAULT_SERVERS,
    *,
    timeout: float = 5.0,
    connect_timeout: float = 2.0,
    publish_async_pending_msgs_max: int = PUBLISH_ASYNC_PENDING_MSGS_MAX,
    publish_async_wait_stall: float | None = None,
    ack_pending_msgs_max: int = ACK_PENDING_MSGS_MAX,
    error_cb: Callable[[errors.RaftStreamError], None] | None = None,
    tls_ca: TlsSource | None = None,
    tls_cert: TlsSource | None = None,
    tls_key: TlsSource | None = None,
    token: str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> Client:
    """Connect to a raftstream cluster.

    ``servers``: ``host:port`` addresses (a comma-separated string works too), tried in turn.
    ``timeout``: the default per-call timeout, seconds. ``connect_timeout``: how long one
    attempt waits for one server before trying the next. ``publish_async_pending_msgs_max``:
    unanswered publish_async messages allowed at once; beyond it publish_async waits up to
    ``publish_async_wait_stall`` seconds (default: ``timeout``). ``ack_pending_msgs_max``:
    fire-and-forget acks queued at once. ``error_cb`` gets errors no call can raise (a
    failed fire-and-forget ack, missed heartbeats, a subscription callback's exception as
    ``CallbackError``); by default they are logged as warnings of the
    ``raftstream.client`` logger, an error that repeats the last one within
    ``ERROR_LOG_REPEAT_S`` once, then how many more came.

    TLS (docs/tls.md): ``tls_ca`` is the CA that signed the nodes' certificates (default: the
    system's roots), ``tls_cert`` and ``tls_key`` this client's certificate and key (a
    cluster with TLS requires them); each a PEM file's path or its bytes. With none of the
    three the connection is plaintext.

    Credentials (docs/security.md), sent on every call: ``token``, or ``user`` and
    ``password``, for a cluster with ``[auth]``; a call it refuses raises
    ``UnauthenticatedError`` (``connect`` itself only opens the connection).

    Raises ``UnavailableError`` when no server answers within ``timeout`` (a refused TLS
    handshake looks the same: the server cannot be connected to), ``InvalidArgumentError``
    for a TLS file that cannot be read, and, before trying any, ``InvalidArgumentError``
    naming ``servers`` for an address that is no ``host:port`` with a port 1 to 65535 or
    an empty one (``",,,"``, ``"a:1,,b:2"``).
    """
    servers = check_servers(servers)
    credentials = tls_credentials(ca=tls_ca, cert=tls_cert, key=tls_key)
    interceptors = credential_interceptors(token=token, user=user, password=password)
    client = Client(
        servers=servers,
        timeout=timeout,
        connect_timeout=connect_timeout,
        publish_async_pending_msgs_max=publish_async_pending_msgs_max,
        publish_async_wait_stall=publish_async_wait_stall,
        ack_pending_msgs_max=ack_pending_msgs_max,
        error_cb=error_cb,
        credentials=credentials,
        interceptors=interceptors,
    )
    try:
        await client._router.call(None, _noop, timeout_s=timeout, idempotent=True)
    except BaseException:
        await client.close()
        raise
    return client


async def _noop(stubs: Stubs, left_s: float) -> None:
    """An attempt that only needs a connected channel (``Router.connect`` made one)."""


class Client(StreamsAPI, ConsumersAPI, ClusterAPI):
    """A connection to a raftstream cluster; see the module docstring. Build with
    ``await connect(...)``."""

    def __init__(
        self,
        *,
        servers: Sequence[str],
        timeout: float,
        connect_timeout: float,
        publish_async_pending_msgs_max: int,
        publish_async_wait_stall: float | None,
        ack_pending_msgs_max: int,
        error_cb: Callable[[errors.RaftStreamError], None] | None,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        self._timeout_s = timeout
        self._router = Router(
            servers,
            connect_timeout_s=connect_timeout,
            credentials=credentials,
            interceptors=interceptors,
        )
        self._publisher = Publisher(
            self._router,
            timeout_s=timeout,
            pending_msgs_max=publish_async_pending_msgs_max,
            wait_stall_s=publish_async_wait_stall or timeout,
        )
        self._error_cb = error_cb or _ErrorLog()
        self._acker = Acker(
            self._router,
            timeout_s=timeout,
            pending_msgs_max=ack_pending_msgs_max,
            error_cb=self._error_cb,
        )
        self._closed = False
        self._registry = SubscriptionRegistry(self.delete_consumer)

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def servers(self) -> tuple[str, ...]:
        return self._router.servers

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Close every connection. Queued acks are sent first (two seconds at most; one not
        sent by then fails to ``error_cb`` and its message is redelivered after its ack wait);
        pending publish_async futures fail (await ``publish_async_completed`` first to keep
        them); push subscriptions end: ephemeral consumers they made are deleted (best effort, a
        few seconds at most), durable ones are kept. Afterwards every call, ack and fetch
        (of messages and subscriptions made before) raises ``ClientClosedError`` at once.

        A client belongs to the event loop it was first used in: a call from another loop
        raises ``PreconditionError`` at once."""
        if self._closed:
            return
        await self._registry.shutdown()
        self._closed = True
        await self._publisher.close()
        await self._acker.close()
        await self._router.close()

    # -- publishing ---------------------------------------------------------------------------

    async def publish(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_subject_seq_subject: str | None = None,
        expected_last_msg_id: str | None = None,
        ttl_ns: int = 0,
    ) -> PubAck:
        """Publish one message; returns its PubAck once it is committed on a quorum.

        A failed ``expected_*`` precondition raises its ``PreconditionError`` subclass. On a
        timeout or a broken connection the message may or may not have been stored; with a
        ``msg_id`` the SDK retries such failures itself (deduplicated by the stream).
        """
        options = options_of(
            headers=headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            expected_last_subject_seq_subject=expected_last_subject_seq_subject,
            expected_last_msg_id=expected_last_msg_id,
            ttl_ns=ttl_ns,
        )
        subject, payload = check_subject(subject), check_payload(payload)
        if self._closed:
            raise errors.ClientClosedError("the client is closed")
        return await self._publisher.publish(subject, payload, options, timeout_s=timeout)

    async def publish_async(
        self,
        subject: str,
        payload: bytes | bytearray | memoryview = b"",
        *,
        wait_stall: float | None = None,
        headers: Mapping[str, str] | None = None,
        msg_id: str | None = None,
        expected_stream: str | None = None,
        expected_last_seq: int | None = None,
        expected_last_subject_seq: int | None = None,
        expected_last_subject_seq_subject: str | None = None,
        expected_last_msg_id: str | None = None,
        ttl_ns: int = 0,
    ) -> asyncio.Future[PubAck]:
        """Queue one message on the pipelined publish stream; returns a future of its PubAck.

        Waits (up to ``wait_stall`` seconds) while ``publish_async_pending_msgs_max``
        messages are unanswered, then raises ``LimitError``. See ``raftstream.publisher``
        for ordering and the ambiguity of failed futures.
        """
        options = options_of(
            headers=headers,
            msg_id=msg_id,
            expected_stream=expected_stream,
            expected_last_seq=expected_last_seq,
            expected_last_subject_seq=expected_last_subject_seq,
            expected_last_subject_seq_subject=expected_last_subject_seq_subject,
            expected_last_msg_id=expected_last_msg_id,
            ttl_ns=ttl_ns,
        )
        subject, payload = check_subject(subject), check_payload(payload)
        if self._closed:
            raise errors.ClientClosedError("the client is closed")
        return await self._publisher.publish_async(
            subject, payload, options, wait_stall_s=wait_stall
        )

    async def publish_async_completed(self, *, timeout: float | None = None) -> None:
        """Wait until every publish_async message is answered (``DeadlineExceededError``
        after ``timeout`` seconds; None: the client's timeout)."""
        await self._publisher.completed(timeout_s=timeout)

    def publish_async_pending(self) -> int:
        """publish_async messages not answered yet."""
        return self._publisher.pending

    # -- pull ---------------------------------------------------------------------------------

    async def pull_subscribe(
        self,
        subject: str,
        durable: str | None = None,
        stream: str | None = None,
        config: ConsumerConfig | None = None,
        *,
        timeout: float | None = None,
    ) -> PullSubscription:
        """Bind to (or create) a pull consumer for ``subject`` (ADR-15, see
        ``raftstream.subscribe``).

        The stream is ``stream`` or the one stream capturing ``subject``
        (``NoStreamMatchError`` when none or several do). With a durable name (``durable`` or
        in ``config``) an existing consumer is used if it fits (a pull consumer, its filter
        the subject, every field ``config`` sets equal: ``ConsumerMismatchError`` otherwise),
        else one is created with ``filter_subject`` set to ``subject``; without one, an
        ephemeral consumer is made. Ack policy none or all is refused
        (``InvalidArgumentError``).
        """
        return await _workflow.pull_subscribe(
            self, subject, durable=durable, stream=stream, config=config, timeout=timeout
        )

    async def pull_subscribe_bind(
        self, stream: str, durable: str, *, timeout: float | None = None
    ) -> PullSubscription:
        """Bind to the existing pull consumer ``durable`` of ``stream``: ``NotFoundError``
        when it is missing, ``ConsumerMismatchError`` when it is a push consumer."""
        return await _workflow.pull_subscribe_bind(self, stream, durable, timeout=timeout)

    def _pull_subscription(
        self, stream: str, consumer: str, *, ephemeral_created: bool = False
    ) -> PullSubscription:
        async def consumer_info() -> ConsumerInfo:
            return await self.consumer_info(stream, consumer)

        async def delete() -> bool:
            return await self.delete_consumer(stream, consumer)

        return PullSubscription(
            router=self._router,
            acker=self._acker,
            stream=stream,
            consumer=consumer,
            timeout_s=self._timeout_s,
            consumer_info=consumer_info,
            delete=delete if ephemeral_created else None,
        )

    # -- push ---------------------------------------------------------------------------------

    async def subscribe(
        self,
        subject: str = "",
        queue: str | None = None,
        durable: str | None = None,
        stream: str | None = None,
        config: ConsumerConfig | None = None,
        ordered_consumer: bool = False,
        manual_ack: bool = False,
        cb: MsgCallback | None = None,
        idle_heartbeat: float | None = None,
        flow_control: bool = False,
        deliver_policy: DeliverPolicy | str | None = None,
        inactive_threshold: float | None = None,
        *,
        error_cb: Callable[[errors.RaftStreamError], None] | None = None,
        pending_msgs_max: int = PENDING_MSGS_MAX,
        pending_bytes_max: int = PENDING_BYTES_MAX,
        timeout: float | None = None,
    ) -> PushSubscription:
        """A push subscription over ``Consume`` (ADR-15's workflow: ``raftstream.subscribe``).

        The stream is ``stream`` or the one capturing ``subject``. With a consumer name
        (``durable``, ``config.durable_name``/``name``, or the ``queue`` name for a queue
        subscription) an existing consumer is bound if it fits, else created; without one an
        ephemeral consumer is created. ``idle_heartbeat`` and ``inactive_threshold`` are
        SECONDS here (``config`` fields are ns). ``ordered_consumer``: see
        ``raftstream.ordered`` (no queue, durable or manual_ack).

        Messages come from ``next_msg``/``async for`` or, with ``cb``, go to the coroutine
        ``cb(msg)`` one at a time, acked after it returns unless ``manual_ack``. Errors no
        call can raise (missed heartbeats, sequence gaps, a consumer deleted under the
        subscription) go to ``error_cb`` (default: the client's). Consumers the SDK created
        are deleted by ``unsubscribe()``/``drain()``. At most ``pending_msgs_max`` messages
        / ``pending_bytes_max`` bytes wait in the subscription (then it stops reading).
        """
        cfg = _workflow.push_config(
            config,
            durable=durable,
            idle_heartbeat=idle_heartbeat,
            flow_control=flow_control,
            deliver_policy=deliver_policy,
            inactive_threshold=inactive_threshold,
        )
        options = _workflow.PushOptions(
            cb=cb,
            manual_ack=manual_ack,
            error_cb=error_cb,
            pending_msgs_max=pending_msgs_max,
            pending_bytes_max=pending_bytes_max,
        )
        self._check_open()
        if ordered_consumer:
            check_ordered_options(queue=queue, durable=durable, manual_ack=manual_ack, cfg=cfg)
            return await subscribe_ordered(
                self, subject, stream=stream, cfg=cfg, options=options, timeout=timeout
            )
        return await _workflow.subscribe(
            self, subject, queue=queue, stream=stream, cfg=cfg, options=options, timeout=timeout
        )

    async def subscribe_bind(
        self,
        stream: str,
        consumer: str,
        *,
        queue: str | None = None,
        manual_ack: bool = False,
        cb: MsgCallback | None = None,
        error_cb: Callable[[errors.RaftStreamError], None] | None = None,
        pending_msgs_max: int = PENDING_MSGS_MAX,
        pending_bytes_max: int = PENDING_BYTES_MAX,
        timeout: float | None = None,
    ) -> PushSubscription:
        """Attach to the existing push consumer ``consumer`` of ``stream`` (``NotFoundError``
        when missing; the queue and duplicate checks of ``subscribe``). The consumer is never
        deleted by this subscription."""
        options = _workflow.PushOptions(
            cb=cb,
            manual_ack=manual_ack,
            error_cb=error_cb,
            pending_msgs_max=pending_msgs_max,
            pending_bytes_max=pending_bytes_max,
        )
        self._check_open()
        return await _workflow.subscribe_bind(
            self, stream, consumer, queue=queue, options=options, timeout=timeout
        )

    # -- key-value ----------------------------------------------------------------------------

    async def create_key_value(
        self,
        bucket: str,
        *,
        description: str = "",
        history: int = 1,
        ttl: float | None = None,
        max_value_size: int = UNLIMITED,
        max_bytes: int = UNLIMITED,
        storage: StorageType | str = StorageType.FILE,
        replicas: int = 1,
        mirror: str | StreamSource | None = None,
        sources: Sequence[str | StreamSource] = (),
        timeout: float | None = None,
    ) -> KeyValue:
        """Create a bucket (its stream ``KV_<bucket>``; see ``raftstream.kv``): ``history``
        revisions per key (1-64), ``ttl`` seconds per value (None: forever), values up to
        ``max_value_size`` bytes. ``mirror``: a bucket (name, or ``StreamSource`` for one in
        another cluster) whose keys this one copies, a read-only copy whose writes go to it;
        ``sources``: buckets whose keys this one takes besides its own. Idempotent for an
        identical bucket; ``AlreadyExistsError`` when one with another config exists
        (naming the bucket and what differs)."""
        cfg = bucket_stream_config(
            bucket,
            description=description,
            history=history,
            ttl=ttl,
            max_value_size=max_value_size,
            max_bytes=max_bytes,
            storage=storage,
            replicas=replicas,
            mirror=mirror,
            sources=sources,
        )
        return await create_bucket(self, bucket, cfg, timeout=timeout)

    async def update_key_value(
        self,
        bucket: str,
        *,
        description: str | None = None,
        history: int | None = None,
        ttl: float | None = None,
        max_value_size: int | None = None,
        max_bytes: int | None = None,
        replicas: int | None = None,
        timeout: float | None = None,
    ) -> KeyValue:
        """Change a bucket's settings: each argument given (not None) replaces the bucket's,
        the others stay; ``ttl`` seconds, 0 for forever. Checked as ``create_key_value``
        checks them (``InvalidArgumentError`` naming the argument, before anything is sent).
        Lowering ``history`` drops the older revisions beyond it, as the stream's
        ``max_msgs_per_subject`` does; the storage cannot change. ``BucketNotFoundError``
        when the bucket is missing."""
        given = {
            "description": description,
            "history": history,
            "ttl": ttl,
            "max_value_size": max_value_size,
            "max_bytes": max_bytes,
            "replicas": replicas,
        }
        changes: dict[str, object] = {k: v for k, v in given.items() if v is not None}
        if "ttl" in changes and changes["ttl"] == 0:
            changes["ttl"] = None  # forever, as create_key_value spells it
        return await update_bucket(self, bucket, changes, timeout=timeout)

    async def key_value(self, bucket: str, *, timeout: float | None = None) -> KeyValue:
        """An existing bucket; ``BucketNotFoundError`` when there is none."""
        return await open_bucket(self, bucket, timeout=timeout)

    async def delete_key_value(self, bucket: str, *, timeout: float | None = None) -> bool:
        """Delete a bucket and every value in it; ``BucketNotFoundError`` when missing."""
        return await delete_bucket(self, bucket, timeout=timeout)
