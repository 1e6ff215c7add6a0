"""Synthetic 3-node data sets for the audit tests, written with the real storage APIs
(``raftstream.audit.synth``): a clean one, and a faulty one with ONE fault per stream, so
each test can tell which rule found what."""

from __future__ import annotations

import json
from pathlib import Path

from raftstream.audit.synth import SynthCluster
from raftstream.cluster.stream.entries import LeaderBarrier, StreamBatch
from raftstream.cluster.stream.entries import encode as encode_group
from raftstream.engine.consumer_state import Ack, ConsumerState, Deliver, Pending
from raftstream.engine.entries import DeleteMsg, Purge

SOURCE_HDR = "Nats-Stream-Source"
# stream -> the one rule its fault must trip (with the nodes and range it must name)
FAULTS = {
    "$G/DIVERGE": ("replica_divergence", ("n2",), 7, 7),
    "$G/MISSING": ("missing_on_replica", ("n3",), 20, 24),
    "$G/GAP": ("unexplained_gap", (), 30, 31),
    "$G/TERMS": ("raft_term_regression", ("n1", "n2", "n3"), 3, 3),
    "$G/RAFTDIFF": ("raft_entry_mismatch", ("n3",), 2, 2),
    "$G/DUPID": ("duplicate_msg_id", (), 41, 42),
    "$G/MIRROR": ("mirror_mismatch", (), 5, 5),
    "$G/SOURCED": ("source_exactly_once", (), 3, 3),
    "$G/CONS": ("consumer_acked_pending", ("n1",), 3, 3),
    "$G/FLOOR": ("consumer_ack_floor", ("n1",), 500, 10),
    "$G/LOST": ("acked_publish_lost", (), 11, 11),
}


def _data(i: int) -> bytes:
    return b"payload-%d" % i


def _history(path: Path, entries: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))


def build_clean(root: Path) -> Path:
    """Streams exercising every explained removal: deletes, a purge, a max_msgs limit, a
    consumer with acks, a mirror and a source of an origin. Returns the history file."""
    c = SynthCluster(root / "data")
    try:
        g = c.add_stream("ORDERS", ["orders.>"])
        c.publish(g, 60, subject="orders.new", msg_id=lambda i: f"o-{i}", data=_data)
        c.propose(g, [StreamBatch((DeleteMsg(ts_ns=c.tick(), seq=5),))])
        c.propose(g, [StreamBatch((Purge(ts_ns=c.tick(), seq=10),))])
        c.publish(g, 10, subject="orders.new", first=60, data=_data)
        ops = [Deliver(stream_seqs=(10, 11, 12), now_ns=c.tick())]
        c.consumer(g, "C", [*ops, Ack(stream_seqs=(10, 11), now_ns=c.tick())])
        lim = c.add_stream("LIMITED", ["lim.>"], max_msgs=20)
        c.publish(lim, 50, subject="lim.x", data=_data)
        _origin_and_copies(c, skip_mirror=None, twice_source=None)
    finally:
        c.close()
    hist = root / "history.jsonl"
    ok = [
        {"op": "publish", "stream": "ORDERS", "seq": s, "msg_id": f"o-{s - 1}", "outcome": "ok"}
        for s in (5, 12, 40)
    ]
    _history(hist, [*ok, {"op": "publish", "stream": "ORDERS", "seq": 99, "outcome": "fail"}])
    return hist


def _origin_and_copies(
    c: SynthCluster, *, skip_mirror: int | None, twice_source: int | None
) -> None:
    """Origin ORIGIN (10 messages), its mirror MIRROR and a stream SOURCED sourcing it,
    each copy carrying the source header; optionally one origin sequence left out of the
    mirror, or sourced twice."""
    o = c.add_stream("ORIGIN", ["origin.>"])
    c.publish(o, 10, subject="origin.x", data=lambda i: _data(i + 1))
    m = c.add_stream("MIRROR", ["origin.>"], mirror={"name": "ORIGIN"})
    s = c.add_stream("SOURCED", ["origin.>"], sources=[{"name": "ORIGIN"}])
    for group, skip, twice in ((m, skip_mirror, None), (s, None, twice_source)):
        seqs = [q for q in range(1, 11) if q != skip]
        if twice is not None:
            seqs.insert(seqs.index(twice), twice)
        for q in seqs:
            c.publish(
                group,
                1,
                subject="origin.x",
                first=q,
                data=_data,
                headers=lambda i: {SOURCE_HDR: f"ORIGIN {i} > >"},
            )


