"""Definitions in the whole-node simulator: streams and consumers made and deleted through
the real meta group, as the servicers make them (cluster/services/streams.py and
consumers.py propose the same entries to the meta leader), and the checks that no
definition is lost or comes back.

- ``meta_propose``: one meta entry through whichever node leads the meta group now,
  following its answers (NOT_LEADER, NO_LEADER, UNAVAILABLE) until ``timeout_s``; the
  result, the refusal, or the last error.
- ``define_workload``: the stream ``Q`` and the consumers the workload uses, before any
  fault.
- ``admin_client``: during the faults, creates and deletes streams ``X<n>`` (on one to all
  of the nodes) and consumers ``E<n>`` on ``Q``, recording each answer in ``Definitions``.
- ``definition_checks``: once every node has applied the same meta log, every node holds
  the same meta state, and each name is defined if and only if its last acknowledged
  operation created it (an operation whose outcome is unknown, a timeout, after it leaves
  the name unchecked): nothing acknowledged is lost, nothing deleted comes back.
"""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raftstream.cluster.meta.entries import (
    AddConsumer,
    AddStream,
    DeleteConsumer,
    DeleteStream,
    MetaEntry,
)
from raftstream.cluster.meta.group import META_GROUP
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import (
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)

if TYPE_CHECKING:
    from .node import SimNode

__all__ = [
    "ACCOUNT",
    "Definitions",
    "admin_client",
    "define_workload",
    "definition_checks",
    "meta_propose",
]

ACCOUNT = "$G"
ADMIN_TIMEOUT_S = 2.0  # one admin call, as a client's deadline
RETRY_S = 0.05
# Answers that say the entry was not applied (a leader will take it again, or it was refused).
_NOT_DONE = (NotLeaderError, NoLeaderError)


@dataclass
class Definitions:
    """What the admin client was told, per name: ``(op, outcome)`` in order, where op is
    ``create`` or ``delete`` and outcome ``ok``, ``refused`` or ``unknown``."""

    ops: dict[str, list[tuple[str, str]]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )
    counts: collections.Counter[str] = field(default_factory=collections.Counter)

    def record(self, key: str, op: str, outcome: str) -> None:
        self.ops[key].append((op, outcome))
        self.counts[f"{op} {outcome}"] += 1

    def expected(self, key: str) -> bool | None:
        """Whether ``key`` must be defined now; None when an unknown outcome leaves it open.
        An operation whose outcome is unknown and an acknowledged one after it are in that
        order in the log if the first is there at all, so the acknowledged one decides."""
        want: bool | None = False
        for op, outcome in self.ops[key]:
            if outcome == "ok":
                want = op == "create"
            elif outcome == "unknown":
                want = None
        return want


def _leader(nodes: dict[str, SimNode]) -> SimNode | None:
    for node in nodes.values():
        if node.meta is not None and node.host is not None and node.meta.is_leader:
            return node
    return None


