"""The cluster benchmark's parts: each measures one figure once, on a fresh stream.

A part function takes the running ``BenchNodes``, the replica count and the ``Limits`` of one
measurement, and returns one ``Sample`` (a dict of named figures, plus the CPU each node and
the client used meanwhile). The driver (``raftstream.bench.cluster``) repeats it and takes
medians. Every part creates its own stream (``num_replicas`` R, default settings), connects a
client to that stream's leader (so no forwarding hop is measured) and deletes the stream
afterwards, so runs do not grow each other's data.

- ``sync``: ``publish`` one 128-byte message at a time: latency p50/p99/p999;
- ``async``: ``publish_async`` with the SDK's bounded window of pending messages, then
  ``publish_async_completed``: messages/s acknowledged, and the p50 time from
  ``publish_async`` to the PubAck (every 16th message timed);
- ``fetch``: after preloading the stream, ``fetch(256)`` and ``ack()`` every message (acks
  batched by the SDK's ack pipeline) until the consumer's ack floor reaches the last message:
  messages/s fetched and acknowledged, and the p50 time of one ``fetch`` call;
- ``prefetch``: the same with ``fetch(256, prefetch=True)``: the SDK keeps the next pull
  request outstanding while the batch is acked (``raftstream/pull.py``, "Prefetch");
- ``push``: after preloading the stream, a push subscription (``subscribe`` on a durable
  explicit-ack consumer, ``next_msg`` and ``ack()`` each message) until the ack floor
  reaches the last message: messages/s delivered and acknowledged.

Issue 7's ``mirror`` part (copy rate and lag from an origin to a mirror) has the same
signature and lives in ``raftstream.bench.cluster_mirror``; ``bench/cluster.py`` adds it to
these ``PARTS``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import raftstream
from raftstream.bench.cluster_nodes import BenchNodes, cpu_seconds
from raftstream.client import PUBLISH_ASYNC_PENDING_MSGS_MAX, Client

__all__ = ["CPU_ROLES", "PARTS", "Limits", "Sample"]

PAYLOAD = b"x" * 128
FETCH_BATCH_MSGS = 256
FETCH_TIMEOUT_S = 2.0
WARMUP_MSGS = 50
LATENCY_SAMPLE_EVERY = 16  # publish_async messages per one whose ack latency is recorded
CLIENT_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0
ACK_FLOOR_POLL_S = 0.01
LEADER_POLL_S = 0.05
LEADER_WAIT_S = 30.0
_streams = itertools.count(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds of one measurement: it stops after ``msgs`` messages or ``seconds``, whichever
    comes first. ``window``: publish_async messages pending at most."""

    msgs: int
    seconds: float
    window: int = PUBLISH_ASYNC_PENDING_MSGS_MAX


@dataclass(slots=True)
class Sample:
    """One measurement: named figures (``msgs_per_s``, ``p50_ms``...), how many messages it
    covered, where the stream leader was, the wall time measured and the CPU seconds used
    meanwhile by the leader, the followers (together) and the client (this process)."""

    figures: dict[str, float]
    msgs: int
    leader: str
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def cpu_pct(self, who: str) -> float:
        """% of one core ``who`` (leader, followers, client) used while measuring."""
        return 100 * self.cpu_s.get(who, 0.0) / self.wall_s if self.wall_s else float("nan")

    def cpu_us_per_msg(self, who: str) -> float:
        """CPU microseconds ``who`` spent per message measured: unlike rates, this barely
        depends on how busy the shared machine is."""
        return 1e6 * self.cpu_s.get(who, 0.0) / self.msgs if self.msgs else float("nan")


CPU_ROLES = ("leader", "followers", "client")


