"""The meta state machine: every rule of ``MetaState.apply``, its queries and snapshots.

Each test names the rule it pins (docs/cluster-design.md, issue 5, and the JetStream
behaviour the rule follows). Refusals must leave the state byte-for-byte unchanged.
"""

from __future__ import annotations

import pytest

from raftstream.cluster.meta.entries import (
    AddConsumer,
    MetaEntry,
    NodeAdd,
    NodeForget,
    PeerAdd,
    PeerRemove,
    ReassignGroup,
    encode_entry,
)
from raftstream.cluster.meta.state import (
    LIST_LIMIT_MAX,
    ConsumerAdded,
    GroupReassigned,
    MetaState,
    NodeAdded,
    NodeForgotten,
    PeerAdded,
    PeerRemoved,
    StreamAdded,
    StreamDeleted,
    StreamUpdated,
)
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import Placement, StreamConfig, StreamSource, SubjectTransform
from raftstream.errors import (
    AlreadyExistsError,
    Code,
    ConflictError,
    DataLossError,
    InvalidArgumentError,
    LimitError,
    NotFoundError,
    RaftStreamError,
)
from tests.support.meta import (
    ACC,
    PEERS3,
    add_consumer,
    add_stream,
    delete_consumer,
    delete_stream,
    field_of,
    refused,
    state_with,
    update_consumer,
    update_stream,
)

# -- streams ----------------------------------------------------------------------------------


def test_add_stream_assigns_group_peers_and_creation_time() -> None:
    """An AddStream records the config (validated), the peers in the leader's order, the
    group id S:<account>:<stream> and the leader's timestamp (docs/cluster-design.md)."""
    state = MetaState()
    result = state.apply(add_stream("ORDERS", "orders.>", peers=("n2", "n1", "n3"), ts_ns=77))
    assert isinstance(result, StreamAdded) and result.created
    sa = state.stream(ACC, "ORDERS")
    assert sa.group == "S:$G:ORDERS"
    assert sa.peers == ("n2", "n1", "n3")
    assert sa.created_ns == 77
    assert (
        sa.config == StreamConfig(name="ORDERS", subjects=("orders.>",), num_replicas=3).validate()
    )
    assert not sa.under_replicated


def test_add_stream_is_idempotent_for_the_same_config() -> None:
    """JetStream: creating a stream that exists with the same config succeeds and changes
    nothing (the original peers and creation time stay)."""
    state = state_with(add_stream("ORDERS", "orders.>", ts_ns=5))
    result = state.apply(add_stream("ORDERS", "orders.>", peers=("n9",), ts_ns=9))
    assert isinstance(result, StreamAdded) and not result.created
    assert result.assignment.peers == ("n1",) and result.assignment.created_ns == 5


def test_add_stream_with_a_different_config_is_refused() -> None:
    """JetStream: "stream name already in use with a different configuration"."""
    state = state_with(add_stream("ORDERS", "orders.>"))
    err = refused(state, add_stream("ORDERS", "orders.>", max_msgs=5), AlreadyExistsError)
    assert field_of(err) == "name" and err.code is Code.ALREADY_EXISTS


def test_stream_names_and_subjects_are_scoped_per_account() -> None:
    """Names are unique per account, and overlap is checked within an account only."""
    state = state_with(
        add_stream("ORDERS", "orders.>"),
        add_stream("ORDERS", "orders.>", account="TEAM-B"),
    )
    assert state.accounts() == ("$G", "TEAM-B")
    assert state.stream("TEAM-B", "ORDERS").group == "S:TEAM-B:ORDERS"


