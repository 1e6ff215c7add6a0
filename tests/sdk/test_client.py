"""The SDK's connection logic against fake servers: server fail-over, leader hints, retries
bounded by the caller's timeout, idempotency, and the management calls' wire fields.

docs/cluster-design.md "Errors" and docs/architecture.md "Publish, end to end": a node that is not
the leader answers NOT_LEADER with the leader's address in structured details; the SDK
follows the hint and retries (tenacity), within the caller's deadline.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import grpc
import pytest

import raftstream
from raftstream import errors
from raftstream._conn import ATTEMPT_TIME_MIN_S, NotConnectedError, _telling, not_sent
from raftstream.config import UnknownFieldError
from raftstream.msg import Msg
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import Nodes, RpcError, ack_token, consumer_info_pb, stream_info_pb


def free_dead_addr() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_connect_skips_an_unreachable_server():
    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("GetStreamInfo", lambda req, ctx: _info(req.name))
            rs = await raftstream.connect([free_dead_addr(), node.addr], timeout=5)
            async with rs:
                info = await rs.stream_info("ORDERS")
            assert info.config.name == "ORDERS"

    run(main())


async def _info(name: str) -> pb.StreamInfo:
    return stream_info_pb(name)


def test_connect_fails_typed_when_no_server_answers():
    async def main() -> None:
        with pytest.raises(errors.UnavailableError):
            await raftstream.connect([free_dead_addr()], timeout=0.5, connect_timeout=0.1)

    run(main())


def test_a_retry_wait_that_overruns_the_deadline_raises_the_last_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a loaded machine the wait before the next attempt can overrun the caller's
    deadline: the error is then the last attempt's (here: nothing answers at the address),
    not a bare "no answer within" timeout that hides it."""
    real_sleep = asyncio.sleep

    async def overrunning_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        return await real_sleep(delay + 0.6 if delay > 0 else delay, *args, **kwargs)

    async def main() -> None:
        monkeypatch.setattr(asyncio, "sleep", overrunning_sleep)
        with pytest.raises(errors.UnavailableError) as info:
            await raftstream.connect([free_dead_addr()], timeout=0.5, connect_timeout=0.1)
        assert not isinstance(info.value, errors.DeadlineExceededError)

    run(main())


def test_not_leader_hint_is_followed_and_remembered_per_stream():
    """A follower's NOT_LEADER names the leader's address: the SDK retries there, and later
    calls for the same stream go straight to the leader."""

    async def main() -> None:
        async with Nodes(2) as (follower, leader):

            async def refuse(req: Any, ctx: Any) -> Any:
                raise errors.NotLeaderError(leader="n2", leader_addr=leader.addr)

            async def create(req: Any, ctx: Any) -> pb.StreamInfo:
                return pb.StreamInfo(config_json=req.config_json)

            follower.on("CreateStream", refuse)
            follower.on("GetStreamInfo", refuse)
            leader.on("CreateStream", create)
            leader.on("GetStreamInfo", lambda req, ctx: _info(req.name))
            async with await raftstream.connect([follower.addr], timeout=5) as rs:
                info = await rs.add_stream(name="ORDERS", subjects=["orders.>"])
                assert info.config.subjects == ("orders.>",)
                await rs.stream_info("ORDERS")
            assert len(follower.calls_to("CreateStream")) == 1
            assert len(leader.calls_to("CreateStream")) == 1
            assert follower.calls_to("GetStreamInfo") == []
            assert len(leader.calls_to("GetStreamInfo")) == 1

    run(main())


def test_a_hinted_leader_that_is_dead_is_left_for_the_seed_which_then_answers():
    """The leader a NOT_LEADER names was just killed; the follower asked becomes leader a
    moment later. The SDK tries the dead leader once, gives it up as soon as its connection
    is refused, and asks the seed again, which answers (a user review: a CLI read through a
    follower tried the dead leader again and again, 2 s each, and failed NOT_LEADER after
    8.6 s while the node asked had led for 8 s)."""

    async def main() -> None:
        async with Nodes(1) as (seed,):
            dead = free_dead_addr()
            asked = 0

            async def info(req: Any, ctx: Any) -> pb.StreamInfo:
                nonlocal asked
                asked += 1
                if asked < 3:  # still following the old leader, then elected
                    raise errors.NotLeaderError(leader="n2", leader_addr=dead)
                return stream_info_pb(req.name)

            seed.on("GetStreamInfo", info)
            async with await raftstream.connect([seed.addr], timeout=3, connect_timeout=2) as rs:
                got = await rs.stream_info("ORDERS")
            assert (got.config.name, asked) == ("ORDERS", 3)

    run(main())


