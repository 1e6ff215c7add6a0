"""A minimal, strict HTTP/1.1 server on asyncio streams, for the Toxiproxy-compatible API.

It serves small JSON requests from test harnesses on loopback, nothing more: requests carry a
``Content-Length`` body or none (no chunked transfer coding, which is answered with 501),
header and body sizes are capped, connections are kept alive per HTTP/1.1 and closed after an
idle timeout. Anything malformed is answered with 400 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import unquote

__all__ = ["HttpLimits", "HttpServer", "Request", "Response"]


@dataclass(frozen=True, slots=True)
class Request:
    """A parsed request. ``path`` is percent-decoded per segment; the query is dropped."""

    method: str
    segments: tuple[str, ...]
    headers: dict[str, str]  # names lower-cased
    body: bytes


@dataclass(frozen=True, slots=True)
class Response:
    """A response; an empty body is sent with ``Content-Length: 0``."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpLimits:
    """Bounds on what one client may send or hold."""

    header_bytes_max: int = 64 * 1024
    header_lines_max: int = 100
    body_bytes_max: int = 1024 * 1024
    idle_timeout_s: float = 60.0
    read_timeout_s: float = 15.0


class BadRequest(Exception):
    """The request cannot be parsed; answered with ``status`` and the connection closed."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_VERSIONS = ("HTTP/1.0", "HTTP/1.1")


def _parse_head(head: bytes, limits: HttpLimits) -> tuple[str, str, str, dict[str, str]]:
    """Request line and headers of ``head`` (which ends with CRLF CRLF)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes any byte
        raise BadRequest("undecodable header") from exc
    lines = text[:-4].split("\r\n")
    if len(lines) - 1 > limits.header_lines_max:
        raise BadRequest("too many header lines", 431)
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[1].startswith("/"):
        raise BadRequest("malformed request line")
    method, target, version = parts
    if version not in _VERSIONS:
        raise BadRequest("unsupported HTTP version", 505)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest("malformed header line")
        key = name.lower()
        value = value.strip(" \t")
        if key not in headers:
            headers[key] = value
        elif key in ("content-length", "host"):
            if headers[key] != value:  # request smuggling guard: never pick one of two
                raise BadRequest(f"conflicting {name}")
        else:
            headers[key] = f"{headers[key]}, {value}"
    return method, target, version, headers


def _body_length(headers: dict[str, str], limits: HttpLimits) -> int:
    if "transfer-encoding" in headers:
        raise BadRequest("transfer codings are not supported", 501)
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise BadRequest("malformed Content-Length")
    length = int(raw)
    if length > limits.body_bytes_max:
        raise BadRequest("body too large", 413)
    return length


def _segments(target: str) -> tuple[str, ...]:
    path = target.split("?", 1)[0].split("#", 1)[0]
    return tuple(unquote(part) for part in path.split("/")[1:] if part != "")


def _keep_alive(version: str, headers: dict[str, str]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens


def encode_response(response: Response, *, keep_alive: bool) -> bytes:
    """The wire form of ``response``."""
    reason = HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    headers = {
        "Content-Type": response.content_type,
        "Content-Length": str(len(response.body)),
        "Connection": "keep-alive" if keep_alive else "close",
        **response.headers,
    }
    if response.status == 204:
        del headers["Content-Length"], headers["Content-Type"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (b"" if response.status == 204 else response.body)


class HttpServer:
    """Serves ``handler`` on one TCP address. Owned by the loop it is started on."""

    def __init__(self, handler: Handler, *, limits: HttpLimits | None = None) -> None:
        self._handler = handler
        self._limits = limits or HttpLimits()
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0 picks a free one); returns the bound address."""
        self._server = await asyncio.start_server(
            self._serve_client, host, port, limit=self._limits.header_bytes_max
        )
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and drop every client connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.gather(*self._clients, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _serve_client(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away or stalled: nothing to answer
        finally:
            if task is not None:
                self._clients.discard(task)
            writer.transport.abort()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True when the connection may carry another."""
        limits = self._limits
        try:
            async with asyncio.timeout(limits.idle_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                await self._send(writer, Response(400, b"incomplete request\n"), keep_alive=False)
            return False
        except asyncio.LimitOverrunError:
            await self._send(writer, Response(431, b"header too large\n"), keep_alive=False)
            return False
        try:
            method, target, version, headers = _parse_head(head, limits)
            length = _body_length(headers, limits)
            if length and headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it
            async with asyncio.timeout(limits.read_timeout_s):
                body = await reader.readexactly(length)
        except BadRequest as exc:
            body_text = f"{exc}\n".encode()
            await self._send(
                writer, Response(exc.status, body_text, "text/plain"), keep_alive=False
            )
            return False
        keep_alive = _keep_alive(version, headers)
        response = await self._handler(Request(method, _segments(target), headers, body))
        await self._send(writer, response, keep_alive=keep_alive)
        return keep_alive

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, response: Response, *, keep_alive: bool) -> None:
        writer.write(encode_response(response, keep_alive=keep_alive))
        with contextlib.suppress(OSError):
            await writer.drain()
