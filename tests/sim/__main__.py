"""Replay one simulation seed: ``python -m tests.sim --seed N`` (from the repo root)."""

from __future__ import annotations

import argparse
import sys

from .sim import Simulation


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim")
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    sim = Simulation(args.seed)
    print(sim.p)
    try:
        sim.run()
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    finally:
        print(sim.stats)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
