"""Transport: lossless wire conversion, heartbeat coalescing, real gRPC on loopback.

Pins proto/raft.proto's contract: every message type survives the round trip unchanged;
one round's heartbeats to a peer travel in one batch in compact form; snapshots stream in
chunks and are reassembled intact; a sender reconnects by itself after its peer restarts;
an undeliverable snapshot comes back to the sender as a rejected SNAPSHOT_RESP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftstream.proto import raft_pb2 as pb
from raftstream.raft.transport import (
    GrpcTransport,
    GrpcTransportConfig,
    Inbound,
    MemoryNetwork,
    MemoryTransport,
    snapshot_failed,
)
from raftstream.raft.transport.convert import (
    SnapshotAssembler,
    from_batch,
    snapshot_chunks,
    to_batches,
)
from raftstream.raft.types import (
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from tests.support.polling import until

MT = MessageType
u64 = st.integers(0, 2**64 - 1)
names = st.text(min_size=1, max_size=12)
entries = st.builds(Entry, u64, u64, st.sampled_from(EntryType), st.binary(max_size=64))
confs = st.builds(ConfState, st.tuples(names, names), st.lists(names, max_size=2).map(tuple))
snapshots = st.builds(Snapshot, st.builds(SnapshotMeta, u64, u64, confs), st.binary(max_size=300))


@st.composite
def messages(draw: st.DrawFn, kinds: st.SearchStrategy[MessageType]) -> Message:
    kind = draw(kinds)
    snapshot = draw(snapshots) if kind == MT.SNAPSHOT else None
    return Message(
        type=kind,
        group=draw(st.text(max_size=20)),
        src="n1",
        dst="n2",
        term=draw(u64),
        log_term=draw(u64),
        index=draw(u64),
        entries=tuple(draw(st.lists(entries, max_size=3))),
        commit=draw(u64),
        reject=draw(st.booleans()),
        reject_hint=draw(u64),
        snapshot=snapshot,
        context=draw(st.binary(max_size=16)),
    )


plain_kinds = st.sampled_from([t for t in MT if t != MT.SNAPSHOT])


def _wire(batches: list[pb.Batch]) -> list[Message]:
    out: list[Message] = []
    for b in batches:
        out.extend(from_batch(pb.Batch.FromString(b.SerializeToString())).messages)
    return out


@given(m=messages(plain_kinds))
def test_every_message_type_round_trips(m: Message) -> None:
    assert _wire(to_batches("n1", "n2", [m], 1 << 20)) == [m]


@given(m=messages(st.just(MT.SNAPSHOT)), chunk=st.integers(1, 64))
def test_snapshot_round_trips_through_chunks(m: Message, chunk: int) -> None:
    chunks = list(snapshot_chunks(m, chunk))
    assert m.snapshot is not None
    assert len(chunks) == max(1, -(-len(m.snapshot.data) // chunk))
    assembler = SnapshotAssembler("n2", 1 << 20)
    for c in chunks:
        assert assembler.add(pb.SnapshotChunk.FromString(c.SerializeToString()))
    assert assembler.finish() == m


def test_snapshot_assembler_refuses_bad_streams() -> None:
    m = Message(MT.SNAPSHOT, "g", "n1", "n2", 3, snapshot=Snapshot(SnapshotMeta(9, 3), b"x" * 10))
    chunks = list(snapshot_chunks(m, 4))
    too_small = SnapshotAssembler("n2", 9)
    assert not too_small.add(chunks[0])
    wrong_node = SnapshotAssembler("n3", 100)
    assert not wrong_node.add(chunks[0])
    out_of_order = SnapshotAssembler("n2", 100)
    assert out_of_order.add(chunks[0]) and not out_of_order.add(chunks[2])
    short = SnapshotAssembler("n2", 100)
    assert short.add(chunks[0]) and short.add(chunks[1])
    assert short.finish() is None


def test_heartbeats_of_all_groups_coalesce_into_one_batch() -> None:
    beats = [Message(MT.HEARTBEAT, f"g{i}", "n1", "n2", 5, commit=i) for i in range(500)]
    resps = [Message(MT.HEARTBEAT_RESP, f"h{i}", "n1", "n2", 4, context=b"r") for i in range(300)]
    append = Message(MT.APPEND, "g1", "n1", "n2", 5, index=3, entries=(Entry(4, 5),), commit=3)
    batches = to_batches("n1", "n2", [*beats, append, *resps], 1 << 20)
    assert len(batches) == 1
    (b,) = batches
    assert (len(b.heartbeats), len(b.heartbeat_responses), len(b.messages)) == (500, 300, 1)
    assert sorted(_wire(batches), key=repr) == sorted([*beats, append, *resps], key=repr)
    # The compact form costs a fraction of a full message per group.
    full = sum(len(pb.Batch(messages=[_full(m)]).SerializeToString()) for m in beats)
    assert len(pb.Batch(heartbeats=b.heartbeats).SerializeToString()) < full


def _full(m: Message) -> pb.Message:
    return pb.Message(type=pb.HEARTBEAT, group=m.group, term=m.term, commit=m.commit)


def test_a_heartbeat_with_extra_fields_still_round_trips() -> None:
    odd = Message(MT.HEARTBEAT_RESP, "g", "n1", "n2", 5, reject=True, reject_hint=7)
    batches = to_batches("n1", "n2", [odd], 1 << 20)
    assert len(batches[0].messages) == 1 and _wire(batches) == [odd]


def _append(group: str, i: int, size: int, src: str = "a", dst: str = "b") -> Message:
    return Message(
        MT.APPEND, group, src, dst, 3, index=i, entries=(Entry(i + 1, 3, data=b"d" * size),)
    )


def test_quiesce_notices_and_liveness_pings_travel_in_batches() -> None:
    """An empty round still makes one batch (a liveness ping), which can carry quiesce
    notices: groups the sender leads and stopped heartbeating, with its term."""
    (ping,) = to_batches("n1", "n2", [], 1 << 20)
    assert from_batch(ping) == Inbound("n1", [], [])
    (b,) = to_batches("n1", "n2", [], 1 << 20, quiesce=[("g1", 4), ("g2", 7)])
    assert from_batch(pb.Batch.FromString(b.SerializeToString())).quiesce == [("g1", 4), ("g2", 7)]


def test_batches_are_cut_at_batch_bytes_max_keeping_order() -> None:
    ms = [_append("g", i, 900, "n1", "n2") for i in range(20)]
    batches = to_batches("n1", "n2", ms, 4096)
    assert len(batches) >= 5
    assert all(b.ByteSize() <= 4096 for b in batches)
    assert _wire(batches) == ms


# --- the in-memory twin ---


def test_memory_transport_delivers_and_cuts_links() -> None:
    async def scenario() -> None:
        net = MemoryNetwork()
        a, b = MemoryTransport("a", net), MemoryTransport("b", net)
        got: list[Message] = []
        b.bind(lambda inb: got.extend(inb.messages))
        reports: list[Message] = []
        a.bind(lambda inb: reports.extend(inb.messages))
        hb = Message(MT.HEARTBEAT, "g", "a", "b", 2, commit=1)
        snap = Message(MT.SNAPSHOT, "g", "a", "b", 2, snapshot=Snapshot(SnapshotMeta(5, 2), b"s"))
        a.send("b", [hb, snap])
        assert got == []  # delivery is asynchronous, never re-entrant
        await asyncio.sleep(0)
        assert got == [hb, snap]
        net.set_down("b", True)
        a.send("b", [hb, snap])
        await asyncio.sleep(0)
        assert got == [hb, snap] and reports == [snapshot_failed(snap)]

    asyncio.run(scenario())


# --- real gRPC on loopback ---


def _poking(cond: Callable[[], bool], poke: Callable[[], None]) -> Callable[[], bool]:
    """A probe of ``cond`` that calls ``poke`` (e.g. a resend) each time it does not hold."""

    def probe() -> bool:
        if cond():
            return True
        poke()
        return False

    return probe


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro(), timeout=60)

    asyncio.run(bounded())


def test_two_grpc_transports_exchange_batches_and_a_chunked_snapshot() -> None:
    cfg = GrpcTransportConfig(chunk_bytes_max=1024, batch_bytes_max=2048)

    async def scenario() -> None:
        a, b = GrpcTransport("a", config=cfg), GrpcTransport("b", config=cfg)
        try:
            port_a, port_b = await a.serve("127.0.0.1:0"), await b.serve("127.0.0.1:0")
            a.set_peer("b", f"127.0.0.1:{port_b}")
            b.set_peer("a", f"127.0.0.1:{port_a}")
            at_a: list[Message] = []
            at_b: list[Message] = []
            a.bind(lambda inb: at_a.extend(inb.messages))
            b.bind(lambda inb: at_b.extend(inb.messages))
            appends = [_append(f"g{i % 7}", i, 128) for i in range(100)]
            beats = [Message(MT.HEARTBEAT, f"g{i}", "a", "b", 3, commit=2) for i in range(50)]
            a.send("b", [*appends, *beats])
            await until(lambda: len(at_b) >= 150, interval_s=0.02)
            assert at_b[:100] == appends and sorted(at_b[100:], key=repr) == sorted(beats, key=repr)
            data = bytes(range(256)) * 40  # ten 1 KiB chunks
            snap = Snapshot(SnapshotMeta(77, 3, ConfState(voters=("a", "b", "c"))), data)
            b.send("a", [Message(MT.SNAPSHOT, "g0", "b", "a", 3, snapshot=snap)])
            await until(lambda: len(at_a) >= 1, interval_s=0.02)
            assert at_a == [Message(MT.SNAPSHOT, "g0", "b", "a", 3, snapshot=snap)]
        finally:
            await a.close()
            await b.close()

    _run(scenario)


def test_batches_queued_for_a_peer_leave_merged_and_in_order() -> None:
    """Batches queued for a peer while its stream is busy leave in one write (up to
    batch_bytes_max), in order; nothing queued after quiesce notices joins them (a notice
    follows only what was sent before it)."""

    async def scenario() -> None:
        a, b = GrpcTransport("a"), GrpcTransport("b")
        try:
            port_b = await b.serve("127.0.0.1:0")
            a.set_peer("b", f"127.0.0.1:{port_b}")
            got: list[Inbound] = []
            b.bind(got.append)
            appends = [_append(f"g{i % 3}", i, 128) for i in range(40)]
            # All queued before the link's task first runs: nothing is written in between.
            for m in appends[:20]:
                a.send("b", [m])
            a.send("b", [], quiesce=[("g9", 3)])
            for m in appends[20:]:
                a.send("b", [m])
            await until(lambda: sum(len(i.messages) for i in got) >= 40, interval_s=0.02)
            assert [m for i in got for m in i.messages] == appends
            assert [(len(i.messages), i.quiesce) for i in got] == [(20, [("g9", 3)]), (20, [])]
        finally:
            await a.close()
            await b.close()

    _run(scenario)


def test_snapshot_to_an_unreachable_peer_is_reported_rejected() -> None:
    async def scenario() -> None:
        a = GrpcTransport("a")
        reports: list[Message] = []
        a.bind(lambda inb: reports.extend(inb.messages))
        try:
            probe = GrpcTransport("x")
            port = await probe.serve("127.0.0.1:0")
            await probe.close()  # a port that nothing listens on any more
            a.set_peer("b", f"127.0.0.1:{port}")
            snap = Message(MT.SNAPSHOT, "g", "a", "b", 4, snapshot=Snapshot(SnapshotMeta(3, 4)))
            a.send("b", [snap])
            await until(lambda: bool(reports), interval_s=0.02)
            assert reports == [snapshot_failed(snap)]
            assert reports[0].reject and reports[0].type == MT.SNAPSHOT_RESP
        finally:
            await a.close()

    _run(scenario)


def test_sender_reconnects_after_the_peer_restarts() -> None:
    async def scenario() -> None:
        a = GrpcTransport("a")
        b = GrpcTransport("b")
        b2: GrpcTransport | None = None
        try:
            port = await b.serve("127.0.0.1:0")
            a.set_peer("b", f"127.0.0.1:{port}")
            first: list[Message] = []
            b.bind(lambda inb: first.extend(inb.messages))
            hb = Message(MT.HEARTBEAT, "g", "a", "b", 1)
            await until(_poking(lambda: bool(first), lambda: a.send("b", [hb])), interval_s=0.02)
            await b.close()  # the peer goes away...
            for _ in range(5):
                a.send("b", [hb])
                await asyncio.sleep(0.02)
            b2 = GrpcTransport("b")  # ...and comes back on the same port
            assert await b2.serve(f"127.0.0.1:{port}") == port
            second: list[Message] = []
            b2.bind(lambda inb: second.extend(inb.messages))
            await until(_poking(lambda: bool(second), lambda: a.send("b", [hb])), interval_s=0.02)
            assert second[0] == hb
        finally:
            await a.close()
            await b.close()
            if b2 is not None:
                await b2.close()

    _run(scenario)


@pytest.mark.parametrize("bad", ["batch", "chunk"])
def test_config_refuses_limits_above_the_message_size(bad: str) -> None:
    from raftstream.raft.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        if bad == "batch":
            GrpcTransportConfig(message_bytes_max=1000, batch_bytes_max=1000, chunk_bytes_max=10)
        else:
            GrpcTransportConfig(message_bytes_max=1000, batch_bytes_max=100, chunk_bytes_max=2000)


def test_a_removed_peer_gets_nothing_until_it_is_set_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``remove_peer`` (a node taken out of the cluster): its stream is dropped and what is
    sent to it afterwards is dropped, with one warning; ``set_peer`` dials it again."""

    async def scenario() -> None:
        a, b = GrpcTransport("a"), GrpcTransport("b")
        try:
            port_b = await b.serve("127.0.0.1:0")
            a.set_peer("b", f"127.0.0.1:{port_b}")
            got: list[Message] = []
            b.bind(lambda inb: got.extend(inb.messages))
            hb = Message(MT.HEARTBEAT, "g", "a", "b", 1)
            await until(_poking(lambda: bool(got), lambda: a.send("b", [hb])), interval_s=0.02)
            a.remove_peer("b")
            await asyncio.sleep(0.05)  # (let the dropped stream end)
            got.clear()
            with caplog.at_level(logging.WARNING):
                for _ in range(5):
                    a.send("b", [hb])
                    await asyncio.sleep(0.02)
            assert got == []
            assert caplog.text.count("no address for peer b; messages dropped") == 1
            a.set_peer("b", f"127.0.0.1:{port_b}")
            await until(_poking(lambda: bool(got), lambda: a.send("b", [hb])), interval_s=0.02)
        finally:
            await a.close()
            await b.close()

    _run(scenario)
