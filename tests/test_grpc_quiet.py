"""raftstream's entry points quiet gRPC's C core (raftstream/grpcenv.py): its INFO lines (such
as "Got goaway" when a server closes a connection a client holds open) would otherwise reach
stderr, in the CLI's output and a node's log. The user's own ``GRPC_VERBOSITY`` wins, and
importing raftstream alone changes nothing (an application's gRPC stays as it set it).

The core's INFO lines are made deterministic here with ``GRPC_TRACE=http`` (a trace of every
HTTP/2 frame, logged at INFO): a GOAWAY's line depends on whether the client reads the frame
before its process exits."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raftstream import grpcenv

# The command line's entry point, as the console script and ``python -m raftstream.cluster``
# run it (``--help`` exits before any command runs); grpc is imported after it.
CLI = "from raftstream.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
APPLIED = "import raftstream.grpcenv; raftstream.grpcenv.apply_defaults()"

_SCRIPT = """
{prelude}
import grpc
from concurrent import futures
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(2))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{{port}}")
health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
channel.close()
server.stop(None).wait()
"""


def _core_info_lines(prelude: str, **grpc_env: str | None) -> list[str]:
    """The core's INFO lines on stderr of ``_SCRIPT`` after ``prelude``, run with the
    GRPC_* variables ``grpc_env`` names (set to its value; unset when None)."""
    env = {k: v for k, v in os.environ.items() if k not in grpc_env}
    env.update({k: v for k, v in grpc_env.items() if v is not None})
    res = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(prelude=prelude)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return [line for line in res.stderr.splitlines() if line.startswith("I")]


def _info_lines(prelude: str, verbosity: str | None) -> list[str]:
    return _core_info_lines(prelude, GRPC_TRACE="http", GRPC_VERBOSITY=verbosity)


@pytest.mark.parametrize(
    ("prelude", "verbosity", "printed"),
    [
        ("", None, True),  # grpc alone: its INFO lines are there to be quieted
        ("import raftstream, raftstream.client", None, True),  # importing changes nothing
        (CLI, None, False),
        (APPLIED, None, False),
        (CLI, "INFO", True),  # the user's setting wins
    ],
)
def test_entry_points_quiet_grpc_core_info_lines(
    prelude: str, verbosity: str | None, printed: bool
) -> None:
    assert bool(_info_lines(prelude, verbosity)) is printed


# -- the I/O engine (raftstream/grpcenv.py, GRPC_EXPERIMENTS_DEFAULT) -------------------------


def _tcp_sources(prelude: str, experiments: str | None) -> set[str]:
    """The core's source files that log the TCP trace of a health check: ``tcp_posix.cc``
    is the older engine's endpoint (iomgr), ``endpoint.cc`` the EventEngine's."""
    lines = _core_info_lines(
        prelude, GRPC_TRACE="tcp", GRPC_VERBOSITY="INFO", GRPC_EXPERIMENTS=experiments
    )
    return {
        source
        for line in lines
        for source in ("tcp_posix.cc", "endpoint.cc")
        if f" {source}:" in line
    }


@pytest.mark.skipif(
    grpcenv.grpcio_version() != grpcenv.GRPC_EXPERIMENTS_TESTED,
    reason="the I/O engine default applies to the grpcio version it was measured on",
)
@pytest.mark.parametrize(
    ("prelude", "experiments", "sources"),
    [
        ("", None, {"endpoint.cc"}),  # grpc alone: the EventEngine endpoints
        ("import raftstream, raftstream.client", None, {"endpoint.cc"}),  # import: no change
        (CLI, None, {"tcp_posix.cc"}),
        (CLI, "", {"endpoint.cc"}),  # the user's setting wins, even empty
    ],
)
def test_entry_points_put_grpc_client_and_listener_io_on_the_older_engine(
    prelude: str, experiments: str | None, sources: set[str]
) -> None:
    assert _tcp_sources(prelude, experiments) == sources
