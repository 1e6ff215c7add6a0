"""The subscribe workflow's rules against a real 3-node cluster (ADR-15 "Creation").

Each test names the ADR-15 rule it pins; every refusal is a typed error naming its field.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from raftstream import errors
from raftstream.config import AckPolicy, ConsumerConfig
from raftstream.subscribe import create_or_bind, new_inbox
from tests.support.cluster import LocalCluster
from tests.support.polling import until

from .live import connected, consumer_gone, run, stream

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("tails")]

NS = 1_000_000_000


def test_no_subject_and_no_stream_is_refused(cluster: LocalCluster) -> None:
    """ADR-15 "Stream name": without a stream the subject is required."""

    async def body() -> None:
        async with connected(cluster) as rs:
            with pytest.raises(errors.InvalidArgumentError) as e:
                await rs.subscribe("")
            assert e.value.field == "subject"
            with pytest.raises(errors.InvalidArgumentError):
                await rs.pull_subscribe("", durable="D")

    run(body())


def test_the_stream_is_the_one_stream_capturing_the_subject(cluster: LocalCluster) -> None:
    """ADR-15 "Stream name": exactly one match, else "no stream matches"."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_ONE", "one.>")
            await stream(rs, "WF_M1", "many.a")
            await stream(rs, "WF_M2", "many.b")
            with pytest.raises(errors.NoStreamMatchError, match="no stream matches"):
                await rs.subscribe("nothing.here")
            with pytest.raises(errors.NoStreamMatchError, match="several"):
                await rs.subscribe("many.*")
            sub = await rs.subscribe("one.x")
            assert sub.stream == "WF_ONE"
            await sub.unsubscribe()

    run(body())


def test_heartbeats_or_flow_control_with_a_queue_are_refused(cluster: LocalCluster) -> None:
    """ADR-15 "Configuration": the server would send them to random members."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_Q", "wfq.>")
            with pytest.raises(errors.InvalidArgumentError) as e:
                await rs.subscribe("wfq.x", queue="workers", idle_heartbeat=1.0)
            assert e.value.field == "idle_heartbeat"
            with pytest.raises(errors.InvalidArgumentError) as e:
                await rs.subscribe("wfq.x", queue="workers", flow_control=True)
            assert e.value.field == "flow_control"
            with pytest.raises(errors.InvalidArgumentError) as e:
                await rs.subscribe("wfq.x", config=ConsumerConfig(deliver_group="workers"))
            assert e.value.field == "deliver_group"
            assert await rs.consumer_names("WF_Q") == []

    run(body())


def test_pull_with_ack_policy_none_or_all_is_refused(cluster: LocalCluster) -> None:
    """ADR-15 "Configuration": a pull subscription may not ask for ack policy none or all
    (binding to an existing consumer with one is allowed, as in the Go client)."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_PA", "wfpa.>")
            for policy in (AckPolicy.NONE, AckPolicy.ALL):
                with pytest.raises(errors.InvalidArgumentError) as e:
                    await rs.pull_subscribe("wfpa.x", "P", config=ConsumerConfig(ack_policy=policy))
                assert e.value.field == "ack_policy"
            await rs.add_consumer("WF_PA", durable_name="NONE", ack_policy="none")
            bound = await rs.pull_subscribe_bind("WF_PA", "NONE")
            assert bound.consumer == "NONE"
            assert await rs.consumer_names("WF_PA") == ["NONE"]  # nothing made for "P"

    run(body())


def test_pull_and_push_consumers_do_not_mix(cluster: LocalCluster) -> None:
    """ADR-15 "Other checks": no pull subscription on a push consumer, nor the opposite."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_PP", "wfpp.>")
            await rs.add_consumer("WF_PP", durable_name="PULL")
            await rs.add_consumer("WF_PP", durable_name="PUSH", deliver_subject=new_inbox())
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.subscribe("wfpp.x", durable="PULL")
            assert e.value.field == "deliver_subject"
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.pull_subscribe("wfpp.x", "PUSH")
            assert e.value.field == "deliver_subject"
            with pytest.raises(errors.ConsumerMismatchError):
                await rs.pull_subscribe_bind("WF_PP", "PUSH")
            with pytest.raises(errors.ConsumerMismatchError):
                await rs.subscribe_bind("WF_PP", "PULL")
            with pytest.raises(errors.NotFoundError):
                await rs.subscribe_bind("WF_PP", "MISSING")
            with pytest.raises(errors.NotFoundError):
                await rs.pull_subscribe_bind("WF_PP", "MISSING")

    run(body())


def test_queue_group_binding_rules(cluster: LocalCluster) -> None:
    """ADR-15 "Push Consumer active information and queue group binding"."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_QB", "wfqb.>")
            deliver = new_inbox()
            await rs.add_consumer(
                "WF_QB", durable_name="G", deliver_subject=deliver, deliver_group="grp"
            )
            await rs.add_consumer("WF_QB", durable_name="NG", deliver_subject=new_inbox())
            with pytest.raises(errors.ConsumerMismatchError, match="queue group 'grp'") as e:
                await rs.subscribe("wfqb.x", durable="G")  # non-queue on a queue consumer
            assert e.value.field == "deliver_group"
            with pytest.raises(errors.ConsumerMismatchError, match="not 'other'"):
                await rs.subscribe("wfqb.x", queue="other", durable="G")
            with pytest.raises(errors.ConsumerMismatchError, match="without a deliver group"):
                await rs.subscribe("wfqb.x", queue="grp", durable="NG")
            sub = await rs.subscribe("wfqb.x", queue="grp", durable="G")
            assert sub.consumer == "G" and sub.queue == "grp"
            await sub.unsubscribe()
            await rs.consumer_info("WF_QB", "G")  # bound, not created: never deleted

    run(body())


