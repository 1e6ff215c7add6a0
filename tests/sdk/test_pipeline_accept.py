"""A bidirectional call refused as a whole is a refusal, not a broken call.

``raftstream/_pipeline.py`` writes nothing before the server accepts its call (the initial
metadata every streaming servicer sends first). A node's interceptor refuses a call before
its servicer runs (NOT_LEADER from a node under repair, ``streaming_calls_max``, auth); a
write racing that refusal used to fail with gRPC core's INTERNAL, which replaced the node's
status, so a publish sent to a node under repair failed as "connection broke" (outcome
unknown) instead of following the hint (a CI run of tests/cluster/test_node_replace.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from raftstream import errors
from raftstream._conn import Stubs
from raftstream._pipeline import Entry, Pipeline
from raftstream.proto import raftstream_pb2 as pb

from .fakes import Nodes

CALLS = 300  # the race lost 1 call in 17 in a probe (grpcio 1.85; raftstream/_pipeline.py)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _pipeline(stubs: Stubs, failed: list[tuple[Entry, errors.RaftStreamError]]) -> Pipeline:
    def on_result(entry: Entry, result: Any) -> None:
        raise AssertionError(f"a refused call answered {result}")

    return Pipeline(
        stubs.publish.PublishStream(),
        batch_of=lambda items: pb.PublishBatch(requests=items),
        results_of=lambda batch: [(r.id, r) for r in batch.results],
        on_result=on_result,
        on_failed=lambda entry, exc: failed.append((entry, exc)),
        on_orphan=lambda result: None,
        queue_msgs_max=4,
        batch_msgs_max=4,
        batch_bytes_max=1 << 20,
        result_timeout_s=10.0,
        name="test",
        addr=stubs.addr,
    )


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
                    pipe = _pipeline(stubs, failed)
                    # Entries come at any time after the call opens; the race was lost by
                    # writes made while the refusal was on its way (0.2-6 ms in a probe).
                    await asyncio.sleep((i % 30) * 0.0002)
                    fut = asyncio.get_running_loop().create_future()
                    entry = Entry(
                        request=pb.PublishRequest(subject="a"),
                        size_bytes=1,
                        expects_result=True,
                        future=fut,
                    )
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

            async def echo(requests: Any, ctx: Any) -> Any:
                async for batch in requests:
                    out = pb.PublishResultBatch()
                    for req in batch.requests:
                        out.results.add(id=req.id, ack=pb.PubAck(stream="S", seq=req.id))
                    yield out

            node.on("PublishStream", echo)
            stubs = Stubs(node.addr, grpc.aio.insecure_channel(node.addr))
            got: list[int] = []
            try:
                pipe = Pipeline(
                    stubs.publish.PublishStream(),
                    batch_of=lambda items: pb.PublishBatch(requests=items),
                    results_of=lambda batch: [(r.id, r) for r in batch.results],
                    on_result=lambda entry, result: got.append(result.ack.seq),
                    on_failed=lambda entry, exc: got.append(-1),
                    on_orphan=lambda result: None,
                    queue_msgs_max=8,
                    batch_msgs_max=8,
                    batch_bytes_max=1 << 20,
                    result_timeout_s=10.0,
                    name="test",
                    addr=stubs.addr,
                )
                loop = asyncio.get_running_loop()
                for _ in range(3):
                    pipe.submit(
                        Entry(
                            request=pb.PublishRequest(subject="a"),
                            size_bytes=1,
                            expects_result=True,
                            future=loop.create_future(),
                        )
                    )
                while len(got) < 3:
                    await asyncio.sleep(0.001)
                await pipe.close()
            finally:
                await stubs.channel.close()
            assert got == [1, 2, 3]

    run(main())
