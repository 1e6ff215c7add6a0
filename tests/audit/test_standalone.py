"""Issue 9: the same audit through a standalone Spark master and worker on 127.0.0.1, and
through a Spark Connect server (``--remote sc://``).

Starts ``org.apache.spark.deploy.master.Master`` and ``...worker.Worker`` with the pyspark
install's ``spark-class``, runs ``python -m raftstream.audit run --master spark://...`` in a
subprocess (a process holds one SparkContext, and the test session already has a local one),
and ALWAYS kills both daemons by their process group, whatever happens. Bounded: the
daemons must come up within ``DAEMON_UP_S`` and the audit finish within ``AUDIT_S``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from raftstream.audit.checks import RuleResult
from raftstream.tooling.localnet import free_port
from tests.support.polling import NeverHappened, wait_for

DAEMON_UP_S = 90.0
AUDIT_S = 480.0  # a bound against a hang, not a speed check: CI machines can be loaded
CONNECT_AUDIT_S = 600.0  # every query a Connect round trip: slower on a loaded machine
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_MASTER_HOST="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_HOME=str(SPARK_CLASS.parent.parent),
    )
    return env


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        # Own session: killpg(pid) then reaches the JVM and anything it started.
        return subprocess.Popen(
            [str(SPARK_CLASS), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def _wait_log(log: Path, needle: str, proc: subprocess.Popen[bytes]) -> None:
    def failed() -> TimeoutError:
        return TimeoutError(f"{needle!r} not in {log}:\n{log.read_text(errors='replace')[-3000:]}")

    def logged() -> bool:
        if needle in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:  # it exited: the line never comes
            raise failed()
        return False

    try:
        wait_for(f"{needle!r} in {log}", logged, DAEMON_UP_S, interval_s=0.2)
    except NeverHappened as never:
        raise failed() from never


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A master and one worker (2 cores, 1 GiB) on loopback; yields the master URL."""
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp_path / "master.log"
        master = _start(
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
            master_log,
        )
        procs.append(master)
        _wait_log(master_log, "I have been elected leader", master)
        worker_log = tmp_path / "worker.log"
        worker = _start(
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(tmp_path / "work"),
            ],
            worker_log,
        )
        procs.append(worker)
        _wait_log(worker_log, "Successfully registered with master", worker)
        yield url
    finally:
        for p in reversed(procs):
            _stop(p)


@pytest.mark.timeout(720)
def test_audit_through_a_standalone_cluster(
    standalone: str, faulty: tuple[Path, Path], faulty_results: list[RuleResult], tmp_path: Path
) -> None:
    data, history = faulty
    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "raftstream.audit",
        "run",
        "--data",
        str(data),
        "--history",
        str(history),
        "--master",
        standalone,
        "--json",
        str(report),
    ]
    done = subprocess.run(cmd, env=_env(), capture_output=True, timeout=AUDIT_S, check=False)
    assert done.returncode == 1, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    counts = {r["rule"]: r["count"] for r in json.loads(report.read_text())["rules"]}
    assert counts == {r.rule: r.count for r in faulty_results}


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[str]:
    """A Spark Connect server (its own local[2] driver) on loopback; yields its sc:// URL."""
    port = free_port()
    log = tmp_path / "connect.log"
    server = _start(
        [
            "org.apache.spark.deploy.SparkSubmit",
            "--master",
            "local[2]",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "spark-internal",
        ],
        log,
    )
    try:
        _wait_log(log, "Spark Connect server started", server)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(server)


@pytest.mark.skipif(
    os.environ.get("RAFTSTREAM_TEST_SPARK_CONNECT") != "1",
    reason="a third Spark JVM: run with `make test-spark-connect`",
)
@pytest.mark.timeout(1200)
def test_audit_through_spark_connect(
    connect_server: str,
    faulty: tuple[Path, Path],
    faulty_results: list[RuleResult],
    tmp_path: Path,
) -> None:
    """``--remote sc://``: the data source is registered over Connect and its Python workers
    run beside the server (this machine: they read the same data root)."""
    data, history = faulty
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "raftstream.audit", "run", "--data", str(data)]
    cmd += ["--history", str(history), "--remote", connect_server, "--json", str(report)]
    done = subprocess.run(
        cmd, env=_env(), capture_output=True, timeout=CONNECT_AUDIT_S, check=False
    )
    assert done.returncode == 1, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    counts = {r["rule"]: r["count"] for r in json.loads(report.read_text())["rules"]}
    assert counts == {r.rule: r.count for r in faulty_results}
