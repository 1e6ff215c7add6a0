"""Publishing: ``publish`` (one acknowledged message) and ``publish_async`` (pipelined).

Both answer with a ``PubAck`` once the message is committed on a quorum (fsynced) and stored.
``publish`` travels as one item on a ``PublishStream`` call of its own when it can (the
"sync lane", ``raftstream/_synclane.py``: much cheaper than a unary call), else as the unary
``Publish`` RPC; either way with the same timeout, retries and errors.

Ambiguity. A publish that fails with a timeout, or whose connection breaks after it was sent,
may or may not have been stored. ``publish`` retries on its own only what is safe: a refusal
before anything was applied (NOT_LEADER, following the leader hint; NO_LEADER), a server it
could not reach; with a ``msg_id`` it also retries ambiguous failures, because the stream's
duplicate window turns a second copy into ``PubAck(duplicate=True)``. Give a ``msg_id`` to
make retries (yours or the SDK's) exactly-once within the window.

``publish_async`` sends over one ``PublishStream`` call per client, batching whatever is
queued while the previous batch is being written. At most ``pending_msgs_max`` messages are
unanswered at once; ``publish_async`` waits up to ``wait_stall`` seconds for room, then raises
``LimitError``. Each returned future resolves to the ``PubAck`` or the typed error.

Resends. A message is sent again, on the pipeline (a new call if the old one broke, on the
next server if its server is gone), when that is safe: it was refused with
NOT_LEADER/NO_LEADER (nothing applied; the node relays it to the leader it learns in the
meantime), it cannot have reached the server (still queued when the call broke, or the call
never connected), or it has a ``msg_id`` and failed ambiguously (the duplicate window turns
a second copy into ``duplicate=True``). A call refused as a whole with NOT_LEADER naming a
peer (a node under repair does that) is opened again at that peer, not at the refusing node.
A broken call is ambiguous however gRPC reports it: UNAVAILABLE, CANCELLED by the transport,
or INTERNAL "Internal error from Core" (its core failing a write when the node died under
it; ``raftstream.proto.errors.from_rpc_error`` maps all three to ``UnavailableError``). Each
resend waits first, 10 ms doubling to 100 ms, and they stop at the client's timeout from
when the message was queued, failing it with its last error. So a leader failover under
``publish_async`` costs time, not errors, for messages with a ``msg_id``; without one, a
message in flight when its call broke fails with the (retriable) error, outcome unknown as
above. Resent messages may be stored out of order relative to later ones; use
``expected_last_seq`` / ``expected_last_subject_seq`` when order matters. ``completed()``
waits until nothing is pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from raftstream import errors
from raftstream._args import check_headers, check_int
from raftstream._conn import NotConnectedError, Router, Stubs
from raftstream._pipeline import Entry, Pipeline, wait_to_send_again
from raftstream._places import Places
from raftstream._synclane import NotImplementedLane, SyncLane
from raftstream.models import PubAck
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import from_error_message

__all__ = ["NO_OPTIONS", "PublishOptions", "Publisher", "options_of"]

# The payload limit no node accepts more than (issue 10; a node's own limit may be lower:
# the publisher learns it from the node's first refusal, see ``_learn_limit``).
PAYLOAD_BYTES_CEILING = 64 * 1024 * 1024
BATCH_MSGS_MAX = 1024
BATCH_BYTES_MAX = 1024 * 1024
REQUEST_OVERHEAD_BYTES = 32


@dataclass(slots=True, kw_only=True)
class _Queued:
    """A publish_async message's own part of its pipeline ``Entry`` (``context``):
    ``deadline`` (loop time, the client's timeout from when it was queued) bounds its
    resends; ``resends`` counts them."""

    deadline: float
    options: PublishOptions
    resends: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishOptions:
    """What a publish carries besides subject and payload (None: not given)."""

    headers: Mapping[str, str] | None = None
    msg_id: str | None = None
    expected_stream: str | None = None
    expected_last_seq: int | None = None
    expected_last_subject_seq: int | None = None
    expected_last_subject_seq_subject: str | None = None
    expected_last_msg_id: str | None = None
    ttl_ns: int = 0

    def request(self, subject: str, payload: bytes) -> pb.PublishRequest:
        if self is NO_OPTIONS:
            return pb.PublishRequest(subject=subject, data=payload)
        if self.ttl_ns:
            req = pb.PublishRequest(subject=subject, data=payload, ttl_ns=self.ttl_ns)
        else:  # the common publish: no keyword to convert and set
            req = pb.PublishRequest(subject=subject, data=payload)
        if self.headers:
            req.headers.update(self.headers)
        if self.msg_id:
            req.msg_id = self.msg_id
        if self.expected_stream is not None:
            req.expected_stream = self.expected_stream
        if self.expected_last_seq is not None:
            req.expected_last_seq = self.expected_last_seq
        if self.expected_last_subject_seq is not None:
            req.expected_last_subject_seq = self.expected_last_subject_seq
        if self.expected_last_subject_seq_subject is not None:
            req.expected_last_subject_seq_subject = self.expected_last_subject_seq_subject
        if self.expected_last_msg_id is not None:
            req.expected_last_msg_id = self.expected_last_msg_id
        return req


NO_OPTIONS = PublishOptions()


def options_of(
    *,
    headers: Mapping[str, str] | None,
    msg_id: str | None,
    expected_stream: str | None,
    expected_last_seq: int | None,
    expected_last_subject_seq: int | None,
    expected_last_subject_seq_subject: str | None,
    expected_last_msg_id: str | None,
    ttl_ns: int,
) -> PublishOptions:
    """The ``PublishOptions`` of a publish call's keywords: the shared ``NO_OPTIONS`` when
    none is given (the common publish: no frozen object built per message)."""
    if (
        headers is None
        and msg_id is None
        and expected_stream is None
        and expected_last_seq is None
        and expected_last_subject_seq is None
        and expected_last_subject_seq_subject is None
        and expected_last_msg_id is None
        and not ttl_ns
    ):
        return NO_OPTIONS
    # Checked here, once per call, not in ``request`` (a resend builds no new request).
    if headers is not None:
        check_headers(headers)
    for name, text in (
        ("msg_id", msg_id),
        ("expected_stream", expected_stream),
        ("expected_last_subject_seq_subject", expected_last_subject_seq_subject),
        ("expected_last_msg_id", expected_last_msg_id),
    ):
        if text is not None and not isinstance(text, str):
            # Protobuf's own refusal names nothing ("bad argument type for built-in operation").
            raise errors.InvalidArgumentError(name, f"must be a string, not {type(text).__name__}")
    if expected_last_seq is not None:
        check_int("expected_last_seq", expected_last_seq, minimum=0)
    if expected_last_subject_seq is not None:
        check_int("expected_last_subject_seq", expected_last_subject_seq, minimum=0)
    check_int("ttl_ns", ttl_ns, minimum=0)
    return PublishOptions(
        headers=headers,
        msg_id=msg_id,
        expected_stream=expected_stream,
        expected_last_seq=expected_last_seq,
        expected_last_subject_seq=expected_last_subject_seq,
        expected_last_subject_seq_subject=expected_last_subject_seq_subject,
        expected_last_msg_id=expected_last_msg_id,
        ttl_ns=ttl_ns,
    )


def _size(subject: str, payload: bytes, options: PublishOptions) -> int:
    """About the request's size, for batching (from the arguments: reading a built
    request's header map back costs more than the rest of the estimate)."""
    h = options.headers
    headers = sum(len(k) + len(v) for k, v in h.items()) if h else 0
    return len(payload) + len(subject) + headers + REQUEST_OVERHEAD_BYTES


async def _connected(stubs: Stubs, left_s: float) -> Stubs:
    """An attempt that only needs a connected channel (``Router.call`` made one)."""
    return stubs


def _results(batch: pb.PublishResultBatch) -> list[tuple[int, pb.PublishResult]]:
    return [(r.id, r) for r in batch.results]


class Publisher:
    """The publishing half of one client; belongs to the client's event loop."""

    def __init__(
        self, router: Router, *, timeout_s: float, pending_msgs_max: int, wait_stall_s: float
    ) -> None:
        if pending_msgs_max < 1:
            raise errors.InvalidArgumentError("publish_async_pending_msgs_max", "at least 1")
        self._router = router
        self._timeout_s = timeout_s
        self._wait_stall_s = wait_stall_s
        self._pending_msgs_max = pending_msgs_max
        self._payload_bytes_max = PAYLOAD_BYTES_CEILING
        self._room = Places(pending_msgs_max)
        self._pending = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._pipe: Pipeline | None = None
        self._opening = asyncio.Lock()
        self._retries: set[asyncio.Task[None]] = set()
        # The last refusal or broken call whose messages are being sent again, until an ack
        # comes: why the window may stay full (named when publish_async stalls).
        self._retrying_after: errors.RaftStreamError | None = None
        self._closing = False
        self._lane = SyncLane(result_timeout_s=timeout_s)

    @property
    def pending(self) -> int:
        """Messages published with ``publish_async`` and not answered yet."""
        return self._pending

    async def publish(
        self,
        subject: str,
        payload: bytes,
        options: PublishOptions,
        *,
        timeout_s: float | None,
    ) -> PubAck:
        """One message, acknowledged (see the module docstring for retries and ambiguity)."""
        self._check_payload(payload)
        req = options.request(subject, payload)
        lane = self._lane

        async def invoke(stubs: Stubs, left_s: float) -> PubAck:
            if lane.usable(stubs):
                try:
                    return PubAck.from_pb(await lane.publish(stubs, req, left_s))
                except NotImplementedLane:
                    pass  # nothing was applied: the unary RPC below, now and from now on
            return PubAck.from_pb(await stubs.publish.Publish(req, timeout=left_s))

        try:
            return await self._router.call(
                None,
                invoke,
                timeout_s=self._timeout_s if timeout_s is None else timeout_s,
                idempotent=bool(options.msg_id),
            )
        except errors.LimitError as exc:
            self._learn_limit(exc)
            raise

    def _check_payload(self, payload: bytes) -> None:
        """Fail fast, before anything is sent, on a payload no node would take: above the
        limit learned from a node's refusal, or the 64 MiB ceiling. The same error the
        node answers (``LimitError``, field ``data``, rule ``payload_bytes_max``)."""
        if len(payload) > self._payload_bytes_max:
            raise errors.LimitError(
                f"data: payload of {len(payload)} bytes exceeds the node's "
                f"payload_bytes_max ({self._payload_bytes_max} bytes)",
                field="data",
                rule="payload_bytes_max",
                limit="payload_bytes_max",
                payload_bytes_max=self._payload_bytes_max,
            )

    def _learn_limit(self, exc: errors.RaftStreamError) -> None:
        """Keep the payload limit a node's refusal carries (the lowest seen)."""
        learned = str(exc.details.get("payload_bytes_max", ""))
        if isinstance(exc, errors.LimitError) and learned.isdigit():
            self._payload_bytes_max = min(self._payload_bytes_max, int(learned))

    async def publish_async(
        self,
        subject: str,
        payload: bytes,
        options: PublishOptions,
        *,
        wait_stall_s: float | None,
    ) -> asyncio.Future[PubAck]:
        """Queue one message; the future resolves to its PubAck or its typed error."""
        self._check_payload(payload)
        req = options.request(subject, payload)  # before reserving: a bad argument leaks no room
        await self._reserve(wait_stall_s if wait_stall_s is not None else self._wait_stall_s)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PubAck] = loop.create_future()
        entry = Entry(
            request=req,
            size_bytes=_size(subject, payload, options),
            expects_result=True,
            future=fut,
            context=_Queued(deadline=loop.time() + self._timeout_s, options=options),
        )
        try:
            pipe = await self._pipeline()
            pipe.submit(entry)
        except errors.RaftStreamError as exc:
            self._resolve(entry, exc)
        return fut

    async def _reserve(self, wait_stall_s: float) -> None:
        if not self._room.take_now() and not await self._room.take(wait_stall_s):
            message = f"{self._pending_msgs_max} publishes pending for {wait_stall_s:.3f}s"
            cause = self._retrying_after
            details: dict[str, object] = {"pending_msgs": self._pending}
            if cause is not None:
                # An outage, not a slow consumer of acks: say so (a user review read LIMIT).
                message += f", being sent again after {cause.reason}: {cause.message}"
                details["cause"] = cause.reason
            raise errors.LimitError(message, **details)
        self._pending += 1
        self._idle.clear()

    def _resolve(self, entry: Entry, outcome: PubAck | BaseException) -> None:
        """Settle one publish_async message and give its room back."""
        if not entry.future.done():
            if isinstance(outcome, BaseException):
                entry.future.set_exception(outcome)
            else:
                entry.future.set_result(outcome)
        self._pending -= 1
        self._room.give()
        if self._pending == 0:
            self._idle.set()

    async def _pipeline(self, *, addr: str | None = None) -> Pipeline:
        """The live PublishStream, else a new one (to ``addr`` first, when given)."""
        pipe = self._pipe
        if pipe is not None and not pipe.dead:
            return pipe
        async with self._opening:
            if self._pipe is None or self._pipe.dead:
                # Through call(): a server that cannot be reached is skipped for the next.
                stubs = await self._router.call(
                    None, _connected, timeout_s=self._timeout_s, idempotent=True, addr=addr
                )
                self._pipe = Pipeline(
                    stubs.publish.PublishStream(),
                    batch_of=lambda items: pb.PublishBatch(requests=items),
                    results_of=_results,
                    on_result=self._on_result,
                    on_failed=self._failed,
                    on_orphan=lambda result: None,  # every publish is waited for
                    queue_msgs_max=self._pending_msgs_max,
                    batch_msgs_max=BATCH_MSGS_MAX,
                    batch_bytes_max=BATCH_BYTES_MAX,
                    result_timeout_s=self._timeout_s,
                    name="publish",
                    addr=stubs.addr,
                )
            return self._pipe

    def _on_result(self, entry: Entry, result: pb.PublishResult) -> None:
        if result.HasField("ack"):
            self._retrying_after = None
            self._resolve(entry, PubAck.from_pb(result.ack))
            return
        exc = from_error_message(result.error)
        self._learn_limit(exc)
        # NOT_LEADER/NO_LEADER: refused before anything was applied.
        self._send_again_or_fail(
            entry, exc, unsent=isinstance(exc, errors.NotLeaderError | errors.NoLeaderError)
        )

    def _failed(self, entry: Entry, exc: errors.RaftStreamError) -> None:
        """The call broke before ``entry``'s answer (module docstring)."""
        unsent = not entry.written or isinstance(exc, NotConnectedError)
        self._send_again_or_fail(entry, exc, unsent=unsent)

    def _send_again_or_fail(
        self, entry: Entry, exc: errors.RaftStreamError, *, unsent: bool
    ) -> None:
        """Send ``entry`` again when that is safe (``unsent``: it cannot have been applied;
        or it has a msg_id and ``exc`` is retriable), else fail it with ``exc``."""
        queued: _Queued = entry.context
        if self._closing or not (unsent or (queued.options.msg_id and exc.retriable)):
            self._resolve(entry, exc)
            return
        self._retrying_after = exc
        task = asyncio.get_running_loop().create_task(self._resend(entry, exc))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _resend(self, entry: Entry, exc: errors.RaftStreamError) -> None:
        """After a wait that doubles with each resend of ``entry`` (``wait_to_send_again``, as
        the client's retries wait), submit it again to the pipeline (a new one if the call
        broke, on the next server when its server is gone): the node it reaches relays it
        to the stream's leader, which it has learned meanwhile. Failed with ``exc``, the
        last refusal, when the wait would pass the message's deadline."""
        queued: _Queued = entry.context
        queued.resends += 1
        try:
            await wait_to_send_again(queued.resends - 1, queued.deadline, exc)
            # A call refused as a whole by a node that names a peer (NOT_LEADER while it is
            # under repair): a new call goes there, not back to the refusing node.
            hinted = exc.leader_addr if isinstance(exc, errors.NotLeaderError) else None
            pipe = await self._pipeline(addr=hinted or None)
            entry.sent_at = 0.0
            pipe.submit(entry)
        except errors.RaftStreamError as failure:
            self._resolve(entry, failure)
        except asyncio.CancelledError:
            self._resolve(entry, errors.UnavailableError("the client was closed"))
            raise

    async def completed(self, *, timeout_s: float | None) -> None:
        """Wait until no publish_async message is pending; ``DeadlineExceededError`` if that
        takes longer than ``timeout_s`` (None: the client's timeout)."""
        limit_s = timeout_s if timeout_s is not None else self._timeout_s
        try:
            async with asyncio.timeout(limit_s):
                await self._idle.wait()
        except TimeoutError:
            raise errors.DeadlineExceededError(
                f"{self._pending} publishes still pending after {limit_s:.3f}s",
                pending_msgs=self._pending,
            ) from None

    async def close(self) -> None:
        """Stop: pending publish_async futures fail with ``UnavailableError``."""
        self._closing = True  # what the pipeline's close fails is not sent again
        for task in list(self._retries):
            task.cancel()
        if self._pipe is not None:
            await self._pipe.close()
        await self._lane.close()
