"""The Toxiproxy-compatible server, driven through the real toxiproxy-python client.

Each test pins behaviour documented by Toxiproxy (README "HTTP API" and "Toxics", and its
api.go status codes and error bodies). Timings are checked as lower bounds only: a toxic
must delay at least as configured; how much longer a loaded machine takes is not checked.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from raftstream.chaos.toxiproxy_server import ServerThread, split_host_port
from tests.support.polling import wait_for

IO_TIMEOUT_S = 5.0

# asyncio may fire a timer up to its clock resolution early; allow that much and no more.
TIMER_SLACK_S = 0.002

Connect = Callable[[Proxy], socket.socket]
Upstream = Any  # conftest.Upstream: a loopback echo (or banner) server


def recv_exactly(sock: socket.socket, n_bytes: int) -> bytes:
    """Read exactly ``n_bytes`` or fail (EOF or the socket timeout)."""
    data = bytearray()
    while len(data) < n_bytes:
        part = sock.recv(n_bytes - len(data))
        if not part:
            raise EOFError(f"EOF after {len(data)} of {n_bytes} bytes")
        data += part
    return bytes(data)


def recv_until_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    while part := sock.recv(65536):
        data += part
    return bytes(data)


def recv_or_reset(sock: socket.socket) -> bytes:
    """What the next read gives, with a reset read as an end of stream (a drop either way)."""
    try:
        return sock.recv(16)
    except ConnectionResetError:
        return b""


def round_trip_s(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.monotonic()
    sock.sendall(payload)
    assert recv_exactly(sock, len(payload)) == payload
    return time.monotonic() - start


def api_error(exc: Exception) -> dict[str, object]:
    """The JSON error body a toxiproxy-python exception carries."""
    body: dict[str, object] = json.loads(exc.args[0])
    return body


@pytest.fixture
def proxy(toxiproxy: Toxiproxy, echo: Upstream) -> Proxy:
    return toxiproxy.create(upstream=echo.address, name="echo")


# --- proxies -----------------------------------------------------------------------------


def test_version_and_running(toxiproxy: Toxiproxy) -> None:
    assert toxiproxy.running()
    assert "version" in json.loads(toxiproxy.version())


def test_create_with_listen_port_zero_returns_the_bound_address(
    toxiproxy: Toxiproxy, echo: Upstream, connect: Connect
) -> None:
    created = toxiproxy.create(upstream=echo.address, name="echo", listen="127.0.0.1:0")
    host, port = split_host_port(created.listen)
    assert (host, created.enabled, created.upstream) == ("127.0.0.1", True, echo.address)
    assert port != 0
    assert round_trip_s(connect(created)) >= 0
    listed = toxiproxy.proxies()
    assert list(listed) == ["echo"]
    assert listed["echo"].listen == created.listen
    shown = APIConsumer.get("/proxies/echo")
    assert shown.status_code == 200
    assert shown.json() == {
        "name": "echo",
        "listen": created.listen,
        "upstream": echo.address,
        "enabled": True,
        "toxics": [],
    }


def test_create_answers_201_and_duplicate_name_409(toxiproxy: Toxiproxy, echo: Upstream) -> None:
    body = {"name": "dup", "upstream": echo.address, "listen": "127.0.0.1:0"}
    assert APIConsumer.post("/proxies", json=body).status_code == 201
    with pytest.raises(ProxyExists) as raised:
        APIConsumer.post("/proxies", json=body)
    assert api_error(raised.value) == {"error": "proxy already exists", "status": 409}
    with pytest.raises(ProxyExists):  # the client checks too, before posting
        toxiproxy.create(upstream=echo.address, name="dup")


def test_create_requires_name_and_upstream(toxiproxy: Toxiproxy) -> None:
    with pytest.raises(InvalidToxic) as raised:
        APIConsumer.post("/proxies", json={"upstream": "127.0.0.1:1"})
    assert api_error(raised.value) == {"error": "missing required field: name", "status": 400}
    with pytest.raises(InvalidToxic) as raised:
        APIConsumer.post("/proxies", json={"name": "x"})
    assert api_error(raised.value)["error"] == "missing required field: upstream"


def test_created_disabled_proxy_does_not_listen_until_enabled(
    toxiproxy: Toxiproxy, echo: Upstream, connect: Connect
) -> None:
    created = toxiproxy.create(upstream=echo.address, name="later", enabled=False)
    assert (created.enabled, created.listen) == (False, "127.0.0.1:0")
    created.enable()
    enabled = toxiproxy.get_proxy("later")
    assert enabled is not None and enabled.enabled
    assert round_trip_s(connect(enabled)) >= 0


def test_only_loopback_listen_addresses_are_bound(toxiproxy: Toxiproxy, echo: Upstream) -> None:
    with pytest.raises(InvalidToxic) as raised:
        APIConsumer.post(
            "/proxies", json={"name": "wide", "upstream": echo.address, "listen": "0.0.0.0:0"}
        )
    assert api_error(raised.value)["status"] == 400
    assert toxiproxy.proxies() == {}


def test_destroy_stops_listening_and_answers_204_then_404(
    toxiproxy: Toxiproxy, proxy: Proxy, connect: Connect
) -> None:
    host, port = split_host_port(proxy.listen)
    assert APIConsumer.delete("/proxies/echo").status_code == 204
    assert toxiproxy.proxies() == {}
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=IO_TIMEOUT_S).close()
    with pytest.raises(NotFound) as raised:
        proxy.destroy()
    assert api_error(raised.value) == {"error": "proxy not found", "status": 404}


def test_disable_drops_connections_and_refuses_new_ones_enable_relistens_same_address(
    toxiproxy: Toxiproxy, proxy: Proxy, connect: Connect
) -> None:
    live = connect(proxy)
    assert round_trip_s(live) >= 0
    proxy.disable()
    assert APIConsumer.get("/proxies/echo").json()["enabled"] is False
    assert recv_or_reset(live) == b""
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.enable()
    again = toxiproxy.get_proxy("echo")
    assert again is not None and again.enabled and again.listen == proxy.listen
    assert round_trip_s(connect(again)) >= 0


def test_down_context_manager_takes_proxy_down_and_back(proxy: Proxy, connect: Connect) -> None:
    with proxy.down(), pytest.raises(ConnectionRefusedError):
        connect(proxy)
    assert round_trip_s(connect(proxy)) >= 0


def test_update_upstream_restarts_proxy_on_new_upstream(
    proxy: Proxy, upstreams: Callable[..., Upstream], echo: Upstream, connect: Connect
) -> None:
    old = connect(proxy)
    assert round_trip_s(old) >= 0
    other = upstreams()
    updated = APIConsumer.post("/proxies/echo", json={"upstream": other.address})
    assert updated.status_code == 200
    assert updated.json()["upstream"] == other.address
    assert updated.json()["listen"] == proxy.listen
    assert recv_or_reset(old) == b""  # "changing upstream drops active connections"
    assert round_trip_s(connect(proxy)) >= 0
    assert (echo.accepted, other.accepted) == (1, 1)


def test_update_listen_moves_the_proxy(proxy: Proxy, connect: Connect) -> None:
    old_host, old_port = split_host_port(proxy.listen)
    moved = APIConsumer.post("/proxies/echo", json={"listen": "127.0.0.1:0"}).json()
    assert moved["enabled"] and moved["listen"] != proxy.listen
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((old_host, old_port), timeout=IO_TIMEOUT_S).close()
    proxy.listen = moved["listen"]
    assert round_trip_s(connect(proxy)) >= 0


def test_reset_enables_every_proxy_and_removes_every_toxic(
    toxiproxy: Toxiproxy, proxy: Proxy, echo: Upstream, connect: Connect
) -> None:
    second = toxiproxy.create(upstream=echo.address, name="second")
    proxy.add_toxic(type="latency", attributes={"latency": 1000})
    second.add_toxic(type="timeout", stream="upstream")
    second.disable()
    assert APIConsumer.post("/reset").status_code == 204
    assert toxiproxy.reset() is True
    proxies = toxiproxy.proxies()
    assert all(p.enabled for p in proxies.values())
    assert all(p.toxics() == {} for p in proxies.values())
    assert round_trip_s(connect(proxies["second"])) >= 0


def test_populate_creates_then_keeps_unchanged_proxies(
    toxiproxy: Toxiproxy, echo: Upstream
) -> None:
    wanted = [{"name": "pop", "upstream": echo.address, "listen": "127.0.0.1:0"}]
    first = APIConsumer.post("/populate", json=wanted)
    assert first.status_code == 201
    (created,) = first.json()["proxies"]
    again = [{"name": "pop", "upstream": echo.address, "listen": created["listen"]}]
    second = APIConsumer.post("/populate", json=again)
    assert second.status_code == 201
    assert second.json()["proxies"][0]["listen"] == created["listen"]
    assert list(toxiproxy.proxies()) == ["pop"]
    moved = [{"name": "pop", "upstream": "127.0.0.1:9", "listen": created["listen"]}]
    third = APIConsumer.post("/populate", json=moved)
    assert third.status_code == 201
    assert APIConsumer.get("/proxies/pop").json()["upstream"] == "127.0.0.1:9"


def test_client_side_populate_and_destroy_all(toxiproxy: Toxiproxy, echo: Upstream) -> None:
    made = toxiproxy.populate(
        [{"name": "a", "upstream": echo.address}, {"name": "b", "upstream": echo.address}]
    )
    assert sorted(p.name for p in made) == ["a", "b"]
    toxiproxy.destroy_all()
    assert toxiproxy.proxies() == {}


def test_unknown_proxy_and_toxic_are_404(proxy: Proxy) -> None:
    with pytest.raises(NotFound) as raised:
        APIConsumer.get("/proxies/nope")
    assert api_error(raised.value) == {"error": "proxy not found", "status": 404}
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/nope/toxics")
    with pytest.raises(NotFound):
        APIConsumer.post("/proxies/nope/toxics", json={"type": "latency"})
    with pytest.raises(NotFound) as raised:
        proxy.destroy_toxic("nope")
    assert api_error(raised.value) == {"error": "toxic not found", "status": 404}
    with pytest.raises(NotFound):
        APIConsumer.get("/proxies/echo/toxics/nope")
    assert proxy.get_toxic("nope") is None


def test_bad_json_is_400(proxy: Proxy) -> None:
    for path in ("/proxies", "/proxies/echo", "/proxies/echo/toxics", "/populate"):
        with pytest.raises(InvalidToxic) as raised:
            APIConsumer.post(path, data=b'{"name": ', headers={"Content-Type": "application/json"})
        error = api_error(raised.value)
        assert error["status"] == 400
        assert str(error["error"]).startswith("bad request body")
    with pytest.raises(InvalidToxic):
        APIConsumer.post("/proxies/echo", json={"enabled": "yes"})


def test_routing_errors_and_browser_refusal(server: ServerThread) -> None:
    assert requests.get(server.url + "/nothing", timeout=IO_TIMEOUT_S).status_code == 404
    assert requests.put(server.url + "/proxies", timeout=IO_TIMEOUT_S).status_code == 405
    browser = {"User-Agent": "Mozilla/5.0"}
    assert (
        requests.get(server.url + "/proxies", headers=browser, timeout=IO_TIMEOUT_S).status_code
        == 403
    )


def test_malformed_http_is_refused(server: ServerThread) -> None:
    host, port = split_host_port(server.url.removeprefix("http://"))
    for request, status in (
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"POST /proxies HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", b"501"),
        (b"GET /proxies HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"400"),
        (b"GET /proxies HTTP/2.0\r\n\r\n", b"505"),
    ):
        with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
            sock.sendall(request)
            assert recv_until_eof(sock).split(b" ")[1] == status


def test_expect_continue_and_duplicate_content_length(server: ServerThread) -> None:
    host, port = split_host_port(server.url.removeprefix("http://"))
    body = b'{"name": "c", "upstream": "127.0.0.1:9"}'
    head = b"POST /proxies HTTP/1.1\r\nConnection: close\r\nExpect: 100-continue\r\n"
    with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        assert b" 201 " in recv_until_eof(sock).split(b"\r\n")[0]
    smuggled = b"GET /proxies HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n"
    with socket.create_connection((host, port), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(smuggled)
        assert recv_until_eof(sock).split(b" ")[1] == b"400"


def test_keep_alive_serves_several_requests_on_one_connection(server: ServerThread) -> None:
    with requests.Session() as session:
        for _ in range(3):
            assert session.get(server.url + "/proxies", timeout=IO_TIMEOUT_S).json() == {}


# --- toxics: the API -----------------------------------------------------------------------


def test_toxic_json_defaults_and_listing(proxy: Proxy) -> None:
    created = APIConsumer.post("/proxies/echo/toxics", json={"type": "latency"})
    assert created.status_code == 200
    assert created.json() == {
        "attributes": {"latency": 0, "jitter": 0},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 1.0,
    }
    proxy.add_toxic(type="bandwidth", stream="upstream", toxicity=0.5, attributes={"rate": 9})
    toxics = proxy.toxics()
    assert sorted(toxics) == ["bandwidth_upstream", "latency_downstream"]
    bandwidth = toxics["bandwidth_upstream"]
    assert (bandwidth.type, bandwidth.stream, bandwidth.toxicity) == ("bandwidth", "upstream", 0.5)
    assert bandwidth.attributes == {"rate": 9}
    listed = APIConsumer.get("/proxies/echo/toxics").json()
    assert [t["name"] for t in listed] == ["bandwidth_upstream", "latency_downstream"]
    assert APIConsumer.get("/proxies/echo").json()["toxics"] == listed
    assert APIConsumer.delete("/proxies/echo/toxics/latency_downstream").status_code == 204
    assert list(proxy.toxics()) == ["bandwidth_upstream"]


def test_toxic_errors(proxy: Proxy) -> None:
    cases = [
        ({"type": "latency", "stream": "sideways"}, 400, "stream was invalid"),
        ({"type": "hiccup"}, 400, "invalid toxic type"),
        ({"type": "latency", "attributes": {"latency": "slow"}}, 400, "bad request body"),
        ({"type": "latency", "attributes": {"latency": -1}}, 400, "bad request body"),
    ]
    for body, status, message in cases:
        with pytest.raises(InvalidToxic) as raised:
            APIConsumer.post("/proxies/echo/toxics", json=body)
        error = api_error(raised.value)
        assert error["status"] == status and str(error["error"]).startswith(message), body
    proxy.add_toxic(type="latency", name="slow")
    with pytest.raises(ProxyExists) as exists:  # the client maps every 409 to ProxyExists
        proxy.add_toxic(type="timeout", name="slow")
    assert api_error(exists.value) == {"error": "toxic already exists", "status": 409}


def test_toxic_update_changes_attributes_and_toxicity_only(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 10, "jitter": 2})
    updated = APIConsumer.post(
        "/proxies/echo/toxics/latency_downstream",
        json={"attributes": {"latency": 20}, "toxicity": 0.25, "stream": "upstream"},
    )
    assert updated.json() == {
        "attributes": {"latency": 20, "jitter": 2},
        "name": "latency_downstream",
        "type": "latency",
        "stream": "downstream",
        "toxicity": 0.25,
    }
    shown = proxy.get_toxic("latency_downstream")
    assert shown is not None and shown.attributes == {"latency": 20, "jitter": 2}


# --- toxics: their effect on real connections ------------------------------------------------


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_delays_each_direction_on_live_connections(
    proxy: Proxy, connect: Connect, stream: str
) -> None:
    sock = connect(proxy)
    assert round_trip_s(sock) >= 0
    proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 150})
    assert round_trip_s(sock) >= 0.150 - TIMER_SLACK_S
    assert round_trip_s(connect(proxy)) >= 0.150 - TIMER_SLACK_S


def test_latency_with_jitter_delays_at_least_latency_minus_jitter(
    proxy: Proxy, connect: Connect
) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 40})
    sock = connect(proxy)
    for _ in range(3):
        assert round_trip_s(sock) >= 0.060 - TIMER_SLACK_S


def test_latency_update_applies_to_live_connections(proxy: Proxy, connect: Connect) -> None:
    sock = connect(proxy)
    proxy.add_toxic(type="latency", attributes={"latency": 0})
    assert round_trip_s(sock) >= 0
    APIConsumer.post(
        "/proxies/echo/toxics/latency_downstream", json={"attributes": {"latency": 120}}
    )
    assert round_trip_s(sock) >= 0.120 - TIMER_SLACK_S


def test_bandwidth_limits_bytes_per_second(proxy: Proxy, connect: Connect) -> None:
    rate_kb_s = 100
    payload = os.urandom(30_000)
    proxy.add_toxic(type="bandwidth", attributes={"rate": rate_kb_s})
    sock = connect(proxy)
    elapsed_s = round_trip_s(sock, payload)
    assert elapsed_s >= len(payload) / (rate_kb_s * 1000) - TIMER_SLACK_S


def test_timeout_drops_data_then_closes_after_timeout(
    proxy: Proxy, echo: Upstream, connect: Connect
) -> None:
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 200})
    start = time.monotonic()
    sock = connect(proxy)
    sock.sendall(b"lost")
    assert recv_until_eof(sock) == b""
    assert time.monotonic() - start >= 0.200 - TIMER_SLACK_S
    assert echo.received_bytes == 0


def test_timeout_timer_restarts_at_each_dropped_chunk(proxy: Proxy, connect: Connect) -> None:
    """As Toxiproxy's timeout.go: a fresh timer per wait, so a chatty link is held open."""
    proxy.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 1000})
    sock = connect(proxy)
    chatter_end = time.monotonic() + 1.3  # longer than the timeout
    while time.monotonic() < chatter_end:
        sock.sendall(b".")
        last_sent = time.monotonic()
        time.sleep(0.05)
    sock.settimeout(0.05)
    with pytest.raises(TimeoutError):  # still open: no EOF, no reset
        sock.recv(16)
    sock.settimeout(IO_TIMEOUT_S)
    assert recv_until_eof(sock) == b""
    assert time.monotonic() - last_sent >= 1.0 - TIMER_SLACK_S


