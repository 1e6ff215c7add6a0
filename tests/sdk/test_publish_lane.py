"""publish over the sync lane (``raftstream/_synclane.py``) against fake servers.

issue 5 "The SDK core": ``publish`` returns the PubAck, raises typed errors, follows leader
hints and retries an ambiguous failure only with a ``msg_id``. The lane sends it as one item
on a ``PublishStream`` call of its own; these tests pin that the same rules hold there, that a
concurrent publish and a server without ``PublishStream`` take the unary RPC, and that a
broken call is ambiguous.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import raftstream
from raftstream import errors
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import Nodes, lane_handler


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_publish_travels_on_the_stream_and_returns_its_ack():
    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []
            node.on("PublishStream", lane_handler(lambda r: pb.PubAck(stream="S", seq=7), seen))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                first = await rs.publish("a.1", b"x", headers={"h": "1"}, expected_last_seq=0)
                second = await rs.publish("a.2", b"y")
            assert (first.stream, first.seq, second.seq) == ("S", 7, 7)
            assert not node.calls_to("Publish")
            assert len(node.calls_to("PublishStream")) == 1  # one call carries them all
            assert [(r.subject, r.data) for r in seen] == [("a.1", b"x"), ("a.2", b"y")]
            assert dict(seen[0].headers) == {"h": "1"} and seen[0].HasField("expected_last_seq")

    run(main())


def test_a_refusal_on_the_stream_is_typed_and_not_retried():
    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []

            def refuse(req: pb.PublishRequest) -> Any:
                return errors.ExpectedLastSeqError("wrong last sequence: 3", last_seq=3)

            node.on("PublishStream", lane_handler(refuse, seen))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.ExpectedLastSeqError) as raised:
                    await rs.publish("a", b"", expected_last_seq=1, msg_id="m")
            assert raised.value.details["last_seq"] == "3"
            assert len(seen) == 1

    run(main())


def test_a_not_leader_answer_follows_the_hint():
    async def main() -> None:
        async with Nodes(2) as (follower, leader):
            on_follower: list[pb.PublishRequest] = []
            on_leader: list[pb.PublishRequest] = []

            def refuse(req: pb.PublishRequest) -> Any:
                return errors.NotLeaderError(leader="n2", leader_addr=leader.addr)

            follower.on("PublishStream", lane_handler(refuse, on_follower))
            leader.on(
                "PublishStream", lane_handler(lambda r: pb.PubAck(stream="S", seq=9), on_leader)
            )
            async with await raftstream.connect([follower.addr], timeout=5) as rs:
                ack = await rs.publish("a", b"1")  # no msg_id: a NOT_LEADER is safe to retry
            assert ack.seq == 9
            assert [r.data for r in on_follower] == [b"1"] and [r.data for r in on_leader] == [b"1"]

    run(main())


def test_a_broken_call_is_ambiguous_retried_only_with_a_msg_id():
    """The call ends with UNAVAILABLE after the publish was sent: it may have been stored.
    Without msg_id that is raised; with one the SDK retries (on a new call)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []
            break_next = [True]

            def answer(req: pb.PublishRequest) -> Any:
                if break_next[0]:
                    break_next[0] = False
                    raise errors.UnavailableError("connection reset")
                return pb.PubAck(stream="S", seq=1)

            node.on("PublishStream", lane_handler(answer, seen))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.UnavailableError):
                    await rs.publish("a", b"1")
                break_next[0] = True
                ack = await rs.publish("a", b"2", msg_id="id-2")
            assert ack.seq == 1
            assert [r.data for r in seen] == [b"1", b"2", b"2"]
            assert not node.calls_to("Publish")

    run(main())


def test_an_answer_not_in_time_is_a_deadline_and_the_lane_goes_on():
    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []
            release = asyncio.Event()

            async def slow_first(req: pb.PublishRequest) -> Any:
                if req.data == b"slow":
                    await release.wait()
                return pb.PubAck(stream="S", seq=len(seen))

            node.on("PublishStream", lane_handler(slow_first, seen))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.DeadlineExceededError):
                    await rs.publish("a", b"slow", timeout=0.2)
                release.set()
                ack = await rs.publish("a", b"next")
            assert ack.seq == 2  # the late answer of the first was dropped, not taken for this
            assert not node.calls_to("Publish")

    run(main())


