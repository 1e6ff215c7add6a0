"""Shared by the cluster tests: entry builders with sensible defaults, and ``cluster3``
(a real 3-node cluster on loopback, see ``node_harness.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raftstream.cluster.meta_entries import (
    DEFAULT_ACCOUNT,
    AddConsumer,
    AddStream,
    DeleteConsumer,
    DeleteStream,
    UpdateConsumer,
    UpdateStream,
)
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig

from .node_harness import LocalCluster

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


# -- real node processes (integration) ---------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def cluster3(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A started 3-node cluster of real processes on loopback, in a temporary directory.
    Always killed and removed afterwards; its nodes' log tails are printed on failure."""
    c = LocalCluster(3)
    try:
        c.start_all()
        yield c
        rep = getattr(request.node, "rep_call", None)
        dead = c.unexpected_exits()
        if (rep is not None and rep.failed) or dead:
            print(c.tails(60))
        if dead:
            pytest.fail(f"node(s) exited during the test (name: exit code): {dead}")
    except BaseException:
        print(c.tails(60))
        raise
    finally:
        c.close()
