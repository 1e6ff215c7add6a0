"""``next_change``: the stream leader's next membership step toward the meta state's peers.

Properties (Raft thesis §4.1 and §4.2.1): one server at a time; a new member joins as a
learner and is promoted only once caught up (a learner catches up before it votes); members
are removed only after every wanted peer votes; a leader that must leave hands leadership
to a caught-up wanted voter first.
"""

from __future__ import annotations

from raftstream.cluster.stream.membership import LEARNER_LAG_MAX_ENTRIES, Step, next_change
from raftstream.raft.types import ConfChange, ConfChangeType

ADD_LEARNER, ADD_VOTER, REMOVE = (
    ConfChangeType.ADD_LEARNER,
    ConfChangeType.ADD_VOTER,
    ConfChangeType.REMOVE,
)


def drive(me: str, wanted: tuple[str, ...], voters: set[str]) -> list[Step]:
    """Apply the steps one by one (every follower caught up) until none is left."""
    learners: set[str] = set()
    steps: list[Step] = []
    for _ in range(20):
        lag = {n: 0 for n in voters | learners if n != me}
        step = next_change(
            me=me,
            wanted=wanted,
            voters=tuple(sorted(voters)),
            learners=tuple(sorted(learners)),
            lag=lag,
        )
        if step is None or step.transfer_to is not None:
            if step is not None:
                steps.append(step)
            return steps
        steps.append(step)
        cc = step.change
        assert cc is not None
        if cc.type == ADD_LEARNER:
            learners.add(cc.node)
        elif cc.type == ADD_VOTER:
            learners.discard(cc.node)
            voters.add(cc.node)
        else:
            voters.discard(cc.node)
            learners.discard(cc.node)
    raise AssertionError("no fixed point")


def test_repair_adds_a_learner_promotes_it_then_removes_the_dead_peer() -> None:
    steps = drive("n1", ("n1", "n2", "n4"), {"n1", "n2", "n3"})
    assert [s.change for s in steps] == [
        ConfChange(ADD_LEARNER, "n4"),
        ConfChange(ADD_VOTER, "n4"),
        ConfChange(REMOVE, "n3"),
    ]


def test_grow_r1_to_r3_one_server_at_a_time() -> None:
    steps = drive("n1", ("n1", "n2", "n3"), {"n1"})
    assert [s.change for s in steps] == [
        # Learners do not count in any majority: both may join at once, and each is
        # promoted (one change at a time) only when caught up.
        ConfChange(ADD_LEARNER, "n2"),
        ConfChange(ADD_LEARNER, "n3"),
        ConfChange(ADD_VOTER, "n2"),
        ConfChange(ADD_VOTER, "n3"),
    ]


def test_a_leader_that_must_leave_removes_the_others_then_hands_over() -> None:
    steps = drive("n2", ("n1",), {"n1", "n2", "n3"})
    assert steps == [Step(ConfChange(REMOVE, "n3")), Step(transfer_to="n1")]


def test_a_lagging_learner_is_not_promoted_and_nothing_is_removed_meanwhile() -> None:
    step = next_change(
        me="n1",
        wanted=("n1", "n2", "n4"),
        voters=("n1", "n2", "n3"),
        learners=("n4",),
        lag={"n2": 0, "n3": 0, "n4": LEARNER_LAG_MAX_ENTRIES + 1},
    )
    assert step is None
    unknown = next_change(me="n1", wanted=("n1", "n4"), voters=("n1",), learners=("n4",), lag={})
    assert unknown is None  # not heard from: not caught up


def test_nothing_to_do_when_membership_matches() -> None:
    assert (
        next_change(me="n1", wanted=("n1", "n2"), voters=("n1", "n2"), learners=(), lag={}) is None
    )