def test_timeout_zero_holds_forever_and_removing_it_closes(proxy: Proxy, connect: Connect) -> None:
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    sock = connect(proxy)
    sock.settimeout(0.3)
    sock.sendall(b"held")
    with pytest.raises(TimeoutError):
        sock.recv(16)
    sock.settimeout(IO_TIMEOUT_S)
    proxy.destroy_toxic("timeout_downstream")
    # As Toxiproxy: the dropped bytes make the stream unusable, so removal closes the link.
    assert recv_until_eof(sock) == b""


def test_upstream_and_downstream_toxics_act_on_their_direction_only(
    proxy: Proxy, echo: Upstream, connect: Connect
) -> None:
    proxy.add_toxic(type="timeout", stream="downstream")
    down = connect(proxy)
    down.settimeout(0.3)
    down.sendall(b"12345")
    wait_for(
        "the request to reach upstream",
        lambda: echo.received_bytes == 5,
        IO_TIMEOUT_S,
        interval_s=0.01,
    )
    with pytest.raises(TimeoutError):
        down.recv(16)  # the reply is held downstream
    proxy.destroy_toxic("timeout_downstream")
    proxy.add_toxic(type="timeout", stream="upstream")
    up = connect(proxy)
    up.settimeout(0.3)
    up.sendall(b"678")
    with pytest.raises(TimeoutError):
        up.recv(16)
    assert echo.received_bytes == 5  # the request never reached upstream