def test_retries_stop_at_the_callers_timeout_and_every_attempt_carries_a_deadline():
    """NO_LEADER is retried with backoff until the timeout is spent; then the last typed
    error is raised. Each attempt's deadline is what is left of the caller's timeout (not
    compared with the clock: deadlines travel rounded, so only their order is checked)."""
    timeout_s = 0.6

    async def main() -> None:
        async with Nodes(1) as (node,):

            async def no_leader(req: Any, ctx: Any) -> Any:
                raise errors.NoLeaderError("stream ORDERS has no leader")

            node.on("GetStreamInfo", no_leader)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.NoLeaderError):
                    await rs.stream_info("ORDERS", timeout=timeout_s)
            calls = node.calls_to("GetStreamInfo")
            assert len(calls) >= 2
            remaining = [c.time_remaining for c in calls]
            # Every attempt carried a deadline, and they share one budget: the last attempt
            # got what was left, not a fresh timeout of its own.
            assert all(r is not None for r in remaining), remaining
            assert remaining[-1] < remaining[0], remaining

    run(main())


def test_no_retry_starts_with_too_little_time_so_the_real_cause_is_raised():
    """With a quorum lost every attempt meets NO_LEADER. A last attempt started with a few
    milliseconds left could only run out of time, and its "deadline exceeded" would hide
    that cause; so a retry starts only with ATTEMPT_TIME_MIN_S left. The fake answers
    NO_LEADER unless the attempt's deadline is too close to answer anything."""

    async def main() -> None:
        async with Nodes(1) as (node,):

            async def no_leader(req: Any, ctx: Any) -> Any:
                left = ctx.time_remaining()
                if left is not None and left < ATTEMPT_TIME_MIN_S / 2:
                    await asyncio.sleep(1)  # past the deadline: DEADLINE_EXCEEDED
                raise errors.NoLeaderError("stream ORDERS has no leader")

            node.on("GetStreamInfo", no_leader)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                for timeout_s in (0.3, 0.35, 0.4, 0.45):  # where the last retry lands varies
                    with pytest.raises(errors.NoLeaderError):
                        await rs.stream_info("ORDERS", timeout=timeout_s)
            remaining = [c.time_remaining for c in node.calls_to("GetStreamInfo")]
            assert all(r is not None and r >= ATTEMPT_TIME_MIN_S / 2 for r in remaining)

    run(main())


def test_the_raised_error_says_what_the_servers_said():
    """With a quorum lost, the last attempt may reach a dead seed (nothing sent) or run out
    of time on a server still waiting for a leader: the first gives way to the earlier
    NO_LEADER; the second stays (ambiguous) and names it."""
    refusal = errors.NoLeaderError("stream 'F' has no leader yet")
    not_connected = NotConnectedError("cannot connect to 127.0.0.1:1", addr="127.0.0.1:1")
    assert _telling(not_connected, refusal) is refusal
    assert _telling(not_connected, None) is not_connected
    timed_out = errors.DeadlineExceededError("no answer in the 0.080s left")
    told = _telling(timed_out, refusal)
    assert told is timed_out and isinstance(told, errors.DeadlineExceededError)
    assert "NO_LEADER: stream 'F' has no leader yet" in str(told)
    assert told.details["before"] == "NO_LEADER"
    other = errors.PreconditionError("wrong last sequence")
    assert _telling(other, refusal) is other