def test_overlapping_subjects_in_one_account_are_refused() -> None:
    """No two streams of an account capture one subject (check_no_overlap)."""
    state = state_with(add_stream("ORDERS", "orders.*"))
    err = refused(state, add_stream("EU", "orders.eu"), InvalidArgumentError)
    assert field_of(err) == "subjects" and "ORDERS" in str(err)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (add_stream("bad.name"), "name"),
        (add_stream("S", "a..b"), "subjects"),
        (add_stream("S", sealed=True), "sealed"),
        (add_stream("S", account=""), "account"),
        (add_stream("S", account="a:b"), "account"),
        (add_stream("S", peers=("n1", "n1"), num_replicas=2), "peers"),
        (add_stream("S", peers=("n1",), num_replicas=3), "peers"),
        (add_stream("S", peers=(), num_replicas=1), "peers"),
        (add_stream("S", peers=("bad name",)), "peers"),
    ],
)
def test_add_stream_validates_every_field(entry: MetaEntry, field: str) -> None:
    """Config rules (validate, check_create), the account name, and the peers: distinct,
    valid names, exactly num_replicas of them."""
    err = refused(MetaState(), entry, InvalidArgumentError)
    assert field_of(err) == field


def test_update_stream_follows_check_update() -> None:
    """Immutable fields (storage...) cannot change; allowed changes are applied."""
    state = state_with(add_stream("ORDERS", "orders.>"))
    err = refused(
        state,
        update_stream("ORDERS", "orders.>", prior=("n1",), storage="memory"),
        InvalidArgumentError,
    )
    assert field_of(err) == "storage"
    result = state.apply(update_stream("ORDERS", "orders.>", prior=("n1",), max_msgs=10))
    assert isinstance(result, StreamUpdated)
    assert state.stream(ACC, "ORDERS").config.max_msgs == 10
    assert result.previous.config.max_msgs == -1
    assert state.stream(ACC, "ORDERS").created_ns == 1


def test_update_stream_moves_its_subjects_in_the_index() -> None:
    """After a subject change the old subject routes nowhere and the new one to the stream."""
    state = state_with(add_stream("ORDERS", "orders.>"))
    state.apply(update_stream("ORDERS", "sales.>", prior=("n1",)))
    assert state.stream_for_subject(ACC, "orders.x") is None
    found = state.stream_for_subject(ACC, "sales.x")
    assert found is not None and found.name == "ORDERS"


def test_update_stream_cannot_overlap_another_stream() -> None:
    state = state_with(add_stream("A", "a.>"), add_stream("B", "b.>"))
    err = refused(state, update_stream("B", "b.>", "a.x", prior=("n1",)), InvalidArgumentError)
    assert field_of(err) == "subjects"


def test_update_of_a_missing_stream_is_not_found() -> None:
    err = refused(MetaState(), update_stream("NOPE", prior=("n1",)), NotFoundError)
    assert err.code is Code.NOT_FOUND and field_of(err) == "stream"


def test_update_planned_on_stale_peers_is_refused() -> None:
    """prior_peers guards against undoing a re-placement that applied in between."""
    state = state_with(add_stream("ORDERS", peers=PEERS3))
    entry = update_stream("ORDERS", prior=("n1", "n2", "n4"), peers=PEERS3)
    err = refused(state, entry, ConflictError)
    assert field_of(err) == "peers"


def test_update_changing_replicas_carries_the_new_peers() -> None:
    """A replica count change comes with the peer list placement chose for it."""
    state = state_with(add_stream("ORDERS", peers=("n1",)))
    state.apply(update_stream("ORDERS", prior=("n1",), peers=PEERS3))
    assert state.stream(ACC, "ORDERS").peers == PEERS3
    refused(
        state,
        update_stream("ORDERS", prior=PEERS3, peers=PEERS3, num_replicas=1),
        InvalidArgumentError,
    )


