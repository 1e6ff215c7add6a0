"""A pipelined, batched bidirectional call: requests carry client-chosen ids, results name them.

Used for ``PublishStream`` (every request answered) and ``AckStream`` (only failed or sync
acks answered). One ``Pipeline`` owns one gRPC call and three tasks on the event loop that
created it: a writer that drains the send queue into batches (at most ``batch_msgs_max``
items and about ``batch_bytes_max`` bytes per write; items that arrive while a write is in
progress go out together in the next one), a reader that hands each result to its owner, and
a watchdog that gives up when a result is overdue by ``result_timeout_s``.

Failure: when the call ends for any reason (an error status, the server closing it, an
overdue result, ``close()``), every entry not yet answered is handed to ``on_failed`` with
the typed error, and the pipeline is ``dead``; the owner opens a new one for new requests.
For such entries the outcome is unknown (the server may have applied them before the call
broke), except where nothing can have reached the server: an entry never handed to a write
(``Entry.written`` false), and every entry of a call gRPC could not start at all ("failed
to connect to all addresses": the error is then ``NotConnectedError``). An owner may send
those again elsewhere.

Nothing is written before the server accepts the call (``raftstream.proto.calls``): a call
refused as a whole (NOT_LEADER from a node under repair, ``streaming_calls_max``,
authentication) then fails every entry unwritten, with the server's typed error, instead of
reading as a broken call.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from raftstream import errors
from raftstream._conn import RETRY_WAIT_INITIAL_S, RETRY_WAIT_MAX_S, not_sent
from raftstream.proto import calls
from raftstream.proto.errors import from_rpc_error

__all__ = ["Entry", "Pipeline", "streaming_refused", "wait_to_send_again"]

# After a failed write, how long to wait for the status the server ended the call with.
ENDED_STATUS_WAIT_S = 1.0
# An entry an owner sends again waits this long first, doubling per earlier try up to the
# max: the client's retry waits (_conn.py).
RESEND_WAIT_INITIAL_S = RETRY_WAIT_INITIAL_S
RESEND_WAIT_MAX_S = RETRY_WAIT_MAX_S


async def wait_to_send_again(tries: int, deadline: float, last: errors.RaftStreamError) -> None:
    """Before an owner sends an entry again (``tries`` times before): wait
    ``RESEND_WAIT_INITIAL_S`` doubled per try, up to ``RESEND_WAIT_MAX_S``; raises ``last``,
    the entry's latest failure, when that wait would pass its ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    wait_s = min(RESEND_WAIT_MAX_S, RESEND_WAIT_INITIAL_S * 2**tries)
    if loop.time() + wait_s >= deadline:
        raise last
    await asyncio.sleep(wait_s)


def streaming_refused(exc: errors.RaftStreamError) -> bool:
    """Whether a call was refused as a whole for the node's ``streaming_calls_max`` (nothing
    applied; that limit does not count unary calls, so the owner may send unary instead)."""
    return isinstance(exc, errors.LimitError) and exc.details.get("limit") == "streaming_calls_max"


@dataclass(slots=True, eq=False)
class Entry:
    """One request in a pipeline. ``request`` is the proto item (its ``id`` set by
    ``submit``); ``future`` belongs to the owner, who resolves it; ``context`` is the owner's.
    ``sent_at``: the loop time it was handed to a write (0.0: never, see ``written``)."""

    request: Any
    size_bytes: int
    expects_result: bool
    future: asyncio.Future[Any]
    context: Any = None
    id: int = 0
    sent_at: float = field(default=0.0)

    @property
    def written(self) -> bool:
        """Whether the entry was handed to a write (it may have reached the server)."""
        return self.sent_at > 0.0