def test_a_server_that_does_not_answer_loses_its_hint_and_its_turn_as_seed():
    """A leader paused or cut off keeps its connection READY, so only the deadline tells:
    the call that meets it fails (DEADLINE_EXCEEDED), and the next call for that stream
    asks a seed server again instead of the silent node, and follows the new hint."""

    async def main() -> None:
        async with Nodes(3) as (seed, frozen, new_leader):
            leader = {"addr": frozen.addr}

            async def refuse(req: Any, ctx: Any) -> Any:
                raise errors.NotLeaderError(leader="n", leader_addr=leader["addr"])

            async def hang(req: Any, ctx: Any) -> Any:
                await asyncio.sleep(30)

            seed.on("GetStreamInfo", refuse)
            frozen.on("GetStreamInfo", hang)
            new_leader.on("GetStreamInfo", lambda req, ctx: _info(req.name))
            async with await raftstream.connect([seed.addr], timeout=5) as rs:
                with pytest.raises(errors.DeadlineExceededError):
                    await rs.stream_info("ORDERS", timeout=0.5)
                assert rs._router.hint("ORDERS") is None
                leader["addr"] = new_leader.addr  # elected meanwhile
                info = await rs.stream_info("ORDERS", timeout=2)
            assert info.config.name == "ORDERS"
            assert len(frozen.calls_to("GetStreamInfo")) == 1

        # A silent seed server is passed over for the next one.
        async with Nodes(2) as (silent, alive):
            silent.on("GetStreamInfo", hang)
            alive.on("GetStreamInfo", lambda req, ctx: _info(req.name))
            async with await raftstream.connect([silent.addr, alive.addr], timeout=5) as rs:
                with pytest.raises(errors.DeadlineExceededError) as late:
                    await rs.stream_info("ORDERS", timeout=0.5)
                # Whose answer was late and the timeout, not gRPC's bare "Deadline Exceeded".
                assert str(late.value) == f"no answer from {silent.addr} within 0.5s (the timeout)"
                await rs.stream_info("ORDERS", timeout=2)
            assert len(silent.calls_to("GetStreamInfo")) == 1
            assert len(alive.calls_to("GetStreamInfo")) == 1

    run(main())