def test_replica_change_refused_while_a_consumer_pins_the_old_count() -> None:
    """Consumers replicate through their stream's group, so a consumer's num_replicas must
    stay 0 or the stream's: a stream R change is refused while one pins the old R."""
    state = state_with(
        add_stream("ORDERS", peers=PEERS3), add_consumer("ORDERS", "C", num_replicas=3)
    )
    err = refused(state, update_stream("ORDERS", prior=PEERS3, peers=("n1",)), InvalidArgumentError)
    assert field_of(err) == "num_replicas" and "'C'" in str(err)
    state.apply(update_consumer("ORDERS", "C", num_replicas=0))
    state.apply(update_stream("ORDERS", prior=PEERS3, peers=("n1",)))
    assert state.stream(ACC, "ORDERS").config.num_replicas == 1


def test_delete_stream_deletes_its_consumers() -> None:
    """Deleting a stream deletes its consumers; its subjects route nowhere; an account left
    without streams disappears."""
    state = state_with(
        add_stream("ORDERS", "orders.>"),
        add_consumer("ORDERS", "B"),
        add_consumer("ORDERS", "A"),
    )
    result = state.apply(delete_stream("ORDERS"))
    assert isinstance(result, StreamDeleted) and result.consumers == ("A", "B")
    assert state.accounts() == ()
    assert state.stream_for_subject(ACC, "orders.x") is None
    with pytest.raises(NotFoundError):
        state.consumer(ACC, "ORDERS", "A")
    assert state.all_streams() == () and state.assets() == {}
    refused(state, delete_stream("ORDERS"), NotFoundError)


def test_a_stream_recreated_after_delete_has_no_old_consumers() -> None:
    state = state_with(add_stream("S"), add_consumer("S", "C"), delete_stream("S"), add_stream("S"))
    assert state.consumers_of(ACC, "S") == ()


# -- consumers --------------------------------------------------------------------------------


def test_consumer_needs_an_existing_stream() -> None:
    err = refused(MetaState(), add_consumer("NOPE", "C"), NotFoundError)
    assert field_of(err) == "stream"


def test_consumer_entry_needs_a_name() -> None:
    """The meta leader names an ephemeral consumer before proposing; an entry without a
    name cannot be applied the same way everywhere."""
    state = state_with(add_stream("S"))
    entry = AddConsumer(account=ACC, stream="S", config=ConsumerConfig(), ts_ns=1)
    err = refused(state, entry, InvalidArgumentError)
    assert field_of(err) == "name"


def test_named_ephemeral_consumer_is_recorded_under_its_name() -> None:
    state = state_with(add_stream("S"))
    entry = AddConsumer(account=ACC, stream="S", config=ConsumerConfig(name="eph1"), ts_ns=9)
    state.apply(entry)
    assert state.consumer(ACC, "S", "eph1").created_ns == 9


def test_durable_names_are_unique_per_stream() -> None:
    """Re-adding an equal consumer is idempotent; a different config under the same durable
    name is refused (JetStream: "consumer already exists")."""
    state = state_with(add_stream("S"), add_consumer("S", "C", ts_ns=4))
    again = state.apply(add_consumer("S", "C", ts_ns=8))
    assert isinstance(again, ConsumerAdded) and not again.created
    assert again.assignment.created_ns == 4
    err = refused(state, add_consumer("S", "C", max_deliver=3), AlreadyExistsError)
    assert field_of(err) == "durable_name"
    # It says which fields differ, as a stream's does (a user review).
    assert "(max_deliver differs: update the consumer to change it" in str(err)
    assert err.details["differs"] == "max_deliver"


def test_same_consumer_name_on_two_streams_is_allowed() -> None:
    state = state_with(add_stream("A", "a"), add_stream("B", "b"))
    state.apply(add_consumer("A", "C"))
    state.apply(add_consumer("B", "C"))
    assert state.consumer_names(ACC, "A").items == state.consumer_names(ACC, "B").items == ("C",)


