"""What a simulation checks, while it runs and at its end.

While it runs (``RaftChecker.check``, every few simulated milliseconds):
- Election Safety (Raft §5.2): at most one leader per term, across every run of every node;
- Log Matching and Leader Completeness (§5.3, §5.4): an entry a node has applied is the
  entry every node applied at that index (same term, same data), whatever crashed since.

At the end, once every node is up and has applied the same index (``final``):
- State Machine Safety (§5.4.3), for the stream: every replica's store holds the same
  messages (sequence, subject, data, time) and the same consumer states;
- no acknowledged publish lost: every PubAck's payload is at its sequence;
- an acked message never delivered again: a sequence whose ack a client saw committed is
  settled in every replica's consumer state (the clients check each delivery as it comes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer_state import encode_state
from raftstream.raft.types import Role

from .node import SimNode
from .workload import History

__all__ = ["RaftChecker", "final_checks"]


class RaftChecker:
    """The checks made while a run goes on (module docstring)."""

    def __init__(self, group: str) -> None:
        self._group = group
        self._leaders: dict[int, str] = {}
        self._applied: dict[int, tuple[int, bytes]] = {}  # index -> (term, digest of data)
        self._checked: dict[str, int] = {}  # node -> highest index compared
        self.checks = 0
        self.entries_compared = 0

    def check(self, nodes: Sequence[SimNode]) -> list[str]:
        self.checks += 1
        found: list[str] = []
        for node in nodes:
            st = node.status(self._group)
            if st is None:
                self._checked.pop(node.name, None)  # a restart may restore a snapshot
                continue
            if st.role == Role.LEADER:
                prior = self._leaders.setdefault(st.term, node.name)
                if prior != node.name:
                    found.append(f"two leaders in term {st.term}: {prior} and {node.name}")
            found += self._compare_log(node, st.applied)
        return found

    def _compare_log(self, node: SimNode, applied: int) -> list[str]:
        log = node.storage_log(self._group)
        if log is None:
            return []
        lo = max(self._checked.get(node.name, 0) + 1, log.first_index())
        if lo > applied:
            return []
        found = []
        for e in log.entries(lo, applied + 1):
            seen = (e.term, hashlib.blake2b(e.data, digest_size=8).digest())
            prior = self._applied.setdefault(e.index, seen)
            self.entries_compared += 1
            if prior != seen:
                found.append(
                    f"{node.name} applied index {e.index} of term {e.term}, another node the "
                    f"entry of term {prior[0]} (or other data) there"
                )
        self._checked[node.name] = applied
        return found


def _store_image(g: StreamGroup) -> list[tuple[int, str, bytes, int]]:
    return [(m.seq, m.subject, m.data, m.ts) for m in g.replica.store.iter_from(1)]


def final_checks(nodes: Sequence[SimNode], group: str, history: History) -> list[str]:
    """The end-of-run checks (module docstring); every node must be up and caught up."""
    found: list[str] = []
    groups = {n.name: n.group(group) for n in nodes}
    live = {name: g for name, g in groups.items() if g is not None}
    if len(live) != len(nodes):
        return [f"nodes down at the end: {sorted(set(groups) - set(live))}"]
    images = {name: _store_image(g) for name, g in live.items()}
    first, image = next(iter(images.items()))
    for name, other in images.items():
        if other != image:
            found.append(f"stores differ: {first} has {len(image)} messages, {name} {len(other)}")
    stored = {seq: data for seq, _, data, _ in image}
    for payload, seq in sorted(history.acked.items(), key=lambda kv: kv[1]):
        if stored.get(seq) != payload:
            found.append(f"acknowledged publish lost: {payload!r} at seq {seq}")
            if len(found) > 20:
                break
    for cname, acked in history.synced_acks.items():
        states = {
            name: encode_state(g.replica.consumers[cname].state)
            for name, g in live.items()
            if cname in g.replica.consumers
        }
        if len(states) != len(live):
            found.append(f"consumer {cname} missing on {sorted(set(live) - set(states))}")
            continue
        if len(set(states.values())) != 1:
            found.append(f"consumer {cname}'s state differs between replicas")
        state = live[first].replica.consumers[cname].state
        for seq in sorted(acked):
            if seq in state.pending or seq > state.delivered_stream_seq:
                found.append(f"consumer {cname}: acked seq {seq} is not settled")
                break
    return found
