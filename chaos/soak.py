"""``python -m raftstream.chaos.soak`` (``make soak``): a long steady run of a local cluster
under a mixed load, sampling every process, to find what grows without bound before a
production cluster does.

The cluster is ``size`` fresh nodes on free loopback ports (default settings, fsync on),
under ``<root>/<UTC timestamp>/``. The load, from this process's SDK client, all at once:

- ``publish_async`` at ``rate`` messages/s (msg ids, 16 subjects) and two sync ``publish``
  a second into stream ``SOAK`` (R3, at most ``SOAK_MAX_MSGS`` messages: its size levels
  off);
- a pull consumer fetching 100 at a time and acking each, and a push consumer shared by a
  queue group of two subscriptions acking each;
- a mirror of ``SOAK`` (R1), a KV bucket (R3, history 3) with 20 puts and 20 gets a
  second;
- every ``churn_s``: a stream created, filled with 100 messages, read by an ephemeral
  consumer and deleted; every ``step_down_s``: the ``SOAK`` leader steps down.

Every ``sample_s`` it records, per node and for itself (``client``), what
``soak_samples.process_sample`` reads, each node's data directory size, and the
consumers' and the mirror's backlog; ``samples.csv`` grows as it goes. At the end
``report.txt`` and ``report.json`` hold the workload's counts, every error the client saw,
and the growth verdict per series (``soak_samples.judge``; the first ``warmup_s`` are left
out, and a run whose window after it is under ``MIN_WINDOW_S`` gets no verdict). The node
data directories are removed unless ``keep_data`` (the logs stay).

A node log line at ERROR (a halted group, a failed task) fails the run too: the soak found
a halted stream group that way. Ctrl-C or SIGTERM during the load stops it early; the
report is still written, over what ran, and says so.

Exit status: 0 when nothing grew, the client saw no error and the nodes logged none; 1
when a series grew, the client saw an error, a node logged one or exited; 2 when the run
could not be carried out (a node that never started) or was interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import click

from raftstream import errors
from raftstream.chaos.soak_samples import METRICS, Trend, disk_bytes, judge, process_sample
from raftstream.tooling.localcluster import NodeLauncher
from raftstream.tooling.localnet import free_port

__all__ = ["MIN_WINDOW_S", "SoakConfig", "SoakResult", "run_soak"]

MIN_WINDOW_S = 600.0  # a shorter window after the warm-up gets no growth verdict
SOAK_MAX_MSGS = 100_000
MIRROR_MAX_MSGS = 100_000
PAYLOAD = b"x" * 128
ERRORS_KEPT = 20  # first messages kept per kind of error
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class SoakConfig:
    duration_s: float = 3600.0
    sample_s: float = 10.0
    warmup_s: float | None = None  # None: a quarter of the run, at least 60 s
    rate: int = 500  # publish_async messages per second
    size: int = 3
    root: Path = Path("soak-runs")
    step_down_s: float = 120.0  # 0: never
    churn_s: float = 30.0  # 0: never
    keep_data: bool = False

    @property
    def warmup(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return max(60.0, self.duration_s / 4)


@dataclass(slots=True)
class SoakResult:
    run_dir: Path
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: dict[str, list[str]] = field(default_factory=dict)
    trends: list[Trend] = field(default_factory=list)
    node_exits: dict[str, int] = field(default_factory=dict)
    node_errors: list[str] = field(default_factory=list)  # ERROR lines of the nodes' logs
    interrupted: bool = False
    elapsed_s: float = 0.0

    @property
    def growing(self) -> list[Trend]:
        return [t for t in self.trends if t.growing]

    @property
    def ok(self) -> bool:
        return not (
            self.growing or self.errors or self.node_exits or self.node_errors or self.interrupted
        )


async def _until(event: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` (none if negative) or until ``event`` is set; whether it is."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0.0)):
            await event.wait()
    return event.is_set()


class _Load:
    """The workload's tasks on one SDK client; every error is counted, none stops it."""

    def __init__(self, rs: Any, cfg: SoakConfig, result: SoakResult) -> None:
        self.rs = rs
        self.cfg = cfg
        self.result = result
        self.stopping = asyncio.Event()

    def error(self, where: str, exc: BaseException) -> None:
        kind = f"{where}: {type(exc).__name__}"
        self.result.errors[kind] += 1
        kept = self.result.error_examples.setdefault(kind, [])
        if len(kept) < ERRORS_KEPT:
            kept.append(f"{time.strftime('%H:%M:%S')} {exc}")

    async def every(
        self,
        where: str,
        period_s: float,
        step: Callable[[], Awaitable[None]],
        *,
        wait_first: bool = False,
    ) -> None:
        """Run ``step`` every ``period_s`` until stopping (``wait_first``: a period from
        now first); an error is counted, not fatal."""
        if wait_first:
            await _until(self.stopping, period_s)
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                await step()
            except errors.RaftStreamError as exc:
                self.error(where, exc)
            left = period_s - (time.monotonic() - started)
            await _until(self.stopping, left)

    async def setup(self) -> None:
        from raftstream.config import StreamSource

        rs = self.rs
        await rs.add_stream(
            name="SOAK", subjects=["soak.>"], num_replicas=min(3, self.cfg.size),
            max_msgs=SOAK_MAX_MSGS,
        )  # fmt: skip
        await rs.add_stream(
            name="SOAK_MIRROR", mirror=StreamSource(name="SOAK"), max_msgs=MIRROR_MAX_MSGS
        )
        self.kv = await rs.create_key_value("SOAKKV", history=3, replicas=min(3, self.cfg.size))
        self.pull = await rs.pull_subscribe("soak.>", durable="soak-pull", stream="SOAK")
        self.push = [await self._subscribe() for _ in range(2)]

    async def _subscribe(self) -> Any:
        return await self.rs.subscribe(
            "soak.>",
            queue="soak-q",
            durable="soak-push",
            stream="SOAK",
            manual_ack=True,
            cb=self._pushed,
            error_cb=lambda exc: self.error("push", exc),
        )

    async def _pushed(self, msg: Any) -> None:
        await msg.ack()
        self.result.counts["push acked"] += 1

    async def publish(self) -> None:
        n = 0
        tick_s = 0.1
        pending: set[asyncio.Future[Any]] = set()
        per_tick = max(1, round(self.cfg.rate * tick_s))
        while not self.stopping.is_set():
            started = time.monotonic()
            for _ in range(per_tick):
                n += 1
                try:
                    fut = await self.rs.publish_async(
                        f"soak.orders.{n % 16}", PAYLOAD, msg_id=f"soak-{n}", wait_stall=5.0
                    )
                except errors.RaftStreamError as exc:
                    self.error("publish_async", exc)
                    break
                pending.add(fut)
            done = {f for f in pending if f.done()}
            pending -= done
            for f in done:
                if f.exception() is None:
                    self.result.counts["published"] += 1
                else:
                    self.error("publish_async ack", f.exception())  # type: ignore[arg-type]
            await asyncio.sleep(max(0.0, tick_s - (time.monotonic() - started)))
        for f in pending:
            f.cancel()

    async def publish_sync(self) -> None:
        await self.rs.publish("soak.sync", PAYLOAD)
        self.result.counts["published sync"] += 1

    async def fetch(self) -> None:
        try:
            msgs = await self.pull.fetch(100, timeout=1.0)
        except errors.DeadlineExceededError:
            return  # nothing to fetch within the second
        except errors.ConflictError as exc:
            if "Leadership Change" not in str(exc):
                raise
            # A step-down ends the pull request with its 409, as JetStream's does; the
            # deliveries are kept, and the next fetch goes on.
            self.result.counts["fetch 409 leadership change"] += 1
            return
        for m in msgs:
            await m.ack()
        self.result.counts["pull acked"] += len(msgs)

    async def kv_ops(self) -> None:
        key = f"k{random.randrange(64)}"
        await self.kv.put(key, PAYLOAD)
        self.result.counts["kv puts"] += 1
        with contextlib.suppress(errors.KeyNotFoundError):
            await self.kv.get(f"k{random.randrange(64)}")
            self.result.counts["kv gets"] += 1

    async def churn(self) -> None:
        rs, name = self.rs, "SOAK_CHURN"
        await rs.add_stream(name=name, subjects=["churn.>"], num_replicas=min(3, self.cfg.size))
        acks: list[asyncio.Future[Any]] = []
        try:
            for i in range(100):
                acks.append(await rs.publish_async("churn.x", PAYLOAD, msg_id=f"churn-{i}"))
            await rs.publish_async_completed()
            for ack in acks:
                ack.result()  # a refused one is this cycle's error
            sub = await rs.pull_subscribe("churn.>", stream=name)
            got = 0
            while got < 100:
                msgs = await sub.fetch(100 - got, timeout=5.0)
                for m in msgs:
                    await m.ack_sync()  # settled before the stream goes: no ack left in flight
                got += len(msgs)
            await sub.unsubscribe()  # deletes the ephemeral consumer
        finally:
            for ack in acks:  # read even when the cycle failed: no "never retrieved" warning
                ack.add_done_callback(lambda f: f.cancelled() or f.exception())
            await rs.delete_stream(name)
        self.result.counts["churn cycles"] += 1

    async def step_down(self) -> None:
        await self.rs.stream_leader_stepdown("SOAK")
        self.result.counts["step-downs"] += 1

    async def backlogs(self) -> dict[str, float]:
        """Unprocessed plus unacked messages of each consumer; the mirror's lag."""
        out: dict[str, float] = {}
        for durable in ("soak-pull", "soak-push"):
            info = await self.rs.consumer_info("SOAK", durable)
            out[durable] = float(info.num_pending + info.num_ack_pending)
        origin = await self.rs.stream_info("SOAK")
        mirror = await self.rs.stream_info("SOAK_MIRROR")
        out["SOAK_MIRROR"] = float(max(0, origin.state.last_seq - mirror.state.last_seq))
        return out

    def tasks(self) -> list[Awaitable[None]]:
        cfg = self.cfg
        work: list[Awaitable[None]] = [
            self.publish(),
            self.every("publish", 0.5, self.publish_sync),
            self.every("fetch", 0.0, self.fetch),
            self.every("kv", 0.05, self.kv_ops),
        ]
        if cfg.churn_s:
            work.append(self.every("churn", cfg.churn_s, self.churn, wait_first=True))
        if cfg.step_down_s:
            work.append(self.every("step-down", cfg.step_down_s, self.step_down, wait_first=True))
        return work