def test_ambiguous_failures_are_retried_only_for_idempotent_calls():
    """A bare UNAVAILABLE mid-call may hide an applied request: reads retry it, a delete
    does not (its outcome is unknown, so it is reported)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            failures = {"GetStreamInfo": 2, "DeleteStream": 2}

            def flaky(rpc: str, answer: Any) -> Any:
                async def handler(req: Any, ctx: Any) -> Any:
                    if failures[rpc] > 0:
                        failures[rpc] -= 1
                        raise errors.UnavailableError("connection reset by peer")
                    return answer

                return handler

            node.on("GetStreamInfo", flaky("GetStreamInfo", stream_info_pb("ORDERS")))
            node.on("DeleteStream", flaky("DeleteStream", pb.DeleteStreamResponse()))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                info = await rs.stream_info("ORDERS")
                with pytest.raises(errors.UnavailableError):
                    await rs.delete_stream("ORDERS")
            assert info.config.name == "ORDERS"
            assert len(node.calls_to("GetStreamInfo")) == 3
            assert len(node.calls_to("DeleteStream")) == 1

    run(main())


def test_a_call_grpc_could_not_send_is_classified_as_not_sent():
    """gRPC fails a call with "failed to connect to all addresses" when the channel lost its
    connection between our readiness check and the call: nothing was sent, so even a publish
    may be retried elsewhere. Any other UNAVAILABLE stays ambiguous."""
    down = RpcError(
        grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: x"
    )
    exc = not_sent(down, "127.0.0.1:1")
    assert isinstance(exc, NotConnectedError) and exc.retriable
    assert not_sent(RpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"), "a:1") is None
    assert not_sent(RpcError(grpc.StatusCode.INTERNAL, down.details()), "a:1") is None


def test_a_server_that_dies_after_connecting_is_skipped_even_for_a_non_idempotent_call():
    """Once the client's channel has seen its server go, a call goes elsewhere (not sent
    there: "failed to connect", or not READY at the check). A call made in the instant
    before the channel notices is written to the dead connection and fails ambiguously
    ("Stream removed"), which no client can tell from a server dying mid-call, so the test
    waits for the channel to leave READY: that instant is a race, not the behaviour."""

    async def main() -> None:
        async with Nodes(2) as (doomed, alive):
            doomed.on("GetStreamInfo", lambda req, ctx: _info(req.name))
            alive.on("DeleteStream", _deleted)
            async with await raftstream.connect([doomed.addr, alive.addr], timeout=5) as rs:
                await rs.stream_info("ORDERS")  # the channel to ``doomed`` is READY now
                channel = rs._router._channels[doomed.addr].channel
                await doomed.stop()
                while channel.get_state() == grpc.ChannelConnectivity.READY:
                    await channel.wait_for_state_change(grpc.ChannelConnectivity.READY)
                await rs.delete_stream("ORDERS")
            assert len(alive.calls_to("DeleteStream")) == 1

    run(main())


async def _deleted(req: Any, ctx: Any) -> pb.DeleteStreamResponse:
    return pb.DeleteStreamResponse()


def test_a_validation_error_is_raised_typed_at_once():
    async def main() -> None:
        async with Nodes(1) as (node,):

            async def refuse(req: Any, ctx: Any) -> Any:
                raise errors.InvalidArgumentError("max_age", "must not be negative")

            node.on("CreateStream", refuse)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                with pytest.raises(errors.InvalidArgumentError) as raised:
                    await rs.add_stream(name="X", max_age=-1)
            assert (raised.value.field, raised.value.rule) == ("max_age", "must not be negative")
            assert len(node.calls_to("CreateStream")) == 1
            sent = json.loads(node.calls_to("CreateStream")[0].request.config_json)
            assert sent["max_age"] == -1 and sent["name"] == "X"

    run(main())


def test_listings_collect_every_page():
    names = [f"S{i}" for i in range(5)]

    async def main() -> None:
        async with Nodes(1) as (node,):

            async def list_streams(req: Any, ctx: Any) -> pb.ListStreamsResponse:
                page = names[req.offset : req.offset + 2]
                return pb.ListStreamsResponse(
                    streams=[stream_info_pb(n) for n in page],
                    page=pb.Page(total=len(names), offset=req.offset, limit=2),
                )

            async def stream_names(req: Any, ctx: Any) -> pb.StreamNamesResponse:
                match = [n for n in names if req.subject in ("", n)]
                return pb.StreamNamesResponse(
                    names=match[req.offset : req.offset + 2],
                    page=pb.Page(total=len(match), offset=req.offset, limit=2),
                )

            node.on("ListStreams", list_streams)
            node.on("StreamNames", stream_names)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                infos = await rs.streams_info()
                assert [i.config.name for i in infos] == names
                assert await rs.stream_names(subject="S3") == ["S3"]
            assert [c.request.offset for c in node.calls_to("ListStreams")] == [0, 2, 4]

    run(main())


def test_management_calls_send_their_fields():
    """purge, get_msg (three ways), delete_msg, pause/resume, consumers: what goes on the
    wire, and what comes back."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("PurgeStream", _answer(pb.PurgeStreamResponse(purged=7)))
            msg = pb.Msg(subject="orders.1", seq=3, ts_ns=9, headers={"k": "v"}, data=b"x")
            node.on("GetMessage", _answer(pb.GetMessageResponse(message=msg)))
            node.on("DeleteMessage", _answer(pb.DeleteMessageResponse()))
            pause = pb.PauseConsumerResponse(paused=True, pause_until_ns=50)
            node.on("PauseConsumer", _answer(pause))
            node.on("ResumeConsumer", _answer(pb.PauseConsumerResponse(paused=False)))
            cinfo = consumer_info_pb("ORDERS", "C", {"durable_name": "C", "ack_policy": "all"})
            node.on("CreateConsumer", _answer(cinfo))
            node.on("DeleteConsumer", _answer(pb.DeleteConsumerResponse()))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                assert await rs.purge_stream("ORDERS", subject="orders.1", keep=2) == 7
                got = await rs.get_msg("ORDERS", 3)
                assert (got.subject, got.seq, got.data, dict(got.headers)) == (
                    "orders.1",
                    3,
                    b"x",
                    {"k": "v"},
                )
                await rs.get_last_msg("ORDERS", "orders.1")
                await rs.get_msg("ORDERS", 2, subject="orders.*", next=True)
                assert await rs.delete_msg("ORDERS", 3, no_erase=True)
                # A future time (a past one is refused: see the bad-input tests).
                until = time.time_ns() + 60 * 10**9
                assert (await rs.pause_consumer("ORDERS", "C", until)).paused
                assert not (await rs.resume_consumer("ORDERS", "C")).paused
                info = await rs.add_consumer("ORDERS", durable_name="C", ack_policy="all")
                assert info.config.ack_policy is raftstream.AckPolicy.ALL
                assert await rs.delete_consumer("ORDERS", "C")
            purge = node.calls_to("PurgeStream")[0].request
            assert purge.subject == "orders.1" and purge.keep == 2 and not purge.HasField("seq")
            gets = [c.request for c in node.calls_to("GetMessage")]
            assert [g.WhichOneof("by") for g in gets] == [
                "seq",
                "last_by_subject",
                "next_by_subject",
            ]
            assert gets[2].start_seq == 2
            assert node.calls_to("DeleteMessage")[0].request.no_erase
            assert node.calls_to("PauseConsumer")[0].request.pause_until_ns == until
            created = json.loads(node.calls_to("CreateConsumer")[0].request.config_json)
            assert created == {
                "durable_name": "C",
                "ack_policy": "all",
                "deliver_policy": "all",
                "replay_policy": "instant",
            }

    run(main())


