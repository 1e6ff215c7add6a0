"""One account's part of the meta state: its streams, their consumers, its subject index.

A ``MetaAccount`` is changed only by ``MetaState`` (``cluster/meta/state.py``), after every check
of an entry passed, so it belongs to the one thread or loop that applies the meta log. Its
``SubList`` is rebuilt from the streams, never snapshotted; ``check_invariants`` checks that
it, the consumers and the streams agree (run on every snapshot restore).
"""

from __future__ import annotations

from collections.abc import Iterator

from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.engine.stream_config import StreamConfig
from raftstream.engine.subjects import OverlapIndex
from raftstream.engine.sublist import SubList, Subscription
from raftstream.errors import InvariantError, RaftStreamError, invariant

__all__ = ["MetaAccount"]


class MetaAccount:
    """One account's streams, consumers and subject index. Mutated only by ``MetaState``."""

    def __init__(self) -> None:
        self.streams: dict[str, StreamAssignment] = {}
        self.consumers: dict[str, dict[str, ConsumerAssignment]] = {}
        # No cache: lookups come from the API path at a modest rate, and the cache would
        # be invalidated by every stream change anyway.
        self.sublist = SubList(cache_entries_max=0)

    def put_stream(self, sa: StreamAssignment) -> None:
        """Add or replace a stream (its consumers stay), keeping the subject index in step.
        Called only after every check passed."""
        try:
            old = self.streams.get(sa.name)
            if old is not None:
                for s in old.config.subjects:
                    self.sublist.remove(Subscription(s, sa.name))
            self.streams[sa.name] = sa
            self.consumers.setdefault(sa.name, {})
            for s in sa.config.subjects:
                self.sublist.insert(Subscription(s, sa.name))
        except RaftStreamError as exc:
            # The index disagreed with the streams: a bug, and the state is now half-changed.
            # Never let it pass as a refusal (apply_data returns refusals as results).
            raise InvariantError(f"subject index out of step: {exc}") from exc

    def drop_stream(self, name: str) -> dict[str, ConsumerAssignment]:
        sa = self.streams.pop(name)
        try:
            for s in sa.config.subjects:
                self.sublist.remove(Subscription(s, name))
        except RaftStreamError as exc:
            raise InvariantError(f"subject index out of step: {exc}") from exc
        return self.consumers.pop(name)

    def configs_except(self, name: str) -> Iterator[StreamConfig]:
        return (sa.config for n, sa in self.streams.items() if n != name)

    def check_invariants(self, account: str) -> None:
        """Raise ``InvariantError`` if this account breaks a rule ``MetaState.apply``
        maintains (``account``: its name, for the messages)."""
        invariant(bool(self.streams), f"account {account!r} kept without streams")
        invariant(set(self.consumers) == set(self.streams), "consumer map out of sync")
        indexed = {(s.subject, s.sid) for s in self.sublist.subscriptions()}
        wanted = {(s, n) for n, sa in self.streams.items() for s in sa.config.subjects}
        invariant(indexed == wanted, f"subject index of {account!r} out of sync")
        _check_no_overlap(account, self)
        for name, sa in self.streams.items():
            _check_stream_invariants(account, name, sa, self)


def _check_no_overlap(account: str, acct: MetaAccount) -> None:
    """No subject of one stream of ``acct`` overlaps one of another (each stream's own are
    disjoint by its config's rules). One ``OverlapIndex`` query per subject, not a
    comparison per pair: this runs on every snapshot restore, at every restart."""
    owners = [(s, name) for name, sa in acct.streams.items() for s in sa.config.subjects]
    index = OverlapIndex([s for s, _ in owners])
    start = 0
    for name, sa in acct.streams.items():
        end = start + len(sa.config.subjects)
        own = ((1 << end) - 1) ^ ((1 << start) - 1)  # this stream's bits
        for s in sa.config.subjects:
            hits = index.colliding(s) & ~own
            other = owners[(hits & -hits).bit_length() - 1][1] if hits else None
            invariant(other is None, f"{name!r} overlaps {other!r} in account {account!r}")
        start = end


def _check_stream_invariants(
    account: str, name: str, sa: StreamAssignment, acct: MetaAccount
) -> None:
    invariant(sa.account == account and sa.name == name, f"stream {name!r} filed wrongly")
    invariant(sa.group == stream_group_id(account, name), f"group id of {name!r}")
    invariant(len(set(sa.peers)) == len(sa.peers), f"duplicate peer in {sa.group}")
    invariant(len(sa.peers) <= sa.config.num_replicas, f"too many peers in {sa.group}")
    for cname, ca in acct.consumers[name].items():
        invariant(ca.name == cname and ca.stream == name, f"consumer {cname!r} filed wrongly")
        invariant(
            ca.config.num_replicas in (0, sa.config.num_replicas),
            f"consumer {cname!r} replicas differ from its stream's",
        )