class _Sampler:
    """Samples every node, the client and the backlogs; appends to ``samples.csv``."""

    def __init__(self, nodes: NodeLauncher, load: _Load, out: IO[str]) -> None:
        self.nodes = nodes
        self.load = load
        self.points: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.cpu: dict[str, tuple[float, float]] = {}  # source -> (t, cpu seconds)
        self.csv = csv.writer(out)
        self.out = out
        self.csv.writerow(["t_s", "source", "metric", "value"])

    def add(self, t: float, source: str, metric: str, value: float) -> None:
        self.points.setdefault((source, metric), []).append((t, value))
        self.csv.writerow([f"{t:.1f}", source, metric, f"{value:g}"])

    async def sample(self, t: float) -> None:
        pids = {name: self.nodes.pid(name) for name in self.nodes.running()}
        pids["client"] = os.getpid()
        for source, pid in pids.items():
            s = process_sample(pid)
            if s is None:
                continue
            for metric in ("rss_anon", "rss", "fds", "threads"):
                self.add(t, source, metric, s[metric])
            before = self.cpu.get(source)
            self.cpu[source] = (t, s["cpu_s"])
            if before is not None and t > before[0]:
                self.add(t, source, "cpu_pct", 100 * (s["cpu_s"] - before[1]) / (t - before[0]))
            if source != "client":
                size = await asyncio.to_thread(disk_bytes, self.nodes.root / source)
                self.add(t, source, "data", float(size))
        try:
            for source, backlog in (await self.load.backlogs()).items():
                self.add(t, source, "backlog", backlog)
        except errors.RaftStreamError as exc:
            self.load.error("sample", exc)
        self.out.flush()

    def trends(self, warmup_s: float) -> list[Trend]:
        order = list(METRICS)
        keys = sorted(self.points, key=lambda k: (order.index(k[1]), k[0]))
        return [
            judge(src, metric, self.points[(src, metric)], warmup_s=warmup_s,
                  min_window_s=MIN_WINDOW_S)
            for src, metric in keys
        ]  # fmt: skip


