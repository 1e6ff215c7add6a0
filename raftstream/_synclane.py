"""The sync publish lane: ``publish`` as one item on a ``PublishStream`` call of its own.

Why. A unary ``Publish`` pays, per message, a new HTTP/2 stream, its metadata, the server's
interceptors (auth, limits, latency) and error mapping, and several completion-queue events,
each a thread handoff in ``grpc.aio``: about 0.3 ms of client-to-leader latency and 300 us of
the leader's CPU on a 3-node cluster (measured with the cluster bench's ``sync`` part). An
item on an open ``PublishStream`` pays none of that.

Why a call of its own, not the ``publish_async`` one: a node answers a call's publishes in
the order they arrived, so a ``publish`` queued behind a full ``publish_async`` window would
wait for all of it.

One publish at a time. While one ``publish`` waits for its answer on the lane, a concurrent
``publish`` takes the unary RPC: behind the first it would wait for that one's answer too
(same ordering), which for another stream whose leader is stuck could be the whole proposal
timeout. Sequential publishers, the ones latency matters to, always find the lane free.

The lane is opened on the server the router picked for the attempt (``Router.call``) and
reopened when an attempt goes elsewhere (a leader hint), the call broke, or a publish stopped
waiting for its answer (timeout, cancellation: see ``_retire``). A server that does not
implement ``PublishStream`` (UNIMPLEMENTED) is remembered, and its publishes use the unary
RPC from then on; a node that refuses the call for its ``streaming_calls_max`` gets that
publish as a unary call (``LaneRefused``). Each item carries the time its publish has left
(``timeout_ns``): the node answers UNAVAILABLE ("not committed in time", a lost quorum) a
little before, as it does at a unary call's deadline, rather than leave the client to time
out with nothing said. Retries and hints stay the router's: an item's
refusal raises the same typed error the unary call would (NOT_LEADER with its hint,
preconditions, limits); a broken call or an answer not in time is ambiguous, exactly as a
unary call failing mid-way.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raftstream import errors
from raftstream._conn import Stubs
from raftstream._pipeline import Entry, Pipeline, streaming_refused
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import from_error_message

__all__ = ["SyncLane"]

NS_PER_S = 1_000_000_000
# One publish at a time (module docstring): a batch is one item, the queue needs room for one.
_LANE_QUEUE_MSGS_MAX = 1


class SyncLane:
    """The lane of one client; belongs to the client's event loop."""

    def __init__(self, *, result_timeout_s: float) -> None:
        self._result_timeout_s = result_timeout_s
        self._pipe: Pipeline | None = None
        self._addr = ""
        self._busy = False
        self._unsupported: set[str] = set()  # servers that answered UNIMPLEMENTED
        self._retired: set[asyncio.Task[None]] = set()

    def usable(self, stubs: Stubs) -> bool:
        """Whether a publish to ``stubs`` may take the lane now (free, and the server has
        ``PublishStream``)."""
        return not self._busy and stubs.addr not in self._unsupported

    async def publish(self, stubs: Stubs, req: pb.PublishRequest, left_s: float) -> pb.PubAck:
        """Send ``req`` on the lane to ``stubs`` and wait at most ``left_s`` for its answer.

        Raises the typed error of a refusal; ``DeadlineExceededError`` when no answer comes in
        time and the pipeline's error when the call breaks (both: outcome unknown); a
        ``NotImplementedLane`` when the server has no ``PublishStream`` (nothing applied)."""
        self._busy = True
        # The node answers UNAVAILABLE (not committed in time) a little before this, as it
        # does at a unary call's deadline (a lost quorum then says so).
        req.timeout_ns = int(left_s * NS_PER_S)
        try:
            pipe = self._open(stubs)
            fut: asyncio.Future[pb.PubAck] = asyncio.get_running_loop().create_future()
            pipe.submit(Entry(request=req, size_bytes=0, expects_result=True, future=fut))
            try:
                async with asyncio.timeout(left_s):
                    return await fut
            except errors.RaftStreamError as exc:  # the answer (DeadlineExceeded included)
                if exc.details.get("grpc_code") == "UNIMPLEMENTED":
                    self._unsupported.add(stubs.addr)
                    raise NotImplementedLane(str(exc)) from None
                raise
            except TimeoutError:  # the timeout's own: no answer in time
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    return fut.result()  # answered just as the time ran out
                self._retire()
                raise errors.DeadlineExceededError(
                    f"no answer from {stubs.addr} in the {left_s:.3f}s left of the call's"
                    " timeout; the outcome is unknown"
                ) from None
            except asyncio.CancelledError:
                self._retire()
                raise
        finally:
            self._busy = False

    def _open(self, stubs: Stubs) -> Pipeline:
        """The lane's pipeline to ``stubs.addr``: the open one, or a new one (the old one,
        dead or to another server, is closed). Nothing awaits between the check and the
        submit that follows, so a pipeline found alive here takes the item."""
        pipe = self._pipe
        if pipe is not None and not pipe.dead and self._addr == stubs.addr:
            return pipe
        self._retire()
        self._pipe = Pipeline(
            stubs.publish.PublishStream(),
            batch_of=lambda items: pb.PublishBatch(requests=items),
            results_of=lambda batch: [(r.id, r) for r in batch.results],
            on_result=_settle,
            on_failed=_fail,
            on_orphan=lambda result: None,  # an answer after its publish gave up waiting
            queue_msgs_max=_LANE_QUEUE_MSGS_MAX,
            batch_msgs_max=1,
            batch_bytes_max=1,
            result_timeout_s=self._result_timeout_s,
            name="publish-sync",
            addr=stubs.addr,
        )
        self._addr = stubs.addr
        return self._pipe

    def _retire(self) -> None:
        """Give up the lane's call (closed in the background), if any. Also when a publish
        stops waiting for its answer (its timeout, or its caller cancelled): the call still
        owes that answer, and a call's answers come in order, so the next publish would
        wait behind it (for a stuck stream, the whole result timeout); it gets a new call.
        Closing fails nothing anyone waits for: the abandoned publish's outcome is already
        unknown to its caller."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            task = asyncio.get_running_loop().create_task(pipe.close())
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    async def close(self) -> None:
        """Close the lane; a publish waiting on it fails with ``UnavailableError``."""
        if self._pipe is not None:
            await self._pipe.close()
        await asyncio.gather(*self._retired, return_exceptions=True)


class NotImplementedLane(errors.UnavailableError):
    """The server has no ``PublishStream``: the request was refused before anything was
    applied; the publisher sends it again with the unary RPC."""

    reason = "UNIMPLEMENTED_LANE"


class LaneRefused(NotImplementedLane):
    """The node refused the lane's call before its servicer ran: it has
    ``streaming_calls_max`` streaming calls open (docs/limits.md). Nothing was applied, and
    that limit does not count unary calls, so this publish goes as a unary call, as it did
    before the lane; the lane is tried again next time (a call may have closed)."""

    reason = "LANE_REFUSED"


def _settle(entry: Entry, result: Any) -> None:
    fut = entry.future
    if fut.done():  # the publish gave up waiting (its timeout): nobody reads this answer
        return
    if result.HasField("ack"):
        fut.set_result(result.ack)
    else:
        fut.set_exception(from_error_message(result.error))


def _fail(entry: Entry, exc: errors.RaftStreamError) -> None:
    """The lane's call ended without this publish's answer (ambiguous: see the module
    docstring), or was refused as a whole before anything was read (``LaneRefused``)."""
    if entry.future.done():
        return
    if streaming_refused(exc):
        exc = LaneRefused(str(exc))
    entry.future.set_exception(exc)