class _CpuWindow:
    """CPU seconds of every node and of this process over a window (``start``/``stop``)."""

    def __init__(self, nodes: BenchNodes) -> None:
        self._nodes = nodes
        self._t0 = 0.0
        self._cpu0: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        cpu = self._nodes.cpu()
        cpu["client"] = cpu_seconds(os.getpid())
        return cpu

    def start(self) -> None:
        self._cpu0, self._t0 = self._now(), time.perf_counter()

    def stop(self, leader: str) -> tuple[float, dict[str, float]]:
        """(wall seconds, CPU seconds by role) since ``start``: the node named ``leader``,
        the other nodes together, and the client."""
        wall = time.perf_counter() - self._t0
        used = {k: v - self._cpu0.get(k, v) for k, v in self._now().items()}
        followers = sum(v for k, v in used.items() if k not in (leader, "client"))
        return wall, {
            "leader": used.get(leader, 0.0),
            "followers": followers,
            "client": used["client"],
        }


async def _stream_leader(admin: Client, stream: str) -> str:
    """The stream's leader (a node name), once it has one."""
    deadline = time.monotonic() + LEADER_WAIT_S
    while True:
        info = await admin.stream_info(stream)
        if info.cluster is not None and info.cluster.leader:
            return info.cluster.leader
        if time.monotonic() > deadline:
            raise TimeoutError(f"stream {stream} has no leader after {LEADER_WAIT_S}s")
        await asyncio.sleep(LEADER_POLL_S)


async def _leader_client(nodes: BenchNodes, leader: str, window: int) -> Client:
    """A client whose first server is ``leader`` (the others follow, as fallbacks)."""
    servers = [nodes.addr(leader)] + [nodes.addr(n) for n in nodes.names if n != leader]
    return await raftstream.connect(
        servers=servers,
        timeout=CLIENT_TIMEOUT_S,
        publish_async_pending_msgs_max=window,
    )


@dataclass(frozen=True, slots=True)
class _Run:
    """What a part's body gets: a client connected to the leader, the fresh stream, the
    subject to publish on, and the CPU window to ``start()`` when measuring begins."""

    client: Client
    stream: str
    subject: str
    cpu: _CpuWindow


@dataclass(frozen=True, slots=True)
class _Measured:
    """What a body returns: figures, the messages they cover, failures by error type."""

    figures: dict[str, float]
    msgs: int
    errors: dict[str, str] = field(default_factory=dict)


Body = Callable[[_Run], Awaitable[_Measured]]


async def _on_fresh_stream(
    nodes: BenchNodes, replicas: int, limits: Limits, prefix: str, body: Body
) -> Sample:
    """Create a stream, run ``body`` on it (CPU counted from the body's ``cpu.start()`` to
    its end), delete the stream."""
    stream = f"{prefix}{replicas}_{next(_streams)}"
    subject = f"{stream.lower()}.a"
    admin = await raftstream.connect(servers=nodes.servers, timeout=CLIENT_TIMEOUT_S)
    try:
        await admin.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], num_replicas=replicas)
        leader = await _stream_leader(admin, stream)
        client = await _leader_client(nodes, leader, limits.window)
        cpu = _CpuWindow(nodes)
        try:
            cpu.start()
            measured = await body(_Run(client, stream, subject, cpu))
            wall_s, cpu_s = cpu.stop(leader)
        finally:
            await client.close()
        await admin.delete_stream(stream)
    finally:
        await admin.close()
    return Sample(
        figures=measured.figures,
        msgs=measured.msgs,
        leader=leader,
        wall_s=wall_s,
        cpu_s=cpu_s,
        errors=measured.errors,
    )


def _percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of already-sorted values (nearest rank); NaN when empty."""
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def part_sync(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """Sequential ``publish`` calls: latency percentiles in ms."""

    async def body(run: _Run) -> _Measured:
        client, subject = run.client, run.subject
        for _ in range(WARMUP_MSGS):
            await client.publish(subject, PAYLOAD)
        run.cpu.start()
        lat_ms: list[float] = []
        deadline = time.perf_counter() + limits.seconds
        while len(lat_ms) < limits.msgs and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await client.publish(subject, PAYLOAD)
            lat_ms.append((time.perf_counter() - t0) * 1000)
        lat_ms.sort()
        figures = {f"p{k}_ms": _percentile(lat_ms, q) for k, q in _QUANTILES}
        return _Measured(figures, len(lat_ms))

    return await _on_fresh_stream(nodes, replicas, limits, "BSYNC", body)


_QUANTILES = (("50", 0.50), ("99", 0.99), ("999", 0.999))


class _Stopwatch:
    """A done-callback that records the ms from its creation to the future's settling."""

    __slots__ = ("_into", "_t0")

    def __init__(self, into: list[float]) -> None:
        self._into = into
        self._t0 = time.perf_counter()

    def __call__(self, fut: asyncio.Future[Any]) -> None:
        self._into.append((time.perf_counter() - self._t0) * 1000)


