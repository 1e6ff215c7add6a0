"""Node processes on this machine: the one launcher behind every local cluster.

Four places start real ``python -m raftstream.cluster`` processes on 127.0.0.1: the cluster
benchmark (``bench/cluster_nodes.py``), the integration tests (``tests/cluster/
node_harness.py``), the chaos harness (``chaos/cluster.py``, nodes behind proxies) and
``raftstream server --local-cluster`` (``raftstream/cli.py``). The mechanics are the same for
all of them and live here, once: a node's settings as flags or as a TOML file
(``NodeSpec``), spawning with the output in a log file per node (or the terminal), polling
until a node serves and the nodes agree on a meta leader, pausing, killing or stopping a
node and reaping it, log tails for failure messages, and a ``close()`` that leaves no
process running. What differs stays with each user: which peer addresses a node is given
(chaos: proxies), which ports (CLI: 7101.. or from --listen; others: free ones), whether
the directory is removed afterwards, CPU accounting, Ctrl-C handling.

Not in ``localnet``: that module is standard library only so that any layer may import it;
this one probes nodes over gRPC. It imports no node code (``raftstream.cluster``), only the
protocol stubs, as the SDK does: the node runs in the child process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from raftstream.errors import InvalidArgumentError
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.tooling.localnet import READY_TIMEOUT_S, wait_for

__all__ = [
    "LAUNCHER_PID_ENV",
    "Keeper",
    "NodeLauncher",
    "NodeSpec",
    "config_argv",
    "die_with_launcher",
]

PROBE_TIMEOUT_S = 1.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 20
# Keeper: a node that failed is started again after this long, doubling (up to the max) while
# it keeps failing within RESTART_STEADY_S of its start; after RESTART_QUICK_FAILS_MAX such
# failures in a row it is left stopped.
RESTART_WAIT_S = 1.0
RESTART_WAIT_MAX_S = 16.0
RESTART_STEADY_S = 30.0
RESTART_QUICK_FAILS_MAX = 5
_PR_SET_PDEATHSIG = 1
# Set by a launcher with kill_on_parent_death in its nodes' environment: its pid
# (die_with_launcher).
LAUNCHER_PID_ENV = "RAFTSTREAM_LAUNCHER_PID"

Metadata = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class NodeSpec:
    """What one node is told: the ``raftstream server`` settings, as flags or TOML.

    ``peers`` maps every node's name to the address THIS node dials for it (its own entry
    is its listen address; the chaos harness gives the others proxy addresses). ``tags``
    None leaves the line out; ``extra_toml`` (an ``[auth]`` section) is appended as is.
    """

    name: str
    listen: str
    data: Path
    peers: Mapping[str, str]
    metrics_listen: str | None = None
    raft: Mapping[str, int] = field(default_factory=dict)
    tags: list[str] | None = None
    tls: tuple[Path, Path, Path] | None = None  # ca, cert, key
    extra_toml: str = ""
    log_level: str | None = None

    def argv(self) -> list[str]:
        """The node's command line with flags (no config file)."""
        for key, given in (("raft", bool(self.raft)), ("extra_toml", bool(self.extra_toml))):
            if given:
                raise InvalidArgumentError(key, "has no flag: give the node a config file")
        args = [
            sys.executable, "-m", "raftstream.cluster",
            "--name", self.name, "--listen", self.listen, "--data", str(self.data),
            "--peers", ",".join(f"{n}={a}" for n, a in self.peers.items()),
        ]  # fmt: skip
        if self.metrics_listen is not None:
            args += ["--metrics-listen", self.metrics_listen]
        if self.tags:
            args += ["--tags", ",".join(self.tags)]
        if self.log_level is not None:
            args += ["--log-level", self.log_level]
        if self.tls is not None:
            ca_file, cert_file, key_file = (str(p) for p in self.tls)
            args += ["--tls-ca", ca_file, "--tls-cert", cert_file, "--tls-key", key_file]
        return args

    def toml(self) -> str:
        """The node's settings as a ``--config`` file."""
        peers = ", ".join(f'{n} = "{a}"' for n, a in self.peers.items())
        text = (
            f'[cluster]\nname = "{self.name}"\nlisten = "{self.listen}"\n'
            f'data = "{self.data}"\npeers = {{ {peers} }}\n'
        )
        if self.metrics_listen is not None:
            text += f'metrics_listen = "{self.metrics_listen}"\n'
        if self.tags is not None:
            text += f"tags = [{', '.join(repr(t) for t in self.tags)}]\n"
        raft = "\n".join(f"{k} = {v}" for k, v in self.raft.items())
        text += f"\n[raft]\n{raft}\n"
        if self.tls is not None:
            ca, cert, key = self.tls
            text += f'\n[tls]\nca_file = "{ca}"\ncert_file = "{cert}"\nkey_file = "{key}"\n'
        if self.extra_toml:
            text += "\n" + self.extra_toml
        return text


