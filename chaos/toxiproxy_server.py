"""A Toxiproxy-compatible server on asyncio: the HTTP API and the TCP proxies it drives.

Toxiproxy (Shopify/toxiproxy) is not installable from the registries raftstream installs
from, so the chaos harness ships this server for the ``toxiproxy-python`` client; a real
``toxiproxy-server`` is used instead whenever one is available (``proxyctl.py``).

API (paths, methods, JSON field names, status codes and error bodies as Toxiproxy's):

    GET    /version                          200 {"version": ...}
    POST   /reset                            204  enable every proxy, remove every toxic
    GET    /proxies                          200 {name: proxy}
    POST   /proxies                          201 proxy | 400 missing field | 409 exists
    POST   /populate                         201 {"proxies": [...]}  create or replace
    GET    /proxies/{p}                      200 proxy | 404
    POST   /proxies/{p}  (or PATCH)          200 proxy  update enabled, listen, upstream
    DELETE /proxies/{p}                      204
    GET    /proxies/{p}/toxics               200 [toxic]
    POST   /proxies/{p}/toxics               200 toxic | 400 bad stream/type | 409 exists
    GET    /proxies/{p}/toxics/{t}           200 toxic | 404
    POST   /proxies/{p}/toxics/{t} (PATCH)   200 toxic  update attributes, toxicity
    DELETE /proxies/{p}/toxics/{t}           204

A proxy is ``{"name", "listen", "upstream", "enabled", "toxics"}``; a toxic is
``{"attributes", "name", "type", "stream", "toxicity"}``. Errors are
``{"error": message, "status": code}`` (sent as text/plain, as Toxiproxy's ``http.Error``
does). A listen port of 0 binds a free port and the response carries the bound address.

Where this server departs from Toxiproxy, on purpose: it binds loopback addresses only
unless started with ``allow_remote`` (an empty listen host means 127.0.0.1, not every
interface) and refuses others with 400; a malformed listen address is a 400 rather than
Toxiproxy's 500 from its failed listen (an OS bind failure is still a 500); each proxy holds
at most ``connections_max`` connections; ``/metrics`` is not served. Toxic semantics and
their departures are described in ``toxics.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import random
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from raftstream.chaos.links import DOWNSTREAM, UPSTREAM, Connection, LinkLimits, ToxicSpec
from raftstream.chaos.minihttp import HttpServer, Request, Response
from raftstream.chaos.toxics import (
    TOXIC_TYPES,
    ToxicAttributeError,
    attributes_json,
    parse_attributes,
)

__all__ = ["ApiError", "ServerSettings", "ServerThread", "ToxiproxyServer", "main"]

log = logging.getLogger(__name__)

# Build metadata marks this as the compatible server, not a Toxiproxy release.
VERSION = "2.12.0+raftstream.compat"
DEFAULT_PORT = 8474


class ApiError(Exception):
    """An API failure with Toxiproxy's message and HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def joined(self, detail: str) -> ApiError:
        """This error with ``": detail"`` appended, as Toxiproxy's ``joinError``."""
        return ApiError(f"{self.message}: {detail}", self.status)