def _answer(response: Any) -> Any:
    async def handler(req: Any, ctx: Any) -> Any:
        return response

    return handler


def test_calls_after_close_fail_typed_at_once():
    """After close, every call fails with ClientClosedError (an UnavailableError, not
    retried) at once: acks and fetches of objects made before it waited out the whole
    timeout, and an ack returned as if sent, only a warning logged (a user review)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("GetStreamInfo", _answer(stream_info_pb("ORDERS")))
            rs = await raftstream.connect([node.addr], timeout=30)
            sub = rs._pull_subscription("ORDERS", "C")
            msg = Msg(
                subject="s",
                data=b"",
                headers=None,
                reply=ack_token(1),
                sender=rs._acker,
                stream="ORDERS",
            )
            await rs.close()
            calls = {
                "stream_info": rs.stream_info("ORDERS"),
                "publish": rs.publish("s", b"x"),
                "fetch": sub.fetch(1, timeout=30),
                "ack": msg.ack(),
                "ack_sync": msg.ack_sync(),
            }
            for name, call in calls.items():
                with pytest.raises(errors.ClientClosedError):
                    # Bounded well below the calls' 30 s: "at once", with room for a slow box.
                    await asyncio.wait_for(call, 10)
                assert name  # (which call failed shows in the traceback's locals)

    run(main())


def test_a_call_from_another_event_loop_is_refused_at_once():
    """gRPC's aio channels belong to one loop: a call from another one hung until its
    timeout and then said the outcome was unknown (a user review)."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("GetStreamInfo", _answer(stream_info_pb("ORDERS")))
            rs = await raftstream.connect([node.addr], timeout=30)
            try:
                await rs.stream_info("ORDERS")  # binds the client to this loop

                def elsewhere() -> BaseException | None:
                    try:
                        asyncio.run(asyncio.wait_for(rs.stream_info("ORDERS"), 10))
                    except BaseException as exc:
                        return exc
                    return None

                exc = await asyncio.to_thread(elsewhere)
                assert isinstance(exc, errors.PreconditionError), exc
                assert "another event loop" in str(exc)
                assert (await rs.stream_info("ORDERS")).config.name == "ORDERS"
            finally:
                await rs.close()

    run(main())