def test_a_second_non_queue_subscription_is_a_duplicate(cluster: LocalCluster) -> None:
    """ADR-15: "duplicate subscription" for a second non-queue subscriber of one push
    consumer; once the first is gone the consumer may be bound again."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_DUP", "wfdup.>")
            first = await rs.subscribe("wfdup.x", durable="D")
            with pytest.raises(errors.DuplicateSubscriptionError, match="duplicate"):
                await rs.subscribe("wfdup.x", durable="D")
            with pytest.raises(errors.DuplicateSubscriptionError):
                await rs.subscribe_bind("WF_DUP", "D")
            await rs.publish("wfdup.x", b"one")
            assert (await first.next_msg(10)).data == b"one"
            await first.drain()  # created by the SDK: deleted at the end of drain
            await consumer_gone(rs, "WF_DUP", "D")
            again = await rs.subscribe("wfdup.x", durable="D")
            assert (await again.next_msg(10)).data == b"one"  # a new consumer, from the start
            await again.unsubscribe()

    run(body())


def test_a_push_consumer_bound_by_another_client_is_a_duplicate(cluster: LocalCluster) -> None:
    """ADR-15: the server reports ``push_bound`` while a subscriber is attached, so a second
    client (which has no memory of the first) is refused with "duplicate subscription"."""

    async def body() -> None:
        async with connected(cluster) as one, connected(cluster) as two:
            await stream(one, "WF_DUP2", "wfdup2.>")
            first = await one.subscribe("wfdup2.x", durable="D2")

            async def bound() -> bool | None:
                return True if (await two.consumer_info("WF_DUP2", "D2")).push_bound else None

            await until(bound, what="push_bound reported")
            with pytest.raises(errors.DuplicateSubscriptionError):
                await two.subscribe("wfdup2.x", durable="D2")
            with pytest.raises(errors.DuplicateSubscriptionError):
                await two.subscribe_bind("WF_DUP2", "D2")
            await first.unsubscribe()

    run(body())


def test_filter_subject_must_match_the_subject(cluster: LocalCluster) -> None:
    """ADR-15 "Other checks": the consumer's filter (when set) is the subscription's subject."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_F", "wff.>")
            await rs.add_consumer(
                "WF_F", durable_name="FA", filter_subject="wff.a", deliver_subject=new_inbox()
            )
            await rs.add_consumer("WF_F", durable_name="PA", filter_subject="wff.a")
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.subscribe("wff.b", durable="FA")
            assert e.value.field == "filter_subject"
            with pytest.raises(errors.ConsumerMismatchError):
                await rs.pull_subscribe("wff.b", "PA")
            sub = await rs.subscribe("wff.a", durable="FA")
            pull = await rs.pull_subscribe("wff.a", "PA")
            assert pull.consumer == "PA"
            await sub.unsubscribe()

    run(body())


