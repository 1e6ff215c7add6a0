"""Real node processes on 127.0.0.1 for integration tests, and ``running``: the one way a
test starts a cluster and always stops it.

``LocalCluster`` starts node processes (``raftstream.tooling.localcluster.NodeLauncher``) on free
loopback ports, each with its own TOML config and data directory under one temporary
directory, waits by POLLING (gRPC health, then the cluster info's meta leader) rather than
sleeping fixed times, and ``close()`` always kills every process it started (by pid) and
removes the directory. Node output goes to a log file per node; ``tails()`` shows the ends
of them for a failing test. What is the tests' own: the settings a test gives the nodes
(raft timing, TLS, auth, tags), the probes' credentials, and noticing a node that exited
although the test neither killed nor stopped it (``unexpected_exits``).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import pytest
from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

from raftstream.proto import raftstream_pb2 as pb
from raftstream.tooling.localcluster import NodeLauncher, NodeSpec, config_argv
from raftstream.tooling.localnet import free_port
from tests.support.polling import NeverHappened, wait_for

__all__ = ["LocalCluster", "failed_test", "free_port", "run", "running", "until_led", "wait_logged"]

INFO_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 30.0
TAIL_LINES = 60


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
        self.tls = dict(tls or {})
        self.client_tls = client_tls
        self.root = Path(tempfile.mkdtemp(prefix="raftstream-it-"))
        self.names = [f"n{i + 1}" for i in range(n)]
        self.ports = {name: free_port() for name in self.names}
        self.metrics_ports = {name: free_port() for name in self.names}
        self.raft = {"tick_ms": 50, "election_ticks": 10, **(raft or {})}
        self.nodes = NodeLauncher(
            self.root,
            {name: f"127.0.0.1:{port}" for name, port in self.ports.items()},
            stop_timeout_s=STOP_TIMEOUT_S,
            info_timeout_s=INFO_TIMEOUT_S,
            channel=self._channel_to,
            metadata=client_metadata,
        )

    @property
    def client_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.nodes.metadata

    @client_metadata.setter
    def client_metadata(self, value: tuple[tuple[str, str], ...]) -> None:
        self.nodes.metadata = value

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        """The started nodes' processes (a node leaves when the test kills or stops it)."""
        return self.nodes.procs

    # -- addresses -------------------------------------------------------------------------

    def addr(self, name: str) -> str:
        return self.nodes.addrs[name]

    @property
    def servers(self) -> list[str]:
        return self.nodes.servers

    def config_path(self, name: str) -> Path:
        return self.root / f"{name}.toml"

    def _spec(self, name: str) -> NodeSpec:
        return self.nodes.spec(
            name,
            metrics_listen=f"127.0.0.1:{self.metrics_ports[name]}",
            raft=self.raft,
            tags=self.tags.get(name, []),
            tls=self.tls.get(name),
            extra_toml=self.auth or "",
        )

    # -- processes -------------------------------------------------------------------------

    def _write_config(self, name: str) -> Path:
        """Write ``name``'s config file (subclasses append sections to it, e.g. [limits])."""
        path = self.config_path(name)
        path.write_text(self._spec(name).toml())
        return path

    def start(self, name: str, *flags: str) -> None:
        """Start ``name`` from its config file; ``flags``: more ``raftstream server`` flags
        (``--join``)."""
        self.nodes.start_process(name, [*config_argv(self._write_config(name)), *flags])

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)
        self.nodes.wait_all_serving()
        self.wait_meta_leader()

    def kill(self, name: str) -> None:
        """kill -9 (no graceful anything), then reap it."""
        self.nodes.kill(name)

    def stop(self, name: str) -> int | None:
        """SIGTERM and wait: the graceful stop; returns the exit code."""
        return self.nodes.stop(name)

    def unexpected_exits(self) -> dict[str, int]:
        """Nodes that exited although the test neither killed nor stopped them: a crash."""
        return self.nodes.unexpected_exits()

    def close(self) -> None:
        self.nodes.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def tails(self, lines: int = 30) -> str:
        return self.nodes.tails(lines)

    # -- polling ---------------------------------------------------------------------------

    def _channel_to(self, addr: str) -> grpc.Channel:
        if self.client_tls is None:
            return grpc.insecure_channel(addr)
        ca, cert, key = (p.read_bytes() for p in self.client_tls)
        return grpc.secure_channel(addr, grpc.ssl_channel_credentials(ca, key, cert))

    def channel(self, name: str) -> grpc.Channel:
        """A blocking channel to the node (TLS with ``client_tls`` when set)."""
        return self._channel_to(self.addr(name))

    def wait_serving(self, name: str) -> None:
        self.nodes.wait_serving(name)

    def metrics(self, name: str) -> str:
        """The node's Prometheus exposition text."""
        return self.nodes.metrics(f"127.0.0.1:{self.metrics_ports[name]}")

    def cluster_info(self, name: str) -> pb.ClusterInfo | None:
        return self.nodes.cluster_info(name)

    def wait_meta_leader(self) -> str:
        """Wait until every running node names the same meta leader; return it."""
        return self.nodes.wait_meta_leader()

    def stream_leader(self, stream: str, account: str = "$G") -> str | None:
        """The stream's leader as the live nodes report it (None: none known)."""
        return self.nodes.stream_leader(stream, account)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def wait_logged(cluster: LocalCluster, name: str, text: str, timeout_s: float) -> None:
    """Wait until ``text`` is in the end (400 lines) of node ``name``'s log; on failure the
    message shows the ends of every node's log."""
    try:
        wait_for(
            f"{name} to log {text!r}",
            lambda: text in cluster.nodes.log_tail(name, 400),
            timeout_s,
            interval_s=0.1,
        )
    except NeverHappened as never:
        raise AssertionError(f"{name} never logged {text!r}:\n{cluster.tails(40)}") from never