@pytest.mark.parametrize(("replicas", "ok"), [(0, True), (3, True), (1, False), (2, False)])
def test_consumer_replicas_are_zero_or_the_streams(replicas: int, ok: bool) -> None:
    """docs/cluster-design.md: a consumer's num_replicas must be 0 or equal to its stream's
    (it replicates through the stream's group)."""
    state = state_with(add_stream("S", peers=PEERS3))
    entry = add_consumer("S", "C", num_replicas=replicas)
    if ok:
        state.apply(entry)
        assert state.consumer(ACC, "S", "C").config.num_replicas == replicas
    else:
        assert field_of(refused(state, entry, InvalidArgumentError)) == "num_replicas"


def test_mem_storage_is_accepted_on_a_consumer() -> None:
    """docs/cluster-design.md: mem_storage is accepted and has no effect."""
    state = state_with(add_stream("S"), add_consumer("S", "C", mem_storage=True))
    assert state.consumer(ACC, "S", "C").config.mem_storage


def test_stream_max_consumers_is_enforced() -> None:
    """JetStream: "maximum consumers limit reached" (RESOURCE_EXHAUSTED)."""
    state = state_with(add_stream("S", max_consumers=1), add_consumer("S", "A"))
    err = refused(state, add_consumer("S", "B"), LimitError)
    assert err.code is Code.RESOURCE_EXHAUSTED and field_of(err) == "max_consumers"


def test_workqueue_consumers_need_disjoint_filters() -> None:
    """A workqueue stream: one consumer per subject (check_workqueue_filters), explicit
    acks (check_for_stream)."""
    state = state_with(add_stream("WQ", "jobs.>", retention="workqueue"))
    state.apply(add_consumer("WQ", "A", filter_subject="jobs.a"))
    err = refused(state, add_consumer("WQ", "B", filter_subject="jobs.*"), InvalidArgumentError)
    assert field_of(err) == "filter_subject"
    err = refused(
        state,
        add_consumer("WQ", "B", filter_subject="jobs.b", ack_policy="none"),
        InvalidArgumentError,
    )
    assert field_of(err) == "ack_policy"
    state.apply(add_consumer("WQ", "B", filter_subject="jobs.b"))


def test_consumer_filter_must_match_a_stream_subject() -> None:
    state = state_with(add_stream("S", "orders.>"))
    err = refused(state, add_consumer("S", "C", filter_subject="sales.x"), InvalidArgumentError)
    assert field_of(err) == "filter_subject"


def test_a_mirrors_or_a_sourced_streams_consumer_filter_is_not_checked_against_subjects() -> None:
    """A mirror has no subjects and stores its origin's; a stream with sources stores theirs
    too: their consumers filter on what is stored, as in JetStream (LOG_FEATURE_LINKED_FILTERS;
    a bucket mirror's watch filters ``$KV.<origin>.>``)."""
    state = state_with(
        add_stream("M", mirror=StreamSource(name="O")),
        add_stream("S", "own.>", sources=(StreamSource(name="O"),)),
    )
    state.apply(add_consumer("M", "C", filter_subject="orders.x"))
    state.apply(add_consumer("S", "C", filter_subject="orders.x"))
    assert state.consumer(ACC, "S", "C").config.filter_subject == "orders.x"


def test_update_consumer_follows_check_update() -> None:
    """Immutable consumer fields cannot change; others can; creation time stays."""
    state = state_with(add_stream("S", "s.>"), add_consumer("S", "C", ts_ns=4))
    err = refused(state, update_consumer("S", "C", deliver_policy="new"), InvalidArgumentError)
    assert field_of(err) == "deliver_policy"
    state.apply(update_consumer("S", "C", max_deliver=7, ts_ns=50))
    ca = state.consumer(ACC, "S", "C")
    assert ca.config.max_deliver == 7 and ca.created_ns == 4


def test_update_consumer_rechecks_workqueue_filters_against_the_others() -> None:
    state = state_with(
        add_stream("WQ", "jobs.>", retention="workqueue"),
        add_consumer("WQ", "A", filter_subject="jobs.a"),
        add_consumer("WQ", "B", filter_subject="jobs.b"),
    )
    err = refused(state, update_consumer("WQ", "B", filter_subject="jobs.>"), InvalidArgumentError)
    assert field_of(err) == "filter_subject"
    state.apply(update_consumer("WQ", "A", filter_subject="jobs.a.>"))  # itself is not "other"


