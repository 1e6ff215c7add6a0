"""The node's ``/metrics`` HTTP endpoint, served on the node's own event loop.

Why on the loop, not threads: the library's WSGI server started a thread per connection and
waited on each with no timeout, so 1,000 half-sent ``GET /metrics`` requests held 1,000
threads and froze the node for 30 s (issue 39, finding 5). Here a connection costs a small
coroutine, and three limits bound what any number of them may hold:

- ``METRICS_CONNECTIONS_MAX`` connections are served at once, so a flood of connections
  costs the node a bounded amount of memory and no thread. When every place is taken, a new
  connection takes the place of the one that has waited longest for its request head (so
  half-open connections cannot keep out a scrape whose request arrives at once); when every
  place is answering, it is closed unanswered (its scraper retries at its next interval);
- the request head (request line and headers) must arrive within
  ``METRICS_HEAD_TIMEOUT_MS`` and fit in ``METRICS_HEAD_BYTES_MAX``, so a half-open or
  slowly dripping connection gives its place back;
- the answer must be taken within ``METRICS_WRITE_TIMEOUT_MS``, so a scraper that stops
  reading does not keep its place either.

A bounded thread pool with socket timeouts would have worked too, but it would still tie
one thread per slow connection up to its timeout and contend with the node's worker threads
on 2-core machines; a coroutine costs neither. Rendering stays prometheus_client's
(``choose_encoder``: ``generate_latest``, or OpenMetrics when asked for), called on the
loop: it reads counters that are already in memory, as the leadership monitor does every
second. One request per connection (``Connection: close``): scrapers open one per scrape.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.parse

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = [
    "METRICS_CONNECTIONS_MAX",
    "METRICS_HEAD_BYTES_MAX",
    "METRICS_HEAD_TIMEOUT_MS",
    "METRICS_PATH",
    "METRICS_WRITE_TIMEOUT_MS",
    "MetricsServer",
]

METRICS_PATH = "/metrics"  # the one path served; anything else is 404 naming it
METRICS_CONNECTIONS_MAX = 16  # served at once; one more is closed unanswered
METRICS_HEAD_BYTES_MAX = 8192  # request line and headers; longer is 431 and closed
METRICS_HEAD_TIMEOUT_MS = 5_000  # for the whole head to arrive; then closed unanswered
METRICS_WRITE_TIMEOUT_MS = 10_000  # for the scraper to take the answer; then closed
_BACKLOG = 64  # the kernel's queue of connections not yet accepted


class MetricsServer:
    """Serves ``registry`` over HTTP at ``METRICS_PATH`` (see the module docstring). Belongs
    to the event loop that calls ``start``; ``close`` stops it and ends every connection."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # served now (METRICS_CONNECTIONS_MAX)
        # Of those, the ones whose request head has not arrived, oldest first.
        self._heads: dict[asyncio.StreamWriter, None] = {}
        self.refused = 0  # connections closed because METRICS_CONNECTIONS_MAX were open

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host:port``; ``OSError`` naming the address and the key when it
        cannot listen there."""
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            self._server = await asyncio.start_server(
                self._serve,
                host,
                port,
                family=family,
                backlog=_BACKLOG,
                limit=METRICS_HEAD_BYTES_MAX,
                reuse_port=False,
            )
        except OSError as exc:
            raise OSError(
                f"cannot serve metrics on {host}:{port} (metrics_listen): "
                f"{exc.strerror or exc} (another node's metrics port?)"
            ) from exc

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for writer in list(self._open):
                writer.transport.abort()  # its coroutine ends on the aborted read or write
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= METRICS_CONNECTIONS_MAX:
            if not self._heads:
                self.refused += 1
                writer.transport.abort()  # nothing sent: a well-behaved scraper retries
                return
            # Every place taken and some still waiting for their request: the one that
            # waited longest makes room, so half-open connections cannot keep out a scrape
            # whose request arrives at once.
            oldest = next(iter(self._heads))
            self._drop(oldest)
            oldest.transport.abort()
        self._open.add(writer)
        self._heads[writer] = None
        try:
            await self._answer(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the scraper left, stalled or never finished its request: nothing to tell
        finally:
            self._drop(writer)
            writer.transport.abort()  # (a no-op once closed) anything unsent is dropped

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        self._open.discard(writer)
        self._heads.pop(writer, None)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(METRICS_HEAD_TIMEOUT_MS / 1000):
                head = await reader.readuntil(b"\r\n\r\n")
            self._heads.pop(writer, None)  # its request is in: it cannot be made to wait
        except asyncio.LimitOverrunError:
            status, headers, body = _plain(
                "431 Request Header Fields Too Large",
                f"request head longer than {METRICS_HEAD_BYTES_MAX} bytes\n",
            )
        else:
            status, headers, body = self._page(head)
        lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + body)
        writer.close()  # after what is buffered is sent
        async with asyncio.timeout(METRICS_WRITE_TIMEOUT_MS / 1000):
            await writer.wait_closed()

    def _page(self, head: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
        request, *fields = head.decode("latin-1").split("\r\n")
        parts = request.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain("400 Bad Request", "not an HTTP request line\n")
        method, target, _ = parts
        if method != "GET":
            return _plain("405 Method Not Allowed", f"only GET {METRICS_PATH}\n")
        url = urllib.parse.urlsplit(target)
        if url.path != METRICS_PATH:
            return _plain(
                "404 Not Found", f"not found: this node's metrics are at {METRICS_PATH}\n"
            )
        accept = ""
        for field in fields:
            name, _, value = field.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        encoder, content_type = choose_encoder(accept)
        registry: CollectorRegistry = self._registry
        names = urllib.parse.parse_qs(url.query).get("name[]")
        if names:  # a scraper's filter, as the library's own server reads it
            registry = registry.restricted_registry(names)  # type: ignore[assignment]
        body = encoder(registry)
        return "200 OK", [("Content-Type", content_type)], body


def _plain(status: str, text: str) -> tuple[str, list[tuple[str, str]], bytes]:
    return status, [("Content-Type", "text/plain; charset=utf-8")], text.encode()