async def _drive(cfg: SoakConfig, nodes: NodeLauncher, result: SoakResult) -> None:
    import raftstream

    load: _Load | None = None

    def failed_in_background(exc: errors.RaftStreamError) -> None:
        if load is not None:  # a fire-and-forget ack or a subscription's failure
            load.error("error_cb", exc)

    rs = await raftstream.connect(nodes.servers, timeout=10.0, error_cb=failed_in_background)
    load = _Load(rs, cfg, result)
    started = time.monotonic()
    interrupt = asyncio.Event()  # Ctrl-C or SIGTERM: stop early, still report
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt.set)
    try:
        await load.setup()
        with (result.run_dir / "samples.csv").open("w", newline="") as out:
            sampler = _Sampler(nodes, load, out)
            tasks = [asyncio.ensure_future(t) for t in load.tasks()]
            try:
                while (t := time.monotonic() - started) < cfg.duration_s:
                    await sampler.sample(t)
                    exits = nodes.unexpected_exits()
                    if exits:
                        result.node_exits.update(exits)
                        break
                    if await _until(interrupt, min(cfg.sample_s, cfg.duration_s - t)):
                        result.interrupted = True
                        break
            finally:
                load.stopping.set()
                _, slow = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
                for task in slow:
                    task.cancel()
                for task in tasks:
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        load.error("task", task.exception())  # type: ignore[arg-type]
            result.trends = sampler.trends(cfg.warmup)
        for sub in load.push:
            await sub.unsubscribe()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        result.elapsed_s = time.monotonic() - started
        await rs.close()


