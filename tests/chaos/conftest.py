"""Fixtures for the chaos harness tests: loopback upstream servers, a bound Toxiproxy client,
and ``cluster``, a started 3-node ``ChaosCluster`` (a test module may define its own).

Everything a fixture opens (servers, threads, sockets) is closed at teardown.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path

import pytest
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer

from raftstream.chaos.cluster import ChaosCluster
from raftstream.chaos.toxiproxy_server import ServerThread, split_host_port
from tests.support.chaos import started_cluster

IO_TIMEOUT_S = 5.0


class Upstream:
    """A threaded TCP server on loopback: echoes (``banner=None``) or sends a banner and closes.

    ``received_bytes`` counts what it has read from all its clients.
    """

    def __init__(self, *, banner: bytes | None = None) -> None:
        self._banner = banner
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0
        self.received_bytes = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._spawn(self._accept_loop)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self.accepted += 1
                self._conns.append(conn)
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self._banner is not None:
                conn.sendall(self._banner)
                return
            while data := conn.recv(65536):
                with self._lock:
                    self.received_bytes += len(data)
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        # Closing a listener does not wake a thread blocked in accept(); shutting it down does.
        for sock in [self._listener, *conns]:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(IO_TIMEOUT_S)


@pytest.fixture
def upstreams() -> Iterator[Callable[..., Upstream]]:
    """Factory of upstream servers, all closed at teardown."""
    made: list[Upstream] = []

    def make(*, banner: bytes | None = None) -> Upstream:
        server = Upstream(banner=banner)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture
def echo(upstreams: Callable[..., Upstream]) -> Upstream:
    return upstreams()


@pytest.fixture
def server() -> Iterator[ServerThread]:
    """A fresh compatible server on a free loopback port, stopped at teardown."""
    with ServerThread(seed=7) as thread:
        yield thread


@pytest.fixture
def toxiproxy(server: ServerThread) -> Iterator[Toxiproxy]:
    """The real toxiproxy-python client bound to ``server`` (binding restored at teardown)."""
    previous = (APIConsumer.host, APIConsumer.port)
    client = Toxiproxy()
    host, port = split_host_port(server.url.removeprefix("http://"))
    client.update_api_consumer(host, port)
    yield client
    APIConsumer.host, APIConsumer.port = previous


@pytest.fixture
def connect() -> Iterator[Callable[[Proxy], socket.socket]]:
    """Factory of client sockets to a proxy's listen address, closed at teardown."""
    with ExitStack() as stack:

        def open_to(proxy: Proxy) -> socket.socket:
            host, port = split_host_port(proxy.listen)
            sock = socket.create_connection((host, port), timeout=IO_TIMEOUT_S)
            return stack.enter_context(sock)

        yield open_to


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    """Three nodes behind per-link proxies, started; killed and removed at teardown."""
    with started_cluster(tmp_path, 3) as c:
        yield c
