"""Parts of a campaign that need no cluster: corruption of a file, how a damaged node's
exit is classified, and the failover figures a report derives from a history."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from raftstream.chaos.history import History, Op, read_records
from raftstream.chaos.nemesis import (
    LMDB_META_BYTES,
    Fault,
    NemesisContext,
    _damage_outcome,
    _heal,
    corrupt_file,
)
from raftstream.chaos.report import election_times, failover_times, percentile


def test_bit_flips_spare_the_lmdb_meta_pages(tmp_path: Path) -> None:
    path = tmp_path / "data.mdb"
    original = bytes(range(256)) * 256
    path.write_bytes(original)
    done = corrupt_file(path, random.Random(3), mode="flip")
    damaged = path.read_bytes()
    assert len(damaged) == len(original)
    changed = [i for i, (a, b) in enumerate(zip(original, damaged, strict=True)) if a != b]
    assert changed, done
    assert min(changed) >= LMDB_META_BYTES


def test_truncation_shortens_the_file(tmp_path: Path) -> None:
    path = tmp_path / "data.mdb"
    path.write_bytes(b"x" * 100_000)
    done = corrupt_file(path, random.Random(3), mode="truncate")
    assert path.stat().st_size == done["new_size"] < 100_000


def test_damage_outcomes() -> None:
    assert _damage_outcome(1, "raftstream.errors.DataLossError: raft entry").startswith("refused")
    invalid = "lmdb.InvalidError: mdb_dbi_open: MDB_INVALID: File is not an LMDB file"
    assert _damage_outcome(1, invalid) == "refused: MDB_INVALID (exit 1)"
    assert _damage_outcome(-7, "") == "crashed: signal 7"
    assert _damage_outcome(None, "") == "not serving (hung or still under repair)"
    assert _damage_outcome(2, "boom") == "exited 2"


def publish(i: int, node: str, t0: float, t1: float, ok: bool = True) -> Op:
    return Op(
        id=i,
        process="p",
        f="publish",
        value=i,
        invoke=t0,
        node=node,
        type="ok" if ok else "info",
        complete=t1,
        result={"seq": i},
    )


def test_a_heal_records_when_it_began_and_when_it_was_done(tmp_path: Path) -> None:
    clock = [5.0]
    history = History(tmp_path / "history.jsonl", clock=lambda: clock[0], started=0.0)

    def undo() -> None:  # a heal that takes 0.25 s (proxies enabled one by one)
        clock[0] += 0.25

    ctx = NemesisContext(cluster=None, rng=random.Random(1), history=history, stream="Q")  # type: ignore[arg-type]
    _heal(ctx, Fault("isolate n1", minority=("n1",), undo=undo), "isolate-node")
    history.close()
    (stop,) = [r for r in read_records(tmp_path / "history.jsonl") if r["f"] == "stop"]
    assert (stop["heal_began"], stop["time"]) == (5.0, 5.25)


def test_failover_counts_only_publishes_through_live_nodes() -> None:
    kill = {"type": "nemesis", "f": "start", "time": 10.0, "nemesis": "kill-stream-leader"}
    kill["facts"] = {"killed": "n1"}
    ops = [
        publish(1, "n1", 10.1, 10.2),  # through the killed node: not a failover
        publish(2, "n2", 10.0, 11.0, ok=False),
        publish(3, "n2", 10.5, 11.2),
    ]
    assert failover_times(ops, [kill]) == [11.2 - 10.0]


def test_election_times_and_percentiles() -> None:
    stop = {"type": "nemesis", "f": "stop", "time": 12.0, "facts": {"election_s": 0.6}}
    assert election_times([stop]) == [0.6]
    assert percentile([0.1, 0.2, 0.3, 5.0], 0.5) == 0.2
    assert percentile([0.1, 0.2, 0.3, 5.0], 0.99) == 5.0


def test_a_run_whose_cluster_did_not_start_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port taken meanwhile is the machine's doing: the run starts again elsewhere; a
    failure after the start is never retried."""
    from raftstream.chaos import campaign

    calls: list[Path] = []

    def fake_run_one(name: str, *, run_dir: Path, **_: object) -> campaign.RunOutcome:
        calls.append(run_dir)
        if len(calls) < 2:
            raise campaign.ClusterStartError("n1 is not running (exit 1)")
        return campaign.RunOutcome(name, run_dir, {}, campaign.CheckResult())

    monkeypatch.setattr(campaign, "run_one", fake_run_one)
    cfg = campaign.CampaignConfig(root=tmp_path)
    out = campaign._run_started("bridge", cfg=cfg, run_dir=tmp_path / "bridge", proxies=None, run=0)  # type: ignore[arg-type]
    assert [p.name for p in calls] == ["bridge", "bridge-start2"]
    assert out.run_dir == tmp_path / "bridge-start2"

    def broken(name: str, *, run_dir: Path, **_: object) -> campaign.RunOutcome:
        calls.append(run_dir)
        raise RuntimeError("a failure after the start")

    monkeypatch.setattr(campaign, "run_one", broken)
    calls.clear()
    with pytest.raises(RuntimeError):
        campaign._run_started("bridge", cfg=cfg, run_dir=tmp_path / "b2", proxies=None, run=0)  # type: ignore[arg-type]
    assert len(calls) == 1
