"""The soak harness (``raftstream.chaos.soak``): the growth verdict on made-up series, the
samples of a real process, and a short soak of a real cluster (``make soak`` runs an hour).

The short soak cannot judge growth (its window is under ``MIN_WINDOW_S``, and it says so);
it shows that every part of the load ran and was sampled, that a step-down and stream
churn cost the client no error, and that the run cleans up after itself.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from raftstream.chaos.soak import MIN_WINDOW_S, SoakConfig, run_soak
from raftstream.chaos.soak_samples import METRICS, MIB, disk_bytes, judge, process_sample


def _series(values: list[float], step_s: float = 10.0) -> list[tuple[float, float]]:
    return [(i * step_s, v) for i, v in enumerate(values)]


def test_a_steady_leak_is_growing() -> None:
    # 1 MiB a minute for an hour over a noisy 60 MiB base: 45 MiB after the warm-up.
    rng = random.Random(1)
    values = [60 * MIB + i * MIB / 6 + rng.uniform(-2, 2) * MIB for i in range(360)]
    t = judge("n1", "rss_anon", _series(values), warmup_s=900, min_window_s=600)
    assert t.growing is True
    assert 50 * MIB < t.per_hour < 70 * MIB
    assert t.growth > t.allowed


def test_noise_and_a_sawtooth_are_flat() -> None:
    rng = random.Random(2)
    sawtooth = [80 * MIB + (i % 30) * MIB / 4 + rng.uniform(-3, 3) * MIB for i in range(360)]
    t = judge("n2", "rss_anon", _series(sawtooth), warmup_s=900, min_window_s=600)
    assert t.growing is False
    fds = judge("n2", "fds", _series([40 + (i % 3) for i in range(360)]), warmup_s=900,
                min_window_s=600)  # fmt: skip
    assert fds.growing is False


def test_warm_up_growth_is_left_out() -> None:
    # Grows 40 MiB in the first 15 minutes, flat after.
    values = [50 * MIB + min(i, 90) * 40 * MIB / 90 for i in range(360)]
    assert judge("n3", "rss_anon", _series(values), warmup_s=900, min_window_s=600).growing is False
    assert judge("n3", "rss_anon", _series(values), warmup_s=0, min_window_s=600).growing is True


def test_growth_below_the_tolerance_is_flat_and_a_short_window_is_not_judged() -> None:
    values = [100.0 + i * 1500 / 360 for i in range(360)]  # backlog up 1,000 after warm-up
    assert judge("c", "backlog", _series(values), warmup_s=900, min_window_s=600).growing is False
    short = judge("c", "backlog", _series(values[:60]), warmup_s=60, min_window_s=MIN_WINDOW_S)
    assert short.growing is None
    assert short.first == short.last == values[59]


def test_process_sample_and_disk_bytes(tmp_path: Path) -> None:
    s = process_sample(os.getpid())
    assert s is not None
    assert 0 < s["rss_anon"] <= s["rss"]
    assert s["fds"] >= 3 and s["threads"] >= 1 and s["cpu_s"] > 0
    with open(tmp_path / "f", "wb") as f:
        f.write(b"x" * 100_000)
    assert 100_000 <= disk_bytes(tmp_path) < 200_000
    assert disk_bytes(tmp_path / "gone") == 0


@pytest.mark.integration
def test_a_short_soak_runs_every_part_and_cleans_up(tmp_path: Path) -> None:
    cfg = SoakConfig(
        duration_s=25, sample_s=1, warmup_s=5, rate=200, root=tmp_path, step_down_s=8,
        churn_s=6,
    )  # fmt: skip
    result = run_soak(cfg)
    report = (result.run_dir / "report.txt").read_text()
    assert result.errors == {}, report
    assert result.node_exits == {}, report
    assert result.node_errors == [] and not result.interrupted, report
    for part in ("published", "published sync", "pull acked", "push acked", "kv puts",
                 "churn cycles", "step-downs"):  # fmt: skip
        assert result.counts[part] > 0, (part, report)
    # Every process and metric sampled; no growth verdict from a 20 s window.
    sources = {t.source for t in result.trends}
    assert {"n1", "n2", "n3", "client"} <= sources
    by_key = {(t.source, t.metric): t for t in result.trends}
    for metric in METRICS:
        if metric == "backlog":
            assert {("soak-pull", metric), ("soak-push", metric), ("SOAK_MIRROR", metric)} <= set(
                by_key
            )
        elif metric == "data":
            assert all(by_key[(n, metric)].last > 0 for n in ("n1", "n2", "n3"))
        else:
            assert all((n, metric) in by_key for n in ("n1", "n2", "n3", "client"))
    assert all(t.growing is None for t in result.trends)
    assert "too short" in report and "verdict: OK" in report
    summary = json.loads((result.run_dir / "report.json").read_text())
    assert summary["ok"] is True and summary["counts"]["published"] == result.counts["published"]
    lines = (result.run_dir / "samples.csv").read_text().splitlines()
    assert lines[0] == "t_s,source,metric,value" and len(lines) > 100
    # The node data is gone, the logs stay, and no node process is left.
    assert not any((result.run_dir / n).exists() for n in ("n1", "n2", "n3"))
    assert all((result.run_dir / f"{n}.log").is_file() for n in ("n1", "n2", "n3"))
