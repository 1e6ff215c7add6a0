"""Node processes for the cluster benchmark: start N on free loopback ports, always clean up.

``BenchNodes`` starts ``python -m raftstream.cluster`` (the ``raftstream server`` command) N
times on 127.0.0.1 free ports, each with its own data directory under one root, default
settings (fsync on), and waits by polling: gRPC health on every node, then one meta leader
known to every node. ``close()`` kills every process it started (by pid, SIGKILL) and removes
the root; it runs from ``finally``, from ``atexit`` and, on Linux, the kernel kills the nodes
by itself if the driver dies first (``PR_SET_PDEATHSIG``), so no node outlives a benchmark.

This is a benchmark's launcher, not the test harness (``tests/`` is not importable from an
installed package) and not ``raftstream server --local-cluster`` (fixed ports 7101..).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import IO, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftstream.localnet import free_port, wait_for
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

__all__ = ["BenchNodes", "cpu_seconds"]

T = TypeVar("T")

PROBE_TIMEOUT_S = 1.0
LOG_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc/<pid>/stat (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK  # utime, stime


def _die_with_parent() -> None:
    """Run in the child before exec: the kernel SIGKILLs it when the driver exits (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class BenchNodes:
    """``size`` nodes ``n1..nN`` under a fresh temporary root (in ``parent``, if given).

    Not thread-safe; use from one thread. ``start()`` returns once every node serves and
    agrees on a meta leader, or raises (after which ``close()`` still cleans up)."""

    def __init__(self, size: int, *, parent: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="raftstream-bench-cluster-", dir=parent))
        self.names = [f"n{i + 1}" for i in range(size)]
        self.ports = {name: free_port() for name in self.names}
        self.metrics_ports = {name: free_port() for name in self.names}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._closed = False
        atexit.register(self.close)

    def addr(self, name: str) -> str:
        """The node's client (and Raft) address."""
        return f"127.0.0.1:{self.ports[name]}"

    @property
    def servers(self) -> list[str]:
        return [self.addr(n) for n in self.names]

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def _argv(self, name: str) -> list[str]:
        peers = ",".join(f"{n}={self.addr(n)}" for n in self.names)
        return [
            sys.executable, "-m", "raftstream.cluster",
            "--name", name, "--listen", self.addr(name),
            "--data", str(self.root / name), "--peers", peers, "--log-level", "WARNING",
            "--metrics-listen", f"127.0.0.1:{self.metrics_ports[name]}",
        ]  # fmt: skip

    def start(self) -> None:
        """Start every node and wait until all serve and name the same meta leader."""
        for name in self.names:
            log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (closed in close())
            self._logs[name] = log
            self.procs[name] = subprocess.Popen(
                self._argv(name),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_parent,  # called before any thread starts; Linux only
            )
        for name in self.names:
            wait_for(f"{name} serving", lambda n=name: True if self._serving(n) else None)  # type: ignore[misc]
        wait_for("one meta leader known to every node", self._meta_leader)

    def _check_alive(self, name: str) -> None:
        p = self.procs[name]
        if p.poll() is not None:
            raise RuntimeError(f"node {name} exited with {p.returncode}:\n{self.tails()}")

    def _serving(self, name: str) -> bool:
        self._check_alive(name)
        with grpc.insecure_channel(self.addr(name)) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S
                )
            except grpc.RpcError:
                return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def _meta_leader(self) -> str | None:
        seen: set[str] = set()
        for name in self.names:
            self._check_alive(name)
            with grpc.insecure_channel(self.addr(name)) as ch:
                try:
                    info = pbg.ClusterServiceStub(ch).GetClusterInfo(
                        pb.ClusterInfoRequest(), timeout=PROBE_TIMEOUT_S
                    )
                except grpc.RpcError:
                    return None
            seen.add(str(info.meta_leader))
        leader = seen.pop() if len(seen) == 1 else ""
        return leader or None

    def metrics(self, name: str) -> str:
        """The node's Prometheus exposition text (``/metrics``)."""
        url = f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S * 5) as resp:
            return str(resp.read().decode())

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each node."""
        return {name: cpu_seconds(p.pid) for name, p in self.procs.items()}

    def tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every node's log (for an error message)."""
        out = []
        for name in self.names:
            path = self.root / f"{name}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} ---\n" + "\n".join(text))
        return "\n".join(out)

    def close(self) -> None:
        """SIGKILL and reap every node, close the logs, remove the root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGKILL)
            p.wait()
        self.procs.clear()
        for log in self._logs.values():
            log.close()
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)
