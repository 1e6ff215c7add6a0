"""Proxied TCP connections: one link per direction, each a pipeline of toxic stages.

    client --reader--> [stage 0] -> [stage 1] -> ... --writer--> upstream     (upstream link)
    client <--writer-- ... <- [stage 1] <- [stage 0] <--reader-- upstream     (downstream link)

A stage runs one toxic (``toxics.py``) as an asyncio task. Stages find their successor when
they emit, so toxics can be added (at the end), updated and removed on live links without
rewiring anything, and without losing or reordering a byte: the item a stage holds and its
queued input go to its successor, ahead of anything its predecessor sends later.

Memory is bounded per link by a byte budget: the reader takes budget before it reads, the
writer (or a toxic that drops data) gives it back. Queues between stages are therefore
bounded by the budget rather than by a count, so putting into one never blocks, which is
what lets every change to a chain happen synchronously, with no await in between.

Everything here belongs to one event loop, the one the proxy server runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raftstream.chaos.toxics import Chunk, End, Item, Toxic, noop_pipe

__all__ = ["Connection", "LinkLimits", "ToxicSpec"]

UPSTREAM = "upstream"
DOWNSTREAM = "downstream"


@dataclass(frozen=True, slots=True)
class ToxicSpec:
    """One toxic as configured on a proxy (name unique across both directions)."""

    name: str
    stream: str  # as given by the client; ``direction`` is its normalised form
    direction: str
    toxicity: float
    toxic: Toxic


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkLimits:
    """Per-link buffer limits. ``inflight_bytes_max`` must be at least ``read_chunk_bytes``.

    The in-flight budget also caps a delayed link's throughput: with ``latency`` L, at most
    ``inflight_bytes_max`` per L (1 MiB per 100 ms is about 10 MB/s).
    """

    read_chunk_bytes: int = 32 * 1024
    inflight_bytes_max: int = 1024 * 1024

    def __post_init__(self) -> None:
        # The reader takes a whole read's worth of budget before reading: a smaller budget
        # would block it forever.
        if not 0 < self.read_chunk_bytes <= self.inflight_bytes_max:
            raise ValueError(f"need 0 < read_chunk_bytes <= inflight_bytes_max: {self}")


class ByteBudget:
    """Bytes a link may hold between reading its source and writing its destination."""

    def __init__(self, limit_bytes: int) -> None:
        self._free_bytes = limit_bytes
        self._waiter: asyncio.Future[None] | None = None

    async def acquire(self, n_bytes: int) -> None:
        """Wait until ``n_bytes`` are free and take them. One acquirer at a time (the reader)."""
        while self._free_bytes < n_bytes:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._free_bytes -= n_bytes

    def release(self, n_bytes: int) -> None:
        """Give back ``n_bytes`` (written, dropped, or read short)."""
        self._free_bytes += n_bytes
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class ChunkQueue:
    """FIFO of items into one stage (or the writer); bounded by the link's byte budget.

    Once closed (its consumer has passed the end of stream on), items put into it are
    discarded and their bytes returned to the budget.
    """

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self._items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, item: Item, *, front: bool = False) -> None:
        """Append ``item`` (or put it back at the front); never blocks."""
        if self.closed:
            self._discard(item)
            return
        if front:
            self._items.appendleft(item)
        else:
            self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> Item:
        """Wait for and remove the first item. Cancel-safe: a cancelled get removes nothing."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def take_all(self) -> list[Item]:
        """Remove and return every queued item, oldest first."""
        items = list(self._items)
        self._items.clear()
        return items

    def close(self) -> None:
        """Discard what is queued and everything put from now on."""
        self.closed = True
        for item in self.take_all():
            self._discard(item)

    def _discard(self, item: Item) -> None:
        if isinstance(item, Chunk):
            self._budget.release(len(item.data))


