"""Mirror and source tests' helpers: publishing with a msg id until acknowledged, reading a
stream whole, waiting for a link to settle or catch up, and checking that a source holds
every origin message exactly once (the ``Nats-Stream-Source`` header names origin and
sequence)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import raftstream
from raftstream import errors
from tests.support.polling import NeverHappened, retry_async, until

__all__ = [
    "HDR",
    "SETTLE_TIMEOUT_S",
    "assert_exactly_once",
    "messages",
    "origin_of",
    "publish",
    "settled",
    "wait_copied",
]

HDR = "Nats-Stream-Source"
SETTLE_TIMEOUT_S = 60.0
SETTLE_POLL_S = 0.1


async def publish(js: raftstream.Client, subject: str, i: int) -> None:
    """Publish message ``i`` with a msg id, retrying with the SAME id until acknowledged."""
    await retry_async(lambda: js.publish(f"{subject}.{i % 5}", b"m%d" % i, msg_id=f"m{i}"))


async def messages(js: raftstream.Client, stream: str) -> dict[int, raftstream.RawStreamMsg]:
    """Every message of ``stream`` by sequence (gaps left out)."""
    info = await js.stream_info(stream)
    out = {}
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            out[seq] = await js.get_msg(stream, seq)
        except errors.NotFoundError:
            continue
    return out


async def settled(pred: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``pred`` (errors retried) until it holds; fail after SETTLE_TIMEOUT_S."""
    await until(
        pred,
        what=what,
        timeout_s=SETTLE_TIMEOUT_S,
        interval_s=SETTLE_POLL_S,
        retrying=(Exception,),
    )


async def wait_copied(js: raftstream.Client, stream: str, origin_seq: int) -> None:
    """Poll until ``stream``'s link reports ``origin_seq`` as its last copied origin seq."""

    async def copied() -> bool:
        info = await js.stream_info(stream)
        links = (info.mirror,) if info.mirror is not None else info.sources
        return bool(links) and all(s.last_origin_seq >= origin_seq for s in links)

    try:
        await settled(copied, f"{stream} to copy up to origin seq {origin_seq}")
    except NeverHappened as never:
        info = await js.stream_info(stream)
        raise AssertionError(f"{stream} did not catch up to {origin_seq}: {info}") from never


def origin_of(m: raftstream.RawStreamMsg) -> tuple[str, int]:
    name, seq = m.headers[HDR].split()[:2]
    return name, int(seq)


def assert_exactly_once(
    copies: dict[int, raftstream.RawStreamMsg],
    origin: dict[int, raftstream.RawStreamMsg],
    name: str,
) -> None:
    seen = [origin_of(m) for m in copies.values()]
    assert all(n == name for n, _ in seen)
    seqs = [s for _, s in seen]
    assert seqs == sorted(origin), "every origin message exactly once, in order"
    for m in copies.values():
        o = origin[origin_of(m)[1]]
        assert (m.subject, m.data) == (o.subject, o.data)
