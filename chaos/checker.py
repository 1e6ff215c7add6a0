"""What a chaos history proves: every anomaly, with the operations involved.

Input: the operations of a history (``history.pair_ops``), its nemesis records, and
optionally the per-node contents of the stores read after the run (``NodeContents``).
Output: a ``CheckResult`` with every ``Anomaly`` found. The kinds:

- ``lost`` (acknowledged publish missing from the final read), split by where it falls
  among the acknowledged publishes ordered by acknowledgement time: ``lost-prefix``
  (before the first that survived), ``lost-middle``, ``lost-postfix`` (after the last);
- ``ack-mismatch``: the sequence a PubAck named holds another value;
- ``duplicate``: one published value stored at several sequences;
- ``order``: publish A acknowledged before publish B was invoked, yet A's seq > B's;
- ``never-published``: a value read (final read, delivery, a node's store) nobody published;
- ``divergence``: two nodes store different messages at the same sequence, or a node has a
  hole where others have a message (``replica-lag`` is a node only missing a tail);
- ``acked-redelivered``: a delivery whose fetch began after an ack of that value succeeded
  (pull deliveries only: when the server decided a push delivery is not known to the
  client, which may have held it in its buffer while the ack of an earlier one succeeded);
- ``undelivered``: a stored message the pull consumer, or the push consumer when the run
  had one, never delivered (after the drain);
- ``minority-ack``: an acknowledgement through a node cut off from the majority, given
  wholly within that partition (from the cut until its healing began);
- ``nonlinearizable``: a key-value register history with no linearization
  (``kv-unchecked`` when the search was too large to finish);
- ``definition-lost`` / ``definition-resurrected``: a created stream or consumer missing
  from the final listing though never deleted, or a deleted one back;
- ``final-read-failed``: the final read did not succeed, so loss cannot be judged.

Pure functions of their inputs; nothing here does IO.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftstream.chaos.history import Op
from raftstream.chaos.linearizability import RegOp, check_register

__all__ = [
    "SAFETY_KINDS",
    "Anomaly",
    "CheckResult",
    "NodeContents",
    "check",
    "check_definitions",
    "check_divergence",
    "check_kv",
    "check_minority_acks",
    "check_queue",
]

# One node's stores: stream -> seq -> (content hash, decoded value).
NodeContents = Mapping[str, Mapping[int, tuple[str, Any]]]

EXAMPLES_MAX = 20  # operations listed per anomaly kind in reports
CULPRITS_SHOWN = 8  # ops shown for a non-linearizable key: the last of the failing prefix
# Anomalies that break a safety promise; the rest (lag, an unfinished search) are reported
# but do not fail a run.
SAFETY_KINDS = frozenset(
    {
        "lost-prefix",
        "lost-middle",
        "lost-postfix",
        "ack-mismatch",
        "duplicate",
        "order",
        "never-published",
        "divergence",
        "acked-redelivered",
        "undelivered",
        "minority-ack",
        "nonlinearizable",
        "definition-lost",
        "definition-resurrected",
        "final-read-failed",
    }
)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomaly: its kind, what happened, and the operations involved (descriptions)."""

    kind: str
    description: str
    ops: tuple[str, ...] = ()


@dataclass(slots=True)
class CheckResult:
    """Every anomaly found, plus counters for the summary."""

    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return sum(1 for a in self.anomalies if a.kind == kind)

    @property
    def safe(self) -> bool:
        return not any(a.kind in SAFETY_KINDS for a in self.anomalies)


def _ok(ops: Iterable[Op], f: str) -> list[Op]:
    return [o for o in ops if o.f == f and o.type == "ok"]


def _final_queue(ops: Sequence[Op]) -> dict[int, Any] | None:
    finals = _ok(ops, "final_queue")
    if not finals:
        return None
    values = finals[-1].result.get("values", {})
    return {int(seq): v for seq, v in values.items()}


# -- queue ---------------------------------------------------------------------------------


