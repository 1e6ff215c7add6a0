"""Closing a stream group's links is bounded (a user review: stopping a whole cluster at
once took 6-6.6 s per node, a mirror link waiting about 4 s for its origin, stopping too, to
delete the consumer the link made there). ``LinkSet.close`` waits ``LINK_CLOSE_WAIT_S`` for
its links' sessions to end, then abandons their cleanup; a cleanup that ends in time is
waited for whole."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from raftstream.cluster.mirrors import link as mirror
from raftstream.cluster.mirrors import links as mirror_links
from raftstream.cluster.mirrors.links import LINK_CLOSE_WAIT_S, LinkSet
from raftstream.engine.stream_config import StreamConfig
from raftstream.engine.stream_source import StreamSource


def _links() -> LinkSet:
    return LinkSet(
        host=object(),  # type: ignore[arg-type]  # the sessions below never use it
        account="$G",
        stream="M",
        servers=lambda: ("127.0.0.1:1",),
        log_extra={"group": "S:$G:M"},
    )


def _mirror_of(origin: str) -> StreamConfig:
    return StreamConfig(name="M", mirror=StreamSource(name=origin))


def test_a_cleanup_against_an_origin_that_does_not_answer_is_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session's cleanup waits on the origin (here: 30 s, and a cancelled wait is
    retried once, as a best-effort delete may): close returns soon after the bound, and the
    session has ended."""
    sessions: list[asyncio.Task[Any]] = []

    async def session(self: mirror.MirrorLink) -> None:
        task = asyncio.current_task()
        assert task is not None
        sessions.append(task)
        try:
            await asyncio.sleep(3600)  # copying
        finally:
            try:
                await asyncio.sleep(30)  # deleting its consumer on a stopped origin
            except asyncio.CancelledError:
                await asyncio.sleep(30)  # one more try

    monkeypatch.setattr(mirror.MirrorLink, "_session", session)

    async def body() -> float:
        links = _links()
        links.sync(_mirror_of("O"))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await links.close()
        took = loop.time() - start
        assert len(sessions) == 1 and sessions[0].done()
        return took

    took = asyncio.run(body())
    # Cut short: the cleanup alone would take 30 s and more (no tighter bound on timing,
    # on a shared machine).
    assert LINK_CLOSE_WAIT_S <= took < 25, took


def test_a_cleanup_that_ends_in_time_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against an origin that answers, the cleanup (deleting the consumer) completes: close
    does not cut it short. Links a leadership loss stopped before are waited for too."""
    cleaned: list[str] = []

    async def session(self: mirror.MirrorLink) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.05)
            cleaned.append(self.source.name)

    monkeypatch.setattr(mirror.MirrorLink, "_session", session)

    async def body() -> None:
        links = _links()
        links.sync(_mirror_of("O1"))
        await asyncio.sleep(0.01)
        links.stop_all()  # leadership lost: stopping in the background
        links.sync(_mirror_of("O2"))  # and led again, with another origin
        await asyncio.sleep(0.01)
        await links.close()
        assert sorted(cleaned) == ["O1", "O2"]

    asyncio.run(body())


def test_a_session_that_never_ends_does_not_hold_close_forever(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A cleanup that swallows every cancellation: close gives up after its tries, with a
    warning naming the link, rather than holding the node's stop."""
    monkeypatch.setattr(mirror_links, "ABANDON_TRIES_MAX", 3)
    release = asyncio.Event()

    async def session(self: mirror.MirrorLink) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            while not release.is_set():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)

    monkeypatch.setattr(mirror.MirrorLink, "_session", session)

    async def body() -> None:
        links = _links()
        links.sync(_mirror_of("O"))
        await asyncio.sleep(0.01)
        await links.close()
        release.set()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    asyncio.run(body())
    assert any("did not end; closing anyway" in r.getMessage() for r in caplog.records)
