"""Fire-and-forget acks whose ``AckStream`` was refused as a whole (raftstream/msg.py).

Nothing of such an ack reached a node (the SDK writes nothing before the node accepts the
call), so it is sent again, within the client's timeout: to the peer a NOT_LEADER refusal
names (a node under repair refuses so), or as a unary ``Ack`` when the node refused the call
for its ``streaming_calls_max``. A refusal for the client's credentials is reported to
``error_cb`` once, not sent again. The same for ``publish_async``: a refused call is opened
again at the peer named.
"""

from __future__ import annotations

import asyncio
from typing import Any

import raftstream
from raftstream import errors
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import AckRecorder, FakeNode, Nodes, ack_token, lane_handler
from tests.support.polling import until

RESEND_SETTLE_S = 0.3  # long enough for several resends (10 ms doubling to 100 ms)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def serve_two(node: FakeNode) -> None:
    async def fetch(req: Any, ctx: Any) -> Any:
        yield pb.FetchResponse(
            messages=[
                pb.Msg(subject=f"orders.{i}", seq=i, data=b"d", reply=ack_token(i)) for i in (1, 2)
            ]
        )

    node.on("Fetch", fetch)


def under_repair(peer: FakeNode) -> errors.NotLeaderError:
    """The refusal of a node under repair: NOT_LEADER naming a peer to try."""
    return errors.NotLeaderError(
        "this node is rejoining the cluster: try n2", leader="n2", leader_addr=peer.addr
    )


def refusing(exc: errors.RaftStreamError) -> Any:
    def refuse(requests: Any, ctx: Any) -> Any:  # raises when called: the call is unaccepted
        raise exc

    return refuse


async def fetched_two(rs: Any) -> list[Any]:
    sub = rs._pull_subscription("ORDERS", "C")
    return list(await sub.fetch(2, timeout=2.0))


def test_an_ack_refused_with_its_call_goes_to_the_peer_the_refusal_names():
    async def main() -> None:
        async with Nodes(2) as (repairing, peer):
            serve_two(repairing)
            repairing.on("AckStream", refusing(under_repair(peer)))
            recorder = AckRecorder()
            peer.on("AckStream", recorder.handler)
            reported: list[errors.RaftStreamError] = []
            rs = await raftstream.connect([repairing.addr], timeout=5, error_cb=reported.append)
            async with rs:
                m1, m2 = await fetched_two(rs)
                await m1.ack()
                await m2.ack()
                await until(lambda: len(recorder.items) == 2, what="both acks at the peer")
            assert [a.reply for a in recorder.items] == [m1.reply, m2.reply]
            assert reported == []

    run(main())


def test_an_ack_refused_for_streaming_calls_max_goes_as_a_unary_ack():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_two(node)
            node.on(
                "AckStream",
                refusing(
                    errors.LimitError("too many streaming calls", limit="streaming_calls_max")
                ),
            )

            async def ack(req: Any, ctx: Any) -> pb.AckResponse:
                return pb.AckResponse()

            node.on("Ack", ack)
            reported: list[errors.RaftStreamError] = []
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=reported.append)
            async with rs:
                (m1, _) = await fetched_two(rs)
                await m1.ack()
                await until(lambda: bool(node.calls_to("Ack")), what="a unary ack")
            [call] = node.calls_to("Ack")
            # A fetched message's ack goes as a run (proto AckRun): the unary Ack carries it.
            assert not call.request.HasField("ack")
            assert call.request.run == pb.AckRun(stream="ORDERS", consumer="C", stream_seqs=[1])
            assert reported == []

    run(main())


def test_an_ack_refused_for_its_credentials_is_reported_once_and_not_sent_again():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_two(node)
            node.on("AckStream", refusing(errors.UnauthenticatedError("bad token")))
            reported: list[errors.RaftStreamError] = []
            rs = await raftstream.connect([node.addr], timeout=5, error_cb=reported.append)
            async with rs:
                m1, _ = await fetched_two(rs)
                await m1.ack()
                await until(lambda: bool(reported), what="the refusal reported")
                await asyncio.sleep(RESEND_SETTLE_S)
                assert len(node.calls_to("AckStream")) == 1
            assert [type(e) for e in reported] == [errors.UnauthenticatedError]

    run(main())


def test_publish_async_refused_with_its_call_is_sent_to_the_peer_the_refusal_names():
    async def main() -> None:
        async with Nodes(2) as (repairing, peer):
            repairing.on("PublishStream", refusing(under_repair(peer)))
            peer.on("PublishStream", lane_handler(lambda req: pb.PubAck(stream="S", seq=7)))
            async with await raftstream.connect([repairing.addr], timeout=5) as rs:
                ack = await asyncio.wait_for(await rs.publish_async("orders.1", b"x"), 5)
            assert (ack.stream, ack.seq) == ("S", 7)

    run(main())
