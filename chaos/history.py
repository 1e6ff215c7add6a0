"""The recorded history of a chaos run: one JSON object per line, append-only.

Every operation writes two lines: an ``invoke`` line before the request leaves, and a
completion line (``ok``, ``fail`` or ``info``) when its outcome is known. ``ok``: the
operation took effect (a publish acknowledged, a read answered); ``fail``: it certainly did
not (a failed precondition, a refused argument); ``info``: unknown, it may or may not have
taken effect (a timeout, a broken connection, a crash). An operation whose completion line
is missing (the harness died) is unknown as well. Nemesis events are ``nemesis`` lines with
``f`` = ``start`` or ``stop``.

Times are seconds since the run's start on the monotonic clock of the recording process,
so invocation and completion times of different operations compare in real-time order.

A ``History`` belongs to the event loop (or thread) that writes it; writes are line-buffered
so that a killed harness leaves every finished line on disk for the checker and the audit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

__all__ = ["History", "Op", "Outcome", "load_ops", "nemesis_windows", "pair_ops"]

Outcome = Literal["ok", "fail", "info"]
OUTCOMES: frozenset[str] = frozenset({"ok", "fail", "info"})


@dataclass(slots=True, kw_only=True)
class Op:
    """One operation: its invocation and, once known, its outcome.

    ``type`` is ``info`` while the outcome is unknown; ``complete`` is None when no
    completion was recorded. ``value`` is what was asked (e.g. the published value),
    ``result`` what came back (e.g. ``{"seq": 7}``).
    """

    id: int
    process: str
    f: str
    value: Any
    invoke: float
    node: str = ""
    type: Outcome = "info"
    complete: float | None = None
    result: Any = None
    error: str = ""

    def describe(self) -> str:
        """A one-line human description for reports."""
        end = "?" if self.complete is None else f"{self.complete:.3f}"
        res = f" -> {self.result!r}" if self.result is not None else ""
        err = f" ({self.error})" if self.error else ""
        return (
            f"#{self.id} {self.process}@{self.node} {self.f}({self.value!r}) "
            f"{self.type}{res}{err} [{self.invoke:.3f}, {end}]"
        )


@dataclass(slots=True)
class History:
    """Appends history lines to ``path`` (created; its parent must exist). ``clock`` is the
    time source (monotonic seconds; tests pass a fake one)."""

    path: Path
    clock: Callable[[], float] = time.monotonic
    started: float | None = None
    _next_id: int = 0
    _fh: IO[str] | None = None

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock()
        self._fh = self.path.open("a", buffering=1, encoding="utf-8")

    def now(self) -> float:
        """Seconds since the start of the run (monotonic)."""
        return self.clock() - (self.started or 0.0)

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            raise ValueError("the history is closed")
        self._fh.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")

    def invoke(
        self, process: str, f: str, value: Any, *, node: str = "", at: float | None = None
    ) -> Op:
        """Record the invocation of an operation and return it (complete it with ``done``).
        ``at``: when it was invoked, if earlier than now (e.g. a delivery: its fetch's start)."""
        invoked = self.now() if at is None else at
        op = Op(id=self._next_id, process=process, f=f, value=value, invoke=invoked, node=node)
        self._next_id += 1
        self._write(
            {
                "type": "invoke",
                "id": op.id,
                "process": process,
                "f": f,
                "value": value,
                "node": node,
                "time": op.invoke,
            }
        )
        return op

    def done(
        self,
        op: Op,
        outcome: Outcome,
        result: Any = None,
        error: str = "",
        *,
        at: float | None = None,
    ) -> Op:
        """Record the outcome of ``op`` (mutated in place and returned); ``at`` as in
        ``invoke``."""
        completed = self.now() if at is None else at
        op.type, op.complete, op.result, op.error = outcome, completed, result, error
        self._write(
            {
                "type": outcome,
                "id": op.id,
                "process": op.process,
                "f": op.f,
                "value": op.value,
                "node": op.node,
                "time": op.complete,
                "result": result,
                "error": error,
            }
        )
        return op

    def nemesis(self, phase: Literal["start", "stop"], description: str, **extra: Any) -> float:
        """Record a nemesis event now; returns its time."""
        t = self.now()
        self._write({"type": "nemesis", "f": phase, "value": description, "time": t, **extra})
        return t

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a history file; a torn last line (a killed writer) is skipped."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def pair_ops(records: Iterable[dict[str, Any]]) -> list[Op]:
    """Operations from invoke/completion records, ordered by id; unmatched invokes stay
    ``info`` (unknown) with ``complete`` None."""
    ops: dict[int, Op] = {}
    for r in records:
        kind = r.get("type")
        if kind == "invoke":
            ops[r["id"]] = Op(
                id=r["id"],
                process=r["process"],
                f=r["f"],
                value=r.get("value"),
                invoke=float(r["time"]),
                node=r.get("node", ""),
            )
        elif kind in OUTCOMES and r.get("id") in ops:
            op = ops[r["id"]]
            op.type, op.complete = kind, float(r["time"])
            op.result, op.error = r.get("result"), r.get("error", "")
    return [ops[k] for k in sorted(ops)]


def nemesis_windows(records: Iterable[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(start, stop, description) of every nemesis window; an unclosed one ends at +inf."""
    open_at: dict[str, float] = {}
    out: list[tuple[float, float, str]] = []
    for r in records:
        if r.get("type") != "nemesis":
            continue
        desc = str(r["value"])
        if r["f"] == "start":
            open_at[desc] = float(r["time"])
        elif desc in open_at:
            out.append((open_at.pop(desc), float(r["time"]), desc))
    out.extend((t, float("inf"), d) for d, t in open_at.items())
    return sorted(out)


def load_ops(path: Path) -> tuple[list[Op], list[dict[str, Any]]]:
    """(operations, nemesis records) of the history at ``path``."""
    records = list(read_records(path))
    return pair_ops(records), [r for r in records if r.get("type") == "nemesis"]
