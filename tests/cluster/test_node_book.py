"""cluster/services/node_book.py: the cluster's nodes, their addresses, and the meta group's
founders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raftstream.cluster.config import Address, NodeConfig
from raftstream.cluster.services.node_book import CLUSTER_FILE, NodeBook
from raftstream.errors import DataLossError


def _config(tmp_path: Path, name: str, peers: dict[str, int]) -> NodeConfig:
    addrs = {n: Address("127.0.0.1", p) for n, p in peers.items()}
    return NodeConfig(name=name, listen=addrs[name], data=tmp_path, peers=addrs)


def test_a_founder_records_its_configured_peers_once_and_keeps_them(tmp_path: Path) -> None:
    book = NodeBook(_config(tmp_path, "n1", {"n1": 7101, "n2": 7102, "n3": 7103}))
    book.load()
    assert book.known_founders is None  # nothing recorded before the meta group starts
    assert book.founders() == ("n1", "n2", "n3")
    saved = json.loads((tmp_path / CLUSTER_FILE).read_text())
    assert saved == {"meta_founders": ["n1", "n2", "n3"], "addresses": {}}
    # Later the operator names a fourth node in n1's config: the founders stay.
    later = NodeBook(_config(tmp_path, "n1", {"n1": 7101, "n2": 7102, "n3": 7103, "n4": 7104}))
    later.load()
    assert later.founders() == ("n1", "n2", "n3")
    assert later.names() == ("n1", "n2", "n3", "n4")


def test_a_joiner_records_what_the_meta_leader_told_it(tmp_path: Path) -> None:
    """A node added later names itself and one founder; the founders and the others'
    addresses come from the meta leader, and survive a restart."""
    cfg = _config(tmp_path, "n4", {"n4": 7104, "n1": 7101})
    book = NodeBook(cfg)
    book.load()
    told = {"n1": "127.0.0.1:7101", "n2": "127.0.0.1:7102", "n3": "127.0.0.1:7103"}
    book.record(["n3", "n1", "n2"], told)
    again = NodeBook(cfg)
    again.load()
    assert again.founders() == ("n1", "n2", "n3")
    assert again.peers() == told
    assert again.address("n4") == "127.0.0.1:7104"
    assert again.is_founder("n2") and not again.is_founder("n4")


def test_addresses_prefer_the_config_then_the_meta_state_then_the_join_answer(
    tmp_path: Path,
) -> None:
    book = NodeBook(_config(tmp_path, "n1", {"n1": 7101, "n2": 7102}))
    book.record(["n1", "n2", "n3"], {"n2": "10.0.0.2:1", "n3": "10.0.0.3:1", "n5": "10.0.0.5:1"})
    assert book.set_added({"n5": "10.0.0.5:2", "n6": "10.0.0.6:1"}) == ["n6"]
    assert book.addresses() == {
        "n1": "127.0.0.1:7101",
        "n2": "127.0.0.1:7102",  # configured here
        "n3": "10.0.0.3:1",  # told on joining
        "n5": "10.0.0.5:2",  # the meta state's
        "n6": "10.0.0.6:1",
    }
    assert "n1" not in book.peers() and "n6" in book
    assert book.address("n9") is None and "n9" not in book


def test_a_forgotten_node_is_no_node_of_the_cluster_even_where_configured(
    tmp_path: Path,
) -> None:
    book = NodeBook(_config(tmp_path, "n1", {"n1": 7101, "n2": 7102, "n3": 7103}))
    book.founders()
    book.set_added({"n4": "10.0.0.4:1"}, forgotten={"n3", "n1"})
    assert book.names() == ("n1", "n2", "n4")  # never this node itself
    assert "n3" not in book and book.address("n3") is None
    book.set_added({"n4": "10.0.0.4:1", "n3": "10.0.0.3:9"}, forgotten=())  # added anew
    assert book.address("n3") == "127.0.0.1:7103"  # its config entry wins, as for any node


def test_a_founder_without_a_known_address_is_listed_but_not_dialled(tmp_path: Path) -> None:
    book = NodeBook(_config(tmp_path, "n4", {"n4": 7104, "n1": 7101}))
    book.record(["n1", "n2"], {})
    assert book.names() == ("n1", "n2", "n4")
    assert book.address("n2") is None
    assert set(book.peers()) == {"n1"}


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"addresses": {}}', '{"meta_founders": [], "addresses": {}}',
     '{"meta_founders": ["n1"], "addresses": {"n2": 7}}', '{"meta_founders": [1]}'],
)  # fmt: skip
def test_an_unreadable_record_stops_the_node(tmp_path: Path, text: str) -> None:
    (tmp_path / CLUSTER_FILE).write_text(text)
    book = NodeBook(_config(tmp_path, "n1", {"n1": 7101}))
    with pytest.raises(DataLossError, match=CLUSTER_FILE):
        book.load()
