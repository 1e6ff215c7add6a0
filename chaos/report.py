"""Reports of a chaos run: figures, a one-screen summary, the anomalies, a timeline plot.

``figures`` computes what the summary shows (ops by outcome, throughput, publish latency
percentiles, failover times after kills). ``write_report`` writes ``report.txt`` (summary
then every anomaly with its operations), ``report.json`` (the same, machine-readable) and
``timeline.png`` (publish throughput and latency per second, fault windows shaded) into the
run directory. matplotlib runs headless (Agg) and is imported only to draw.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raftstream.chaos.checker import EXAMPLES_MAX, SAFETY_KINDS, CheckResult
from raftstream.chaos.history import Op

__all__ = [
    "election_times",
    "failover_times",
    "figures",
    "percentile",
    "summary_text",
    "write_report",
]

KILL_NEMESES = frozenset(
    {"kill-random", "kill-stream-leader", "kill-meta-leader", "bounce", "remove-node"}
)
FAILOVER_P99_MAX_S = 1.5


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1, nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]


def failover_times(ops: Sequence[Op], nemesis: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per kill: seconds from the kill until the first publish invoked after it through a
    node still alive succeeded (what a client sees of the failover); kills never followed
    by one are left out."""
    acked = [o for o in ops if o.f == "publish" and o.type == "ok" and o.complete is not None]
    out = []
    for r in nemesis:
        if r["f"] != "start" or r.get("nemesis") not in KILL_NEMESES:
            continue
        t = float(r["time"])
        killed = r.get("facts", {}).get("killed", [])
        killed = {killed} if isinstance(killed, str) else set(killed)
        after = [o.complete for o in acked if o.invoke >= t and o.node not in killed]
        if after:
            out.append(min(x for x in after if x is not None) - t)
    return out