def config_argv(path: Path, log_level: str | None = None) -> list[str]:
    """The command line of a node whose settings are in the TOML file ``path``."""
    argv = [sys.executable, "-m", "raftstream.cluster", "--config", str(path)]
    return argv if log_level is None else [*argv, "--log-level", log_level]


def die_with_launcher() -> None:
    """Called by every node at its start (``raftstream server``): when the launcher that
    started it asked (``kill_on_parent_death``, its pid in ``LAUNCHER_PID_ENV``), have the
    kernel SIGKILL this process when the launcher's thread that started it exits (Linux
    ``PR_SET_PDEATHSIG``), so no node outlives a driver that died first, and exit at once
    if the launcher is already gone. Nothing when not asked.

    Set here, after exec, not in a ``preexec_fn``: a ``preexec_fn`` makes ``subprocess``
    fork instead of vfork, and grpcio (1.80 to 1.85 at least) then restarts its poller
    thread in the child, which aborts on the descriptors the child closes before exec: a
    launcher whose own gRPC calls are under way lost about one node start in five to
    SIGABRT (grpc/grpc#43055)."""
    launcher = os.environ.pop(LAUNCHER_PID_ENV, None)
    if launcher is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != launcher.strip():
        sys.exit(f"raftstream: the process that started this node (pid {launcher}) has exited")


def _insecure(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr)


