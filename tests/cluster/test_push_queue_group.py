"""A queue group's members share a push consumer's messages one at a time in turn
(docs/cli.md, ``sub --queue GROUP``: "share the messages with the other subscribers of
GROUP (they take turns)"; ``cluster/services/push.py``).

Regression: every Consume call attached to the consumer was woken on an apply, and the one
that ran first took what the apply brought (a step of up to 32 while several were attached):
a burst published at once, 20 messages from ``raftstream pub --count 20``, all went to one
member and none to the other; only messages published apart alternated.

A single in-process node (RaftHost over memory storage and transport, a real StreamGroup)
and two push sessions driving one leader copy, as two attached Consume calls do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raftstream.cluster.common.clock import SYSTEM_CLOCK
from raftstream.cluster.config import Limits
from raftstream.cluster.services.push import DEALT_MSGS_MAX, PushMembers, PushSession
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer_config import AckPolicy, ConsumerConfig
from tests.support.deliveries import delivery
from tests.support.polling import until
from tests.support.raft_hosts import run

from .one_node import one_node

BURST = 20
MS = 1_000_000


class Member:
    """One attached Consume call: its session, its driver, and the stream sequence of every
    message it sent, in order."""

    def __init__(self, g: StreamGroup, name: str) -> None:
        ctx: Any = SimpleNamespace(config=SimpleNamespace(limits=Limits()), clock=SYSTEM_CLOCK)
        self.g = g
        self.name = name
        self.session = PushSession(ctx, lambda *_: asyncio.sleep(0))
        self.waker = g.push_waker(name)
        self.driver = asyncio.ensure_future(
            self.session._drive(g, g.leader_consumer(name), self.waker, 5.0)
        )
        self.got: list[int] = []

    def take(self) -> int:
        """Collect what the session sent since the last call; how many messages so far."""
        out = self.session._out
        while not out.empty():
            self.got.extend(m.seq for m in out.get_nowait().messages)
        return len(self.got)

    async def detach(self) -> None:
        self.driver.cancel()
        await asyncio.gather(self.driver, return_exceptions=True)
        self.g.drop_push_waker(self.name, self.waker)


@contextlib.asynccontextmanager
async def queue_group(tmp_path: Path, ack_wait_ns: int = 0) -> AsyncIterator[list[Member]]:
    """Stream Q (R1) with the queue-group push consumer G and two members attached."""
    cfg = ConsumerConfig(
        durable_name="G",
        deliver_subject="d.g",
        deliver_group="G",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_ns,
    )
    async with one_node(tmp_path, cfg) as node:
        members = [Member(node.g, "G"), Member(node.g, "G")]
        await asyncio.sleep(0)  # both drivers start (and join) before anything is published
        try:
            yield members
        finally:
            for m in members:
                await m.detach()


async def burst(g: StreamGroup) -> None:
    """``BURST`` messages submitted at once: one Raft entry, one apply."""
    await asyncio.gather(*(g.submit_plain("q.a", b"m%d" % i) for i in range(BURST)))


def test_a_burst_is_shared_one_message_at_a_time_in_turn(tmp_path: Path) -> None:
    """20 messages in one batch: each member gets 10, every message once, each member's in
    stream order."""

    async def scenario() -> None:
        async with queue_group(tmp_path) as (a, b):
            await burst(a.g)
            await until(lambda: a.take() + b.take() == BURST)
            got_a, got_b = a.got, b.got
            assert sorted(got_a + got_b) == list(range(1, BURST + 1))
            assert abs(len(got_a) - len(got_b)) <= 1, (got_a, got_b)
            assert got_a == sorted(got_a) and got_b == sorted(got_b)

    run(scenario)


def test_what_a_leaving_member_held_goes_to_the_others_after_ack_wait(tmp_path: Path) -> None:
    """A member leaves without acking its share: after ack wait the member still attached
    gets those messages (redelivered), as before members took turns."""

    async def scenario() -> None:
        async with queue_group(tmp_path, ack_wait_ns=200 * MS) as (a, b):
            await burst(a.g)
            await until(lambda: a.take() + b.take() == BURST)
            held = set(b.got)
            assert held and not held & set(a.got)
            await b.detach()
            await until(lambda: a.take() > 0 and held <= set(a.got))

    run(scenario)


def test_a_member_with_a_full_backlog_is_passed_over() -> None:
    """A member holding ``DEALT_MSGS_MAX`` deliveries not yet sent (its client reads slowly)
    gets no more; the others keep their turns, and the dealer takes what nobody has room
    for, so nothing is left undealt."""
    ctx: Any = SimpleNamespace(config=SimpleNamespace(limits=Limits()), clock=SYSTEM_CLOCK)
    a, b, slow = (PushSession(ctx, lambda *_: asyncio.sleep(0)) for _ in range(3))
    group = PushMembers()
    for s in (a, b, slow):
        group.join(s)
    slow._dealt.extend(delivery(0, 1) for _ in range(DEALT_MSGS_MAX))
    group.deal([delivery(s, 1) for s in range(1, 7)], a)
    assert [d.stream_seq for d in a._dealt] == [1, 3, 5]
    assert [d.stream_seq for d in b._dealt] == [2, 4, 6]
    assert len(slow._dealt) == DEALT_MSGS_MAX
    b._dealt.extend(delivery(0, 1) for _ in range(DEALT_MSGS_MAX - 3))
    group.deal([delivery(s, 1) for s in range(7, 10)], a)
    assert [d.stream_seq for d in a._dealt] == [1, 3, 5, 7, 8, 9]
