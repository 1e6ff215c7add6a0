"""The chaos harness's cluster for tests: ``ChaosCluster`` nodes behind per-link Toxiproxy
proxies, started and always stopped by ``tests.support.cluster.running``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.proxyctl import start_toxiproxy
from tests.support.cluster import running

__all__ = ["started_cluster"]


@contextmanager
def started_cluster(tmp_path: Path, size: int) -> Iterator[ChaosCluster]:
    """``size`` nodes behind per-link proxies, started; killed and removed on exit."""
    with start_toxiproxy() as proxies:
        c = ChaosCluster(size=size, run_dir=tmp_path / "data", proxies=proxies)
        with running(c, start=c.start, lines=20):
            yield c