def test_update_or_delete_of_a_missing_consumer_is_not_found() -> None:
    state = state_with(add_stream("S"))
    assert field_of(refused(state, update_consumer("S", "C"), NotFoundError)) == "name"
    assert field_of(refused(state, delete_consumer("S", "C"), NotFoundError)) == "name"


def test_delete_consumer() -> None:
    state = state_with(add_stream("S"), add_consumer("S", "C"))
    state.apply(delete_consumer("S", "C"))
    assert state.consumers_of(ACC, "S") == ()


# -- peers ------------------------------------------------------------------------------------


def test_peer_remove_records_the_peer_and_lists_its_groups() -> None:
    """PeerRemove marks the peer gone (nothing may be placed on it) and answers the groups
    that still need a replacement; repeating it is harmless."""
    state = state_with(add_stream("A", "a", peers=PEERS3), add_stream("B", "b", peers=("n1",)))
    result = state.apply(PeerRemove(peer="n3", ts_ns=9))
    assert result == PeerRemoved("n3", newly_removed=True, groups=("S:$G:A",))
    assert state.removed_peers == frozenset({"n3"})
    again = state.apply(PeerRemove(peer="n3", ts_ns=10))
    assert isinstance(again, PeerRemoved) and not again.newly_removed
    err = refused(state, add_stream("C", "c", peers=("n3",)), InvalidArgumentError)
    assert field_of(err) == "peers"


def test_peer_add_readmits_a_removed_peer() -> None:
    """PeerAdd drops the removal, so replicas may be placed on the peer again; readmitting
    a peer that was not removed changes nothing and says so."""
    state = state_with(add_stream("A", "a", peers=PEERS3), PeerRemove(peer="n3", ts_ns=2))
    assert state.apply(PeerAdd(peer="n3", ts_ns=3)) == PeerAdded("n3", readmitted=True)
    assert state.removed_peers == frozenset()
    state.apply(add_stream("C", "c", peers=("n3",)))  # placeable again
    assert state.apply(PeerAdd(peer="n3", ts_ns=4)) == PeerAdded("n3", readmitted=False)
    err = refused(state, PeerAdd(peer="bad name", ts_ns=5), InvalidArgumentError)
    assert field_of(err) == "peer"


def test_node_add_records_a_new_node_and_its_address() -> None:
    """NodeAdd records the node and where it serves; added again at the same address it
    changes nothing and says so; at another address, or at one another added node has, or
    with a bad name or address, it is refused naming the field, the state unchanged. The
    nodes survive a snapshot."""
    state = state_with(add_stream("A", "a", peers=PEERS3))
    empty = state.snapshot()
    assert MetaState.from_snapshot(empty).added_nodes == {}
    assert state.apply(NodeAdd(node="n4", address="10.0.0.4:7101", ts_ns=3)) == NodeAdded(
        "n4", "10.0.0.4:7101", added=True
    )
    assert state.added_nodes == {"n4": "10.0.0.4:7101"}
    again = state.apply(NodeAdd(node="n4", address="10.0.0.4:7101", ts_ns=4))
    assert again == NodeAdded("n4", "10.0.0.4:7101", added=False)
    for entry, kind, field in [
        (NodeAdd(node="n4", address="10.0.0.9:7101", ts_ns=5), ConflictError, "address"),
        (NodeAdd(node="n5", address="10.0.0.4:7101", ts_ns=5), ConflictError, "address"),
        (NodeAdd(node="bad name", address="10.0.0.5:7101", ts_ns=5), InvalidArgumentError, "peer"),
        (NodeAdd(node="n5", address="10.0.0.5", ts_ns=5), InvalidArgumentError, "address"),
        (NodeAdd(node="n5", address="[::1:7101", ts_ns=5), InvalidArgumentError, "address"),
    ]:
        err = refused(state, entry, kind)
        assert field_of(err) == field, entry
    copy = MetaState.from_snapshot(state.snapshot())
    assert copy.added_nodes == {"n4": "10.0.0.4:7101"}
    assert copy.snapshot() == state.snapshot()