def test_a_zero_timeout_is_refused_not_the_default():
    """publish(timeout=0) meant the client's default timeout (``or``), a negative one was
    refused: 0 is refused alike."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            rs = await raftstream.connect([node.addr], timeout=30)
            try:
                with pytest.raises(errors.InvalidArgumentError) as info:
                    await asyncio.wait_for(rs.publish("s", b"x", timeout=0), 10)
                assert info.value.field == "timeout"
            finally:
                await rs.close()

    run(main())


def test_admin_calls_send_their_fields_and_are_not_retried_when_ambiguous():
    """Step-downs, peer removal and consumer reset change leadership or state once: a bare
    UNAVAILABLE is reported, never repeated; their requests carry what was asked."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("StepDownStreamLeader", _answer(pb.StepDownResponse(leader="n2")))
            node.on("StepDownConsumerLeader", _answer(pb.StepDownResponse()))
            node.on("StepDownMetaLeader", _answer(pb.StepDownResponse(leader="n3")))
            cinfo = consumer_info_pb("ORDERS", "C", {"durable_name": "C"})
            node.on("ResetConsumer", _answer(cinfo))
            node.on("UpdateConsumer", _answer(cinfo))

            async def gone(req: Any, ctx: Any) -> Any:
                raise errors.UnavailableError("connection reset")

            node.on("RemovePeer", gone)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                assert await rs.stream_leader_stepdown("ORDERS", preferred="n2") == "n2"
                assert await rs.consumer_leader_stepdown("ORDERS", "C") is None
                assert await rs.meta_leader_stepdown() == "n3"
                await rs.reset_consumer("ORDERS", "C", 10)
                cfg = raftstream.ConsumerConfig(durable_name="C", max_deliver=3)
                await rs.update_consumer("ORDERS", cfg)
                with pytest.raises(errors.UnavailableError):
                    await rs.remove_peer("n4")
            assert node.calls_to("StepDownStreamLeader")[0].request.preferred == "n2"
            reset = node.calls_to("ResetConsumer")[0].request
            assert reset.HasField("seq") and reset.seq == 10
            updated = json.loads(node.calls_to("UpdateConsumer")[0].request.config_json)
            assert updated["max_deliver"] == 3
            assert len(node.calls_to("RemovePeer")) == 1

    run(main())


def test_add_peer_sends_the_name_says_whether_it_readmitted_and_retries_when_ambiguous():
    """A readmission is idempotent (it only drops a removal), so a bare UNAVAILABLE is
    retried."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            answers = [None, pb.AddPeerResponse(readmitted=True), pb.AddPeerResponse()]

            async def add(req: Any, ctx: Any) -> Any:
                answer = answers.pop(0)
                if answer is None:
                    raise errors.UnavailableError("connection reset by peer")
                return answer

            node.on("AddPeer", add)
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                assert await rs.add_peer("n3") is True
                assert await rs.add_peer("n3") is False
            assert [c.request.peer for c in node.calls_to("AddPeer")] == ["n3"] * 3

    run(main())


def test_bad_numbers_and_headers_are_refused_naming_the_argument_before_sending():
    """Protobuf would refuse these with a bare ValueError/TypeError naming nothing."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                cases = [
                    ("expected_last_seq", rs.publish("s", b"x", expected_last_seq=-1)),
                    (
                        "expected_last_subject_seq",
                        rs.publish("s", b"x", expected_last_subject_seq=-1),
                    ),
                    ("headers", rs.publish("s", b"x", headers={"k": 1})),  # type: ignore[dict-item]
                    ("expected_last_seq", rs.publish_async("s", b"x", expected_last_seq=-1)),
                    ("seq", rs.get_msg("S", -1)),
                    ("seq", rs.delete_msg("S", 0)),
                    ("seq", rs.purge_stream("S", seq=-1)),
                    ("keep", rs.purge_stream("S", keep=-1)),
                    ("pause_until_ns", rs.pause_consumer("S", "C", -5)),
                    ("seq", rs.get_msg("S", 2**63)),
                    ("timeout", rs.stream_info("S", timeout=-1)),
                    ("timeout", rs.publish("s", b"x", timeout=-1)),
                    # A user review: bare TypeErrors from len() and protobuf before.
                    ("payload", rs.publish("s", 5)),  # type: ignore[arg-type]
                    ("payload", rs.publish_async("s", "text")),  # type: ignore[arg-type]
                    ("subject", rs.publish(5, b"x")),  # type: ignore[arg-type]
                ]
                for field, call in cases:
                    with pytest.raises(errors.InvalidArgumentError) as err:
                        await call
                    assert err.value.field == field
            assert node.calls == []

    run(main())