def test_reset_peer_resets_the_connection_after_its_timeout(proxy: Proxy, connect: Connect) -> None:
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 100})
    sock = connect(proxy)
    start = time.monotonic()
    sock.sendall(b"hello")
    with pytest.raises(ConnectionResetError):
        recv_until_eof(sock)
    assert time.monotonic() - start >= 0.100 - TIMER_SLACK_S


def test_reset_peer_zero_resets_at_first_data(proxy: Proxy, connect: Connect) -> None:
    sock = connect(proxy)
    assert round_trip_s(sock) >= 0
    proxy.add_toxic(type="reset_peer", stream="upstream", attributes={"timeout": 0})
    sock.sendall(b"boom")
    with pytest.raises(ConnectionResetError):
        recv_until_eof(sock)


def test_slow_close_delays_the_close(
    toxiproxy: Toxiproxy, upstreams: Callable[..., Upstream], connect: Connect
) -> None:
    closer = upstreams(banner=b"bye")
    proxy = toxiproxy.create(upstream=closer.address, name="closer")
    proxy.add_toxic(type="slow_close", attributes={"delay": 250})
    start = time.monotonic()
    sock = connect(proxy)
    assert recv_until_eof(sock) == b"bye"
    assert time.monotonic() - start >= 0.250 - TIMER_SLACK_S


