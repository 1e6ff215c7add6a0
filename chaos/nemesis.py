"""Nemeses: faults that start and stop on a timeline against a ``ChaosCluster``.

A ``Nemesis`` has ``start(ctx) -> Fault`` (inject the fault, say what was done) and
``stop(ctx, fault)`` (heal it). ``run_timeline`` alternates quiet intervals and fault
windows until its time budget ends, records every window in the history (``nemesis`` lines
with the fault's description and facts, e.g. the minority of a partition) and always heals
at the end, even when it is interrupted. Everything here is synchronous (toxiproxy-python
and signals): the campaign runs the timeline in a worker thread.

Partitions disable proxies (connections refused and live ones dropped), so a cut is clean
and immediate. ``Fault.minority`` lists the nodes that cannot reach a majority while the
fault lasts: the checker refuses any acknowledgement given through them in that window.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.history import History

__all__ = [
    "NEMESES",
    "Fault",
    "Nemesis",
    "NemesisContext",
    "corrupt_file",
    "run_timeline",
]

log = logging.getLogger(__name__)

LATENCY_MS = 100
JITTER_MS = 50
BANDWIDTH_KBPS = 64
RESET_AFTER_MS = 200
CORRUPT_FLIPS = 64
# LMDB keeps its two meta pages at the start of data.mdb; flipping them only makes LMDB fall
# back to the other root, so flips go past them to hit B-tree pages and records.
LMDB_META_BYTES = 2 * 4096
# A damaged node detects the damage at start, quarantines its Raft data and is repaired from
# its peers (removed from every group and added back fresh) before it serves again.
REPAIR_WAIT_S = 60.0
DETECT_LOG_LINES = 400
QUARANTINE_MARKER = "quarantined"
# What a node says when it refuses damaged data: its own checksums, or LMDB's checks.
REFUSAL_MARKERS = ("DataLossError", "MDB_CORRUPTED", "MDB_INVALID", "MDB_PAGE_NOTFOUND")
ELECTION_WAIT_S = 10.0
ELECTION_POLL_S = 0.02


@dataclass(slots=True)
class NemesisContext:
    """What a nemesis acts on: the cluster, a seeded RNG, the history, the queue stream."""

    cluster: ChaosCluster
    rng: random.Random
    history: History
    stream: str


@dataclass(slots=True)
class Fault:
    """A fault in place: its description, the facts the checker needs, and how to heal it."""

    description: str
    facts: dict[str, Any] = field(default_factory=dict)
    minority: tuple[str, ...] = ()
    undo: Callable[[], None] | None = None
    # Runs right after the fault's start is recorded (e.g. timing the election a kill
    # causes), so that measuring does not delay the recorded start.
    observe: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Nemesis:
    """A named fault kind: ``inject`` puts a fault in place and returns it."""

    name: str
    inject: Callable[[NemesisContext], Fault]
    window_s: tuple[float, float] = (2.0, 4.0)


# -- partitions ----------------------------------------------------------------------------


def _cross(a: Iterable[str], b: Iterable[str]) -> list[tuple[str, str]]:
    """Both directions of every link between groups ``a`` and ``b``."""
    pairs = list(itertools.product(a, b))
    return pairs + [(y, x) for x, y in pairs]


def _split(ctx: NemesisContext, minority: Sequence[str], label: str) -> Fault:
    c = ctx.cluster
    majority = [n for n in c.names if n not in minority]
    c.cut(_cross(minority, majority))
    return Fault(
        f"{label}: {sorted(minority)} | {sorted(majority)}",
        facts={"minority": sorted(minority), "majority": sorted(majority)},
        minority=tuple(sorted(minority)),
        undo=c.heal,
    )


def isolate_random(ctx: NemesisContext) -> Fault:
    return _split(ctx, [ctx.rng.choice(ctx.cluster.names)], "isolate-node")


def isolate_leader(ctx: NemesisContext) -> Fault:
    leader = ctx.cluster.stream_leader(ctx.stream) or ctx.rng.choice(ctx.cluster.names)
    return _split(ctx, [leader], "isolate-leader")


def split_minority(ctx: NemesisContext) -> Fault:
    names = list(ctx.cluster.names)
    ctx.rng.shuffle(names)
    return _split(ctx, names[: (len(names) - 1) // 2], "majority-minority")


def leader_minority(ctx: NemesisContext) -> Fault:
    """The largest minority, the stream leader in it (on 3 nodes: the leader alone; on 5: the
    leader and one follower, which can still elect nobody)."""
    names = list(ctx.cluster.names)
    leader = ctx.cluster.stream_leader(ctx.stream) or ctx.rng.choice(names)
    others = [n for n in names if n != leader]
    ctx.rng.shuffle(others)
    return _split(ctx, [leader, *others[: (len(names) - 1) // 2 - 1]], "leader-minority")


def bridge(ctx: NemesisContext) -> Fault:
    """Two halves that only the bridge node connects; nobody is cut from a majority."""
    c = ctx.cluster
    names = list(c.names)
    ctx.rng.shuffle(names)
    middle, rest = names[0], names[1:]
    left, right = rest[: len(rest) // 2], rest[len(rest) // 2 :]
    c.cut(_cross(left, right))
    return Fault(
        f"bridge via {middle}: {sorted(left)} x {sorted(right)}",
        facts={"bridge": middle, "left": sorted(left), "right": sorted(right)},
        undo=c.heal,
    )


def one_way(ctx: NemesisContext) -> Fault:
    """The stream leader cannot send to anyone, but hears everyone."""
    c = ctx.cluster
    leader = c.stream_leader(ctx.stream) or ctx.rng.choice(c.names)
    c.cut([(leader, n) for n in c.names if n != leader])
    return Fault(f"one-way: {leader} -> all cut", facts={"mute": leader}, undo=c.heal)


# -- link toxics ---------------------------------------------------------------------------


def _toxic_all(ctx: NemesisContext, description: str, **toxic: Any) -> Fault:
    c = ctx.cluster
    for pair in c.links:
        for stream in ("upstream", "downstream"):
            c.add_toxic(pair, stream=stream, name=f"{toxic['type']}_{stream}", **toxic)
    return Fault(description, facts={"toxic": toxic}, undo=c.heal)


def latency(ctx: NemesisContext) -> Fault:
    attrs = {"latency": LATENCY_MS, "jitter": JITTER_MS}
    return _toxic_all(ctx, f"latency {LATENCY_MS}±{JITTER_MS} ms", type="latency", attributes=attrs)


def bandwidth(ctx: NemesisContext) -> Fault:
    attrs = {"rate": BANDWIDTH_KBPS}
    return _toxic_all(ctx, f"bandwidth {BANDWIDTH_KBPS} KB/s", type="bandwidth", attributes=attrs)


def resets(ctx: NemesisContext) -> Fault:
    """Every connection on half of the links is reset ``RESET_AFTER_MS`` after it opens."""
    c = ctx.cluster
    pairs = ctx.rng.sample(sorted(c.links), max(1, len(c.links) // 2))
    for pair in pairs:
        c.add_toxic(
            pair, type="reset_peer", stream="upstream", attributes={"timeout": RESET_AFTER_MS}
        )
    return Fault(
        f"connection resets on {len(pairs)} links",
        facts={"links": [f"{a}->{b}" for a, b in pairs]},
        undo=c.heal,
    )


# -- processes -----------------------------------------------------------------------------


def _kill(ctx: NemesisContext, name: str, label: str) -> Fault:
    c = ctx.cluster
    was_leader = c.stream_leader(ctx.stream) == name
    c.kill(name)
    fault = Fault(f"{label}: kill -9 {name}", facts={"killed": name})
    fault.undo = lambda: c.start_node(name)
    if was_leader:
        fault.observe = lambda: fault.facts.update(election_s=_time_to_new_leader(ctx, name))
    return fault


def _time_to_new_leader(ctx: NemesisContext, old: str) -> float | None:
    """Seconds until a live node names a stream leader other than ``old`` (None: not
    within ``ELECTION_WAIT_S``). Polled, so it errs late by up to one poll."""
    c = ctx.cluster
    start = time.monotonic()
    while time.monotonic() - start < ELECTION_WAIT_S:
        leader = c.stream_leader(ctx.stream)
        if leader is not None and leader != old:
            return round(time.monotonic() - start, 3)
        time.sleep(ELECTION_POLL_S)
    return None


def kill_random(ctx: NemesisContext) -> Fault:
    return _kill(ctx, ctx.rng.choice(ctx.cluster.names), "kill-random")


def kill_stream_leader(ctx: NemesisContext) -> Fault:
    leader = ctx.cluster.stream_leader(ctx.stream) or ctx.rng.choice(ctx.cluster.names)
    return _kill(ctx, leader, "kill-stream-leader")


def kill_meta_leader(ctx: NemesisContext) -> Fault:
    leader = ctx.cluster.meta_leader() or ctx.rng.choice(ctx.cluster.names)
    return _kill(ctx, leader, "kill-meta-leader")


def pause(ctx: NemesisContext) -> Fault:
    """SIGSTOP the stream leader (its window outlasts the election timeout)."""
    c = ctx.cluster
    name = c.stream_leader(ctx.stream) or ctx.rng.choice(c.names)
    c.pause(name)
    return Fault(f"pause: SIGSTOP {name}", facts={"paused": name}, undo=lambda: c.resume(name))


def bounce(ctx: NemesisContext) -> Fault:
    """kill -9 every node at once; the window's end restarts them all."""
    c = ctx.cluster
    for name in c.names:
        c.kill(name)
    return Fault("bounce: kill -9 all", facts={"killed": list(c.names)}, undo=c.bounce_all)


