"""Chaos campaigns: one fresh cluster per nemesis, workloads under faults, then the checks.

One run (``run_one``): start a cluster behind proxies; set up the workloads; run them while
the nemesis timeline injects and heals faults for ``duration_s``; stop the workers; drain
the queue; take the final reads; wait (bounded) for replicas to catch up; stop every node
gracefully and read each node's store read-only from its data directory; check; report.

A campaign (``run_campaign``) does that ``runs`` times for every nemesis asked for (round
by round, so a campaign cut short has as many runs of each), under
``<root>/<UTC timestamp>-<seed>/<nemesis>/`` (``<nemesis>/r<k>/`` when ``runs`` > 1): node
data directories (kept for the Spark audit: ``raftstream audit run <dir>``), node logs and
configs, ``history.jsonl``, ``report.txt``, ``report.json`` and ``timeline.png``; plus
``campaign.txt`` and ``campaign.json`` at the top, rewritten after every run, with the
figures per nemesis summed over its runs (lost acknowledged messages, divergence, acked
redeliveries, minority acks, failover p99). One seed drives every random choice of the
harness (which node, which fault, when); run ``k`` of a nemesis draws from
``<seed>:<nemesis>:<k>`` (the first run from ``<seed>:<nemesis>``). The cluster's own timing
is not deterministic, so a seed replays the same schedule, not the same interleaving. A run
whose cluster could not even start (a free port taken by another process meanwhile) is
tried again, up to ``START_ATTEMPTS`` times, in ``<run dir>-start<n>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt

from raftstream.audit.layout import open_readonly
from raftstream.audit.readers import content_hash, iter_store_msgs, split_group, store_streams
from raftstream.chaos.checker import SAFETY_KINDS, CheckResult, NodeContents, check
from raftstream.chaos.cluster import ChaosCluster, wait_for
from raftstream.chaos.history import History, load_ops
from raftstream.chaos.nemesis import NEMESES, NemesisContext, run_timeline
from raftstream.chaos.proxyctl import ProxyService, start_toxiproxy
from raftstream.chaos.report import percentile, write_report
from raftstream.chaos.workloads import WorkloadConfig, Workloads

__all__ = ["CampaignConfig", "ClusterStartError", "RunOutcome", "run_campaign", "run_one"]

log = logging.getLogger(__name__)

SETTLE_TIMEOUT_S = 30.0
START_ATTEMPTS = 3  # a run whose cluster cannot start (a port taken meanwhile) is tried again
CATCH_UP_TIMEOUT_S = 20.0
WORKERS_STOP_TIMEOUT_S = 30.0


class ClusterStartError(RuntimeError):
    """A run's cluster did not start (nothing was injected or checked yet)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CampaignConfig:
    """What to run: nemeses, runs of each, seconds of faults per run, cluster size, workload
    sizes."""

    nemeses: tuple[str, ...] = tuple(NEMESES)
    duration_s: float = 300.0
    seed: int = 0
    size: int = 3
    runs: int = 1
    root: Path = Path("chaos-runs")
    # The nodes' [raft] snapshot_entries (None: the node default): a few dozen makes every
    # group compact, and a restarted or cut-off node catch up by snapshot, all run long.
    snapshot_entries: int | None = None
    quiet_s: tuple[float, float] = (2.0, 4.0)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)


@dataclass(slots=True)
class RunOutcome:
    """One nemesis run: where it is, its figures and its check result."""

    nemesis: str
    run_dir: Path
    figures: dict[str, Any]
    result: CheckResult
    facts: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""  # the harness failed (e.g. a node never started): nothing was checked