def test_a_requested_config_that_differs_is_refused(cluster: LocalCluster) -> None:
    """ADR-15 "Other checks": subscribing never changes an existing consumer; a field the
    caller set that differs is an error naming it, an equal one is fine."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_C", "wfc.>")
            await rs.add_consumer(
                "WF_C", durable_name="C", max_deliver=3, deliver_subject=new_inbox()
            )
            await rs.add_consumer("WF_C", durable_name="P", max_deliver=3)
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.subscribe("wfc.x", durable="C", config=ConsumerConfig(max_deliver=5))
            assert e.value.field == "max_deliver" and "3" in str(e.value)
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.subscribe("wfc.x", durable="C", deliver_policy="new")
            assert e.value.field == "deliver_policy"
            with pytest.raises(errors.ConsumerMismatchError) as e:
                await rs.pull_subscribe("wfc.x", "P", config=ConsumerConfig(max_deliver=4))
            assert e.value.field == "max_deliver"
            sub = await rs.subscribe("wfc.x", durable="C", config=ConsumerConfig(max_deliver=3))
            await sub.unsubscribe()
            assert (await rs.consumer_info("WF_C", "C")).config.max_deliver == 3

    run(body())


def test_a_queue_subscription_without_durable_uses_the_queue_name(
    cluster: LocalCluster,
) -> None:
    """ADR-15 "Queue name": members share one consumer named after the queue, and each
    message goes to one member (no gap reports for queue members: they see part of it)."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(cluster, errs) as rs:
            await stream(rs, "WF_QD", "wfqd.>")
            got: list[bytes] = []
            seen: list[set[bytes]] = [set(), set()]

            def member(i: int):
                async def cb(msg) -> None:
                    got.append(msg.data)
                    seen[i].add(msg.data)

                return cb

            m1 = await rs.subscribe("wfqd.x", queue="workers", cb=member(0))
            m2 = await rs.subscribe("wfqd.x", queue="workers", cb=member(1))
            assert m1.consumer == m2.consumer == "workers"
            info = await rs.consumer_info("WF_QD", "workers")
            assert info.config.deliver_group == "workers"
            total = 200
            for i in range(total):
                await rs.publish_async("wfqd.x", b"%d" % i)
            await rs.publish_async_completed()

            async def all_acked() -> bool | None:
                ci = await rs.consumer_info("WF_QD", "workers")
                done = len(got) >= total and ci.num_ack_pending == 0
                return True if done else None

            await until(all_acked, what="every message handled and acked")
            assert sorted(got) == sorted(b"%d" % i for i in range(total))  # each once
            assert not seen[0] & seen[1]
            assert seen[0] and seen[1], "both members get work (one used to get it all)"
            assert not [e for e in errs if isinstance(e, errors.SequenceGapError)]
            # m1 created the consumer. Its leaving must not stop m2 (it did, 409 Consumer
            # Deleted), and no member's leaving deletes a queue group's consumer.
            await m1.unsubscribe()
            more = [b"late-%d" % i for i in range(20)]
            for data in more:
                await rs.publish("wfqd.x", data)
            await until(lambda: _all_in(more, seen[1]), what="m2 goes on after its creator left")
            await m2.unsubscribe()
            await rs.consumer_info("WF_QD", "workers")  # still there: a durable of the group
            await rs.delete_consumer("WF_QD", "workers")

    run(body())


def test_a_create_that_loses_a_race_falls_back_to_lookup_and_checks(
    cluster: LocalCluster,
) -> None:
    """ADR-15 "Creating the JS Consumer": "already exists" means another creator won; the
    consumer is looked up and checked like a found one, and is not ours to delete."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_R", "wfr.>")
            winner = ConsumerConfig(
                durable_name="R", deliver_subject=new_inbox(), deliver_group="g"
            )
            await rs.add_consumer("WF_R", winner)
            # The loser's create (its own inbox) is refused by the server: already exists.
            loser = ConsumerConfig(durable_name="R", deliver_subject=new_inbox(), deliver_group="g")
            checked: list[str] = []
            info, created = await create_or_bind(
                rs, "WF_R", loser, lambda found: checked.append(found.name)
            )
            assert (info.name, created, checked) == ("R", False, ["R"])

            def refuse(found: object) -> None:
                raise errors.ConsumerMismatchError("deliver_group", "test refusal")

            with pytest.raises(errors.ConsumerMismatchError):
                await create_or_bind(rs, "WF_R", loser, refuse)
            # Two subscribers racing on one queue consumer both end up bound to it.
            subs = await asyncio.gather(
                rs.subscribe("wfr.y", queue="racers"), rs.subscribe("wfr.y", queue="racers")
            )
            assert {s.consumer for s in subs} == {"racers"}
            for s in subs:
                await s.unsubscribe()

    run(body())


def test_consumers_the_sdk_created_are_deleted_and_others_kept(cluster: LocalCluster) -> None:
    """ADR-15 "Unsubscribe and Drain": only consumers the library created are deleted;
    drain hands over what is buffered first."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_DEL", "wfdel.>")
            for i in range(5):
                await rs.publish("wfdel.x", b"%d" % i)
            got: list[bytes] = []

            async def slow(msg) -> None:
                await asyncio.sleep(0.01)
                got.append(msg.data)

            eph = await rs.subscribe("wfdel.x", cb=slow)
            await until(lambda: _ready(eph.pending + len(got) == 5), what="five messages received")
            await eph.drain()
            assert got == [b"%d" % i for i in range(5)]  # drain handed over the buffer first
            await consumer_gone(rs, "WF_DEL", eph.consumer)
            await rs.add_consumer("WF_DEL", durable_name="KEEP", deliver_subject=new_inbox())
            kept = await rs.subscribe("wfdel.x", durable="KEEP")
            await kept.unsubscribe()
            bound = await rs.subscribe_bind("WF_DEL", "KEEP")
            await bound.unsubscribe()
            assert "KEEP" in await rs.consumer_names("WF_DEL")

    run(body())


