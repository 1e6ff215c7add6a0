"""The leader side of a stream group: publish batching, consumer decisions, pull waiters.

``StreamGroup`` is what the node runs per stream group it hosts: the replica state machine
(``StreamReplica``, registered with the ``RaftHost``) plus, while this node leads, the work
only a leader does. Everything belongs to the node's event loop.

Time: the leader stamps every entry and consumer op with its clock (``GroupDeps.clock``,
``cluster/common/clock.py``); replicas never read the clock, so they all compute the same state from
the same log.

Publishes: each waits in a bounded queue (``publish_queue_msgs_max``); on the next loop turn
the queue is cut into Raft entries of at most ``publish_batch_entries_max`` publishes and
``publish_batch_bytes_max`` bytes, each proposed at once (many in flight; the host also
writes all of a round's entries with one fsync). A publish is answered from its entry's
apply result: after commit, which needs the entry fsynced on a quorum (fsync-before-ack).

Consumer decisions run on the leader copies (see ``cluster/stream/replica.py``): the ops they
record are proposed. A pull's deliveries go to the client as soon as their Deliver op is
proposed, as JetStream does, not after it commits: the fetch then costs no Raft round trip.
Every ack comes after its delivery, so its op is after the Deliver op in the log and commits
only if the Deliver op did. If the Deliver op is lost with a leader change, the new leader
does not know the delivery: it delivers the message again, and refuses an ack for a
sequence it never delivered (``cluster/services/consume.py``), so a sync ack never
succeeds for a message that is still to be delivered. A push step's deliveries leave the
same way; each Consume call keeps at most ``PUSH_STEPS_UNCOMMITTED_MAX`` steps uncommitted
(``cluster/services/push.py``), which is what bounds an AckNone push consumer's proposals.
Everything else (acks, naks, pause, reset) is answered after its ops commit.

Failure: a proposal that fails leaves the leader copies ahead of the log by ops that may
never commit, so the copies are dropped (waiting pulls get 409 Leadership Change) and a new
barrier is proposed if this node still leads. Ambiguous outcomes (timeouts) are reported to
the caller as such.

Leadership transfers (a step-down, a leader leaving the group, a planned stop): while one
is in progress the core refuses every proposal, so a Deliver op decided then would be
refused after its deliveries had left, and the new leader would not know them (it would
deliver them again as first deliveries, and refuse the client's ack). So while the host
says a transfer is in progress (``RaftHost.transferring``) the copies decide nothing:
waiting pulls stay waiting, and a new pull, push step, ack or nak waits for the transfer to
end (``Leadership.await_transfer``), then goes on here if this node still leads, else fails
NOT_LEADER with nothing decided (the client goes to the new leader; waiting pulls end with
409 Leadership Change when the copies are dropped). What is queued in the host when a
transfer starts is not refused: ``RaftHost.transfer_leadership`` puts it into the log first.
``handing_over`` (the consumer step-down) goes further for a caller that starts the transfer
inside it: it holds decisions and waits for the consumer ops already proposed to commit.

Mirrors and sources: while this node leads (from its barrier on), a ``LinkSet``
(``cluster/mirrors/links.py``) runs one coordinator per origin of the config; they propose
``Copy`` entries through ``propose_copies`` and stop when leadership is lost.

Parts: ``StreamGroup`` is the face callers use (the node, the services, the tests); each
concern is a part of its own module, which it wires together and delegates to:
``Leadership`` (``cluster/stream/leadership.py``: role and term, the barrier, the
leader state's drop, transfer waits, not-leader errors), ``Publisher``
(``streamgroup_publish.py``: the publish queue and its batches, queue and storage room),
``ConsumerDecisions`` (``streamgroup_consumers.py``: the leader copies, decisions and their
ops, sequencing the meta state's definitions, push wakers, activity), ``Pulls``
(``streamgroup_pulls.py``: pull requests and their ``PullHandle``) and ``Poller``
(``streamgroup_poller.py``: the leader's timer: waiting pulls, expiry, inactive consumers).
What they share (the deps, the replica, the clock, proposing, tasks) is a ``GroupCore``
(``streamgroup_core.py``). The stream's own proposals (``propose_stream``) and the mirror
and source links stay here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from raftstream.cluster.common.answers import no_commit
from raftstream.cluster.common.raft_errors import LeadershipTransferError
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.meta.descriptions import LOG_FEATURE_SNAPSHOT_RECORDS
from raftstream.cluster.mirrors.links import LinkSet
from raftstream.cluster.stream.consumers import ConsumerDecisions
from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.deps import GroupDeps
from raftstream.cluster.stream.entries import StreamBatch, encode
from raftstream.cluster.stream.leadership import Leadership
from raftstream.cluster.stream.poller import Poller
from raftstream.cluster.stream.publish import Publisher
from raftstream.cluster.stream.pulls import PullHandle, Pulls
from raftstream.cluster.stream.replica import StreamReplica
from raftstream.engine.consumer import Consumer
from raftstream.engine.consumer_pull import PullEvent
from raftstream.engine.consumer_push import PushStep
from raftstream.engine.entries import Copy
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.origins import OriginState
from raftstream.engine.stream import PubAck
from raftstream.errors import (
    DeadlineExceededError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["GroupDeps", "PullHandle", "StreamGroup"]


class StreamGroup:
    """This node's replica of a stream group and, while it leads, the leader's work: the
    face of its parts (module docstring, "Parts"), which it wires together."""

    def __init__(self, deps: GroupDeps, assignment: StreamAssignment) -> None:
        self._d = deps
        self.group = assignment.group
        self.account = assignment.account
        self.name = assignment.name
        self.replica = StreamReplica(
            node_id=deps.node_id,
            assignment=assignment,
            env=deps.env,
            metrics=deps.metrics,
            on_barrier=self._barrier_applied,
            on_applied=self._applied,
            records_snapshots=lambda: self.replicas_read(LOG_FEATURE_SNAPSHOT_RECORDS) is True,
        )
        core = self._core = GroupCore(
            deps, group=self.group, account=self.account, name=self.name, replica=self.replica
        )
        # In dependency order; the two late calls (``_wake_poller``, ``_deliver``) go to
        # parts made after the one that makes them.
        self._lead = Leadership(core, on_drop=self._dropped, wake=self._wake_poller)
        self._publisher = Publisher(core, self._lead)
        self._consumers = ConsumerDecisions(core, self._lead, deliver=self._deliver)
        self._poller = Poller(core, self._lead, self._consumers, propose_stream=self.propose_stream)
        self._pulls = Pulls(core, self._lead, self._consumers, wake=self._poller.wake)
        self._links = LinkSet(
            host=self,
            account=self.account,
            stream=self.name,
            servers=deps.cluster_addrs,
            log_extra={"node": deps.node_id, "group": self.group},
            tls=deps.client_tls,
            token=deps.link_token(self.account),
            clock=deps.clock,
        )

    def _wake_poller(self) -> None:
        self._poller.wake()

    def _deliver(self, events: list[PullEvent]) -> None:
        self._pulls.dispatch(events)

    # -- leadership (streamgroup_leadership.py) ------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._lead.is_leader

    @property
    def ready(self) -> bool:
        """True while this node leads and its leader copies are valid."""
        return self._lead.ready

    def check_leadership(self, *, observe: bool = True) -> None:
        """Called by the node's monitor: react to a change of role or term; ``observe``:
        refresh the group's gauges too (the monitor does that less often)."""
        self._lead.check_leadership(observe=observe)

    def handing_over(self, timeout_s: float | None) -> AbstractAsyncContextManager[None]:
        """Hold every consumer decision while the caller starts a leadership transfer of
        this group inside (``RaftHost.transfer_leadership``) and waits for it
        (``Leadership.handing_over``; module docstring, "Leadership transfers")."""
        return self._lead.handing_over(timeout_s)

    def not_leader(self) -> UnavailableError:
        """The error for a request that needs the leader: NOT_LEADER with the leader's
        client address when one is known, NO_LEADER otherwise."""
        return self._lead.not_leader()

    def require_leader(self) -> None:
        self._lead.require_leader()

    def _barrier_applied(self, term: int, seq: int) -> None:
        """Build the leader copies and start the leader's work when this leader's last
        barrier applies (``Leadership.take_lead`` says which barrier does)."""
        if not self._lead.take_lead(term, seq):
            return
        self._consumers.build()
        self._poller.start()
        self._consumers.reconcile()
        self._links.sync(self.replica.stream.config)

    def _dropped(self) -> None:
        """The leader state went (``Leadership.drop``): so does every part's."""
        self._links.stop_all()
        self._consumers.drop()
        self.replica.forget_proposed()
        self._publisher.fail(NotLeaderError("stream leadership changed; not proposed"))

    def _applied(self) -> None:
        self._poller.wake()
        self._consumers.applied()
        if self._lead.lead_term:
            self._links.sync(self.replica.stream.config)

    # -- publishing (streamgroup_publish.py) ---------------------------------------------------

    def submit(self, entry_args: dict[str, Any]) -> asyncio.Future[PubAck]:
        """Queue one message for the next Raft entry; the future resolves to its PubAck
        once committed and applied, or to the refusal (preconditions, limits), a
        NotLeader/NoLeader error, or UnavailableError when no quorum committed it in the
        proposal timeout (ambiguous: it may be stored). Raises at once when this node does
        not lead or the queue is full."""
        return self._publisher.submit(entry_args)

    def submit_plain(self, subject: str, data: bytes) -> asyncio.Future[PubAck]:
        """``submit`` of a message with a subject and data only (no headers, no options):
        the common publish, without building and unpacking its arguments."""
        return self._publisher.submit_plain(subject, data)

    async def publish(self, entry_args: dict[str, Any], timeout_s: float | None) -> PubAck:
        """``submit`` and wait, answering UNAVAILABLE shortly before ``timeout_s``."""
        return await self._publisher.publish(entry_args, timeout_s)

    async def propose_stream(self, entry: EngineEntry, timeout_s: float | None) -> Any:
        """Propose one engine entry (purge, delete, config, expiry) and return its result."""
        if not self.is_leader:
            raise self.not_leader()
        results = await self._await(self._core.propose(encode(StreamBatch((entry,))), timeout_s))
        result = results[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _await(self, fut: Awaitable[Any]) -> Any:
        try:
            return await fut
        except NotLeaderError:
            raise self.not_leader() from None
        except LeadershipTransferError as exc:
            raise self._lead.moving(exc) from None
        except DeadlineExceededError:
            raise no_commit("stream change") from None

    # -- mirrors and sources (cluster/mirrors/link.py) ---------------------------------------------

    def replicas_read(self, feature: str) -> bool | None:
        """Whether every replica of the stream reads log entries of ``feature`` (a rolling
        upgrade: a node not upgraded yet would halt the group on an entry it cannot read);
        None while a replica has not described itself to this node yet."""
        sa = self._d.stream_of(self.account, self.name)
        return sa is not None and self._d.replicas_read(sa.peers, feature)

    def origin_position(self, key: str) -> OriginState:
        """The replicated position of origin ``key``, as applied here."""
        return self.replica.stream.origins.get(key, OriginState())

    async def propose_copies(self, copies: Sequence[Copy]) -> list[Any]:
        """Propose ``copies`` as one entry; their results (refusals as values). Raises
        NotLeader/Unavailable when it cannot commit (the outcome may be unknown: the
        engine's position check makes a retry safe)."""
        self.require_leader()
        batch = StreamBatch(tuple(copies))
        data = encode(batch)
        self.replica.remember(data, batch)
        try:
            fut = self._core.propose(data)
        except RaftStreamError:
            self.replica.forget_proposed()
            raise
        return list(await self._await(fut))

    def source_infos(self) -> tuple[pb.StreamSourceInfo | None, list[pb.StreamSourceInfo]]:
        """(mirror, sources) of ``GetStreamInfo``: replicated positions, plus the live
        state of the links running here."""
        stream = self.replica.stream
        infos = self._links.source_infos(stream.config, stream.origins)
        if stream.config.mirror is not None:
            return (infos[0] if infos else None), []
        return None, infos

    # -- consumers (streamgroup_consumers.py, streamgroup_pulls.py) -----------------------------

    def reconcile(self) -> None:
        """Leader: make the group's consumers and config match the meta state (proposes the
        differences; level-triggered, so a lost proposal is made again on the next call)."""
        self._consumers.reconcile()

    def led_consumers(self) -> list[Consumer]:
        """The leader copies of the consumers, while this node leads (else none)."""
        return self._consumers.led_consumers()

    def leader_consumer(self, name: str) -> Consumer:
        """The leader copy of consumer ``name`` (NotLeader/NotFound otherwise)."""
        return self._consumers.leader_consumer(name)

    async def run(
        self,
        c: Consumer,
        decide: Callable[[int], list[PullEvent]],
        timeout_s: float | None,
        *,
        deliver_early: bool = False,
        lazy: bool = False,
    ) -> asyncio.Future[Any] | None:
        """Run one decision of the leader copy ``c`` at the leader's time, propose the ops
        it recorded, and return once they committed, delivering its events then; with
        ``deliver_early`` (pulls, push steps), deliver them once the ops are proposed and a
        quorum confirmed this node still leads (a deposed leader hands out nothing: it
        fails NOT_LEADER, NO_LEADER or UNAVAILABLE and drops its copies), and return with
        the future of their commit (None when there were none): a failed commit then only
        drops the copies (module docstring). UnavailableError
        (retriable), with nothing decided, when ``c`` is a stale copy
        (``ConsumerDecisions.stale``). While a leadership transfer is in progress it first
        waits for its end (``Leadership.await_transfer``: NOT_LEADER, with nothing decided,
        when leadership moved). ``lazy`` (fire-and-forget acks, whose sender waits for no
        answer): the op goes with the group's next Raft round rather than starting one
        (``RaftHost.propose``; docs/cluster-design.md)."""
        return await self._consumers.run(
            c, decide, timeout_s, deliver_early=deliver_early, lazy=lazy
        )

    def push_waker(self, consumer: str) -> asyncio.Event:
        """Attach a Consume call to ``consumer``: an event set on every apply (new
        messages, acks) that its session waits on. Detach with ``drop_push_waker``."""
        return self._consumers.push_waker(consumer)

    def drop_push_waker(self, consumer: str, w: asyncio.Event) -> None:
        self._consumers.drop_push_waker(consumer, w)

    def push_bound(self, consumer: str) -> bool:
        """Whether a Consume call is attached to ``consumer``."""
        return self._consumers.push_bound(consumer)

    async def push_step(
        self, c: Consumer, max_msgs: int, timeout_s: float | None
    ) -> tuple[PushStep, asyncio.Future[Any] | None]:
        """One push step of the leader copy ``c`` (``Consumer.push_step``), run as a pull's
        decision is (``run`` with ``deliver_early``): returned, to be sent at once, with the
        future of its Deliver ops' commit (None when it recorded none). The caller bounds
        how many steps it has uncommitted (cluster/services/push.py)."""
        return await self._consumers.push_step(c, max_msgs, timeout_s)

    async def open_pull(
        self, consumer: str, request: dict[str, Any], timeout_s: float | None
    ) -> PullHandle:
        """Queue a pull request on the leader copy; its events arrive on the handle. The
        caller closes the handle when its call ends, however it ends: that also takes the
        request out of the consumer if it is still waiting. During a leadership transfer it
        first waits for the transfer's end (``Leadership.await_transfer``): NOT_LEADER,
        with nothing queued, when leadership moved."""
        return await self._pulls.open_pull(consumer, request, timeout_s)

    # -- lifecycle -----------------------------------------------------------------------------

    async def close(self, *, drop: bool) -> None:
        """Stop the leader's work and close (``drop``: delete) the store."""
        self._lead.drop("group closed")
        await self._links.close()
        self._poller.stop()
        await self._core.close_tasks()
        self.replica.close(drop=drop)