def run_soak(cfg: SoakConfig) -> SoakResult:
    """Run one soak; the report is in ``result.run_dir``. Raises ``RuntimeError`` when the
    cluster does not start."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = cfg.root / stamp
    run_dir.mkdir(parents=True, exist_ok=False)
    result = SoakResult(run_dir=run_dir)
    names = [f"n{i + 1}" for i in range(cfg.size)]
    nodes = NodeLauncher(
        run_dir, {n: f"127.0.0.1:{free_port()}" for n in names}, kill_on_parent_death=True
    )
    try:
        for name in names:
            nodes.spawn(nodes.spec(name, log_level="WARNING"))
        nodes.wait_all_serving()
        nodes.wait_meta_leader(check_alive=True)
        asyncio.run(_drive(cfg, nodes, result))
    finally:
        nodes.close()
        result.node_errors = _log_errors(run_dir, names)
        if not cfg.keep_data:
            for name in names:
                shutil.rmtree(run_dir / name, ignore_errors=True)
    _write_report(cfg, result)
    return result


def _log_errors(run_dir: Path, names: list[str]) -> list[str]:
    """The ERROR lines of the nodes' logs (a halted group, a failed task), each prefixed
    with its node's name."""
    out = []
    for name in names:
        path = run_dir / f"{name}.log"
        if path.exists():
            with path.open(errors="replace") as f:
                out += [f"{name}: {line.rstrip()}" for line in f if " ERROR " in line]
    return out


def _human(metric: str, value: float) -> str:
    unit = METRICS[metric]
    if unit == "bytes":
        return f"{value / (1 << 20):,.1f} MiB"
    if unit == "percent":
        return f"{value:.1f} %"
    return f"{value:,.0f}"


