"""A stream group that cannot start on a node does not keep the node's other groups from
starting (a bad-input review: a stream whose store could not be written stopped the node's
reconciler for good, silently, and every group after it in the meta state stayed down; a
restart of the node took all of them offline).

``NodeGroups.reconcile`` with the meta state and the group start replaced: the first group's
start fails; the second still starts, the failure is logged once (with its traceback) however
often it is tried again, and another try is scheduled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from raftstream.cluster.config import Address, NodeConfig
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.node.groups import NodeGroups
from raftstream.engine.stream_config import StreamConfig
from tests.support.polling import NeverHappened, until


def _sa(name: str) -> StreamAssignment:
    return StreamAssignment(
        account="$G",
        config=StreamConfig(name=name, subjects=(f"{name.lower()}.>",)),
        peers=("n1",),
        group=f"S:$G:{name}",
        created_ns=1,
    )


def test_a_group_that_cannot_start_leaves_the_others_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad, good = _sa("A1"), _sa("Z1")
    pokes: list[int] = []
    meta = SimpleNamespace(
        state=SimpleNamespace(all_streams=lambda: (bad, good)), poke=lambda: pokes.append(1)
    )
    groups: dict[str, Any] = {}
    node = NodeGroups(
        config=NodeConfig(
            name="n1",
            listen=Address("127.0.0.1", 7100),
            data=tmp_path,
            peers={"n1": Address("127.0.0.1", 7100)},
        ),
        host=None,  # type: ignore[arg-type]
        meta=meta,  # type: ignore[arg-type]
        metrics=None,  # type: ignore[arg-type]
        groups=groups,
        ctx=None,  # type: ignore[arg-type]
        membership=None,  # type: ignore[arg-type]
        repair=SimpleNamespace(repair_id=None),  # type: ignore[arg-type]
        storage=SimpleNamespace(env=None),  # type: ignore[arg-type]
        peers=None,  # type: ignore[arg-type]
        tls=None,
    )
    started: list[str] = []

    async def start_group(sa: StreamAssignment) -> None:
        if sa is bad:
            raise OverflowError("int too large to convert")  # what the review's store raised
        started.append(sa.group)
        node.groups[sa.group] = SimpleNamespace(reconcile=lambda: None)  # type: ignore[assignment]

    node.start_group = start_group  # type: ignore[method-assign]

    async def body() -> None:
        with caplog.at_level(logging.ERROR, logger="raftstream.cluster.node.groups"):
            await node.reconcile((bad, good))
            await node.reconcile((bad, good))  # tried again: not said again
        await asyncio.sleep(0.05)

    asyncio.run(body())
    assert started == [good.group]
    said = [r for r in caplog.records if "cannot start here" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None
    assert "OverflowError" in said[0].getMessage()
    assert bad.group not in node.groups


def test_the_meta_reconciler_survives_an_unexpected_error(caplog: pytest.LogCaptureFixture) -> None:
    """An error the reconciler did not expect is logged with its traceback, and the
    reconciler goes on (it used to end, silently, and no group started on the node again)."""
    from raftstream.cluster.meta import group as meta_group

    calls: list[int] = []

    async def reconcile(_streams: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise struct_error()

    def struct_error() -> Exception:
        import struct

        return struct.error("int too large to convert")

    class _Host:
        def status(self, _group: str) -> Any:
            return SimpleNamespace(applied=10)

        def leader(self, _group: str) -> str | None:
            return None  # not the meta leader: no repairs

    mg = object.__new__(meta_group.MetaGroup)
    mg._trigger = asyncio.Event()  # type: ignore[attr-defined]
    mg._host = _Host()  # type: ignore[attr-defined]
    mg._replayed_to = 0  # type: ignore[attr-defined]
    mg._reconcile = reconcile  # type: ignore[attr-defined]
    mg.node_id = "n1"  # type: ignore[misc]
    mg.state = SimpleNamespace(streams_for_node=lambda _n: ())  # type: ignore[misc]

    async def body() -> None:
        task = asyncio.get_running_loop().create_task(mg._run())
        mg._trigger.set()  # type: ignore[attr-defined]
        with contextlib.suppress(NeverHappened):  # asserted below
            await until(lambda: len(calls) >= 2, timeout_s=10, interval_s=0.05)
        assert not task.done()
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="raftstream.cluster.meta.group"):
        asyncio.run(body())
    assert len(calls) >= 2
    assert any(r.exc_info for r in caplog.records if "reconcile failed" in r.getMessage())
