"""Node processes for the Raft benchmarks: spawn, command, kill -9, restart, always clean up.

Each node is ``python -m raftstream.bench.raft.node`` on 127.0.0.1 with its own data dir.
A node whose stdin closes exits by itself, so even a driver that dies leaves no node behind;
``BenchCluster.close`` kills whatever is still running in any case.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import sys
from pathlib import Path
from typing import Any

from raftstream.tooling.procfs import cpu_seconds, status_kib

__all__ = ["BenchCluster", "NodeProc", "cpu_seconds", "rss_bytes"]

_LINE_BYTES_MAX = 64 << 20  # a reply carries raw latencies: allow large lines


def rss_bytes(pid: int) -> int:
    status = status_kib(pid, "VmRSS") or {}
    return status.get("VmRSS", 0) * 1024


class NodeProc:
    """One node process and its JSON-line command channel (on the driver's event loop)."""

    def __init__(self, node_id: str, data_dir: Path, tick_ms: int, quiesce: bool = True) -> None:
        self.node_id = node_id
        self.data_dir = data_dir
        self.tick_ms = tick_ms
        self.quiesce = quiesce
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.node_id} is not running")
        return self.proc.pid

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "raftstream.bench.raft.node",
            "--id", self.node_id, "--data", str(self.data_dir),
            "--port", str(self.port), "--tick-ms", str(self.tick_ms),
            *([] if self.quiesce else ["--no-quiesce"]),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=_LINE_BYTES_MAX,
        )  # fmt: skip
        if self.proc.stdout is None:
            raise RuntimeError("node started without a stdout pipe")
        ready = json.loads(await self.proc.stdout.readline() or b"{}")
        if ready.get("event") != "ready":
            raise RuntimeError(f"node {self.node_id} did not start")
        self.port = int(ready["port"])
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        while line := await proc.stdout.readline():
            reply = json.loads(line)
            fut = self._pending.pop(reply.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(reply)
        for fut in self._pending.values():  # the process is gone: nobody will answer
            if not fut.done():
                fut.set_exception(ConnectionError(f"node {self.node_id} exited"))
        self._pending.clear()

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        if self.proc is None or self.proc.stdin is None:
            raise ConnectionError(f"node {self.node_id} is not running")
        cid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        self.proc.stdin.write((json.dumps({"id": cid, "op": op, **args}) + "\n").encode())
        await self.proc.stdin.drain()
        reply = await fut
        if not reply.get("ok"):
            raise RuntimeError(f"{self.node_id} {op}: {reply.get('error')}")
        return reply

    async def kill(self) -> None:
        """kill -9, and reap."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self.proc = None

    async def stop(self) -> None:
        """Close stdin (a clean exit), then kill whatever did not leave in time."""
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout=10)
        await self.kill()


class BenchCluster:
    """``size`` nodes n1..nN under ``root``; every group has all of them as voters."""

    def __init__(self, root: Path, *, size: int = 3, tick_ms: int, quiesce: bool = True) -> None:
        self.nodes = {
            f"n{i}": NodeProc(f"n{i}", root / f"n{i}", tick_ms, quiesce) for i in range(1, size + 1)
        }
        self.groups: list[str] = []

    async def start(self) -> None:
        await asyncio.gather(*(n.start() for n in self.nodes.values()))
        await self._connect()

    def _peers(self) -> dict[str, str]:
        return {n.node_id: f"127.0.0.1:{n.port}" for n in self.nodes.values()}

    async def _connect(self) -> None:
        peers = self._peers()
        await asyncio.gather(*(n.call("peers", peers=peers) for n in self.running()))

    def running(self) -> list[NodeProc]:
        return [n for n in self.nodes.values() if n.proc is not None]

    async def add_groups(self, groups: list[str], chunk: int = 200) -> None:
        voters = list(self.nodes)
        for i in range(0, len(groups), chunk):
            part = groups[i : i + chunk]
            await asyncio.gather(
                *(n.call("add_groups", groups=part, voters=voters) for n in self.running())
            )
        self.groups.extend(groups)

    async def leaders(self) -> dict[str, str]:
        """group -> the node that leads it (as each node reports for itself)."""
        out: dict[str, str] = {}
        statuses = await asyncio.gather(*(n.call("status") for n in self.running()))
        for node, st in zip(self.running(), statuses, strict=True):
            for g in st["led"]:
                out[g] = node.node_id
        return out

    async def wait_all_led(self, poll_s: float = 0.1, timeout_s: float = 120) -> dict[str, str]:
        """Wait until every group has a leader and every running replica knows one."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            statuses = await asyncio.gather(*(n.call("status") for n in self.running()))
            led = await self.leaders()
            if len(led) == len(self.groups) and all(s["no_leader"] == 0 for s in statuses):
                return led
            if loop.time() > deadline:
                raise TimeoutError(f"only {len(led)}/{len(self.groups)} groups have a leader")
            await asyncio.sleep(poll_s)

    async def restart(self, node_id: str) -> None:
        node = self.nodes[node_id]
        await node.start()  # same port, same data dir
        await self._connect()
        await node.call("add_groups", groups=self.groups, voters=list(self.nodes))

    async def close(self) -> None:
        await asyncio.gather(*(n.stop() for n in self.nodes.values()), return_exceptions=True)
