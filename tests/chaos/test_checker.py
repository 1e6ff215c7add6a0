"""The chaos checker on hand-made histories: each anomaly kind is found, a clean history is
clean. The histories go through ``History`` and ``load_ops`` (the JSON lines a run writes),
so the checker is tested on exactly what a campaign hands it.

The promises pinned (issue 8, "Checker"): nothing acknowledged is lost (split prefix /
middle / postfix), no duplicates, real-time order of acknowledged publishes, no value read
that was never published, no replica divergence, no acked message redelivered, no
acknowledgement from a minority side, linearizable KV registers, no definition lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raftstream.chaos.checker import CheckResult, check, check_divergence
from raftstream.chaos.history import History, Op, load_ops


class Recorder:
    """Builds a history with explicit times (seconds) for each invocation and completion."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.clock = 0.0
        self.history = History(path, clock=lambda: self.clock, started=0.0)

    def op(
        self,
        f: str,
        value: Any,
        *,
        at: float,
        until: float | None,
        outcome: str = "ok",
        result: Any = None,
        process: str = "p0",
        node: str = "n1",
    ) -> Op:
        self.clock = at
        op = self.history.invoke(process, f, value, node=node)
        if until is not None:
            self.clock = until
            self.history.done(op, outcome, result)  # type: ignore[arg-type]
        return op

    def nemesis(self, phase: str, desc: str, at: float, **extra: Any) -> None:
        self.clock = at
        self.history.nemesis(phase, desc, **extra)  # type: ignore[arg-type]

    def publish(self, value: int, seq: int, at: float, **kw: Any) -> Op:
        return self.op("publish", value, at=at, until=at + 0.01, result={"seq": seq}, **kw)

    def deliver_and_ack(self, value: int, seq: int, at: float, *, delivered: int = 1) -> None:
        result = {"seq": seq, "delivered": delivered, "fetch": 0}
        self.op("deliver", value, at=at, until=at + 0.01, result=result, process="c0")
        self.op("ack", value, at=at + 0.02, until=at + 0.03, result=None, process="c0")

    def finals(self, values: dict[int, int], defs: dict[str, list[str]] | None = None) -> None:
        stored = {str(s): v for s, v in values.items()}
        self.op("final_queue", None, at=90, until=91, result={"values": stored}, process="final")
        self.op("final_defs", None, at=92, until=93, result=defs or {}, process="final")

    def check(self, nodes: Any = None) -> CheckResult:
        self.history.close()
        ops, nemesis = load_ops(self.path)
        return check(ops, nemesis, nodes)


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    return Recorder(tmp_path / "history.jsonl")


def clean_queue(rec: Recorder, n: int = 5) -> dict[int, int]:
    """``n`` values published, stored, delivered and acked in order."""
    stored = {}
    for i in range(1, n + 1):
        rec.publish(100 + i, i, at=float(i))
        rec.deliver_and_ack(100 + i, i, at=i + 0.5)
        stored[i] = 100 + i
    return stored