def test_slicer_splits_writes_into_several_reads_intact(proxy: Proxy, connect: Connect) -> None:
    proxy.add_toxic(
        type="slicer", attributes={"average_size": 10, "size_variation": 3, "delay": 20_000}
    )
    sock = connect(proxy)
    payload = os.urandom(100)
    sock.sendall(payload)
    reads: list[bytes] = []
    while sum(map(len, reads)) < len(payload):
        reads.append(sock.recv(4096))
        assert reads[-1], "EOF before the whole payload"
    assert b"".join(reads) == payload
    assert len(reads) > 1


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_limit_data_closes_after_n_bytes(
    proxy: Proxy, echo: Upstream, connect: Connect, stream: str
) -> None:
    proxy.add_toxic(type="limit_data", stream=stream, attributes={"bytes": 10})
    sock = connect(proxy)
    payload = os.urandom(100)
    sock.sendall(payload)
    if stream == "downstream":
        assert recv_until_eof(sock) == payload[:10]
    else:
        # The upstream socket closes right after the 10th byte, so the echo of those bytes
        # may or may not make it back (Toxiproxy closes the whole connection as well).
        assert payload[:10].startswith(recv_until_eof(sock))
        wait_for(
            "upstream to receive the 10 bytes",
            lambda: echo.received_bytes == 10,
            IO_TIMEOUT_S,
            interval_s=0.01,
        )