def test_node_forget_takes_a_removed_node_without_replicas_out_for_good() -> None:
    """NodeForget needs the node removed and no group on it (else refused, state unchanged);
    it drops the removal and any address NodeAdd gave; again it says so; NodeAdd brings the
    name back. A snapshot keeps the forgotten nodes."""
    state = state_with(add_stream("A", "a", peers=PEERS3))
    state.apply(NodeAdd(node="n4", address="10.0.0.4:7101", ts_ns=2))
    err = refused(state, NodeForget(node="n4", ts_ns=3), ConflictError)
    assert field_of(err) == "peer" and "remove it first" in str(err)
    state.apply(PeerRemove(peer="n3", ts_ns=3))
    err = refused(state, NodeForget(node="n3", ts_ns=4), ConflictError)
    assert field_of(err) == "peer" and "S:$G:A" in str(err)
    moved = ReassignGroup(account="$G", stream="A", peers=("n1", "n2"), prior_peers=PEERS3, ts_ns=5)
    state.apply(moved)
    state.apply(PeerRemove(peer="n4", ts_ns=6))
    assert state.apply(NodeForget(node="n3", ts_ns=7)) == NodeForgotten("n3", forgotten=True)
    assert state.apply(NodeForget(node="n4", ts_ns=8)) == NodeForgotten("n4", forgotten=True)
    assert state.apply(NodeForget(node="n3", ts_ns=9)) == NodeForgotten("n3", forgotten=False)
    assert state.forgotten_nodes == {"n3", "n4"}
    assert state.removed_peers == frozenset() and state.added_nodes == {}
    copy = MetaState.from_snapshot(state.snapshot())
    assert copy.forgotten_nodes == {"n3", "n4"} and copy.snapshot() == state.snapshot()
    state.apply(NodeAdd(node="n4", address="10.0.0.5:7101", ts_ns=10))
    assert state.forgotten_nodes == {"n3"} and state.added_nodes == {"n4": "10.0.0.5:7101"}


def test_reassign_group_replaces_the_peers() -> None:
    state = state_with(add_stream("A", "a", peers=PEERS3), PeerRemove(peer="n3", ts_ns=2))
    entry = ReassignGroup(
        account=ACC, stream="A", peers=("n1", "n2", "n4"), prior_peers=PEERS3, ts_ns=3
    )
    result = state.apply(entry)
    assert isinstance(result, GroupReassigned) and result.previous.peers == PEERS3
    assert [sa.name for sa in state.streams_for_node("n4")] == ["A"]
    assert state.streams_for_node("n3") == ()


@pytest.mark.parametrize(
    ("peers", "prior", "kind"),
    [
        (("n1", "n2", "n4"), ("n1", "n2"), ConflictError),
        (("n1", "n2", "n3", "n4"), PEERS3, InvalidArgumentError),
        (("n1", "n1", "n2"), PEERS3, InvalidArgumentError),
        ((), PEERS3, InvalidArgumentError),
        (("n1", "n2", "gone"), PEERS3, InvalidArgumentError),
    ],
)
def test_reassign_group_rules(
    peers: tuple[str, ...], prior: tuple[str, ...], kind: type[RaftStreamError]
) -> None:
    """A reassignment applies only to the peers it was planned on, with 1..R distinct
    peers, none removed."""
    state = state_with(add_stream("A", "a", peers=PEERS3), PeerRemove(peer="gone", ts_ns=1))
    entry = ReassignGroup(account=ACC, stream="A", peers=peers, prior_peers=prior, ts_ns=3)
    refused(state, entry, kind)


