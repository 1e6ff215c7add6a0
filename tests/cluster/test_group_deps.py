"""``GroupDeps`` (cluster/stream/deps.py): the calls a stream group makes on its node go to
the protocol that answers them, and a node that gives none of the optional ones knows no
address, no origin, no credentials, no storage room and no optional log feature of any
replica (what a stream group then assumes: no storage check, no entry a replica may not
read)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from raftstream.cluster.config import Limits
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.cluster.meta.descriptions import LOG_FEATURE_SNAPSHOT_RECORDS
from raftstream.cluster.stream.deps import GroupDeps


class _Meta:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str, str]] = []

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        return ()

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        return None

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        self.deleted.append((account, stream, name))


class _Links:
    def client_addr(self, node: str) -> str | None:
        return f"{node}:4222"

    def cluster_addrs(self) -> tuple[str, ...]:
        return ("n1:4222", "n2:4222")

    def link_token(self, account: str) -> str | None:
        return f"token-{account}"


class _Rooms:
    def __init__(self) -> None:
        self.admitted: list[int] = []

    def storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        return (peers[0], 100, 10)

    def storage_admitted(self, size: int) -> None:
        self.admitted.append(size)


class _Features:
    def replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        return None  # not known yet


def _deps(**parts: Any) -> GroupDeps:
    return GroupDeps(
        node_id="n1",
        host=None,  # type: ignore[arg-type]
        env=None,
        limits=Limits(),
        metrics=None,  # type: ignore[arg-type]
        proposal_timeout_ms=1000,
        **parts,
    )


def test_each_call_goes_to_its_protocol() -> None:
    meta, rooms = _Meta(), _Rooms()
    deps = _deps(meta=meta, links=_Links(), rooms=rooms, features=_Features())
    assert deps.client_addr("n2") == "n2:4222"
    assert deps.cluster_addrs() == ("n1:4222", "n2:4222")
    assert deps.link_token("A") == "token-A"
    assert deps.storage_room(["n3", "n1"]) == ("n3", 100, 10)
    deps.storage_admitted(7)
    assert rooms.admitted == [7]
    assert deps.replicas_read(["n1"], LOG_FEATURE_SNAPSHOT_RECORDS) is None
    assert deps.consumers_of("A", "S") == () and deps.stream_of("A", "S") is None
    asyncio.run(deps.delete_consumer("A", "S", "C"))
    assert meta.deleted == [("A", "S", "C")]


def test_a_node_that_gives_only_its_meta_view_knows_nothing_else() -> None:
    deps = _deps(meta=_Meta())
    assert deps.client_addr("n2") is None
    assert deps.cluster_addrs() == ()
    assert deps.link_token("A") is None
    assert deps.storage_room(["n1"]) is None
    deps.storage_admitted(7)  # nothing to count it against
    assert deps.replicas_read(["n1"], LOG_FEATURE_SNAPSHOT_RECORDS) is False