def test_toxicity_zero_never_applies(proxy: Proxy, connect: Connect) -> None:
    proxy.add_toxic(type="timeout", toxicity=0.0)
    proxy.add_toxic(type="limit_data", stream="upstream", toxicity=0.0, attributes={"bytes": 0})
    for _ in range(5):
        sock = connect(proxy)
        assert round_trip_s(sock, b"x" * 100) >= 0


def test_toxicity_is_drawn_per_connection(proxy: Proxy, connect: Connect) -> None:
    proxy.add_toxic(type="limit_data", stream="upstream", toxicity=0.5, attributes={"bytes": 0})
    outcomes = []
    for _ in range(30):
        sock = connect(proxy)
        sock.sendall(b"x")
        outcomes.append(recv_or_reset(sock) == b"x")
    # 30 fair draws all alike: probability 2**-29.
    assert any(outcomes) and not all(outcomes)


# --- data integrity while toxics change on a busy link ---------------------------------------


def test_bulk_transfer_is_intact_through_backpressure(proxy: Proxy, connect: Connect) -> None:
    sock = connect(proxy)
    payload = os.urandom(4 * 1024 * 1024)  # more than a link's in-flight budget
    sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
    sender.start()
    assert recv_exactly(sock, len(payload)) == payload
    sender.join(IO_TIMEOUT_S)