class Pipeline:
    """See the module docstring. Not thread-safe; every method runs on the creating loop.

    ``batch_of(items)`` builds the request message from proto items; ``results_of(response)``
    yields ``(id, result)`` pairs; ``on_result(entry, result)`` and ``on_failed(entry, exc)``
    resolve entries (called on the loop, must not block); ``on_orphan(result)`` gets results
    whose id is not waited for (a failed fire-and-forget ack). Entries that do not expect a
    result are handed to ``on_result(entry, None)`` once written. ``addr``: the server the
    call goes to (named in a ``NotConnectedError``).
    """

    def __init__(
        self,
        call: Any,
        *,
        batch_of: Callable[[list[Any]], Any],
        results_of: Callable[[Any], Iterable[tuple[int, Any]]],
        on_result: Callable[[Entry, Any], None],
        on_failed: Callable[[Entry, errors.RaftStreamError], None],
        on_orphan: Callable[[Any], None],
        queue_msgs_max: int,
        batch_msgs_max: int,
        batch_bytes_max: int,
        result_timeout_s: float,
        name: str,
        addr: str = "",
    ) -> None:
        self._call = call
        self._addr = addr
        self._batch_of = batch_of
        self._results_of = results_of
        self._on_result = on_result
        self._on_failed = on_failed
        self._on_orphan = on_orphan
        # The send queue: a deque and an event rather than an asyncio.Queue, whose put and
        # get cost several times as much per message (this is every publish_async's and
        # every fire-and-forget ack's path).
        self._queue: collections.deque[Entry] = collections.deque()
        self._queued = asyncio.Event()
        self._queue_msgs_max = queue_msgs_max
        self._inflight: dict[int, Entry] = {}
        self._batch_msgs_max = batch_msgs_max
        self._batch_bytes_max = batch_bytes_max
        self._result_timeout_s = result_timeout_s
        self._ids = itertools.count(1)
        self._dead: errors.RaftStreamError | None = None
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop(), name=f"{name}-writer"),
            loop.create_task(self._read_loop(), name=f"{name}-reader"),
            loop.create_task(self._watchdog(), name=f"{name}-watchdog"),
        ]

    @property
    def dead(self) -> bool:
        return self._dead is not None

    def __len__(self) -> int:
        """Entries queued or awaiting their result."""
        return len(self._queue) + len(self._inflight)

    def submit(self, entry: Entry) -> None:
        """Queue ``entry`` for sending. Raises ``LimitError`` when ``queue_msgs_max`` entries
        are queued (owners bound their pending entries below that) and the pipeline's error
        when it is dead (nothing was sent)."""
        if self._dead is not None:
            raise self._dead
        entry.id = next(self._ids)
        entry.request.id = entry.id
        if len(self._queue) >= self._queue_msgs_max:
            raise errors.LimitError("pipeline send queue is full")
        self._queue.append(entry)
        self._queued.set()

    async def _take_batch(self) -> list[Entry]:
        """The next batch to write: waits for the first entry, then takes what is queued."""
        queue = self._queue
        while not queue:
            self._queued.clear()
            await self._queued.wait()
        first = queue.popleft()
        batch, size = [first], first.size_bytes
        while len(batch) < self._batch_msgs_max and size < self._batch_bytes_max and queue:
            entry = queue.popleft()
            batch.append(entry)
            size += entry.size_bytes
        return batch

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if not await self._accepted():
                return
            while True:
                batch = await self._take_batch()
                now = loop.time()
                for entry in batch:
                    # Registered before the write: a result may arrive before write returns,
                    # and a failed write fails every entry of the batch through _fail.
                    entry.sent_at = now
                    self._inflight[entry.id] = entry
                await self._call.write(self._batch_of([e.request for e in batch]))
                for entry in batch:
                    if not entry.expects_result:
                        del self._inflight[entry.id]
                        self._on_result(entry, None)
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as err:
            self._fail(await self._ended_with() or not_sent(err, self._addr) or from_rpc_error(err))
        except Exception as exc:  # the call broke under the write (e.g. already finished)
            self._fail(
                await self._ended_with() or errors.UnavailableError(f"stream write failed: {exc!r}")
            )

    async def _accepted(self) -> bool:
        """Whether the server accepted the call (``calls.accepted``); when it refused the
        call instead, the pipeline is failed with the refusal (nothing was written)."""
        if await calls.accepted(self._call):
            return True
        self._fail(
            await self._ended_with()
            or errors.UnavailableError("the server ended the call before accepting it")
        )
        return False

    async def _ended_with(self) -> errors.RaftStreamError | None:
        """The status the server ended the call with, when a write failed because it had
        (it refused the call at once: UNIMPLEMENTED, or NOT_LEADER with the leader's
        address). The write's own error says only that the call broke, which hides the
        answer (under load a lane publish was failed as "connection broke" instead of
        falling back to the unary call, or following the hint); None when the call did not
        end with one in ``ENDED_STATUS_WAIT_S``."""
        try:
            async with asyncio.timeout(ENDED_STATUS_WAIT_S):
                code = await self._call.code()
            if code is None or code == grpc.StatusCode.OK:
                return None
            err = grpc.aio.AioRpcError(
                code,
                await self._call.initial_metadata(),
                await self._call.trailing_metadata(),
                await self._call.details(),
            )
        except (TimeoutError, grpc.RpcError):
            return None
        return not_sent(err, self._addr) or from_rpc_error(err)

    async def _read_loop(self) -> None:
        try:
            async for response in self._call:
                for rid, result in self._results_of(response):
                    entry = self._inflight.pop(rid, None)
                    if entry is None:
                        self._on_orphan(result)
                    else:
                        self._on_result(entry, result)
            self._fail(errors.UnavailableError("the server ended the stream"))
        except asyncio.CancelledError:
            raise
        except grpc.RpcError as err:
            self._fail(not_sent(err, self._addr) or from_rpc_error(err))

    async def _watchdog(self) -> None:
        loop = asyncio.get_running_loop()
        period_s = self._result_timeout_s / 4
        while self._dead is None:
            await asyncio.sleep(period_s)
            oldest = min((e.sent_at for e in self._inflight.values()), default=None)
            if oldest is not None and loop.time() - oldest > self._result_timeout_s:
                self._fail(
                    errors.DeadlineExceededError(
                        f"no result within {self._result_timeout_s:.3f}s; outcome unknown"
                    )
                )

    def _fail(self, exc: errors.RaftStreamError) -> None:
        """End the pipeline: cancel the call and hand every unanswered entry to on_failed."""
        if self._dead is not None:
            return
        self._dead = exc
        self._call.cancel()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        entries = list(self._inflight.values())
        self._inflight.clear()
        entries.extend(self._queue)
        self._queue.clear()
        for entry in entries:
            self._on_failed(entry, exc)

    async def drain(self, *, timeout_s: float, poll_s: float = 0.005) -> None:
        """Wait, at most ``timeout_s``, until every queued entry is written and every written
        one answered, then ``close()``: whatever is still unanswered fails as there."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._dead is None and len(self) > 0 and loop.time() < deadline:
            await asyncio.sleep(poll_s)
        await self.close()

    async def close(self) -> None:
        """Cancel the call now; unanswered entries fail with ``UnavailableError``."""
        self._fail(errors.UnavailableError("the pipeline was closed"))
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