def test_under_replicated_group_is_visible() -> None:
    """A repair that found no replacement leaves the group short, and says so."""
    state = state_with(add_stream("A", "a", peers=PEERS3))
    state.apply(
        ReassignGroup(account=ACC, stream="A", peers=("n1", "n2"), prior_peers=PEERS3, ts_ns=3)
    )
    assert state.stream(ACC, "A").under_replicated


# -- time -------------------------------------------------------------------------------------


def test_time_never_goes_backwards() -> None:
    """Leader-stamped time is floored at the last applied stamp: a new leader whose clock
    lags cannot give a later definition an earlier creation time."""
    state = state_with(add_stream("A", "a", ts_ns=100))
    state.apply(add_stream("B", "b", ts_ns=40))
    assert state.stream(ACC, "B").created_ns == 100 == state.last_ts_ns


def test_a_refused_entry_does_not_move_time() -> None:
    state = state_with(add_stream("A", "a", ts_ns=100))
    refused(state, add_stream("B", "a", ts_ns=500), InvalidArgumentError)
    assert state.last_ts_ns == 100


# -- the Raft adapter path --------------------------------------------------------------------


def test_apply_data_returns_refusals_as_results() -> None:
    """An exception from a group's state machine halts the group, so a refusal (a normal,
    replicated outcome) comes back as the entry's result instead."""
    state = state_with(add_stream("A", "a"))
    result = state.apply_data(encode_entry(add_stream("B", "a")))
    assert isinstance(result, InvalidArgumentError) and result.field == "subjects"
    ok = state.apply_data(encode_entry(add_stream("B", "b")))
    assert isinstance(ok, StreamAdded)


def test_apply_data_raises_on_an_unreadable_entry() -> None:
    """A corrupt entry is DATA_LOSS: the replica must stop, not skip it."""
    with pytest.raises(DataLossError):
        MetaState().apply_data(b"\x01\x01{not json")


# -- queries ----------------------------------------------------------------------------------


def test_stream_for_subject_uses_the_account_index() -> None:
    state = state_with(
        add_stream("ORDERS", "orders.*", "returns.>"),
        add_stream("OTHER", "orders.*", account="B"),
    )
    found = state.stream_for_subject(ACC, "returns.eu.1")
    assert found is not None and found.name == "ORDERS" and found.account == ACC
    other = state.stream_for_subject("B", "orders.x")
    assert other is not None and other.account == "B"
    assert state.stream_for_subject(ACC, "orders.x.y") is None
    assert state.stream_for_subject("NOBODY", "orders.x") is None
    with pytest.raises(InvalidArgumentError):
        state.stream_for_subject(ACC, "orders.*")


def test_list_streams_pages_in_name_order() -> None:
    """Listings are sorted by name, paged by offset and limit, with the total."""
    state = state_with(*(add_stream(f"S{i:02d}", f"s.{i}") for i in range(12)))
    page = state.stream_names(ACC, offset=5, limit=4)
    assert page.items == ("S05", "S06", "S07", "S08") and page.total == 12
    assert state.stream_names(ACC, offset=11).items == ("S11",)
    assert state.stream_names(ACC, offset=40).items == ()
    assert state.list_streams(ACC).limit == LIST_LIMIT_MAX
    with pytest.raises(InvalidArgumentError) as info:
        state.stream_names(ACC, limit=LIST_LIMIT_MAX + 1)
    assert info.value.field == "limit"
    with pytest.raises(InvalidArgumentError) as info:
        state.stream_names(ACC, offset=-1)
    assert info.value.field == "offset"


def test_list_streams_subject_filter_matches_colliding_subjects() -> None:
    """JetStream's names subject filter: streams whose subjects collide with the filter."""
    state = state_with(
        add_stream("A", "orders.*"), add_stream("B", "sales.>"), add_stream("C", "x")
    )
    assert state.stream_names(ACC, subject="orders.eu").items == ("A",)
    assert state.stream_names(ACC, subject=">").items == ("A", "B", "C")
    assert state.stream_names(ACC, subject="sales.*.x").items == ("B",)
    assert state.stream_names(ACC, subject="none").items == ()


