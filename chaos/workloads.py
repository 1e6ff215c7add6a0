"""Workloads that drive a chaos cluster and record every operation in a ``History``.

- queue: publishers send unique integers (``msg_id`` = the value, so the SDK's retries are
  deduplicated) to stream ``Q``; consumers fetch from durable pull consumer ``C`` and
  ``ack_sync`` every delivery; push consumers take every message of the same stream from
  durable push consumer ``PC`` (``subscribe_bind``, ``next_msg``, ``ack_sync``); after the
  faults a drain phase consumes what is left on both; a final read fetches every stored
  message by sequence.
- kv: registers on a plain stream (``KV``, one subject per key), the way a KV bucket works
  underneath: put = publish, get = last message on the subject, compare-and-set = get, then
  publish with ``expected_last_subject_seq`` of the revision read. Written values are unique,
  so a failed precondition means the register no longer held the expected value.
- churn: streams and consumers created and deleted against the meta group, then listed.

Each worker has its own client pinned to one node (``servers=[that node]``), recorded as
the op's ``node``: a pinned client reaches other nodes only through its node's proxies (its
NOT_LEADER hints name proxy addresses), which is what lets the checker pin an
acknowledgement to a side of a partition.

Outcomes: success is ``ok``; a definite refusal (a failed precondition, a bad argument, a
missing object) is ``fail``; anything retriable, a timeout or an unexpected exception is
``info`` (unknown: it may have taken effect). Everything runs on one event loop; every
request carries a timeout and every loop ends on a stop event or a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

import raftstream
from raftstream import errors
from raftstream.chaos.history import History, Op, Outcome
from raftstream.client import Client
from raftstream.config import ConsumerConfig

__all__ = ["WorkloadConfig", "Workloads", "outcome_of"]

T = TypeVar("T")
NS_PER_S = 1_000_000_000
SETUP_TIMEOUT_S = 60.0
FINAL_READ_CONCURRENCY = 16
# The final reads are one operation each over the whole stream (a ReadIndex-barriered get per
# message): bounded by this, not by a single request's timeout, so that a loaded machine does
# not turn a slow read into "loss cannot be judged".
FINAL_READ_TIMEOUT_S = 120.0
PUSH_GROUP = "workers"  # the push consumer's deliver group (its workers are a queue group)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    """Sizes and paces of the workloads (all bounded)."""

    queue_stream: str = "Q"
    queue_subject: str = "q.v"
    consumer: str = "C"
    push_consumer: str = "PC"
    kv_stream: str = "KV"
    kv_keys: tuple[str, ...] = ("k0", "k1", "k2")
    replicas: int = 3
    publishers: int = 2
    consumers: int = 2
    push_consumers: int = 1
    kv_workers: int = 3
    churn_workers: int = 1
    request_timeout_s: float = 2.0
    publish_pause_s: float = 0.01
    kv_pause_s: float = 0.05
    churn_pause_s: float = 0.5
    fetch_batch: int = 16
    # The push consumer's max_ack_pending: what its subscription may hold unacked, which one
    # worker (an ack_sync each, ~15 ms at R3) must get through within ``ack_wait_s``, as
    # ``fetch_batch`` bounds a fetch. With JetStream's default 1,000 the buffer held ~15 s of
    # work against the 2 s ack wait: nearly every message handed out had been delivered again
    # behind it, and a drain after a kill-stream-leader run ran out of time cycling through
    # those copies (406 messages reported undelivered; none lost).
    push_ack_pending: int = 32
    ack_wait_s: float = 2.0
    drain_timeout_s: float = 30.0


def outcome_of(exc: BaseException) -> Outcome:
    """``fail`` for a definite refusal, ``info`` (unknown) for everything else."""
    definite = isinstance(exc, errors.RaftStreamError) and not exc.retriable
    if definite and not isinstance(exc, errors.DeadlineExceededError | errors.InvariantError):
        return "fail"
    return "info"


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


class Workloads:
    """All workloads against one cluster. ``nodes`` maps node name to client address."""

    def __init__(
        self, *, nodes: Mapping[str, str], history: History, rng: random.Random, cfg: WorkloadConfig
    ) -> None:
        self.nodes = dict(nodes)
        self.history = history
        self.rng = rng
        self.cfg = cfg
        self._values = itertools.count(1)
        self._clients: list[Client] = []
        self.excluded: set[str] = set()

    # -- plumbing ----------------------------------------------------------------------------

    async def _client(self, node: str) -> Client:
        """A client pinned to ``node`` (kept to close at the end)."""
        client = await self._retry(
            lambda: raftstream.connect([self.nodes[node]], timeout=self.cfg.request_timeout_s)
        )
        self._clients.append(client)
        return client

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` retried on any raftstream error for at most ``SETUP_TIMEOUT_S``."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(errors.RaftStreamError),
            stop=stop_after_delay(SETUP_TIMEOUT_S),
            wait=wait_fixed(0.2),
            reraise=True,
        ):
            with attempt:
                return await fn()
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _op(
        self,
        process: str,
        node: str,
        f: str,
        value: Any,
        call: Callable[[], Awaitable[Any]],
        *,
        timeout_s: float | None = None,
    ) -> Op:
        """Invoke ``call`` as one recorded operation; its return value is the op's result.
        Bounded by ``timeout_s`` (default: three request timeouts)."""
        op = self.history.invoke(process, f, value, node=node)
        try:
            async with asyncio.timeout(timeout_s or self.cfg.request_timeout_s * 3):
                result = await call()
        except asyncio.CancelledError:
            self.history.done(op, "info", error="cancelled")
            raise
        except Exception as exc:  # every failure is recorded; the workload goes on
            return self.history.done(op, outcome_of(exc), error=_error_text(exc))
        return self.history.done(op, "ok", result)

    def _node_for(self, index: int) -> str:
        names = sorted(n for n in self.nodes if n not in self.excluded)
        return names[index % len(names)]

    def exclude(self, names: set[str]) -> None:
        """Clients made from now on avoid ``names`` (nodes left down on purpose)."""
        self.excluded = set(names)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()

    # -- set-up ------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create the queue stream and consumer and the KV stream; every key starts at 0."""
        cfg = self.cfg
        admin = await self._client(self._node_for(0))
        await self._retry(
            lambda: admin.add_stream(
                name=cfg.queue_stream, subjects=["q.>"], num_replicas=cfg.replicas
            )
        )
        consumer = ConsumerConfig(
            durable_name=cfg.consumer,
            ack_wait=int(cfg.ack_wait_s * NS_PER_S),
            filter_subject=cfg.queue_subject,
        )
        await self._retry(lambda: admin.add_consumer(cfg.queue_stream, consumer))
        push = ConsumerConfig(
            durable_name=cfg.push_consumer,
            deliver_subject=f"push.{cfg.push_consumer}",
            deliver_group=PUSH_GROUP,
            ack_wait=int(cfg.ack_wait_s * NS_PER_S),
            max_ack_pending=cfg.push_ack_pending,
            filter_subject=cfg.queue_subject,
        )
        await self._retry(lambda: admin.add_consumer(cfg.queue_stream, push))
        await self._retry(
            lambda: admin.add_stream(
                name=cfg.kv_stream, subjects=["kv.>"], num_replicas=cfg.replicas
            )
        )
        for key in cfg.kv_keys:
            await self._retry(partial(admin.publish, f"kv.{key}", b"0", msg_id=f"init-{key}"))

    # -- queue -------------------------------------------------------------------------------

    async def publisher(self, index: int, stop: asyncio.Event) -> None:
        """Publish unique values until ``stop``; each publish is one op."""
        node = self._node_for(index)
        client = await self._client(node)
        process = f"pub{index}"
        while not stop.is_set():
            value = next(self._values)

            async def call(v: int = value) -> dict[str, Any]:
                ack = await client.publish(self.cfg.queue_subject, str(v).encode(), msg_id=f"q-{v}")
                return {"seq": ack.seq, "duplicate": ack.duplicate}

            await self._op(process, node, "publish", value, call)
            await asyncio.sleep(self.cfg.publish_pause_s)

    async def consumer(self, index: int, stop: asyncio.Event) -> None:
        """Fetch and ack_sync until ``stop``; a delivery and its ack are ops of their own."""
        node = self._node_for(index + 1)
        client = await self._client(node)
        process = f"con{index}"
        sub = await self._retry(
            lambda: client.pull_subscribe(
                self.cfg.queue_subject, durable=self.cfg.consumer, stream=self.cfg.queue_stream
            )
        )
        while not stop.is_set():
            fetch = self.history.invoke(process, "fetch", self.cfg.fetch_batch, node=node)
            try:
                msgs = await sub.fetch(self.cfg.fetch_batch, timeout=1.0)
            except Exception as exc:
                self.history.done(fetch, "fail", error=_error_text(exc))
                continue
            self.history.done(fetch, "ok", len(msgs))
            # Every delivery is recorded before any ack: it happened within the fetch, and
            # acking (which may block for a while under faults) must not make it look later.
            for msg in msgs:
                self._record_delivery(process, node, fetch, msg)
            for msg in msgs:
                value = _parse_int(msg.data)
                await self._op(
                    process, node, "ack", value, partial(msg.ack_sync, self.cfg.request_timeout_s)
                )

    async def push_consumer(self, index: int, stop: asyncio.Event) -> None:
        """Take messages of push consumer ``PC`` (a queue group: the workers share its
        deliveries) and ``ack_sync`` each until ``stop``. A delivery is recorded when
        ``next_msg`` hands it over: when the server decided it is not known here (it may
        have waited in the subscription's buffer), so push deliveries are checked for loss,
        not for redelivery after an ack (``checker.py``). A subscription that ends is made
        again (each attempt is a ``push_attach`` op)."""
        node = self._node_for(index + 2)
        client = await self._client(node)
        process = f"push{index}"
        sub: raftstream.PushSubscription | None = None
        made: list[raftstream.PushSubscription] = []

        async def attach() -> bool:
            made.append(
                await client.subscribe_bind(
                    self.cfg.queue_stream, self.cfg.push_consumer, queue=PUSH_GROUP, manual_ack=True
                )
            )
            return True

        while not stop.is_set():
            if sub is None or sub.is_closed:
                made.clear()
                await self._op(process, node, "push_attach", self.cfg.push_consumer, attach)
                sub = made[0] if made else None
                if sub is None:
                    await asyncio.sleep(0.2)
                    continue
            try:
                msg = await sub.next_msg(timeout=1.0)
            except errors.DeadlineExceededError:
                continue
            except errors.RaftStreamError:  # ended (its error went to the error callback)
                with contextlib.suppress(errors.RaftStreamError):
                    await sub.unsubscribe()
                sub = None
                continue
            value = _parse_int(msg.data)
            md = msg.metadata
            deliver = self.history.invoke(process, "push_deliver", value, node=node)
            result = {"seq": md.stream_seq, "delivered": md.num_delivered}
            self.history.done(deliver, "ok", result)
            await self._op(
                process, node, "push_ack", value, partial(msg.ack_sync, self.cfg.request_timeout_s)
            )
        if sub is not None:
            with contextlib.suppress(errors.RaftStreamError):
                await sub.unsubscribe()

    def _record_delivery(self, process: str, node: str, fetch: Op, msg: raftstream.Msg) -> None:
        md = msg.metadata
        deliver = self.history.invoke(
            process, "deliver", _parse_int(msg.data), node=node, at=fetch.invoke
        )
        result = {"seq": md.stream_seq, "delivered": md.num_delivered, "fetch": fetch.id}
        self.history.done(deliver, "ok", result, at=fetch.complete)

    async def drain(self) -> None:
        """After healing: consume until the consumer has nothing pending or unacked, or
        ``drain_timeout_s`` passes."""
        stop = asyncio.Event()
        tasks = [
            *(asyncio.create_task(self.consumer(100 + i, stop)) for i in range(self.cfg.consumers)),
            *(
                asyncio.create_task(self.push_consumer(100 + i, stop))
                for i in range(self.cfg.push_consumers)
            ),
        ]
        admin = await self._client(self._node_for(0))
        names = [self.cfg.consumer, *([self.cfg.push_consumer] if self.cfg.push_consumers else [])]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.drain_timeout_s
        try:
            while loop.time() < deadline:
                await asyncio.sleep(0.5)
                try:
                    infos = [await admin.consumer_info(self.cfg.queue_stream, n) for n in names]
                except errors.RaftStreamError:
                    continue
                if all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos):
                    break
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- kv ----------------------------------------------------------------------------------

    async def kv_worker(self, index: int, stop: asyncio.Event) -> None:
        """Random puts, gets and compare-and-sets on the keys until ``stop``."""
        node = self._node_for(index)
        client = await self._client(node)
        process = f"kv{index}"
        seen: dict[str, int] = {}
        while not stop.is_set():
            key = self.rng.choice(self.cfg.kv_keys)
            # A cas needs a value to expect: a key this worker knows nothing of is read first.
            kind = self.rng.choice(("put", "get", "cas")) if key in seen else "get"
            value: list[Any] = [key]
            if kind == "put":
                value = [key, next(self._values)]
            elif kind == "cas":
                value = [key, seen[key], next(self._values)]
            op = await self._op(
                process, node, kind, value, partial(_kv_call, client, self.cfg, value)
            )
            _remember(seen, key, kind, op)
            await asyncio.sleep(self.cfg.kv_pause_s)

    # -- churn -------------------------------------------------------------------------------

    async def churn_worker(self, index: int, stop: asyncio.Event) -> None:
        """Create streams (R1 or R3) with a consumer each; delete some of them."""
        node = self._node_for(index + 2)
        client = await self._client(node)
        process = f"churn{index}"
        for k in itertools.count():
            if stop.is_set():
                break
            name = f"CH{index}x{k}"
            replicas = self.rng.choice((1, 3))
            await self._op(
                process,
                node,
                "create_stream",
                name,
                partial(
                    _created,
                    partial(
                        client.add_stream,
                        name=name,
                        subjects=[f"ch.{name}.>"],
                        num_replicas=replicas,
                    ),
                ),
            )
            await self._op(
                process,
                node,
                "create_consumer",
                [name, "D"],
                partial(_created, partial(client.add_consumer, name, durable_name="D")),
            )
            if self.rng.random() < 0.5:
                await self._op(
                    process, node, "delete_stream", name, partial(client.delete_stream, name)
                )
            await asyncio.sleep(self.cfg.churn_pause_s)

    # -- final reads -------------------------------------------------------------------------

    async def final_reads(self) -> None:
        """Record (as ``final_*`` ops) the queue stream's contents by sequence, every KV
        key's value, and the stream and consumer listings."""
        client = await self._client(self._node_for(0))
        within = FINAL_READ_TIMEOUT_S
        await self._op(
            "final", "", "final_queue", None, lambda: self._read_queue(client), timeout_s=within
        )
        for key in self.cfg.kv_keys:
            get = partial(_get, client, self.cfg.kv_stream, key)
            await self._op("final", "", "get", [key], get, timeout_s=within)
        await self._op(
            "final", "", "final_defs", None, lambda: self._read_defs(client), timeout_s=within
        )

    async def _read_queue(self, client: Client) -> dict[str, Any]:
        info = await self._retry(lambda: client.stream_info(self.cfg.queue_stream))
        first, last = info.state.first_seq, info.state.last_seq
        gate = asyncio.Semaphore(FINAL_READ_CONCURRENCY)

        async def one(seq: int) -> tuple[int, int | str | None]:
            async with gate:
                try:
                    msg = await self._retry(lambda: client.get_msg(self.cfg.queue_stream, seq))
                except errors.NotFoundError:
                    return seq, None
                return seq, _parse_int(msg.data)

        pairs = await asyncio.gather(*(one(s) for s in range(max(first, 1), last + 1)))
        return {"last_seq": last, "values": {str(s): v for s, v in pairs if v is not None}}

    async def _read_defs(self, client: Client) -> dict[str, list[str]]:
        names = await self._retry(lambda: client.stream_names())
        out: dict[str, list[str]] = {}
        for name in names:
            try:
                out[name] = sorted(await self._retry(partial(client.consumer_names, name)))
            except errors.NotFoundError:
                continue
        return out

    # -- everything --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Every worker until ``stop`` is set."""
        cfg = self.cfg
        workers = [
            *(self.publisher(i, stop) for i in range(cfg.publishers)),
            *(self.consumer(i, stop) for i in range(cfg.consumers)),
            *(self.push_consumer(i, stop) for i in range(cfg.push_consumers)),
            *(self.kv_worker(i, stop) for i in range(cfg.kv_workers)),
            *(self.churn_worker(i, stop) for i in range(cfg.churn_workers)),
        ]
        results = await asyncio.gather(*workers, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]


