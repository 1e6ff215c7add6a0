"""``raftstream bench pub|sub|pubsub SUBJECT``: publish and consume through a bench stream.

The run creates a stream capturing SUBJECT with ``--replicas`` replicas (``--stream``,
default ``BENCH``), removes it afterwards unless ``--keep``, and reports per role: messages,
bytes, seconds, msgs/s, MB/s (10^6 bytes of payload per second) and latency percentiles:

- pub: publish to acknowledgement (stored on a quorum). ``--sync`` waits for each ack
  before the next publish; otherwise publishes are pipelined (``publish_async``).
- sub: the stream is first filled with ``--msgs`` messages by one publisher (not timed);
  each of ``--subs`` subscribers then reads all of them over its own pull consumer (ack
  policy none); latency is each pull request's round trip (request to its last message).
- pubsub: both at once; subscriber latency is end to end, from the message's stored
  timestamp (stamped by the leader) to its arrival at the subscriber.

A mode takes only the options it uses: ``pub`` has no ``--subs``, ``sub`` no ``--pubs`` or
``--sync`` (click refuses them rather than ignore them). Each publisher and subscriber has
its own connection. Figures come from one machine's
loopback: compare runs with each other, not with other systems.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

import click

from raftstream import errors
from raftstream.cli.common import (
    SIZE,
    Conn,
    connection_options,
    echo_json,
    fail,
    print_table,
    run,
)

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = ["bench"]

R = TypeVar("R")
FETCH_BATCH_MSGS_MAX = 500
FETCH_TIMEOUT_S = 5.0
SUB_IDLE_S_MAX = 30.0
PROGRESS_REFRESH_S = 0.1
SUB_INACTIVE_NS = 60 * 1_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSpec:
    """What one run does (the command's options)."""

    subject: str
    stream: str
    msgs: int
    size: int
    pubs: int
    subs: int
    replicas: int
    sync: bool
    keep: bool


@dataclass(slots=True)
class Role:
    """One side's measurements: messages and bytes done, wall time, latencies (ns)."""

    name: str
    clients: int
    msgs: int = 0
    bytes: int = 0
    start_ns: int = 0
    end_ns: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Counts, rates and latency percentiles (ms), as printed and as JSON."""
        seconds = max(self.end_ns - self.start_ns, 1) / 1e9
        lat = sorted(self.latencies_ns)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6 if lat else 0.0

        return {
            "role": self.name,
            "clients": self.clients,
            "msgs": self.msgs,
            "bytes": self.bytes,
            "seconds": round(seconds, 4),
            "msgs_per_s": round(self.msgs / seconds, 1),
            "mb_per_s": round(self.bytes / seconds / 1e6, 3),
            "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)},
        }


def _split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal shares (the first ones one larger)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def _publisher(conn: Conn, spec: BenchSpec, n: int, role: Role) -> None:
    """Publish ``n`` messages on one connection, recording each ack's latency."""
    payload = b"x" * spec.size
    c = await conn.connect()
    try:
        if spec.sync:
            for _ in range(n):
                t0 = time.perf_counter_ns()
                await c.publish(spec.subject, payload)
                role.latencies_ns.append(time.perf_counter_ns() - t0)
                role.msgs += 1
                role.bytes += spec.size
            return
        for _ in range(n):
            t0 = time.perf_counter_ns()
            fut = await c.publish_async(spec.subject, payload)
            fut.add_done_callback(functools.partial(_acked, role, spec.size, t0))
        await c.publish_async_completed(timeout=max(conn.timeout_s, 60.0))
        if role.failures:
            raise role.failures[0]
    finally:
        await c.close()


def _acked(role: Role, size: int, t0: int, fut: asyncio.Future[Any]) -> None:
    """Record one pipelined publish that was acknowledged (failures surface later)."""
    if fut.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        role.failures.append(exc)  # raised by the publisher once every ack is in
        return
    role.latencies_ns.append(time.perf_counter_ns() - t0)
    role.msgs += 1
    role.bytes += size


async def _subscriber(conn: Conn, spec: BenchSpec, index: int, role: Role, e2e: bool) -> None:
    """Read ``spec.msgs`` messages over an own pull consumer (deleted afterwards); each is
    acked fire-and-forget, as a pull consumer's messages must be (ack policy explicit).
    An empty pull is retried; ``SUB_IDLE_S_MAX`` seconds without a message fail the run."""
    c = await conn.connect()
    name = f"bench-sub-{index}"
    try:
        await c.add_consumer(spec.stream, durable_name=name, inactive_threshold=SUB_INACTIVE_NS)
        sub = await c.pull_subscribe("", durable=name, stream=spec.stream)
        got, progress_at = 0, time.monotonic()
        while got < spec.msgs:
            t0 = time.perf_counter_ns()
            want = min(FETCH_BATCH_MSGS_MAX, spec.msgs - got)
            try:
                msgs = await sub.fetch(want, timeout=FETCH_TIMEOUT_S)
            except errors.DeadlineExceededError:
                if time.monotonic() - progress_at > SUB_IDLE_S_MAX:
                    raise  # the publishers stopped, or the stream lost messages
                continue  # publishers not there yet (pubsub), or a slow machine
            now_ns, fetched_ns = time.time_ns(), time.perf_counter_ns() - t0
            for m in msgs:
                role.latencies_ns.append(now_ns - m.metadata.timestamp_ns if e2e else fetched_ns)
                role.bytes += len(m.data)
                await m.ack()
            got += len(msgs)
            role.msgs += len(msgs)
            progress_at = time.monotonic()
        await c.delete_consumer(spec.stream, name)
    finally:
        await c.close()


async def _timed(role: Role, tasks: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``tasks`` together, stamping the role's start and end."""
    role.start_ns = time.perf_counter_ns()
    try:
        await asyncio.gather(*tasks)
    finally:
        role.end_ns = time.perf_counter_ns()


async def _with_progress(total: int, done: Callable[[], int], work: Awaitable[Any]) -> None:
    """Await ``work`` with a progress bar on stderr (only on a terminal)."""
    if not sys.stderr.isatty():
        await work
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("bench", total=total)
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                progress.update(bar, completed=done())
                await asyncio.wait({task}, timeout=PROGRESS_REFRESH_S)
        finally:
            if not task.done():  # Ctrl-C, SIGTERM: stop the clients before the stream goes
                task.cancel()
                await asyncio.wait({task})
        await task


async def _fill(conn: Conn, spec: BenchSpec) -> None:
    """Store ``spec.msgs`` messages for ``bench sub`` (not measured)."""
    await _publisher(conn, spec, spec.msgs, Role("fill", 1))


async def _bench(conn: Conn, spec: BenchSpec, mode: str) -> list[Role]:
    """Run the bench against the prepared stream; the roles measured."""
    pub = Role("pub", spec.pubs)
    sub = Role("sub", spec.subs)

    def pubs() -> list[Coroutine[Any, Any, None]]:
        return [_publisher(conn, spec, n, pub) for n in _split(spec.msgs, spec.pubs) if n]

    def subs() -> list[Coroutine[Any, Any, None]]:
        return [_subscriber(conn, spec, i, sub, mode == "pubsub") for i in range(spec.subs)]

    if mode == "pub":
        await _with_progress(spec.msgs, lambda: pub.msgs, _timed(pub, pubs()))
        return [pub]
    if mode == "sub":
        await _fill(conn, replace(spec, sync=False))
        total = spec.msgs * spec.subs
        await _with_progress(total, lambda: sub.msgs, _timed(sub, subs()))
        return [sub]
    total = spec.msgs * (1 + spec.subs)
    both = asyncio.gather(_timed(sub, subs()), _timed(pub, pubs()))
    await _with_progress(total, lambda: pub.msgs + sub.msgs, both)
    return [pub, sub]


async def _run(c: Client, conn: Conn, spec: BenchSpec, mode: str) -> list[Role]:
    """Create the bench stream, run, remove the stream (unless ``keep``), also when Ctrl-C
    or SIGTERM cancels the run."""
    try:
        await c.add_stream(name=spec.stream, subjects=[spec.subject], num_replicas=spec.replicas)
    except asyncio.CancelledError:
        # Cancelled while the stream was being made: it may exist all the same. Removed as
        # at the end, if it is the one asked for (add_stream refuses another of that name).
        if not spec.keep:
            with contextlib.suppress(errors.NotFoundError):
                have = (await c.stream_info(spec.stream)).config
                if list(have.subjects) == [spec.subject] and have.num_replicas == spec.replicas:
                    await c.delete_stream(spec.stream)
        raise
    try:
        return await _bench(conn, spec, mode)
    finally:
        if not spec.keep:
            await c.delete_stream(spec.stream)


def _report(spec: BenchSpec, mode: str, roles: list[Role], as_json: bool) -> None:
    """The summary: one JSON document, or a table with a row per role."""
    results = [r.summary() for r in roles]
    if as_json:
        echo_json(
            {
                "mode": mode,
                "subject": spec.subject,
                "stream": spec.stream,
                "replicas": spec.replicas,
                "msgs": spec.msgs,
                "size": spec.size,
                "sync": spec.sync,
                "results": results,
            }
        )
        return
    rows = [
        (
            r["role"],
            r["clients"],
            r["msgs"],
            f"{r['seconds']:.3f}",
            f"{r['msgs_per_s']:,.0f}",
            f"{r['mb_per_s']:.2f}",
            *(f"{r['latency_ms'][p]:.2f}" for p in ("p50", "p90", "p99")),
        )
        for r in results
    ]
    title = (
        f"bench {mode} {spec.subject}: {spec.msgs} msgs of {spec.size} B, "
        f"R{spec.replicas}{', sync' if spec.sync else ''}"
    )
    headers = ["Role", "Clients", "Msgs", "Seconds", "Msgs/s", "MB/s", "p50 ms", "p90 ms"]
    print_table(title, [*headers, "p99 ms"], rows)


def bench_options(*, pubs: bool, subs: bool) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """The options of a bench mode: every mode's, plus ``--pubs`` and ``--sync`` where it
    publishes (``bench sub`` fills its stream with one publisher, not timed) and ``--subs``
    where it subscribes. A mode does not list what it would ignore: click refuses it."""
    options: list[Callable[[Callable[..., R]], Callable[..., R]]] = [
        click.argument("subject"),
        click.option("--msgs", type=click.IntRange(min=1), default=10_000, show_default=True),
        click.option("--size", type=SIZE, default="128", show_default=True,
                     help="Payload bytes (128, 1K)."),
    ]  # fmt: skip
    count = click.IntRange(min=1)
    if pubs:
        help_pubs = "Publishers, each its own connection."
        options.append(
            click.option("--pubs", type=count, default=1, show_default=True, help=help_pubs)
        )
    if subs:
        help_subs = "Subscribers, each its own connection."
        options.append(
            click.option("--subs", type=count, default=1, show_default=True, help=help_subs)
        )
    options.append(click.option("--replicas", type=count, default=1, show_default=True))
    if pubs:
        options.append(
            click.option("--sync", is_flag=True, help="Wait for each ack before the next publish.")
        )
    options += [
        click.option("--stream", default="BENCH", show_default=True),
        click.option("--keep", is_flag=True, help="Keep the bench stream afterwards."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
        connection_options,
    ]

    def decorate(f: Callable[..., R]) -> Callable[..., R]:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _command(mode: str, conn: Conn, as_json: bool, **options: Any) -> None:
    """One bench mode: check the options, run against the cluster, report."""
    options.setdefault("pubs", 1)  # a mode without the option (module docstring)
    options.setdefault("subs", 0)
    options.setdefault("sync", False)
    spec = BenchSpec(**options)
    if spec.size < 0:
        fail("--size must be 0 or more")
    roles = run(conn, lambda c: _run(c, conn, spec, mode))
    _report(spec, mode, roles, as_json)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Measure publish and consume throughput and latency.

    \b
    Example:
      raftstream bench pub bench.x --msgs 100000 --size 512 --pubs 4 --replicas 3
    """


@bench.command("pub")
@bench_options(pubs=True, subs=False)
def bench_pub(conn: Conn, as_json: bool, **options: Any) -> None:
    """Publish --msgs messages from --pubs publishers.

    \b
    Example:
      raftstream bench pub bench.x --msgs 10000 --size 128 --replicas 3 --sync
    """
    _command("pub", conn, as_json, **options)


@bench.command("sub")
@bench_options(pubs=False, subs=True)
def bench_sub(conn: Conn, as_json: bool, **options: Any) -> None:
    """Store --msgs messages, then read them all with each of --subs subscribers.

    \b
    Example:
      raftstream bench sub bench.x --msgs 10000 --subs 2
    """
    _command("sub", conn, as_json, **options)


@bench.command("pubsub")
@bench_options(pubs=True, subs=True)
def bench_pubsub(conn: Conn, as_json: bool, **options: Any) -> None:
    """Publish and consume at the same time (end-to-end latency).

    \b
    Example:
      raftstream bench pubsub bench.x --msgs 10000 --pubs 2 --subs 2 --replicas 3
    """
    _command("pubsub", conn, as_json, **options)