def kinds(result: CheckResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in result.anomalies:
        out[a.kind] = out.get(a.kind, 0) + 1
    return out


def test_clean_history_is_clean(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("put", ["k0", 7], at=20, until=21, result=3)
    rec.op("get", ["k0"], at=22, until=23, result=7)
    rec.op("cas", ["k0", 7, 8], at=24, until=25, result=True)
    rec.op("cas", ["k0", 7, 9], at=26, until=27, result=False)
    rec.op("create_stream", "CH0", at=30, until=31, result=True)
    rec.op("create_consumer", ["CH0", "D"], at=32, until=33, result=True)
    rec.op("get", ["k0"], at=95, until=96, result=8, process="final")
    rec.finals(stored, {"Q": ["C"], "KV": [], "CH0": ["D"]})
    result = rec.check()
    assert result.anomalies == []
    assert result.safe


@pytest.mark.parametrize(
    ("missing", "kind"), [(1, "lost-prefix"), (3, "lost-middle"), (5, "lost-postfix")]
)
def test_lost_acknowledged_publish_is_split_by_position(
    rec: Recorder, missing: int, kind: str
) -> None:
    stored = clean_queue(rec)
    del stored[missing]
    rec.finals(stored)
    result = rec.check()
    assert kinds(result) == {kind: 1}
    assert not result.safe
    assert f"publish({100 + missing})" in result.anomalies[0].ops[0]


def test_unknown_publish_missing_is_not_lost(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("publish", 999, at=50, until=52, outcome="info")
    rec.finals(stored)
    assert rec.check().anomalies == []


def test_duplicate_value_at_two_sequences(rec: Recorder) -> None:
    stored = clean_queue(rec)
    stored[6] = 103
    rec.finals(stored)
    assert kinds(rec.check()) == {"duplicate": 1}


def test_ack_naming_a_sequence_that_holds_another_value(rec: Recorder) -> None:
    stored = clean_queue(rec, 3)
    # Concurrent with the others (so real-time order says nothing), acked as seq 2: 102's.
    rec.op("publish", 200, at=0.5, until=10, result={"seq": 2}, process="p1")
    rec.deliver_and_ack(200, 4, at=11)
    stored[4] = 200
    rec.finals(stored)
    assert kinds(rec.check()) == {"ack-mismatch": 1}


def test_order_violation_between_sequential_publishes(rec: Recorder) -> None:
    rec.publish(1, 2, at=1)
    rec.publish(2, 1, at=2)  # invoked after 1 was acked, yet stored before it
    rec.deliver_and_ack(2, 1, at=3)
    rec.deliver_and_ack(1, 2, at=4)
    rec.finals({1: 2, 2: 1})
    assert kinds(rec.check()) == {"order": 1}


def test_concurrent_publishes_may_commit_in_any_order(rec: Recorder) -> None:
    rec.op("publish", 1, at=1, until=3, result={"seq": 2})
    rec.op("publish", 2, at=2, until=4, result={"seq": 1}, process="p1")
    rec.deliver_and_ack(2, 1, at=5)
    rec.deliver_and_ack(1, 2, at=6)
    rec.finals({1: 2, 2: 1})
    assert rec.check().anomalies == []


def test_value_read_that_was_never_published(rec: Recorder) -> None:
    stored = clean_queue(rec)
    stored[6] = 4242
    rec.op("deliver", 4242, at=20, until=21, result={"seq": 6}, process="c0")
    rec.finals(stored)
    found = rec.check()
    assert kinds(found) == {"never-published": 1}


def test_acked_message_redelivered(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("deliver", 103, at=30, until=30.1, result={"seq": 3, "delivered": 2}, process="c1")
    rec.finals(stored)
    result = rec.check()
    assert kinds(result) == {"acked-redelivered": 1}
    assert len(result.anomalies[0].ops) == 2  # the ack and the redelivery


def test_redelivery_of_an_unacked_message_is_fine(rec: Recorder) -> None:
    rec.publish(1, 1, at=1)
    rec.op("deliver", 1, at=2, until=2.1, result={"seq": 1}, process="c0")
    rec.op("ack", 1, at=2.2, until=4, outcome="info", process="c0")
    rec.deliver_and_ack(1, 1, at=5, delivered=2)
    rec.finals({1: 1})
    assert rec.check().anomalies == []


def test_stored_message_never_delivered(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.publish(300, 6, at=10)
    stored[6] = 300
    rec.finals(stored)
    assert kinds(rec.check()) == {"undelivered": 1}


def push_queue(rec: Recorder, stored: dict[int, int], *, skip: int = 0) -> None:
    """The push consumer attached once and took (and acked) every stored value but ``skip``."""
    rec.op("push_attach", "PC", at=0.1, until=0.2, result=True, process="push0")
    for seq, value in sorted(stored.items()):
        if value == skip:
            continue
        rec.op("push_deliver", value, at=seq + 0.6, until=seq + 0.6, result={"seq": seq},
               process="push0")  # fmt: skip
        rec.op("push_ack", value, at=seq + 0.7, until=seq + 0.8, process="push0")


def test_a_push_consumer_that_took_everything_is_clean(rec: Recorder) -> None:
    stored = clean_queue(rec)
    push_queue(rec, stored)
    # A push redelivery after an ack is not judged: when the server decided it is unknown.
    rec.op("push_deliver", 103, at=30, until=30, result={"seq": 3, "delivered": 2},
           process="push0")  # fmt: skip
    rec.finals(stored)
    assert rec.check().anomalies == []


def test_stored_message_the_push_consumer_never_delivered(rec: Recorder) -> None:
    stored = clean_queue(rec)
    push_queue(rec, stored, skip=104)
    rec.op("push_deliver", 999, at=40, until=40, result={"seq": 9}, process="push0")
    rec.finals(stored)
    result = rec.check()
    assert kinds(result) == {"undelivered": 1, "never-published": 1}
    assert any(
        "(104) was never delivered to the push consumer" in a.description for a in result.anomalies
    )


def assert_only_106_acked_on_the_minority_side(rec: Recorder, stored: dict[int, int]) -> None:
    """Values 106 and 107 (seqs 6 and 7) delivered, acked and stored; the check finds one
    anomaly: 106's publish acknowledged through n1 inside the partition."""
    rec.deliver_and_ack(106, 6, at=21)
    rec.deliver_and_ack(107, 7, at=22)
    rec.finals({**stored, 6: 106, 7: 107})
    result = rec.check()
    assert kinds(result) == {"minority-ack": 1}
    assert "@n1 publish(106)" in result.anomalies[0].ops[0]


def test_acknowledgement_from_the_minority_side(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.nemesis("start", "isolate n1", at=10, minority=["n1"])
    rec.publish(106, 6, at=11, node="n1")
    rec.publish(107, 7, at=12, node="n2")  # the majority side may acknowledge
    rec.nemesis("stop", "isolate n1", at=20)
    assert_only_106_acked_on_the_minority_side(rec, stored)


def test_a_partition_ends_when_its_healing_began(rec: Recorder) -> None:
    # A heal enables the proxies one by one: a link may be back before the stop is written,
    # so an acknowledgement completed after healing began is no anomaly; one before it is.
    stored = clean_queue(rec)
    rec.nemesis("start", "isolate n1", at=10, minority=["n1"])
    rec.op("publish", 106, at=11, until=19.4, result={"seq": 6}, node="n1")
    rec.op("publish", 107, at=11, until=19.6, result={"seq": 7}, node="n1")
    rec.nemesis("stop", "isolate n1", at=20, heal_began=19.5)
    assert_only_106_acked_on_the_minority_side(rec, stored)


def test_stale_read_is_not_linearizable(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("put", ["k0", 7], at=20, until=21, result=3)
    rec.op("get", ["k0"], at=22, until=23, result=0, node="n3")  # the old value, after the put
    rec.finals(stored)
    result = rec.check()
    assert kinds(result) == {"nonlinearizable": 1}


def test_cas_that_lies_about_its_outcome_is_not_linearizable(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("put", ["k1", 5], at=20, until=21, result=1)
    rec.op("cas", ["k1", 5, 6], at=22, until=23, result=False)  # nothing else wrote
    rec.finals(stored)
    assert kinds(rec.check()) == {"nonlinearizable": 1}


def test_unknown_write_may_have_happened(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("put", ["k2", 9], at=20, until=None)  # never answered
    rec.op("get", ["k2"], at=30, until=31, result=9)
    rec.finals(stored)
    assert rec.check().anomalies == []


def test_definitions_lost_and_resurrected(rec: Recorder) -> None:
    stored = clean_queue(rec)
    rec.op("create_stream", "CH1", at=20, until=21, result=True)
    rec.op("create_consumer", ["CH1", "D"], at=22, until=23, result=True)
    rec.op("create_stream", "CH2", at=24, until=25, result=True)
    rec.op("delete_stream", "CH2", at=26, until=27, result=True)
    rec.finals(stored, {"CH2": []})  # CH1 and its consumer gone, deleted CH2 back
    found = kinds(rec.check())
    assert found == {"definition-lost": 2, "definition-resurrected": 1}


def test_final_read_missing(rec: Recorder) -> None:
    clean_queue(rec)
    assert "final-read-failed" in kinds(rec.check())


def contents(values: dict[int, tuple[str, int]]) -> dict[str, dict[int, tuple[str, int]]]:
    return {"Q": values}


def test_replicas_that_agree_do_not_diverge() -> None:
    same = contents({1: ("a", 1), 2: ("b", 2)})
    assert check_divergence({"n1": same, "n2": same, "n3": same}, {1, 2}) == []


def test_replica_divergence_at_a_sequence() -> None:
    nodes = {
        "n1": contents({1: ("a", 1), 2: ("b", 2)}),
        "n2": contents({1: ("a", 1), 2: ("X", 2)}),
    }
    found = check_divergence(nodes, {1, 2})
    assert [a.kind for a in found] == ["divergence"]


def test_replica_hole_is_divergence_and_short_tail_is_lag() -> None:
    nodes = {
        "n1": contents({1: ("a", 1), 2: ("b", 2), 3: ("c", 3)}),
        "n2": contents({1: ("a", 1), 3: ("c", 3)}),
        "n3": contents({1: ("a", 1), 2: ("b", 2)}),
    }
    found = sorted(a.kind for a in check_divergence(nodes, {1, 2, 3}))
    assert found == ["divergence", "replica-lag"]


def test_a_node_storing_a_value_nobody_published() -> None:
    nodes = {"n1": contents({1: ("a", 1), 2: ("z", 77)})}
    found = check_divergence(nodes, {1})
    assert [a.kind for a in found] == ["never-published"]


def test_redelivery_from_a_fetch_begun_before_the_ack_is_fine(rec: Recorder) -> None:
    """A fetch that started before an ack completed may still deliver the message (its
    ack wait ran out in between): only a fetch begun after the ack must not."""
    rec.publish(1, 1, at=1)
    rec.op("deliver", 1, at=2, until=2.1, result={"seq": 1}, process="c0")
    rec.op("ack", 1, at=2.2, until=5, process="c0")
    rec.op("deliver", 1, at=4, until=6, result={"seq": 1, "delivered": 2}, process="c1")
    rec.finals({1: 1})
    assert rec.check().anomalies == []
