"""Meta group entries for tests: builders with sensible defaults (one account, peers
n1..n3, increasing leader timestamps), a ``MetaState`` built from entries with its
invariants checked after each, and ``refused``: an entry the state must refuse unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from raftstream.cluster.common.names import DEFAULT_ACCOUNT
from raftstream.cluster.meta.entries import (
    AddConsumer,
    AddStream,
    DeleteConsumer,
    DeleteStream,
    MetaEntry,
    UpdateConsumer,
    UpdateStream,
)
from raftstream.cluster.meta.state import MetaState
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import RaftStreamError

__all__ = [
    "ACC",
    "PEERS3",
    "add_consumer",
    "add_stream",
    "delete_consumer",
    "delete_stream",
    "field_of",
    "refused",
    "state_with",
    "update_consumer",
    "update_stream",
]

ACC = DEFAULT_ACCOUNT
PEERS3 = ("n1", "n2", "n3")


def add_stream(
    name: str,
    *subjects: str,
    account: str = ACC,
    peers: tuple[str, ...] = ("n1",),
    ts_ns: int = 1,
    **config: Any,
) -> AddStream:
    config.setdefault("num_replicas", len(peers))
    cfg = StreamConfig(name=name, subjects=subjects, **config)
    return AddStream(account=account, config=cfg, peers=peers, ts_ns=ts_ns)


def update_stream(
    name: str,
    *subjects: str,
    prior: tuple[str, ...],
    peers: tuple[str, ...] | None = None,
    account: str = ACC,
    ts_ns: int = 2,
    **config: Any,
) -> UpdateStream:
    new_peers = prior if peers is None else peers
    config.setdefault("num_replicas", len(new_peers))
    cfg = StreamConfig(name=name, subjects=subjects, **config)
    return UpdateStream(
        account=account, config=cfg, peers=new_peers, prior_peers=prior, ts_ns=ts_ns
    )


def delete_stream(name: str, *, account: str = ACC, ts_ns: int = 3) -> DeleteStream:
    return DeleteStream(account=account, name=name, ts_ns=ts_ns)


def add_consumer(
    stream: str, name: str, *, account: str = ACC, ts_ns: int = 4, **config: Any
) -> AddConsumer:
    cfg = ConsumerConfig(durable_name=name, **config)
    return AddConsumer(account=account, stream=stream, config=cfg, ts_ns=ts_ns)


def update_consumer(
    stream: str, name: str, *, account: str = ACC, ts_ns: int = 5, **config: Any
) -> UpdateConsumer:
    cfg = ConsumerConfig(durable_name=name, **config)
    return UpdateConsumer(account=account, stream=stream, config=cfg, ts_ns=ts_ns)


def delete_consumer(
    stream: str, name: str, *, account: str = ACC, ts_ns: int = 6
) -> DeleteConsumer:
    return DeleteConsumer(account=account, stream=stream, name=name, ts_ns=ts_ns)


def state_with(*entries: MetaEntry) -> MetaState:
    state = MetaState()
    for e in entries:
        state.apply(e)
        state.check_invariants()
    return state


def refused(state: MetaState, entry: MetaEntry, kind: type[RaftStreamError]) -> RaftStreamError:
    """Apply an entry that must be refused; check nothing changed; return the error."""
    before = state.snapshot()
    with pytest.raises(kind) as info:
        state.apply(entry)
    assert state.snapshot() == before, "a refused entry changed the state"
    state.check_invariants()
    return info.value


def field_of(err: RaftStreamError) -> Any:
    return getattr(err, "field", err.details.get("field"))