def check_queue(ops: Sequence[Op]) -> list[Anomaly]:
    """Loss, ack mismatches, duplicates, order, never-published values and redeliveries."""
    final = _final_queue(ops)
    if final is None:
        return [Anomaly("final-read-failed", "the final read of the queue stream did not succeed")]
    published = {o.value for o in ops if o.f == "publish"}
    acked = sorted(_ok(ops, "publish"), key=lambda o: o.complete or 0.0)
    out = _lost(acked, set(final.values()))
    for o in acked:
        seq = int(o.result["seq"])
        if seq in final and final[seq] != o.value:
            out.append(Anomaly("ack-mismatch", f"seq {seq} holds {final[seq]!r}", (o.describe(),)))
    by_value: dict[Any, list[int]] = defaultdict(list)
    for seq, value in sorted(final.items()):
        by_value[value].append(seq)
    for value, seqs in by_value.items():
        if len(seqs) > 1:
            out.append(Anomaly("duplicate", f"value {value!r} stored at seqs {seqs}"))
    delivered = [o for o in ops if o.f == "deliver" and o.type == "ok"]
    pushed = [o for o in ops if o.f == "push_deliver" and o.type == "ok"]
    read = {*final.values(), *(d.value for d in delivered), *(d.value for d in pushed)}
    for value in sorted(read - published, key=str):
        out.append(Anomaly("never-published", f"value {value!r} was read but never published"))
    out.extend(_order(acked))
    out.extend(_redelivered(ops, delivered))
    out.extend(_undelivered(final, delivered, "the pull consumer"))
    if any(o.f == "push_attach" for o in ops):  # the run had a push consumer
        out.extend(_undelivered(final, pushed, "the push consumer"))
    return out


def _lost(acked: Sequence[Op], stored: set[Any]) -> list[Anomaly]:
    survived = [i for i, o in enumerate(acked) if o.value in stored]
    first = survived[0] if survived else len(acked)
    last = survived[-1] if survived else -1
    out = []
    for i, o in enumerate(acked):
        if o.value in stored:
            continue
        where = "prefix" if i < first else "postfix" if i > last else "middle"
        out.append(
            Anomaly(f"lost-{where}", f"acknowledged value {o.value!r} is gone", (o.describe(),))
        )
    return out


def _order(acked: Sequence[Op]) -> list[Anomaly]:
    """A acked before B was invoked must have the lower sequence (real-time order)."""
    by_complete = sorted(acked, key=lambda o: o.complete or 0.0)
    completes = [o.complete or 0.0 for o in by_complete]
    # prefix_max[i]: the op with the highest seq among the first i completed.
    prefix_max: list[Op | None] = [None]
    for o in by_complete:
        best = prefix_max[-1]
        prefix_max.append(o if best is None or o.result["seq"] > best.result["seq"] else best)
    out = []
    for b in acked:
        a = prefix_max[bisect.bisect_left(completes, b.invoke)]
        if a is not None and a.result["seq"] > b.result["seq"]:
            out.append(
                Anomaly(
                    "order",
                    f"seq {a.result['seq']} acked before seq {b.result['seq']} was invoked",
                    (a.describe(), b.describe()),
                )
            )
    return out


def _redelivered(ops: Sequence[Op], delivered: Sequence[Op]) -> list[Anomaly]:
    first_ack: dict[Any, Op] = {}
    for o in _ok(ops, "ack"):
        prev = first_ack.get(o.value)
        if prev is None or (o.complete or 0.0) < (prev.complete or 0.0):
            first_ack[o.value] = o
    out = []
    for d in delivered:
        ack = first_ack.get(d.value)
        if ack is not None and ack.complete is not None and d.invoke > ack.complete:
            out.append(
                Anomaly(
                    "acked-redelivered",
                    f"value {d.value!r} delivered again after its ack succeeded",
                    (ack.describe(), d.describe()),
                )
            )
    return out


def _undelivered(final: Mapping[int, Any], delivered: Sequence[Op], who: str) -> list[Anomaly]:
    seen = {d.value for d in delivered}
    return [
        Anomaly("undelivered", f"seq {seq} ({value!r}) was never delivered to {who}")
        for seq, value in sorted(final.items())
        if value not in seen
    ]


