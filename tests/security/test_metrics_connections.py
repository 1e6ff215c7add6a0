"""Issue 39, finding 5: the metrics endpoint started a thread per connection and waited on
each with no timeout; 1,000 half-sent ``GET /metrics`` requests froze the node for 30 s.

What closes the class (cluster/common/metrics_http.py; docs/limits.md, "Metrics endpoint";
docs/security.md): the endpoint is served on the node's event loop, a connection holds no
thread, at most ``METRICS_CONNECTIONS_MAX`` are served at once (the one waiting longest
for its request gives way to a new one), and the request head must arrive within
``METRICS_HEAD_TIMEOUT_MS`` and fit in ``METRICS_HEAD_BYTES_MAX``.

These pin behaviour, never time: what answers, what is closed, how many threads run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from raftstream.cluster.common import metrics_http
from raftstream.cluster.common.metrics import METRICS_PATH, NodeMetrics
from raftstream.tooling.localnet import free_port

HALF_OPEN = 300  # connections that send part of a request and then nothing
GUARD_S = 30  # a hung test fails here instead of hanging CI; no assertion on it
PARTIAL = b"GET /metrics HTTP/1.1\r\nHost: node\r\n"  # the blank line never comes


async def _scrape(port: int, request: bytes | None = None) -> bytes:
    """What the endpoint answers to ``request`` (a whole GET of the page by default)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request or f"GET {METRICS_PATH} HTTP/1.1\r\nHost: node\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()  # until the server closes
    writer.close()
    return answer


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write unless the server closed the connection already (it gave way to a newer one)."""
    with contextlib.suppress(ConnectionError):
        writer.write(data)
        await writer.drain()


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """All the server sent until it closed; nothing if it reset the connection."""
    try:
        return await reader.read()
    except ConnectionError:
        return b""


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=GUARD_S)
        return int(resp.status)


def test_half_open_connections_hold_no_thread_and_keep_no_scrape_out() -> None:
    """Hundreds of half-sent requests: the node's loop still answers a gRPC health check,
    a well-formed scrape still gets the page, and no connection started a thread."""

    async def scenario() -> None:
        metrics = NodeMetrics("n1")
        metrics.published.inc(3)
        port = free_port()
        await metrics.serve("127.0.0.1", port)
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        grpc_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            assert b"200 OK" in await _scrape(port)  # every thread there is to start, started
            assert await _health(grpc_port) == health_pb2.HealthCheckResponse.SERVING
            threads_before = threading.active_count()

            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(HALF_OPEN)]
            for _, writer in held:
                await _send(writer, PARTIAL)

            page = await _scrape(port)
            assert page.startswith(b"HTTP/1.1 200 OK")
            assert b"raftstream_published_messages_total 3.0" in page
            assert await _health(grpc_port) == health_pb2.HealthCheckResponse.SERVING
            # A thread per connection (the library's server) would add HALF_OPEN of them.
            assert threading.active_count() - threads_before < HALF_OPEN // 10

            # Every held request completed at once: each is answered in full or was closed
            # unanswered (it gave way to a newer connection); the node answers throughout.
            for _, writer in held:
                await _send(writer, b"\r\n")
            answers = await asyncio.gather(*(_answer(reader) for reader, _ in held))
            assert all(a == b"" or a.startswith(b"HTTP/1.1 200 OK") for a in answers)
            assert await _health(grpc_port) == health_pb2.HealthCheckResponse.SERVING
            assert (await _scrape(port)).startswith(b"HTTP/1.1 200 OK")
            for _, writer in held:
                writer.close()
        finally:
            await server.stop(None)
            await metrics.close()

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_head_that_never_completes_is_closed_unanswered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """METRICS_HEAD_TIMEOUT_MS: a connection that stops mid-request gives its place back."""
    monkeypatch.setattr(metrics_http, "METRICS_HEAD_TIMEOUT_MS", 50)

    async def scenario() -> None:
        metrics = NodeMetrics("n1")
        port = free_port()
        await metrics.serve("127.0.0.1", port)
        try:
            assert await _scrape(port, PARTIAL) == b""  # closed, nothing said
        finally:
            await metrics.close()

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))


def test_a_head_longer_than_the_bound_is_refused() -> None:
    """METRICS_HEAD_BYTES_MAX: a request head is never read past it."""

    async def scenario() -> None:
        metrics = NodeMetrics("n1")
        port = free_port()
        await metrics.serve("127.0.0.1", port)
        try:
            filler = b"X-Filler: " + b"a" * metrics_http.METRICS_HEAD_BYTES_MAX + b"\r\n"
            answer = await _scrape(port, PARTIAL + filler + b"\r\n")
            assert answer.startswith(b"HTTP/1.1 431 ")
            assert str(metrics_http.METRICS_HEAD_BYTES_MAX).encode() in answer
        finally:
            await metrics.close()

    asyncio.run(asyncio.wait_for(scenario(), GUARD_S))
