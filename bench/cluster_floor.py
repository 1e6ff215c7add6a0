"""The floor for the cluster benchmark: what this disk and the engine alone can do right now.

fsync speed on a shared machine swings 10-30x from minute to minute, so the cluster figures
are printed beside floors measured in the same run, in the same directory as the node data:

- ``fsync_per_s``: a 128-byte ``write`` + ``fsync`` loop on one file (the disk's sync rate);
- ``lmdb_commit_per_s``: one 128-byte put per LMDB write transaction, sync on (what one
  Raft-log or store commit costs);
- ``store_batch_msgs_per_s``: ``LmdbStreamStore.append`` of 128-byte messages, 256 per
  transaction (the engine's batched rate on one node: a CPU ceiling for the whole path);
- ``rpc_rtt_ms`` (when given a node's address): the median time of a unary gRPC health
  check from this process to that node, one at a time, over the same loopback and gRPC
  asyncio stack as every client and Raft message (a sync publish on R3 is four such
  one-way hops plus the work; a fetch is a call of its own).

Each loop runs for ``seconds`` (bounded), in its own temporary directory under ``root``. The
machine's 1-minute load average is recorded with them: on a shared machine it says how much
of the CPU the benchmark could have had.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env

__all__ = ["Floor", "measure_floor"]

PAYLOAD_BYTES = 128
STORE_BATCH_MSGS = 256
MAP_SIZE_BYTES = 1 << 30
RPC_TIMEOUT_S = 5.0
_KEY = struct.Struct(">Q")


@dataclass(frozen=True, slots=True, kw_only=True)
class Floor:
    """Rates measured back to back (see the module docstring)."""

    fsync_per_s: float
    lmdb_commit_per_s: float
    store_batch_msgs_per_s: float
    load_1m: float = 0.0  # the machine's 1-minute load average then (others' runs count)
    rpc_rtt_ms: float = float("nan")  # NaN: not measured (no node address given)

    @property
    def fsync_ms(self) -> float:
        """The mean time of one fsync, ms."""
        return 1000.0 / self.fsync_per_s if self.fsync_per_s else float("nan")


def _fsync_rate(path: Path, seconds: float) -> float:
    """128-byte appends, each followed by fsync, for ``seconds``: fsyncs per second."""
    payload = b"x" * PAYLOAD_BYTES
    fd = os.open(path / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    count, started = 0, time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            os.write(fd, payload)
            os.fsync(fd)
            count += 1
    finally:
        os.close(fd)
    return count / elapsed


def _lmdb_commit_rate(path: Path, seconds: float) -> float:
    """One 128-byte put per synced LMDB transaction, for ``seconds``: commits per second."""
    env = open_node_env(path / "lmdb", map_size_bytes=MAP_SIZE_BYTES, sync=True)
    db = env.open_db(b"floor")
    value, count, started = b"x" * PAYLOAD_BYTES, 0, time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            with env.begin(write=True) as txn:
                txn.put(_KEY.pack(count), value, db=db)
            count += 1
    finally:
        env.close()
    return count / elapsed


def _store_batch_rate(path: Path, seconds: float) -> float:
    """``LmdbStreamStore.append``, ``STORE_BATCH_MSGS`` per transaction: messages/s."""
    env = open_node_env(path / "store", map_size_bytes=MAP_SIZE_BYTES, sync=True)
    store = LmdbStreamStore(env, "FLOOR")
    payload, count, started = b"x" * PAYLOAD_BYTES, 0, time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - started) < seconds:
            with store.transaction():
                for _ in range(STORE_BATCH_MSGS):
                    count += 1
                    store.append("floor.a", payload, now_ns=count)
    finally:
        store.close()
        env.close()
    return count / elapsed


def _rpc_rtt_ms(addr: str, seconds: float) -> float:
    """Unary health checks to the node at ``addr``, one at a time, for ``seconds`` (after
    one to connect): the median round trip, ms."""

    async def checks() -> float:
        async with grpc.aio.insecure_channel(addr) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()
            await stub.Check(request, timeout=RPC_TIMEOUT_S)
            times: list[float] = []
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                await stub.Check(request, timeout=RPC_TIMEOUT_S)
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1000

    return asyncio.run(checks())


def measure_floor(root: Path, seconds: float = 1.0, *, rpc_addr: str | None = None) -> Floor:
    """Measure the floors for ``seconds`` each, in a directory under ``root`` that is
    removed afterwards; the RPC round trip only with a node's ``rpc_addr``."""
    path = Path(tempfile.mkdtemp(prefix="floor-", dir=root))
    try:
        return Floor(
            fsync_per_s=_fsync_rate(path, seconds),
            lmdb_commit_per_s=_lmdb_commit_rate(path, seconds),
            store_batch_msgs_per_s=_store_batch_rate(path, seconds),
            load_1m=os.getloadavg()[0],
            rpc_rtt_ms=_rpc_rtt_ms(rpc_addr, seconds) if rpc_addr else float("nan"),
        )
    finally:
        shutil.rmtree(path, ignore_errors=True)
