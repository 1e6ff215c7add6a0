"""A PublishStream call's answers (``cluster/services_publish._answers``): in request order,
one result per publish whatever its outcome, and the answer of a publish that commits
leaves on the next turn of the loop."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from raftstream.cluster.services.publish import _answers, _Room
from raftstream.errors import LimitError
from raftstream.proto import raftstream_pb2 as pb

Inflight = collections.deque[tuple[int, asyncio.Future[Any]] | None]


def _ack(seq: int) -> pb.PubAck:
    return pb.PubAck(stream="S", seq=seq)


def _call(n: int) -> tuple[Inflight, list[asyncio.Future[Any]], Any]:
    """``n`` publishes in flight on one call (no end of input yet) and its answers."""
    loop = asyncio.get_running_loop()
    futs: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(n)]
    inflight: Inflight = collections.deque((i + 1, f) for i, f in enumerate(futs))
    room = _Room(n)
    for _ in range(n):
        assert room.take_now()
    return inflight, futs, _answers(inflight, asyncio.Event(), room)


def _results(batch: pb.PublishResultBatch) -> list[tuple[int, str]]:
    return [
        (r.id, r.error.message if r.HasField("error") else f"seq {r.ack.seq}")
        for r in batch.results
    ]


def test_answers_come_in_request_order_one_per_publish_whatever_its_outcome() -> None:
    async def body() -> None:
        inflight, futs, answers = _call(4)
        futs[2].set_result(_ack(3))  # done before the head: waits for it
        futs[1].set_exception(LimitError("maximum messages exceeded"))
        futs[0].cancel()  # a relay whose call was cancelled under it
        first = await asyncio.wait_for(anext(answers), 5)
        assert [rid for rid, _ in _results(first)] == [1, 2, 3]
        got = dict(_results(first))
        assert "cancelled" in got[1]
        assert "maximum messages exceeded" in got[2]
        assert got[3] == "seq 3"
        futs[3].set_result(_ack(4))
        assert _results(await asyncio.wait_for(anext(answers), 5)) == [(4, "seq 4")]
        inflight.append(None)  # end of input: the answers end
        with pytest.raises(StopAsyncIteration):
            await anext(answers)

    asyncio.run(body())


def test_a_committed_publish_is_answered_on_the_next_turn_of_the_loop() -> None:
    """The answer waits on the publish's future itself (``_settled``): one turn after the
    commit, where ``asyncio.wait`` took two, each behind whatever else was ready."""

    async def body() -> None:
        _, futs, answers = _call(1)
        nxt = asyncio.ensure_future(anext(answers))
        for _ in range(3):  # let it reach the wait
            await asyncio.sleep(0)
        assert not nxt.done()
        futs[0].set_result(_ack(7))
        await asyncio.sleep(0)  # the turn that runs the woken answer loop
        assert nxt.done(), "the answer took more than one turn of the loop"
        assert _results(nxt.result()) == [(1, "seq 7")]

    asyncio.run(body())


def test_the_answer_loop_cancelled_while_waiting_is_cancelled_not_swallowed() -> None:
    async def body() -> None:
        _, _, answers = _call(1)

        async def consume() -> None:
            await anext(answers)

        task = asyncio.ensure_future(consume())
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(body())


def test_a_publish_cancelled_while_the_loop_waits_on_it_is_answered_and_the_loop_goes_on() -> None:
    """The head publish's future is cancelled under the waiting answer loop (a relay whose
    call was cancelled): that publish is answered with its error, and the loop goes on."""

    async def body() -> None:
        inflight, futs, answers = _call(2)
        nxt = asyncio.ensure_future(anext(answers))
        for _ in range(3):  # let it reach the wait on the head's future
            await asyncio.sleep(0)
        futs[0].cancel()
        futs[1].set_result(_ack(2))
        got = dict(_results(await asyncio.wait_for(nxt, 5)))
        assert "cancelled" in got[1] and got[2] == "seq 2"
        inflight.append(None)
        with pytest.raises(StopAsyncIteration):
            await anext(answers)

    asyncio.run(body())
