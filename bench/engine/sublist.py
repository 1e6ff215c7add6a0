"""SubList matches/s with a warm cache and with a cold one.

``python -m raftstream.bench.engine sublist [--subs=N] [--runs=N] [--budget-s=S]``

A SubList is loaded with subscriptions shaped like a service mesh's (``svc.<app>.<region>.<id>``):
mostly literal filters, some with ``*``, a few with ``>``, a tenth of them in queue groups.
Then:

- warm: a working set smaller than the cache bound is matched over and over, so after the
  first pass every match is a cache hit;
- cold: every match is of a subject never matched before (runs draw disjoint slices of the
  whole subject space), so every match misses, walks the trie and fills (and sweeps) the cache.

Each figure is the median over several runs; the run count shrinks if the time budget is
spent, so the whole part stays well under half a minute. Hit rates are printed as measured
(from the SubList's own stats), so a warm run that missed or a cold run that hit shows.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from raftstream.engine.sublist import CACHE_ENTRIES_MAX, SubList, Subscription

__all__ = ["main"]

_APPS = 50
_REGIONS = 8
_IDS = 200
_SEED = 7


@dataclass(frozen=True, slots=True)
class _Run:
    matches: int
    seconds: float
    hits: int
    fanout_total: int

    @property
    def per_s(self) -> float:
        return self.matches / self.seconds if self.seconds > 0 else float("inf")


def _subject(app: int, region: int, ident: int) -> str:
    return f"svc.app{app}.r{region}.id{ident}"


def _filter(rng: random.Random) -> str:
    """70% literal, 20% with a '*', 10% with a '>' (the mix of a routing table)."""
    app, region, ident = rng.randrange(_APPS), rng.randrange(_REGIONS), rng.randrange(_IDS)
    kind = rng.random()
    if kind < 0.70:
        return _subject(app, region, ident)
    if kind < 0.80:
        return f"svc.app{app}.*.id{ident}"
    if kind < 0.90:
        return f"svc.*.r{region}.id{ident}"
    if kind < 0.97:
        return f"svc.app{app}.r{region}.>"
    return f"svc.app{app}.>"


def _load(subs_count: int, rng: random.Random) -> SubList:
    sl = SubList()
    for sid in range(subs_count):
        queue = f"workers{sid % 16}" if rng.random() < 0.10 else None
        sl.insert(Subscription(subject=_filter(rng), sid=sid, queue=queue))
    return sl


def _timed(sl: SubList, subjects: Sequence[str], passes: int) -> _Run:
    before = sl.stats()
    match = sl.match
    fanout = 0
    start = time.perf_counter()
    for _ in range(passes):
        for s in subjects:
            fanout += match(s).fanout
    seconds = time.perf_counter() - start
    after = sl.stats()
    return _Run(
        matches=after.matches - before.matches,
        seconds=seconds,
        hits=after.cache_hits - before.cache_hits,
        fanout_total=fanout,
    )


def _report(label: str, runs: list[_Run], detail: str) -> None:
    rate = statistics.median(r.per_s for r in runs)
    matches = sum(r.matches for r in runs)
    hit_rate = sum(r.hits for r in runs) / matches if matches else 0.0
    fanout = sum(r.fanout_total for r in runs) / matches if matches else 0.0
    print(
        f"  {label:<10} {rate:>12,.0f} matches/s   median of {len(runs)} runs x {detail}; "
        f"hit rate {hit_rate:.1%}, avg fanout {fanout:.2f}"
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.engine sublist")
    parser.add_argument("--subs", type=int, default=10_000, help="subscriptions loaded")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--budget-s", type=float, default=20.0, help="time budget, seconds")
    # The engine bench dispatcher hands every part the same flags: ignore other parts' ones.
    args, _ = parser.parse_known_args(argv)
    return args


def main(argv: list[str]) -> int:
    """Print warm- and cold-cache matches/s; return 0 (1 if the measured hit rates are off)."""
    args = _parse(argv)
    rng = random.Random(_SEED)
    deadline = time.perf_counter() + args.budget_s
    sl = _load(args.subs, rng)
    space = [_subject(a, r, i) for a in range(_APPS) for r in range(_REGIONS) for i in range(_IDS)]
    rng.shuffle(space)
    stats = sl.stats()
    print(
        f"sublist: {stats.subscriptions:,} subscriptions (~70% literal, 20% '*', 10% '>', "
        f"10% queue), {stats.nodes:,} trie nodes, cache bound {CACHE_ENTRIES_MAX} entries"
    )
    # Warm: a working set half the cache bound, matched once untimed to fill the cache.
    working = space[: CACHE_ENTRIES_MAX // 2]
    _timed(sl, working, 1)
    warm_passes = 1000
    warm = [_timed(sl, working, warm_passes)]
    while len(warm) < args.runs and time.perf_counter() < deadline - args.budget_s / 2:
        warm.append(_timed(sl, working, warm_passes))
    _report("warm", warm, f"{len(working) * warm_passes:,} matches")
    # Cold: disjoint slices of never-matched subjects, one slice per run.
    cold_slice = min(16_000, len(space[len(working) :]) // args.runs)
    cold: list[_Run] = []
    offset = len(working)
    while len(cold) < args.runs and (not cold or time.perf_counter() < deadline):
        cold.append(_timed(sl, space[offset : offset + cold_slice], 1))
        offset += cold_slice
    _report("cold", cold, f"{cold_slice:,} distinct subjects")
    warm_ok = all(r.hits == r.matches for r in warm)
    cold_ok = all(r.hits == 0 for r in cold)
    if not (warm_ok and cold_ok):
        print("  unexpected hit rates: the figures above do not measure what they claim")
        return 1
    return 0