def remove_node(ctx: NemesisContext) -> Fault:
    """The operator's "a node is gone" (docs/operations.md): kill -9 a random node and
    ``peer-remove`` it, so the meta leader places its replicas elsewhere (on a cluster with
    a spare node) while the workloads run; the window's end readmits it (``peer-add``) and
    starts it on its old data, and the groups it lost are placed on it again as needed."""
    c = ctx.cluster
    name = ctx.rng.choice(c.names)
    fault = _kill(ctx, name, "remove-node")
    fault.description += f", peer-remove {name}"
    fault.facts["removed"] = name
    timed = fault.observe  # (the kill's election, timed from the recorded start)

    def remove() -> None:
        if timed is not None:
            timed()
        c.remove_peer(name)

    fault.observe = remove

    def readmit() -> None:
        c.add_peer(name)
        c.start_node(name)

    fault.undo = readmit
    return fault


# -- corruption ----------------------------------------------------------------------------


def corrupt_file(path: Path, rng: random.Random, *, mode: str) -> dict[str, Any]:
    """Damage ``path`` in place: ``flip`` flips ``CORRUPT_FLIPS`` random bits past the LMDB
    meta pages; ``truncate`` cuts the file to a random fraction of its size. Returns what
    was done (offsets or the new size)."""
    size = path.stat().st_size
    if mode == "truncate":
        new_size = max(LMDB_META_BYTES, int(size * rng.uniform(0.3, 0.8)))
        os.truncate(path, new_size)
        return {"file": str(path), "mode": mode, "size": size, "new_size": new_size}
    offsets = sorted(rng.randrange(LMDB_META_BYTES, size) for _ in range(CORRUPT_FLIPS))
    with path.open("r+b") as fh:
        for off in offsets:
            fh.seek(off)
            byte = fh.read(1)[0]
            fh.seek(off)
            fh.write(bytes([byte ^ (1 << rng.randrange(8))]))
    return {"file": str(path), "mode": mode, "size": size, "offsets": offsets[:8]}


