"""A short chaos campaign against real node processes that must find nothing (issue 8:
"make test runs a short smoke campaign that must find nothing").

Three nemeses (isolate the stream leader, kill -9 the stream leader, kill -9 every node)
with short windows on a 3-node cluster behind per-link proxies; every run must be
safe (no lost acknowledged message, no divergence, no acked redelivery, no minority ack,
linearizable KV), must actually have injected faults and served traffic, and a kill's
failover must stay within 1.5 s p99. On a failure the seed and the run directory are in
the message, so ``CHAOS_SEED=<seed>`` repeats the schedule.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from raftstream.chaos.campaign import run_campaign, smoke_config
from raftstream.chaos.report import FAILOVER_P99_MAX_S


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
        p99 = o.figures["failover_p99_s"]
        if p99 is not None:
            assert p99 <= FAILOVER_P99_MAX_S, where
    assert (root / "campaign.json").is_file()