def build_faulty(root: Path) -> Path:
    """One fault per stream (``FAULTS``) plus a CONTROL stream without any. Returns the
    history file."""
    c = SynthCluster(root / "data")
    try:
        for name in ("CONTROL", "DIVERGE", "MISSING", "GAP", "DUPID", "LOST"):
            g = c.add_stream(name, [f"{name.lower()}.>"])
            c.publish(g, 40 if name != "LOST" else 10, subject=f"{name.lower()}.x", data=_data)
        c.fault_rewrite("n2", "S:$G:DIVERGE", 7, b"flipped")
        c.fault_drop("n3", "S:$G:MISSING", range(20, 25))
        for node in c.nodes:
            c.fault_drop(node, "S:$G:GAP", (30, 31))
        c.fault_append("S:$G:DUPID", "dupid.x", b"a", {"Nats-Msg-Id": "twice"})
        c.fault_append("S:$G:DUPID", "dupid.x", b"b", {"Nats-Msg-Id": "twice"})
        _raft_faults(c)
        _consumer_faults(c)
        _origin_and_copies(c, skip_mirror=5, twice_source=3)
    finally:
        c.close()
    hist = root / "history.jsonl"
    _history(
        hist,
        [
            {"op": "publish", "stream": "LOST", "seq": 10, "msg_id": None, "outcome": "ok"},
            {"op": "publish", "stream": "LOST", "seq": 11, "msg_id": "l-11", "outcome": "ok"},
            {"op": "publish", "stream": "LOST", "seq": 12, "msg_id": "l-12", "outcome": "unknown"},
            {"op": "publish", "stream": "CONTROL", "seq": 3, "msg_id": None, "outcome": "ok"},
        ],
    )
    return hist


def _raft_faults(c: SynthCluster) -> None:
    t = c.add_stream("TERMS", ["terms.>"])
    c.term = 3
    c.publish(t, 20, subject="terms.x", batch=10)  # indexes 1, 2 at term 3
    c.term = 2  # a regression: index 3 at term 2, on every replica
    c.publish(t, 10, subject="terms.x", first=20, batch=10)
    c.term = 3
    r = c.add_stream("RAFTDIFF", ["raftdiff.>"])
    c.publish(r, 10, subject="raftdiff.x", batch=10)
    c.append_raw(r, [encode_group(LeaderBarrier(3, "n1"))], nodes=["n1", "n2"])
    c.append_raw(r, [encode_group(LeaderBarrier(3, "n3"))], nodes=["n3"])


def _consumer_faults(c: SynthCluster) -> None:
    g = c.add_stream("CONS", ["cons.>"])
    c.publish(g, 10, subject="cons.x")
    now = c.tick()
    c.consumer(
        g, "C", [Deliver(stream_seqs=(1, 2, 3), now_ns=now), Ack(stream_seqs=(3,), now_ns=now)]
    )
    stale = ConsumerState(delivered_consumer_seq=3, delivered_stream_seq=3)
    stale.pending[3] = Pending(consumer_seq=3, deliveries=1, deadline_ns=now, delivered_ns=now)
    c.fault_consumer_state("n1", "CONS", "C", stale)
    f = c.add_stream("FLOOR", ["floor.>"])
    c.publish(f, 10, subject="floor.x")
    c.consumer(f, "C", [])
    beyond = ConsumerState(delivered_consumer_seq=500, delivered_stream_seq=500)
    c.fault_consumer_state("n1", "FLOOR", "C", beyond)
