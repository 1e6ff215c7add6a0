"""Node processes for the cluster benchmark: start N on free loopback ports, always clean up.

``BenchNodes`` starts N nodes (``raftstream.tooling.localcluster.NodeLauncher``) on 127.0.0.1 free
ports, each with its own data directory under one root, default settings (fsync on), and
waits by polling: gRPC health on every node, then one meta leader known to every node.
``close()`` kills every process it started (by pid, SIGKILL) and removes the root; it runs
from ``finally``, from ``atexit`` and, on Linux, the kernel kills the nodes by itself if the
driver dies first (``PR_SET_PDEATHSIG``), so no node outlives a benchmark.

What is the benchmark's own here: a metrics port per node and the pids and CPU time of the
nodes for CPU accounting. (Not ``raftstream server --local-cluster``: its ports are given,
these are free ones.)
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from raftstream.tooling.localcluster import NodeLauncher, NodeSpec
from raftstream.tooling.localnet import free_port
from raftstream.tooling.procfs import cpu_seconds

__all__ = ["BenchNodes", "cpu_seconds"]

LOG_TAIL_LINES = 20


class BenchNodes:
    """``size`` nodes ``n1..nN`` under a fresh temporary root (in ``parent``, if given).

    Not thread-safe; use from one thread. ``start()`` returns once every node serves and
    agrees on a meta leader, or raises (after which ``close()`` still cleans up)."""

    def __init__(self, size: int, *, parent: str | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="raftstream-bench-cluster-", dir=parent))
        self.names = [f"n{i + 1}" for i in range(size)]
        self.ports = {name: free_port() for name in self.names}
        self.metrics_ports = {name: free_port() for name in self.names}
        self.nodes = NodeLauncher(
            self.root,
            {name: f"127.0.0.1:{port}" for name, port in self.ports.items()},
            kill_on_parent_death=True,  # the benchmark starts its nodes from the main thread
        )
        self._closed = False
        atexit.register(self.close)

    def addr(self, name: str) -> str:
        """The node's client (and Raft) address."""
        return self.nodes.addrs[name]

    @property
    def servers(self) -> list[str]:
        return self.nodes.servers

    def pid(self, name: str) -> int:
        return self.nodes.pid(name)

    def _spec(self, name: str) -> NodeSpec:
        return self.nodes.spec(
            name, metrics_listen=f"127.0.0.1:{self.metrics_ports[name]}", log_level="WARNING"
        )

    def start(self) -> None:
        """Start every node and wait until all serve and name the same meta leader."""
        for name in self.names:
            self.nodes.spawn(self._spec(name))
        self.nodes.wait_all_serving()
        self.nodes.wait_meta_leader(check_alive=True)

    def metrics(self, name: str) -> str:
        """The node's Prometheus exposition text (``/metrics``)."""
        return self.nodes.metrics(f"127.0.0.1:{self.metrics_ports[name]}")

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each node."""
        return {name: cpu_seconds(p.pid) for name, p in self.nodes.procs.items()}

    def tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every node's log (for an error message)."""
        return self.nodes.tails(lines)

    def close(self) -> None:
        """SIGKILL and reap every node, close the logs, remove the root. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.nodes.close()
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.close)