def run_one(
    nemesis: str, *, cfg: CampaignConfig, run_dir: Path, proxies: ProxyService, run: int = 0
) -> RunOutcome:
    """Run number ``run`` of ``nemesis`` (see the module docstring). The cluster is always
    torn down."""
    rng = random.Random(f"{cfg.seed}:{nemesis}" + (f":{run}" if run else ""))
    # The workload streams live on every node, so a minority of the cluster is a minority of
    # their groups too: the minority-ack check relies on it (an R3 stream on 5 nodes could
    # have its own majority on the smaller side of a split, and rightly acknowledge there).
    cfg = replace(cfg, workload=replace(cfg.workload, replicas=cfg.size))
    run_dir.mkdir(parents=True, exist_ok=True)
    raft = {} if cfg.snapshot_entries is None else {"snapshot_entries": cfg.snapshot_entries}
    cluster = ChaosCluster(size=cfg.size, run_dir=run_dir / "data", proxies=proxies, raft=raft)
    history = History(run_dir / "history.jsonl")
    try:
        try:
            cluster.start()
        except (RuntimeError, TimeoutError) as exc:
            raise ClusterStartError(f"the cluster did not start: {exc!r}") from exc
        ctx = NemesisContext(
            cluster=cluster, rng=rng, history=history, stream=cfg.workload.queue_stream
        )
        asyncio.run(_drive(ctx, cfg, nemesis))
        _wait_caught_up(cluster, cfg.workload)
        for name in cluster.names:
            cluster.stop(name)
        contents = read_node_contents(cluster)
    finally:
        history.close()
        cluster.close()
    ops, nemesis_records = load_ops(run_dir / "history.jsonl")
    result = check(ops, nemesis_records, contents)
    facts = [r.get("facts", {}) for r in nemesis_records if r["f"] == "stop"]
    figs = write_report(
        run_dir,
        name=nemesis,
        seed=cfg.seed,
        ops=ops,
        nemesis=nemesis_records,
        result=result,
        extra={"damaged": sorted(cluster.damaged), "faults": facts},
    )
    return RunOutcome(nemesis, run_dir, figs, result, facts)


async def _drive(ctx: NemesisContext, cfg: CampaignConfig, nemesis: str) -> None:
    """Workloads under the nemesis timeline, then drain and final reads."""
    nodes = {n: p.addr for n, p in ctx.cluster.nodes.items()}
    rng = random.Random(ctx.rng.random())
    workloads = Workloads(nodes=nodes, history=ctx.history, rng=rng, cfg=cfg.workload)
    try:
        await workloads.setup()
        stop = asyncio.Event()
        workers = asyncio.create_task(workloads.run(stop))
        timeline_stop = threading.Event()
        try:
            await asyncio.to_thread(
                run_timeline,
                ctx,
                NEMESES[nemesis],
                duration_s=cfg.duration_s,
                quiet_s=cfg.quiet_s,
                stop=timeline_stop,
            )
        finally:
            timeline_stop.set()
            stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(workers, WORKERS_STOP_TIMEOUT_S)
        await asyncio.to_thread(_settle, ctx.cluster, cfg.workload)
        workloads.exclude(ctx.cluster.damaged)
        await workloads.drain()
        await workloads.final_reads()
    finally:
        await workloads.close()


def _settle(cluster: ChaosCluster, wl: WorkloadConfig) -> None:
    """After healing: a meta leader and a leader for each workload stream (bounded)."""
    cluster.wait_meta_leader(SETTLE_TIMEOUT_S)
    for stream in (wl.queue_stream, wl.kv_stream):
        wait_for(f"a leader of {stream}", partial(cluster.stream_leader, stream), SETTLE_TIMEOUT_S)


def _wait_caught_up(cluster: ChaosCluster, wl: WorkloadConfig) -> None:
    """Give followers time to apply everything before the stores are read (a node left
    behind then shows as ``replica-lag``, not as a harness error)."""
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    for stream in (wl.queue_stream, wl.kv_stream):
        while time.monotonic() < deadline and not cluster.replicas_current(stream):
            time.sleep(0.2)