def test_adding_and_removing_toxics_mid_stream_loses_and_reorders_nothing(
    proxy: Proxy, connect: Connect
) -> None:
    sock = connect(proxy)
    payload = os.urandom(400_000)
    pieces = [payload[i : i + 4000] for i in range(0, len(payload), 4000)]

    def send() -> None:
        for i, piece in enumerate(pieces):
            sock.sendall(piece)
            if i % 10 == 0:
                time.sleep(0.002)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    received = bytearray()
    changes = [
        lambda: proxy.add_toxic(type="latency", attributes={"latency": 20, "jitter": 10}),
        lambda: proxy.add_toxic(type="slicer", stream="upstream", attributes={"average_size": 500}),
        lambda: proxy.add_toxic(type="bandwidth", attributes={"rate": 2000}),
        lambda: proxy.destroy_toxic("latency_downstream"),
        lambda: APIConsumer.post(
            "/proxies/echo/toxics/bandwidth_downstream", json={"attributes": {"rate": 0}}
        ),
        lambda: proxy.destroy_toxic("slicer_upstream"),
        lambda: proxy.destroy_toxic("bandwidth_downstream"),
    ]
    for change in changes:
        received += recv_exactly(sock, 40_000)
        change()
    received += recv_exactly(sock, len(payload) - len(received))
    sender.join(IO_TIMEOUT_S)
    assert bytes(received) == payload


