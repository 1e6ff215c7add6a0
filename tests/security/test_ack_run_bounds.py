"""Issue 39, finding 1: an ack run of any length froze the stream leader, then every replica.

What closes the class (docs/limits.md, "Pulls, acks and waiting"; docs/security.md):

- a run holds at most ``ACK_RUN_SEQS_MAX`` sequences, checked wherever a run enters the
  node (``ConsumeServicer.ack_run``: unary ``Ack``, forwarded ``Ack``, ``AckStream``); a
  longer one is INVALID_ARGUMENT naming ``run.stream_seqs`` and acks nothing;
- the leader's work per run is O(len) with nothing made per sequence: its sequences are
  taken once each (the op it proposes, which every replica applies, holds no duplicate),
  never-delivered ones cost one error for the run, not one each, and the cursor test of a
  last_per_subject consumer is a bisection, not a scan of its queue.

These pin behaviour, not time (a timing assertion would be flaky on a shared machine). The
gRPC paths are pinned in tests/cluster/test_ack_runs.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from raftstream.cluster.services.consume import ConsumeServicer
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.consumer_config import NS_PER_S, ConsumerConfig
from raftstream.engine.consumer_state import ConsumerState
from raftstream.errors import InvalidArgumentError
from raftstream.msg import ACK_RUN_SEQS_MAX
from raftstream.proto import raftstream_pb2 as pb
from tests.cluster.one_node import one_node
from tests.support.polling import until
from tests.support.raft_hosts import run

NEVER = 10**9  # a stream sequence the consumer never delivered
WAIT_NS = 60 * NS_PER_S


class _Ctx:
    """The few ``ServiceContext`` calls ``ack_run`` makes on a node leading stream Q."""

    def __init__(self, g: StreamGroup) -> None:
        self._g = g

    async def caught_up(self, lookup: Any) -> Any:
        return lookup()

    def stream(self, account: str, name: str) -> object:
        return object()

    def local_group(self, sa: object) -> StreamGroup:
        return self._g


def _spy_acks(g: StreamGroup) -> list[tuple[int, ...]]:
    """The sequences of every ``ack_many`` the leader copy of C decides from now on."""
    c = g.leader_consumer("C")
    decided: list[tuple[int, ...]] = []
    real = c.ack_many

    def ack_many(stream_seqs: Sequence[int], now_ns: int) -> None:
        decided.append(tuple(stream_seqs))
        real(stream_seqs, now_ns)

    c.ack_many = ack_many  # type: ignore[method-assign]
    return decided


async def _delivered(g: StreamGroup, n: int) -> None:
    """Publish ``n`` messages and have consumer C deliver them (pending, unacked)."""
    for i in range(n):
        await g.submit_plain("q.v", str(i).encode())
    handle = await g.open_pull("C", {"batch": n, "expires": WAIT_NS}, 30.0)
    got = 0
    while got < n:
        got += sum(1 for e in await handle.take() if e.delivery)
    handle.close()


def test_a_run_at_the_bound_is_decided_once_per_distinct_sequence(tmp_path: Path) -> None:
    """A run of ACK_RUN_SEQS_MAX sequences, all copies of one delivered sequence and of one
    never delivered: the op acks the delivered one once, the other is refused once (one
    sequence named, one error), and the replica applies just that ack."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            await _delivered(g, 3)
            decided = _spy_acks(g)
            half = ACK_RUN_SEQS_MAX // 2
            seqs = [2] * half + [NEVER] * (ACK_RUN_SEQS_MAX - half)
            run_ = pb.AckRun(stream="Q", consumer="C", stream_seqs=seqs)
            svc = ConsumeServicer(_Ctx(g))  # type: ignore[arg-type]
            refused = await svc.ack_run(run_, "$G", 5.0, False, patient=False)
            assert refused == [NEVER]
            assert decided == [(2,)]
            replica = g.replica.consumers["C"]
            await until(lambda: sorted(replica.state.pending) == [1, 3])

    run(scenario)


def test_a_run_of_never_delivered_sequences_makes_nothing_per_sequence(tmp_path: Path) -> None:
    """[10**9] * ACK_RUN_SEQS_MAX on a consumer that delivered nothing: one refused
    sequence, no op (nothing to ack), nothing pending."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            decided = _spy_acks(g)
            run_ = pb.AckRun(stream="Q", consumer="C", stream_seqs=[NEVER] * ACK_RUN_SEQS_MAX)
            svc = ConsumeServicer(_Ctx(g))  # type: ignore[arg-type]
            assert await svc.ack_run(run_, "$G", 5.0, False, patient=False) == [NEVER]
            assert decided == [()]
            assert g.leader_consumer("C").state.pending == {}

    run(scenario)


def test_a_run_past_the_bound_is_refused_by_ack_run_and_acks_nothing(tmp_path: Path) -> None:
    """Whatever path brought it (AckStream calls ``ack_run`` directly, without the
    interceptor's check), one sequence past the bound is INVALID_ARGUMENT naming the field
    and its rule, and nothing is decided."""

    async def scenario() -> None:
        async with one_node(tmp_path, ConsumerConfig(durable_name="C")) as node:
            g = node.g
            await _delivered(g, 2)
            decided = _spy_acks(g)
            seqs = [1] * (ACK_RUN_SEQS_MAX + 1)
            run_ = pb.AckRun(stream="Q", consumer="C", stream_seqs=seqs)
            svc = ConsumeServicer(_Ctx(g))  # type: ignore[arg-type]
            with pytest.raises(InvalidArgumentError) as refused:
                await svc.ack_run(run_, "$G", 5.0, False, patient=False)
            assert refused.value.field == "run.stream_seqs"
            assert "ack_run_seqs_max" in refused.value.rule
            assert decided == []
            assert sorted(g.leader_consumer("C").state.pending) == [1, 2]

    run(scenario)


class _NoScan(list[int]):
    """A last_per_subject queue that fails a membership scan or a walk over it."""

    def __contains__(self, item: object) -> bool:
        raise AssertionError("will_deliver scanned the last_per_subject queue")

    def __iter__(self) -> Any:
        raise AssertionError("will_deliver walked the last_per_subject queue")


def test_the_cursor_test_of_a_last_per_subject_consumer_does_not_scan_its_queue() -> None:
    """``will_deliver`` runs for every acked sequence: with a queue of n owed sequences a
    scan made a run cost len * n. A bisection answers the same."""
    queue = _NoScan(range(10, 20_010, 2))
    state = ConsumerState(lps_queue=queue, lps_end=30_000, started=True)
    assert state.will_deliver(10)
    assert state.will_deliver(20_008)
    assert not state.will_deliver(11)
    assert not state.will_deliver(9)
    assert not state.will_deliver(30_000)
    assert state.will_deliver(30_001)