def corrupt(ctx: NemesisContext) -> Fault:
    """Stop one non-leader node, damage its Raft log environment, then (at the window's
    end) start it again: it must detect the damage and be repaired from its peers before it
    serves (``outcome`` says how it went; the run's divergence check then compares its store
    with its peers')."""
    c = ctx.cluster
    if len(c.damaged) >= (len(c.names) - 1) // 2:
        # One more damaged node would take the majority: a minority only, as the issue says.
        return Fault("corrupt: skipped (a minority is already damaged)")
    leader = c.stream_leader(ctx.stream)
    healthy = [n for n in c.running() if n != leader and n not in c.damaged]
    if not healthy:
        return Fault("corrupt: skipped (no healthy follower)")
    victim = ctx.rng.choice(healthy)
    c.kill(victim)
    mode = ctx.rng.choice(["flip", "truncate"])
    data_file = c.nodes[victim].data / "raft" / "data.mdb"
    done = corrupt_file(data_file, ctx.rng, mode=mode) if data_file.exists() else {}
    fault = Fault(f"corrupt {victim} ({mode})", facts={"node": victim, **done})
    fault.undo = lambda: _restart_damaged(ctx, victim, fault)
    return fault


def _restart_damaged(ctx: NemesisContext, name: str, fault: Fault) -> None:
    """Start the damaged node and wait until it serves again: ``repaired`` when it found the
    damage (quarantined its data) and was repaired from its peers, ``serving (no damage
    found)`` when the damage missed every record it reads (free pages); if instead it exits
    or never serves, record how and leave it down (``damaged``)."""
    c = ctx.cluster
    c.start_node(name, wait=False)
    start = time.monotonic()
    try:
        c.wait_serving(name, timeout_s=REPAIR_WAIT_S)
        took = round(time.monotonic() - start, 1)
        detected = QUARANTINE_MARKER in c.log_tail(name, DETECT_LOG_LINES)
        fault.facts["outcome"] = (
            f"repaired in {took} s" if detected else "serving (no damage found)"
        )
    except (RuntimeError, TimeoutError):
        code = c.exited(name)
        fault.facts["outcome"] = _damage_outcome(code, c.log_tail(name, DETECT_LOG_LINES))
        c.kill(name)  # reaps it; the damaged data stays for the audit
        c.damaged.add(name)


