"""A Wing & Gong linearizability checker for registers (the Knossos/Porcupine family).

An ``RegOp`` is a put, a get or a compare-and-set on one register, with its invocation and
response times; ``ret=None`` means the outcome is unknown (the client gave up or crashed):
the operation may have taken effect at any point after its invocation, or never.

``check_register`` searches for a legal sequential order consistent with real time: an
operation may be linearized next only if it was invoked before the earliest response among
the completed operations still waiting, and if the register accepts its recorded result.
Explored (linearized set, state) pairs are cached (Lowe's refinement of Wing & Gong), the
search is iterative (no recursion limit), and bounded by ``states_max``: beyond it the
answer is ``None`` (unknown) rather than a guess.

Before searching, unknown writes whose value nobody ever observed are dropped: linearizing
them as never having happened is always possible, since no read depends on them. Not when a
compare-and-set FAILED on the register: a failed cas observes that the value was not the
one it expected, which an unobserved write may be the only explanation of (found by the
corruption nemesis: an unknown cas 53->64 took effect, a later cas 53->82 failed, and 64 was
overwritten before anyone read it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["RegOp", "Verdict", "check_register", "prune_unobserved"]

INF = float("inf")
STATES_MAX = 2_000_000
Kind = Literal["put", "get", "cas"]


@dataclass(frozen=True, slots=True)
class RegOp:
    """``put(a)``, ``get() -> result`` or ``cas(a, b) -> result`` (True: it swapped).

    ``result`` None on a cas means unknown; ``ret`` None means the op never returned. Gets
    with an unknown outcome say nothing and must be left out by the caller.
    """

    kind: Kind
    a: int = 0
    b: int = 0
    result: int | bool | None = None
    invoke: float = 0.0
    ret: float | None = None
    ref: int = -1  # the history op id, for reports

    def describe(self) -> str:
        end = "?" if self.ret is None else f"{self.ret:.3f}"
        args = {"put": f"{self.a}", "get": "", "cas": f"{self.a},{self.b}"}[self.kind]
        return f"#{self.ref} {self.kind}({args})->{self.result} @[{self.invoke:.3f},{end}]"


@dataclass(frozen=True, slots=True)
class Verdict:
    """``ok`` True/False, or None when the search hit ``states_max``; ``ops`` the history
    checked; ``explored`` the number of states visited."""

    ok: bool | None
    ops: tuple[RegOp, ...]
    explored: int


def _step(op: RegOp, state: int) -> tuple[bool, int]:
    """Whether ``op`` with its recorded result is legal in ``state``; the next state."""
    if op.kind == "put":
        return True, op.a
    if op.kind == "get":
        return op.result == state, state
    match = state == op.a
    if op.result is None:  # unknown cas: it did whatever the state implies
        return True, op.b if match else state
    if bool(op.result) != match:
        return False, state
    return True, op.b if match else state


def prune_unobserved(ops: Sequence[RegOp]) -> list[RegOp]:
    """Drop unknown puts and unknown cas whose written value no op observed (a get result
    or the expected value of a cas), unless a cas failed (see the module docstring): then
    every op is kept."""
    if any(op.kind == "cas" and op.result is False for op in ops):
        return list(ops)
    observed: set[int] = set()
    for op in ops:
        if op.kind == "get" and isinstance(op.result, int) and not isinstance(op.result, bool):
            observed.add(op.result)
        elif op.kind == "cas":
            observed.add(op.a)
    out = []
    for op in ops:
        unknown = op.ret is None or (op.kind == "cas" and op.result is None)
        written = op.a if op.kind == "put" else op.b
        if unknown and op.kind != "get" and written not in observed:
            continue
        out.append(op)
    return out


def check_register(
    ops: Sequence[RegOp], initial: int = 0, *, states_max: int = STATES_MAX
) -> Verdict:
    """Whether the history of one register is linearizable (see the module docstring)."""
    kept = sorted(prune_unobserved(ops), key=lambda o: o.invoke)
    n = len(kept)
    rets = [INF if o.ret is None else o.ret for o in kept]
    required = 0
    for i, o in enumerate(kept):
        if o.ret is not None:
            required |= 1 << i
    seen: set[tuple[int, int]] = set()
    # Each frame: (linearized set, state, next candidate index to try).
    stack: list[tuple[int, int, int]] = [(0, initial, 0)]
    while stack:
        done, state, start = stack.pop()
        if done & required == required:
            return Verdict(True, tuple(kept), len(seen))
        if start == 0:
            if (done, state) in seen:
                continue
            seen.add((done, state))
            if len(seen) > states_max:
                return Verdict(None, tuple(kept), len(seen))
        deadline = min(rets[i] for i in range(n) if not done >> i & 1 and required >> i & 1)
        for i in range(start, n):
            if done >> i & 1:
                continue
            if kept[i].invoke > deadline:
                break  # sorted by invocation: no later op may go first either
            legal, nxt = _step(kept[i], state)
            if legal:
                stack.append((done, state, i + 1))  # resume the siblings after this child
                stack.append((done | 1 << i, nxt, 0))
                break
    return Verdict(False, tuple(kept), len(seen))