ERR_BAD_REQUEST_BODY = ApiError("bad request body", 400)
ERR_MISSING_FIELD = ApiError("missing required field", 400)
ERR_PROXY_NOT_FOUND = ApiError("proxy not found", 404)
ERR_PROXY_ALREADY_EXISTS = ApiError("proxy already exists", 409)
ERR_INVALID_STREAM = ApiError("stream was invalid, can be either upstream or downstream", 400)
ERR_INVALID_TOXIC_TYPE = ApiError("invalid toxic type", 400)
ERR_TOXIC_ALREADY_EXISTS = ApiError("toxic already exists", 409)
ERR_TOXIC_NOT_FOUND = ApiError("toxic not found", 404)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    """How proxies behave; shared by every proxy of a server."""

    allow_remote: bool = False  # bind non-loopback listen addresses
    connections_max: int = 1024  # per proxy, dialling ones included; more are closed at once
    upstream_connect_timeout_s: float = 10.0
    stream_buffer_bytes: int = 64 * 1024  # asyncio StreamReader limit per socket
    link_limits: LinkLimits = field(default_factory=LinkLimits)


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its parts.

    Raises:
        ValueError: no port, or a port that is not a number in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address {address!r}: missing or bad port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """The inverse of ``split_host_port``, bracketing IPv6 hosts as Go does."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_host(host: str, *, allow_remote: bool) -> str:
    """The address to bind for a listen host: "" and "localhost" mean 127.0.0.1.

    Raises:
        ApiError: 400, the host is not a loopback address and ``allow_remote`` is off.
    """
    if host in ("", "localhost"):
        return "127.0.0.1"
    if allow_remote:
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ApiError(f"listen address {host!r} is not loopback (server runs loopback-only)", 400)
    return host


def normalise_listen(listen: str, *, allow_remote: bool) -> str:
    """``listen`` with its host resolved as it would be bound (for change detection)."""
    try:
        host, port = split_host_port(listen)
    except ValueError as exc:
        raise ApiError(f"listen tcp {listen}: {exc}", 400) from exc
    return join_host_port(listen_host(host, allow_remote=allow_remote), port)


class Proxy:
    """One proxy: a listener, its live connections, and its toxics (chain order).

    Owned by ``ToxiproxyServer``; every method runs on the server's loop, under its lock.
    """

    def __init__(
        self, *, name: str, listen: str, upstream: str, settings: ServerSettings, rng: random.Random
    ) -> None:
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[ToxicSpec] = []
        self._settings = settings
        self._rng = rng
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self._handlers: set[asyncio.Task[Any]] = set()  # one per client, dialling or joined

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": [toxic_json(spec) for spec in self.ordered_toxics()],
        }

    def ordered_toxics(self) -> list[ToxicSpec]:
        """Toxics as Toxiproxy lists them: the upstream chain, then the downstream chain."""
        return self.chain(UPSTREAM) + self.chain(DOWNSTREAM)

    def chain(self, direction: str) -> list[ToxicSpec]:
        return [spec for spec in self.toxics if spec.direction == direction]

    def find_toxic(self, name: str) -> ToxicSpec | None:
        return next((spec for spec in self.toxics if spec.name == name), None)

    async def start(self) -> None:
        """Listen on ``listen`` and accept clients; ``listen`` becomes the bound address.

        Raises:
            ApiError: 400 for a malformed or refused address, 500 when the bind fails.
        """
        if self.enabled:
            return
        try:
            host, port = split_host_port(self.listen)
        except ValueError as exc:
            raise ApiError(f"listen tcp {self.listen}: {exc}", 400) from exc
        bind_host = listen_host(host, allow_remote=self._settings.allow_remote)
        try:
            server = await asyncio.start_server(
                self._accept, bind_host, port, limit=self._settings.stream_buffer_bytes
            )
        except OSError as exc:
            raise ApiError(f"listen tcp {self.listen}: {exc.strerror or exc}", 500) from exc
        self._server = server
        sockname = server.sockets[0].getsockname()
        self.listen = join_host_port(str(sockname[0]), int(sockname[1]))
        self.enabled = True

    async def stop(self) -> None:
        """Stop listening and drop every connection (as Toxiproxy: its clients see them close)."""
        if not self.enabled:
            return
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.close()  # at once, so clients see the drop before the API answers
        for handler in list(self._handlers):
            handler.cancel()  # also the clients still dialling upstream
        if server is not None:
            await server.wait_closed()

    async def update(self, *, listen: str, upstream: str, enabled: bool) -> None:
        """Apply new fields; a new listen or upstream restarts the proxy (drops connections)."""
        allow = self._settings.allow_remote
        if normalise_listen(listen, allow_remote=allow) != normalise_listen(
            self.listen, allow_remote=allow
        ) or (upstream != self.upstream):
            await self.stop()
            self.listen, self.upstream = listen, upstream
        if enabled and not self.enabled:
            await self.start()
        elif not enabled:
            await self.stop()

    def add_toxic(self, spec: ToxicSpec) -> None:
        """Append ``spec`` to its chain, on live connections too."""
        self.toxics.append(spec)
        for conn in self._connections:
            conn.links[spec.direction].add_toxic(spec)

    def update_toxic(self, spec: ToxicSpec) -> None:
        """Replace the toxic named ``spec.name`` (same position), on live connections too."""
        self.toxics = [spec if old.name == spec.name else old for old in self.toxics]
        for conn in self._connections:
            conn.links[spec.direction].update_toxic(spec)

    def remove_toxic(self, spec: ToxicSpec) -> None:
        """Remove ``spec``, on live connections too."""
        self.toxics = [old for old in self.toxics if old.name != spec.name]
        for conn in self._connections:
            conn.links[spec.direction].remove_toxic(spec.name)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is None or len(self._handlers) >= self._settings.connections_max:
            writer.transport.abort()
            return
        self._handlers.add(handler)
        try:
            await self._join(reader, writer)
        except asyncio.CancelledError:
            # ``stop`` cancelled it: end quietly. This task is the stream server's own
            # (nothing awaits it), and Python 3.11's stream callback would log a cancelled
            # handler as an "Exception in callback" error.
            pass
        finally:
            self._handlers.discard(handler)
            if not writer.transport.is_closing():
                writer.transport.abort()

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Dial upstream and run the connection until it ends (or the proxy stops)."""
        upstream = await self._dial()
        if upstream is None:
            # As Toxiproxy: a client whose upstream cannot be reached is simply closed.
            writer.close()
            return
        conn = Connection(
            client=(reader, writer),
            upstream=upstream,
            limits=self._settings.link_limits,
            rng=self._rng,
            on_error=lambda exc: log.error("proxy %s: link failed: %r", self.name, exc),
        )
        self._connections.add(conn)
        try:
            await conn.run({UPSTREAM: self.chain(UPSTREAM), DOWNSTREAM: self.chain(DOWNSTREAM)})
        finally:
            self._connections.discard(conn)

    async def _dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            host, port = split_host_port(self.upstream)
            async with asyncio.timeout(self._settings.upstream_connect_timeout_s):
                return await asyncio.open_connection(
                    host, port, limit=self._settings.stream_buffer_bytes
                )
        except (OSError, ValueError, TimeoutError) as exc:
            log.info("proxy %s: upstream %s unreachable: %s", self.name, self.upstream, exc)
            return None


