"""Publishes/s applied through ``Stream.apply`` on the LMDB store, against raw store appends.

Every replica applies committed publishes through ``Stream.apply`` inside one store
transaction per batch, so this is the per-replica ceiling of the publish path. For each batch
size (entries per write transaction, fsync on) the same run measures, back to back:

- store: ``LmdbStreamStore.append`` of a 128-byte payload, ``batch`` appends inside one
  ``store.transaction()`` (what ``bench/engine/store.py`` calls "store");
- stream: ``Stream.apply(Publish)`` of the same messages, no msg id;
- stream+id: the same with a unique msg id per publish, and a short duplicate window so
  that the steady state (each publish expires about one old dedup record) is measured.

The stream is a limits stream with a few subjects (two wildcards and a literal); entries are
built before the clock starts, as a replica receives them decoded from the log. Timestamps
advance 25 us per message (40,000 msgs/s). Each figure is the median of ``--runs`` runs; a
ratio is the median of the per-run stream/store ratios. Total time stays bounded (a fixed,
small number of messages per run). Usage: ``python -m raftstream.bench.engine stream
[--runs=N | --quick]``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raftstream.engine.entries import Publish
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.stream import Stream
from raftstream.engine.stream_config import StreamConfig

__all__ = ["Figure", "main", "measure"]

PAYLOAD_BYTES = 128
BATCH_SIZES = (1, 100, 1000)
# Messages per run for each batch size: enough transactions to average the fsync, small
# enough that every run of every size finishes well under a minute on a slow disk.
MSGS_PER_RUN = {1: 200, 100: 5_000, 1000: 20_000}
RUNS_DEFAULT = 5
RUNS_MAX = 15
MAP_SIZE_BYTES = 2 * 1024**3
STREAM_SUBJECTS = ("bench.orders.*", "bench.audit.>", "bench.misc")
SUBJECTS = (*(f"bench.orders.{i}" for i in range(6)), "bench.audit.eu.1", "bench.misc")
TS_START_NS = 1_700_000_000 * 1_000_000_000
TS_STEP_NS = 25_000  # 40,000 msgs/s of leader time
# With ids: a 1 s window at 40,000 msgs/s holds ~40,000 records, so after the first second
# of leader time every publish also expires about one record (the steady state).
DUPLICATE_WINDOW_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Figure:
    """Medians over the runs of one batch size (per second); ratios are the medians of the
    per-run stream/store ratios (each triple measured back to back)."""

    batch: int
    store_per_s: float
    stream_per_s: float
    stream_ids_per_s: float
    ratio: float
    ratio_ids: float


class _Clock:
    """Leader time of one stream: strictly increasing stamps."""

    def __init__(self) -> None:
        self.ts = TS_START_NS

    def take(self) -> int:
        self.ts += TS_STEP_NS
        return self.ts


class _StoreAppends:
    """Raw store appends: the floor ``Stream.apply`` is compared with."""

    def __init__(self, env: Any) -> None:
        self._store = LmdbStreamStore(env, "BENCH_STORE")
        self._clock = _Clock()

    def run(self, batch: int, msgs: int) -> float:
        store, payload, clock = self._store, b"x" * PAYLOAD_BYTES, self._clock
        stamps = [clock.take() for _ in range(msgs)]
        append, subjects, n = store.append, SUBJECTS, len(SUBJECTS)
        started = time.perf_counter()
        for lo in range(0, msgs, batch):
            with store.transaction():
                for i in range(lo, lo + batch):
                    append(subjects[i % n], payload, now_ns=stamps[i])
        return msgs / (time.perf_counter() - started)


class _StreamApplies:
    """``Stream.apply`` of publishes, with or without a msg id each."""

    def __init__(self, env: Any, name: str, *, msg_ids: bool) -> None:
        config = StreamConfig(
            name=name,
            subjects=STREAM_SUBJECTS,
            duplicate_window=DUPLICATE_WINDOW_NS if msg_ids else 0,
        )
        self._store = LmdbStreamStore(env, name)
        self._stream = Stream(config, self._store)
        self._clock = _Clock()
        self._ids = msg_ids
        self._next_id = 0

    def _entries(self, msgs: int) -> list[Publish]:
        payload, subjects, n = b"x" * PAYLOAD_BYTES, SUBJECTS, len(SUBJECTS)
        out = []
        for i in range(msgs):
            msg_id = None
            if self._ids:
                self._next_id += 1
                msg_id = f"bench-{self._next_id}"
            out.append(
                Publish(
                    ts_ns=self._clock.take(), subject=subjects[i % n], data=payload, msg_id=msg_id
                )
            )
        return out

    def run(self, batch: int, msgs: int) -> float:
        entries = self._entries(msgs)
        store, apply = self._store, self._stream.apply
        started = time.perf_counter()
        for lo in range(0, msgs, batch):
            with store.transaction():
                for entry in entries[lo : lo + batch]:
                    apply(entry)
        return msgs / (time.perf_counter() - started)


def _median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(n / d for n, d in zip(num, den, strict=True))


def measure(runs: int) -> list[Figure]:
    """Run the benchmark in a fresh temporary environment (sync on) and return figures."""
    figures = []
    with tempfile.TemporaryDirectory(prefix="raftstream-bench-stream-") as path:
        env = open_node_env(path, map_size_bytes=MAP_SIZE_BYTES, sync=True)
        try:
            store = _StoreAppends(env)
            plain = _StreamApplies(env, "BENCH_STREAM", msg_ids=False)
            ids = _StreamApplies(env, "BENCH_STREAM_IDS", msg_ids=True)
            for batch in BATCH_SIZES:
                figures.append(_measure_batch(batch, runs, store.run, plain.run, ids.run))
        finally:
            env.close()
    return figures


def _measure_batch(
    batch: int,
    runs: int,
    store: Callable[[int, int], float],
    plain: Callable[[int, int], float],
    ids: Callable[[int, int], float],
) -> Figure:
    msgs = MSGS_PER_RUN[batch]
    s: list[float] = []
    p: list[float] = []
    d: list[float] = []
    for _ in range(runs):
        s.append(store(batch, msgs))
        p.append(plain(batch, msgs))
        d.append(ids(batch, msgs))
    return Figure(
        batch,
        statistics.median(s),
        statistics.median(p),
        statistics.median(d),
        _median_ratio(p, s),
        _median_ratio(d, s),
    )


def _runs_from(argv: list[str]) -> int:
    runs = RUNS_DEFAULT
    for arg in argv:
        if arg.startswith("--runs="):
            runs = int(arg.split("=", 1)[1])
        elif arg == "--quick":
            runs = 1
    return max(1, min(runs, RUNS_MAX))


def main(argv: list[str]) -> int:
    """Print applies/s (store appends, stream, stream with msg ids, ratios) per batch size."""
    runs = _runs_from(argv)
    figures = measure(runs)
    print(
        f"Stream.apply publishes/s, {PAYLOAD_BYTES}-byte payloads, LMDB fsync on, median of {runs}"
    )
    print(
        f"{'batch':>6} {'store append':>13} {'stream':>10} {'ratio':>6} "
        f"{'stream+id':>10} {'ratio':>6}"
    )
    for f in figures:
        print(
            f"{f.batch:>6} {f.store_per_s:>13,.0f} {f.stream_per_s:>10,.0f} {f.ratio:>6.2f} "
            f"{f.stream_ids_per_s:>10,.0f} {f.ratio_ids:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
