"""Appends/s into the LMDB stream store against the raw py-lmdb floor, fsync on.

For each batch size (messages per write transaction) the same run measures:

- raw: a bare ``txn.put`` of a 128-byte value under an 8-byte big-endian key per message,
  ``batch`` puts per write transaction, in the same environment (own named DB), same fsync;
- store: ``LmdbStreamStore.append`` of a 128-byte payload, ``batch`` appends inside one
  ``store.transaction()``.

Each figure is the median of ``--runs`` runs (raw and store alternate, so drift hits both);
the ratio is the median of the per-run store/raw ratios: the share of the floor the store
keeps. Total time stays bounded: each run is a fixed,
small number of messages. Usage: ``python -m raftstream.bench.engine store [--runs N]``.
"""

from __future__ import annotations

import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env

__all__ = ["main"]

PAYLOAD_BYTES = 128
BATCH_SIZES = (1, 100, 1000)
# Messages per run for each batch size: enough transactions to average the fsync, small
# enough that all runs of all sizes finish in well under a minute on a slow disk.
MSGS_PER_RUN = {1: 200, 100: 5_000, 1000: 20_000}
RUNS_DEFAULT = 7
RUNS_MAX = 15
MAP_SIZE_BYTES = 2 * 1024**3
SUBJECTS = tuple(f"bench.orders.{i}" for i in range(8))
_KEY = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Figure:
    """Medians over the runs of one batch size; ``ratio`` is the median of the per-run
    store/raw ratios (each pair measured back to back, so a noisy moment hits both)."""

    batch: int
    raw_per_s: float
    store_per_s: float
    ratio: float


class _Raw:
    """The floor: what py-lmdb itself costs for the same puts and commits."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self._db = env.open_db(b"bench.raw")
        self._next = 1

    def run(self, batch: int, msgs: int) -> float:
        env, db, value, pack = self._env, self._db, b"x" * PAYLOAD_BYTES, _KEY.pack
        seq = self._next
        started = time.perf_counter()
        for _ in range(msgs // batch):
            with env.begin(write=True) as txn:
                for _ in range(batch):
                    txn.put(pack(seq), value, db=db)
                    seq += 1
        elapsed = time.perf_counter() - started
        self._next = seq
        return msgs / elapsed


class _Store:
    def __init__(self, env: Any) -> None:
        self._store = LmdbStreamStore(env, "BENCH")
        self._ts_ns = 1

    def run(self, batch: int, msgs: int) -> float:
        store, payload = self._store, b"x" * PAYLOAD_BYTES
        append, subjects = store.append, SUBJECTS
        ts = self._ts_ns
        started = time.perf_counter()
        for _ in range(msgs // batch):
            with store.transaction():
                for i in range(batch):
                    append(subjects[i & 7], payload, now_ns=ts)
                    ts += 1
        elapsed = time.perf_counter() - started
        self._ts_ns = ts
        return msgs / elapsed


def measure(runs: int) -> list[Figure]:
    """Run the benchmark in a fresh temporary environment (sync on) and return figures."""
    figures = []
    with tempfile.TemporaryDirectory(prefix="raftstream-bench-store-") as path:
        env = open_node_env(path, map_size_bytes=MAP_SIZE_BYTES, sync=True)
        try:
            raw, store = _Raw(env), _Store(env)
            for batch in BATCH_SIZES:
                raw_runs: list[float] = []
                store_runs: list[float] = []
                for _ in range(runs):
                    raw_runs.append(raw.run(batch, MSGS_PER_RUN[batch]))
                    store_runs.append(store.run(batch, MSGS_PER_RUN[batch]))
                ratios = [s / r for s, r in zip(store_runs, raw_runs, strict=True)]
                figures.append(
                    Figure(
                        batch,
                        statistics.median(raw_runs),
                        statistics.median(store_runs),
                        statistics.median(ratios),
                    )
                )
        finally:
            env.close()
    return figures


def _runs_from(argv: list[str]) -> int:
    runs = RUNS_DEFAULT
    for arg in argv:
        if arg.startswith("--runs="):
            runs = int(arg.split("=", 1)[1])
        elif arg == "--quick":
            runs = 1
    return max(1, min(runs, RUNS_MAX))


def main(argv: list[str]) -> int:
    """Print appends/s (raw floor, store, ratio) per batch size; 0 on success."""
    runs = _runs_from(argv)
    figures = measure(runs)
    print(f"stream store appends/s, {PAYLOAD_BYTES}-byte messages, fsync on, median of {runs}")
    print(f"{'batch':>6} {'raw py-lmdb':>14} {'LmdbStreamStore':>16} {'ratio':>7}")
    for f in figures:
        print(f"{f.batch:>6} {f.raw_per_s:>14,.0f} {f.store_per_s:>16,.0f} {f.ratio:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
