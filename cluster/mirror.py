"""The mirror/source coordinator: one ``MirrorLink`` per origin of a stream, on its leader.

A link is a CLIENT of the origin through the public gRPC API (the SDK, ``raftstream.client``),
wherever the origin is: this cluster (its own node addresses) or another (``external.api``).
One session of a link:

1. connect; read the origin's info; read the REPLICATED position of this origin
   (``Stream.origins``, advanced by every applied ``Copy``);
2. subscribe from right after that position. A limits origin (acks do not matter to it)
   is read with the SDK's ordered consumer: a push consumer with flow control and idle
   heartbeats that resets itself after a gap or missed heartbeats, never handing a message
   over twice or out of order (a reset ends the session after the batch in hand: the origin
   may have been deleted and created again, which a session start checks). An interest or
   work-queue origin (acks remove messages) is read with a pull consumer of a fixed name
   per link (a new leader's replaces the old leader's) with explicit acks, fetched with
   idle heartbeats (a stalled link raises); its consumer sequence numbers every delivery,
   and a jump (a delivery lost in flight, which would come back only as a late
   redelivery) ends the session after what came before;
3. loop: take a batch, propose it as ``Copy`` entries (each naming the origin sequence it
   copies and the one it believes was stored before it); once the entry committed, ack the
   batch on the origin (pull consumer). Receiving overlaps committing: a few batches may
   be proposed before the first one commits (see ``_pump``).

Exactly once, in order: the engine stores a ``Copy`` only when its ``prev_origin_seq`` is the
replicated position, and ignores one at or below it, so whatever was proposed twice (a
redelivery, two leaders for a moment) is stored once, and nothing is stored past a hole.
Any failure (origin or own leader change, a refused copy, missed heartbeats: a stalled link,
a broken connection) ends the session; the next one starts from the replicated position
again, after a tenacity backoff. Acks go out only after commit, so a work-queue or interest
origin drops a message only once the copy is durable on a quorum here. What was committed
but not acked when a session ended is deleted from a work-queue origin by the next session
(it holds the copies), since a fresh consumer never sees those sequences again.

Origin sequences that the origin removed before they could be copied (limits, purge) are
reported as ``skipped`` ranges in the replicated state: a gap in the delivered sequences is
checked against the origin's first sequence (links with a subject filter see gaps for every
other subject, so they report none); sequences below the origin's configured ``first_seq``
never existed and are not skipped.

Link state (leader-local, ``LinkInfo``): ``lag`` is the number of origin messages not copied
yet. A session sets it from its consumer's ``num_pending`` when the consumer is made (an
estimate from the origin's state before that, if nothing was known), then only from what
committed (the ``num_pending`` of the last message stored); an idle origin with nothing in
flight makes it 0. It is kept across sessions; None until the link learnt anything (stream
info then shows 0 with an error saying why). ``error`` is a plain sentence (no private
class name), kept from the session that failed until a batch commits or a session caught
up. An origin whose last sequence is below the copied position (deleted and created again,
or reset) is not copied: the session ends at once with an error saying so.

Ownership: the node's event loop. ``StreamGroup`` starts links when its leader barrier
applies and stops them when leadership is lost or the config drops the origin.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from raftstream import errors as sdk_errors
from raftstream.client import Client, connect
from raftstream.config import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy
from raftstream.engine.entries import Copy
from raftstream.engine.origins import HDR_STREAM_SOURCE, OriginState
from raftstream.engine.stream_source import StreamSource, source_key
from raftstream.engine.subjects import subject_matches
from raftstream.msg import Msg
from raftstream.ordered import OrderedSubscription
from raftstream.pull import PullSubscription
from raftstream.raft.transport.tls import PeerTls

__all__ = ["LinkHost", "LinkInfo", "MirrorLink", "describe_error", "link_consumer_name"]

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000
FETCH_MSGS_MAX = 512  # messages per round (and per proposed entry)
FETCH_WAIT_S = 2.0  # how long the first fetch of a round waits for a message
BULK_WAIT_S = 0.05  # how long the rest of a pulled batch may take to arrive
ORDERED_PENDING_MSGS_MAX = 4 * 512  # messages the ordered subscription buffers
COMMITS_INFLIGHT_MAX = 4  # batches proposed and not yet committed, per link
HEARTBEAT_S = 0.5  # the origin's idle heartbeat; 3 missed ones end the session (stalled)
CLIENT_TIMEOUT_S = 5.0  # per call to the origin
ACK_WAIT_NS = 30 * NS_PER_S  # the origin redelivers an unacked copy after this
ACK_PENDING_MSGS_MAX = 4 * FETCH_MSGS_MAX
INACTIVE_THRESHOLD_NS = 30 * NS_PER_S  # the origin drops an abandoned link consumer
RECONNECT_WAIT_MIN_S = 0.1
RECONNECT_WAIT_MAX_S = 5.0
WORKQUEUE_CLEANUP_MSGS_MAX = 4 * ACK_PENDING_MSGS_MAX  # committed-not-acked, deleted at start


class LinkHost(Protocol):
    """What a link needs from the stream group it copies into (``StreamGroup``)."""

    def origin_position(self, key: str) -> OriginState:
        """The replicated position of origin ``key`` (as applied on this node)."""
        ...

    async def propose_copies(self, copies: Sequence[Copy]) -> list[Any]:
        """Propose the copies as one entry; their results (a refusal is an exception
        VALUE in the list); raises when the entry could not be committed."""
        ...


@dataclass(frozen=True, slots=True)
class LinkInfo:
    """A link as its leader sees it (``lag``: origin messages not copied yet, as last
    learnt, None while the link has learnt nothing; ``active_ns``: since the origin was
    last heard from, -1 never; ``error``: a plain sentence, None once healthy)."""

    lag: int | None
    active_ns: int
    error: str | None
    running: bool


def link_consumer_name(account: str, stream: str, src: StreamSource, *, mirror: bool) -> str:
    """The link's consumer name on the origin: fixed per link, so a new leader replaces
    the consumer of the old one instead of leaving a second one reading."""
    digest = hashlib.sha256(f"{account}/{stream}/{source_key(src)}".encode()).hexdigest()
    return ("MIRROR_" if mirror else "SOURCE_") + digest[:20].upper()


class _SessionEnd(Exception):
    """A session ended for a reason worth a retry (its message, a plain sentence, is the
    link's error)."""


def describe_error(exc: BaseException) -> str:
    """``exc`` as the link's error: the message of a session end; a public error class
    name (``NotConnectedError: ...``) before the message of any other, never a private
    one (a leading underscore)."""
    text = str(exc)
    name = type(exc).__name__
    if isinstance(exc, _SessionEnd) or name.startswith("_"):
        return text or "the link's session ended"
    return f"{name}: {text}" if text else name


def _refusal(exc: BaseException) -> str:
    """A copy refused by this stream, as a sentence naming the setting that refused it."""
    text = f"copy refused: {exc}"
    limit = exc.details.get("limit") if isinstance(exc, sdk_errors.RaftStreamError) else None
    if limit in ("max_msgs", "max_bytes", "max_msgs_per_subject"):
        text += f" (the stream's {limit} with discard new)"
    elif limit == "max_msg_size":
        text += " (the stream's max_msg_size)"
    return text


def _origin_went_back(name: str, last: int, pos: int) -> str:
    return (
        f"origin {name} went back: its last sequence is {last}, below the {pos} copied from "
        f"it (deleted and created again, or reset); its messages up to sequence {pos} are "
        "not copied, later ones will be; to copy all of it, copy it into a new stream "
        "(docs/mirrors.md, Left out)"
    )


class MirrorLink:
    """Copies one origin into its host's stream while started (module docstring)."""

    def __init__(
        self,
        *,
        host: LinkHost,
        source: StreamSource,
        mirror: bool,
        consumer_name: str,
        servers: Callable[[], tuple[str, ...]],
        log_extra: dict[str, str],
        tls: PeerTls | None = None,
        token: str | None = None,
    ) -> None:
        self._host = host
        self._tls = tls
        self._token = token
        self.source = source
        self.key = source_key(source)
        self._mirror = mirror
        self._consumer = consumer_name
        self._servers = servers
        self._extra = log_extra
        self._task: asyncio.Task[None] | None = None
        self._lag: int | None = None  # None: not learnt yet (kept across sessions)
        self._lag_seq = 0  # the origin sequence the lag was learnt after (this session)
        self._active_mono: float | None = None
        self._error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def info(self) -> LinkInfo:
        active = -1
        if self._active_mono is not None:
            active = int((time.monotonic() - self._active_mono) * NS_PER_S)
        running = self._task is not None and not self._task.done()
        return LinkInfo(lag=self._lag, active_ns=active, error=self._error, running=running)

    async def _run(self) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential_jitter(initial=RECONNECT_WAIT_MIN_S, max=RECONNECT_WAIT_MAX_S),
            before_sleep=self._report,
        )
        # Never gives up while started: the link is stopped by its stream group. A session
        # that ends without an error (a lost delivery) starts over after the shortest
        # wait, backoff reset (the wait bounds a loop of such sessions).
        while True:
            async for attempt in retrying.copy():
                with attempt:
                    await self._session()
            await asyncio.sleep(RECONNECT_WAIT_MIN_S)

    def _report(self, state: Any) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:  # kept until a batch commits (``_commit``) or the link caught up
            self._error = describe_error(exc)
        log.info("link to %s interrupted: %s", self.key, self._error, extra=self._extra)

    # -- one session -------------------------------------------------------------------------

    def _servers_now(self) -> tuple[str, ...]:
        if self.source.external is not None:
            return self.source.external.api
        return self._servers()

    async def _session(self) -> None:
        servers = self._servers_now()
        if not servers:
            raise _SessionEnd("no address to reach the origin")
        # With [tls] the origin is reached as this node: its certificate and CA (for an
        # external origin too, which must then trust the same CA; docs/tls.md).
        tls = self._tls
        client = await connect(
            list(servers),
            timeout=CLIENT_TIMEOUT_S,
            tls_ca=tls.ca_pem if tls is not None else None,
            tls_cert=tls.cert_pem if tls is not None else None,
            tls_key=tls.key_pem if tls is not None else None,
            # With [auth], a same-cluster origin is read as this node acting for the
            # stream's account (its node token); another cluster's does not know it.
            token=self._token if self.source.external is None else None,
        )
        try:
            await self._copy_with(client)
        finally:
            await client.close()

    async def _copy_with(self, client: Client) -> None:
        info = await client.stream_info(self.source.name)
        self._active_mono = time.monotonic()
        pos = self._host.origin_position(self.key).last_seq
        self._lag_seq = pos
        state = info.state
        if pos and state.last_seq < pos:
            # Not copied (docs/mirrors.md, Left out); ending here also keeps a work-queue
            # link from deleting or acking the new origin's messages as copied ones.
            self._lag = state.messages  # none of them is copied (all of them, if filtered)
            raise _SessionEnd(_origin_went_back(self.source.name, state.last_seq, pos))
        if self._lag is None and not self.source.filters:
            # An estimate until the consumer's num_pending replaces it (interior deletes
            # of the origin count as messages here).
            self._lag = state.messages if pos < state.first_seq else state.last_seq - pos
        retention = info.config.retention
        if retention is RetentionPolicy.LIMITS:
            batches = await self._ordered(client, pos)
        else:
            batches = await self._pulled(client, pos, state.first_seq, retention)
        try:
            await self._pump(client, pos, batches)
        finally:
            await batches.close()

    async def _ordered(self, client: Client, pos: int) -> _Batches:
        """A limits origin: the SDK's ordered consumer (flow control, heartbeats, resets
        after gaps or stalls by itself); nothing to ack. A new one per session."""
        cfg = self._consumer_config(pos, workqueue=False)
        cfg = replace(cfg, name=None, ack_policy=AckPolicy.NONE, ack_wait=0, max_ack_pending=0)
        sub = await client.subscribe(
            stream=self.source.name,
            config=replace(cfg, idle_heartbeat=int(HEARTBEAT_S * NS_PER_S)),
            ordered_consumer=True,
            error_cb=self._on_sub_error,
            pending_msgs_max=ORDERED_PENDING_MSGS_MAX,
        )
        if not isinstance(sub, OrderedSubscription):
            await sub.unsubscribe()
            raise sdk_errors.InvariantError("subscribe(ordered_consumer=True): not ordered")
        self._lag = sub.initial_info.num_pending  # from right after the position
        return _OrderedBatches(sub)

    async def _pulled(
        self, client: Client, pos: int, first: int, retention: RetentionPolicy
    ) -> _Batches:
        """An interest or work-queue origin: a pull consumer with explicit acks, each sent
        once the copy committed (module docstring)."""
        src = self.source
        workqueue = retention is RetentionPolicy.WORKQUEUE
        if workqueue and pos:
            await self._clean_workqueue(client, first, pos)
        with contextlib.suppress(sdk_errors.NotFoundError):
            await client.delete_consumer(src.name, self._consumer)
        made = await client.add_consumer(src.name, self._consumer_config(pos, workqueue=workqueue))
        self._lag = made.num_pending  # what the work queue holds, or after the position
        return _PullBatches(await client.pull_subscribe_bind(src.name, self._consumer))

    def _on_sub_error(self, exc: sdk_errors.RaftStreamError) -> None:
        self._error = describe_error(exc)

    async def _pump(self, client: Client, pos: int, batches: _Batches) -> None:
        """Copy batch after batch; returns when ``batches`` says to start over (``lost``).

        Up to ``COMMITS_INFLIGHT_MAX`` batches are proposed before the first committed:
        safe, since each batch's first copy names the last origin sequence of the batch
        before it, so if one fails to commit every later one is refused, never stored past
        the hole. Each batch is acked once it committed."""
        src = self.source
        expect = pos + 1 if pos else max(src.opt_start_seq, 1)
        first_gap_checked = bool(pos) or not src.opt_start_time
        prev = pos
        inflight: collections.deque[asyncio.Task[None]] = collections.deque()
        try:
            while True:
                msgs = await batches.next()
                self._active_mono = time.monotonic()
                copies: list[Copy] = []
                pending: list[int] = []  # the origin's num_pending after each copy
                for m in msgs:
                    seq = m.metadata.stream_seq
                    if seq <= prev:
                        continue  # a redelivery of what is stored or proposed already
                    skipped = None
                    if seq > expect and first_gap_checked and not src.filters:
                        skipped = await self._skipped(client, expect, seq - 1)
                    first_gap_checked = True
                    copies.append(self._copy(m, prev, skipped))
                    pending.append(m.metadata.num_pending)
                    prev, expect = seq, seq + 1
                while inflight and (inflight[0].done() or len(inflight) >= COMMITS_INFLIGHT_MAX):
                    await inflight.popleft()  # committed (or this raises: the session ends)
                if msgs:
                    commit = self._commit(copies, pending, msgs)
                    inflight.append(asyncio.get_running_loop().create_task(commit))
                elif batches.lost is None:
                    # Nothing new from the origin: once what is in flight committed, all
                    # it delivered is copied (the link caught up).
                    while inflight:
                        await inflight.popleft()
                    self._lag, self._error = 0, None
                if batches.lost is not None:
                    break
            while inflight:
                await inflight.popleft()
            log.info("link to %s restarts: %s", self.key, batches.lost, extra=self._extra)
        finally:
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    def _consumer_config(self, pos: int, *, workqueue: bool) -> ConsumerConfig:
        src = self.source
        filters = src.filters
        start: dict[str, Any] = {}
        if workqueue:
            pass  # a work queue delivers all (what is copied was acked or deleted)
        elif pos:
            start = {"deliver_policy": DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": pos + 1}
        elif src.opt_start_seq:
            start = {
                "deliver_policy": DeliverPolicy.BY_START_SEQUENCE,
                "opt_start_seq": src.opt_start_seq,
            }
        elif src.opt_start_time:
            start = {
                "deliver_policy": DeliverPolicy.BY_START_TIME,
                "opt_start_time": src.opt_start_time,
            }
        return ConsumerConfig(
            name=self._consumer,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ACK_WAIT_NS,
            max_ack_pending=ACK_PENDING_MSGS_MAX,
            inactive_threshold=INACTIVE_THRESHOLD_NS,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else (),
            **start,
        )

    def _copy(self, m: Msg, prev: int, skipped: tuple[int, int] | None) -> Copy:
        headers = {k: v for k, v in m.headers.items() if k != HDR_STREAM_SOURCE}
        return Copy(
            ts_ns=time.time_ns(),  # the leader's stamp, as for a publish
            origin=self.key,
            origin_seq=m.metadata.stream_seq,
            prev_origin_seq=prev,
            subject=m.subject,
            data=m.data,
            headers=headers,
            skipped=skipped,
        )

    async def _commit(self, copies: list[Copy], pending: list[int], acks: list[Msg]) -> None:
        """Propose the copies; ack ``acks`` on the origin only once they committed (a
        no-op for the ordered consumer's unacked messages). The lag follows what
        committed (``pending[i]``: the origin's num_pending after ``copies[i]``); a refused
        copy ends the session after acking the copies stored before it."""
        refused: BaseException | None = None
        if copies:
            results = await self._host.propose_copies(copies)
            stored = next(
                (i for i, r in enumerate(results) if isinstance(r, BaseException)), len(results)
            )
            last = copies[stored - 1].origin_seq if stored else 0
            if last > self._lag_seq:  # batches may finish committing out of order
                self._lag, self._lag_seq = pending[stored - 1], last
            if stored < len(results):
                refused = results[stored]
                top = copies[stored - 1].origin_seq if stored else copies[0].prev_origin_seq
                acks = [m for m in acks if m.metadata.stream_seq <= top]
            else:
                self._error = None  # a batch committed: the link works again
        for m in acks:
            await m.ack()
        if refused is not None:
            raise _SessionEnd(_refusal(refused))

    async def _skipped(self, client: Client, lo: int, hi: int) -> tuple[int, int] | None:
        """The part of the undelivered origin range ``lo..hi`` that lies below the origin's
        first sequence now (removed by limits or a purge before it could be copied); the
        rest are messages deleted inside the origin, which a copy keeps as gaps. Sequences
        below the origin's configured ``first_seq`` never existed: not skipped."""
        info = await client.stream_info(self.source.name)
        lo = max(lo, info.config.first_seq)
        top = min(hi, info.state.first_seq - 1)
        return (lo, top) if top >= lo else None

    async def _clean_workqueue(self, client: Client, first: int, pos: int) -> None:
        """Delete from a work-queue origin what is copied (up to ``pos``) but was never
        acked (module docstring); only messages this link takes (its filters)."""
        filters = self.source.filters
        for seq in range(max(first, 1, pos - WORKQUEUE_CLEANUP_MSGS_MAX + 1), pos + 1):
            with contextlib.suppress(sdk_errors.NotFoundError):
                if filters:
                    msg = await client.get_msg(self.source.name, seq)
                    if not any(subject_matches(f, msg.subject) for f in filters):
                        continue
                await client.delete_msg(self.source.name, seq)


class _Batches(Protocol):
    """Where a session's messages come from; ``lost`` is set (and the batch before it is
    the last one) when the session must start over: a delivery went missing, or the
    origin's consumer was made again."""

    lost: str | None

    async def next(self) -> list[Msg]: ...

    async def close(self) -> None: ...


class _OrderedBatches:
    """Batches from an ordered push subscription: wait for one message, then take what is
    buffered. Gaps and stalls are the subscription's own business (it resets itself), but
    a reset ends the session after the batch: the origin may be another stream by then
    (deleted and created again, its consumers with it), which only a session start checks.
    """

    def __init__(self, sub: OrderedSubscription) -> None:
        self._sub = sub
        self._resets = sub.resets
        self.lost: str | None = None

    async def next(self) -> list[Msg]:
        try:
            out = [await self._sub.next_msg(FETCH_WAIT_S)]
        except sdk_errors.DeadlineExceededError:
            out = []  # the origin is idle (its heartbeats keep the subscription alive)
        while out and self._sub.pending and len(out) < FETCH_MSGS_MAX:
            out.append(await self._sub.next_msg(None))
        if self._sub.resets != self._resets:
            self.lost = "the origin's ordered consumer was made again (a stall, or the origin "
            self.lost += "changed): the next session checks the origin"
        return out

    async def close(self) -> None:
        await self._sub.unsubscribe()


class _PullBatches:
    """Batches from a pull consumer: one fetch waits for a message (idle heartbeats on: a
    stalled link raises), a short second one takes what else is there. The consumer's own
    sequence numbers every delivery; a jump means one was lost in flight (a pull request
    ended with it), which would only come back as a redelivery after what follows it."""

    def __init__(self, sub: PullSubscription) -> None:
        self._sub = sub
        self._cseq = 0
        self.lost: str | None = None

    async def next(self) -> list[Msg]:
        try:
            msgs = await self._sub.fetch(1, FETCH_WAIT_S, heartbeat=HEARTBEAT_S)
        except sdk_errors.DeadlineExceededError:
            return []  # nothing new within the wait: the origin is idle, not stalled
        with contextlib.suppress(sdk_errors.DeadlineExceededError):
            msgs += await self._sub.fetch(FETCH_MSGS_MAX - 1, BULK_WAIT_S)
        for i, m in enumerate(msgs):
            if m.metadata.consumer_seq != self._cseq + 1:
                self.lost = f"delivery gap: consumer seq {self._cseq + 1} expected, got "
                self.lost += str(m.metadata.consumer_seq)
                return msgs[:i]
            self._cseq = m.metadata.consumer_seq
        return msgs

    async def close(self) -> None:
        """Nothing: the consumer is replaced by the next session, or expires."""
