"""``python -m raftstream.chaos``: run a chaos campaign and print its summary.

Environment (or the matching options): ``CHAOS_TIME`` seconds of faults per nemesis
(default 300), ``CHAOS_RUNS`` runs of each nemesis (default 1, each a fresh cluster with
its own schedule drawn from the seed), ``CHAOS_SEED`` (default: random, printed so the
campaign can be repeated), ``CHAOS_NEMESES`` (comma-separated, default: all),
``CHAOS_SIZE`` (3 to 5 nodes; ``make chaos NODES=5``), ``CHAOS_ROOT`` (default
``./chaos-runs``), ``CHAOS_SNAPSHOT_ENTRIES`` (the nodes' ``[raft] snapshot_entries``: a few
dozen exercises compaction and catching up by snapshot). Exits 1 when any run found a
safety anomaly, 2 when a run could not be carried out (a harness error, e.g. a node that
never started; its message is in campaign.txt).
"""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

import click

from raftstream.chaos.campaign import CampaignConfig, run_campaign
from raftstream.chaos.nemesis import NEMESES


@click.command()
@click.option("--time", "duration_s", envvar="CHAOS_TIME", type=float, default=300.0)
@click.option("--runs", envvar="CHAOS_RUNS", type=click.IntRange(min=1), default=1)
@click.option("--seed", envvar="CHAOS_SEED", type=int, default=None)
@click.option("--nemeses", envvar="CHAOS_NEMESES", default=",".join(NEMESES))
@click.option("--size", envvar="CHAOS_SIZE", type=click.IntRange(3, 5), default=3)
@click.option("--root", envvar="CHAOS_ROOT", type=click.Path(path_type=Path), default="chaos-runs")
@click.option(
    "--snapshot-entries",
    envvar="CHAOS_SNAPSHOT_ENTRIES",
    type=click.IntRange(min=1),
    default=None,
    help="The nodes' [raft] snapshot_entries (default: the node's): a few dozen makes groups"
    " compact all run long and lagging nodes catch up by snapshot.",
)
def main(
    duration_s: float,
    runs: int,
    seed: int | None,
    nemeses: str,
    size: int,
    root: Path,
    snapshot_entries: int | None,
) -> None:
    """Run every nemesis (or those named) CHAOS_RUNS times for CHAOS_TIME seconds each, each
    run against a fresh cluster."""
    names = tuple(n.strip() for n in nemeses.split(",") if n.strip())
    unknown = [n for n in names if n not in NEMESES]
    if unknown:
        raise click.BadParameter(f"unknown nemeses {unknown}; known: {sorted(NEMESES)}")
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    click.echo(f"chaos campaign seed={seed} (repeat with CHAOS_SEED={seed})", err=True)
    cfg = CampaignConfig(
        nemeses=names,
        duration_s=duration_s,
        seed=seed,
        size=size,
        runs=runs,
        root=root,
        snapshot_entries=snapshot_entries,
    )
    # SIGTERM (``timeout``, a CI job's end) stops a campaign as Ctrl-C does, so it still
    # stops its node processes and proxies; by default it ended Python at once, leaving them.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    campaign_dir, outcomes = run_campaign(cfg)
    click.echo((campaign_dir / "campaign.txt").read_text())
    click.echo(f"runs, histories and node data under {campaign_dir}")
    if any(not o.result.safe for o in outcomes):
        sys.exit(1)
    if any(o.error for o in outcomes):
        sys.exit(2)


if __name__ == "__main__":
    main()