# -- partitions ----------------------------------------------------------------------------


def _acknowledged(o: Op) -> bool:
    """An ok op that claims a replicated effect (a publish, an ack, a put, a swap)."""
    if o.type != "ok":
        return False
    return o.f in ("publish", "ack", "push_ack", "put") or (o.f == "cas" and o.result is True)


def check_minority_acks(ops: Sequence[Op], nemesis: Sequence[Mapping[str, Any]]) -> list[Anomaly]:
    """No acknowledgement through a minority node wholly inside its partition window."""
    windows = []
    opened: dict[str, tuple[float, list[str]]] = {}
    for r in nemesis:
        if r["f"] == "start" and r.get("minority"):
            opened[r["value"]] = (float(r["time"]), list(r["minority"]))
        elif r["f"] == "stop" and r["value"] in opened:
            start, minority = opened.pop(r["value"])
            # The partition lasted until healing began (links come back during the heal);
            # a history written before ``heal_began`` existed ends it at the stop.
            end = float(r.get("heal_began", r["time"]))
            windows.append((start, end, minority, r["value"]))
    out = []
    for o in ops:
        if not _acknowledged(o) or o.complete is None:
            continue
        for start, stop, minority, desc in windows:
            if o.node in minority and start < o.invoke and o.complete < stop:
                out.append(
                    Anomaly(
                        "minority-ack", f"acknowledged on {o.node} during {desc}", (o.describe(),)
                    )
                )
    return out


# -- key-value -----------------------------------------------------------------------------


def _reg_op(o: Op) -> RegOp | None:
    """The register op of a kv history op (None: an unknown get, which says nothing)."""
    ret = o.complete if o.type == "ok" else None
    if o.type == "fail":
        return None  # certainly had no effect
    if o.f == "put":
        return RegOp("put", a=int(o.value[1]), invoke=o.invoke, ret=ret, ref=o.id)
    if o.f == "get":
        if o.type != "ok" or not isinstance(o.result, int):
            return None
        return RegOp("get", result=o.result, invoke=o.invoke, ret=ret, ref=o.id)
    result = o.result if o.type == "ok" else None
    return RegOp(
        "cas",
        a=int(o.value[1]),
        b=int(o.value[2]),
        result=result,
        invoke=o.invoke,
        ret=ret,
        ref=o.id,
    )


def check_kv(ops: Sequence[Op]) -> tuple[list[Anomaly], dict[str, int]]:
    """A linearizability check per key; also returns the states each search explored."""
    per_key: dict[str, list[RegOp]] = defaultdict(list)
    for o in ops:
        if o.f in ("put", "get", "cas"):
            reg = _reg_op(o)
            if reg is not None:
                per_key[str(o.value[0])].append(reg)
    out: list[Anomaly] = []
    explored: dict[str, int] = {}
    by_id = {o.id: o for o in ops}
    for key, reg_ops in sorted(per_key.items()):
        verdict = check_register(reg_ops, initial=0)
        explored[key] = verdict.explored
        if verdict.ok is None:
            out.append(Anomaly("kv-unchecked", f"key {key}: search budget exhausted"))
        elif not verdict.ok:
            shown = tuple(by_id[op.ref].describe() for op in _culprits(list(verdict.ops)))
            out.append(
                Anomaly(
                    "nonlinearizable", f"key {key}: {len(verdict.ops)} ops, no linearization", shown
                )
            )
    return out, explored


def _culprits(ops: list[RegOp]) -> list[RegOp]:
    """The last ops of the shortest non-linearizable prefix (by invocation): the one that
    cannot be placed and those just before it. Bisection, so about log2(n) searches."""
    ops = sorted(ops, key=lambda o: o.invoke)
    lo, hi = 1, len(ops)
    while lo < hi:
        mid = (lo + hi) // 2
        if check_register(ops[:mid]).ok is False:
            hi = mid
        else:
            lo = mid + 1
    return ops[max(0, lo - CULPRITS_SHOWN) : lo]


# -- definitions ---------------------------------------------------------------------------


