"""Importing raftstream quiets gRPC's C core (raftstream/__init__.py): without it, a server
closing a connection a client holds open prints an INFO line ("Got goaway") on stderr, in
the CLI's output, a node's log and an application's. The user's own ``GRPC_VERBOSITY``
wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A server stopped under an open channel: the client's core logs the GOAWAY it got.
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
server.stop(None)
"""
GOAWAY = "Got goaway"


def _stderr(prelude: str, verbosity: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if verbosity is not None:
        env["GRPC_VERBOSITY"] = verbosity
    script = _SCRIPT.format(prelude=prelude)
    res = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return res.stderr


@pytest.mark.parametrize(
    ("prelude", "verbosity", "printed"),
    [
        ("", None, True),  # grpc alone: the line is there to be quieted
        ("import raftstream", None, False),
        ("import raftstream", "INFO", True),  # the user's setting wins
    ],
)
def test_importing_raftstream_quiets_grpc_core_info_lines(
    prelude: str, verbosity: str | None, printed: bool
) -> None:
    assert (GOAWAY in _stderr(prelude, verbosity)) is printed
