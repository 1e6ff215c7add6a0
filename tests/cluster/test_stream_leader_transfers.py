"""Leadership transfers and the stream leader's consumer copies (docs/cluster-design.md, "The
stream leader's consumer copies and deliveries": a planned leader change forgets no
delivery that was sent; operator review, finding 2).

While a transfer of the group's leadership is in progress, the core refuses every proposal
(Raft thesis §3.10). Before, the leader copies went on deciding: a Deliver op decided then
was refused after its deliveries had left, the new leader did not know them, delivered the
messages again as first deliveries (``num_delivered`` 1) and refused the client's ack.
Now, while a transfer is in progress:

- a new pull decides nothing; it waits for the transfer's end and then fails NOT_LEADER
  (the client asks the new leader), or goes on if the transfer was abandoned;
- a waiting pull takes nothing (the poller decides nothing), even when a message commits
  during the transfer; it ends with 409 Leadership Change;
- ``handing_over`` (the consumer step-down) waits for the consumer ops already proposed
  before it starts the transfer, so a pull decided just before is not refused either;
- without it (a transfer started by the stream step-down or a planned stop), that pull is
  kept too: ``RaftHost.transfer_leadership`` puts the proposals queued for the next round
  into the log before the transfer starts, so the new leader has them;
- a publish or stream change proposed during the transfer, which the core refuses, is
  NOT_LEADER naming the node taking over (it is in no log): clients send it there again,
  even a publish without a msg id.

Three in-process nodes on a memory network (``stream_nodes``), real transfers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from raftstream.cluster.services.consume import undelivered
from raftstream.cluster.stream.group import PullHandle
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from raftstream.engine.entries import DeleteMsg
from raftstream.errors import NotLeaderError, UnavailableError
from tests.support.polling import until
from tests.support.raft_hosts import run

from .one_node import GROUP, Node, leader_of, stream_nodes

NAMES = ("n1", "n2", "n3")
MSGS = 5
CONSUMER = ConsumerConfig(durable_name="C", ack_policy=AckPolicy.EXPLICIT, ack_wait=60 * 10**9)
PULL_ALL = {"batch": MSGS, "no_wait": True}


async def taken(handle: PullHandle) -> tuple[list[tuple[int, int]], list[str]]:
    """(stream sequence, delivery count) of the deliveries queued on ``handle``, and the
    descriptions of its statuses; closes it."""
    try:
        events = await handle.take()
    finally:
        handle.close()
    got = [(e.delivery.stream_seq, e.delivery.deliveries) for e in events if e.delivery]
    return got, [e.status.description for e in events if e.status is not None]


async def led_with_messages(nodes: dict[str, Node]) -> tuple[Node, Node]:
    """The leader, with ``MSGS`` messages published and on every replica, and the voter
    leadership is to move to."""
    lead = leader_of(nodes)
    assert lead is not None
    for i in range(MSGS):
        await lead.g.submit_plain("q.v", b"%d" % i)
    await until(lambda: all(n.g.replica.store.state().msgs == MSGS for n in nodes.values()))
    return lead, next(n for n in nodes.values() if n is not lead)


async def moved_to(nodes: dict[str, Node], target: Node) -> None:
    await until(lambda: leader_of(nodes) is target)


def known_to(n: Node, got: list[tuple[int, int]]) -> list[int]:
    """The sequences of ``got`` that ``n``'s leader copy has not delivered (an ack of
    them would be refused, and they would be delivered again as first deliveries)."""
    c = n.g.leader_consumer("C")
    return [seq for seq, _ in got if undelivered(c, seq) is not None]


def test_a_pull_during_a_transfer_decides_nothing_and_the_new_leader_serves_it(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead, target = await led_with_messages(nodes)
            lead.host.transfer_leadership(GROUP, target.name)
            got: list[tuple[int, int]] = []
            refused: UnavailableError | None = None
            try:
                handle = await lead.g.open_pull("C", PULL_ALL, 5.0)
            except UnavailableError as exc:  # NOT_LEADER / NO_LEADER: ask the new leader
                refused = exc
            else:
                got, _ = await taken(handle)
            await moved_to(nodes, target)
            # Whatever left the old leader is known to the new one.
            assert known_to(target, got) == []
            assert got == [] and refused is not None
            again, _ = await taken(await target.g.open_pull("C", PULL_ALL, 5.0))
            assert again == [(s, 1) for s in range(1, MSGS + 1)]

    run(scenario)


def test_a_publish_refused_during_a_transfer_is_not_leader_naming_the_new_leader(
    tmp_path: Path,
) -> None:
    """``cluster balance`` under a publish_async load without msg ids failed 20 publishes
    with a retriable UNAVAILABLE ("leadership is moving to n2"), which a client must take as
    ambiguous; the publish was in no log. It is NOT_LEADER with the hint now, and so is a
    stream change (a message delete) refused the same way."""

    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead, target = await led_with_messages(nodes)
            lead.host.transfer_leadership(GROUP, target.name)
            assert lead.host.transferring(GROUP) is not None
            # Both proposed at the host's next round, while the transfer is in progress: a
            # publish, and a message delete (a stream change, not retried when ambiguous).
            publish = lead.g.submit_plain("q.v", b"during")
            delete = asyncio.ensure_future(lead.g.propose_stream(DeleteMsg(ts_ns=1, seq=1), 5.0))
            for fut in (publish, delete):
                with pytest.raises(NotLeaderError) as refused:
                    await fut
                assert refused.value.details.get("leader") == target.name, refused.value
            await moved_to(nodes, target)
            await until(lambda: all(n.g.replica.store.state().msgs == MSGS for n in nodes.values()))

    run(scenario)


def test_a_waiting_pull_takes_nothing_that_commits_during_a_transfer(tmp_path: Path) -> None:
    """A message appended before the transfer commits while it is in progress (the target
    catches up, which is what lets it take over): the poller must not hand it out."""

    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead = leader_of(nodes)
            assert lead is not None
            target, other = (n for n in nodes.values() if n is not lead)
            await until(lambda: not any(lead.host.peer_lags(GROUP).values()))
            handle = await lead.g.open_pull("C", {"batch": 1, "expires": 30 * 10**9}, 30.0)
            # Appended on the leader only: its followers are cut off meanwhile.
            for n in (target, other):
                lead.net.set_down(n.name, True)  # type: ignore[union-attr]
            published = lead.g.submit_plain("q.v", b"during")
            await until(lambda: any(lead.host.peer_lags(GROUP).values()))  # appended
            assert lead.g.replica.store.state().msgs == 0  # not committed
            lead.host.transfer_leadership(GROUP, target.name)
            for n in (target, other):
                lead.net.set_down(n.name, False)  # type: ignore[union-attr]
            await moved_to(nodes, target)
            assert (await published).seq == 1
            got, statuses = await taken(handle)
            assert known_to(target, got) == []
            assert got == [] and statuses == ["Leadership Change"]
            again, _ = await taken(await target.g.open_pull("C", {"batch": 1}, 5.0))
            assert again == [(1, 1)]

    run(scenario)


def test_a_consumer_step_down_hands_over_the_deliveries_just_proposed(tmp_path: Path) -> None:
    """A pull decided just before the step-down: its Deliver op is still queued in the
    host when the transfer would start; ``handing_over`` waits for it first."""

    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead, target = await led_with_messages(nodes)
            handle = await lead.g.open_pull("C", PULL_ALL, 5.0)  # proposed, not yet taken
            async with lead.g.handing_over(5.0):
                lead.host.transfer_leadership(GROUP, target.name)
                await moved_to(nodes, target)
            got, _ = await taken(handle)
            assert got == [(s, 1) for s in range(1, MSGS + 1)]
            assert known_to(target, got) == []

    run(scenario)


def test_an_abandoned_transfer_lets_the_leader_decide_again(tmp_path: Path) -> None:
    """A transfer to a voter that is cut off is abandoned after an election timeout; the
    pull that waited for it is then served by the same leader, with the same copy, and its
    Deliver op commits."""

    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead, target = await led_with_messages(nodes)
            c = lead.g.leader_consumer("C")
            lead.net.set_down(target.name, True)  # type: ignore[union-attr]
            lead.host.transfer_leadership(GROUP, target.name)
            got, _ = await taken(await lead.g.open_pull("C", PULL_ALL, 5.0))
            assert got == [(s, 1) for s in range(1, MSGS + 1)]
            replica = lead.g.replica.consumers["C"]
            await until(
                lambda: (
                    replica.state.delivered_stream_seq == MSGS or c not in lead.g.led_consumers()
                )
            )
            assert c in lead.g.led_consumers()  # never dropped: nothing was refused
            assert lead.host.transferring(GROUP) is None
            lead.net.set_down(target.name, False)  # type: ignore[union-attr]

    run(scenario)


def test_a_transfer_without_handing_over_keeps_the_deliveries_just_proposed(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with stream_nodes(tmp_path, NAMES, CONSUMER) as nodes:
            lead, target = await led_with_messages(nodes)
            handle = await lead.g.open_pull("C", PULL_ALL, 5.0)  # proposed, not yet taken
            lead.host.transfer_leadership(GROUP, target.name)
            await moved_to(nodes, target)
            got, _ = await taken(handle)
            assert known_to(target, got) == []

    run(scenario)
