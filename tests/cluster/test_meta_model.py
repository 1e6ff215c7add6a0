"""Property tests of the meta state machine: determinism, and apply against a dict model.

Determinism (the reason the meta group exists): replicas that apply the same encoded log,
one of them restarting from a snapshot part-way, end byte-identical and answer every entry
the same way. The model test checks which entries succeed, and what the queries then say,
against a plain dict model of names and subjects.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from raftstream.cluster.meta.entries import (
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
    encode_entry,
)
from raftstream.cluster.meta.state import MetaState
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.engine.subjects import subjects_collide
from raftstream.errors import AlreadyExistsError, NotFoundError, RaftStreamError

ACCOUNTS = ("$G", "B")
STREAMS = ("S1", "S2", "S3")
SUBJECTS = ("a", "a.*", "a.>", "b", "b.x", "c.>")
NODES = ("n1", "n2", "n3", "n4")
CONSUMERS = ("c1", "c2")

accounts = st.sampled_from(ACCOUNTS)
streams = st.sampled_from(STREAMS)
peer_lists = st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True).map(tuple)


def stream_configs_named(names: st.SearchStrategy[str]) -> st.SearchStrategy[StreamConfig]:
    return st.builds(
        lambda name, subject, replicas, retention: StreamConfig(
            name=name, subjects=(subject,), num_replicas=replicas, retention=retention
        ),
        names,
        st.sampled_from(SUBJECTS),
        st.integers(1, 3),
        st.sampled_from(("limits", "interest", "workqueue")),
    )


stream_configs = stream_configs_named(streams)
consumer_configs = st.builds(
    lambda name, filt, replicas: ConsumerConfig(
        durable_name=name, filter_subject=filt, num_replicas=replicas
    ),
    st.sampled_from(CONSUMERS),
    st.sampled_from((None, "a", "a.x", "b.x", "c.d")),
    st.sampled_from((0, 1, 3)),
)
ts = st.integers(0, 1000)

entries: st.SearchStrategy[MetaEntry] = st.one_of(
    st.builds(AddStream, account=accounts, config=stream_configs, peers=peer_lists, ts_ns=ts),
    st.builds(
        UpdateStream,
        account=accounts,
        config=stream_configs,
        peers=peer_lists,
        prior_peers=peer_lists,
        ts_ns=ts,
    ),
    st.builds(DeleteStream, account=accounts, name=streams, ts_ns=ts),
    st.builds(AddConsumer, account=accounts, stream=streams, config=consumer_configs, ts_ns=ts),
    st.builds(UpdateConsumer, account=accounts, stream=streams, config=consumer_configs, ts_ns=ts),
    st.builds(
        DeleteConsumer, account=accounts, stream=streams, name=st.sampled_from(CONSUMERS), ts_ns=ts
    ),
    st.builds(PeerRemove, peer=st.sampled_from(NODES), ts_ns=ts),
    st.builds(PeerAdd, peer=st.sampled_from(NODES), ts_ns=ts),
    st.builds(
        NodeAdd,
        node=st.sampled_from(NODES),
        address=st.sampled_from(("127.0.0.1:7104", "127.0.0.1:7105", "bad")),
        ts_ns=ts,
    ),
    st.builds(NodeForget, node=st.sampled_from(NODES), ts_ns=ts),
    st.builds(
        ReassignGroup,
        account=accounts,
        stream=streams,
        peers=peer_lists,
        prior_peers=peer_lists,
        ts_ns=ts,
    ),
)


def outcome(result: Any) -> str:
    """A replica-independent description of an apply result (or refusal)."""
    if isinstance(result, RaftStreamError):
        return f"{type(result).__name__}:{result.details.get('field')}:{result}"
    return repr(result)


def _prior(data: st.DataObject, state: MetaState, account: str, stream: str) -> tuple[str, ...]:
    """Mostly the stream's real peers (so updates and reassignments apply), sometimes not."""
    try:
        current = state.stream(account, stream).peers
    except RaftStreamError:
        current = ()
    return data.draw(st.one_of(st.just(current), peer_lists) if current else peer_lists)


def _informed_entry(data: st.DataObject, state: MetaState) -> MetaEntry:
    """An entry built with knowledge of ``state``, so that most of them apply."""
    account, stream = data.draw(accounts), data.draw(streams)
    kind = data.draw(st.sampled_from(("add", "update", "reassign", "consumer", "random")))
    if kind in ("add", "update"):
        cfg = data.draw(stream_configs_named(st.just(stream)))
        peers = data.draw(
            st.lists(st.sampled_from(NODES), min_size=1, max_size=cfg.num_replicas, unique=True)
        )
        if kind == "add":
            return AddStream(account=account, config=cfg, peers=tuple(peers), ts_ns=data.draw(ts))
        prior = _prior(data, state, account, stream)
        return UpdateStream(
            account=account, config=cfg, peers=tuple(peers), prior_peers=prior, ts_ns=0
        )
    if kind == "reassign":
        prior = _prior(data, state, account, stream)
        peers = data.draw(peer_lists)
        return ReassignGroup(
            account=account, stream=stream, peers=peers, prior_peers=prior, ts_ns=data.draw(ts)
        )
    if kind == "consumer":
        cfg = data.draw(consumer_configs)
        return AddConsumer(account=account, stream=stream, config=cfg, ts_ns=data.draw(ts))
    return data.draw(entries)


