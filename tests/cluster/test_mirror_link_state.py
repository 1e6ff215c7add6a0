"""Integration: the link state ``stream info`` shows for mirrors and sources
(docs/mirrors.md, "Stream info": lag, error, skipped), on one real node.

- lag is the origin messages not copied yet: a new mirror of a non-empty origin never shows
  a plain 0 before it caught up (nor less than what is left), and a source stuck on its own
  ``max_msgs`` with ``discard: new`` shows what it could not copy, with a plain error that
  stays while the link retries;
- an origin that was never reached shows an error from the start (its lag is not known);
- an origin created with ``first_seq`` has no skipped range below it;
- an origin deleted and created again is reported as the link's error, not copied.

Waits poll; nothing asserts on timing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator

import pytest

import raftstream
from raftstream.config import ExternalStream, StreamSource
from raftstream.models import StreamSourceInfo
from tests.support.cluster import LocalCluster, free_port, run, running
from tests.support.polling import NeverHappened, retry_async, until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTLE_TIMEOUT_S = 60.0
STEADY_POLLS = 15  # stream infos in a row that must agree while a link retries
STEADY_POLL_S = 0.2
BIG_ORIGIN_MSGS = 20_000
PRIVATE_NAME = re.compile(r"^_\w*:")


@pytest.fixture(scope="module")
def node() -> Iterator[LocalCluster]:
    with running(LocalCluster(1)) as c:
        yield c


async def _link(js: raftstream.Client, stream: str) -> StreamSourceInfo:
    info = await retry_async(lambda: js.stream_info(stream))
    link = info.mirror if info.mirror is not None else info.sources[0]
    assert link is not None
    return link


async def _until(
    js: raftstream.Client, stream: str, check: Callable[[StreamSourceInfo], bool], what: str
) -> StreamSourceInfo:
    """Poll ``stream``'s (first) link until ``check(link)`` holds; fail after the timeout."""
    link: StreamSourceInfo = await until(
        lambda: _link(js, stream),
        what=f"{stream}: {what}",
        accept=check,
        timeout_s=SETTLE_TIMEOUT_S,
        interval_s=0.05,
    )
    return link


def test_a_new_mirror_never_shows_lag_0_before_it_caught_up(node: LocalCluster) -> None:
    """Lag: origin messages not copied yet, set from the consumer's num_pending and then
    only from what committed; never a plain 0 while the link has learnt nothing."""

    async def body() -> None:
        js = await raftstream.connect(servers=node.servers, timeout=20)
        try:
            await js.add_stream(raftstream.StreamConfig(name="BIG", subjects=("big.>",)))
            for i in range(BIG_ORIGIN_MSGS):
                await js.publish_async(f"big.{i % 7}", b"x")
            await js.publish_async_completed(timeout=SETTLE_TIMEOUT_S)
            total = (await js.stream_info("BIG")).state.last_seq
            assert total == BIG_ORIGIN_MSGS
            await js.add_stream(
                raftstream.StreamConfig(name="BIGM", mirror=StreamSource(name="BIG"))
            )
            seen = []

            async def caught_up() -> bool:
                link = await _link(js, "BIGM")
                seen.append((link.last_origin_seq, link.lag, link.error))
                left = total - link.last_origin_seq
                if left == 0 and link.lag == 0 and link.error is None:
                    return True
                if link.error is None:
                    # A known lag counts at least what is not stored yet (the origin
                    # takes no publishes, so it is exact once the lag caught up).
                    assert link.lag >= left, f"lag below what is left: {seen[-5:]}"
                else:
                    assert not PRIVATE_NAME.match(link.error), link.error
                assert left == 0 or link.lag > 0 or link.error, f"a plain lag 0: {seen}"
                return False

            try:  # every sample checked, none skipped: no pause between them
                await until(caught_up, timeout_s=SETTLE_TIMEOUT_S, interval_s=0)
            except NeverHappened as never:
                raise AssertionError(f"not caught up: {seen}") from never
            assert len(seen) > 1, "stream info was asked while the mirror copied"
        finally:
            await js.close()

    run(body())


