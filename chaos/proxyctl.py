"""A ``toxiproxy-python`` client bound to a Toxiproxy server, started if need be.

Which server, in order:

1. ``TOXIPROXY_URL`` (e.g. ``http://127.0.0.1:8474``): a server someone else runs; it is
   used as is and left running on close, with whatever proxies the caller left on it.
2. ``toxiproxy-server`` on PATH: started on a free loopback port, stopped on close.
3. Otherwise the compatible server (``toxiproxy_server.py``), in a child process (default:
   proxied traffic then never competes with the harness for this process's GIL) or in a
   thread of this process; stopped on close.

toxiproxy-python keeps its server address in class attributes (``APIConsumer.host`` and
``.port``), so the binding is per process: one service at a time. ``close`` puts back the
address that was bound before.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer

from raftstream.chaos.toxiproxy_server import DEFAULT_PORT, ServerThread
from raftstream.tooling.localnet import free_port

__all__ = ["TOXIPROXY_URL_ENV", "ProxyService", "start_toxiproxy"]

TOXIPROXY_URL_ENV = "TOXIPROXY_URL"
REAL_SERVER_BINARY = "toxiproxy-server"

PORT_ATTEMPTS = 3  # a free port may be taken between picking it and the server binding it

Kind = Literal["external", "real", "compat-process", "compat-thread"]


@dataclass(kw_only=True)
class ProxyService:
    """A bound client and the server behind it. ``close`` is idempotent."""

    client: Toxiproxy
    url: str
    kind: Kind
    process: subprocess.Popen[Any] | None = None
    thread: ServerThread | None = None
    previous_binding: tuple[str, int] = ("127.0.0.1", DEFAULT_PORT)
    _closed: bool = field(default=False, init=False)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the server if this service started it; restore the previous client binding."""
        if self._closed:
            return
        self._closed = True
        if self.thread is not None:
            self.thread.stop(timeout_s)
        if self.process is not None:
            _stop_process(self.process, timeout_s)
        APIConsumer.host, APIConsumer.port = self.previous_binding

    def __enter__(self) -> ProxyService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_toxiproxy(
    *,
    use_real: bool = True,
    compat_mode: Literal["process", "thread"] = "process",
    startup_timeout_s: float = 15.0,
) -> ProxyService:
    """A client bound to a running Toxiproxy server (see the module docstring for which).

    ``use_real=False`` skips steps 1 and 2. The caller owns the service and must close it.

    Raises:
        RuntimeError: ``TOXIPROXY_URL`` is unreachable, or a server did not start within
            ``startup_timeout_s``.
    """
    previous = (str(APIConsumer.host), int(APIConsumer.port))
    external = os.environ.get(TOXIPROXY_URL_ENV, "") if use_real else ""
    binary = shutil.which(REAL_SERVER_BINARY) if use_real else None
    process: subprocess.Popen[Any] | None = None
    thread: ServerThread | None = None
    kind: Kind
    if external:
        url, kind = external.rstrip("/"), "external"
    elif binary is not None:
        url, process = _start_real(binary, startup_timeout_s)
        kind = "real"
    elif compat_mode == "thread":
        thread = ServerThread()
        url, kind = thread.start(startup_timeout_s), "compat-thread"
    else:
        url, process = _start_compat_process(startup_timeout_s)
        kind = "compat-process"
    service = ProxyService(
        client=Toxiproxy(),
        url=url,
        kind=kind,
        process=process,
        thread=thread,
        previous_binding=previous,
    )
    try:
        host, port = url_address(url)
        service.client.update_api_consumer(host, port)
        _wait_until_serving(service, startup_timeout_s)
    except BaseException:
        service.close()
        raise
    return service


def url_address(url: str) -> tuple[str, int]:
    """Host and port of an ``http://host:port`` URL (port 8474 when absent)."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.hostname is None:
        raise ValueError(f"not a Toxiproxy URL: {url!r}")
    return parts.hostname, parts.port or DEFAULT_PORT


def _start_real(binary: str, timeout_s: float) -> tuple[str, subprocess.Popen[Any]]:
    """Start ``toxiproxy-server`` on a free port, retrying if another process took the port."""
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        process = subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    return f"http://127.0.0.1:{port}", process
            time.sleep(0.05)
        if process.poll() is None:
            _stop_process(process, timeout_s)
            raise RuntimeError(f"{binary} did not listen on port {port} within {timeout_s} s")
    raise RuntimeError(
        f"{binary} exited at start {PORT_ATTEMPTS} times (last: {process.returncode})"
    )


def _start_compat_process(timeout_s: float) -> tuple[str, subprocess.Popen[str]]:
    command = [sys.executable, "-m", "raftstream.chaos.toxiproxy_server"]
    process = subprocess.Popen(
        [*command, "--host", "127.0.0.1", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    stdout = process.stdout
    if stdout is None:  # pragma: no cover - stdout=PIPE always gives a pipe
        raise RuntimeError("no stdout pipe")
    # The server prints its URL as its first line once it is bound (port 0: only it knows).
    ready, _, _ = select.select([stdout], [], [], timeout_s)
    line = stdout.readline().strip() if ready else ""
    if not line.startswith("http://"):
        _stop_process(process, timeout_s)
        raise RuntimeError(f"toxiproxy-compatible server did not start (said {line!r})")
    return line, process


def _wait_until_serving(service: ProxyService, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not service.client.running():
        process = service.process
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{service.kind} server exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no Toxiproxy server answering at {service.url}")
        time.sleep(0.05)


def _stop_process(process: subprocess.Popen[Any], timeout_s: float) -> None:
    """SIGTERM (both servers then close their proxies), SIGKILL if that is not enough."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()