class _Outcomes:
    """Counts settled publish_async futures (marking their exceptions retrieved) and keeps
    the first error of each type with how often it happened."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.errors: dict[str, tuple[int, str]] = {}
        self.lat_ms: list[float] = []  # publish_async -> PubAck of sampled messages

    def __call__(self, fut: asyncio.Future[Any]) -> None:
        exc = asyncio.CancelledError() if fut.cancelled() else fut.exception()
        if exc is None:
            self.ok += 1
            return
        self.failed += 1
        kind = type(exc).__name__
        count, first = self.errors.get(kind, (0, str(exc)))
        self.errors[kind] = (count + 1, first)

    def summary(self) -> dict[str, str]:
        """error type -> "N x first message"."""
        return {k: f"{n} x {first}" for k, (n, first) in self.errors.items()}


async def _publish_async_for(
    client: Client, subject: str, msgs: int, seconds: float
) -> tuple[_Outcomes, float]:
    """publish_async up to ``msgs`` messages for at most ``seconds``, then wait for every
    answer: (outcomes, elapsed seconds including the drain)."""
    outcomes = _Outcomes()
    started = time.perf_counter()
    deadline = started + seconds
    sent = 0
    while sent < msgs and (sent & 255 or time.perf_counter() < deadline):
        fut = await client.publish_async(subject, PAYLOAD)
        fut.add_done_callback(outcomes)
        if not sent % LATENCY_SAMPLE_EVERY:
            fut.add_done_callback(_Stopwatch(outcomes.lat_ms))
        sent += 1
    await client.publish_async_completed(timeout=DRAIN_TIMEOUT_S)
    await asyncio.sleep(0)  # let the last done-callbacks run
    return outcomes, time.perf_counter() - started


async def part_async(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """``publish_async`` with a bounded window: acknowledged messages/s."""

    async def body(run: _Run) -> _Measured:
        client, subject = run.client, run.subject
        await _publish_async_for(client, subject, min(limits.window, limits.msgs), limits.seconds)
        run.cpu.start()
        outcomes, elapsed = await _publish_async_for(client, subject, limits.msgs, limits.seconds)
        figures = {
            "msgs_per_s": outcomes.ok / elapsed,
            "ack_p50_ms": _percentile(sorted(outcomes.lat_ms), 0.5),
            "failed": float(outcomes.failed),
        }
        return _Measured(figures, outcomes.ok, outcomes.summary())

    return await _on_fresh_stream(nodes, replicas, limits, "BASYNC", body)


async def _wait_ack_floor(client: Client, stream: str, consumer: str, last_seq: int) -> None:
    """Poll until the consumer's ack floor reaches ``last_seq`` (every ack applied)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (await client.consumer_info(stream, consumer)).ack_floor.stream_seq < last_seq:
        if time.monotonic() > deadline:
            raise TimeoutError(f"acks of {consumer} not applied after {DRAIN_TIMEOUT_S}s")
        await asyncio.sleep(ACK_FLOOR_POLL_S)


