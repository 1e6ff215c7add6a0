"""raftstream.tooling.localnet.free_port: distinct ports, outside the kernel's ephemeral range."""

from __future__ import annotations

import itertools
import socket

import pytest

from raftstream.tooling import localnet


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


def test_port_slices_split_the_range_into_disjoint_parts() -> None:
    parts = [localnet.port_slice(20000, 32768, f"{k}/3") for k in range(3)]
    assert parts[0][0] == 20000 and parts[-1][1] <= 32768
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(parts))
    assert all(hi - lo == (32768 - 20000) // 3 for lo, hi in parts)
    assert localnet.port_slice(20000, 32768, "") == (20000, 32768)


@pytest.mark.parametrize("spec", ["2/2", "1", "a/2", "-1/2", "0/0", "1/2/3", "0/500"])
def test_a_bad_port_slice_is_refused_naming_the_variable(spec: str) -> None:
    with pytest.raises(ValueError, match="RAFTSTREAM_PORT_SLICE"):
        localnet.port_slice(20000, 32768, spec)


def test_free_port_keeps_to_this_process_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(localnet.PORT_SLICE_ENV, raising=False)
    whole = localnet._listen_range()
    if whole is None:
        pytest.skip("no room below the ephemeral range on this machine")
    monkeypatch.setenv(localnet.PORT_SLICE_ENV, "1/4")
    lo, hi = localnet.port_slice(*whole, "1/4")
    assert localnet._listen_range() == (lo, hi)
    ports = [localnet.free_port() for _ in range(50)]
    assert all(lo <= p < hi for p in ports)
