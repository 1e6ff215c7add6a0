"""proxyctl picks the server the issue asks for: TOXIPROXY_URL, else a toxiproxy-server on
PATH, else the compatible server; the client is bound to it and everything it started stops."""

from __future__ import annotations

import socket
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from toxiproxy.api import APIConsumer

from raftstream.chaos import proxyctl
from raftstream.chaos.toxiproxy_server import ServerThread, split_host_port
from raftstream.tooling.localnet import free_port

Upstream = Any  # conftest.Upstream


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No TOXIPROXY_URL and a PATH with nothing on it but what a test puts in the returned dir."""
    monkeypatch.delenv(proxyctl.TOXIPROXY_URL_ENV, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def echo_once(service: proxyctl.ProxyService, upstream: str) -> bytes:
    proxy = service.client.create(upstream=upstream, name="ctl")
    with socket.create_connection(split_host_port(proxy.listen), timeout=5.0) as sock:
        sock.sendall(b"ping")
        return sock.recv(4)


def test_without_a_real_server_it_runs_the_compatible_one_in_a_process(
    bare_env: Path, echo: Upstream
) -> None:
    before = (APIConsumer.host, APIConsumer.port)
    service = proxyctl.start_toxiproxy()
    try:
        assert service.kind == "compat-process"
        assert (APIConsumer.host, APIConsumer.port) == proxyctl.url_address(service.url)
        assert echo_once(service, echo.address) == b"ping"
    finally:
        service.close()
    assert service.process is not None and service.process.returncode == 0  # SIGTERM, clean
    assert (APIConsumer.host, APIConsumer.port) == before


def test_thread_mode(bare_env: Path, echo: Upstream) -> None:
    with proxyctl.start_toxiproxy(compat_mode="thread") as service:
        assert service.kind == "compat-thread"
        assert echo_once(service, echo.address) == b"ping"
    with pytest.raises(ConnectionRefusedError):  # the server stopped with the service
        socket.create_connection(proxyctl.url_address(service.url), timeout=5.0).close()


def test_toxiproxy_url_is_used_as_is_and_left_running(
    bare_env: Path, monkeypatch: pytest.MonkeyPatch, echo: Upstream
) -> None:
    with ServerThread() as external:
        monkeypatch.setenv(proxyctl.TOXIPROXY_URL_ENV, external.url)
        with proxyctl.start_toxiproxy() as service:
            assert (service.kind, service.url) == ("external", external.url)
            assert echo_once(service, echo.address) == b"ping"
        host, port = proxyctl.url_address(external.url)
        socket.create_connection((host, port), timeout=5.0).close()  # still serving


def test_unreachable_toxiproxy_url_fails_loudly(
    bare_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv(proxyctl.TOXIPROXY_URL_ENV, f"http://127.0.0.1:{port}")
    before = (APIConsumer.host, APIConsumer.port)
    with pytest.raises(RuntimeError, match="no Toxiproxy server answering"):
        proxyctl.start_toxiproxy(startup_timeout_s=0.3)
    assert (APIConsumer.host, APIConsumer.port) == before


def test_a_toxiproxy_server_on_path_is_started_with_its_flags(
    bare_env: Path, upstreams: Callable[..., Upstream]
) -> None:
    # Stands in for the Go binary: takes its flags (-host H -port P) and serves the same API.
    shim = bare_env / proxyctl.REAL_SERVER_BINARY
    shim.write_text(
        "#!/bin/sh\n"
        '[ "$1" = -host ] && [ "$3" = -port ] || exit 64\n'
        f'exec "{sys.executable}" -m raftstream.chaos.toxiproxy_server --host "$2" --port "$4"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    service = proxyctl.start_toxiproxy()
    try:
        assert service.kind == "real"
        assert echo_once(service, upstreams().address) == b"ping"
    finally:
        service.close()
    assert service.process is not None and service.process.returncode == 0


def test_a_real_server_that_fails_to_start_is_retried_on_another_port(
    bare_env: Path, upstreams: Callable[..., Upstream], tmp_path: Path
) -> None:
    # The first start fails (as when another process took the port), the second serves.
    marker = tmp_path / "started-once"
    shim = bare_env / proxyctl.REAL_SERVER_BINARY
    shim.write_text(
        "#!/bin/sh\n"
        f'[ -e "{marker}" ] || {{ : > "{marker}"; exit 1; }}\n'
        f'exec "{sys.executable}" -m raftstream.chaos.toxiproxy_server --host "$2" --port "$4"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    with proxyctl.start_toxiproxy() as service:
        assert service.kind == "real" and marker.exists()
        assert echo_once(service, upstreams().address) == b"ping"