async def _fetch_ack_for(
    client: Client, stream: str, subject: str, msgs: int, seconds: float, *, prefetch: bool
) -> tuple[int, float, list[float]]:
    """fetch(256) + ack every message until ``msgs`` are in or ``seconds`` pass, then wait
    for the ack floor: (messages acknowledged, elapsed seconds including the ack drain,
    sorted ms of each fetch call). The last fetch asks only for the messages left, and
    prefetches nothing: no more messages come."""
    sub = await client.pull_subscribe(subject, durable="bench", stream=stream)
    started = time.perf_counter()
    deadline = started + seconds
    got, last_seq, fetch_ms = 0, 0, []
    while got < msgs and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        want = min(FETCH_BATCH_MSGS, msgs - got)
        # The next request is prefetched only while more than this batch is left to come.
        more = prefetch and got + want < msgs
        batch = await sub.fetch(want, timeout=FETCH_TIMEOUT_S, prefetch=more)
        fetch_ms.append((time.perf_counter() - t0) * 1000)
        for m in batch:
            await m.ack()
        got += len(batch)
        last_seq = batch[-1].metadata.stream_seq
    await _wait_ack_floor(client, stream, sub.consumer, last_seq)
    await sub.cancel_prefetch()  # a run stopped by time leaves one outstanding
    return got, time.perf_counter() - started, sorted(fetch_ms)


async def part_fetch(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """Preload with publish_async (not measured), then fetch+ack: messages/s."""
    return await _fetch_part(nodes, replicas, limits, prefetch=False)


async def part_prefetch(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """As ``part_fetch``, with the SDK's prefetch."""
    return await _fetch_part(nodes, replicas, limits, prefetch=True)


async def _fetch_part(
    nodes: BenchNodes, replicas: int, limits: Limits, *, prefetch: bool
) -> Sample:
    async def body(run: _Run) -> _Measured:
        client, subject = run.client, run.subject
        preload, _ = await _publish_async_for(client, subject, limits.msgs, limits.seconds)
        run.cpu.start()
        got, elapsed, fetch_ms = await _fetch_ack_for(
            client, run.stream, subject, preload.ok, limits.seconds, prefetch=prefetch
        )
        figures = {
            "msgs_per_s": got / elapsed,
            "fetch_p50_ms": _percentile(fetch_ms, 0.5),
            "preloaded": float(preload.ok),
        }
        return _Measured(figures, got, preload.summary())

    return await _on_fresh_stream(nodes, replicas, limits, "BPREF" if prefetch else "BFETCH", body)


async def _push_ack_for(
    client: Client, stream: str, subject: str, msgs: int, seconds: float
) -> tuple[int, float]:
    """A push subscription: ``next_msg`` + ``ack`` until ``msgs`` are in or ``seconds``
    pass, then wait for the ack floor: (messages acknowledged, elapsed seconds including the
    ack drain)."""
    sub = await client.subscribe(subject, durable="bench", stream=stream, manual_ack=True)
    started = time.perf_counter()
    deadline = started + seconds
    got, last_seq = 0, 0
    try:
        while got < msgs and time.perf_counter() < deadline:
            m = await sub.next_msg(timeout=FETCH_TIMEOUT_S)
            await m.ack()
            got += 1
            last_seq = m.metadata.stream_seq
        await _wait_ack_floor(client, stream, sub.consumer, last_seq)
        return got, time.perf_counter() - started
    finally:
        await sub.unsubscribe()


async def part_push(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """Preload with publish_async (not measured), then push + ack: messages/s."""

    async def body(run: _Run) -> _Measured:
        client, subject = run.client, run.subject
        preload, _ = await _publish_async_for(client, subject, limits.msgs, limits.seconds)
        run.cpu.start()
        got, elapsed = await _push_ack_for(client, run.stream, subject, preload.ok, limits.seconds)
        figures = {"msgs_per_s": got / elapsed, "preloaded": float(preload.ok)}
        return _Measured(figures, got, preload.summary())

    return await _on_fresh_stream(nodes, replicas, limits, "BPUSH", body)


Part = Callable[[BenchNodes, int, Limits], Awaitable[Sample]]
PARTS: dict[str, Part] = {
    "sync": part_sync,
    "async": part_async,
    "fetch": part_fetch,
    "prefetch": part_prefetch,
    "push": part_push,
}