async def _ready(cond: bool) -> bool | None:
    return True if cond else None


def test_keyword_options_shape_the_consumer_created(cluster: LocalCluster) -> None:
    """``idle_heartbeat`` and ``inactive_threshold`` are seconds; the consumer the SDK makes
    filters on the subject, has an inbox deliver subject and the options asked for."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_KW", "wfkw.>")
            sub = await rs.subscribe(
                "wfkw.a",
                idle_heartbeat=0.5,
                flow_control=True,
                inactive_threshold=30,
                deliver_policy="new",
            )
            cfg = (await sub.consumer_info()).config
            assert (cfg.idle_heartbeat, cfg.inactive_threshold) == (NS // 2, 30 * NS)
            assert cfg.flow_control and cfg.deliver_policy == "new"
            assert cfg.filter_subject == "wfkw.a" and (cfg.deliver_subject or "").startswith(
                "_INBOX."
            )
            await sub.unsubscribe()

    run(body())


def test_an_ordered_consumer_refuses_what_contradicts_it(cluster: LocalCluster) -> None:
    """An ordered consumer is ephemeral, unshared and unacked."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_ORD", "wford.>")
            for kwargs, field in (
                ({"queue": "q"}, "queue"),
                ({"durable": "D"}, "durable"),
                ({"manual_ack": True}, "manual_ack"),
                ({"config": ConsumerConfig(deliver_group="g")}, "deliver_group"),
            ):
                with pytest.raises(errors.InvalidArgumentError) as e:
                    await rs.subscribe("wford.x", ordered_consumer=True, **kwargs)
                assert e.value.field == field
            assert await rs.consumer_names("WF_ORD") == []

    run(body())


def test_closing_the_client_deletes_its_ephemeral_consumers_only(cluster: LocalCluster) -> None:
    """The server does not see the client go; the SDK deletes the ephemeral consumers it
    made (push and ordered) when the client closes, and keeps durable ones."""

    async def body() -> None:
        async with connected(cluster) as admin:
            await stream(admin, "WF_CL", "wfcl.>")
            async with connected(cluster) as rs:
                eph = await rs.subscribe("wfcl.x")
                ordered = await rs.subscribe("wfcl.x", ordered_consumer=True)
                await rs.subscribe("wfcl.x", durable="STAYS")
                names = {eph.consumer, ordered.consumer, "STAYS"}
                assert set(await rs.consumer_names("WF_CL")) == names
            await consumer_gone(admin, "WF_CL", eph.consumer)
            await consumer_gone(admin, "WF_CL", ordered.consumer)
            assert await admin.consumer_names("WF_CL") == ["STAYS"]

    run(body())


async def _all_in(items: list[bytes], seen: set[bytes]) -> bool | None:
    return True if all(i in seen for i in items) else None


def test_unsubscribe_or_drain_from_the_subscriptions_own_callback(
    cluster: LocalCluster,
) -> None:
    """Stopping a subscription from its own callback (after N messages, say): unsubscribe
    used to cancel the callback before the consumer was deleted, and drain waited for the
    callback that was waiting for it, forever."""

    async def body() -> None:
        async with connected(cluster) as rs:
            await stream(rs, "WF_CB", "wfcb.>")
            for i in range(20):
                await rs.publish("wfcb.x", b"%d" % i)
            outcomes: dict[str, str] = {}
            seen: dict[str, list[bytes]] = {"unsubscribe": [], "drain": []}
            subs: dict[str, Any] = {}

            def stopper(how: str) -> Any:
                async def cb(msg: Any) -> None:
                    seen[how].append(msg.data)
                    if len(seen[how]) == 5:
                        try:
                            await asyncio.wait_for(getattr(subs[how], how)(), 10)
                            outcomes[how] = "returned"
                        except BaseException as exc:  # CancelledError, TimeoutError
                            outcomes[how] = type(exc).__name__
                            raise

                return cb

            for how in ("unsubscribe", "drain"):
                subs[how] = await rs.subscribe("wfcb.x", cb=stopper(how))
            await until(
                lambda: _done(subs.values(), outcomes), what="both callbacks stopped their sub"
            )
            assert outcomes == {"unsubscribe": "returned", "drain": "returned"}
            assert len(seen["unsubscribe"]) == 5  # nothing after it
            for sub in subs.values():  # the SDK made them: deleted on the way out
                await consumer_gone(rs, "WF_CB", sub.consumer)

    run(body())


async def _done(subs: Any, outcomes: dict[str, str]) -> bool | None:
    return True if len(outcomes) == 2 and all(s.is_closed for s in subs) else None