def check_definitions(ops: Sequence[Op]) -> list[Anomaly]:
    """Streams and consumers created (ok) and never deleted must be listed at the end; ones
    deleted (ok) and not created again must not be."""
    finals = _ok(ops, "final_defs")
    if not finals:
        return [Anomaly("final-read-failed", "the final listing of definitions did not succeed")]
    listed: Mapping[str, list[str]] = finals[-1].result
    deletes = {o.value for o in ops if o.f == "delete_stream" and o.type != "fail"}
    deleted_ok = {o.value for o in _ok(ops, "delete_stream")}
    out = []
    for o in _ok(ops, "create_stream"):
        if o.value not in deletes and o.value not in listed:
            out.append(Anomaly("definition-lost", f"stream {o.value} is gone", (o.describe(),)))
    for o in _ok(ops, "create_consumer"):
        stream, name = o.value
        if stream not in deletes and name not in listed.get(stream, []):
            out.append(
                Anomaly("definition-lost", f"consumer {stream}/{name} is gone", (o.describe(),))
            )
    for name in sorted(deleted_ok & set(listed)):
        out.append(Anomaly("definition-resurrected", f"deleted stream {name} is listed"))
    return out


# -- replicas ------------------------------------------------------------------------------


def check_divergence(nodes: Mapping[str, NodeContents], published: set[Any]) -> list[Anomaly]:
    """Compare every stream's messages across nodes (``nodes``: node -> contents)."""
    out: list[Anomaly] = []
    streams = sorted({s for contents in nodes.values() for s in contents})
    for stream in streams:
        per_node = {n: c.get(stream, {}) for n, c in nodes.items() if stream in c}
        out.extend(_compare_stream(stream, per_node))
        if stream == "Q":
            for node, msgs in sorted(per_node.items()):
                bad = sorted({v for _, v in msgs.values()} - published, key=str)
                for value in bad[:EXAMPLES_MAX]:
                    out.append(Anomaly("never-published", f"{node} stores {value!r} in {stream}"))
    return out


def _compare_stream(
    stream: str, per_node: Mapping[str, Mapping[int, tuple[str, Any]]]
) -> list[Anomaly]:
    out = []
    all_seqs = sorted({s for msgs in per_node.values() for s in msgs})
    for seq in all_seqs:
        hashes = {n: msgs[seq][0] for n, msgs in per_node.items() if seq in msgs}
        if len(set(hashes.values())) > 1:
            out.append(Anomaly("divergence", f"{stream} seq {seq} differs: {hashes}"))
    for node, msgs in sorted(per_node.items()):
        top = max(msgs, default=0)
        missing = [s for s in all_seqs if s not in msgs]
        holes = [s for s in missing if s < top]
        if holes:
            out.append(
                Anomaly("divergence", f"{node} lacks {stream} seqs {holes[:10]} below {top}")
            )
        elif missing:
            out.append(Anomaly("replica-lag", f"{node} lacks the last {len(missing)} of {stream}"))
    return out


# -- everything ----------------------------------------------------------------------------


def check(
    ops: Sequence[Op],
    nemesis: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, NodeContents] | None = None,
) -> CheckResult:
    """Every check above on one run."""
    result = CheckResult()
    result.anomalies.extend(check_queue(ops))
    result.anomalies.extend(check_minority_acks(ops, nemesis))
    kv, explored = check_kv(ops)
    result.anomalies.extend(kv)
    if any(o.f.startswith("create_") for o in ops) or _ok(ops, "final_defs"):
        result.anomalies.extend(check_definitions(ops))
    if nodes:
        published = {o.value for o in ops if o.f == "publish"}
        result.anomalies.extend(check_divergence(nodes, published))
    result.stats = _stats(ops, explored)
    return result


def _stats(ops: Sequence[Op], explored: Mapping[str, int]) -> dict[str, Any]:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for o in ops:
        counts[o.f][o.type] += 1
    return {
        "ops": len(ops),
        "by_f": {f: dict(v) for f, v in sorted(counts.items())},
        "kv_states_explored": dict(explored),
    }
