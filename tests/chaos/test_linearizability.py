"""The production register checker (``chaos/linearizability.py``): Wing & Gong search with
Lowe's state cache. Linearizability (Herlihy & Wing 1990): every operation appears to take
effect at one instant between its invocation and its response."""

from __future__ import annotations

import random

from raftstream.chaos.linearizability import RegOp, check_register, prune_unobserved


def put(a: int, t0: float, t1: float | None) -> RegOp:
    return RegOp("put", a=a, invoke=t0, ret=t1)


def get(r: int, t0: float, t1: float) -> RegOp:
    return RegOp("get", result=r, invoke=t0, ret=t1)


def cas(a: int, b: int, r: bool | None, t0: float, t1: float | None) -> RegOp:
    return RegOp("cas", a=a, b=b, result=r, invoke=t0, ret=t1)


def test_sequential_history_is_linearizable() -> None:
    ops = [put(1, 0, 1), get(1, 2, 3), cas(1, 2, True, 4, 5), get(2, 6, 7)]
    assert check_register(ops).ok is True


def test_stale_read_after_a_completed_write_is_not() -> None:
    assert check_register([put(1, 0, 1), get(0, 2, 3)]).ok is False


def test_read_concurrent_with_a_write_may_see_either_value() -> None:
    assert check_register([put(1, 0, 10), get(0, 1, 2), get(1, 3, 4)]).ok is True
    # ...but once a read has seen the new value, a later read cannot see the old one.
    assert check_register([put(1, 0, 10), get(1, 1, 2), get(0, 3, 4)]).ok is False


def test_unknown_write_may_take_effect_late_or_never() -> None:
    assert check_register([put(5, 0, None), get(0, 1, 2), get(5, 10, 11)]).ok is True
    assert check_register([put(5, 0, None), get(0, 1, 2)]).ok is True


def test_unknown_cas_does_what_the_state_implies() -> None:
    ops = [put(1, 0, 1), cas(1, 2, None, 2, None), get(2, 5, 6)]
    assert check_register(ops).ok is True
    ops = [put(1, 0, 1), cas(3, 2, None, 2, None), get(2, 5, 6)]  # could never swap
    assert check_register(ops).ok is False


def test_unobserved_unknown_writes_are_pruned() -> None:
    ops = [put(1, 0, 1), put(9, 2, None), cas(4, 7, None, 3, None), get(1, 5, 6)]
    kept = prune_unobserved(ops)
    assert [o.kind for o in kept] == ["put", "get"]


def test_a_failed_cas_keeps_the_unobserved_write_that_explains_it() -> None:
    """Regression (chaos corrupt run, seed 5301): an unknown cas 53->64 took effect (the
    stores hold 64), so cas 53->82 failed; 64 was overwritten before any get. Pruning the
    unknown cas as unobserved made this correct history look non-linearizable."""
    ops = [
        put(53, 0.0, 1.0),
        get(53, 1.1, 1.2),
        cas(53, 64, None, 1.3, None),  # the client lost its connection: unknown
        cas(53, 82, False, 2.0, 2.1),
        put(84, 2.2, 2.3),
        get(84, 2.4, 2.5),
    ]
    assert len(prune_unobserved(ops)) == len(ops)
    assert check_register(ops).ok is True
    # Without the unknown cas, the failed cas has no explanation: not linearizable.
    assert check_register([o for o in ops if o.result is not None or o.kind != "cas"]).ok is False


def test_large_concurrent_history_finishes_within_budget() -> None:
    """A correct register simulated with overlapping ops: linearizable, found quickly."""
    rng = random.Random(7)
    state, t, ops = 0, 0.0, []
    for i in range(1, 400):
        t0 = t
        t += rng.uniform(0.1, 1.0)
        kind = rng.choice(["put", "get", "cas"])
        if kind == "put":
            state = i
            ops.append(put(i, t0, t + 0.5))
        elif kind == "get":
            ops.append(get(state, t0, t + 0.5))
        else:
            ok = rng.random() < 0.5
            expected = state if ok else -1
            if ok:
                state = i
            ops.append(cas(expected, i, ok, t0, t + 0.5))
    verdict = check_register(ops)
    assert verdict.ok is True
    assert verdict.explored < 100_000


def test_budget_exhausted_is_unknown_not_a_verdict() -> None:
    ops = [put(i, 0, 100) for i in range(1, 16)] + [get(99, 101, 102)]
    assert check_register(ops, states_max=50).ok is None