@settings(max_examples=100)
@given(data=st.data(), steps=st.integers(0, 40), cut=st.integers(0, 40))
def test_replicas_applying_the_same_log_end_identical(
    data: st.DataObject, steps: int, cut: int
) -> None:
    """Two replicas apply the same encoded entries; the second restarts from a snapshot at
    ``cut``. Every result is the same and the final snapshots are byte-identical."""
    a, b = MetaState(), MetaState()
    for i in range(steps):
        encoded = encode_entry(_informed_entry(data, a))
        if i == cut:
            b = MetaState.from_snapshot(b.snapshot())
        assert outcome(a.apply_data(encoded)) == outcome(b.apply_data(encoded))
        a.check_invariants()
    assert a.snapshot() == b.snapshot()
    assert MetaState.from_snapshot(a.snapshot()).snapshot() == a.snapshot()


class MetaModel(RuleBasedStateMachine):
    """MetaState against a dict model of stream subjects and consumer names per account."""

    def __init__(self) -> None:
        super().__init__()
        self.state = MetaState()
        self.streams: dict[tuple[str, str], str] = {}  # (account, name) -> its one subject
        self.consumers: dict[tuple[str, str], set[str]] = {}
        self.ts = 0

    def _apply(self, entry: MetaEntry) -> RaftStreamError | None:
        try:
            self.state.apply(entry)
        except RaftStreamError as err:
            return err
        return None

    @rule(account=accounts, name=streams, subject=st.sampled_from(SUBJECTS))
    def add_stream(self, account: str, name: str, subject: str) -> None:
        cfg = StreamConfig(name=name, subjects=(subject,))
        err = self._apply(AddStream(account=account, config=cfg, peers=("n1",), ts_ns=self.ts))
        key = (account, name)
        if key in self.streams:
            assert (err is None) == (self.streams[key] == subject)
            assert err is None or isinstance(err, AlreadyExistsError)
            return
        clash = any(
            subjects_collide(subject, s) for (acc, _), s in self.streams.items() if acc == account
        )
        assert (err is not None) == clash, err
        if not clash:
            self.streams[key] = subject
            self.consumers[key] = set()

    @rule(account=accounts, name=streams)
    def delete_stream(self, account: str, name: str) -> None:
        err = self._apply(DeleteStream(account=account, name=name, ts_ns=self.ts))
        key = (account, name)
        assert (err is None) == (key in self.streams)
        self.streams.pop(key, None)
        self.consumers.pop(key, None)

    @rule(account=accounts, stream=streams, name=st.sampled_from(CONSUMERS))
    def add_consumer(self, account: str, stream: str, name: str) -> None:
        cfg = ConsumerConfig(durable_name=name)
        err = self._apply(AddConsumer(account=account, stream=stream, config=cfg, ts_ns=self.ts))
        key = (account, stream)
        assert (err is None) == (key in self.streams)
        assert err is None or isinstance(err, NotFoundError)
        if err is None:
            self.consumers[key].add(name)

    @rule(account=accounts, stream=streams, name=st.sampled_from(CONSUMERS))
    def delete_consumer(self, account: str, stream: str, name: str) -> None:
        entry = DeleteConsumer(account=account, stream=stream, name=name, ts_ns=self.ts)
        err = self._apply(entry)
        key = (account, stream)
        assert (err is None) == (name in self.consumers.get(key, set()))
        if err is None:
            self.consumers[key].discard(name)

    @rule(step=st.integers(-5, 5))
    def tick(self, step: int) -> None:
        self.ts = max(0, self.ts + step)

    @invariant()
    def matches_the_model(self) -> None:
        self.state.check_invariants()
        for account in ACCOUNTS:
            names = tuple(sorted(n for acc, n in self.streams if acc == account))
            assert self.state.stream_names(account).items == names
            for name in names:
                assert self.state.stream(account, name).config.subjects == (
                    self.streams[(account, name)],
                )
                consumers = tuple(sorted(self.consumers[(account, name)]))
                assert self.state.consumer_names(account, name).items == consumers
                for subject in ("a", "a.q", "b", "b.x", "c.q.r"):
                    found = self.state.stream_for_subject(account, subject)
                    model = self.streams[(account, name)]
                    if subjects_collide(model, subject):
                        assert found is not None and found.name == name


TestMetaModel = MetaModel.TestCase
TestMetaModel.settings = settings(max_examples=60, stateful_step_count=40)
