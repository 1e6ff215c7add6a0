"""Toxics of the Toxiproxy-compatible server: their attributes and their per-link behaviour.

A toxic is a frozen dataclass of attributes (the JSON ``attributes`` object of the Toxiproxy
API, same field names and units) with a ``pipe`` coroutine that moves data from one stage of
a link to the next (see ``links.py``). The semantics follow Toxiproxy's toxics:

- ``latency``: every chunk is delayed ``latency`` ms +/- ``jitter`` ms after it was read.
- ``bandwidth``: at most ``rate`` KB/s (1 KB = 1000 bytes); 0 means unlimited.
- ``timeout``: drops all data; closes the connection once ``timeout`` ms pass with no data on
  the link, or never if ``timeout`` is 0. As in Toxiproxy's code (its README says "after
  timeout"), the timer restarts at every chunk it drops, so a link that keeps sending is held
  open; the harness then behaves the same on either server. Removing an applied timeout
  toxic closes the link, as Toxiproxy's does (the dropped bytes make the stream unusable).
- ``reset_peer``: at the first data (or end of stream) after the toxic starts, drops it,
  waits ``timeout`` ms and resets both sockets (TCP RST via SO_LINGER 0). Toxiproxy sets
  SO_LINGER 0 when a link opens with the toxic in its chain, so there any close of such a
  link is a reset; here only the toxic's own close is.
- ``slow_close``: the end of stream is passed on ``delay`` ms late.
- ``slicer``: chunks are cut into pieces of ``average_size`` +/- ``size_variation`` bytes,
  with ``delay`` microseconds after each piece.
- ``limit_data``: passes ``bytes`` bytes in total on the link, then closes it.

``toxicity`` (the probability that a toxic applies) is drawn once per link, when the toxic
starts on it: when the link is opened, when the toxic is added, and when it is updated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeAlias

__all__ = [
    "TOXIC_TYPES",
    "Bandwidth",
    "Chunk",
    "End",
    "Item",
    "Latency",
    "LimitData",
    "ResetPeer",
    "Slicer",
    "SlowClose",
    "Timeout",
    "Toxic",
    "ToxicAttributeError",
    "ToxicStub",
    "noop_pipe",
    "parse_attributes",
]


@dataclass(frozen=True, slots=True)
class Chunk:
    """Bytes read from a link's source, with the loop time (s) they were read at."""

    data: bytes
    stamp_s: float


@dataclass(frozen=True, slots=True)
class End:
    """End of a link's stream: the source closed, or a toxic closed the link.

    ``reset`` asks the link's writer to reset both sockets (RST) instead of closing them.
    """

    reset: bool = False


Item: TypeAlias = Chunk | End


class ToxicStub(Protocol):
    """What a toxic's ``pipe`` sees of the stage that runs it on one link.

    The item returned by ``take`` is *held* by the stage until it is emitted, dropped or
    finished, so that no byte is lost if the toxic is removed or updated meanwhile.
    """

    transmitted_bytes: int  # per-link state kept across updates (limit_data)

    def now_s(self) -> float:
        """The event loop's clock, in seconds."""
        ...

    async def take(self) -> Item:
        """Wait for the next item; it becomes the held item."""
        ...

    def emit(self, chunk: Chunk, rest: Chunk | None = None) -> None:
        """Pass ``chunk`` on; ``rest`` (a remainder not yet passed on) stays held."""
        ...

    def drop(self, chunk: Chunk) -> None:
        """Discard ``chunk`` (its bytes leave the link's budget)."""
        ...

    def finish(self, end: End) -> None:
        """Pass the end of stream on; the stage takes nothing more after this."""
        ...


class ToxicAttributeError(ValueError):
    """An attribute is missing its type or range; the API answers 400."""


class Toxic(Protocol):
    """A toxic's attributes and its behaviour on one stage of one link."""

    TYPE: ClassVar[str]
    CLOSES_ON_REMOVAL: ClassVar[bool]

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        """Move items from the stage's input to its output until the stream ends."""
        ...


