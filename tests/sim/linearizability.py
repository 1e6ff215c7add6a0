"""A Wing & Gong style linearizability checker for one register (Knossos/Porcupine family).

An operation is ``Op(kind, a, b, result, invoke, ret)`` with ``ret=None`` when its outcome
is unknown (the client gave up or its node crashed): such an operation may have taken
effect at any point after its invocation, or never. Reads with unknown outcome tell
nothing and should be left out by the caller.

The search linearizes one operation at a time: an operation may go next only if it was
invoked before the earliest response among the completed operations still waiting, and if
the register model accepts its recorded result. (linearized set, state) pairs already
explored are cached, which keeps bounded histories fast.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True)
class Op:
    kind: str  # "put" | "get" | "cas"
    a: int = 0
    b: int = 0
    result: int | bool | None = None  # None: unknown
    invoke: float = 0.0
    ret: float | None = None  # None: never returned

    def describe(self) -> str:
        end = "?" if self.ret is None else f"{self.ret:g}"
        return f"{self.kind}({self.a},{self.b})->{self.result} @[{self.invoke:g},{end}]"


def _step(op: Op, state: int) -> tuple[bool, int]:
    """Whether ``op`` (with its recorded result) is legal in ``state``; the next state."""
    if op.kind == "put":
        return True, op.a
    if op.kind == "get":
        return op.result == state, state
    ok = state == op.a
    if op.result is None:  # unknown cas: it did whatever the state implies
        return True, op.b if ok else state
    if bool(op.result) != ok:
        return False, state
    return True, op.b if ok else state


def check_register(ops: Sequence[Op], initial: int = 0) -> bool:
    """True if the history of one register is linearizable."""
    ops = sorted(ops, key=lambda o: o.invoke)
    n = len(ops)
    rets = [INF if o.ret is None else o.ret for o in ops]
    required = 0
    for i, o in enumerate(ops):
        if o.ret is not None:
            required |= 1 << i
    seen: set[tuple[int, int]] = set()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 100))
    try:
        return _search(ops, rets, required, 0, initial, seen)
    finally:
        sys.setrecursionlimit(limit)


def _search(
    ops: Sequence[Op],
    rets: list[float],
    required: int,
    done: int,
    state: int,
    seen: set[tuple[int, int]],
) -> bool:
    if done & required == required:
        return True
    if (done, state) in seen:
        return False
    seen.add((done, state))
    deadline = min(rets[i] for i in range(len(ops)) if not done >> i & 1 and required >> i & 1)
    for i, op in enumerate(ops):
        if done >> i & 1:
            continue
        if op.invoke > deadline:
            break  # sorted by invocation: no later op can go first either
        legal, nxt = _step(op, state)
        if legal and _search(ops, rets, required, done | 1 << i, nxt, seen):
            return True
    return False
