"""``Stream.apply_batch``: the replicas' way to apply a committed batch of entries.

docs/architecture.md "Durability and errors" and the engine's determinism contract: every replica
must compute the same state from the same log, whichever code version applies it. So
``apply_batch`` (with its fast path for plain publishes) must give exactly what ``apply`` on
each entry in turn, inside one transaction, gives (the path before it existed, which a
replica of the previous version still runs): the same results, refusals as values, and the
same stored messages, counters and dedup records. Random configs and entry mixes, both
stores.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raftstream.engine.entries import DeleteMsg, Entry, Publish, Purge, UpdateConfig
from raftstream.engine.store import DiscardPolicy
from raftstream.engine.stream import PubAck, Stream
from raftstream.engine.stream_config import RetentionPolicy, StreamConfig, SubjectTransform
from raftstream.errors import LimitError, PreconditionError, RaftStreamError

SEC = 1_000_000_000
BASE_TS = 1_700_000_000 * SEC


def _config(draw: Any) -> StreamConfig:
    transform = draw(st.sampled_from([None, SubjectTransform(src="s.>", dest="t.>")]))
    return StreamConfig(
        name="S",
        subjects=("s.>",),
        max_msgs=draw(st.sampled_from([-1, 3, 10])),
        max_bytes=draw(st.sampled_from([-1, 2_000])),
        max_age=draw(st.sampled_from([0, 3 * SEC])),
        max_msg_size=draw(st.sampled_from([-1, 40])),
        discard=draw(st.sampled_from([DiscardPolicy.OLD, DiscardPolicy.NEW])),
        duplicate_window=2 * SEC,  # at most max_age (a config rule)
        retention=draw(st.sampled_from(list(RetentionPolicy))),
        subject_transform=transform,
    )


@st.composite
def scenarios(draw: Any) -> tuple[StreamConfig, list[list[Entry]]]:
    """A config and batches of entries: mostly plain publishes, some with ids, headers or
    expectations, deletes, purges and config updates (seal, size limit), times that mostly
    grow but sometimes step back (a new leader's clock)."""
    config = _config(draw)
    ts = BASE_TS
    batches: list[list[Entry]] = []
    for _ in range(draw(st.integers(1, 4))):
        batch: list[Entry] = []
        for _ in range(draw(st.integers(1, 12))):
            ts += draw(st.sampled_from([0, 1, SEC // 2, 2 * SEC, -SEC]))
            kind = draw(
                st.sampled_from(["plain"] * 6 + ["id", "hdr", "exp", "del", "purge", "cfg"])
            )
            subject = draw(st.sampled_from(["s.a", "s.b", "s.c.d", "x.not.captured"]))
            data = b"p" * draw(st.sampled_from([0, 10, 50]))
            if kind == "plain":
                batch.append(Publish(ts_ns=ts, subject=subject, data=data))
            elif kind == "id":
                mid = draw(st.sampled_from(["m1", "m2", "m3"]))
                batch.append(Publish(ts_ns=ts, subject=subject, data=data, msg_id=mid))
            elif kind == "hdr":
                batch.append(Publish(ts_ns=ts, subject=subject, data=data, headers={"k": "v"}))
            elif kind == "exp":
                last = draw(st.integers(0, 6))
                batch.append(Publish(ts_ns=ts, subject=subject, data=data, expected_last_seq=last))
            elif kind == "del":
                batch.append(DeleteMsg(ts_ns=ts, seq=draw(st.integers(1, 8))))
            elif kind == "purge":
                batch.append(Purge(ts_ns=ts, keep=draw(st.sampled_from([None, 1]))))
            else:
                change = draw(st.sampled_from(["seal", "size", "nosize"]))
                new = {
                    "seal": {"sealed": True},
                    "size": {"max_msg_size": 20},
                    "nosize": {"max_msg_size": -1},
                }[change]
                batch.append(UpdateConfig(ts_ns=ts, config=_replace(config, **new)))
        batches.append(batch)
    return config, batches


def _replace(config: StreamConfig, **changes: Any) -> StreamConfig:
    from dataclasses import replace

    return replace(config, **changes)


def _outcome(result: Any) -> Any:
    """A result compared by value; a refusal by its type and message."""
    if isinstance(result, RaftStreamError):
        return (type(result).__name__, str(result))
    return result


def _by_entry(stream: Stream, batch: list[Entry]) -> list[Any]:
    """The path without ``apply_batch``: ``apply`` per entry, one transaction."""
    out: list[Any] = []
    with stream.store.transaction():
        for e in batch:
            try:
                out.append(stream.apply(e))
            except (LimitError, PreconditionError, RaftStreamError) as refusal:
                out.append(refusal)
    return out


def _image(stream: Stream) -> Any:
    store = stream.store
    msgs = [(m.seq, m.subject, m.data, dict(m.headers), m.ts, m.ttl_ns) for m in store.iter_from(1)]
    dedup = sorted((r.msg_id, r.seq, r.ts_ns) for r in store.dedup_iter())
    return store.state(), msgs, dedup, stream.config


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(scenario=scenarios())
def test_apply_batch_equals_apply_per_entry(store_kit: Any, scenario: Any) -> None:
    config, batches = scenario
    one = Stream(config, store_kit.make())
    other = Stream(config, store_kit.make())
    for batch in batches:
        expected = [_outcome(r) for r in _by_entry(one, batch)]
        got = [_outcome(r) for r in other.apply_batch(batch)]
        assert got == expected
        assert _image(other) == _image(one)


def test_plain_publishes_in_a_batch_are_stored_and_acknowledged_in_order(store_kit: Any) -> None:
    """The fast path's common case, spelled out: sequences in order, a refused entry in the
    middle is its result and the others still apply (JetStream: an uncaptured subject)."""
    stream = Stream(StreamConfig(name="S", subjects=("s.>",)), store_kit.make())
    batch: list[Entry] = [
        Publish(ts_ns=BASE_TS, subject="s.a", data=b"1"),
        Publish(ts_ns=BASE_TS + 1, subject="nope", data=b"2"),
        Publish(ts_ns=BASE_TS + 2, subject="s.b", data=b"3"),
    ]
    first, refused, last = stream.apply_batch(batch)
    assert first == PubAck(stream="S", seq=1) and last == PubAck(stream="S", seq=2)
    assert isinstance(refused, RaftStreamError)
    assert [m.data for m in stream.store.iter_from(1)] == [b"1", b"3"]
