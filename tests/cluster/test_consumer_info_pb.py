"""A consumer's info from its definition alone (a node that does not lead the stream, or whose
leader copy is not ready): its pause is counted from the node's time, which the caller gives
(``consumer_info_pb(..., now_ns=)``), never from a default."""

from __future__ import annotations

from raftstream.cluster.meta.assignments import ConsumerAssignment
from raftstream.cluster.services.convert import consumer_info_pb
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.proto import raftstream_pb2 as pb


def test_a_paused_consumer_known_by_its_definition_counts_its_pause_from_now() -> None:
    now = 1_767_225_600 * NS_PER_S
    cfg = ConsumerConfig(durable_name="C", pause_until=now + 30 * NS_PER_S)
    ca = ConsumerAssignment(account="$G", stream="Q", config=cfg, created_ns=now)
    out = consumer_info_pb(ca, None, pb.GroupInfo(), now_ns=now)
    assert out.paused and out.pause_remaining_ns == 30 * NS_PER_S
    later = consumer_info_pb(ca, None, pb.GroupInfo(), now_ns=now + 31 * NS_PER_S)
    assert not later.paused and later.pause_remaining_ns == 0
