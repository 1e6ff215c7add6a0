"""The Raft benchmark parts; each starts its own 3-node cluster and returns table rows.

(a) commit throughput and latency, one group; (b) the same over 100 groups; (c) idle CPU and
memory per group with 1,000 groups; (d) leader failover after kill -9. Every node is a
separate process with fsync on; proposals are 128 bytes.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftstream.bench.raft.cluster import BenchCluster, cpu_seconds, rss_bytes

__all__ = ["PARTS", "BenchOptions", "Row"]

PROPOSAL_BYTES = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    root: Path
    tick_ms: int
    load_seconds: float = 5.0
    idle_groups: int = 1000
    idle_window_seconds: float = 10.0
    kills: int = 20


@dataclass(frozen=True, slots=True)
class Row:
    part: str
    metric: str
    value: str
    goal: str = ""


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _load(
    cluster: BenchCluster, leaders: dict[str, str], inflight_per_group: int, seconds: float
) -> tuple[float, list[float], int]:
    """Run the closed-loop load on every group's leader at once: (commits/s, latencies, errs)."""
    by_node: dict[str, list[str]] = {}
    for g, n in leaders.items():
        by_node.setdefault(n, []).append(g)
    replies = await asyncio.gather(
        *(
            cluster.nodes[n].call(
                "load", groups=gs, seconds=seconds, inflight=inflight_per_group,
                size=PROPOSAL_BYTES,
            )
            for n, gs in by_node.items()
        )
    )  # fmt: skip
    lat: list[float] = [x for r in replies for x in r["lat_ms"]]
    elapsed = max(r["elapsed"] for r in replies)
    return len(lat) / elapsed, lat, sum(int(r["errors"]) for r in replies)


def _load_rows(part: str, label: str, result: tuple[float, list[float], int]) -> list[Row]:
    rate, lat, errors = result
    p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
    rows = [
        Row(part, f"{label}: commits/s", f"{rate:,.0f}"),
        Row(part, f"{label}: latency p50 / p99 ms", f"{p50:.2f} / {p99:.2f}"),
    ]
    if errors:
        rows.append(Row(part, f"{label}: failed proposals", str(errors)))
    return rows


async def _with_cluster(
    opts: BenchOptions, name: str, body: Callable[[BenchCluster], Awaitable[list[Row]]]
) -> list[Row]:
    cluster = BenchCluster(opts.root / name, tick_ms=opts.tick_ms)
    try:
        await cluster.start()
        return await body(cluster)
    finally:
        await cluster.close()


async def part_a(opts: BenchOptions) -> list[Row]:
    async def body(cluster: BenchCluster) -> list[Row]:
        await cluster.add_groups(["g0"])
        leaders = await cluster.wait_all_led()
        one = await _load(cluster, leaders, 1, opts.load_seconds)
        many = await _load(cluster, leaders, 1000, opts.load_seconds)
        return _load_rows("a", "1 group, 1 in flight", one) + _load_rows(
            "a", "1 group, 1000 in flight", many
        )

    return await _with_cluster(opts, "a", body)


async def part_b(opts: BenchOptions) -> list[Row]:
    async def body(cluster: BenchCluster) -> list[Row]:
        await cluster.add_groups([f"g{i}" for i in range(100)])
        leaders = await cluster.wait_all_led()
        spread = sorted(list(leaders.values()).count(n) for n in cluster.nodes)
        one = await _load(cluster, leaders, 1, opts.load_seconds)
        many = await _load(cluster, leaders, 10, opts.load_seconds)
        return [
            Row("b", "100 groups: leaders per node", " / ".join(map(str, spread))),
            *_load_rows("b", "100 groups, 1 in flight each (100 total)", one),
            *_load_rows("b", "100 groups, 10 in flight each (1000 total)", many),
        ]

    return await _with_cluster(opts, "b", body)


async def _idle(opts: BenchOptions, quiesce: bool) -> list[Row]:
    label = "quiescence on" if quiesce else "quiescence off"

    async def body(cluster: BenchCluster) -> list[Row]:
        n = opts.idle_groups
        await asyncio.sleep(1.0)
        rss_before = {p.node_id: rss_bytes(p.pid) for p in cluster.running()}
        await cluster.add_groups([f"g{i}" for i in range(n)])
        await cluster.wait_all_led()
        await asyncio.sleep(3.0)  # let the elections' traffic drain (and groups quiesce)
        cpu0 = {p.node_id: cpu_seconds(p.pid) for p in cluster.running()}
        t0 = time.monotonic()
        await asyncio.sleep(opts.idle_window_seconds)
        window = time.monotonic() - t0
        cpu = [100 * (cpu_seconds(p.pid) - cpu0[p.node_id]) / window for p in cluster.running()]
        kib = [(rss_bytes(p.pid) - rss_before[p.node_id]) / n / 1024 for p in cluster.running()]
        goal = "< 10" if quiesce else ""
        return [
            Row("c", f"{n} idle groups, {label}: CPU % of a core, n1 / n2 / n3",
                " / ".join(f"{c:.1f}" for c in cpu), goal),
            Row("c", f"{n} idle groups, {label}: RSS per group, n1 / n2 / n3",
                " / ".join(f"{k:.1f}" for k in kib) + " KiB"),
        ]  # fmt: skip

    cluster = BenchCluster(
        opts.root / f"c-{label[-3:].strip()}", tick_ms=opts.tick_ms, quiesce=quiesce
    )
    try:
        await cluster.start()
        return await body(cluster)
    finally:
        await cluster.close()


async def part_c(opts: BenchOptions) -> list[Row]:
    return [*await _idle(opts, quiesce=True), *await _idle(opts, quiesce=False)]


async def _one_failover(cluster: BenchCluster) -> float:
    leaders = await cluster.wait_all_led()
    old = leaders["g0"]
    survivors = [p for p in cluster.running() if p.node_id != old]
    waits = [
        asyncio.create_task(p.call("await_commit", group="g0", old_leader=old, seconds=30))
        for p in survivors
    ]
    await asyncio.sleep(0.05)  # the survivors are polling before the kill
    t_kill = time.time()
    await cluster.nodes[old].kill()
    replies: list[dict[str, Any]] = await asyncio.gather(*waits)
    times = [float(r["t"]) for r in replies if r.get("committed")]
    if not times:
        raise RuntimeError("no new leader committed within 30 s")
    await cluster.restart(old)
    return min(times) - t_kill


async def part_d(opts: BenchOptions) -> list[Row]:
    async def body(cluster: BenchCluster) -> list[Row]:
        await cluster.add_groups(["g0"])
        samples = [await _one_failover(cluster) * 1000 for _ in range(opts.kills)]
        spread = f"{min(samples):.0f} / {statistics.mean(samples):.0f} / {max(samples):.0f}"
        return [
            Row("d", f"kill -9 leader -> first commit ({len(samples)} kills): p50 ms",
                f"{_pct(samples, 0.5):.0f}"),
            Row("d", "failover p99 ms", f"{_pct(samples, 0.99):.0f}", "< 1500"),
            Row("d", "failover min / mean / max ms", spread),
        ]  # fmt: skip

    return await _with_cluster(opts, "d", body)


PARTS: dict[str, Callable[[BenchOptions], Awaitable[list[Row]]]] = {
    "a": part_a,
    "b": part_b,
    "c": part_c,
    "d": part_d,
}