async def noop_pipe(stub: ToxicStub) -> None:
    """Pass everything through unchanged: a toxic that did not pass its toxicity draw."""
    while True:
        item = await stub.take()
        if isinstance(item, End):
            stub.finish(item)
            return
        stub.emit(item)


@dataclass(frozen=True, slots=True)
class Latency:
    """Delay each chunk ``latency`` ms +/- ``jitter`` ms after it was read."""

    TYPE: ClassVar[str] = "latency"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    latency: int = 0
    jitter: int = 0

    def delay_s(self, rng: random.Random) -> float:
        """One draw of the delay: uniform in [latency - jitter, latency + jitter)."""
        delay_ms = self.latency
        if self.jitter > 0:
            delay_ms += rng.randrange(-self.jitter, self.jitter)
        return delay_ms / 1000.0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        while True:
            item = await stub.take()
            if isinstance(item, End):
                stub.finish(item)
                return
            # Measured from the read time, so a chunk that already waited behind an earlier
            # one is not delayed twice: the delay pipelines instead of accumulating.
            sleep_s = self.delay_s(rng) - (stub.now_s() - item.stamp_s)
            if sleep_s > 0:
                await asyncio.sleep(sleep_s)
                # Later latency toxics on the link add their delay on top of this one.
                item = Chunk(item.data, item.stamp_s + sleep_s)
            stub.emit(item)


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """Pass at most ``rate`` KB/s (1 KB = 1000 bytes); 0 means unlimited."""

    TYPE: ClassVar[str] = "bandwidth"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    rate: int = 0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        if self.rate <= 0:
            await noop_pipe(stub)
            return
        bytes_per_s = self.rate * 1000.0
        # Large chunks go out in 100 ms slices, so a slow rate trickles instead of bursting.
        slice_bytes_max = max(1, self.rate * 100)
        ready_s = stub.now_s()
        while True:
            item = await stub.take()
            if isinstance(item, End):
                stub.finish(item)
                return
            rest: Chunk | None = item
            while rest is not None:
                piece, rest = _split(rest, slice_bytes_max)
                # A piece leaves only once its bytes have been "paid for" at the rate; idle
                # time is not banked, so there are no bursts above the rate.
                ready_s = max(ready_s, stub.now_s()) + len(piece.data) / bytes_per_s
                wait_s = ready_s - stub.now_s()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                stub.emit(piece, rest)


@dataclass(frozen=True, slots=True)
class Timeout:
    """Drop all data; close after ``timeout`` ms without data, or never when it is 0."""

    TYPE: ClassVar[str] = "timeout"
    CLOSES_ON_REMOVAL: ClassVar[bool] = True
    timeout: int = 0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        idle_s = self.timeout / 1000.0 if self.timeout > 0 else None
        while True:
            try:
                # A fresh timer per wait: each dropped chunk restarts it, as Toxiproxy's does.
                async with asyncio.timeout(idle_s):
                    item = await stub.take()
            except TimeoutError:
                stub.finish(End())
                return
            if isinstance(item, End):
                stub.finish(item)
                return
            stub.drop(item)


@dataclass(frozen=True, slots=True)
class ResetPeer:
    """At the first data after starting, drop it, wait ``timeout`` ms, then reset (RST)."""

    TYPE: ClassVar[str] = "reset_peer"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    timeout: int = 0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        item = await stub.take()
        if isinstance(item, Chunk):
            stub.drop(item)
        if self.timeout > 0:
            await asyncio.sleep(self.timeout / 1000.0)
        stub.finish(End(reset=True))


@dataclass(frozen=True, slots=True)
class SlowClose:
    """Pass data through; pass the end of stream on ``delay`` ms late."""

    TYPE: ClassVar[str] = "slow_close"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    delay: int = 0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        while True:
            item = await stub.take()
            if isinstance(item, End):
                if self.delay > 0:
                    await asyncio.sleep(self.delay / 1000.0)
                stub.finish(item)
                return
            stub.emit(item)


