"""Audit throughput: ``python -m raftstream.bench.audit [--sizes 1000000,3000000]``.

For each size N: a synthetic 3-node data root with one stream of N messages on every node
(``SynthCluster.publish_bulk``: the real Raft log storage and stream store, 1000 messages per
Raft entry and per store transaction, 64-byte payloads), then, in local mode (``local[2]``):

- the audit reading LMDB directly through the data source (tables loaded, every rule run),
- the Parquet export (``audit export``, one process),
- the audit reading that export.

Printed per phase: wall time and rows/s, rows being the 3N message rows (the raft_log rows,
N/1000 per node, are negligible). Prints figures, asserts nothing: the machine is shared.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession

from raftstream.audit.checks import run_checks
from raftstream.audit.export import export
from raftstream.audit.session import load_tables, spark_session
from raftstream.audit.synth import SynthCluster

__all__ = ["main"]

PAYLOAD_BYTES = 64
BATCH_MSGS = 1000
ROWS_PER_PARTITION = 1_000_000


def _generate(root: Path, n: int) -> float:
    started = time.monotonic()
    c = SynthCluster(root)
    try:
        group = c.add_stream("BENCH", ["bench.>"])
        c.publish_bulk(group, n, subject="bench.x", payload_bytes=PAYLOAD_BYTES, batch=BATCH_MSGS)
    finally:
        c.close()
    return time.monotonic() - started


def _audit(
    spark: SparkSession, *, data: str | None = None, parquet: str | None = None
) -> tuple[float, int, int]:
    """(seconds, message rows, rules with findings) of one audit."""
    started = time.monotonic()
    t = load_tables(spark, data=data, parquet=parquet, rows_per_partition=ROWS_PER_PARTITION)
    results = run_checks(t)
    rows = t.messages.count()
    for df in (t.messages, t.raft_log, t.consumers, t.streams):
        df.unpersist()
    return time.monotonic() - started, rows, sum(1 for r in results if r.count)


def _line(what: str, seconds: float, rows: int) -> None:
    print(f"  {what:<28} {seconds:8.1f} s  {rows / seconds:>10,.0f} rows/s", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m raftstream.bench.audit")
    ap.add_argument("--sizes", default="1000000", help="comma-separated message counts")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    spark = spark_session(master="local[2]", app="raftstream-bench-audit")
    try:
        for n in sizes:
            work = Path(tempfile.mkdtemp(prefix="raftstream-bench-audit-"))
            try:
                print(f"{n:,} messages x 3 replicas ({3 * n:,} message rows)", flush=True)
                _line("generate (synthetic dirs)", _generate(work / "data", n), 3 * n)
                secs, rows, failing = _audit(spark, data=str(work / "data"))
                _line(f"audit from LMDB ({failing} failing)", secs, rows)
                started = time.monotonic()
                export(str(work / "data"), str(work / "parquet"))
                _line("export to Parquet", time.monotonic() - started, 3 * n)
                secs, rows, failing = _audit(spark, parquet=str(work / "parquet"))
                _line(f"audit from Parquet ({failing} failing)", secs, rows)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
