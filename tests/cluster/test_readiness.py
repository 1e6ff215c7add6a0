"""Readiness (``raftstream.ready``) holds through a meta election (a soak review: it
followed every election, so a load balancer probing it took nodes out of service for each
one, although publishing and consuming never need the meta leader)."""

from __future__ import annotations

from raftstream.cluster.node.monitor import READY_GRACE_S, readiness


def test_a_ready_node_stays_ready_through_an_election() -> None:
    assert readiness(was_ready=True, meta_leader_known=False, missing_s=0.0)
    assert readiness(was_ready=True, meta_leader_known=False, missing_s=READY_GRACE_S - 0.1)


def test_a_node_without_a_meta_leader_past_the_grace_is_not_ready() -> None:
    assert not readiness(was_ready=True, meta_leader_known=False, missing_s=READY_GRACE_S)


def test_a_node_is_ready_only_once_it_knows_a_meta_leader() -> None:
    assert not readiness(was_ready=False, meta_leader_known=False, missing_s=0.0)
    assert readiness(was_ready=False, meta_leader_known=True, missing_s=0.0)
    assert readiness(was_ready=True, meta_leader_known=True, missing_s=0.0)