def read_node_contents(cluster: ChaosCluster) -> dict[str, NodeContents]:
    """Each stopped, undamaged node's stores: stream -> seq -> (content hash, value)."""
    out: dict[str, NodeContents] = {}
    for name, node in cluster.nodes.items():
        store = node.data / "store"
        if name in cluster.damaged or not (store / "data.mdb").is_file():
            continue
        env = open_readonly(store)
        try:
            streams: dict[str, dict[int, tuple[str, Any]]] = {}
            for s in store_streams(env):
                _, stream = split_group(s.name)
                msgs = iter_store_msgs(env, s.stream_id, 0, s.meta.last_seq + 1)
                streams[stream] = {
                    m.seq: (content_hash(m.subject, m.headers, m.data), _value(m.data))
                    for m in msgs
                }
            out[name] = streams
        finally:
            env.close()
    return out


def _value(data: bytes) -> Any:
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError):
        return data.decode(errors="replace")


def run_campaign(cfg: CampaignConfig) -> tuple[Path, list[RunOutcome]]:
    """``cfg.runs`` rounds of every nemesis of ``cfg``; returns the campaign directory and the
    outcomes (round by round)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    root = cfg.root / f"{stamp}-{cfg.seed}"
    root.mkdir(parents=True, exist_ok=True)
    outcomes: list[RunOutcome] = []
    with start_toxiproxy() as proxies:
        for run in range(cfg.runs):
            for name in cfg.nemeses:
                run_dir = root / name / f"r{run + 1}" if cfg.runs > 1 else root / name
                try:
                    outcome = _run_started(name, cfg=cfg, run_dir=run_dir, proxies=proxies, run=run)
                except Exception as exc:  # one broken run must not hide the others' results
                    log.exception("chaos run %s failed", name)
                    outcome = RunOutcome(name, run_dir, {}, CheckResult(), error=repr(exc))
                outcomes.append(outcome)
                report = run_dir / "report.txt"
                text = report.read_text() if report.exists() else outcome.error
                print(text.split("\n\n")[0], flush=True)
                _write_campaign(root, cfg, outcomes)
    return root, outcomes


def _run_started(
    name: str, *, cfg: CampaignConfig, run_dir: Path, proxies: ProxyService, run: int
) -> RunOutcome:
    """``run_one``, tried again (fresh ports, a fresh directory) when its cluster could not
    start: a free port taken by another process before the node bound it is the machine's
    doing, not the system's. Failures after the start are never retried."""
    retrying = Retrying(
        retry=retry_if_exception_type(ClusterStartError),
        stop=stop_after_attempt(START_ATTEMPTS),
        reraise=True,
    )
    for attempt in retrying:
        with attempt:
            n = attempt.retry_state.attempt_number
            where = run_dir if n == 1 else run_dir.with_name(f"{run_dir.name}-start{n}")
            return run_one(name, cfg=cfg, run_dir=where, proxies=proxies, run=run)
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover


# Anomaly kinds the campaign totals name: what the issue asks to be zero in every nemesis.
LOST_KINDS = ("lost-prefix", "lost-middle", "lost-postfix")
TOTAL_KINDS = {
    "lost": LOST_KINDS,
    "divergence": ("divergence",),
    "acked_redelivered": ("acked-redelivered",),
    "minority_acks": ("minority-ack",),
}


def nemesis_totals(outcomes: Sequence[RunOutcome]) -> dict[str, dict[str, Any]]:
    """Per nemesis, over its runs: how many ran, were safe or failed to run; publishes acked;
    the anomaly counts of ``TOTAL_KINDS`` and of every safety kind; failover and election p99
    over every kill of every run; corruption outcomes."""
    out: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        t = out.setdefault(
            o.nemesis,
            {
                "runs": 0,
                "safe": 0,
                "errors": 0,
                "faults": 0,
                "acked": 0,
                **{k: 0 for k in TOTAL_KINDS},
                "safety_anomalies": 0,
                "failovers_s": [],
                "elections_s": [],
                "corruption": [],
            },
        )
        t["runs"] += 1
        if o.error:
            t["errors"] += 1
            continue
        t["safe"] += int(o.result.safe)
        kinds: dict[str, int] = o.figures.get("anomalies", {})
        for key, names in TOTAL_KINDS.items():
            t[key] += sum(kinds.get(k, 0) for k in names)
        t["safety_anomalies"] += sum(v for k, v in kinds.items() if k in SAFETY_KINDS)
        t["faults"] += o.figures.get("faults", 0)
        t["acked"] += o.figures.get("publish", {}).get("ok", 0)
        t["failovers_s"] += o.figures.get("failovers_s", [])
        t["elections_s"] += o.figures.get("elections_s", [])
        t["corruption"] += o.figures.get("corruption", [])
    for t in out.values():
        fails, elections = t.pop("failovers_s"), t.pop("elections_s")
        t["failovers"] = len(fails)
        t["failover_p99_s"] = round(percentile(fails, 0.99), 3) if fails else None
        t["election_p99_s"] = round(percentile(elections, 0.99), 3) if elections else None
    return out


