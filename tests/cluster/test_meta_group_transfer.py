"""A meta change the Raft core refuses while the meta leadership moves (a step-down, a
planned stop) is in no log: ``MetaGroup.propose`` answers NOT_LEADER naming the node taking
over, which a client follows even for a call it never retries when the outcome is unknown
(``delete_stream``); the core's own retriable UNAVAILABLE was such an unknown outcome."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.raft_errors import LeadershipTransferError
from raftstream.cluster.meta.entries import DeleteStream
from raftstream.cluster.meta.group import MetaGroup
from raftstream.errors import NotLeaderError, UnavailableError


class _Host:
    """The part of ``RaftHost`` that ``propose`` uses: n1 leads, and refuses proposals."""

    def __init__(self, refusal: Exception) -> None:
        self.refusal = refusal

    def leader(self, group: str) -> str:
        return "n1"

    def propose(self, group: str, data: bytes, *, timeout_ms: int | None = None) -> Any:
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(self.refusal)
        return fut


async def _noop(*args: Any) -> None:
    return None


def _meta(refusal: Exception) -> MetaGroup:
    return MetaGroup(
        node_id="n1",
        host=_Host(refusal),  # type: ignore[arg-type]
        metrics=NodeMetrics("n1"),
        proposal_timeout_ms=1000,
        client_addr=lambda node: f"{node}.example:7101",
        reconcile=_noop,
        nodes=lambda: [],
    )


def test_a_change_refused_during_a_transfer_is_not_leader_naming_the_next_leader() -> None:
    async def body() -> None:
        meta = _meta(LeadershipTransferError("n2"))
        with pytest.raises(NotLeaderError) as refused:
            await meta.propose(DeleteStream(account="$G", name="S", ts_ns=1), 5.0)
        details = refused.value.details
        assert (details["leader"], details["leader_addr"]) == ("n2", "n2.example:7101")

    asyncio.run(body())


def test_other_unavailable_refusals_are_unchanged() -> None:
    async def body() -> None:
        meta = _meta(UnavailableError("raft host failed"))
        with pytest.raises(UnavailableError) as refused:
            await meta.propose(DeleteStream(account="$G", name="S", ts_ns=1), 5.0)
        assert not isinstance(refused.value, NotLeaderError)

    asyncio.run(body())
