"""``raftstream.tooling.localcluster``: a node's flags and config file say the same thing, and the
launcher reaps every process it starts.

Every local launcher (bench, tests, chaos, ``server --local-cluster``) describes a node with
one ``NodeSpec`` and hands it over either as flags or as a TOML file; both must reach the
node as the same configuration, which is what ``load_config`` (the node's own parser) shows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftstream.cluster.config import load_config
from raftstream.errors import InvalidArgumentError
from raftstream.tooling.certs import generate
from raftstream.tooling.localcluster import (
    LAUNCHER_PID_ENV,
    RESTART_QUICK_FAILS_MAX,
    RESTART_STEADY_S,
    RESTART_WAIT_MAX_S,
    RESTART_WAIT_S,
    Keeper,
    NodeLauncher,
    NodeSpec,
)
from raftstream.tooling.localnet import free_port
from raftstream.tooling.procfs import running
from tests.support.polling import wait_for

FLAG_KEYS = {
    "--name": "name",
    "--listen": "listen",
    "--data": "data",
    "--peers": "peers",
    "--metrics-listen": "metrics_listen",
    "--tags": "tags",
    "--tls-ca": "tls_ca_file",
    "--tls-cert": "tls_cert_file",
    "--tls-key": "tls_key_file",
}


def _spec(tmp_path: Path, **kw: object) -> NodeSpec:
    base: dict[str, object] = dict(
        name="n2",
        listen="127.0.0.1:7102",
        data=tmp_path / "n2",
        peers={"n1": "127.0.0.1:7101", "n2": "127.0.0.1:7102", "n3": "127.0.0.1:7203"},
        metrics_listen="127.0.0.1:9102",
        tags=["ssd", "zone-a"],
    )
    return NodeSpec(**{**base, **kw})  # type: ignore[arg-type]


def _from_argv(argv: list[str]) -> dict[str, str]:
    rest = argv[argv.index("raftstream.cluster") + 1 :]
    pairs = dict(zip(rest[::2], rest[1::2], strict=True))
    return {FLAG_KEYS[k]: v for k, v in pairs.items() if k in FLAG_KEYS}


def test_flags_and_config_file_give_the_node_the_same_configuration(tmp_path: Path) -> None:
    certs = generate(tmp_path / "certs", nodes=["n2"])  # the config's [tls] files are read
    spec = _spec(tmp_path, tls=(certs.ca, certs.nodes["n2"].cert, certs.nodes["n2"].key))
    path = tmp_path / "n2.toml"
    path.write_text(spec.toml())
    from_file = load_config(path)
    from_flags = load_config(None, **_from_argv(spec.argv()))
    assert from_file == from_flags
    assert from_file.name == "n2" and from_file.tags == ("ssd", "zone-a")
    assert str(from_file.peers["n3"]) == "127.0.0.1:7203"
    assert from_file.tls is not None and from_file.tls.cert_file == certs.nodes["n2"].cert


def test_config_file_carries_raft_settings_and_extra_sections(tmp_path: Path) -> None:
    spec = _spec(tmp_path, raft={"tick_ms": 50, "election_ticks": 10}, tls=None, tags=None)
    path = tmp_path / "n2.toml"
    path.write_text(spec.toml())
    config = load_config(path)
    assert config.raft.tick_ms == 50 and config.raft.election_ticks == 10
    assert config.tls is None and config.tags == ()


@pytest.mark.parametrize("field", ["raft", "extra_toml"])
def test_settings_without_a_flag_are_refused_as_flags(tmp_path: Path, field: str) -> None:
    value: object = {"tick_ms": 50} if field == "raft" else "[auth]\n"
    spec = _spec(tmp_path, **{field: value})
    with pytest.raises(InvalidArgumentError) as err:
        spec.argv()
    assert err.value.field == field


# -- NodeLauncher's process handling, with stand-in processes (no node: fast) ------------------

SLEEPER = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(600)"]
EXIT_3 = [sys.executable, "-c", "import sys; print('bye', flush=True); sys.exit(3)"]


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[NodeLauncher]:
    nodes = NodeLauncher(tmp_path, {n: f"127.0.0.1:{free_port()}" for n in ("n1", "n2", "n3")})
    try:
        yield nodes
    finally:
        nodes.close()


def test_kill_stop_and_close_reap_every_process(launcher: NodeLauncher) -> None:
    procs = {n: launcher.start_process(n, SLEEPER) for n in launcher.names}
    launcher.pause("n1")
    launcher.kill("n1")  # a paused process dies too (resumed first)
    assert procs["n1"].returncode == -signal.SIGKILL
    assert launcher.stop("n2") == -signal.SIGTERM
    assert launcher.running() == ["n3"] and launcher.unexpected_exits() == {}
    launcher.close()
    assert all(p.returncode is not None for p in procs.values())
    assert launcher.procs == {} and launcher.running() == []


def test_a_process_that_exits_by_itself_is_reported_with_its_log(launcher: NodeLauncher) -> None:
    launcher.start_process("n1", EXIT_3)
    launcher.start_process("n2", SLEEPER)
    wait_for("n1 to exit", lambda: launcher.exited("n1"))
    assert launcher.unexpected_exits() == {"n1": 3}
    with pytest.raises(RuntimeError, match="n1 exited with 3") as err:
        launcher.wait_serving("n1")
    assert "--- n1 (exited 3) ---\nbye" in str(err.value)
    launcher.stop_all()
    assert launcher.procs == {}


# -- kill_on_parent_death: a node dies with its launcher ---------------------------------------


def test_a_launcher_whose_grpc_runs_starts_every_child(tmp_path: Path) -> None:
    # grpcio aborts a forked child whose parent's gRPC is busy (die_with_launcher): started
    # with a preexec_fn, about one start in five of these died of SIGABRT before its exec.
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = health_pb2_grpc.HealthStub(channel)
    done = threading.Event()

    def calls() -> None:
        while not done.is_set():
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)

    caller = threading.Thread(target=calls)
    caller.start()
    nodes = NodeLauncher(tmp_path, {"n1": "127.0.0.1:1"}, kill_on_parent_death=True)
    codes = []
    try:
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)  # under way from here
        for _ in range(60):
            codes.append(nodes.start_process("n1", ["true"]).wait(timeout=30))
    finally:
        nodes.close()
        done.set()
        caller.join()
        channel.close()
        server.stop(None)
    assert codes == [0] * 60


def test_a_node_dies_with_the_launcher_that_asked(tmp_path: Path) -> None:
    child = (
        "from raftstream.tooling.localcluster import die_with_launcher; import time; "
        "die_with_launcher(); print('ready', flush=True); time.sleep(600)"
    )
    driver = (
        "import sys, time; from pathlib import Path; "
        "from raftstream.tooling.localcluster import NodeLauncher; "
        f"nodes = NodeLauncher(Path({str(tmp_path)!r}), {{'n1': '127.0.0.1:1'}}, "
        "kill_on_parent_death=True); "
        f"p = nodes.start_process('n1', [sys.executable, '-c', {child!r}]); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    pid = int(launcher.stdout.readline())
    try:
        log = tmp_path / "n1.log"
        wait_for("the node to be ready", lambda: "ready" in log.read_text() or None)
        assert running(pid)
        launcher.kill()
        launcher.wait()
        assert wait_for("the node to die with its launcher", lambda: not running(pid) or None)
    finally:
        launcher.kill()
        launcher.wait()
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_node_whose_launcher_is_gone_does_not_start(tmp_path: Path) -> None:
    # The launcher died between starting the node and the node's asking the kernel.
    env = {**os.environ, LAUNCHER_PID_ENV: "1"}
    argv = [sys.executable, "-m", "raftstream.cluster", "--name", "n1", "--data",
            str(tmp_path / "n1"), "--listen", f"127.0.0.1:{free_port()}"]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "the process that started this node (pid 1) has exited" in done.stderr
    assert not (tmp_path / "n1").exists()  # it stopped before touching its data directory


# -- Keeper: what `server --local-cluster` does when a node exits ----------------------------


class _StandIns(NodeLauncher):
    """Starts a stand-in process for a node spec (no node: fast)."""

    commands: dict[str, list[str]]

    def spawn(self, spec: NodeSpec) -> subprocess.Popen[bytes]:
        return self.start_process(spec.name, self.commands[spec.name])


@pytest.fixture
def stand_ins(tmp_path: Path) -> Iterator[_StandIns]:
    nodes = _StandIns(tmp_path, {n: f"127.0.0.1:{free_port()}" for n in ("n1", "n2", "n3")})
    nodes.commands = {n: SLEEPER for n in nodes.names}
    try:
        yield nodes
    finally:
        nodes.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keeper(nodes: _StandIns, clock: _Clock, said: list[str]) -> Keeper:
    for name in nodes.names:
        nodes.spawn(nodes.spec(name))
    return Keeper(nodes, {n: nodes.spec(n) for n in nodes.names}, say=said.append, clock=clock)


def _exits(nodes: _StandIns, name: str) -> None:
    wait_for(f"{name} to exit", lambda: nodes.exited(name))


def test_a_killed_node_is_started_again_after_a_wait_and_the_others_run_on(
    stand_ins: _StandIns,
) -> None:
    clock, said = _Clock(), []
    keeper = _keeper(stand_ins, clock, said)
    clock.now += RESTART_STEADY_S  # it had run steadily
    first = stand_ins.pid("n3")
    stand_ins.procs["n3"].kill()
    _exits(stand_ins, "n3")
    assert keeper.check()
    assert said == [
        f"node n3 exited (killed by SIGKILL); starting it again in 1 s with its data under "
        f"{stand_ins.root / 'n3'}"
    ]
    assert keeper.check() and len(said) == 1  # not before its wait is over
    clock.now += RESTART_WAIT_S
    assert keeper.check()
    assert stand_ins.alive("n3") and stand_ins.pid("n3") != first
    assert said[1] == f"node n3 started again (pid {stand_ins.pid('n3')})"
    assert stand_ins.running() == ["n1", "n2", "n3"] and keeper.failed == []


def test_a_node_that_keeps_failing_waits_longer_each_time_then_is_left_stopped(
    stand_ins: _StandIns,
) -> None:
    clock, said = _Clock(), []
    stand_ins.commands["n1"] = EXIT_3
    keeper = _keeper(stand_ins, clock, said)
    waits = []
    for _ in range(RESTART_QUICK_FAILS_MAX - 1):
        _exits(stand_ins, "n1")
        assert keeper.check()
        waits.append(float(said[-1].split("again in ")[1].split(" s")[0]))
        clock.now += waits[-1]
        assert keeper.check()  # started again: it fails again at once
    assert waits == [1.0, 2.0, 4.0, 8.0]
    _exits(stand_ins, "n1")
    assert keeper.check()  # n2 and n3 still run
    assert said[-1].startswith(
        f"node n1 exited (exit code 3), {RESTART_QUICK_FAILS_MAX} times in a row"
    )
    assert keeper.failed == ["n1"]
    clock.now += RESTART_WAIT_MAX_S
    assert keeper.check() and not stand_ins.alive("n1")  # left stopped
    assert stand_ins.running() == ["n2", "n3"]


def test_a_node_failing_after_a_steady_run_starts_its_waits_over(stand_ins: _StandIns) -> None:
    clock, said = _Clock(), []
    keeper = _keeper(stand_ins, clock, said)
    for _ in range(3):
        stand_ins.procs["n2"].kill()
        _exits(stand_ins, "n2")
        keeper.check()
        clock.now += RESTART_WAIT_S
        keeper.check()  # started again
        clock.now += RESTART_STEADY_S  # and runs steadily
    assert [line for line in said if "again in" in line] == [
        f"node n2 exited (killed by SIGKILL); starting it again in 1 s with its data under "
        f"{stand_ins.root / 'n2'}"
    ] * 3


def test_a_node_stopped_cleanly_is_left_stopped_and_the_keeper_ends_with_the_last(
    stand_ins: _StandIns,
) -> None:
    clock, said = _Clock(), []
    stand_ins.commands = {n: [sys.executable, "-c", "pass"] for n in stand_ins.names}
    keeper = _keeper(stand_ins, clock, said)
    for name in stand_ins.names:
        _exits(stand_ins, name)
    assert not keeper.check()  # nothing runs or waits to be started
    assert said == [f"node n{i} stopped (exit code 0); the others keep serving" for i in "123"]
    assert keeper.failed == []


def test_a_node_stopped_cleanly_after_a_restart_is_not_counted_as_failed(
    stand_ins: _StandIns,
) -> None:
    clock, said = _Clock(), []
    keeper = _keeper(stand_ins, clock, said)
    stand_ins.procs["n1"].kill()
    _exits(stand_ins, "n1")
    keeper.check()
    clock.now += RESTART_WAIT_S
    stand_ins.commands["n1"] = [sys.executable, "-c", "pass"]  # this time it stops cleanly
    keeper.check()
    _exits(stand_ins, "n1")
    assert keeper.check()  # n2 and n3 run on
    assert said[-1] == "node n1 stopped (exit code 0); the others keep serving"
    assert keeper.failed == []
