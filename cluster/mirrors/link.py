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
   per link with explicit acks, fetched with idle heartbeats (a stalled link raises). That
   consumer holds the origin's messages for the link (on an interest origin, a message no
   consumer holds is removed), so it is never deleted and made again: a session RESUMES it
   (``reset_consumer`` to the sequence after the replicated position: what is copied is
   released, what is not stays held), a new leader's link resumes the old leader's, and
   only a missing one (never made, or expired after ``inactive_threshold``) is created. A
   delivery can still be lost in flight (a pull request that ended while it travelled; it
   stays pending on the origin until its ack wait): its consumer sequence is skipped. The
   link then copies nothing past the hole it may leave (see ``_PullBatches``) and ends the
   session: the next one resumes the consumer after what committed;
3. loop: take a batch, propose it as ``Copy`` entries (each naming the origin sequence it
   copies and the one it believes was stored before it); once the entry committed, ack the
   batch on the origin (pull consumer). Receiving overlaps committing: a few batches may
   be proposed before the first one commits (see ``_pump``).

Exactly once, in order: the engine stores a ``Copy`` only when its ``prev_origin_seq`` is the
replicated position, and ignores one at or below it, so whatever was proposed twice (a
redelivery, two leaders for a moment) is stored once, and nothing is stored past a hole.
Any failure (origin or own leader change, a refused copy, missed heartbeats: a stalled link,
a broken connection, an origin that does not answer) ends the session; the next one starts
from the replicated position again, after a tenacity backoff. Acks go out only after commit
(a message is acked only once the replicated position covers it, redeliveries included), so
a work-queue or interest origin drops a message only once the copy is durable on a quorum
here. What was committed but not acked when a session ended is released by the next
session's reset of the consumer; if the consumer had to be made anew, a work-queue origin's
such messages are deleted (it holds the copies).

Origin sequences that the origin removed before they could be copied (limits, purge) are
reported as ``skipped`` ranges in the replicated state: a gap in the delivered sequences is
checked against the origin's first sequence (links with a subject filter see gaps for every
other subject, so they report none); sequences below the origin's configured ``first_seq``
never existed and are not skipped. A gap is only ever classified when no delivery went
missing before it (a hole left by a lost delivery ends the session instead), so a message
the origin still holds for the link is never booked as skipped.

Link state (leader-local, ``LinkInfo``): ``active_ns`` counts from the last time the origin
answered: a message, its info, or a wait that it ended with nothing new (the pull
consumer's 408; for the ordered consumer, whose subscription retries on its own forever,
the origin's info asked after a quiet wait). A session whose origin does not answer ends
with the error, so neither an error nor a growing ``active_ns`` is hidden by an idle loop.
``lag`` is the number of origin messages not copied yet. A session sets it from its
consumer's ``num_pending`` when the consumer is made or resumed (an estimate from the
origin's state before that, if nothing was known), then only from what committed (the
``num_pending`` of the last message stored); an idle origin (it answered) with nothing in
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    wait_exponential_jitter,
)

from raftstream import errors as sdk_errors
from raftstream.client import Client, connect
from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.meta.descriptions import LOG_FEATURE_COPY_AT, LOG_FEATURE_COPY_ROLLUP
from raftstream.config import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy
from raftstream.engine.entries import HDR_ROLLUP, Copy
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
# How long a fetch waits: the first one of a round for one message, the second for the
# ones the first said are pending (it is answered as soon as they are there). The server
# ends a request 10% (at most 0.25 s) before this, so a delivery it makes at the end still
# arrives before the client gives up; a much shorter wait loses deliveries in flight.
FETCH_WAIT_S = 2.0
ORDERED_PENDING_MSGS_MAX = 4 * 512  # messages the ordered subscription buffers
COMMITS_INFLIGHT_MAX = 4  # batches proposed and not yet committed, per link
HEARTBEAT_S = 0.5  # the origin's idle heartbeat; 3 missed ones end the session (stalled)
CLIENT_TIMEOUT_S = 5.0  # per call to the origin
ACK_WAIT_NS = 30 * NS_PER_S  # the origin redelivers an unacked copy after this
# Room for the batches in flight and the one being fetched: a fetch never waits for acks.
ACK_PENDING_MSGS_MAX = (COMMITS_INFLIGHT_MAX + 1) * FETCH_MSGS_MAX
INACTIVE_THRESHOLD_NS = 30 * NS_PER_S  # the origin drops an abandoned link consumer
RECONNECT_WAIT_MIN_S = 0.1
RECONNECT_WAIT_MAX_S = 5.0
# A mirror's session waits this long at most for every replica's description (log features).
DESCRIBED_WAIT_S = 2.0
DESCRIBED_POLL_S = 0.05
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

    def replicas_read(self, feature: str) -> bool | None:
        """Whether every replica reads log entries of ``feature`` (``LOG_FEATURES``); None
        while not known for every replica yet."""
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


