"""A chaos cluster: real node processes on 127.0.0.1 whose every inter-node link is a proxy.

For ``n`` nodes there are ``n * (n - 1)`` Toxiproxy proxies, one per ordered pair: node
``i`` is configured with node ``j``'s address being the listen address of proxy ``i->j``
(each node is given its own peer table; its own entry is its real listen address), so
disabling proxy ``i->j`` cuts what ``i`` sends to ``j`` (and the answers on those
connections) and leaves ``j->i`` alone: one-way cuts. Clients dial nodes directly; a client
that follows a NOT_LEADER hint from node ``i`` goes through ``i``'s proxy to the leader,
because hints carry the answering node's peer table entry.

Everything lives under ``run_dir``: ``<node>/`` data directories (kept for the Spark audit),
``<node>.toml`` configs and ``<node>.log`` outputs. ``close()`` kills (SIGKILL, by pid) every
process this object started, resumes paused ones first, and deletes its proxies; it runs
even when start-up fails half way. The object belongs to one thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from toxiproxy import Proxy

from raftstream.chaos.proxyctl import ProxyService
from raftstream.localnet import READY_TIMEOUT_S, free_port, wait_for
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg

__all__ = ["ChaosCluster", "NodeProc", "wait_for"]

T = TypeVar("T")

RPC_TIMEOUT_S = 1.0
STOP_TIMEOUT_S = 20.0
# Fast Raft timing so that failovers fit short windows: election after 500 ms of silence.
DEFAULT_RAFT = {"tick_ms": 50, "election_ticks": 10}


@dataclass(slots=True)
class NodeProc:
    """One node: its name, client address, and the running process (None while down)."""

    name: str
    port: int
    data: Path
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"


class ChaosCluster:
    """``size`` nodes ``n1..nN`` behind per-link proxies (see the module docstring)."""

    def __init__(
        self,
        *,
        size: int,
        run_dir: Path,
        proxies: ProxyService,
        raft: dict[str, int] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.run_dir = run_dir
        self.proxies = proxies
        self.raft = {**DEFAULT_RAFT, **(raft or {})}
        self.names = [f"n{i + 1}" for i in range(size)]
        self.nodes = {n: NodeProc(n, free_port(), run_dir / n) for n in self.names}
        self.links: dict[tuple[str, str], Proxy] = {}
        # Nodes that refused to start on data a nemesis damaged: left down on purpose.
        self.damaged: set[str] = set()
        self._logs: list[IO[bytes]] = []

    # -- set-up ------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the proxies, start every node, wait until all serve and agree on a meta
        leader. On failure everything started is torn down before the error propagates."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._create_links()
            for name in self.names:
                self.start_node(name, wait=False)
            for name in self.names:
                self.wait_serving(name)
            self.wait_meta_leader()
        except BaseException:
            self.close()
            raise

    def _create_links(self) -> None:
        for src in self.names:
            for dst in self.names:
                if src == dst:
                    continue
                proxy = self.proxies.client.create(
                    upstream=self.nodes[dst].addr,
                    name=f"chaos_{src}_{dst}_{self.nodes[src].port}",
                    listen="127.0.0.1:0",
                    enabled=True,
                )
                self.links[(src, dst)] = proxy

    def link_addr(self, src: str, dst: str) -> str:
        """The address ``src`` dials to reach ``dst`` (the proxy's listen address)."""
        return str(self.links[(src, dst)].listen)

    def _write_config(self, name: str) -> Path:
        node = self.nodes[name]
        peers = {
            other: node.addr if other == name else self.link_addr(name, other)
            for other in self.names
        }
        peer_text = ", ".join(f'{k} = "{v}"' for k, v in peers.items())
        raft_text = "\n".join(f"{k} = {v}" for k, v in self.raft.items())
        text = (
            f'[cluster]\nname = "{name}"\nlisten = "{node.addr}"\n'
            f'data = "{node.data}"\npeers = {{ {peer_text} }}\n\n[raft]\n{raft_text}\n'
        )
        path = self.run_dir / f"{name}.toml"
        path.write_text(text)
        return path

    # -- processes ---------------------------------------------------------------------------

    def start_node(self, name: str, *, wait: bool = True) -> None:
        """Start ``name`` (a no-op if it runs); with ``wait``, until it serves."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None:
            return
        config = self._write_config(name)
        log = (self.run_dir / f"{name}.log").open("ab")
        self._logs.append(log)
        node.proc = subprocess.Popen(
            [sys.executable, "-m", "raftstream.cluster", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        node.paused = False
        if wait:
            self.wait_serving(name)

    def kill(self, name: str) -> None:
        """kill -9 ``name`` and reap it (resumed first if paused, so it dies at once)."""
        node = self.nodes[name]
        proc = node.proc
        if proc is None:
            return
        if proc.poll() is None:
            if node.paused:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)
        node.proc, node.paused = None, False

    def stop(self, name: str) -> int | None:
        """Graceful stop (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``); the exit code."""
        node = self.nodes[name]
        proc = node.proc
        if proc is None:
            return None
        if node.paused:
            proc.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        node.proc, node.paused = None, False
        return proc.returncode

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        node = self.nodes[name]
        if node.proc is not None and node.proc.poll() is None and not node.paused:
            node.proc.send_signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, name: str) -> None:
        """SIGCONT a paused node."""
        node = self.nodes[name]
        if node.proc is not None and node.paused:
            node.proc.send_signal(signal.SIGCONT)
            node.paused = False

    def running(self) -> list[str]:
        """Nodes whose process is alive (paused ones included)."""
        return [n for n, p in self.nodes.items() if p.proc is not None and p.proc.poll() is None]

    def exited(self, name: str) -> int | None:
        """The exit code of ``name`` if its process ended by itself, else None."""
        proc = self.nodes[name].proc
        return None if proc is None else proc.poll()

    def bounce_all(self) -> None:
        """kill -9 every node, then start them all again and wait for a meta leader."""
        for name in self.names:
            self.kill(name)
        for name in self.names:
            self.start_node(name, wait=False)
        for name in self.names:
            self.wait_serving(name)
        self.wait_meta_leader()

    def close(self) -> None:
        """Kill every process, delete the proxies, close the logs. Idempotent."""
        for name in self.names:
            with contextlib.suppress(Exception):
                self.kill(name)
        for proxy in self.links.values():
            with contextlib.suppress(Exception):
                proxy.destroy()
        self.links.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- links -------------------------------------------------------------------------------

    def cut(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Disable the proxies of the ordered ``pairs`` (drops their live connections)."""
        for pair in pairs:
            self.links[pair].disable()

    def heal(self) -> None:
        """Enable every proxy and remove every toxic."""
        for proxy in self.links.values():
            for toxic in list(proxy.toxics()):
                proxy.destroy_toxic(toxic)
            proxy.enable()

    def add_toxic(self, pair: tuple[str, str], **toxic: Any) -> None:
        """Add a toxic (toxiproxy-python ``add_toxic`` arguments) to the link ``pair``."""
        self.links[pair].add_toxic(**toxic)

    # -- polling -----------------------------------------------------------------------------

    def _health(self, name: str) -> bool:
        with grpc.insecure_channel(self.nodes[name].addr) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S
                )
            except grpc.RpcError:
                return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def wait_serving(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until ``name`` answers health SERVING; RuntimeError if its process exits."""
        proc = self.nodes[name].proc

        def probe() -> bool | None:
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                raise RuntimeError(f"{name} is not running (exit {code})")
            return True if self._health(name) else None

        wait_for(f"{name} serving", probe, timeout_s)

    def cluster_info(self, name: str) -> pb.ClusterInfo | None:
        """``name``'s view of the cluster, or None if it does not answer."""
        node = self.nodes[name]
        if node.proc is None or node.paused:
            return None
        with grpc.insecure_channel(node.addr) as ch:
            try:
                info: pb.ClusterInfo = pbg.ClusterServiceStub(ch).GetClusterInfo(
                    pb.ClusterInfoRequest(), timeout=RPC_TIMEOUT_S
                )
                return info
            except grpc.RpcError:
                return None

    def meta_leader(self) -> str | None:
        """The meta leader named by a majority of the running nodes, else None."""
        votes: dict[str, int] = {}
        for name in self.running():
            info = self.cluster_info(name)
            if info is not None and info.meta_leader:
                votes[info.meta_leader] = votes.get(info.meta_leader, 0) + 1
        for leader, count in votes.items():
            if count * 2 > len(self.names):
                return leader
        return None

    def wait_meta_leader(self, timeout_s: float = READY_TIMEOUT_S) -> str:
        return wait_for("a meta leader", self.meta_leader, timeout_s)

    def stream_leader(self, stream: str) -> str | None:
        """The leader of ``stream``'s group as a running node reports it, else None."""
        for name in self.running():
            info = self.cluster_info(name)
            if info is None:
                continue
            for g in info.groups:
                if g.stream == stream and g.group.leader:
                    return str(g.group.leader)
        return None

    def replicas_current(self, stream: str) -> bool:
        """True when the stream's leader reports every replica current with no lag."""
        leader = self.stream_leader(stream)
        info = self.cluster_info(leader) if leader else None
        if info is None:
            return False
        for g in info.groups:
            if g.stream == stream and g.group.leader == leader:
                return all(r.current and r.lag == 0 for r in g.group.replicas)
        return False

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last ``lines`` lines of ``name``'s log ("" when it has none)."""
        path = self.run_dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def tails(self, lines: int = 20) -> str:
        """The last lines of every node's log, for failure messages."""
        return "\n".join(f"--- {n} ---\n{self.log_tail(n, lines)}" for n in self.names)
