"""``raftstream.msg.Acker``'s fire-and-forget path on a fake ``AckStream`` call.

The module docstring's promises that the per-message path must keep (it was made cheaper:
``Places`` instead of ``asyncio.Semaphore``, a deque instead of an ``asyncio.Queue``): at
most ``pending_msgs_max`` acks are queued or unwritten, a further ``ack()`` waits for room,
and the acks leave in the order they were made, batched, each with its token and kind.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftstream.msg import Acker, Msg
from raftstream.proto import raftstream_pb2 as pb


class GatedCall:
    """An accepted ``AckStream`` whose writes wait for ``gate``; notes what was written."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.written: list[list[tuple[str, int]]] = []
        self._ended = asyncio.get_running_loop().create_future()

    async def initial_metadata(self) -> tuple[()]:
        return ()

    def done(self) -> bool:
        return False

    async def write(self, batch: pb.AckBatch) -> None:
        await self.gate.wait()
        self.written.append([(a.reply, a.kind) for a in batch.acks])

    def __aiter__(self) -> GatedCall:
        return self

    async def __anext__(self) -> Any:
        return await self._ended  # no results: every ack succeeds

    def cancel(self) -> None:
        if not self._ended.done():
            self._ended.cancel()


class Router:
    """The part of ``raftstream._conn.Router`` the acker uses: one address."""

    def __init__(self, call: GatedCall) -> None:
        self.addr = "n1"
        self.consume = self
        self._call = call

    def AckStream(self) -> GatedCall:
        return self._call

    def target(self, stream: str) -> str:
        return self.addr

    async def call(self, stream: str, fn: Any, *, timeout_s: float, idempotent: bool) -> Any:
        return await fn(self, timeout_s)


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def test_acks_wait_for_room_and_leave_in_order() -> None:
    async def main() -> None:
        call = GatedCall()
        errors: list[Exception] = []
        acker = Acker(Router(call), timeout_s=5, pending_msgs_max=2, error_cb=errors.append)  # type: ignore[arg-type]
        msgs = [
            Msg(subject="s", data=b"", headers=None, reply=f"t.{i}", sender=acker, stream="S")
            for i in range(5)
        ]
        await msgs[0].ack()
        await msgs[1].nak()
        third = asyncio.ensure_future(msgs[2].ack())
        await _settle()
        assert not third.done()  # two unwritten: no room
        call.gate.set()
        await third
        for m in msgs[3:]:
            await m.term("done")
        await _settle()
        sent = [item for batch in call.written for item in batch]
        kinds = [
            pb.ACK_KIND_ACK,
            pb.ACK_KIND_NAK,
            pb.ACK_KIND_ACK,
            pb.ACK_KIND_TERM,
            pb.ACK_KIND_TERM,
        ]
        assert sent == [(f"t.{i}", kind) for i, kind in enumerate(kinds)]
        assert len(call.written) < len(sent)  # batched
        assert errors == []
        await acker.close(flush_timeout_s=1)

    asyncio.run(main())


class RunsCall(GatedCall):
    """Notes each write's runs too."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[list[tuple[str, str, list[int]]]] = []

    async def write(self, batch: pb.AckBatch) -> None:
        await super().write(batch)
        self.runs.append([(r.stream, r.consumer, list(r.stream_seqs)) for r in batch.runs])


def test_acks_of_fetched_messages_join_the_queued_run_of_their_consumer() -> None:
    """A message that knows its consumer and stream sequence (a fetched one) acks as a
    sequence of an ``AckRun``: acks made while a run is queued join it, each taking its own
    room; once the run is handed to a write, the next ack starts another. A message without
    them (no consumer known) acks with its token, as before."""

    async def main() -> None:
        call = RunsCall()
        errors: list[Exception] = []
        acker = Acker(Router(call), timeout_s=5, pending_msgs_max=3, error_cb=errors.append)  # type: ignore[arg-type]

        def fetched(seq: int, consumer: str = "C") -> Msg:
            return Msg(
                subject="s",
                data=b"",
                headers=None,
                reply=f"t.{seq}",
                sender=acker,
                stream="S",
                consumer=consumer,
                stream_seq=seq,
            )

        await fetched(1).ack()
        await fetched(2).ack()
        await fetched(3, "D").ack()
        fourth = asyncio.ensure_future(fetched(4).ack())
        await _settle()
        assert not fourth.done()  # three sequences queued: no room
        call.gate.set()
        await fourth
        await Msg(subject="s", data=b"", headers=None, reply="t.9", sender=acker, stream="S").ack()
        await _settle()
        assert call.runs[0] == [("S", "C", [1, 2]), ("S", "D", [3])]
        assert [run for runs in call.runs[1:] for run in runs] == [("S", "C", [4])]
        assert [item for batch in call.written for item in batch] == [("t.9", pb.ACK_KIND_ACK)]
        assert errors == []
        await acker.close(flush_timeout_s=1)

    asyncio.run(main())
