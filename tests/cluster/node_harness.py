"""Real node processes on 127.0.0.1 for integration tests.

``LocalCluster`` starts ``python -m raftstream.cluster`` processes on free loopback ports,
each with its own TOML config and data directory under one temporary directory, waits by
POLLING (gRPC health, then the cluster info's meta leader) rather than sleeping fixed
times, and ``close()`` always kills every process it started (by pid) and removes the
directory. Node output goes to a log file per node; ``tails()`` shows the ends of them for
a failing test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftstream.localnet import POLL_S, READY_TIMEOUT_S, free_port, wait_for
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

T = TypeVar("T")


class LocalCluster:
    """``n`` nodes ``n1..nN``; ``raft``: extra ``[raft]`` settings for every node.

    TLS (tests/security): ``tls`` maps a node to its ``[tls]`` files (ca, cert, key), read
    when the node is started (change an entry, then restart the node to give it other
    ones); ``client_tls`` (ca, cert, key) is what the harness's own probes present.

    Auth (tests/security): ``auth`` is the TOML text of an ``[auth]`` section written into
    every node's config; ``client_metadata`` the credentials the harness's probes send.

    Placement: ``tags`` maps a node to its ``[cluster] tags`` (others have none).
    """

    def __init__(
        self,
        n: int,
        *,
        raft: dict[str, int] | None = None,
        tls: dict[str, tuple[Path, Path, Path]] | None = None,
        client_tls: tuple[Path, Path, Path] | None = None,
        auth: str | None = None,
        client_metadata: tuple[tuple[str, str], ...] = (),
        tags: dict[str, list[str]] | None = None,
    ) -> None:
        self.tags = dict(tags or {})
        self.auth = auth
        self.client_metadata = client_metadata
        self.tls = dict(tls or {})
        self.client_tls = client_tls
        self.root = Path(tempfile.mkdtemp(prefix="raftstream-it-"))
        self.names = [f"n{i + 1}" for i in range(n)]
        self.ports = {name: free_port() for name in self.names}
        self.metrics_ports = {name: free_port() for name in self.names}
        self.raft = {"tick_ms": 50, "election_ticks": 10, **(raft or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, Any] = {}

    # -- addresses -------------------------------------------------------------------------

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def servers(self) -> list[str]:
        return [self.addr(n) for n in self.names]

    def config_path(self, name: str) -> Path:
        return self.root / f"{name}.toml"

    def _write_config(self, name: str) -> Path:
        peers = ", ".join(f'{n} = "{self.addr(n)}"' for n in self.names)
        raft = "\n".join(f"{k} = {v}" for k, v in self.raft.items())
        text = (
            f'[cluster]\nname = "{name}"\nlisten = "{self.addr(name)}"\n'
            f'data = "{self.root / name}"\npeers = {{ {peers} }}\n'
            f'metrics_listen = "127.0.0.1:{self.metrics_ports[name]}"\n'
            f"tags = [{', '.join(repr(t) for t in self.tags.get(name, []))}]\n\n[raft]\n{raft}\n"
        )
        if name in self.tls:
            ca, cert, key = self.tls[name]
            text += f'\n[tls]\nca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
        if self.auth is not None:
            text += "\n" + self.auth
        path = self.config_path(name)
        path.write_text(text)
        return path

    # -- processes -------------------------------------------------------------------------

    def start(self, name: str) -> None:
        config = self._write_config(name)
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (closed in close())
        self._logs[name] = log
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "raftstream.cluster", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)
        for name in self.names:
            self.wait_serving(name)
        self.wait_meta_leader()

    def kill(self, name: str) -> None:
        """kill -9 (no graceful anything), then reap it."""
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def stop(self, name: str) -> int:
        """SIGTERM and wait: the graceful stop; returns the exit code."""
        p = self.procs.pop(name)
        p.send_signal(signal.SIGTERM)
        return p.wait(timeout=30)

    def unexpected_exits(self) -> dict[str, int]:
        """Nodes that exited although the test neither killed nor stopped them: a crash."""
        codes = {name: p.poll() for name, p in self.procs.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        for log in self._logs.values():
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def tails(self, lines: int = 30) -> str:
        out = []
        for name in self.names:
            path = self.root / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                proc = self.procs.get(name)
                code = None if proc is None else proc.poll()
                state = (
                    "not running"
                    if proc is None
                    else f"exited {code}"
                    if code is not None
                    else "running"
                )
                out.append(f"--- {name} ({state}) ---\n" + "\n".join(text))
        return "\n".join(out)

    # -- polling ---------------------------------------------------------------------------

    def channel(self, name: str) -> grpc.Channel:
        """A blocking channel to the node (TLS with ``client_tls`` when set)."""
        if self.client_tls is None:
            return grpc.insecure_channel(self.addr(name))
        ca, cert, key = (p.read_bytes() for p in self.client_tls)
        return grpc.secure_channel(self.addr(name), grpc.ssl_channel_credentials(ca, key, cert))

    def _health(self, name: str) -> bool:
        with self.channel(name) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
            except grpc.RpcError:
                return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def wait_serving(self, name: str) -> None:
        p = self.procs[name]

        def probe() -> bool | None:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.tails()}")
            return True if self._health(name) else None

        wait_for(f"{name} serving", probe)

    def metrics(self, name: str) -> str:
        """The node's Prometheus exposition text."""
        url = f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def cluster_info(self, name: str) -> pb.ClusterInfo | None:
        with self.channel(name) as ch:
            try:
                return pbg.ClusterServiceStub(ch).GetClusterInfo(
                    pb.ClusterInfoRequest(), timeout=2, metadata=self.client_metadata
                )
            except grpc.RpcError:
                return None

    def wait_meta_leader(self) -> str:
        """Wait until every running node names the same meta leader; return it."""

        def probe() -> str | None:
            seen = set()
            for name in self.procs:
                info = self.cluster_info(name)
                seen.add(info.meta_leader if info is not None else "")
            leader = seen.pop() if len(seen) == 1 else ""
            return str(leader) if leader else None

        return wait_for("one meta leader known to every node", probe)

    def stream_leader(self, stream: str, account: str = "$G") -> str | None:
        """The stream's leader as the live nodes report it (None: none known)."""
        for name in self.procs:
            info = self.cluster_info(name)
            if info is None:
                continue
            for g in info.groups:
                if g.stream == stream and g.account == account and g.group.leader:
                    return str(g.group.leader)
        return None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def retry_async(fn: Callable[[], Any], *, timeout_s: float = READY_TIMEOUT_S) -> Any:
    """Await ``fn()`` until it does not raise (the last error when time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(POLL_S * 4)


@contextlib.contextmanager
def running(c: LocalCluster) -> Iterator[LocalCluster]:
    """Start every node of ``c`` and always close it afterwards; print the nodes' log tails
    when starting fails (a module fixture: ``with running(LocalCluster(3)) as c: yield c``)."""
    try:
        c.start_all()
        yield c
    except BaseException:
        print(c.tails(60))
        raise
    finally:
        c.close()