class Cluster(Protocol):
    """What ``running`` needs of a cluster (``LocalCluster``; the chaos harness's too)."""

    def close(self) -> None: ...

    def tails(self, lines: int = ...) -> str: ...


C = TypeVar("C", bound=Cluster)


def failed_test(request: pytest.FixtureRequest) -> bool:
    """Whether the fixture's test failed (a module or session fixture: any test so far).
    The per-phase reports come from the hook in tests/conftest.py."""
    rep = getattr(request.node, "rep_call", None)
    if rep is not None:
        return bool(rep.failed)
    return request.scope != "function" and request.session.testsfailed > 0


@contextlib.contextmanager
def running(
    c: C,
    *,
    start: Callable[[], None] | None = None,
    request: pytest.FixtureRequest | None = None,
    fail_on_exit: bool = False,
    lines: int = TAIL_LINES,
) -> Iterator[C]:
    """Start every node of ``c`` (``start``, by default ``c.start_all``) and always close
    it afterwards: the one cluster context manager, for fixtures (``with running(
    LocalCluster(3), request=request) as c: yield c``) and for tests that start their own.

    The nodes' log tails are printed when starting fails or the body raises, and, given the
    fixture's ``request``, when its test failed. ``fail_on_exit``: fail the test if a node
    exited that the test neither killed nor stopped (``LocalCluster.unexpected_exits``).
    """
    try:
        (start or c.start_all)()  # type: ignore[attr-defined]
        yield c
        dead: dict[str, int] = c.unexpected_exits() if fail_on_exit else {}  # type: ignore[attr-defined]
        if dead or (request is not None and failed_test(request)):
            print(c.tails(lines))
        if dead:
            pytest.fail(f"node(s) exited during the test (name: exit code): {dead}")
    except BaseException:
        print(c.tails(lines))
        raise
    finally:
        c.close()


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE


# Retries a raw stub call while it answers UNAVAILABLE: a new stream's group elects its
# leader right after creation (on a loaded machine, slowly).
until_led = retry(
    retry=retry_if_exception(_unavailable),
    stop=stop_after_delay(30),
    wait=wait_fixed(0.05),
    reraise=True,
)