@dataclass(frozen=True, slots=True)
class Slicer:
    """Cut chunks into ``average_size`` +/- ``size_variation`` byte pieces, ``delay`` us apart."""

    TYPE: ClassVar[str] = "slicer"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    average_size: int = 0
    size_variation: int = 0
    delay: int = 0

    def piece_sizes(self, size: int, rng: random.Random) -> list[int]:
        """Sizes (summing to ``size``) from halving until pieces are near the average.

        Unlike a naive halving, every cut is kept strictly inside its span, so odd settings
        (an average of 0, a variation above the average) still make progress: the smallest
        piece is one byte.
        """
        sizes: list[int] = []
        spans = [size]
        while spans:
            span = spans.pop()
            if span <= 1 or span - self.average_size <= self.size_variation:
                sizes.append(span)
                continue
            cut = span // 2
            if self.size_variation > 0:
                cut += rng.randrange(-self.size_variation, self.size_variation)
            cut = min(max(cut, 1), span - 1)
            spans.append(span - cut)  # popped after the left part: pieces stay in order
            spans.append(cut)
        return sizes

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        while True:
            item = await stub.take()
            if isinstance(item, End):
                stub.finish(item)
                return
            rest: Chunk | None = item
            for size in self.piece_sizes(len(item.data), rng):
                if rest is None:
                    break
                piece, rest = _split(rest, size)
                stub.emit(piece, rest)
                if self.delay > 0:
                    await asyncio.sleep(self.delay / 1_000_000.0)


@dataclass(frozen=True, slots=True)
class LimitData:
    """Pass ``bytes`` bytes in total on the link, then close it."""

    TYPE: ClassVar[str] = "limit_data"
    CLOSES_ON_REMOVAL: ClassVar[bool] = False
    bytes: int = 0

    async def pipe(self, stub: ToxicStub, rng: random.Random) -> None:
        while True:
            item = await stub.take()
            if isinstance(item, End):
                stub.finish(item)
                return
            allowed_bytes = max(0, self.bytes - stub.transmitted_bytes)
            piece, rest = _split(item, allowed_bytes)
            if piece.data:
                stub.transmitted_bytes += len(piece.data)
                stub.emit(piece, rest)
            if rest is not None:
                stub.drop(rest)
            if stub.transmitted_bytes >= self.bytes:
                stub.finish(End())
                return


TOXIC_TYPES: Mapping[str, type[Toxic]] = {
    cls.TYPE: cls for cls in (Latency, Bandwidth, Timeout, ResetPeer, SlowClose, Slicer, LimitData)
}


def _split(chunk: Chunk, head_bytes: int) -> tuple[Chunk, Chunk | None]:
    """The first ``head_bytes`` of ``chunk`` and the rest (None when nothing is left)."""
    if head_bytes >= len(chunk.data):
        return chunk, None
    head = Chunk(chunk.data[:head_bytes], chunk.stamp_s)
    return head, Chunk(chunk.data[head_bytes:], chunk.stamp_s)


ATTRIBUTE_MAX = 2**63 - 1  # Toxiproxy's attributes are Go int64s


def parse_attributes(base: Toxic, attributes: object) -> Toxic:
    """``base`` with the fields given in ``attributes`` (a JSON object) replaced.

    Unknown keys are ignored, as Toxiproxy's JSON decoding ignores them. Every known key
    must be a non-negative integer (JSON booleans and fractions are refused).

    Raises:
        ToxicAttributeError: ``attributes`` is not an object, or a value is not acceptable.
    """
    if attributes is None:
        return base
    if not isinstance(attributes, dict):
        raise ToxicAttributeError("attributes must be a JSON object")
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(base):  # type: ignore[arg-type]
        if field.name not in attributes:
            continue
        value = attributes[field.name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToxicAttributeError(f"attribute {field.name!r} must be an integer")
        if not 0 <= value <= ATTRIBUTE_MAX:
            raise ToxicAttributeError(f"attribute {field.name!r} out of range: {value}")
        changes[field.name] = value
    return dataclasses.replace(base, **changes)  # type: ignore[type-var]


def attributes_json(toxic: Toxic) -> dict[str, int]:
    """The JSON ``attributes`` object of ``toxic``: every field, defaults included."""
    return {
        field.name: getattr(toxic, field.name)
        for field in dataclasses.fields(toxic)  # type: ignore[arg-type]
    }