def test_a_source_stuck_on_its_own_limits_shows_what_it_did_not_copy(node: LocalCluster) -> None:
    """`stream add SFULL --source EU --max-msgs 5 --discard new`, EU holding 31 messages:
    5 copied, lag 26, and the refusal as a plain sentence that stays while it retries."""

    async def body() -> None:
        js = await raftstream.connect(servers=node.servers, timeout=20)
        try:
            await js.add_stream(raftstream.StreamConfig(name="EU", subjects=("eu.>",)))
            for i in range(31):
                await js.publish("eu.x", b"%d" % i)
            await js.add_stream(
                raftstream.StreamConfig(
                    name="SFULL", sources=(StreamSource(name="EU"),), max_msgs=5, discard="new"
                )
            )
            await _until(
                js,
                "SFULL",
                lambda s: s.last_origin_seq == 5 and s.error is not None,
                "5 copied and the refusal reported",
            )
            for _ in range(STEADY_POLLS):
                link = await _link(js, "SFULL")
                assert link.last_origin_seq == 5
                assert link.lag == 26, "the origin messages not copied"
                assert link.error == (
                    "copy refused: maximum messages exceeded (the stream's max_msgs with "
                    "discard new)"
                ), "a plain sentence, shown until a batch commits"
                await asyncio.sleep(STEADY_POLL_S)
            assert (await js.stream_info("SFULL")).state.messages == 5
        finally:
            await js.close()

    run(body())


def test_an_origin_never_reached_shows_an_error_from_the_start(node: LocalCluster) -> None:
    """Lag not known (the origin was never reached): 0 with an error, never a plain 0."""

    async def body() -> None:
        js = await raftstream.connect(servers=node.servers, timeout=20)
        try:
            nowhere = ExternalStream(api=(f"127.0.0.1:{free_port()}",))
            await js.add_stream(
                raftstream.StreamConfig(
                    name="LOST", sources=(StreamSource(name="GONE", external=nowhere),)
                )
            )
            for _ in range(STEADY_POLLS):
                link = await _link(js, "LOST")
                assert link.lag == 0 and link.active_ns == -1
                assert link.error, "an unknown lag is shown with an error saying why"
                assert not PRIVATE_NAME.match(link.error), link.error
                await asyncio.sleep(STEADY_POLL_S)
            link = await _until(
                js,
                "LOST",
                lambda s: s.error is not None and s.error.startswith("NotConnectedError: "),
                "the connection's error",
            )
            assert link.lag == 0 and link.last_origin_seq == 0
        finally:
            await js.close()

    run(body())


def test_an_origin_with_first_seq_has_nothing_skipped_below_it(node: LocalCluster) -> None:
    """`stream add FS --first-seq 1000; pub fs.a x --count 3; stream add FSM --mirror FS`:
    sequences 1..999 never existed, so nothing is skipped (docs/mirrors.md, Skipped)."""

    async def body() -> None:
        js = await raftstream.connect(servers=node.servers, timeout=20)
        try:
            await js.add_stream(
                raftstream.StreamConfig(name="FS", subjects=("fs.>",), first_seq=1000)
            )
            for _ in range(3):
                await js.publish("fs.a", b"x")
            await js.add_stream(raftstream.StreamConfig(name="FSM", mirror=StreamSource(name="FS")))
            link = await _until(
                js, "FSM", lambda s: s.last_origin_seq == 1002 and s.lag == 0, "copied"
            )
            assert (link.skipped, link.skipped_msgs) == ((), 0)
            assert link.error is None
            state = (await js.stream_info("FSM")).state
            assert (state.first_seq, state.last_seq, state.messages) == (1000, 1002, 3)
        finally:
            await js.close()

    run(body())


def test_an_origin_created_again_is_reported_not_copied(node: LocalCluster) -> None:
    """An origin deleted and created again (its sequences below the copied position) is
    not copied (docs/mirrors.md, Left out), and the link says so instead of looking
    healthy."""

    async def body() -> None:
        js = await raftstream.connect(servers=node.servers, timeout=20)
        try:
            await js.add_stream(raftstream.StreamConfig(name="AGAIN", subjects=("again.>",)))
            for i in range(10):
                await js.publish("again.x", b"%d" % i)
            await js.add_stream(
                raftstream.StreamConfig(name="AGAINM", mirror=StreamSource(name="AGAIN"))
            )
            await _until(js, "AGAINM", lambda s: s.last_origin_seq == 10, "copied")
            await js.delete_stream("AGAIN")
            await js.add_stream(raftstream.StreamConfig(name="AGAIN", subjects=("again.>",)))
            for i in range(5):
                await js.publish("again.x", b"new %d" % i)
            await _until(
                js,
                "AGAINM",
                lambda s: s.error is not None and "went back" in s.error,
                "the origin's reset reported",
            )
            for _ in range(STEADY_POLLS):
                link = await _link(js, "AGAINM")
                assert link.error is not None
                assert link.error.startswith(
                    "origin AGAIN went back: its last sequence is 5, below the 10 copied"
                ), link.error
                assert link.last_origin_seq == 10 and link.lag == 5
                await asyncio.sleep(STEADY_POLL_S)
            assert (await js.stream_info("AGAINM")).state.messages == 10, "nothing copied"
        finally:
            await js.close()

    run(body())