def _settings(cfg: ConsumerConfig) -> tuple[object, ...]:
    """What a link sets on its consumer that an update may change (its start is the
    session's reset)."""
    return (
        cfg.ack_wait,
        cfg.max_ack_pending,
        cfg.inactive_threshold,
        cfg.filter_subject or None,
        tuple(cfg.filter_subjects),
    )


def _with_settings(cfg: ConsumerConfig, wanted: ConsumerConfig) -> ConsumerConfig:
    """``cfg`` (an existing consumer's) with the link's ``_settings`` from ``wanted``."""
    return replace(
        cfg,
        ack_wait=wanted.ack_wait,
        max_ack_pending=wanted.max_ack_pending,
        inactive_threshold=wanted.inactive_threshold,
        filter_subject=wanted.filter_subject,
        filter_subjects=wanted.filter_subjects,
    )


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
        clock: NodeClock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock  # the stream group's: the leader's stamps on copies
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
        self._ending: asyncio.Task[None] | None = None  # the session ``stop`` cancelled
        self._lag: int | None = None  # None: not learnt yet (kept across sessions)
        self._lag_seq = 0  # the origin sequence the lag was learnt after (this session)
        self._active_mono: float | None = None
        self._error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Cancel the session and wait for it to end: its cleanup deletes the ordered
        consumer it made on the origin (best effort: the SDK waits seconds for an origin
        that does not answer). ``abandon`` cuts that wait short."""
        task, self._task = self._task, None
        if task is not None:
            self._ending = task
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def abandon(self) -> None:
        """Interrupt a stopping session's cleanup where it waits now (call again for its
        next wait). Nothing copied depends on it: a consumer left on the origin expires
        there (``INACTIVE_THRESHOLD_NS``), acks not sent are released by the next session's
        reset of its consumer, and the client's channels close when freed."""
        if self._ending is not None and not self._ending.done():
            self._ending.cancel()

    def info(self) -> LinkInfo:
        active = -1
        if self._active_mono is not None:
            active = int((self._clock.monotonic() - self._active_mono) * NS_PER_S)
        running = self._task is not None and not self._task.done()
        return LinkInfo(lag=self._lag, active_ns=active, error=self._error, running=running)

    async def _run(self) -> None:
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential_jitter(multiplier=RECONNECT_WAIT_MIN_S, max=RECONNECT_WAIT_MAX_S),
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
        self._active_mono = self._clock.monotonic()
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
        return _OrderedBatches(sub, probe=lambda: client.stream_info(self.source.name))

    async def _pulled(
        self, client: Client, pos: int, first: int, retention: RetentionPolicy
    ) -> _Batches:
        """An interest or work-queue origin: the link's pull consumer with explicit acks,
        each sent once the copy committed (module docstring). An existing consumer is
        resumed right after ``pos``, never deleted: on an interest origin, deleting the
        only consumer removes every message it holds (delivered and not acked, or not
        delivered yet) and those published until a new one exists."""
        src = self.source
        workqueue = retention is RetentionPolicy.WORKQUEUE
        wanted = self._consumer_config(pos, workqueue=workqueue)
        try:
            have = await client.consumer_info(src.name, self._consumer)
        except sdk_errors.NotFoundError:
            have = None
        if have is None:
            if workqueue and pos:
                await self._clean_workqueue(client, first, pos)
            made = await client.add_consumer(src.name, wanted)
        else:
            if _settings(have.config) != _settings(wanted):  # e.g. the source's filter changed
                await client.update_consumer(src.name, _with_settings(have.config, wanted))
            # Interest is held throughout: the reset releases only what is at or below the
            # position (copied), and delivers everything after it again, including what
            # the last session received and did not commit.
            seq = self._resume_seq(pos, workqueue=workqueue)
            made = await client.reset_consumer(src.name, self._consumer, seq)
            log.info(
                "link to %s resumes its consumer %s at %s (copied up to %d)",
                self.key,
                self._consumer,
                seq if seq is not None else "its ack floor",
                pos,
                extra=self._extra,
            )
        self._lag = made.num_pending  # what the work queue holds, or after the position
        sub = await client.pull_subscribe_bind(src.name, self._consumer)
        return _PullBatches(
            sub, pos=pos, cseq=made.delivered.consumer_seq, filtered=bool(src.filters)
        )

    def _resume_seq(self, pos: int, *, workqueue: bool) -> int | None:
        """Where a resumed consumer delivers from: after the position, or, with nothing
        copied yet, where the link starts (None: the consumer's ack floor, which is its
        start by time since the link acks nothing it did not copy)."""
        src = self.source
        if pos or workqueue:
            return pos + 1
        if src.opt_start_seq:
            return src.opt_start_seq
        return None if src.opt_start_time else 1

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
        await self._await_replicas_described()
        try:
            while True:
                msgs = await batches.next()
                self._active_mono = self._clock.monotonic()
                copies: list[Copy] = []
                pending: list[int] = []  # the origin's num_pending after each copy
                # A mirror keeps the origin's times once every replica reads such copies.
                origin_times = (
                    self._mirror and self._host.replicas_read(LOG_FEATURE_COPY_AT) is True
                )
                # A rollup at the origin rolls up here too once every replica reads that.
                rollups = self._host.replicas_read(LOG_FEATURE_COPY_ROLLUP) is True
                for m in msgs:
                    seq = m.metadata.stream_seq
                    if seq <= prev:
                        continue  # a redelivery of what is stored or proposed already
                    skipped = None
                    if seq > expect and first_gap_checked and not src.filters:
                        skipped = await self._skipped(client, expect, seq - 1)
                    first_gap_checked = True
                    copies.append(
                        self._copy(m, prev, skipped, origin_times=origin_times, rollups=rollups)
                    )
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

    async def _await_replicas_described(self) -> None:
        """Wait, at most ``DESCRIBED_WAIT_S``, until this node knows whether every replica
        reads copies with the origin's time and rollup copies (a node that just started has
        not heard its peers' descriptions yet): without it, a mirror's first copies would
        get this node's time, and a rollup among them would not roll up. After that, a
        replica still not heard from counts as one that does not read them."""
        deadline = self._clock.monotonic() + DESCRIBED_WAIT_S
        while self._host.replicas_read(LOG_FEATURE_COPY_AT) is None:
            if self._clock.monotonic() >= deadline:
                return
            await asyncio.sleep(DESCRIBED_POLL_S)

    def _copy(
        self,
        m: Msg,
        prev: int,
        skipped: tuple[int, int] | None,
        *,
        origin_times: bool,
        rollups: bool,
    ) -> Copy:
        headers = {k: v for k, v in m.headers.items() if k != HDR_STREAM_SOURCE}
        return Copy(
            ts_ns=self._clock.time_ns(),  # the leader's stamp, as for a publish
            origin=self.key,
            origin_seq=m.metadata.stream_seq,
            prev_origin_seq=prev,
            subject=m.subject,
            data=m.data,
            headers=headers,
            skipped=skipped,
            # The origin's time of the message, kept as its time (engine ``Stream._copy_ts``).
            origin_ts_ns=m.metadata.timestamp_ns if origin_times else 0,
            # Only a rollup takes the kind of entry an earlier version cannot read.
            rollup=rollups and HDR_ROLLUP in headers,
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
            else:
                self._error = None  # a batch committed: the link works again
        # Ack after commit: only what the replicated position covers (a redelivery of a
        # copy still in flight, or one after a refusal, waits; it is delivered again).
        top = self._host.origin_position(self.key).last_seq
        for m in acks:
            if m.metadata.stream_seq <= top:
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
    origin's consumer was made again.

    ``next`` returns messages, or [] only when the ORIGIN ANSWERED that it has nothing new
    (so the link counts it as heard from, and as caught up); it raises when the origin
    does not answer, which ends the session with that error."""

    lost: str | None

    async def next(self) -> list[Msg]: ...

    async def close(self) -> None: ...


class _OrderedBatches:
    """Batches from an ordered push subscription: wait for one message, then take what is
    buffered. Gaps and stalls are the subscription's own business (it resets itself), but
    a reset ends the session after the batch: the origin may be another stream by then
    (deleted and created again, its consumers with it), which only a session start checks.

    A quiet wait proves nothing: the subscription keeps trying to reach a dead origin on
    its own, forever, and meanwhile delivers nothing, as an idle origin does. So after a
    quiet wait the origin is asked for its info (``probe``): an answer means idle, a
    failure raises and ends the session (its error is the link's).
    """

    def __init__(self, sub: OrderedSubscription, probe: Callable[[], Awaitable[object]]) -> None:
        self._sub = sub
        self._probe = probe
        self._resets = sub.resets
        self.lost: str | None = None

    async def next(self) -> list[Msg]:
        try:
            out = [await self._sub.next_msg(FETCH_WAIT_S)]
        except sdk_errors.DeadlineExceededError:
            out = []
        while out and self._sub.pending and len(out) < FETCH_MSGS_MAX:
            out.append(await self._sub.next_msg(None))
        if not out:
            await self._probe()  # raises when the origin does not answer
        if self._sub.resets != self._resets:
            self.lost = "the origin's ordered consumer was made again (a stall, or the origin "
            self.lost += "changed): the next session checks the origin"
        return out

    async def close(self) -> None:
        await self._sub.unsubscribe()


class _PullBatches:
    """Batches from the link's pull consumer: one fetch waits for a message (idle
    heartbeats on: a stalled link raises); a second one takes the messages the first
    said are pending (``num_pending``), and is answered as soon as they are there.

    A delivery can be lost in flight (its pull request ended while it travelled): the
    consumer's own sequence skips it and the message stays pending on the origin until
    its ack wait, then comes again. A skipped consumer sequence only matters if it may
    have been a message the link has not copied: new deliveries come in stream order, so
    when the next message above what was handed over is the very next origin sequence,
    the lost one was a redelivery of a copied message (harmless). Otherwise (or with a
    subject filter, where any gap is normal) nothing past the hole is handed over and
    ``lost`` ends the session; the next one resumes the consumer after what committed.
    A quiet wait after a delivery that said more were pending means the same.
    Redeliveries (a message at or below what was handed over) pass through; the link
    ignores them and acks them once the position covers them."""

    def __init__(self, sub: PullSubscription, *, pos: int, cseq: int, filtered: bool) -> None:
        self._sub = sub
        self._top = pos  # the highest origin sequence handed over (or copied before)
        self._cseq = cseq  # the highest consumer sequence seen (the consumer's at start)
        self._filtered = filtered
        self._missed: int | None = None  # a consumer sequence lost in flight, unresolved
        self._pending_after = 0  # the origin's num_pending after the last delivery
        self.lost: str | None = None

    async def next(self) -> list[Msg]:
        try:
            msgs = await self._sub.fetch(1, FETCH_WAIT_S, heartbeat=HEARTBEAT_S)
        except sdk_errors.DeadlineExceededError:
            # The origin answered (408): nothing within the wait. Idle, unless the last
            # delivery said more were pending: then they went to a request that ended.
            if self._pending_after:
                self.lost = f"{self._pending_after} more message(s) pending on the origin "
                self.lost += "did not arrive (lost in flight, or removed)"
            return []
        more = min(msgs[-1].metadata.num_pending, FETCH_MSGS_MAX - 1)
        if more:
            with contextlib.suppress(sdk_errors.DeadlineExceededError):
                msgs += await self._sub.fetch(more, FETCH_WAIT_S, heartbeat=HEARTBEAT_S)
        return self._checked(msgs)

    def _checked(self, msgs: list[Msg]) -> list[Msg]:
        """``msgs`` up to the first one that may lie past an uncopied lost delivery."""
        for i, m in enumerate(msgs):
            meta = m.metadata
            if meta.consumer_seq > self._cseq + 1 and self._missed is None:
                self._missed = self._cseq + 1
            # Not less: a delivery whose op a leader change lost is made again with the
            # same consumer sequence (its message was received already).
            self._cseq = max(self._cseq, meta.consumer_seq)
            self._pending_after = meta.num_pending
            if meta.stream_seq <= self._top:
                continue  # a redelivery: at most a copy made again
            if self._missed is not None:
                if self._filtered or meta.stream_seq != self._top + 1:
                    self.lost = f"delivery gap: consumer seq {self._missed} was lost in "
                    self.lost += f"flight before origin seq {meta.stream_seq}, after "
                    self.lost += f"{self._top}: the next session resumes after what committed"
                    return msgs[:i]
                self._missed = None  # the lost one was a redelivery: nothing is missing
            self._top = meta.stream_seq
        return msgs

    async def close(self) -> None:
        """Nothing: the consumer is resumed by the next session, or expires."""
