"""One benchmark node: a RaftHost over gRPC and LMDB (fsync on) with a trivial state machine.

Run by the benchmark driver as a separate process::

    python -m raftstream.bench.raft.node --id n1 --data DIR [--port P]

It prints ``{"event": "ready", "port": P}`` once serving, then answers JSON-line commands on
stdin with JSON lines on stdout (each reply carries the command's ``id``). Commands run
concurrently; see ``Node.handle`` for the list. stdin closing ends the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from raftstream.errors import NotLeaderError, RaftStreamError
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.storage import LmdbLogStorage
from raftstream.raft.transport import GrpcTransport
from raftstream.raft.types import Entry, Role

__all__ = ["main"]


class CountingMachine:
    """Counts applied commands per group: the cheapest state machine that still applies."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}

    def apply(self, group: str, entries: Sequence[Entry]) -> Sequence[Any]:
        self.count[group] = self.count.get(group, 0) + len(entries)
        return [None] * len(entries)

    def snapshot(self, group: str) -> bytes:
        return str(self.count.get(group, 0)).encode()

    def restore(self, group: str, data: bytes) -> None:
        self.count[group] = int(data or b"0")


class Node:
    """Owns the host, its storage and transport; all on the process's one event loop."""

    def __init__(self, node_id: str, host: RaftHost, transport: GrpcTransport) -> None:
        self.node_id = node_id
        self.host = host
        self.transport = transport
        self.machine = CountingMachine()

    async def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "peers":
            for peer, address in cmd["peers"].items():
                if peer != self.node_id:
                    self.transport.set_peer(peer, address)
            return {}
        if op == "add_groups":
            for g in cmd["groups"]:
                self.host.add_group(g, voters=cmd["voters"], state_machine=self.machine)
            return {}
        if op == "status":
            return self.status()
        if op == "load":
            return await self.load(cmd["groups"], cmd["seconds"], cmd["inflight"], cmd["size"])
        if op == "await_commit":
            return await self.await_commit(cmd["group"], cmd["old_leader"], cmd["seconds"])
        raise ValueError(f"unknown op {op!r}")

    def status(self) -> dict[str, Any]:
        led, unknown, applied = [], 0, 0
        for g in self.host.groups():
            st = self.host.status(g)
            applied += st.applied
            if st.role == Role.LEADER:
                led.append(g)
            elif not st.leader:
                unknown += 1
        return {"led": led, "no_leader": unknown, "applied": applied}

    async def load(
        self, groups: list[str], seconds: float, inflight: int, size: int
    ) -> dict[str, Any]:
        """Closed loop: ``inflight`` proposers per group, each waits for its entry to apply
        before proposing the next. Latency is propose -> applied on this (leader) node."""
        payload = b"x" * size
        deadline = time.perf_counter() + seconds
        lat_ms: list[float] = []
        errors = 0

        async def worker(group: str) -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    await self.host.propose(group, payload)
                except RaftStreamError:
                    errors += 1
                    await asyncio.sleep(0.01)
                    continue
                lat_ms.append((time.perf_counter() - t0) * 1000)

        t_start = time.perf_counter()
        await asyncio.gather(*(worker(g) for g in groups for _ in range(inflight)))
        return {"lat_ms": lat_ms, "elapsed": time.perf_counter() - t_start, "errors": errors}

    async def await_commit(self, group: str, old_leader: str, seconds: float) -> dict[str, Any]:
        """Propose until one commits here (we are the new leader): return the wall time it
        applied. Give up when another node leads in a newer term, or after ``seconds``."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                await self.host.propose(group, b"probe", timeout_ms=int(seconds * 1000))
                return {"committed": True, "t": time.time()}
            except NotLeaderError as exc:
                if exc.leader not in (None, old_leader, self.node_id):
                    return {"committed": False}
            except RaftStreamError:
                pass
            await asyncio.sleep(0.002)
        return {"committed": False}


def _stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[str | None]) -> None:
    """Reader thread: stdin lines onto the loop's queue; None when stdin closes."""
    for line in sys.stdin:
        loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _serve(node: Node, cmd: dict[str, Any]) -> None:
    try:
        out = await node.handle(cmd)
        _reply({"id": cmd.get("id"), "ok": True, **out})
    except Exception as exc:
        _reply({"id": cmd.get("id"), "ok": False, "error": repr(exc)})


async def run(node_id: str, data_dir: str, port: int, tick_ms: int, quiesce: bool) -> None:
    storage = LmdbLogStorage(data_dir, map_size_bytes=4 << 30)
    transport = GrpcTransport(node_id)
    bound = await transport.serve(f"127.0.0.1:{port}")
    host = RaftHost(
        node_id,
        storage=storage,
        transport=transport,
        config=HostConfig(tick_ms=tick_ms, quiesce=quiesce),
    )
    host.start()
    node = Node(node_id, host, transport)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_stdin_lines, args=(loop, queue), daemon=True).start()
    _reply({"event": "ready", "port": bound})
    tasks: set[asyncio.Task[None]] = set()
    try:
        while (line := await queue.get()) is not None:
            task = asyncio.create_task(_serve(node, json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        await host.stop()
        await transport.close()
        storage.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="raftstream.bench.raft.node")
    p.add_argument("--id", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tick-ms", type=int, default=HostConfig().tick_ms)
    p.add_argument("--no-quiesce", action="store_true", help="tick idle groups too")
    args = p.parse_args(argv)
    asyncio.run(run(args.id, args.data, args.port, args.tick_ms, not args.no_quiesce))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
