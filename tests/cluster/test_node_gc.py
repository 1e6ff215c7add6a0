"""The node process's garbage collector settings (``cluster/node/process.py``, ``tune_gc``)."""

from __future__ import annotations

import gc

from raftstream.cluster.node.process import GC_GEN0_THRESHOLD, tune_gc


def test_tune_gc_freezes_the_start_and_collects_the_young_in_larger_steps() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, before[1], before[2])
        assert before[0] < GC_GEN0_THRESHOLD
        assert gc.get_freeze_count() > 0
        # Cyclic garbage made afterwards is still found.
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