class NodeLauncher:
    """Node processes named in ``addrs`` (name -> client address), files under ``root``.

    ``logs``: each node's output goes to ``root/<name>.log`` (appended across restarts);
    without, it goes to this process's terminal. ``config_files``: a node gets
    ``--config root/<name>.toml`` rather than flags. ``kill_on_parent_death``: see
    ``die_with_launcher`` (for drivers that start nodes from their main thread only).
    ``channel`` makes the probes' channels (TLS for secured clusters), ``metadata`` is what
    the cluster info probe sends (credentials).

    ``procs`` holds a node from its start until this object kills or stops it (a node that
    exits by itself stays there, so its exit code can be read). Not thread-safe; use from
    one thread. ``close()`` kills and reaps every process it started; it does not remove
    ``root``: whether the directory is kept is the caller's choice.
    """

    def __init__(
        self,
        root: Path,
        addrs: Mapping[str, str],
        *,
        logs: bool = True,
        config_files: bool = False,
        kill_on_parent_death: bool = False,
        stop_timeout_s: float = STOP_TIMEOUT_S,
        info_timeout_s: float = PROBE_TIMEOUT_S,
        channel: Callable[[str], grpc.Channel] = _insecure,
        metadata: Metadata = (),
    ) -> None:
        self.root = root
        self.addrs = dict(addrs)
        self.names = list(addrs)
        self.logs = logs
        self.config_files = config_files
        self.kill_on_parent_death = kill_on_parent_death
        self.stop_timeout_s = stop_timeout_s
        self.info_timeout_s = info_timeout_s
        self.channel = channel
        self.metadata = metadata
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self._log_files: list[IO[bytes]] = []

    @property
    def servers(self) -> list[str]:
        """Every node's client address, in name order (what an SDK client is given)."""
        return [self.addrs[n] for n in self.names]

    def spec(self, name: str, **fields: Any) -> NodeSpec:
        """Node ``name`` as this launcher places it: listening on its address, data in
        ``root/<name>``, every node its peer; ``fields`` set the rest of the ``NodeSpec``."""
        return NodeSpec(
            name=name, listen=self.addrs[name], data=self.root / name, peers=self.addrs, **fields
        )

    # -- processes ---------------------------------------------------------------------------

    def spawn(self, spec: NodeSpec) -> subprocess.Popen[bytes]:
        """Start the node ``spec`` describes (the caller makes sure it is not running)."""
        if not self.config_files:
            return self.start_process(spec.name, spec.argv())
        path = self.root / f"{spec.name}.toml"
        path.write_text(spec.toml())
        return self.start_process(spec.name, config_argv(path, spec.log_level))

    def start_process(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start node ``name`` with the command line ``argv`` (``NodeSpec.argv``, or
        ``config_argv`` of a config file the caller wrote itself)."""
        log: IO[bytes] | None = None
        if self.logs:
            log = (self.root / f"{name}.log").open("ab")
            self._log_files.append(log)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.kill_on_parent_death:  # the node sees to it (die_with_launcher)
            env[LAUNCHER_PID_ENV] = str(os.getpid())
        self.procs[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT if log is not None else None,
            stdin=subprocess.DEVNULL if log is not None else None,
            env=env,
        )
        self.paused.discard(name)
        return self.procs[name]

    def alive(self, name: str) -> bool:
        """Whether ``name``'s process runs (a paused one does)."""
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def running(self) -> list[str]:
        """Nodes whose process is alive (paused ones included)."""
        return [n for n in self.names if self.alive(n)]

    def exited(self, name: str) -> int | None:
        """The exit code of ``name`` if its process ended by itself, else None."""
        p = self.procs.get(name)
        return None if p is None else p.poll()

    def unexpected_exits(self) -> dict[str, int]:
        """Nodes that exited although nobody killed or stopped them: a crash."""
        codes = {name: p.poll() for name, p in self.procs.items()}
        return {name: code for name, code in codes.items() if code is not None}

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def pause(self, name: str) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        if self.alive(name) and name not in self.paused:
            self.procs[name].send_signal(signal.SIGSTOP)
            self.paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT a paused node."""
        if name in self.paused:
            self.paused.discard(name)
            if self.alive(name):
                self.procs[name].send_signal(signal.SIGCONT)

    def kill(self, name: str) -> None:
        """kill -9 (no graceful anything; resumed first if paused, so it dies at once), then
        reap it. A no-op for a node that is not running."""
        p = self.procs.pop(name, None)
        if p is None:
            return
        self._signal_resumed(name, p, signal.SIGKILL)
        p.wait()

    def _signal_resumed(self, name: str, p: subprocess.Popen[bytes], sig: int) -> None:
        """Send ``sig`` to a running ``p`` (SIGCONT first if paused, so a stopped process
        acts on it at once); ``name`` is not paused afterwards."""
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if name in self.paused:
                    p.send_signal(signal.SIGCONT)
                p.send_signal(sig)
        self.paused.discard(name)

    def stop(self, name: str) -> int | None:
        """Graceful stop (SIGTERM; SIGKILL after ``stop_timeout_s``); the exit code, None if
        the node was not running."""
        p = self.procs.get(name)
        if p is None:
            return None
        self.stop_all([name])
        return p.returncode

    def stop_all(self, names: Iterable[str] | None = None) -> None:
        """SIGTERM every node (or ``names``) at once, then wait for all of them together
        for ``stop_timeout_s``; SIGKILL what is still running then."""
        procs = {n: self.procs.pop(n) for n in list(names or self.procs) if n in self.procs}
        for name, p in procs.items():
            self._signal_resumed(name, p, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for p in procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        """Kill and reap every process, close the logs. Idempotent; ``root`` stays."""
        for name in list(self.procs):
            self.kill(name)
        for log in self._log_files:
            log.close()
        self._log_files.clear()

    # -- logs --------------------------------------------------------------------------------

    def log_tail(self, name: str, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of ``name``'s log ("" when it has none)."""
        path = self.root / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _state(self, name: str) -> str:
        p = self.procs.get(name)
        if p is None:
            return "not running"
        code = p.poll()
        return "running" if code is None else f"exited {code}"

    def tails(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last lines of every node's log with its state, for failure messages."""
        return "\n".join(
            f"--- {n} ({self._state(n)}) ---\n{self.log_tail(n, lines)}"
            for n in self.names
            if (self.root / f"{n}.log").exists()
        )

    # -- polling -----------------------------------------------------------------------------

    def health(self, name: str) -> bool:
        """Whether ``name`` answers gRPC health SERVING."""
        with self.channel(self.addrs[name]) as ch:
            try:
                resp = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=PROBE_TIMEOUT_S
                )
            except grpc.RpcError:
                return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    def wait_serving(self, name: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until ``name`` serves; RuntimeError (with the log tails) if its process is gone."""

        def probe() -> bool | None:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                code = None if p is None else p.returncode
                raise RuntimeError(f"{name} exited with {code}:\n{self.tails()}")
            return True if self.health(name) else None

        wait_for(f"{name} serving", probe, timeout_s)

    def wait_all_serving(self, names: Iterable[str] | None = None) -> None:
        for name in names or self.names:
            self.wait_serving(name)

    def cluster_info(self, name: str) -> pb.ClusterInfo | None:
        """``name``'s view of the cluster, or None if it does not answer (or is paused)."""
        if name not in self.procs or name in self.paused:
            return None
        with self.channel(self.addrs[name]) as ch:
            try:
                info: pb.ClusterInfo = pbg.ClusterServiceStub(ch).GetClusterInfo(
                    pb.ClusterInfoRequest(), timeout=self.info_timeout_s, metadata=self.metadata
                )
            except grpc.RpcError:
                return None
        return info

    def agreed_meta_leader(self, *, check_alive: bool = False) -> str | None:
        """The meta leader every started node names, None until they all name the same.
        ``check_alive``: RuntimeError (with the log tails) if one of them has exited."""
        seen: set[str] = set()
        for name in list(self.procs):
            if check_alive and self.exited(name) is not None:
                raise RuntimeError(f"{name} exited with {self.exited(name)}:\n{self.tails()}")
            info = self.cluster_info(name)
            seen.add(info.meta_leader if info is not None else "")
        leader = seen.pop() if len(seen) == 1 else ""
        return str(leader) if leader else None

    def wait_meta_leader(self, *, check_alive: bool = False) -> str:
        """Wait until every started node names the same meta leader; return it."""
        return wait_for(
            "one meta leader known to every node",
            lambda: self.agreed_meta_leader(check_alive=check_alive),
        )

    def stream_leader(self, stream: str, account: str | None = None) -> str | None:
        """The stream's leader as a started node reports it (``account``: only that
        account's stream); None when none is known."""
        for name in list(self.procs):
            info = self.cluster_info(name)
            if info is None:
                continue
            for g in info.groups:
                if (
                    g.stream == stream
                    and (account is None or g.account == account)
                    and g.group.leader
                ):
                    return str(g.group.leader)
        return None

    @staticmethod
    def metrics(metrics_addr: str) -> str:
        """A node's Prometheus exposition text from its ``host:port`` metrics listener."""
        url = f"http://{metrics_addr}/metrics"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S * 5) as resp:
            return str(resp.read().decode())


@dataclass(slots=True)
class _Kept:
    started: float
    quick_fails: int = 0
    restart_at: float | None = None
    # Left stopped: "stopped" (it exited with 0) or "failed" (it kept failing); "" while kept.
    end: str = ""


class Keeper:
    """Keeps the nodes of ``raftstream server --local-cluster`` running, as a service
    manager does (systemd's ``Restart=on-failure``): a node that exits by itself with a
    failure (a crash, a kill -9, a refusal to start) is started again with the same settings
    and data after ``RESTART_WAIT_S``, the wait doubling up to ``RESTART_WAIT_MAX_S`` while it
    keeps failing within ``RESTART_STEADY_S`` of its start; after ``RESTART_QUICK_FAILS_MAX``
    such failures in a row it is left stopped (its own output says why). A node that exits
    with 0 (someone stopped it with SIGTERM) is left stopped. The other nodes serve on
    throughout: a cluster of three keeps its quorum with one node down.

    ``check()`` looks once (call it every half second or so from the thread that owns
    ``nodes``); ``say`` gets one line per event. ``clock`` is for tests."""

    def __init__(
        self,
        nodes: NodeLauncher,
        specs: Mapping[str, NodeSpec],
        *,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nodes = nodes
        self._specs = dict(specs)
        self._say = say
        self._clock = clock
        now = clock()
        self._kept = {name: _Kept(started=now) for name in self._specs}

    @property
    def failed(self) -> list[str]:
        """Nodes left stopped because they kept failing."""
        return [n for n, k in self._kept.items() if k.end == "failed"]

    def check(self) -> bool:
        """Report exits and start again the nodes whose wait is over; False once no node
        runs or waits to be started again."""
        now = self._clock()
        for name, kept in self._kept.items():
            if kept.end:
                continue
            if kept.restart_at is not None:
                if now >= kept.restart_at:
                    self._start(name, kept, now)
                continue
            code = self._nodes.exited(name)
            if code is not None:
                self._exited(name, kept, code, now)
        return any(not k.end for k in self._kept.values())

    def _exited(self, name: str, kept: _Kept, code: int, now: float) -> None:
        if code == 0:
            kept.end = "stopped"
            self._say(f"node {name} stopped (exit code 0); the others keep serving")
            return
        quick = now - kept.started < RESTART_STEADY_S
        kept.quick_fails = kept.quick_fails + 1 if quick else 1
        how = f"killed by {_signal_name(-code)}" if code < 0 else f"exit code {code}"
        if kept.quick_fails >= RESTART_QUICK_FAILS_MAX:
            kept.end = "failed"
            self._say(
                f"node {name} exited ({how}), {kept.quick_fails} times in a row within "
                f"{RESTART_STEADY_S:.0f} s of starting: left stopped (its output above says "
                "why); the others keep serving"
            )
            return
        wait_s = min(RESTART_WAIT_MAX_S, RESTART_WAIT_S * 2 ** (kept.quick_fails - 1))
        kept.restart_at = now + wait_s
        self._say(
            f"node {name} exited ({how}); starting it again in {wait_s:g} s with its data "
            f"under {self._specs[name].data}"
        )

    def _start(self, name: str, kept: _Kept, now: float) -> None:
        kept.restart_at, kept.started = None, now
        proc = self._nodes.spawn(self._specs[name])
        self._say(f"node {name} started again (pid {proc.pid})")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
