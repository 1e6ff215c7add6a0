"""Deliver+ack throughput of the consumer state machine over a 1M-message LMDB stream.

Setup: one node environment (fsync on), a stream of ``--msgs`` (default 1,000,000) messages
of 128 bytes on 8 subjects, appended 10,000 per write transaction (the build time is
printed). Consumer state lives in the same environment (``LmdbConsumerStore``).

Measured, each the median of ``--runs`` runs over disjoint windows of the stream (every run
is a fresh durable consumer starting at its window, explicit acks):

- batched acks: ``fetch(256)`` then one ``ack_many`` of the 256 stream sequences, i.e. two
  state writes (two fsyncs) per 256 messages, as a consumer leader that batches the acks it
  received into one replicated op would;
- single acks: ``fetch(256)`` then ``ack()`` per message, one state write (one fsync) per
  ack: the unbatched worst case, on a shorter window.

Usage: ``python -m raftstream.bench.engine consumer [--msgs N] [--runs N]``.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_config import ConsumerConfig, DeliverPolicy
from raftstream.engine.consumer_store import LmdbConsumerStore
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env

__all__ = ["main"]

STREAM_MSGS_DEFAULT = 1_000_000
PAYLOAD_BYTES = 128
BUILD_BATCH_MSGS = 10_000
FETCH_BATCH_MSGS = 256
RUNS_DEFAULT = 5
RUNS_MAX = 15
SINGLE_ACK_WINDOW_MSGS = 4_096  # per run; one fsync per ack keeps this slow on purpose
MAP_SIZE_BYTES = 4 * 1024**3
SUBJECTS = tuple(f"bench.orders.{i}" for i in range(8))


def _build(env: Any, msgs: int) -> tuple[LmdbStreamStore, float]:
    store = LmdbStreamStore(env, "BENCH")
    payload = b"x" * PAYLOAD_BYTES
    started = time.perf_counter()
    seq = 0
    while seq < msgs:
        n = min(BUILD_BATCH_MSGS, msgs - seq)
        with store.transaction():
            for i in range(seq, seq + n):
                store.append(SUBJECTS[i % len(SUBJECTS)], payload, now_ns=i + 1)
        seq += n
    return store, time.perf_counter() - started


def _consumer(store: LmdbStreamStore, cstore: LmdbConsumerStore, name: str, start: int) -> Consumer:
    config = ConsumerConfig(
        durable_name=name, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
    )
    return Consumer.create(
        stream="BENCH", name=name, config=config, store=store, now_ns=0, state_store=cstore
    )


def _run(consumer: Consumer, window: int, *, batched: bool) -> float:
    """Messages/s delivering and acking ``window`` messages."""
    done = 0
    now = 1
    started = time.perf_counter()
    while done < window:
        got = consumer.fetch(min(FETCH_BATCH_MSGS, window - done), now)
        if not got:
            raise RuntimeError(f"stream ran dry after {done} of {window} messages")
        if batched:
            consumer.ack_many([d.stream_seq for d in got], now)
        else:
            for d in got:
                consumer.ack(d.stream_seq, now)
        done += len(got)
        now += 1
    elapsed = time.perf_counter() - started
    info = consumer.info(now)
    if info.num_ack_pending or info.ack_floor.stream_seq != info.delivered.stream_seq:
        raise RuntimeError(f"acks did not settle: {info}")
    return window / elapsed


def _parse(argv: list[str]) -> tuple[int, int]:
    msgs, runs = STREAM_MSGS_DEFAULT, RUNS_DEFAULT
    for arg in argv:
        name, _, value = arg.partition("=")
        if name == "--msgs" and value.isdigit() and int(value) >= RUNS_MAX:
            msgs = int(value)
        elif name == "--runs" and value.isdigit() and 1 <= int(value) <= RUNS_MAX:
            runs = int(value)
        else:
            raise SystemExit(f"consumer bench: bad argument {arg!r} (--msgs=N, --runs=1..15)")
    return msgs, runs


def main(argv: list[str]) -> int:
    """Build the stream, run both measurements, print them; returns 0."""
    msgs, runs = _parse(argv)
    root = Path(tempfile.mkdtemp(prefix="raftstream-bench-consumer-"))
    env = open_node_env(root, map_size_bytes=MAP_SIZE_BYTES)
    try:
        store, build_s = _build(env, msgs)
        print(
            f"consumer: built a stream of {msgs:,} x {PAYLOAD_BYTES}-byte messages in "
            f"{build_s:.1f} s ({msgs / build_s:,.0f} appends/s, {BUILD_BATCH_MSGS:,} per txn)"
        )
        cstore = LmdbConsumerStore(env=env)
        window = msgs // runs
        batched = [
            _run(_consumer(store, cstore, f"b{i}", i * window + 1), window, batched=True)
            for i in range(runs)
        ]
        single_window = min(SINGLE_ACK_WINDOW_MSGS, window)
        single = [
            _run(_consumer(store, cstore, f"s{i}", i * window + 1), single_window, batched=False)
            for i in range(runs)
        ]
    finally:
        env.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"consumer: fetch({FETCH_BATCH_MSGS}) + explicit acks, fsync on, median of {runs} runs")
    print(
        f"  acks batched per fetch  {statistics.median(batched):>12,.0f} msgs/s"
        f"  ({window:,} msgs per run; runs: {', '.join(f'{r:,.0f}' for r in batched)})"
    )
    print(
        f"  one write per ack       {statistics.median(single):>12,.0f} msgs/s"
        f"  ({single_window:,} msgs per run)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