async def meta_propose(nodes: dict[str, SimNode], entry: MetaEntry, timeout_s: float) -> Any:
    """``entry``'s result through the meta leader of the moment (module docstring).
    Raises the refusal (a definite answer: nothing applied), or the last error once
    ``timeout_s`` has passed (UnavailableError: the outcome may be unknown)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: RaftStreamError = NoLeaderError("no meta leader yet")
    while True:
        left = deadline - loop.time()
        if left <= 0:
            raise last
        node = _leader(nodes)
        if node is not None and node.meta is not None:
            try:
                return await node.meta.propose(entry, left)
            except _NOT_DONE as exc:
                last = exc
            except UnavailableError as exc:
                # Not committed in time, or the proposal was cut off: it may still apply.
                raise exc from None
        await asyncio.sleep(RETRY_S)


def _stamp(nodes: dict[str, SimNode]) -> int:
    node = _leader(nodes) or next(iter(nodes.values()))
    return node.clock.time_ns()


def workload_consumer(i: int) -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=f"C{i}", ack_policy=AckPolicy.EXPLICIT, ack_wait=1_000_000_000
    )


async def define_workload(nodes: dict[str, SimNode], consumers: int) -> None:
    """Stream ``Q`` on every node and the workload's consumers, before any fault (retried
    until each is applied: an add is idempotent)."""
    names = tuple(sorted(nodes))
    config = StreamConfig(name="Q", subjects=("q.>",), num_replicas=len(names)).validate()
    ts = _stamp(nodes)
    entries: list[MetaEntry] = [AddStream(account=ACCOUNT, config=config, peers=names, ts_ns=ts)]
    entries += [
        AddConsumer(account=ACCOUNT, stream="Q", config=workload_consumer(i), ts_ns=ts)
        for i in range(consumers)
    ]
    for entry in entries:
        while True:
            try:
                await meta_propose(nodes, entry, 30.0)
                break
            except UnavailableError:
                continue


async def admin_client(
    nodes: dict[str, SimNode], rng: random.Random, defs: Definitions, pause_s: float
) -> None:
    """Create and delete streams and consumers until cancelled (module docstring)."""
    names = sorted(nodes)
    streams = [f"X{i}" for i in range(1, 4)]
    consumers = [f"E{i}" for i in range(1, 4)]
    while True:
        await asyncio.sleep(rng.uniform(0.0, pause_s))
        create = rng.random() < 0.6
        ts = _stamp(nodes)  # the meta leader's clock, as the servicers stamp their entries
        entry: MetaEntry
        if rng.random() < 0.5:
            name = rng.choice(streams)
            key = f"stream {name}"
            if create:
                peers = tuple(sorted(rng.sample(names, rng.randint(1, len(names)))))
                config = StreamConfig(
                    name=name, subjects=(f"{name.lower()}.>",), num_replicas=len(peers)
                ).validate()
                entry = AddStream(account=ACCOUNT, config=config, peers=peers, ts_ns=ts)
            else:
                entry = DeleteStream(account=ACCOUNT, name=name, ts_ns=ts)
        else:
            name = rng.choice(consumers)
            key = f"consumer Q/{name}"
            if create:
                config = ConsumerConfig(durable_name=name, ack_policy=AckPolicy.EXPLICIT)
                entry = AddConsumer(account=ACCOUNT, stream="Q", config=config, ts_ns=ts)
            else:
                entry = DeleteConsumer(account=ACCOUNT, stream="Q", name=name, ts_ns=ts)
        op = "create" if create else "delete"
        try:
            await meta_propose(nodes, entry, ADMIN_TIMEOUT_S)
        except asyncio.CancelledError:
            defs.record(key, op, "unknown")  # the run's faults ended with it in flight
            raise
        except _NOT_DONE:
            # Refused before it was in any log, or superseded there: never applied.
            defs.record(key, op, "refused")
        except UnavailableError:
            defs.record(key, op, "unknown")  # not committed in time: it may still apply
        except RaftStreamError:
            defs.record(key, op, "refused")  # refused when applied (not found, a clash)
        else:
            defs.record(key, op, "ok")


def _defined(node: SimNode, key: str) -> bool:
    assert node.meta is not None
    state = node.meta.state
    kind, _, name = key.partition(" ")
    try:
        if kind == "stream":
            state.stream(ACCOUNT, name)
        else:
            stream, _, consumer = name.partition("/")
            state.consumer(ACCOUNT, stream, consumer)
    except NotFoundError:
        return False
    return True


async def meta_converged(nodes: Sequence[SimNode], within_s: float) -> list[str]:
    """Wait until every node has applied the same meta log; the problem otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        states = {n.name: n.meta.state.snapshot() for n in nodes if n.meta is not None}
        applied = {n.host.status(META_GROUP).applied for n in nodes if n.host is not None}
        if len(states) == len(nodes) and len(set(states.values())) == 1 and len(applied) == 1:
            return []
        if loop.time() > deadline:
            return [f"the meta states differ {within_s} s after healing (applied {applied})"]
        await asyncio.sleep(0.05)


def definition_checks(nodes: Sequence[SimNode], defs: Definitions) -> list[str]:
    """No acknowledged definition lost, no deleted one back (module docstring)."""
    out = []
    for key in sorted(defs.ops):
        want = defs.expected(key)
        if want is None:
            continue
        for node in nodes:
            have = _defined(node, key)
            if have != want:
                what = "lost" if want else "resurrected"
                out.append(f"{key} {what} on {node.name} (answers: {defs.ops[key]})")
    return out