class Stage:
    """Runs one toxic on one link. Implements ``toxics.ToxicStub``."""

    def __init__(self, link: Link, spec: ToxicSpec) -> None:
        self.link = link
        self.spec = spec
        self.inbox = ChunkQueue(link.budget)
        self.held: Item | None = None
        self.transmitted_bytes = 0
        self.active = False  # the toxicity draw of the current run
        self.finished = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Draw the toxicity and run the toxic (or a pass-through if the draw says no)."""
        self.active = self.link.rng.random() < self.spec.toxicity
        pipe = self.spec.toxic.pipe(self, self.link.rng) if self.active else noop_pipe(self)
        self._task = asyncio.get_running_loop().create_task(pipe)
        self._task.add_done_callback(self.link.report_task_error)

    def stop(self) -> Item | None:
        """Cancel the toxic and return the item it held, if any (the caller owns it now).

        Safe without awaiting the task: once cancelled it runs no code that emits.
        """
        if self._task is not None:
            self._task.cancel()
            self._task = None
        held, self.held = self.held, None
        return held

    # ToxicStub
    def now_s(self) -> float:
        return self.link.loop.time()

    async def take(self) -> Item:
        item = await self.inbox.get()
        self.held = item
        return item

    def emit(self, chunk: Chunk, rest: Chunk | None = None) -> None:
        self.held = rest
        self.link.inbox_after(self).put(chunk)

    def drop(self, chunk: Chunk) -> None:
        if self.held is chunk:
            self.held = None
        self.link.budget.release(len(chunk.data))

    def finish(self, end: End) -> None:
        self.finished = True
        if isinstance(self.held, Chunk):
            self.drop(self.held)
        self.held = None
        self.inbox.close()
        self.link.inbox_after(self).put(end)


class Link:
    """One direction of a connection: reader, toxic stages, writer."""

    def __init__(
        self,
        *,
        direction: str,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        conn: Connection,
        limits: LinkLimits,
        rng: random.Random,
    ) -> None:
        self.direction = direction
        self.loop = asyncio.get_running_loop()
        self.rng = rng
        self.budget = ByteBudget(limits.inflight_bytes_max)
        self.sink = ChunkQueue(self.budget)
        self.stages: list[Stage] = []
        self.done = asyncio.Event()
        self._source = source
        self._dest = dest
        self._conn = conn
        self._limits = limits
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, specs: Sequence[ToxicSpec]) -> None:
        """Start the toxics in chain order, then the reader and the writer."""
        for spec in specs:
            self.add_toxic(spec)
        for coro in (self._read(), self._write()):
            task = self.loop.create_task(coro)
            task.add_done_callback(self.report_task_error)
            self._tasks.append(task)

    def cancel(self) -> None:
        """Stop every task of the link (the connection is being torn down)."""
        for stage in self.stages:
            stage.stop()
        for task in self._tasks:
            task.cancel()

    def inbox_after(self, stage: Stage | None) -> ChunkQueue:
        """The queue that receives what ``stage`` emits (None: what the reader reads)."""
        index = 0 if stage is None else self.stages.index(stage) + 1
        return self.stages[index].inbox if index < len(self.stages) else self.sink

    def add_toxic(self, spec: ToxicSpec) -> None:
        """Append a toxic to the end of the chain; it applies to bytes not yet past the end."""
        stage = Stage(self, spec)
        self.stages.append(stage)
        stage.start()

    def update_toxic(self, spec: ToxicSpec) -> None:
        """Restart the toxic named ``spec.name`` with new settings and a new toxicity draw."""
        for stage in self.stages:
            if stage.spec.name == spec.name and not stage.finished:
                held = stage.stop()
                if held is not None:
                    stage.inbox.put(held, front=True)
                stage.spec = spec
                stage.start()

    def remove_toxic(self, name: str) -> None:
        """Take a toxic out of the chain, handing what it holds to its successor."""
        for stage in list(self.stages):
            if stage.spec.name != name:
                continue
            successor = self.inbox_after(stage)
            held = stage.stop()
            pending = ([held] if held is not None else []) + stage.inbox.take_all()
            self.stages.remove(stage)
            if stage.finished:
                continue  # it already passed the end of stream on
            if stage.active and stage.spec.toxic.CLOSES_ON_REMOVAL:
                # The toxic dropped bytes: resuming the stream would corrupt it, so close it.
                for item in pending:
                    stage.inbox.put(item)
                stage.inbox.close()
                successor.put(End())
                continue
            for item in pending:
                successor.put(item)

    def report_task_error(self, task: asyncio.Task[None]) -> None:
        """Done-callback: a task that died of an unexpected error tears the connection down."""
        if not task.cancelled() and task.exception() is not None:
            self._conn.fail(task.exception())

    async def _read(self) -> None:
        chunk_bytes = self._limits.read_chunk_bytes
        while True:
            await self.budget.acquire(chunk_bytes)
            try:
                data = await self._source.read(chunk_bytes)
            except OSError:
                data = b""  # a reset source ends the stream like an orderly close
            self.budget.release(chunk_bytes - len(data))
            if not data:
                self.inbox_after(None).put(End())
                return
            self.inbox_after(None).put(Chunk(data, self.loop.time()))

    async def _write(self) -> None:
        try:
            while True:
                item = await self.sink.get()
                if isinstance(item, End):
                    self.sink.close()
                    if item.reset:
                        self._conn.reset()
                    else:
                        self._dest.close()
                    return
                self._dest.write(item.data)
                try:
                    await self._dest.drain()
                except OSError:
                    self.sink.close()
                    self._conn.close()
                    return
                self.budget.release(len(item.data))
        finally:
            self.done.set()
            self._conn.link_done()


class Connection:
    """A client connection and its upstream connection, joined by two links.

    Owned by its proxy; lives on the proxy server's loop. It ends when both links have
    passed their end of stream on (as Toxiproxy, a close in either direction closes both
    sockets), on ``close``, or on ``reset``.
    """

    def __init__(
        self,
        *,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        limits: LinkLimits,
        rng: random.Random,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._writers = (client[1], upstream[1])
        self._on_error = on_error
        self._closed = asyncio.Event()
        self.links = {
            UPSTREAM: Link(
                direction=UPSTREAM,
                source=client[0],
                dest=upstream[1],
                conn=self,
                limits=limits,
                rng=rng,
            ),
            DOWNSTREAM: Link(
                direction=DOWNSTREAM,
                source=upstream[0],
                dest=client[1],
                conn=self,
                limits=limits,
                rng=rng,
            ),
        }

    async def run(self, chains: dict[str, list[ToxicSpec]]) -> None:
        """Start both links with their toxic chains; return once the connection is over."""
        for direction, link in self.links.items():
            link.start(chains[direction])
        try:
            await self._closed.wait()
        finally:
            self.close()  # also when the proxy's accept task is cancelled

    def link_done(self) -> None:
        """A link's writer ended: once both have, the connection is over."""
        if all(link.done.is_set() for link in self.links.values()):
            self.close()

    def close(self) -> None:
        """Stop both links and drop both sockets at once (unsent bytes are discarded)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for link in self.links.values():
            link.cancel()
        for writer in self._writers:
            writer.transport.abort()

    def reset(self) -> None:
        """Close both sockets with TCP RST (SO_LINGER 0), as reset_peer asks."""
        for writer in self._writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()

    def fail(self, error: BaseException | None) -> None:
        """A link task died unexpectedly: report it and tear the connection down."""
        if error is not None:
            self._on_error(error)
        self.close()
