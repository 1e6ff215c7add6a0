"""The metrics port serves ``/metrics`` only (a user review: every path answered with the
page, so a mistyped scrape path looked right), on the loopback here, IPv4 and IPv6; and each
per-group series names the group's account and stream apart."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from raftstream.cluster.common.metrics import GROUP_LABELS, METRICS_PATH, NodeMetrics, group_labels
from raftstream.tooling.localnet import free_port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@contextlib.contextmanager
def serving(metrics: NodeMetrics, host: str, port: int) -> Iterator[None]:
    """``metrics`` served on an event loop of its own thread (as on a node's loop) while the
    test's blocking HTTP calls run on the test's."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(metrics.serve(host, port), loop).result(10)
        yield
    finally:
        asyncio.run_coroutine_threadsafe(metrics.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def served() -> Iterator[str]:
    metrics = NodeMetrics("n1")
    metrics.published.inc(3)
    port = free_port()
    with serving(metrics, "127.0.0.1", port):
        yield f"http://127.0.0.1:{port}"


def test_the_page_is_at_metrics(served: str) -> None:
    status, text = _get(served + METRICS_PATH)
    assert status == 200
    assert "raftstream_published_messages_total 3.0" in text
    # The library's query (a scraper's ``name[]`` filter) still works.
    status, text = _get(served + METRICS_PATH + "?name[]=raftstream_published_messages_total")
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert (status, samples) == (200, ["raftstream_published_messages_total 3.0"])


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/x", "/favicon.ico", "/health"])
def test_any_other_path_is_404_naming_metrics(served: str, path: str) -> None:
    status, text = _get(served + path)
    assert status == 404
    assert "/metrics" in text and "raftstream_" not in text


def test_a_taken_port_names_the_key() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match="metrics_listen"):
            asyncio.run(NodeMetrics("n1").serve("127.0.0.1", port))


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 here")
def test_an_ipv6_address_is_served() -> None:
    metrics = NodeMetrics("n1")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with serving(metrics, "::1", port):
        assert _get(f"http://[::1]:{port}{METRICS_PATH}")[0] == 200


@pytest.mark.parametrize(
    ("group", "labels"),
    [
        ("S:$G:ORDERS", ("S:$G:ORDERS", "$G", "ORDERS")),
        ("S:acme:a:b", ("S:acme:a:b", "acme", "a:b")),  # stream names may hold ':'
        ("meta", ("meta", "", "")),
    ],
)
def test_a_group_series_names_its_account_and_stream(group: str, labels: tuple[str, ...]) -> None:
    """Per-group series carry the account and stream apart from the group id (a user review:
    a dashboard had to parse ``S:<account>:<stream>`` to sum by stream)."""
    assert group_labels(group) == labels
    metrics = NodeMetrics("n1")
    metrics.observe_group(group, applied=7, term=2, leader=True)
    metrics.observe_store(group, msgs=5, size_bytes=640)
    values = dict(zip(GROUP_LABELS, labels, strict=True))
    sample = metrics.registry.get_sample_value
    assert sample("raftstream_raft_applied_index", values) == 7
    assert sample("raftstream_stream_messages", values) == 5
    metrics.forget_group(group)
    assert sample("raftstream_raft_applied_index", values) is None
