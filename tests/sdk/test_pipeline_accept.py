"""A bidirectional call refused as a whole is a refusal, not a broken call.

``raftstream/_pipeline.py`` writes nothing before the server accepts its call (the initial
metadata every streaming servicer sends first: ``raftstream/proto/calls.py``). A node's
interceptor refuses a call before its servicer runs (NOT_LEADER from a node under repair,
``streaming_calls_max``, auth); a write racing that refusal used to fail with gRPC core's
INTERNAL, which replaced the node's status, so a publish sent to a node under repair failed
as "connection broke" (outcome unknown) instead of following the hint (a CI run of
tests/cluster/test_node_replace.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc

from raftstream import errors
from raftstream._conn import Stubs
from raftstream._pipeline import Entry, Pipeline
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import Nodes, ack_each, lane_handler

CALLS = 300  # the race lost 1 call in 17 in a probe (grpcio 1.85; raftstream/proto/calls.py)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _pipeline(
    stubs: Stubs,
    on_result: Callable[[Entry, Any], None],
    on_failed: Callable[[Entry, errors.RaftStreamError], None],
) -> Pipeline:
    return Pipeline(
        stubs.publish.PublishStream(),
        batch_of=lambda items: pb.PublishBatch(requests=items),
        results_of=lambda batch: [(r.id, r) for r in batch.results],
        on_result=on_result,
        on_failed=on_failed,
        on_orphan=lambda result: None,
        queue_msgs_max=8,
        batch_msgs_max=8,
        batch_bytes_max=1 << 20,
        result_timeout_s=10.0,
        name="test",
        addr=stubs.addr,
    )


def _entry() -> Entry:
    return Entry(
        request=pb.PublishRequest(subject="a"),
        size_bytes=1,
        expects_result=True,
        future=asyncio.get_running_loop().create_future(),
    )


def _collect(
    into: list[tuple[Entry, errors.RaftStreamError]], entry: Entry, exc: errors.RaftStreamError
) -> None:
    into.append((entry, exc))


def _never_answered(entry: Entry, result: Any) -> None:
    raise AssertionError(f"a refused call answered {result}")


def test_a_call_refused_before_it_is_accepted_fails_its_entries_unwritten_with_the_refusal():
    async def main() -> None:
        async with Nodes(1) as (node,):

            def refuse(requests: Any, ctx: Any) -> Any:  # raises when called: unaccepted
                raise errors.NotLeaderError(
                    "this node is rejoining the cluster: try n2", leader="n2", leader_addr="b:1"
                )

            node.on("PublishStream", refuse)
            stubs = Stubs(node.addr, grpc.aio.insecure_channel(node.addr))
            try:
                for i in range(CALLS):
                    failed: list[tuple[Entry, errors.RaftStreamError]] = []
                    pipe = _pipeline(stubs, _never_answered, partial(_collect, failed))
                    # Entries come at any time after the call opens; the race was lost by
                    # writes made while the refusal was on its way (0.2-6 ms in a probe).
                    await asyncio.sleep((i % 30) * 0.0002)
                    entry = _entry()
                    try:
                        pipe.submit(entry)
                    except errors.RaftStreamError as refused:  # dead already: not taken
                        failed.append((entry, refused))
                    while not pipe.dead:
                        await asyncio.sleep(0.001)
                    await pipe.close()
                    [(entry, exc)] = failed
                    assert isinstance(exc, errors.NotLeaderError), repr(exc)
                    assert exc.details.get("leader_addr") == "b:1"
                    assert not entry.written  # nothing can have reached the node
            finally:
                await stubs.channel.close()

    run(main())


def test_an_accepted_call_still_answers_what_it_is_sent():
    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("PublishStream", lane_handler(ack_each))
            stubs = Stubs(node.addr, grpc.aio.insecure_channel(node.addr))
            got: list[int] = []
            try:
                pipe = _pipeline(
                    stubs,
                    lambda entry, result: got.append(result.ack.seq),
                    lambda entry, exc: got.append(-1),
                )
                for _ in range(3):
                    pipe.submit(_entry())
                while len(got) < 3:
                    await asyncio.sleep(0.001)
                await pipe.close()
            finally:
                await stubs.channel.close()
            assert got == [1, 2, 3]

    run(main())
