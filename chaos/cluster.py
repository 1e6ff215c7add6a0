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
even when start-up fails half way. The object belongs to one thread. The processes
themselves (spawning, readiness, signals, reaping, logs) are ``raftstream.tooling.localcluster``'s;
what is the chaos harness's own is the proxies and the peer table made of them.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed
from toxiproxy import Proxy

from raftstream.chaos.proxyctl import ProxyService
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.tooling.localcluster import NodeLauncher, NodeSpec
from raftstream.tooling.localnet import READY_TIMEOUT_S, free_port, wait_for

__all__ = ["ChaosCluster", "NodeProc", "wait_for"]

RPC_TIMEOUT_S = 1.0
# Membership calls (remove_peer, add_peer): each try, and all of them.
MEMBERSHIP_RPC_TIMEOUT_S = 5.0
MEMBERSHIP_WAIT_S = 30.0
MEMBERSHIP_RETRY_S = 0.2
STOP_TIMEOUT_S = 20.0
# Fast Raft timing so that failovers fit short windows: election after 500 ms of silence.
DEFAULT_RAFT = {"tick_ms": 50, "election_ticks": 10}


@dataclass(slots=True)
class NodeProc:
    """One node: its name, client address and data directory (its process: ``process``)."""

    name: str
    port: int
    data: Path

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
        self.launcher = NodeLauncher(
            run_dir,
            {n: node.addr for n, node in self.nodes.items()},
            config_files=True,
            stop_timeout_s=STOP_TIMEOUT_S,
            info_timeout_s=RPC_TIMEOUT_S,
        )

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

    def _spec(self, name: str) -> NodeSpec:
        """``name``'s settings: its peers are the proxies it dials, itself its real address."""
        node = self.nodes[name]
        peers = {
            other: node.addr if other == name else self.link_addr(name, other)
            for other in self.names
        }
        return NodeSpec(name=name, listen=node.addr, data=node.data, peers=peers, raft=self.raft)

    # -- processes ---------------------------------------------------------------------------

    def start_node(self, name: str, *, wait: bool = True) -> None:
        """Start ``name`` (a no-op if it runs); with ``wait``, until it serves."""
        if self.launcher.alive(name):
            return
        self.launcher.spawn(self._spec(name))
        if wait:
            self.wait_serving(name)

    def process(self, name: str) -> subprocess.Popen[bytes] | None:
        """``name``'s process; None while down (killed or stopped: a node that exited by
        itself keeps its process until then, so that ``exited`` can read its code)."""
        return self.launcher.procs.get(name)

    def kill(self, name: str) -> None:
        """kill -9 ``name`` and reap it (resumed first if paused, so it dies at once)."""
        self.launcher.kill(name)

    def stop(self, name: str) -> int | None:
        """Graceful stop (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``); the exit code."""
        return self.launcher.stop(name)

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        self.launcher.pause(name)

    def resume(self, name: str) -> None:
        """SIGCONT a paused node."""
        self.launcher.resume(name)

    def running(self) -> list[str]:
        """Nodes whose process is alive (paused ones included)."""
        return self.launcher.running()

    def exited(self, name: str) -> int | None:
        """The exit code of ``name`` if its process ended by itself, else None."""
        return self.launcher.exited(name)

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
                self.launcher.kill(name)
        for proxy in self.links.values():
            with contextlib.suppress(Exception):
                proxy.destroy()
        self.links.clear()
        self.launcher.close()

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

    def wait_serving(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until ``name`` answers health SERVING; RuntimeError if its process exits."""
        self.launcher.wait_serving(name, timeout_s)

    def cluster_info(self, name: str) -> pb.ClusterInfo | None:
        """``name``'s view of the cluster, or None if it does not answer."""
        return self.launcher.cluster_info(name)

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
        return self.launcher.stream_leader(stream)

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

    def remove_peer(self, peer: str) -> None:
        """``raftstream cluster peer-remove PEER``, through any running node (forwarded to
        the meta leader), tried again until it answers or ``MEMBERSHIP_WAIT_S`` passes (a
        meta election may be under way)."""
        self._membership("RemovePeer", pb.RemovePeerRequest(peer=peer), avoid=peer)

    def add_peer(self, peer: str) -> None:
        """``raftstream cluster peer-add PEER``: readmit a removed node (as ``remove_peer``)."""
        self._membership("AddPeer", pb.AddPeerRequest(peer=peer), avoid=peer)

    def _membership(self, method: str, request: Any, *, avoid: str) -> None:
        for attempt in Retrying(
            stop=stop_after_delay(MEMBERSHIP_WAIT_S),
            wait=wait_fixed(MEMBERSHIP_RETRY_S),
            retry=retry_if_exception_type(grpc.RpcError),
            reraise=True,
        ):
            with attempt:
                via = [n for n in self.running() if n != avoid and n not in self.launcher.paused]
                if not via:
                    raise RuntimeError(f"{method}: no running node to ask")
                node = self.nodes[via[attempt.retry_state.attempt_number % len(via)]]
                with grpc.insecure_channel(node.addr) as ch:
                    stub = pbg.ClusterServiceStub(ch)
                    getattr(stub, method)(request, timeout=MEMBERSHIP_RPC_TIMEOUT_S)

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last ``lines`` lines of ``name``'s log ("" when it has none)."""
        return self.launcher.log_tail(name, lines)

    def tails(self, lines: int = 20) -> str:
        """The last lines of every node's log, for failure messages."""
        return self.launcher.tails(lines)