def test_consumer_listing_pages_in_name_order() -> None:
    state = state_with(add_stream("S"), *(add_consumer("S", f"c{i}") for i in (3, 1, 2)))
    assert state.consumer_names(ACC, "S").items == ("c1", "c2", "c3")
    page = state.list_consumers(ACC, "S", offset=1, limit=1)
    assert [ca.name for ca in page.items] == ["c2"] and page.total == 3


def test_streams_for_node_and_assets() -> None:
    """What a node must run, and the per-node group counts placement balances on."""
    state = state_with(
        add_stream("A", "a", peers=PEERS3),
        add_stream("B", "b", peers=("n2",)),
        add_stream("C", "c", peers=("n2",), account="X"),
    )
    assert [sa.group for sa in state.streams_for_node("n2")] == ["S:$G:A", "S:$G:B", "S:X:C"]
    assert state.assets() == {"n1": 1, "n2": 3, "n3": 1}


# -- snapshots --------------------------------------------------------------------------------


def _busy_state() -> MetaState:
    return state_with(
        add_stream("A", "a.>", peers=PEERS3, description="d", metadata={"k": "v"}),
        add_stream(
            "B",
            "b.*",
            account="OTHER",
            placement=Placement(tags=("ssd",)),
            subject_transform=SubjectTransform(src="b.*", dest="bb.$1"),
            sealed=False,
            max_age=10**10,
        ),
        add_consumer("A", "c1", filter_subject="a.x", backoff=(10**9, 2 * 10**9)),
        AddConsumer(account=ACC, stream="A", config=ConsumerConfig(name="eph"), ts_ns=7),
        PeerRemove(peer="n9", ts_ns=8),
    )


def test_snapshot_restore_is_identical() -> None:
    """snapshot -> restore -> the same state: same bytes, same queries, same index."""
    state = _busy_state()
    data = state.snapshot()
    copy = MetaState.from_snapshot(data)
    assert copy.snapshot() == data
    assert copy.all_streams() == state.all_streams()
    assert copy.consumers_of(ACC, "A") == state.consumers_of(ACC, "A")
    assert copy.removed_peers == state.removed_peers and copy.last_ts_ns == state.last_ts_ns
    found = copy.stream_for_subject(ACC, "a.b")
    assert found is not None and found.name == "A"
    copy.check_invariants()


def test_restored_state_applies_like_the_original() -> None:
    state = _busy_state()
    copy = MetaState.from_snapshot(state.snapshot())
    for s in (state, copy):
        s.apply(add_consumer("A", "c2", filter_subject="a.y"))
        refused(s, add_stream("Z", "a.q"), InvalidArgumentError)
    assert copy.snapshot() == state.snapshot()


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty"])
def test_damaged_snapshot_is_data_loss_and_changes_nothing(damage: str) -> None:
    """A snapshot that fails its checksum or framing is DATA_LOSS; restore is all or nothing."""
    data = bytearray(_busy_state().snapshot())
    if damage == "flip":
        data[-5] ^= 0x01
    elif damage == "truncate":
        del data[-10:]
    elif damage == "magic":
        data[0:6] = b"XXXXXX"
    else:
        data = bytearray()
    state = state_with(add_stream("KEEP", "keep"))
    before = state.snapshot()
    with pytest.raises(DataLossError):
        state.restore(bytes(data))
    assert state.snapshot() == before


def test_restore_replaces_the_whole_state() -> None:
    state = state_with(add_stream("OLD", "old"))
    state.restore(_busy_state().snapshot())
    assert [sa.name for sa in state.all_streams()] == ["A", "B"]
    assert state.stream_for_subject(ACC, "old") is None