def election_times(nemesis: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per kill of the stream leader: seconds until a live node named a new leader."""
    out = []
    for r in nemesis:
        value = r.get("facts", {}).get("election_s") if r["f"] == "stop" else None
        if value is not None:
            out.append(float(value))
    return out


def figures(
    ops: Sequence[Op], nemesis: Sequence[Mapping[str, Any]], result: CheckResult
) -> dict[str, Any]:
    """The figures of a run (see the module docstring)."""
    pubs = [o for o in ops if o.f == "publish"]
    latencies = [(o.complete or 0.0) - o.invoke for o in pubs if o.type == "ok"]
    span = max((o.complete or o.invoke for o in ops), default=0.0)
    failovers = failover_times(ops, nemesis)
    elections = election_times(nemesis)
    kinds = Counter(a.kind for a in result.anomalies)
    return {
        "ops": len(ops),
        "publish": dict(Counter(o.type for o in pubs)),
        "acks_ok": sum(1 for o in ops if o.f == "ack" and o.type == "ok"),
        "push_acks_ok": sum(1 for o in ops if o.f == "push_ack" and o.type == "ok"),
        "kv_ops": sum(1 for o in ops if o.f in ("put", "get", "cas")),
        "churn_ops": sum(1 for o in ops if o.f.startswith(("create_", "delete_"))),
        "duration_s": round(span, 3),
        "publish_per_s": round(len(latencies) / span, 1) if span else 0.0,
        "latency_p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "latency_p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "faults": sum(1 for r in nemesis if r["f"] == "start"),
        "failovers_s": [round(x, 3) for x in failovers],
        "failover_p99_s": round(percentile(failovers, 0.99), 3) if failovers else None,
        "elections_s": elections,
        "election_p99_s": round(percentile(elections, 0.99), 3) if elections else None,
        "anomalies": dict(sorted(kinds.items())),
        "safe": result.safe,
    }


def summary_text(name: str, seed: int, figs: Mapping[str, Any], result: CheckResult) -> str:
    """One screen: the run, its figures, and a verdict."""
    lines = [
        f"chaos run {name}  seed={seed}  ({figs['duration_s']} s, {figs['faults']} faults)",
        f"  ops {figs['ops']}: publish {figs['publish']}, acks ok {figs['acks_ok']} "
        f"(push {figs['push_acks_ok']}), kv {figs['kv_ops']}, churn {figs['churn_ops']}",
        f"  publish {figs['publish_per_s']}/s, latency p50 {figs['latency_p50_ms']} ms, "
        f"p99 {figs['latency_p99_ms']} ms",
    ]
    if figs["failovers_s"]:
        p99 = figs["failover_p99_s"]
        verdict = "ok" if p99 is not None and p99 <= FAILOVER_P99_MAX_S else "SLOW"
        lines.append(
            f"  client failover after kills: {figs['failovers_s']} s, p99 {p99} s ({verdict})"
        )
    if figs["elections_s"]:
        lines.append(
            f"  new stream leader after leader kills: {figs['elections_s']} s, "
            f"p99 {figs['election_p99_s']} s"
        )
    kinds = figs["anomalies"]
    lines.append("  anomalies: " + (", ".join(f"{k}={v}" for k, v in kinds.items()) or "none"))
    safety = sum(v for k, v in kinds.items() if k in SAFETY_KINDS)
    lines.append(f"  verdict: {'SAFE' if result.safe else f'UNSAFE ({safety} safety anomalies)'}")
    return "\n".join(lines)


def _anomaly_text(result: CheckResult) -> str:
    by_kind: dict[str, list[str]] = {}
    for a in result.anomalies:
        entry = a.description + "".join(f"\n      {op}" for op in a.ops)
        by_kind.setdefault(a.kind, []).append(entry)
    out = []
    for kind, entries in sorted(by_kind.items()):
        out.append(f"{kind} ({len(entries)}):")
        out.extend(f"  - {e}" for e in entries[:EXAMPLES_MAX])
        if len(entries) > EXAMPLES_MAX:
            out.append(f"  ... {len(entries) - EXAMPLES_MAX} more")
    return "\n".join(out)


def write_report(
    run_dir: Path,
    *,
    name: str,
    seed: int,
    ops: Sequence[Op],
    nemesis: Sequence[Mapping[str, Any]],
    result: CheckResult,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Write report.txt, report.json and timeline.png under ``run_dir``; return the figures."""
    figs = figures(ops, nemesis, result)
    text = summary_text(name, seed, figs, result)
    damage = [
        f"{f['node']} {f['mode']} -> {f['outcome']}"
        for f in (extra or {}).get("faults", [])
        if "outcome" in f
    ]
    if damage:
        text += "\n  corruption: " + "; ".join(damage)
        figs["corruption"] = damage
    anomalies = _anomaly_text(result)
    (run_dir / "report.txt").write_text(text + ("\n\n" + anomalies if anomalies else "") + "\n")
    payload = {
        "name": name,
        "seed": seed,
        "figures": figs,
        "stats": result.stats,
        "extra": dict(extra or {}),
        "anomalies": [
            {"kind": a.kind, "description": a.description, "ops": list(a.ops)}
            for a in result.anomalies
        ],
    }
    (run_dir / "report.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    plot_timeline(run_dir / "timeline.png", ops, nemesis, title=f"{name} (seed {seed})")
    return figs


def _per_second(ops: Sequence[Op]) -> tuple[list[float], list[int], list[float], list[float]]:
    """Bins of one second: times, acked publishes, p50 and p99 latency (ms)."""
    acked = [o for o in ops if o.f == "publish" and o.type == "ok" and o.complete is not None]
    horizon = int(max((o.complete or 0.0 for o in acked), default=0.0)) + 1
    bins: list[list[float]] = [[] for _ in range(horizon)]
    for o in acked:
        complete = o.complete or 0.0
        bins[int(complete)].append((complete - o.invoke) * 1000)
    times = [float(i) for i in range(horizon)]
    counts = [len(b) for b in bins]
    p50 = [percentile(b, 0.5) for b in bins]
    p99 = [percentile(b, 0.99) for b in bins]
    return times, counts, p50, p99


def plot_timeline(
    path: Path, ops: Sequence[Op], nemesis: Sequence[Mapping[str, Any]], *, title: str
) -> None:
    """Throughput and latency over time, fault windows shaded, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on CI machines
    import matplotlib.pyplot as plt

    times, counts, p50, p99 = _per_second(ops)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(11, 6))
    top.bar(times, counts, width=1.0, align="edge", color="tab:blue")
    top.set_ylabel("acked publishes / s")
    top.set_title(title)
    bottom.plot(times, p50, label="p50", color="tab:green")
    bottom.plot(times, p99, label="p99", color="tab:red")
    bottom.set_ylabel("publish latency (ms)")
    bottom.set_xlabel("time since start (s)")
    bottom.legend(loc="upper right")
    end = max(times, default=0.0) + 1
    for start, stop in _windows(nemesis, end):
        for ax in (top, bottom):
            ax.axvspan(start, stop, color="tab:orange", alpha=0.25, lw=0)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _windows(nemesis: Sequence[Mapping[str, Any]], end: float) -> list[tuple[float, float]]:
    opened: dict[str, float] = {}
    out = []
    for r in nemesis:
        if r["f"] == "start":
            opened[r["value"]] = float(r["time"])
        elif r["value"] in opened:
            out.append((opened.pop(r["value"]), float(r["time"])))
    out.extend((t, end) for t in opened.values())
    return out