def test_a_publish_after_one_not_answered_in_time_does_not_wait_behind_it():
    """A publish that gave up waiting (its timeout, or its caller cancelled) leaves its
    answer owed on the lane's call, and a call's answers come in order: the next publish
    must not queue behind it (for a stuck stream that is the whole result timeout, then an
    ambiguous failure). The lane gives that call up and the next one opens a new call."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []
            release = asyncio.Event()

            async def stuck_first(req: pb.PublishRequest) -> Any:
                if req.data in (b"stuck", b"cancelled"):
                    await release.wait()
                return pb.PubAck(stream="S", seq=len(seen))

            node.on("PublishStream", lane_handler(stuck_first, seen))
            try:
                async with await raftstream.connect([node.addr], timeout=10) as rs:
                    with pytest.raises(errors.DeadlineExceededError):
                        await rs.publish("a", b"stuck", timeout=0.2)
                    assert (await rs.publish("a", b"next")).seq == 2
                    cancelled = asyncio.ensure_future(rs.publish("a", b"cancelled"))
                    while len(seen) < 3:
                        await asyncio.sleep(0.005)
                    cancelled.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await cancelled
                    assert (await rs.publish("a", b"after")).seq == 4
            finally:
                release.set()
            assert [r.data for r in seen] == [b"stuck", b"next", b"cancelled", b"after"]
            assert len(node.calls_to("PublishStream")) == 3
            assert not node.calls_to("Publish")

    run(main())


def test_a_concurrent_publish_takes_the_unary_rpc():
    """One publish at a time on the lane: a second, while the first waits, must not queue
    behind it (answers come in order), so it goes as a unary call."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            seen: list[pb.PublishRequest] = []
            release = asyncio.Event()

            async def held(req: pb.PublishRequest) -> Any:
                await release.wait()
                return pb.PubAck(stream="S", seq=1)

            async def unary(req: Any, ctx: Any) -> pb.PubAck:
                return pb.PubAck(stream="S", seq=2)

            node.on("PublishStream", lane_handler(held, seen))
            node.on("Publish", unary)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                first = asyncio.ensure_future(rs.publish("a", b"1"))
                while not seen:
                    await asyncio.sleep(0.005)
                second = await rs.publish("a", b"2")
                assert not first.done()
                release.set()
                assert (await first).seq == 1
            assert second.seq == 2
            assert [c.request.data for c in node.calls_to("Publish")] == [b"2"]

    run(main())


def test_a_node_at_its_streaming_calls_max_gets_the_publish_as_a_unary_call():
    """A node with ``streaming_calls_max`` streaming calls open refuses one more before the
    servicer runs (docs/limits.md): nothing was applied, and the unary RPC does not count
    against that limit, so the publish goes as a unary call (it used to be one), and the
    lane is tried again later (a call may close meanwhile)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            refuse = [True]
            seen: list[pb.PublishRequest] = []
            answer = lane_handler(lambda r: pb.PubAck(stream="S", seq=3), seen)

            def lane(requests: Any, ctx: Any) -> Any:
                if refuse[0]:
                    raise errors.LimitError(
                        "this node has streaming_calls_max (1) streaming calls open",
                        limit="streaming_calls_max",
                    )
                return answer(requests, ctx)

            async def unary(req: Any, ctx: Any) -> pb.PubAck:
                return pb.PubAck(stream="S", seq=int(req.data))

            node.on("PublishStream", lane)
            node.on("Publish", unary)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                assert (await rs.publish("a", b"1")).seq == 1
                refuse[0] = False
                assert (await rs.publish("a", b"2")).seq == 3
            assert [c.request.data for c in node.calls_to("Publish")] == [b"1"]
            assert [r.data for r in seen] == [b"2"]

    run(main())


def test_a_server_without_publish_stream_gets_unary_publishes():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def unary(req: Any, ctx: Any) -> pb.PubAck:
                return pb.PubAck(stream="S", seq=int(req.data))

            node.on("Publish", unary)  # PublishStream answers UNIMPLEMENTED
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                acks = [await rs.publish("a", str(i).encode()) for i in range(3)]
            assert [a.seq for a in acks] == [0, 1, 2]
            assert [c.request.data for c in node.calls_to("Publish")] == [b"0", b"1", b"2"]
            assert len(node.calls_to("PublishStream")) == 1  # tried once, then remembered

    run(main())
