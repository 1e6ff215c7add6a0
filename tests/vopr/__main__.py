"""``python -m tests.vopr``: run seeds of the whole-node simulator (``make vopr``).

    python -m tests.vopr --seeds 2000          # seeds 0..1999, a summary at the end
    python -m tests.vopr --seed 1234 -v        # replay one seed, with its report

Exits 1 on the first failing seed, printing how to replay it; with ``--keep-going`` it runs
every seed and lists the failing ones at the end (a campaign's figures).
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import tempfile
import time
from pathlib import Path

from .sim import Simulation, SimulationFailed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.vopr", description=__doc__)
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds (from --first)")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run's report")
    parser.add_argument(
        "--keep-going", action="store_true", help="run every seed; list the failing ones"
    )
    args = parser.parse_args(argv)
    # The nodes log what a real node would (crashes, elections); thousands of lines a seed.
    logging.disable(logging.CRITICAL)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    faults: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    simulated = checks = entries = end_checks = 0.0
    started = time.perf_counter()
    failed: list[int] = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix="vopr-") as tmp:
            try:
                report = Simulation(seed, Path(tmp)).run()
            except SimulationFailed as exc:
                print(f"FAILED {exc}\nreplay: python -m tests.vopr --seed {seed} -v", flush=True)
                if not args.keep_going:
                    return 1
                failed.append(seed)
                continue
        faults.update(report.faults)
        counts.update(report.counts)
        simulated += report.simulated_s
        checks += report.raft_checks
        entries += report.entries_compared
        end_checks += report.end_checks
        if args.verbose:
            print(report)
    wall = time.perf_counter() - started
    passed = len(seeds) - len(failed)
    print(
        f"{passed} of {len(seeds)} seeds passed in {wall:.0f} s: "
        f"{simulated / 3600:.2f} simulated hours (of the seeds that passed)"
    )
    print(
        f"checks: {checks:.0f} Raft checks ({entries:.0f} applied entries compared), "
        f"{end_checks:.0f} end-of-run checks"
    )
    print("faults injected:", ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    print("client operations:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if failed:
        print("failed seeds:", " ".join(map(str, failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
