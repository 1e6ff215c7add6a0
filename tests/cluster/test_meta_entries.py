"""Meta entries: the byte encoding round-trips exactly, and anything else is DATA_LOSS.

The encoding is ``u8 version | u8 kind | canonical JSON`` (cluster/meta/entries.py): the same
entry must give the same bytes on every node, and a log entry is never half-understood.
"""

from __future__ import annotations

import json

import pytest

from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.meta.entries import (
    FORMAT_VERSION,
    AddConsumer,
    AddStream,
    DeleteConsumer,
    DeleteStream,
    MetaEntry,
    NodeAdd,
    NodeForget,
    PeerAdd,
    PeerRemove,
    ReassignGroup,
    UpdateConsumer,
    UpdateStream,
    decode_entry,
    encode_entry,
)
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import Placement, StreamConfig, SubjectTransform
from raftstream.errors import DataLossError

CFG = StreamConfig(
    name="ORDERS",
    subjects=("orders.*", "returns.>"),
    subject_transform=SubjectTransform(src="orders.*", dest="o.$1"),
    num_replicas=3,
    metadata={"owner": "team-é"},
    placement=Placement(cluster="east", tags=("ssd",)),
    max_age=10**10,
)
CCFG = ConsumerConfig(
    durable_name="C", filter_subjects=("orders.a", "orders.b"), backoff=(10**9,), opt_start_time=0
)
ENTRIES: list[MetaEntry] = [
    AddStream(account="$G", config=CFG, peers=("n1", "n2", "n3"), ts_ns=1),
    UpdateStream(account="$G", config=CFG, peers=("n1",), prior_peers=("n1", "n2"), ts_ns=2),
    DeleteStream(account="B", name="ORDERS", ts_ns=3),
    AddConsumer(account="$G", stream="ORDERS", config=CCFG, ts_ns=4),
    UpdateConsumer(account="$G", stream="ORDERS", config=CCFG, ts_ns=5),
    DeleteConsumer(account="$G", stream="ORDERS", name="C", ts_ns=6),
    PeerRemove(peer="n3", ts_ns=7),
    ReassignGroup(account="$G", stream="ORDERS", peers=("n2",), prior_peers=("n3",), ts_ns=8),
    PeerAdd(peer="n3", ts_ns=9),
    NodeAdd(node="n4", address="10.0.0.4:7101", ts_ns=10),
    NodeForget(node="n3", ts_ns=11),
]


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: type(e).__name__)
def test_every_entry_round_trips(entry: MetaEntry) -> None:
    """decode(encode(e)) == e, and re-encoding gives the same bytes (canonical form)."""
    data = encode_entry(entry)
    assert data[0] == FORMAT_VERSION
    back = decode_entry(data)
    assert back == entry
    assert encode_entry(back) == data


def test_kinds_are_distinct() -> None:
    assert len({encode_entry(e)[1] for e in ENTRIES}) == len(ENTRIES)


def test_group_id_format() -> None:
    """docs/cluster-design.md: a stream's group is S:<account>:<stream>."""
    assert stream_group_id("$G", "ORDERS") == "S:$G:ORDERS"


def _body(entry: MetaEntry) -> dict[str, object]:
    body = json.loads(encode_entry(entry)[2:])
    assert isinstance(body, dict)
    return body


def _with_body(entry: MetaEntry, body: dict[str, object]) -> bytes:
    return encode_entry(entry)[:2] + json.dumps(body).encode()


def _corruptions() -> list[tuple[str, bytes]]:
    add = ENTRIES[0]
    good = encode_entry(add)
    missing = _body(add)
    del missing["peers"]
    extra = {**_body(add), "zone": "x"}
    bad_ts = {**_body(add), "ts_ns": "1"}
    bool_ts = {**_body(add), "ts_ns": True}
    bad_peers = {**_body(add), "peers": "n1"}
    bad_config = {**_body(add), "config": {"name": "X", "bogus": 1}}
    bad_consumer = {**_body(ENTRIES[3]), "config": {"ack_policy": "sometimes"}}
    return [
        ("empty", b""),
        ("version", bytes([FORMAT_VERSION + 1]) + good[1:]),
        ("kind", good[:1] + b"\x63" + good[2:]),
        ("json", good[:-1]),
        ("utf8", good[:2] + b"\xff\xfe"),
        ("not-object", good[:2] + b"[1,2]"),
        ("missing", _with_body(add, missing)),
        ("extra", _with_body(add, extra)),
        ("ts-type", _with_body(add, bad_ts)),
        ("ts-bool", _with_body(add, bool_ts)),
        ("peers-type", _with_body(add, bad_peers)),
        ("stream-config", _with_body(add, bad_config)),
        ("consumer-config", _with_body(ENTRIES[3], bad_consumer)),
    ]


@pytest.mark.parametrize(("case", "data"), _corruptions(), ids=[c for c, _ in _corruptions()])
def test_unreadable_entries_are_data_loss(case: str, data: bytes) -> None:
    """Unknown version or kind, bad JSON or UTF-8, missing/unknown/mistyped fields, or a
    config that does not parse: DataLossError, never a partly-read entry."""
    with pytest.raises(DataLossError):
        decode_entry(data)