def test_the_default_error_log_says_a_repeated_error_once_then_how_many_more(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of fire-and-forget acks fail alike when a stream loses its leader: the
    default error_cb logged 512 identical lines in 10 ms (a user review). Now one line,
    then the count once the repeats end (another error, or one after the window)."""
    from raftstream import client as client_mod

    clock = [100.0]
    monkeypatch.setattr(client_mod.time, "monotonic", lambda: clock[0])
    cb = client_mod._ErrorLog()
    caplog.set_level("WARNING", logger="raftstream.client")
    no_leader = errors.NoLeaderError("stream 'WQ' has no leader yet")
    for _ in range(512):
        cb(no_leader)
    assert len(caplog.records) == 1
    cb(errors.NotFoundError("stream 'X' not found"))  # another error: the count, then it
    messages = [r.getMessage() for r in caplog.records]
    assert messages[1:] == [
        "raftstream: stream 'WQ' has no leader yet (NO_LEADER): 511 more times",
        "raftstream: stream 'X' not found (NOT_FOUND)",
    ]
    clock[0] += client_mod.ERROR_LOG_REPEAT_S  # the same again after the window: said again
    cb(errors.NotFoundError("stream 'X' not found"))
    assert len(caplog.records) == 4


def test_config_durations_below_a_millisecond_are_refused_naming_the_unit():
    """Config durations are nanoseconds; nats.py's ack_wait=30 is 30 s. ack_wait=30 made a
    30 ns ack wait and a redelivery storm (a user review): a set duration below 1 ms is
    refused before anything is sent, naming the field and the unit."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                cases = [
                    ("ack_wait", rs.add_consumer("S", durable_name="d", ack_wait=30)),
                    ("backoff", rs.add_consumer("S", durable_name="d", backoff=(5,))),
                    ("duplicate_window", rs.add_stream(name="S", duplicate_window=120)),
                    ("inactive_threshold", rs.update_consumer(
                        "S", raftstream.ConsumerConfig(durable_name="d", inactive_threshold=9)
                    )),
                ]  # fmt: skip
                for field, call in cases:
                    with pytest.raises(errors.InvalidArgumentError) as info:
                        await call
                    assert info.value.field == field and "nanoseconds" in str(info.value)
            assert not node.calls_to("CreateConsumer") and not node.calls_to("CreateStream")

    run(main())


def test_a_bytearray_or_memoryview_payload_is_published_as_its_bytes():
    """nats.py takes any bytes-like payload; a bytearray was refused by protobuf."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("Publish", _answer(pb.PubAck(stream="S", seq=1)))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                for payload in (bytearray(b"ab"), memoryview(b"ab")):
                    assert (await rs.publish("s", payload)).seq == 1
            sent = [c.request.data for c in node.calls_to("Publish")]
            assert sent and all(d == b"ab" for d in sent), sent

    run(main())


def test_update_consumer_takes_its_fields_as_keywords_like_add_consumer():
    """The README: configs are given as a config object and/or their fields as keywords;
    ``update_consumer`` took only the object (a TypeError for keywords, found by a user
    review). An unknown keyword is refused by name before anything is sent."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            cinfo = consumer_info_pb("ORDERS", "C", {"durable_name": "C"})
            node.on("UpdateConsumer", _answer(cinfo))
            async with await raftstream.connect([node.addr], timeout=5) as rs:
                await rs.update_consumer("ORDERS", durable_name="C", max_deliver=3)
                base = raftstream.ConsumerConfig(durable_name="C", ack_wait=5_000_000_000)
                await rs.update_consumer("ORDERS", base, max_deliver=4)
                with pytest.raises(UnknownFieldError) as err:
                    await rs.update_consumer("ORDERS", durable_name="C", max_delivr=3)
                assert err.value.field == "max_delivr" and "max_deliver" in str(err.value)
            sent = [json.loads(c.request.config_json) for c in node.calls_to("UpdateConsumer")]
            assert [(s["durable_name"], s["max_deliver"]) for s in sent] == [("C", 3), ("C", 4)]
            assert sent[1]["ack_wait"] == 5_000_000_000

    run(main())
