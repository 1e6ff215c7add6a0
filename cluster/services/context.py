"""What the gRPC servicers share: the node's groups, the meta state, routing to leaders.

``ServiceContext`` belongs to the node's event loop. Who a call acts for is resolved ONCE,
by ``cluster/security/auth.py``'s interceptor, before the servicer runs; ``account_of`` and
``caller_of`` read it (the default account ``$G`` with every permission when the node has
no ``[auth]``), and the account is passed explicitly below. Permission checks live in the
servicers; account limits are checked by the meta leader (``check_account_limits`` in
``cluster/meta/state.py``, under ``admission_lock``) before it proposes (docs/security.md).

Routing: a request that needs a leader this node is not either fails NOT_LEADER with the
leader's client address (reads, fetches: the SDK follows the hint), or is forwarded
(``to_stream_leader``/``to_meta_leader``: meta changes, publishes, acks). A node that does
not host a stream's group does not know its leader; it points at the group's first peer,
which knows. Forwarding follows NOT_LEADER hints a bounded number of times (tenacity), within
the caller's deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.raft_extras import followers
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.assignments import StreamAssignment
from raftstream.cluster.meta.descriptions import NodeDescription
from raftstream.cluster.meta.group import META_GROUP, MetaGroup
from raftstream.cluster.security.auth import AccountLimits, Caller, caller
from raftstream.cluster.services.forward import Forwarder, was_forwarded
from raftstream.cluster.services.node_book import NodeBook
from raftstream.cluster.stream.group import StreamGroup
from raftstream.errors import (
    NoLeaderError,
    NotFoundError,
    NotLeaderError,
    PermissionDeniedError,
    RaftStreamError,
    UnauthenticatedError,
    UnavailableError,
)
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.host import RaftHost

if TYPE_CHECKING:
    from tenacity.stop import StopBaseT
    from tenacity.wait import WaitBaseT

__all__ = ["PeerView", "ServiceContext", "account_of", "caller_of", "from_leaders", "time_left"]

R = TypeVar("R")
T = TypeVar("T")
LIST_INFO_TIMEOUT_S = 2.0  # a list waits at most this long for one item's leader
LIST_FORWARDS_MAX = 32  # leaders one list call asks at once
FORWARD_HOPS_MAX = 4  # NOT_LEADER hints followed by one forwarded request
FORWARD_RETRY_WAIT_S = 0.05  # between hops when a group has no leader yet
# A ``patient`` forward (what its sender cannot retry: a fire-and-forget ack) is sent again
# while the group has no leader for up to this long (within its timeout), waiting from the
# first to the last wait between attempts, doubling: about an election's or a leadership
# transfer's length, so that it reaches the next leader.
FORWARD_PATIENT_WAIT_S = 3.0
FORWARD_PATIENT_ATTEMPTS_MAX = 30
FORWARD_PATIENT_WAIT_FIRST_S = 0.02
FORWARD_PATIENT_WAIT_LAST_S = 0.2
META_CATCHUP_WAIT_S = 0.5  # a lagging meta replica gets this long before NOT_FOUND stands
META_CATCHUP_POLL_S = 0.02


async def from_leaders(
    items: Sequence[T],
    *,
    leads: Callable[[T], bool],
    local: Callable[[T], R],
    ask: Callable[[T, float], Awaitable[R]],
    timeout_s: float | None,
) -> list[R]:
    """A list's items as their groups' leaders have them (a follower's state lags, and a
    node that hosts no replica has none): ``local(item)`` where this node leads, else
    ``ask(item, seconds)`` (forwarded to the leader), ``LIST_FORWARDS_MAX`` at once. An item
    whose leader does not answer within ``LIST_INFO_TIMEOUT_S`` (or half the call's time),
    or fails otherwise, gets ``local(item)``: what this node knows, rather than failing the
    whole list. A leader that refuses the caller (PERMISSION_DENIED, UNAUTHENTICATED) fails
    the whole list with its error: this node's copy must not show what the caller was
    refused."""
    cap = LIST_INFO_TIMEOUT_S
    if timeout_s is not None:
        cap = max(0.05, min(cap, timeout_s / 2))
    room = asyncio.Semaphore(LIST_FORWARDS_MAX)

    async def one(item: T) -> R:
        if leads(item):
            return local(item)
        async with room:
            try:
                return await ask(item, cap)
            except (PermissionDeniedError, UnauthenticatedError):
                raise
            except RaftStreamError:
                return local(item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def account_of(context: Any) -> str:
    """The account the call acts in (resolved once per call by the auth interceptor)."""
    return caller_of(context).account


def caller_of(context: Any) -> Caller:
    """Who the call acts for: account, user, permissions (``cluster/security/auth.py``)."""
    del context  # bound to the call's task by the interceptor, not to the gRPC context
    return caller()


def time_left(context: Any) -> float | None:
    """Seconds left before the client's deadline, or None when it set none."""
    left = context.time_remaining()
    return None if left is None else max(0.001, float(left))


class PeerView(Protocol):
    """The other nodes as this one sees them: when each last answered, which are down, what
    each said of itself, and the groups one leads. Implemented by the node's peer part
    (``cluster/node/peers.py``)."""

    def seen_ns(self) -> Mapping[str, int]:
        """Node -> the last time it answered a health probe (ns since the epoch)."""
        ...

    def down(self, name: str) -> bool:
        """True once peer ``name`` has failed its probes for a while."""
        ...

    def describe_self(self) -> NodeDescription:
        """This node now (``OSError``: the data directory cannot be examined)."""
        ...

    def descriptions(self) -> Mapping[str, NodeDescription]:
        """The latest description heard from each peer."""
        ...

    async def led_groups(
        self, peer: str, groups: Sequence[str], timeout_s: float
    ) -> list[pb.GroupInfo]:
        """The infos of those of ``groups`` that ``peer`` leads (none if it does not answer
        within ``timeout_s``): cluster info asks the leaders of the groups this node does not
        lead."""
        ...


@dataclass(slots=True, kw_only=True)
class ServiceContext:
    config: NodeConfig
    nodes: NodeBook  # the cluster's nodes and their addresses (founders and added ones)
    host: RaftHost
    meta: MetaGroup
    groups: dict[str, StreamGroup]
    forwarder: Forwarder
    metrics: NodeMetrics
    peers: PeerView  # the peers as this node sees them (liveness, descriptions)
    # Held by the meta leader from an account-limit check to the commit of what it admitted,
    # so two concurrent creates cannot both pass the same last free place.
    admission_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The node's clocks: the stamps of the entries the servicers propose and their waits.
    clock: NodeClock = SYSTEM_CLOCK

    @property
    def node_id(self) -> str:
        return self.config.name

    def peer_live(self, node: str) -> bool:
        """This node; a peer active in the meta group as its leader (this node) sees it;
        or a peer not known to be down (unknown counts as live: right after a start nothing
        is known yet, and placement must not refuse a healthy cluster)."""
        if node == self.node_id or not self.peers.down(node):
            return True
        _, progress = followers(self.host, META_GROUP)
        return any(f.name == node and f.active for f in progress)

    def nodes_not_reading(self, feature: str, *, exempt: Collection[str] = ()) -> list[str]:
        """The nodes that may still apply the meta log (every node but this one, removed
        ones, and ``exempt``) that have not described themselves as reading log feature
        ``feature`` (a version from before it, or not heard from yet): a meta entry of that
        kind would halt them, so the leader proposes none while this is not empty."""
        described = self.peers.descriptions()
        removed = self.meta.state.removed_peers
        return [
            n
            for n in self.nodes.names()
            if n != self.node_id
            and n not in removed
            and n not in exempt
            and (n not in described or feature not in described[n].log_features)
        ]

    def account_limits(self, account: str) -> AccountLimits:
        """The account's limits (none without ``[auth]``)."""
        auth = self.config.auth
        return AccountLimits() if auth is None else auth.limits(account)

    def client_addr(self, node: str) -> str | None:
        return self.nodes.address(node)

    # -- streams -------------------------------------------------------------------------------

    def stream(self, account: str, name: str) -> StreamAssignment:
        return self.meta.state.stream(account, name)

    async def caught_up(self, lookup: Callable[[], R]) -> R:
        """``lookup()`` against this node's meta state; on NotFoundError, when this node is
        not the meta leader, wait (bounded) for its replica to apply what the leader just
        committed: a client that created a stream through one node and then uses another
        must not see NOT_FOUND because that node lags by a heartbeat."""
        deadline = self.clock.monotonic() + META_CATCHUP_WAIT_S
        while True:
            try:
                return lookup()
            except NotFoundError:
                if self.meta.is_leader or self.clock.monotonic() >= deadline:
                    raise
            await asyncio.sleep(META_CATCHUP_POLL_S)

    def local_group(self, sa: StreamAssignment) -> StreamGroup | None:
        return self.groups.get(sa.group)

    def hint_for(self, sa: StreamAssignment) -> UnavailableError:
        """NOT_LEADER (or NO_LEADER) for a request about ``sa`` that needs its leader."""
        lost = self._lost(sa)
        if lost is not None:
            return lost
        g = self.groups.get(sa.group)
        if g is not None:
            err = g.not_leader()
            # A replica the group removed lingers here a while (node_groups.py ``_may_drop``)
            # and soon knows no leader: its NO_LEADER kept a client asking here, after a
            # shrink, until its timeout (a user review). Then a peer is the better hint.
            if isinstance(err, NotLeaderError):
                return err
            if self.node_id in sa.peers:
                return self._without_quorum(sa) or err
        live = [p for p in sa.peers if not self.peers.down(p)]
        if not live:  # pointing at a node known down would only send the client there
            return self._offline(sa)
        peer = live[0]
        return NotLeaderError(
            f"stream {sa.name!r} is not hosted here",
            leader=peer,
            leader_addr=self.client_addr(peer),
        )

    def unreachable(self, sa: StreamAssignment) -> NoLeaderError | None:
        """NO_LEADER saying why, when as far as this node knows the stream's group cannot
        have a leader now (its replicas lost to removed nodes, none of them online, or too
        few for an election); None otherwise. Checked before a change that must reach the
        group (a consumer's creation): refused at once, nothing proposed, where a proposal
        would commit and then wait for the group until the client's timeout."""
        if (lost := self._lost(sa)) is not None:
            return lost
        if not any(p == self.node_id or not self.peers.down(p) for p in sa.peers):
            return self._offline(sa)
        return self._without_quorum(sa)

    def _offline(self, sa: StreamAssignment) -> NoLeaderError:
        nodes = ", ".join(sorted(sa.peers))
        return NoLeaderError(
            f"stream {sa.name!r} has no replica online: "
            f"{'its node' if len(sa.peers) == 1 else 'its nodes'} {nodes} "
            f"{'is' if len(sa.peers) == 1 else 'are'} offline",
            group=sa.group,
        )

    def _lost(self, sa: StreamAssignment) -> NoLeaderError | None:
        """NO_LEADER for a group that lost a majority of its replicas to nodes removed from
        the cluster (``peer-remove``) and down: no election can win and no repair can move
        it (a membership change needs the old majority; ``cluster/meta/placement.py``
        ``plan_repairs``), so it says what brings the stream back."""
        removed = [p for p in sa.peers if p in self.meta.state.removed_peers and self.peers.down(p)]
        if len(sa.peers) - len(removed) >= sa.quorum:
            return None
        which = ", ".join(removed)
        what = (
            f"its only replica was on node {which}, removed from the cluster"
            if len(sa.peers) == 1
            else f"{len(removed)} of its {len(sa.peers)} replicas "
            f"{'was on a node' if len(removed) == 1 else 'were on nodes'} removed from the "
            f"cluster ({which})"
        )
        them, it, its = (
            ("the node", "it", "its") if len(removed) == 1 else ("them",) * 2 + ("their",)
        )
        return NoLeaderError(
            f"stream {sa.name!r} is unavailable: {what}; to bring it back, `cluster peer-add`"
            f" {them} and start {it} with {its} data, or delete the stream",
            group=sa.group,
        )

    def _without_quorum(self, sa: StreamAssignment) -> NoLeaderError | None:
        """NO_LEADER that says why, when too many of the stream's replicas are known down
        for any election to win ("no leader yet" read as if waiting would help; a user
        review); None while a quorum is up (an election is the likely reason)."""
        # Sorted: the message names them the same way whatever the placement's order.
        down = sorted(p for p in sa.peers if p != self.node_id and self.peers.down(p))
        need = sa.quorum
        if len(sa.peers) - len(down) >= need:
            return None
        return NoLeaderError(
            f"stream {sa.name!r} has no leader: {len(down)} of its {len(sa.peers)} replicas "
            f"({', '.join(down)}) {'is' if len(down) == 1 else 'are'} offline, and electing "
            f"one needs {need}",
            group=sa.group,
        )

    async def leader_group(self, account: str, name: str) -> StreamGroup:
        """This node's group of stream ``name`` when it leads it (copies ready); else the
        NOT_LEADER/NO_LEADER error (NOT_FOUND once the meta replica caught up)."""
        sa = await self.caught_up(lambda: self.stream(account, name))
        g = self.groups.get(sa.group)
        if g is None or not g.ready:
            raise self.hint_for(sa)
        return g

    async def read_leader_group(
        self, account: str, name: str, timeout_s: float | None
    ) -> StreamGroup:
        """``leader_group``, then a linearizable read point: returns once this node was
        confirmed to still lead the group (a heartbeat round with a quorum) and applied the
        commit index it had at the call, so reading its state afterwards is never stale.

        A deposed leader (paused or partitioned past an election timeout, not yet aware of
        it) must not serve reads (Raft thesis §6.4): it fails NOT_LEADER/NO_LEADER here, or
        DEADLINE_EXCEEDED within ``timeout_s`` (None: the raft proposal timeout). Reads
        have no effect, so every failure is safe to retry."""
        g = await self.leader_group(account, name)
        timeout_ms = None if timeout_s is None else max(1, int(timeout_s * 1000))
        try:
            await self.host.read_index(g.group, timeout_ms=timeout_ms)
        except (NotLeaderError, NoLeaderError):
            raise g.not_leader() from None  # with the client address of the new leader
        return g

    async def to_stream_leader(
        self,
        sa: StreamAssignment,
        method: str,
        request: Any,
        response_type: Callable[[bytes], R],
        timeout_s: float | None,
        *,
        patient: bool = False,
    ) -> R:
        """Send ``request`` to the leader of ``sa``'s group (maybe this node, over loopback),
        following NOT_LEADER hints; NO_LEADER is retried briefly, within ``timeout_s`` (the
        sender retries too), or ``patient``ly for up to ``FORWARD_PATIENT_WAIT_S``."""
        err = self.hint_for(sa)
        addr = err.leader_addr if isinstance(err, NotLeaderError) else None
        g = self.groups.get(sa.group)
        if g is not None and g.is_leader:
            addr = self.client_addr(self.node_id)
        return await self._hop(
            addr or self.client_addr(sa.peers[0]),
            method,
            request,
            response_type,
            timeout_s,
            patient=patient,
        )

    async def to_meta_leader(
        self,
        method: str,
        request: Any,
        response_type: Callable[[bytes], R],
        timeout_s: float | None,
    ) -> R:
        leader = self.meta.leader
        addr = self.client_addr(leader) if leader else None
        return await self._hop(addr, method, request, response_type, timeout_s)

    async def _hop(
        self,
        addr: str | None,
        method: str,
        request: Any,
        response_type: Callable[[bytes], R],
        timeout_s: float | None,
        *,
        patient: bool = False,
    ) -> R:
        deadline = None if timeout_s is None else self.clock.monotonic() + timeout_s
        target = [addr]

        async def attempt() -> R:
            left = None if deadline is None else max(0.001, deadline - self.clock.monotonic())
            try:
                return await self.forwarder.unary(
                    target[0], method, request, response_type, timeout_s=left
                )
            except NotLeaderError as exc:
                hint = self.own_hint(exc)
                if hint.leader_addr:
                    target[0] = hint.leader_addr
                raise hint from None

        stop: StopBaseT = stop_after_attempt(FORWARD_HOPS_MAX)
        wait: WaitBaseT = wait_fixed(FORWARD_RETRY_WAIT_S)
        if patient:
            wait_s = (
                FORWARD_PATIENT_WAIT_S
                if timeout_s is None
                else min(FORWARD_PATIENT_WAIT_S, timeout_s)
            )
            stop = stop_after_attempt(FORWARD_PATIENT_ATTEMPTS_MAX) | stop_after_delay(wait_s)
            wait = wait_exponential(
                multiplier=FORWARD_PATIENT_WAIT_FIRST_S,
                min=FORWARD_PATIENT_WAIT_FIRST_S,
                max=FORWARD_PATIENT_WAIT_LAST_S,
            )
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((NotLeaderError, NoLeaderError)),
            stop=stop,
            wait=wait,
            reraise=True,
        )
        async for a in retrying:
            with a:
                return await attempt()
        raise NoLeaderError("no leader answered")  # pragma: no cover (reraise=True)

    def own_hint(self, exc: NotLeaderError) -> NotLeaderError:
        """A peer's NOT_LEADER in this node's terms: the leader's address as this node's
        ``nodes`` give it, not as the peer's do. Followed here, and passed on to the client.
        Addresses are usually the same everywhere, but where they are not (a NAT, a proxy
        per link: the chaos harness's partitions), following the peer's would reach the
        leader by the peer's route, around a link this node has lost."""
        own = self.client_addr(exc.leader) if exc.leader else None
        if own is None or own == exc.leader_addr:
            return exc
        details = {k: v for k, v in exc.details.items() if k not in ("leader", "leader_addr")}
        return NotLeaderError(exc.message, leader=exc.leader, leader_addr=own, **details)

    @staticmethod
    def forwarded(context: Any) -> bool:
        return was_forwarded(context)