def toxic_json(spec: ToxicSpec) -> dict[str, Any]:
    return {
        "attributes": attributes_json(spec.toxic),
        "name": spec.name,
        "type": spec.toxic.TYPE,
        "stream": spec.stream,
        "toxicity": spec.toxicity,
    }


def decode_json(body: bytes) -> Any:
    """The first JSON value of ``body`` (trailing data ignored, as Go's json.Decoder).

    Raises:
        ApiError: 400 "bad request body: ..." when there is no valid JSON value.
    """
    text = body.decode("utf-8", errors="replace").lstrip()
    if not text:
        raise ERR_BAD_REQUEST_BODY.joined("EOF")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ERR_BAD_REQUEST_BODY.joined(str(exc)) from exc
    return value


def field_of(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``obj[key]`` checked against ``kind`` (JSON null means absent), else ``default``."""
    value = obj.get(key)
    if value is None:
        return default
    bad_bool = isinstance(value, bool) and kind is not bool
    if bad_bool or not isinstance(value, kind):
        raise ERR_BAD_REQUEST_BODY.joined(f"field {key!r} has the wrong type")
    return value


def decode_object(body: bytes) -> dict[str, Any]:
    value = decode_json(body)
    if not isinstance(value, dict):
        raise ERR_BAD_REQUEST_BODY.joined("expected a JSON object")
    return value


def json_response(value: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(value).encode())


def error_response(error: ApiError) -> Response:
    body = json.dumps({"error": error.message, "status": error.status}) + "\n"
    return Response(error.status, body.encode(), "text/plain; charset=utf-8")


Route = Callable[[Request, tuple[str, ...]], Awaitable[Response]]


class ToxiproxyServer:
    """The API server and its proxies. Owned by the loop ``start`` runs on.

    API calls are serialised by one lock: each sees and leaves the proxies consistent, even
    across the awaits of starting and stopping listeners.
    """

    def __init__(self, *, settings: ServerSettings | None = None, seed: int | None = None) -> None:
        self._settings = settings or ServerSettings()
        self._rng = random.Random(seed)
        self._proxies: dict[str, Proxy] = {}
        self._lock = asyncio.Lock()
        self._http = HttpServer(self.handle)
        self.url = ""
        self._routes: list[tuple[tuple[str | None, ...], dict[str, Route]]] = [
            (("version",), {"GET": self._version}),
            (("reset",), {"POST": self._reset}),
            (("populate",), {"POST": self._populate}),
            (("proxies",), {"GET": self._proxy_index, "POST": self._proxy_create}),
            (
                ("proxies", None),
                self._methods(self._proxy_show, self._proxy_update, self._proxy_delete),
            ),
            (("proxies", None, "toxics"), {"GET": self._toxic_index, "POST": self._toxic_create}),
            (
                ("proxies", None, "toxics", None),
                self._methods(self._toxic_show, self._toxic_update, self._toxic_delete),
            ),
        ]

    @staticmethod
    def _methods(show: Route, update: Route, delete: Route) -> dict[str, Route]:
        # Toxiproxy accepts POST (deprecated) and PATCH for updates.
        return {"GET": show, "POST": update, "PATCH": update, "DELETE": delete}

    async def start(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> str:
        """Serve the API on ``host:port`` (port 0 picks one); returns the API's URL.

        Raises:
            ApiError: ``host`` is not loopback and ``allow_remote`` is off.
            OSError: the address cannot be bound.
        """
        bind_host = listen_host(host, allow_remote=self._settings.allow_remote)
        bound_host, bound_port = await self._http.start(bind_host, port)
        self.url = f"http://{join_host_port(bound_host, bound_port)}"
        return self.url

    async def close(self) -> None:
        """Stop the API and every proxy (their connections are dropped)."""
        await self._http.close()
        async with self._lock:
            for proxy in self._proxies.values():
                await proxy.stop()
            self._proxies.clear()

    async def handle(self, request: Request) -> Response:
        """Route one API request; never raises."""
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            # As Toxiproxy: browsers are refused, so a web page cannot drive local proxies.
            return Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        found = self._match(request)
        if isinstance(found, Response):
            return found
        route, args = found
        try:
            async with self._lock:
                return await route(request, args)
        except ApiError as exc:
            return error_response(exc)
        except Exception as exc:  # an API bug must not kill the server: answer 500
            log.exception("API %s %s failed", request.method, "/".join(request.segments))
            return error_response(ApiError(str(exc), 500))

    def _match(self, request: Request) -> tuple[Route, tuple[str, ...]] | Response:
        for pattern, methods in self._routes:
            if len(pattern) != len(request.segments):
                continue
            if any(
                p is not None and p != s for p, s in zip(pattern, request.segments, strict=True)
            ):
                continue
            route = methods.get(request.method)
            if route is None:
                return Response(405, b"", "text/plain; charset=utf-8")
            args = tuple(s for p, s in zip(pattern, request.segments, strict=True) if p is None)
            return route, args
        return Response(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def _proxy(self, name: str) -> Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise ERR_PROXY_NOT_FOUND
        return proxy

    def _new_proxy(self, *, name: str, listen: str, upstream: str) -> Proxy:
        return Proxy(
            name=name,
            listen=listen or "127.0.0.1:0",
            upstream=upstream,
            settings=self._settings,
            rng=self._rng,
        )

    async def _version(self, request: Request, args: tuple[str, ...]) -> Response:
        body = json.dumps({"version": VERSION}) + "\n"
        return Response(200, body.encode(), "application/json;charset=utf-8")

    async def _reset(self, request: Request, args: tuple[str, ...]) -> Response:
        for proxy in self._proxies.values():
            await proxy.start()
            for spec in list(proxy.toxics):
                proxy.remove_toxic(spec)
        return Response(204)

    async def _proxy_index(self, request: Request, args: tuple[str, ...]) -> Response:
        return json_response({name: proxy.to_json() for name, proxy in self._proxies.items()})

    async def _proxy_create(self, request: Request, args: tuple[str, ...]) -> Response:
        obj = decode_object(request.body)
        name = field_of(obj, "name", str, "")
        upstream = field_of(obj, "upstream", str, "")
        listen = field_of(obj, "listen", str, "")
        enabled = field_of(obj, "enabled", bool, True)
        if not name:
            raise ERR_MISSING_FIELD.joined("name")
        if not upstream:
            raise ERR_MISSING_FIELD.joined("upstream")
        if name in self._proxies:
            raise ERR_PROXY_ALREADY_EXISTS
        proxy = self._new_proxy(name=name, listen=listen, upstream=upstream)
        if enabled:
            await proxy.start()
        self._proxies[name] = proxy
        return json_response(proxy.to_json(), 201)

    async def _populate(self, request: Request, args: tuple[str, ...]) -> Response:
        entries = decode_json(request.body)
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ERR_BAD_REQUEST_BODY.joined("expected a JSON array of proxies")
        wanted: list[tuple[str, str, str, bool]] = []
        for i, entry in enumerate(entries, start=1):
            name = field_of(entry, "name", str, "")
            upstream = field_of(entry, "upstream", str, "")
            if not name:
                raise ERR_MISSING_FIELD.joined(f"name at proxy {i}")
            if not upstream:
                raise ERR_MISSING_FIELD.joined(f"upstream at proxy {i}")
            listen = field_of(entry, "listen", str, "")
            wanted.append((name, listen, upstream, field_of(entry, "enabled", bool, True)))
        done: list[Proxy] = []
        try:
            for name, listen, upstream, enabled in wanted:
                done.append(await self._add_or_replace(name, listen, upstream, enabled))
        except ApiError as exc:
            listed = [proxy.to_json() for proxy in done]
            body = {"error": exc.message, "status": exc.status, "proxies": listed}
            return json_response(body, exc.status)
        return json_response({"proxies": [proxy.to_json() for proxy in done]}, 201)

    async def _add_or_replace(self, name: str, listen: str, upstream: str, enabled: bool) -> Proxy:
        """Populate's rule: keep a proxy with the same listen and upstream, else replace it."""
        existing = self._proxies.get(name)
        if existing is not None:
            allow = self._settings.allow_remote
            same_listen = normalise_listen(listen or "127.0.0.1:0", allow_remote=allow) == (
                normalise_listen(existing.listen, allow_remote=allow)
            )
            if same_listen and upstream == existing.upstream:
                return existing
            await existing.stop()
        proxy = self._new_proxy(name=name, listen=listen, upstream=upstream)
        if enabled:
            await proxy.start()
        self._proxies[name] = proxy
        return proxy

    async def _proxy_show(self, request: Request, args: tuple[str, ...]) -> Response:
        return json_response(self._proxy(args[0]).to_json())

    async def _proxy_update(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy = self._proxy(args[0])
        obj = decode_object(request.body)
        await proxy.update(
            listen=field_of(obj, "listen", str, "") or proxy.listen,
            upstream=field_of(obj, "upstream", str, "") or proxy.upstream,
            enabled=field_of(obj, "enabled", bool, proxy.enabled),
        )
        return json_response(proxy.to_json())

    async def _proxy_delete(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy = self._proxy(args[0])
        await proxy.stop()
        del self._proxies[proxy.name]
        return Response(204)

    async def _toxic_index(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy = self._proxy(args[0])
        return json_response([toxic_json(spec) for spec in proxy.ordered_toxics()])

    async def _toxic_create(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy = self._proxy(args[0])
        obj = decode_object(request.body)
        stream = field_of(obj, "stream", str, "downstream")
        toxicity = float(field_of(obj, "toxicity", (int, float), 1.0))
        toxic_type = field_of(obj, "type", str, "")
        name = field_of(obj, "name", str, "") or f"{toxic_type}_{stream}"
        # Checked in Toxiproxy's order: stream, type, name, then the attributes.
        direction = stream.lower()
        if direction not in (UPSTREAM, DOWNSTREAM):
            raise ERR_INVALID_STREAM
        toxic_class = TOXIC_TYPES.get(toxic_type)
        if toxic_class is None:
            raise ERR_INVALID_TOXIC_TYPE
        if proxy.find_toxic(name) is not None:
            raise ERR_TOXIC_ALREADY_EXISTS
        try:
            toxic = parse_attributes(toxic_class(), obj.get("attributes"))
        except ToxicAttributeError as exc:
            raise ERR_BAD_REQUEST_BODY.joined(str(exc)) from exc
        spec = ToxicSpec(
            name=name, stream=stream, direction=direction, toxicity=toxicity, toxic=toxic
        )
        proxy.add_toxic(spec)
        return json_response(toxic_json(spec))

    def _toxic(self, args: tuple[str, ...]) -> tuple[Proxy, ToxicSpec]:
        proxy = self._proxy(args[0])
        spec = proxy.find_toxic(args[1])
        if spec is None:
            raise ERR_TOXIC_NOT_FOUND
        return proxy, spec

    async def _toxic_show(self, request: Request, args: tuple[str, ...]) -> Response:
        return json_response(toxic_json(self._toxic(args)[1]))

    async def _toxic_update(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy, spec = self._toxic(args)
        obj = decode_object(request.body)
        toxicity = float(field_of(obj, "toxicity", (int, float), spec.toxicity))
        try:
            toxic = parse_attributes(spec.toxic, obj.get("attributes"))
        except ToxicAttributeError as exc:
            raise ERR_BAD_REQUEST_BODY.joined(str(exc)) from exc
        updated = ToxicSpec(
            name=spec.name,
            stream=spec.stream,
            direction=spec.direction,
            toxicity=toxicity,
            toxic=toxic,
        )
        proxy.update_toxic(updated)
        return json_response(toxic_json(updated))

    async def _toxic_delete(self, request: Request, args: tuple[str, ...]) -> Response:
        proxy, spec = self._toxic(args)
        proxy.remove_toxic(spec)
        return Response(204)


class ServerThread:
    """A ``ToxiproxyServer`` on its own event loop in a daemon thread.

    ``start`` and ``stop`` are called from the owning (any other) thread; the server and its
    proxies live on the thread's loop only.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: ServerSettings | None = None,
        seed: int | None = None,
    ) -> None:
        self._host, self._port = host, port
        self._server = ToxiproxyServer(settings=settings, seed=seed)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="toxiproxy-compat", daemon=True)
        self.url = ""

    def start(self, timeout_s: float = 10.0) -> str:
        """Start serving; returns the API's URL. Raises what the server raised on start."""
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError("toxiproxy-compatible server did not start")
        if self._error is not None:
            raise self._error
        return self.url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (dropping every proxy and connection) and join the thread."""
        if self._loop is not None and self._stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            self.url = await self._server.start(self._host, self._port)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await self._server.close()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m raftstream.chaos.toxiproxy_server",
        description="Toxiproxy-compatible server (HTTP API and TCP proxies) for the chaos harness.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="API address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port; 0 picks one")
    parser.add_argument("--seed", type=int, default=None, help="seed for toxicity and jitter")
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow non-loopback addresses for the API and for proxy listeners",
    )
    return parser.parse_args(argv)


async def _serve_forever(args: argparse.Namespace) -> None:
    settings = ServerSettings(allow_remote=args.allow_remote)
    server = ToxiproxyServer(settings=settings, seed=args.seed)
    try:
        url = await server.start(args.host, args.port)
    except (ApiError, OSError) as exc:
        raise SystemExit(f"toxiproxy-compatible server: {exc}") from exc
    # The first line of stdout is the URL: proxyctl reads it to find a port-0 server.
    print(url, flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        await server.close()


def main(argv: list[str] | None = None) -> int:
    """CLI entry: serve until SIGINT or SIGTERM, then close every proxy."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(_serve_forever(_parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