@pytest.mark.parametrize(
    ("toxic", "attributes"),
    [
        ("latency", {"latency": 60_000}),
        ("bandwidth", {"rate": 1}),
        ("slicer", {"average_size": 1, "delay": 10**9}),
    ],
)
@pytest.mark.parametrize("change", ["remove", "update"])
def test_bytes_held_by_a_toxic_survive_its_removal_or_update(
    proxy: Proxy,
    echo: Upstream,
    connect: Connect,
    toxic: str,
    attributes: dict[str, int],
    change: str,
) -> None:
    """Toxiproxy's link.RemoveToxic/UpdateToxic: "don't drop any data on the floor"."""
    proxy.add_toxic(type=toxic, attributes=attributes)
    sock = connect(proxy)
    payload = os.urandom(5000)  # minutes of delay at these settings while the toxic is there
    sock.sendall(payload)
    wait_for(
        "the echo to enter the toxic",
        lambda: echo.received_bytes == len(payload),
        IO_TIMEOUT_S,
        interval_s=0.01,
    )
    time.sleep(0.05)  # let the downstream link read the echo into the toxic
    if change == "remove":
        proxy.destroy_toxic(f"{toxic}_downstream")
    else:
        neutral = {"latency": {"latency": 0}, "bandwidth": {"rate": 0}, "slicer": {"delay": 0}}
        body = {"attributes": neutral[toxic]}
        APIConsumer.post(f"/proxies/echo/toxics/{toxic}_downstream", json=body)
    assert recv_exactly(sock, len(payload)) == payload


def test_stopping_the_server_drops_connections(echo: Upstream, connect: Connect) -> None:
    previous = (APIConsumer.host, APIConsumer.port)
    thread = ServerThread()
    try:
        host, port = split_host_port(thread.start().removeprefix("http://"))
        client = Toxiproxy()
        client.update_api_consumer(host, port)
        sock = connect(client.create(upstream=echo.address, name="echo"))
        assert round_trip_s(sock) >= 0
    finally:
        thread.stop()
        APIConsumer.host, APIConsumer.port = previous
    assert recv_or_reset(sock) == b""