def _parse_int(data: bytes) -> int | str:
    """The integer a workload wrote, or the raw text when it is not one (an anomaly)."""
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError):
        return data.decode(errors="replace")


async def _created(call: Callable[[], Awaitable[Any]]) -> bool:
    await call()
    return True


async def _kv_call(client: Client, cfg: WorkloadConfig, value: list[Any]) -> int | str | bool:
    """Run the kv op ``value`` (``[key]`` get, ``[key, v]`` put, ``[key, old, new]`` cas)."""
    if len(value) == 1:
        return await _get(client, cfg.kv_stream, value[0])
    if len(value) == 2:
        return await _put(client, value[0], value[1])
    return await _cas(client, cfg.kv_stream, value[0], value[1], value[2])


async def _put(client: Client, key: str, value: int) -> int:
    ack = await client.publish(f"kv.{key}", str(value).encode(), msg_id=f"kv-{value}")
    return ack.seq


async def _get(client: Client, stream: str, key: str) -> int | str:
    msg = await client.get_last_msg(stream, f"kv.{key}")
    return _parse_int(msg.data)


async def _cas(client: Client, stream: str, key: str, old: int, new: int) -> bool:
    """True if the register held ``old`` and now holds ``new``; False if it did not hold
    ``old`` (at the read, or at the write: written values are unique)."""
    msg = await client.get_last_msg(stream, f"kv.{key}")
    if _parse_int(msg.data) != old:
        return False
    try:
        await client.publish(
            f"kv.{key}",
            str(new).encode(),
            msg_id=f"kv-{new}",
            expected_last_subject_seq=msg.seq,
        )
    except errors.ExpectedLastSubjectSeqError:
        return False
    return True


def _remember(seen: dict[str, int], key: str, kind: str, op: Op) -> None:
    """What this worker last knew a key to hold: the next cas expects it."""
    if op.type != "ok":
        return
    if kind == "put":
        seen[key] = int(op.value[1])
    elif kind == "get" and isinstance(op.result, int):
        seen[key] = op.result
    elif kind == "cas" and op.result is True:
        seen[key] = int(op.value[2])
    elif kind == "cas":
        seen.pop(key, None)
