"""Helpers of the SDK's integration tests (real clusters from ``conftest.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import raftstream
from raftstream import errors
from raftstream.client import Client
from tests.support.cluster import LocalCluster
from tests.support.polling import until

T = TypeVar("T")

# A safety net against hangs (the machine is shared and slow), never a timed assertion.
BODY_LIMIT_S = 90.0
POLL_S = 0.02


def run(body: Awaitable[Any]) -> Any:
    async def limited() -> Any:
        return await asyncio.wait_for(body, BODY_LIMIT_S)

    return asyncio.run(limited())


@asynccontextmanager
async def connected(
    cluster: LocalCluster,
    errs: list[errors.RaftStreamError] | None = None,
    *,
    servers: list[str] | None = None,
) -> AsyncIterator[Client]:
    """A client of ``cluster`` (seeded with ``servers``, default all); its error callback
    appends to ``errs`` when given."""
    rs = await raftstream.connect(
        servers or cluster.servers,
        timeout=20,
        error_cb=errs.append if errs is not None else None,
    )
    try:
        yield rs
    finally:
        await rs.close()


async def consumer_gone(rs: Client, stream: str, name: str) -> None:
    """Wait until neither the meta state (names) nor the stream leader (info) knows the
    consumer: the two apply a delete at different moments."""

    async def probe() -> bool | None:
        if name in await rs.consumer_names(stream):
            return None
        try:
            await rs.consumer_info(stream, name)
        except errors.NotFoundError:
            return True
        return None

    await until(probe, what=f"consumer {name} deleted")


async def stream(rs: Client, name: str, *subjects: str, replicas: int = 3) -> None:
    await rs.add_stream(name=name, subjects=list(subjects), num_replicas=replicas)
