"""Acks as runs (proto ``AckRun``; cluster/services/consume.py): the SDK acks the messages it
fetched as stream sequences of one consumer, not one token each. A run is checked (names,
sequences from 1 to int64), decided as one op on the stream leader, sent on by a node that
does not lead, and its acks of sequences the consumer has not delivered are refused with
FAILED_PRECONDITION (one result, id 0, on an ``AckStream``), changing nothing."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import raftstream
from raftstream import StreamConfig
from raftstream.cluster.security.limits import check_ack_run
from raftstream.errors import InvalidArgumentError
from raftstream.msg import ACK_RUN_SEQS_MAX
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

from .node_harness import LocalCluster, retry_async, run

pytestmark = pytest.mark.integration

MSGS = 6


async def _acked_to(js: raftstream.Client, floor: int, pending: int) -> None:
    """Wait until consumer R's ack floor is ``floor`` with ``pending`` left to deliver
    (fire-and-forget acks apply a moment later)."""

    async def check() -> None:
        ci = await js.consumer_info("RUN", "R")
        assert (ci.ack_floor.stream_seq, ci.num_ack_pending, ci.num_pending) == (
            floor,
            0,
            pending,
        ), ci

    await retry_async(check, timeout_s=30)


def test_runs_ack_fetched_messages_are_checked_and_refuse_what_was_not_delivered(
    cluster3: LocalCluster,
) -> None:
    async def body() -> None:
        js = await raftstream.connect(servers=cluster3.servers, timeout=15)
        try:
            await js.add_stream(StreamConfig(name="RUN", subjects=("run.>",), num_replicas=3))
            for i in range(MSGS):
                await js.publish("run.a", b"%d" % i)
            sub = await js.pull_subscribe("run.>", durable="R", stream="RUN")
            for m in await sub.fetch(4, timeout=5):
                await m.ack()  # sequences of a run
            await _acked_to(js, 4, 2)

            leader = cluster3.stream_leader("RUN")
            assert leader is not None
            stub = pbg.ConsumeServiceStub(cluster3.channel(leader))
            ahead = pb.AckRun(stream="RUN", consumer="R", stream_seqs=[5, 6])
            zero = pb.AckRun(stream="RUN", consumer="R", stream_seqs=[0])
            batch = pb.AckBatch(runs=[ahead, zero])
            results = [r for b in stub.AckStream(iter([batch]), timeout=15) for r in b.results]
            assert {r.id for r in results} == {0}
            by_code = {r.error.code: r.error.message for r in results}
            failed = grpc.StatusCode.FAILED_PRECONDITION.value[0]
            invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
            assert set(by_code) == {failed, invalid}, by_code
            assert "has not delivered 2 of the stream sequences acked (5, 6;" in by_code[failed]
            assert "run.stream_seqs" in by_code[invalid]
            await _acked_to(js, 4, 2)  # nothing changed

            rest = await sub.fetch(2, timeout=5)
            assert [m.metadata.stream_seq for m in rest] == [5, 6]
            follower = next(n for n in cluster3.names if n != leader)
            other = pbg.ConsumeServiceStub(cluster3.channel(follower))
            await _long_runs_refused(stub, other, js)
            other.Ack(pb.AckRequest(run=ahead), timeout=15)  # sent on to the leader
            await _acked_to(js, MSGS, 0)

            with pytest.raises(grpc.RpcError) as refused:
                other.Ack(
                    pb.AckRequest(run=pb.AckRun(stream="RUN", consumer="R", stream_seqs=[7])),
                    timeout=15,
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "has not delivered stream sequence 7" in (refused.value.details() or "")
            with pytest.raises(grpc.RpcError) as both:
                stub.Ack(pb.AckRequest(ack=pb.AckItem(reply="x"), run=ahead), timeout=15)
            assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "run" in (both.value.details() or "")
            await asyncio.sleep(0)
        finally:
            await js.close()

    run(body())


async def _long_runs_refused(
    stub: pbg.ConsumeServiceStub, other: pbg.ConsumeServiceStub, js: raftstream.Client
) -> None:
    """A run of one more than ACK_RUN_SEQS_MAX sequences (of a delivered, unacked one) is
    INVALID_ARGUMENT naming ``run.stream_seqs`` and its rule on every path (unary to the
    leader, unary to a follower that would send it on, AckStream), and acks nothing."""
    long_run = pb.AckRun(stream="RUN", consumer="R", stream_seqs=[5] * (ACK_RUN_SEQS_MAX + 1))
    for s in (stub, other):
        with pytest.raises(grpc.RpcError) as refused:
            s.Ack(pb.AckRequest(run=long_run), timeout=15)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "run.stream_seqs" in (refused.value.details() or "")
        assert "ack_run_seqs_max" in (refused.value.details() or "")
        batch = pb.AckBatch(runs=[long_run])
        results = [r for b in s.AckStream(iter([batch]), timeout=15) for r in b.results]
        assert [r.error.code for r in results] == [grpc.StatusCode.INVALID_ARGUMENT.value[0]]
        assert "ack_run_seqs_max" in results[0].error.message
    ci = await js.consumer_info("RUN", "R")
    assert (ci.ack_floor.stream_seq, ci.num_ack_pending) == (4, 2), ci  # nothing changed


@pytest.mark.parametrize(
    ("run", "field"),
    [
        (pb.AckRun(stream="", consumer="C", stream_seqs=[1]), "run.stream"),
        (pb.AckRun(stream="S", consumer="a.b", stream_seqs=[1]), "run.consumer"),
        (pb.AckRun(stream="S", consumer="C"), "run.stream_seqs"),
        (pb.AckRun(stream="S", consumer="C", stream_seqs=[1, 0]), "run.stream_seqs"),
        (pb.AckRun(stream="S", consumer="C", stream_seqs=[2**63]), "run.stream_seqs"),
        (
            pb.AckRun(stream="S", consumer="C", stream_seqs=[1] * (ACK_RUN_SEQS_MAX + 1)),
            "run.stream_seqs",
        ),
    ],
)
def test_a_bad_run_is_refused_naming_its_field(run: pb.AckRun, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as refused:
        check_ack_run(run)
    assert refused.value.field == field


def test_a_good_run_passes() -> None:
    check_ack_run(pb.AckRun(stream="S", consumer="C", stream_seqs=[1, 2**63 - 1]))
    check_ack_run(pb.AckRun(stream="S", consumer="C", stream_seqs=[1] * ACK_RUN_SEQS_MAX))
