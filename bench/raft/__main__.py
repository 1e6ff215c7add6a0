"""Raft benchmarks over real gRPC on loopback, each node a process, fsync on.

``python -m raftstream.bench.raft [a] [b] [c] [d] [--seconds S] [--kills N] ...``

Parts (all by default): (a) one 3-node group, commits/s and latency with 1 and 1,000
proposals in flight; (b) the same over 100 groups; (c) 1,000 idle groups, CPU per node and
memory per group; (d) leader failover after kill -9, over ``--kills`` kills. Node processes
and data dirs are always cleaned up, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

from raftstream.bench.raft.parts import PARTS, BenchOptions, Row
from raftstream.raft.host import HostConfig

__all__ = ["main"]


def _table(rows: list[Row]) -> str:
    head = ("part", "metric", "value", "goal")
    cells = [head, *((r.part, r.metric, r.value, r.goal) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


async def _run(parts: list[str], opts: BenchOptions) -> list[Row]:
    rows: list[Row] = []
    for p in parts:
        t0 = time.monotonic()
        print(f"raft bench part {p}...", file=sys.stderr, flush=True)
        rows.extend(await PARTS[p](opts))
        print(f"raft bench part {p}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="raftstream.bench.raft", description=__doc__)
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)}")
    ap.add_argument("--seconds", type=float, default=5.0, help="load duration per measurement")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--idle-groups", type=int, default=1000)
    ap.add_argument("--idle-window", type=float, default=10.0, help="CPU sampling window, s")
    ap.add_argument("--tick-ms", type=int, default=HostConfig().tick_ms)
    ap.add_argument("--data-dir", default=None, help="parent of the node data dirs (temp)")
    args = ap.parse_args(argv)
    parts = args.parts or list(PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown parts {unknown}; parts: {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory(prefix="raft-bench-", dir=args.data_dir) as root:
        opts = BenchOptions(
            root=Path(root),
            tick_ms=args.tick_ms,
            load_seconds=args.seconds,
            idle_groups=args.idle_groups,
            idle_window_seconds=args.idle_window,
            kills=args.kills,
        )
        rows = asyncio.run(_run(parts, opts))
    cfg = HostConfig(tick_ms=args.tick_ms)
    print(
        f"raft bench: 3 node processes on 127.0.0.1, gRPC, LMDB fsync on, {os.cpu_count()} CPUs;"
        f" tick {cfg.tick_ms} ms, election {cfg.election_tick}-{2 * cfg.election_tick} ticks,"
        f" heartbeat every {cfg.heartbeat_tick} tick"
    )
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