def _write_report(cfg: SoakConfig, result: SoakResult) -> None:
    lines = [
        f"soak: {cfg.size} nodes, {result.elapsed_s:.0f} s (warm-up {cfg.warmup:.0f} s left"
        f" out), sample every {cfg.sample_s:g} s, publish_async {cfg.rate}/s",
        "",
        "workload: " + ", ".join(f"{k} {v:,}" for k, v in sorted(result.counts.items())),
    ]
    if result.interrupted:
        lines.append("INTERRUPTED before the end (Ctrl-C or SIGTERM)")
    if result.node_exits:
        lines.append(f"NODES EXITED: {result.node_exits}")
    if result.node_errors:
        lines.append(f"ERRORS in the node logs: {len(result.node_errors)}, the first:")
        lines += [f"  {line[:300]}" for line in result.node_errors[:ERRORS_KEPT]]
    if result.errors:
        lines.append("ERRORS the client saw:")
        for kind, n in result.errors.most_common():
            lines.append(f"  {n:6,} {kind}")
            lines += [f"         {m}" for m in result.error_examples[kind][:3]]
    else:
        lines.append("errors the client saw: none")
    lines += ["", "source       metric    first span   last span    per hour     allowed   verdict"]
    for t in result.trends:
        verdict = "too short" if t.growing is None else ("GROWING" if t.growing else "flat")
        lines.append(
            f"{t.source:<12} {t.metric:<9} {_human(t.metric, t.first):>11}  "
            f"{_human(t.metric, t.last):>11}  {_human(t.metric, t.per_hour):>10}  "
            f"{_human(t.metric, t.allowed):>10}   {verdict}"
        )
    lines += ["", f"verdict: {'OK' if result.ok else 'FAILED'}"]
    (result.run_dir / "report.txt").write_text("\n".join(lines) + "\n")
    summary = {
        "ok": result.ok,
        "elapsed_s": result.elapsed_s,
        "config": {k: str(v) for k, v in asdict(cfg).items()},
        "counts": dict(result.counts),
        "errors": dict(result.errors),
        "error_examples": result.error_examples,
        "node_exits": result.node_exits,
        "node_errors": result.node_errors,
        "interrupted": result.interrupted,
        "trends": [{**asdict(t), "growth": t.growth} for t in result.trends],
    }
    (result.run_dir / "report.json").write_text(json.dumps(summary, indent=2) + "\n")


@click.command()
@click.option(
    "--time",
    "duration_s",
    envvar="SOAK_TIME",
    type=click.FloatRange(min=1),
    default=3600.0,
    show_default=True,
    help="Seconds of load.",
)
@click.option(
    "--sample",
    "sample_s",
    envvar="SOAK_SAMPLE",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between samples.",
)
@click.option(
    "--warmup",
    "warmup_s",
    envvar="SOAK_WARMUP",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds left out of the verdict (default: a quarter of --time, at least 60).",
)
@click.option(
    "--rate",
    envvar="SOAK_RATE",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="publish_async messages per second.",
)
@click.option(
    "--size",
    envvar="SOAK_SIZE",
    type=click.IntRange(1, 5),
    default=3,
    show_default=True,
    help="Nodes.",
)
@click.option(
    "--root",
    envvar="SOAK_ROOT",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("soak-runs"),
    show_default=True,
    help="Where runs go.",
)
@click.option(
    "--step-down",
    "step_down_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds between step-downs of the SOAK leader (0: none).",
)
@click.option(
    "--churn",
    "churn_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds between stream create/fill/read/delete cycles (0: none).",
)
@click.option("--keep-data", is_flag=True, help="Keep the nodes' data directories.")
def main(**options: Any) -> None:
    """Run a local cluster under a steady mixed load for --time seconds, sampling every
    process, and report what grew. Exit 0: nothing grew and no error; 1: a series grew, the
    client saw an error, a node logged one or exited; 2: the run could not be carried out,
    or was interrupted (Ctrl-C, SIGTERM: the report covers what ran)."""
    cfg = SoakConfig(**options)
    # SIGTERM (``timeout``, a CI job's end) stops a soak as Ctrl-C does, so it still stops
    # its node processes.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = run_soak(cfg)
    except (RuntimeError, TimeoutError, errors.RaftStreamError) as exc:
        click.echo(f"soak: the run could not be carried out: {exc}", err=True)
        sys.exit(2)
    click.echo((result.run_dir / "report.txt").read_text())
    click.echo(f"samples, report and node logs under {result.run_dir}")
    if result.interrupted:
        sys.exit(2)
    if not result.ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
