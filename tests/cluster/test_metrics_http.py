"""The metrics port serves ``/metrics`` only (a user review: every path answered with the
page, so a mistyped scrape path looked right), on the loopback here, IPv4 and IPv6."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from raftstream.cluster.metrics import METRICS_PATH, NodeMetrics
from raftstream.localnet import free_port


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def served() -> Iterator[str]:
    metrics = NodeMetrics("n1")
    metrics.published.inc(3)
    port = free_port()
    metrics.serve("127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        metrics.close()


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
            NodeMetrics("n1").serve("127.0.0.1", port)


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 here")
def test_an_ipv6_address_is_served() -> None:
    metrics = NodeMetrics("n1")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = probe.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    metrics.serve("::1", port)
    try:
        assert _get(f"http://[::1]:{port}{METRICS_PATH}")[0] == 200
    finally:
        metrics.close()
