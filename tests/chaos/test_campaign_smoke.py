"""A short chaos campaign against real node processes that must find nothing (issue 8:
"make test runs a short smoke campaign that must find nothing").

Three nemeses (isolate the stream leader, kill -9 the stream leader, kill -9 every node)
with short windows on a 3-node cluster behind per-link proxies; every run must be
safe (no lost acknowledged message, no divergence, no acked redelivery, no minority ack,
linearizable KV), and must actually have injected faults and served traffic. On a failure
the seed and the run directory are in the message, so ``CHAOS_SEED=<seed>`` repeats the
schedule.

Failover time is measured, not asserted: each run's report gives it and flags it SLOW over
1.5 s, and ``make chaos`` is where it is judged. A timed assertion here failed CI on a busy
machine (one split vote, 1.88 s) with nothing wrong but the timing.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from raftstream.chaos.campaign import run_campaign, smoke_config


@pytest.mark.integration
def test_smoke_campaign_finds_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", random.SystemRandom().randrange(1 << 31)))
    root, outcomes = run_campaign(smoke_config(tmp_path, seed))
    assert [o.nemesis for o in outcomes] == list(smoke_config(tmp_path, seed).nemeses)
    for o in outcomes:
        where = f"seed {seed}, {o.run_dir}:\n{(o.run_dir / 'report.txt').read_text()}"
        assert o.result.safe, where
        assert o.figures["faults"] >= 1, where
        assert o.figures["publish"].get("ok", 0) > 0, where
        assert (o.run_dir / "timeline.png").stat().st_size > 0
        assert (o.run_dir / "history.jsonl").stat().st_size > 0
    assert (root / "campaign.json").is_file()
