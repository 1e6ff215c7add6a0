"""What a soak measures and how it judges growth: per-process samples from ``/proc``, data
directory sizes, and the trend verdict.

A sample of a process is its anonymous resident memory (``RssAnon``: the heap, what a leak
grows; the file-backed part of the RSS is LMDB's page cache and comes and goes), its whole
RSS, its open file descriptors, its threads and its CPU seconds; a node's sample adds the
bytes its data directory takes on disk (allocated blocks, so LMDB's sparse map does not
count). ``cpu_pct`` is derived between successive samples.

**The verdict** (``judge``). The first ``warmup_s`` of a run are left out: caches, the
duplicate window, the stream's limits and the Raft log's compaction cycle all fill up
first. The rest is cut into three equal spans of time; a series *grows* when the median of
the last span exceeds the median of the first by more than the metric's tolerance
(``TOLERANCES``: the larger of an absolute amount and a fraction of the first median). The
medians make a sawtooth (the garbage collector, a compaction) no trend; the tolerance is
the noise a steady process shows, so a leak is seen once it has grown past it: a longer
soak sees a slower leak. The growth per hour is reported either way. A window shorter than
``min_window_s`` gets no verdict (``growing`` None): a short run can show the harness works,
not that nothing leaks.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from raftstream.tooling.procfs import cpu_seconds, status_kib

__all__ = [
    "METRICS",
    "TOLERANCES",
    "Trend",
    "disk_bytes",
    "judge",
    "process_sample",
]

MIB = 1 << 20

# The metrics judged, in report order, with their unit for the report.
METRICS: dict[str, str] = {
    "rss_anon": "bytes",
    "rss": "bytes",
    "fds": "count",
    "threads": "count",
    "cpu_pct": "percent",
    "data": "bytes",
    "backlog": "messages",
}

# metric -> (absolute, fraction of the first span's median): the larger is the noise allowed.
TOLERANCES: dict[str, tuple[float, float]] = {
    "rss_anon": (8 * MIB, 0.05),
    "rss": (32 * MIB, 0.10),  # LMDB's page cache comes and goes with reads
    "fds": (8, 0.0),
    "threads": (4, 0.0),
    "cpu_pct": (5.0, 0.5),  # more CPU for the same load: work that piles up (timers, tasks)
    "data": (16 * MIB, 0.25),  # the Raft log between compactions, LMDB's free pages
    "backlog": (2000, 0.0),  # the consumers fall behind the steady publish rate
}


@dataclass(frozen=True, slots=True)
class Trend:
    """One series' verdict: the medians of the first and last spans after the warm-up."""

    source: str  # a node's name, or "client"
    metric: str
    first: float
    last: float
    per_hour: float  # (last - first) per hour between the spans' middles
    allowed: float  # the growth tolerated (see TOLERANCES)
    growing: bool | None  # None: the window after the warm-up is too short to judge

    @property
    def growth(self) -> float:
        return self.last - self.first


def process_sample(pid: int) -> dict[str, float] | None:
    """``rss_anon``, ``rss`` (bytes), ``fds``, ``threads`` and ``cpu_s`` of a process, or
    None when it is gone."""
    status = status_kib(pid, "RssAnon", "VmRSS", "Threads")
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    if status is None or len(status) < 3:
        return None
    return {
        "rss_anon": status["RssAnon"] * 1024,
        "rss": status["VmRSS"] * 1024,
        "fds": float(fds),
        "threads": float(status["Threads"]),
        "cpu_s": cpu_seconds(pid),
    }


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk for every file under ``path`` (0 if it is gone)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            # A file removed while walked (a stream deleted meanwhile) counts nothing.
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def judge(
    source: str,
    metric: str,
    points: list[tuple[float, float]],
    *,
    warmup_s: float,
    min_window_s: float,
) -> Trend:
    """The verdict on one series of ``(seconds since the start, value)`` points."""
    after = sorted(p for p in points if p[0] >= warmup_s)
    absolute, fraction = TOLERANCES[metric]
    if len(after) < 3 or after[-1][0] - after[0][0] < min_window_s:
        value = after[-1][1] if after else (points[-1][1] if points else 0.0)
        return Trend(source, metric, value, value, 0.0, absolute, None)
    start, end = after[0][0], after[-1][0]
    span = (end - start) / 3
    first = [v for t, v in after if t <= start + span]
    last = [v for t, v in after if t >= end - span]
    m_first, m_last = statistics.median(first), statistics.median(last)
    allowed = max(absolute, fraction * abs(m_first))
    per_hour = (m_last - m_first) / (2 * span) * 3600  # the spans' middles are 2 spans apart
    return Trend(source, metric, m_first, m_last, per_hour, allowed, m_last - m_first > allowed)
