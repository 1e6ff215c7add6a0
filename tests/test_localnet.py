"""raftstream.localnet.free_port: distinct ports, outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from raftstream import localnet


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [localnet.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    span = localnet._listen_range()
    if span is not None:  # Linux: outgoing connections never get these ports
        assert all(span[0] <= p < span[1] for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        other = localnet.free_port()
        localnet._handed_out.discard(other)
        picks = iter([taken, other])
        monkeypatch.setattr(localnet, "_listen_range", lambda: (1024, 65536))
        monkeypatch.setattr(localnet._rng, "randrange", lambda lo, hi: next(picks))
        assert localnet.free_port() == other