def _write_campaign(root: Path, cfg: CampaignConfig, outcomes: Sequence[RunOutcome]) -> None:
    keys = (
        "ops",
        "publish",
        "faults",
        "failover_p99_s",
        "election_p99_s",
        "anomalies",
        "corruption",
    )
    rows = [
        {
            "nemesis": o.nemesis,
            "run_dir": str(o.run_dir),
            "safe": o.result.safe and not o.error,
            "error": o.error,
            **{k: o.figures.get(k) for k in keys},
            "facts": o.facts,
        }
        for o in outcomes
    ]
    totals = nemesis_totals(outcomes)
    payload = {
        "seed": cfg.seed,
        "duration_s": cfg.duration_s,
        "size": cfg.size,
        "runs_per_nemesis": cfg.runs,
        "snapshot_entries": cfg.snapshot_entries,
        "totals": totals,
        "runs": rows,
    }
    (root / "campaign.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    lines = [f"campaign seed={cfg.seed} duration={cfg.duration_s}s size={cfg.size} runs={cfg.runs}"]
    if cfg.snapshot_entries is not None:
        lines[0] += f" snapshot_entries={cfg.snapshot_entries}"
    for r in rows:
        if r["error"]:
            lines.append(f"  {r['nemesis']:<20} ERROR  {r['error']}")
            continue
        verdict = "SAFE" if r["safe"] else "UNSAFE"
        lines.append(
            f"  {r['nemesis']:<20} {verdict:<6} ops={r['ops']} publish={r['publish']} "
            f"faults={r['faults']} failover_p99={r['failover_p99_s']} "
            f"election_p99={r['election_p99_s']} anomalies={r['anomalies']}"
            + (f" corruption={r['corruption']}" if r["corruption"] else "")
        )
    lines.append("per nemesis, over its runs:")
    for name, t in totals.items():
        lines.append(
            f"  {name:<20} runs={t['runs']} safe={t['safe']} errors={t['errors']} "
            f"faults={t['faults']} acked={t['acked']} lost={t['lost']} "
            f"divergence={t['divergence']} acked_redelivered={t['acked_redelivered']} "
            f"minority_acks={t['minority_acks']} safety_anomalies={t['safety_anomalies']} "
            f"failover_p99={t['failover_p99_s']} ({t['failovers']} kills) "
            f"election_p99={t['election_p99_s']}"
            + (f" corruption={len(t['corruption'])}" if t["corruption"] else "")
        )
    (root / "campaign.txt").write_text("\n".join(lines) + "\n")


def smoke_config(root: Path, seed: int) -> CampaignConfig:
    """A short campaign for CI: a few nemeses, short windows, light workloads. ``pause`` is
    left to the full campaign while the stale-read bug it finds is open (its regression
    test is tests/chaos/test_campaign_stale_read.py)."""
    return CampaignConfig(
        nemeses=("isolate-leader", "kill-stream-leader", "bounce"),
        duration_s=8.0,
        seed=seed,
        root=root,
        quiet_s=(1.0, 2.0),
        workload=replace(
            WorkloadConfig(), publishers=2, consumers=1, kv_workers=2, drain_timeout_s=15.0
        ),
    )
