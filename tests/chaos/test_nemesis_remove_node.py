"""The ``remove-node`` nemesis (docs/chaos.md, "Nemeses"): its fault kills a node and removes
it from the cluster (``peer-remove``), and healing readmits it (``peer-add``) and starts it
again. The campaigns judge what the workloads saw meanwhile; this checks the fault itself."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.history import History
from raftstream.chaos.nemesis import NEMESES, NemesisContext
from tests.support.polling import wait_for

STATE_WAIT_S = 30.0


def _removed(c: ChaosCluster, via: str, name: str) -> bool | None:
    info = c.cluster_info(via)
    if info is None:
        return None
    return next(n.removed for n in info.nodes if n.name == name)


@pytest.mark.integration
def test_remove_node_kills_and_removes_a_node_and_healing_readmits_it(
    cluster: ChaosCluster, tmp_path: Path
) -> None:
    history = History(tmp_path / "history.jsonl")
    try:
        ctx = NemesisContext(cluster, random.Random(3), history, "Q")
        fault = NEMESES["remove-node"].inject(ctx)
        name = fault.facts["removed"]
        assert fault.facts["killed"] == name and cluster.process(name) is None
        assert fault.observe is not None and fault.undo is not None
        fault.observe()  # (the campaign runs it once the start is recorded)
        via = next(n for n in cluster.names if n != name)
        wait_for(f"{name} removed", lambda: _removed(cluster, via, name) or None, STATE_WAIT_S)
        fault.undo()
        assert cluster.process(name) is not None
        wait_for(
            f"{name} readmitted",
            lambda: _removed(cluster, via, name) is False or None,
            STATE_WAIT_S,
        )
    finally:
        history.close()
