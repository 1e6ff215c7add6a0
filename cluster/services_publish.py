"""``raftstream.v1.PublishService``: unary ``Publish`` and pipelined ``PublishStream``.

A publish finds its stream by subject (the meta state, in the caller's account), then is
stored by the stream leader: on this node when it leads, else forwarded one hop to it (a
forwarded publish that meets a non-leader answers NOT_LEADER with the hint, never forwards
again). Either way the answer is the leader's PubAck, sent after commit: the message is
fsynced on a quorum (see ``cluster/stream_leader.py``).

``PublishStream`` reads batches while earlier publishes are in flight (at most
``publish_async_pending_max`` per call: reading stops until one is answered) and answers
every request exactly once, in the order received, grouping answers that are ready into one
``PublishResultBatch``. A failed publish is an ``Error`` result; the call goes on.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from typing import Any

from raftstream.cluster.assignments import StreamAssignment
from raftstream.cluster.context import ServiceContext, account_of, time_left
from raftstream.errors import InvalidArgumentError, LimitError, NotFoundError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto.errors import map_errors, to_error_message

__all__ = ["PublishServicer"]

_PUBLISH = "/raftstream.v1.PublishService/Publish"


def publish_args(req: pb.PublishRequest) -> dict[str, Any]:
    """The engine ``Publish`` fields of a request (the leader adds its time stamp)."""
    return {
        "subject": req.subject,
        "data": req.data,
        "headers": dict(req.headers),
        "msg_id": req.msg_id or None,
        "expected_stream": req.expected_stream if req.HasField("expected_stream") else None,
        "expected_last_seq": (req.expected_last_seq if req.HasField("expected_last_seq") else None),
        "expected_last_subject_seq": (
            req.expected_last_subject_seq if req.HasField("expected_last_subject_seq") else None
        ),
        "expected_last_subject_seq_subject": (
            req.expected_last_subject_seq_subject
            if req.HasField("expected_last_subject_seq_subject")
            else None
        ),
        "expected_last_msg_id": (
            req.expected_last_msg_id if req.HasField("expected_last_msg_id") else None
        ),
        "ttl_ns": req.ttl_ns or None,
    }


class PublishServicer(pbg.PublishServiceServicer):
    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    async def publish_one(
        self, req: pb.PublishRequest, account: str, timeout_s: float | None, forwarded: bool
    ) -> pb.PubAck:
        """Store one message through its stream's leader; the PubAck or the typed error."""
        ctx = self._ctx
        if not req.subject:
            raise InvalidArgumentError("subject", "is required")
        if len(req.data) > ctx.config.limits.max_payload_bytes:
            raise LimitError(
                f"payload of {len(req.data)} bytes exceeds max_payload_bytes",
                field="data",
                limit="max_payload_bytes",
            )

        def lookup() -> StreamAssignment:
            sa = ctx.meta.state.stream_for_subject(account, req.subject)
            if sa is None:
                raise NotFoundError(f"no stream captures subject {req.subject!r}", field="subject")
            return sa

        sa = await ctx.caught_up(lookup)
        g = ctx.local_group(sa)
        if g is not None and g.is_leader:
            ack = await g.publish(publish_args(req), timeout_s)
            return pb.PubAck(stream=ack.stream, seq=ack.seq, duplicate=ack.duplicate)
        if forwarded:
            raise ctx.hint_for(sa)
        return await ctx.to_stream_leader(sa, _PUBLISH, req, pb.PubAck.FromString, timeout_s)

    @map_errors
    async def Publish(self, request: pb.PublishRequest, context: Any) -> pb.PubAck:
        forwarded = self._ctx.forwarded(context)
        return await self.publish_one(request, account_of(context), time_left(context), forwarded)

    async def _result(
        self, req: pb.PublishRequest, account: str, forwarded: bool
    ) -> pb.PublishResult:
        timeout_s = self._ctx.config.limits.request_timeout_ms / 1000
        try:
            ack = await self.publish_one(req, account, timeout_s, forwarded)
        except Exception as exc:  # every outcome is one result; the call goes on
            return pb.PublishResult(id=req.id, error=to_error_message(exc))
        return pb.PublishResult(id=req.id, ack=ack)

    @map_errors
    async def PublishStream(
        self, request_iterator: AsyncIterator[pb.PublishBatch], context: Any
    ) -> AsyncIterator[pb.PublishResultBatch]:
        account = account_of(context)
        forwarded = self._ctx.forwarded(context)
        room = asyncio.Semaphore(self._ctx.config.limits.publish_async_pending_max)
        inflight: collections.deque[asyncio.Task[pb.PublishResult] | None] = collections.deque()
        more = asyncio.Event()

        async def reader() -> None:
            try:
                async for batch in request_iterator:
                    for req in batch.requests:
                        await room.acquire()
                        inflight.append(
                            asyncio.ensure_future(self._result(req, account, forwarded))
                        )
                        more.set()
            finally:
                inflight.append(None)  # end of input
                more.set()

        task = asyncio.get_running_loop().create_task(reader())
        try:
            async for out in _answers(inflight, more, room):
                yield out
        finally:
            task.cancel()
            for t in inflight:
                if t is not None:
                    t.cancel()


async def _answers(
    inflight: collections.deque[asyncio.Task[pb.PublishResult] | None],
    more: asyncio.Event,
    room: asyncio.Semaphore,
) -> AsyncIterator[pb.PublishResultBatch]:
    """Results in request order; the ready ones after the head go in the same batch."""
    while True:
        while not inflight:
            more.clear()
            await more.wait()
        head = inflight[0]
        if head is None:
            return
        results = [await head]
        inflight.popleft()
        room.release()
        while inflight and inflight[0] is not None and inflight[0].done():
            t = inflight.popleft()
            room.release()
            if t is not None:
                results.append(t.result())
        yield pb.PublishResultBatch(results=results)
