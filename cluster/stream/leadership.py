"""A ``StreamGroup``'s leadership (``cluster/stream/group.py``): following the host's role
and term, the barrier that makes the leader copies valid, the leader state's drop, and the
waits of leadership transfers (``await_transfer``, ``handing_over``: the module docstring
of ``cluster/stream/group.py``, "Leadership transfers"); and the errors that tell a caller
where the leader is.

Everything belongs to the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from raftstream.cluster.common.answers import answer_within, moving_to, no_commit
from raftstream.cluster.common.raft_errors import LeadershipTransferError
from raftstream.cluster.stream.core import GroupCore
from raftstream.cluster.stream.entries import LeaderBarrier, encode
from raftstream.errors import (
    DeadlineExceededError,
    NoLeaderError,
    NotLeaderError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.raft.types import Role

__all__ = ["Leadership"]

log = logging.getLogger(__name__)

# A decision waits this long at most for a leadership transfer to end (the core abandons
# one after an election timeout), and looks whether it ended at least this often.
TRANSFER_WAIT_S_MAX = 5.0
TRANSFER_POLL_S = 0.01


class Leadership:
    """Whether this node leads the group with valid leader copies, and the transfer waits.

    ``on_drop`` is called when the leader state goes (a change of role or term, a failed
    proposal, the group's close): the other parts drop theirs. ``wake`` wakes the leader's
    timer (the poller) when a transfer ends."""

    def __init__(
        self, core: GroupCore, *, on_drop: Callable[[], None], wake: Callable[[], None]
    ) -> None:
        self._core = core
        self._on_drop = on_drop
        self._wake = wake
        self._term = 0  # the term of the leadership last seen
        self._lead_term = 0  # nonzero: the leader copies are valid for this term
        self._barrier_term = 0  # the term a barrier was proposed for
        self._barrier_seq = 0  # the last barrier proposed (``take_lead``)
        # Leadership transfers: hand-overs holding decisions, consumer ops proposed and not
        # settled, and what wakes decisions waiting for a transfer.
        self._handing_over = 0
        self._hand_over_began = False  # a transfer was seen since the hand-over started
        self._ops_inflight: set[asyncio.Future[Any]] = set()
        self._transfer_over = asyncio.Event()

    @property
    def is_leader(self) -> bool:
        d = self._core.d
        return d.host.leader(self._core.group) == d.node_id

    @property
    def ready(self) -> bool:
        """True while this node leads and its leader copies are valid."""
        return self._lead_term != 0 and self.is_leader

    @property
    def lead_term(self) -> int:
        """The term the leader copies are valid for; 0: none are."""
        return self._lead_term

    def check_leadership(self, *, observe: bool = True) -> None:
        """Called by the node's monitor: react to a change of role or term; ``observe``:
        refresh the group's gauges too (the monitor does that less often)."""
        d, group = self._core.d, self._core.group
        role, term = d.host.role(group)
        leading = role == Role.LEADER
        if term != self._term or (not leading and self._lead_term):
            if term != self._term and self._term:  # not the term found at start
                d.metrics.leader_changed(group)
            self._term = term
            leader = "this node" if leading else d.host.leader(group) or "unknown"
            self.drop(f"leadership changed: term {term}, leader {leader}")
        if leading and self._barrier_term != term and self._lead_term != term:
            self._propose_barrier(term)
        if leading and not self._transfer_over.is_set() and not self.held():
            self._transfer_ended()  # abandoned: what waited decides here after all
        if observe:
            st = d.host.status(group)
            d.metrics.observe_group(
                group, applied=st.applied, term=st.term, leader=leading, halted=st.halted
            )

    def _propose_barrier(self, term: int) -> None:
        self._barrier_term = term
        self._barrier_seq += 1
        data = encode(LeaderBarrier(term, self._core.d.node_id, self._barrier_seq))
        try:
            fut = self._core.d.host.propose(self._core.group, data)
        except RaftStreamError:
            self._barrier_term = 0  # try again on the next check
            return
        self._core.watch(fut, on_error=self._barrier_failed)

    def _barrier_failed(self, exc: BaseException) -> None:
        self._barrier_term = 0

    def take_lead(self, term: int, seq: int) -> bool:
        """A barrier of ``term`` applied: whether the leader copies are to be built now (and
        are valid for ``term`` from now on). Only for the last barrier this leader
        proposed, and only while the copies are not built for this term: a barrier whose
        proposal failed ambiguously (a timeout) may still commit, after the next one was
        proposed or after the copies were built. Building again then, from a replica that
        had not applied the ops the copies had proposed meanwhile, would decide the same
        deliveries again, and applying both halts every replica ("new delivery N is behind
        the cursor": found by the soak, ``chaos/soak.py``, two barriers of one term in the
        log with a push step's deliveries between them)."""
        st = self._core.d.host.status(self._core.group)
        if st.role != Role.LEADER or st.term != term:
            return False
        if seq != self._barrier_seq or self._lead_term == term:
            return False
        self._barrier_term = term
        self._lead_term = term
        log.info(
            "leading", extra={"node": self._core.d.node_id, "group": self._core.group, "term": term}
        )
        return True

    def drop(self, why: str) -> None:
        """The leader state goes (``on_drop``); decisions waiting for a transfer then fail
        NOT_LEADER."""
        if self._lead_term:
            core = self._core
            log.info(why, extra={"node": core.d.node_id, "group": core.group, "term": self._term})
        self._lead_term = 0
        self._on_drop()
        self._transfer_over.set()

    def proposal_failed(self, exc: BaseException) -> None:
        """Ops of the leader copies may not commit: drop the copies, make them again."""
        self._core.d.metrics.proposal_failures.labels("stream").inc()
        self.drop(f"a consumer proposal failed: {exc!r}")
        self._barrier_term = 0

    # -- leadership transfers (cluster/stream/group.py's docstring) --------------------------

    def held(self) -> bool:
        """Whether the leader copies must decide nothing now: a transfer of this group's
        leadership is in progress here (the core refuses every proposal until it ends), or
        a hand-over (``handing_over``) is about to start one (once its transfer was seen,
        the transfer's own end releases decisions, abandoned or not)."""
        if self._core.d.host.transferring(self._core.group) is not None:
            self._hand_over_began = bool(self._handing_over)
            return True
        return bool(self._handing_over) and not self._hand_over_began

    def held_until_woken(self) -> bool:
        """``held``; if so, the transfer's end calls ``wake`` (what the poller waits for)."""
        if not self.held():
            return False
        self._transfer_over.clear()  # so that the transfer's end wakes the poller
        return True

    def _transfer_ended(self) -> None:
        """Wake what waited for a transfer: decisions (``await_transfer``), the poller."""
        self._transfer_over.set()
        self._wake()

    async def await_transfer(self, timeout_s: float | None) -> None:
        """Return at once unless a transfer holds decisions; else wait until it ends, then
        return if this node still leads with its copies, or raise ``not_leader()`` (the
        leadership moved: nothing was decided here, the request may go to the new leader).
        UnavailableError (retriable) when it outlasts ``timeout_s`` (``answer_within``) or
        ``TRANSFER_WAIT_S_MAX``."""
        if not self.held():
            return
        loop = asyncio.get_running_loop()
        within = answer_within(timeout_s)
        deadline = loop.time() + min(TRANSFER_WAIT_S_MAX, within or TRANSFER_WAIT_S_MAX)
        while self._lead_term and self.held():
            left = deadline - loop.time()
            if left <= 0:
                raise UnavailableError(
                    f"the leadership of stream {self._core.name!r} is moving; retry",
                    group=self._core.group,
                )
            self._transfer_over.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._transfer_over.wait(), min(left, TRANSFER_POLL_S))
        if not self.ready:
            raise self.not_leader()

    @contextlib.asynccontextmanager
    async def handing_over(self, timeout_s: float | None) -> AsyncIterator[None]:
        """Hold every consumer decision while the caller starts a leadership transfer of
        this group inside (``RaftHost.transfer_leadership``) and waits for it. Entering
        waits, bounded by ``timeout_s`` (else the proposal timeout), until the consumer
        ops already proposed (``track_op``) have settled, so that none is still queued in
        the host when the transfer starts: the core would refuse it after its deliveries
        had left. Decisions asked meanwhile wait: until the transfer is seen to start, then
        until it ends, as during any transfer (an abandoned one releases them); at the
        latest on leaving, after which they go on if this node still leads, else fail
        NOT_LEADER."""
        self._handing_over += 1
        self._hand_over_began = False
        try:
            inflight = set(self._ops_inflight)
            if inflight:
                within = answer_within(timeout_s)
                limit_s = self._core.d.proposal_timeout_ms / 1000
                await asyncio.wait(inflight, timeout=min(limit_s, within or limit_s))
            yield
        finally:
            self._handing_over -= 1
            if not self.held():
                self._transfer_ended()

    def track_op(self, fut: asyncio.Future[Any]) -> None:
        """A consumer op proposed: ``handing_over`` waits for it until it settles."""
        self._ops_inflight.add(fut)
        fut.add_done_callback(self._ops_inflight.discard)

    # -- the errors of a request that needs the leader ----------------------------------------

    def not_leader(self) -> UnavailableError:
        """The error for a request that needs the leader: NOT_LEADER with the leader's
        client address when one is known, NO_LEADER otherwise."""
        d, name = self._core.d, self._core.name
        leader = d.host.leader(self._core.group)
        if leader is None or leader == d.node_id:
            return NoLeaderError(f"stream {name!r} has no leader yet", group=self._core.group)
        return NotLeaderError(
            f"not the leader of stream {name!r}",
            leader=leader,
            leader_addr=d.client_addr(leader),
        )

    def require_leader(self) -> None:
        if not self.ready:
            raise self.not_leader()

    def hinted(self, exc: RaftStreamError, what: str = "publish") -> RaftStreamError:
        """The error to answer for a proposal that failed with ``exc``: no quorum in time
        (``no_commit(what)``), the leadership moving (``moving``) or moved
        (``not_leader``), or ``exc`` itself."""
        if isinstance(exc, DeadlineExceededError):
            return no_commit(what)
        if isinstance(exc, LeadershipTransferError):
            return self.moving(exc)
        return self.not_leader() if isinstance(exc, NotLeaderError) else exc

    def moving(self, exc: LeadershipTransferError) -> NotLeaderError:
        what = f"the leadership of stream {self._core.name!r}"
        return moving_to(what, exc.to, self._core.d.client_addr(exc.to))