def _damage_outcome(code: int | None, log_tail: str) -> str:
    """How a node that did not come back took its damaged data: refused it (its checksums or
    LMDB's), crashed (a signal: LMDB reading past a truncated file gets SIGBUS), exited
    otherwise, or hung (still under repair: no healthy majority answered it)."""
    if code is None:
        return "not serving (hung or still under repair)"
    for marker in REFUSAL_MARKERS:
        if marker in log_tail:
            return f"refused: {marker} (exit {code})"
    if code < 0:
        return f"crashed: signal {-code}"
    return f"exited {code}"


# -- the timeline --------------------------------------------------------------------------

NEMESES: dict[str, Nemesis] = {
    n.name: n
    for n in [
        Nemesis("isolate-node", isolate_random),
        Nemesis("isolate-leader", isolate_leader),
        Nemesis("majority-minority", split_minority),
        Nemesis("leader-minority", leader_minority),
        Nemesis("bridge", bridge),
        Nemesis("one-way", one_way),
        Nemesis("latency", latency),
        Nemesis("bandwidth", bandwidth),
        Nemesis("resets", resets),
        Nemesis("kill-random", kill_random),
        Nemesis("kill-stream-leader", kill_stream_leader),
        Nemesis("kill-meta-leader", kill_meta_leader),
        Nemesis("pause", pause, window_s=(1.5, 3.0)),
        Nemesis("bounce", bounce, window_s=(0.2, 1.0)),
        Nemesis("remove-node", remove_node, window_s=(3.0, 6.0)),
        Nemesis("corrupt", corrupt, window_s=(0.5, 1.5)),
    ]
}


def run_timeline(
    ctx: NemesisContext,
    nemesis: Nemesis,
    *,
    duration_s: float,
    quiet_s: tuple[float, float] = (2.0, 4.0),
    stop: threading.Event,
) -> list[Fault]:
    """Alternate quiet intervals and ``nemesis`` windows for ``duration_s`` seconds (or until
    ``stop`` is set); heal at the end whatever happens. Returns the faults injected."""
    faults: list[Fault] = []
    end = ctx.history.now() + duration_s
    try:
        while not stop.is_set():
            if stop.wait(ctx.rng.uniform(*quiet_s)) or ctx.history.now() >= end:
                break
            fault = nemesis.inject(ctx)
            faults.append(fault)
            ctx.history.nemesis(
                "start",
                fault.description,
                nemesis=nemesis.name,
                minority=list(fault.minority),
                facts=dict(fault.facts),
            )
            if fault.observe is not None:
                fault.observe()
            stop.wait(ctx.rng.uniform(*nemesis.window_s))
            _heal(ctx, fault, nemesis.name)
    finally:
        _final_heal(ctx)
    return faults


def _heal(ctx: NemesisContext, fault: Fault, name: str) -> None:
    # Healing takes a while (a partition's undo enables every proxy in turn: 20 HTTP calls or
    # more on 5 nodes), and a link may be back before "stop" is written: the checker ends a
    # partition's window when healing began (``heal_began``), not when it was done.
    began = ctx.history.now()
    try:
        if fault.undo is not None:
            fault.undo()
    finally:
        ctx.history.nemesis(
            "stop", fault.description, nemesis=name, facts=fault.facts, heal_began=began
        )


def _final_heal(ctx: NemesisContext) -> None:
    """Every link back and every live node resumed; dead nodes restarted (except a node a
    corruption left down: it was not repaired)."""
    c = ctx.cluster
    with contextlib.suppress(Exception):
        c.heal()
    for name in c.names:
        c.resume(name)
        if c.process(name) is None and name not in c.damaged:
            with contextlib.suppress(RuntimeError, TimeoutError):
                c.start_node(name)
