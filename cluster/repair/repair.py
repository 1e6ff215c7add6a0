"""Repair after data loss: detect damaged Raft data at start, quarantine it, rejoin fresh.

A node's Raft environment (``data/raft``) holds every group's log, term and vote: what its
promises to its peers rest on. If any of it fails its checks, the node cannot simply start
empty under its old name: an amnesic voter may vote twice in a term or acknowledge an old
leader's append, and so break entries its peers consider committed (Raft thesis §11.7;
"protocol-aware recovery"). So, at start (``prepare``):

1. the environment is scrubbed: LMDB's own checks and every record's checksum (hard states,
   snapshot metadata and data, every entry);
2. if it fails, a marker (``data/REPAIR``, naming a fresh repair id) is written durably
   FIRST, then the environment is moved to ``data/quarantine/`` (kept for inspection, logged).
   The marker makes an interrupted repair resume as a repair: a node without it and without
   a Raft environment would look like a new node;
3. the node then runs no group until the healthy cluster has taken it out of the
   membership: ``RepairClient`` asks the meta leader (through any peer) to take the next step
   of its repair until it is done (the steps are ``RepairSteps``, on the meta leader:
   ``cluster/repair/steps.py``), and the node starts each group only once the meta state
   says it may (at the term it names).
   Meanwhile its health is NOT_SERVING and ``RepairGate`` refuses every client API call as
   UNAVAILABLE (retriable): it answers nothing from its empty, catching-up state.

The engine store (``data/store``) is a cache rebuilt from the Raft logs at every start, so
damage there is repaired locally by the wipe every start does anyway.

When a majority of the cluster is damaged no meta leader exists to ask: the node keeps
asking (logging that it cannot be repaired yet) and never serves; nothing in that case can
tell which copy of the data is right.

The same protocol brings back a node that has no Raft data at all (``--join``: a disk that
was replaced, a new machine under the node's name), and takes in a node added under a new
name (``raftstream cluster peer-add NAME --address``), but only into a cluster that runs:
``prepare`` writes nothing but ``data/CHECKING`` for it (``cluster/repair/known_peers.py``: the
empty Raft environment this start creates is removed at the next start unless a cluster
took the node in), and ``seek_cluster`` writes the marker only once a meta leader answered,
before the first ``RepairNode`` call lets it act. A node that never found a cluster keeps
nothing, so it may be restarted without ``--join`` and start as a new node (the known-peers
check still stands guard). When every peer answers and none is serving or has seen this
node running (they are empty too: a new cluster started with ``--join`` everywhere), there
is no cluster to join and the node refuses to start (``DataLossError``, exit 1) rather than
wait forever; it never forms a cluster itself, so a cluster it merely cannot reach is never
split. A marker an older version wrote for ``--join`` before any cluster answered is
looked for again the same way, and dropped when there is no cluster.
A node ``PeerRemove`` took out is refused until an operator readmits it (``PeerAdd``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import lmdb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tenacity import AsyncRetrying, retry_if_exception_type, wait_fixed

from raftstream.cluster.common.durable import fsync_dir, write_json
from raftstream.cluster.common.raft_errors import app_error
from raftstream.cluster.meta.entries import RepairCleared
from raftstream.cluster.meta.group import META_GROUP
from raftstream.cluster.repair.known_peers import CHECKING_MARKER, begin_check, end_check
from raftstream.cluster.repair.steps import repair_step
from raftstream.cluster.security.auth_tokens import cluster_caller
from raftstream.cluster.security.auth_values import AuthConfig, acting_as
from raftstream.cluster.services.context import ServiceContext, time_left
from raftstream.cluster.services.forward import Forwarder
from raftstream.cluster.services.node import knows_asker, led_groups, probe_metadata
from raftstream.engine.lmdbstore import DEFAULT_MAP_SIZE_BYTES
from raftstream.errors import (
    DataLossError,
    InvalidArgumentError,
    NotLeaderError,
    PreconditionError,
    RaftStreamError,
    UnavailableError,
)
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.proto.errors import abort, map_errors
from raftstream.raft import errors as raft_errors
from raftstream.raft.storage import LmdbLogStorage

__all__ = [
    "MARKER",
    "RepairClient",
    "RepairGate",
    "RepairServicer",
    "prepare",
    "scrub_raft_env",
    "seek_cluster",
]

log = logging.getLogger(__name__)

MARKER = "REPAIR"
QUARANTINE = "quarantine"
SCRUB_BATCH_BYTES_MAX = 8 << 20  # entries read per step of the scrub
REPAIR_POLL_S = 0.3  # between two steps of a repair that is under way
REPAIR_RETRY_S = 0.5  # after a failed call (no leader, a peer down)
REPAIR_CALL_TIMEOUT_S = 5.0
REPAIR_LOG_EVERY_S = 10.0  # how often a repair that cannot go on says why
JOIN_REASON = "joining a running cluster (--join)"
JOIN_ASK_EVERY_S = 0.5  # a --join node asks its peers this often until a meta leader answers
JOIN_ASK_TIMEOUT_S = 1.0
# Found no cluster to join, a node goes on answering this long before it stops, so that the
# nodes started with it (empty too) see it and find the same (``seek_cluster``).
JOIN_VERDICT_LINGER_S = 5.0
_SVC = "/raftstream.repair.v1.RepairService/"


# -- detection and quarantine (node start, before anything opens the environment) ---------


def scrub_raft_env(path: Path) -> None:
    """Raise ``DataLossError`` unless every record of the Raft environment at ``path`` passes
    LMDB's checks and its own checksum. A missing environment passes (a fresh node)."""
    if not (path / "data.mdb").exists():
        return
    try:
        storage = LmdbLogStorage(path, map_size_bytes=DEFAULT_MAP_SIZE_BYTES)
    except (lmdb.Error, raft_errors.InvariantError) as exc:
        raise DataLossError(f"{path}: LMDB refused the environment: {exc}") from None
    except raft_errors.RaftError as exc:  # DataLossError: a truncated data file
        raise app_error(exc) from None
    try:
        for group in storage.groups():
            view = storage.log(group)
            view.snapshot()  # verifies the snapshot data against its metadata's checksum
            lo, last = view.first_index(), view.last_index()
            while lo <= last:
                got = view.entries(lo, last + 1, SCRUB_BATCH_BYTES_MAX)
                lo += max(1, len(got))
    except (lmdb.Error, raft_errors.InvariantError) as exc:
        raise DataLossError(f"{path}: LMDB found damage: {exc}") from None
    except raft_errors.RaftError as exc:  # DataLossError: a record failed its checksum
        raise app_error(exc) from None
    finally:
        storage.close()


def _write_marker(data: Path, repair_id: str, reason: str, *, meta_leader: str = "") -> None:
    """``meta_leader``: for ``--join``, the meta leader that answered before the marker was
    written (an older version wrote the marker without one, before any cluster answered)."""
    record = {"repair_id": repair_id, "reason": reason}
    if meta_leader:
        record["meta_leader"] = meta_leader
    write_json(data / MARKER, record)


@dataclass(frozen=True, slots=True)
class _Marker:
    repair_id: str  # "" when the marker itself is damaged
    unanswered_join: bool  # written for --join by an older version, before any cluster answered


def _read_marker(data: Path) -> _Marker | None:
    path = data / MARKER
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        repair_id = str(raw["repair_id"])
    except (ValueError, KeyError, TypeError, OSError):
        # The marker itself is damaged: still a repair (a new one, so nothing is assumed).
        return _Marker("", unanswered_join=False)
    return _Marker(
        repair_id, unanswered_join=raw.get("reason") == JOIN_REASON and "meta_leader" not in raw
    )


def _holds_groups(raft: Path) -> bool:
    """Whether the (scrubbed) Raft environment at ``raft`` holds any group's state."""
    if not (raft / "data.mdb").exists():
        return False
    storage = LmdbLogStorage(raft, map_size_bytes=DEFAULT_MAP_SIZE_BYTES)
    try:
        return bool(storage.groups())
    finally:
        storage.close()


def prepare(data: Path, *, has_peers: bool, join: bool = False) -> str | None:
    """Scrub ``data/raft``; quarantine it if damaged. Returns the repair id the node is
    under (a new one after a quarantine or for ``join``, the marker's when a repair was
    interrupted), or None for a healthy node with no repair pending. A node with no peers
    has nobody to be repaired from: its damaged data stays where it is and
    ``DataLossError`` is raised (the node refuses to start).

    ``join`` (``raftstream server --join``): a node with no Raft data joins a running
    cluster as a new member (a lost disk, a replacement machine under the node's name): the
    same protocol as a repair, so it never votes or acknowledges from an empty log its
    peers may count. No marker is written for it here, only ``data/CHECKING``: the marker
    waits until a meta leader answers (``seek_cluster``), so a node that found no cluster
    keeps nothing and, restarted without ``join``, starts as a new node. A node that has
    Raft data is a member already: ``join`` is ignored (logged), so the flag may stay in a
    service definition. A repair a cluster took up resumes with or without ``join``.

    Whenever ``data/CHECKING`` exists on return (a ``join`` no meta leader has answered
    yet, or such a marker left by an older version), the caller must run ``seek_cluster``
    before anything is written to the Raft environment."""
    raft = data / "raft"
    pending = _read_marker(data)
    if join:
        repair_id = _prepare_join(data, raft, pending, has_peers=has_peers)
        if repair_id is not None:
            return repair_id
    try:
        scrub_raft_env(raft)
    except DataLossError as exc:
        if not has_peers:
            log.error("Raft data damaged and no peer to repair it from: refusing to start")
            raise
        return _quarantine(data, raft, exc)
    return _pending_repair(data, raft, pending, has_peers=has_peers)


def _prepare_join(
    data: Path, raft: Path, pending: _Marker | None, *, has_peers: bool
) -> str | None:
    """``prepare`` with ``join``: a new repair id when the node has neither Raft data nor a
    marker (``data/CHECKING`` begun, nothing else written), else None: the start goes on as
    it would without ``join``."""
    if not has_peers:
        raise InvalidArgumentError("join", "a node without peers has no cluster to join")
    if pending is None and not (raft / "data.mdb").exists():
        repair_id = secrets.token_hex(8)
        # CHECKING only: the environment this start creates goes at the next start
        # unless a cluster took the node in (then ``seek_cluster`` wrote the marker).
        begin_check(data)
        log.warning(
            "--join: no Raft data here: looking for the running cluster to join as a"
            " new member (repair %s)",
            repair_id,
        )
        return repair_id
    if pending is None:
        log.info("--join ignored: %s holds Raft data (this node is a member)", raft)
    return None


def _quarantine(data: Path, raft: Path, exc: DataLossError) -> str:
    """Open a new repair for the damaged Raft environment ``raft``: the marker first, then
    the environment moved to ``data/quarantine/``. Returns the repair id."""
    repair_id = secrets.token_hex(8)
    log.error("Raft data damaged, DataLossError: %s; repair %s", exc, repair_id)
    # The marker first: a crash after the move must still find the node under repair.
    _write_marker(data, repair_id, str(exc))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = data / QUARANTINE / f"{stamp}-raft"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(raft, target)
    fsync_dir(data)
    log.error("damaged Raft data quarantined in %s; rejoining the cluster as new", target)
    return repair_id


def _pending_repair(
    data: Path, raft: Path, pending: _Marker | None, *, has_peers: bool
) -> str | None:
    """The repair a healthy (scrubbed) node is still under: its marker's (a new id for an
    unreadable marker), or None when there is no marker."""
    if pending is None:
        return None
    if pending.repair_id == "":
        repair_id = secrets.token_hex(8)
        _write_marker(data, repair_id, "unreadable repair marker")
        return repair_id
    if pending.unanswered_join and has_peers and not _holds_groups(raft):
        # An older version wrote this marker before any cluster answered; the node never
        # got as far as the meta group (no group here). Whether a cluster took it up only
        # a running cluster can tell: look for it again, keeping the marker until then.
        begin_check(data)
        log.warning(
            "repair %s was started by --join of an older version, which no cluster may"
            " have taken up: looking for the running cluster (the marker %s goes if none"
            " exists)",
            pending.repair_id,
            data / MARKER,
        )
        return pending.repair_id
    log.warning("resuming repair %s (interrupted)", pending.repair_id)
    return pending.repair_id


def finish(data: Path) -> None:
    """The repair is over: drop the marker (durably)."""
    (data / MARKER).unlink(missing_ok=True)
    fsync_dir(data)


# -- --join: a cluster to join first ------------------------------------------------------------


class _Peer(enum.Enum):
    """What a ``--join`` node learned of a peer, and how its log says so."""

    LEADS = "leads the meta group"
    KNOWS_LEADER = "serves, and knows the meta leader"
    SERVES = "serves (it holds Raft data) but knows no meta leader"
    KNOWS = "is not serving, but saw this node running before (under repair itself?)"
    EMPTY = "is not serving and never saw this node running (no Raft data either)"


async def _ask_peer(
    channel: grpc.aio.Channel, *, asker: str, metadata: tuple[tuple[str, str], ...]
) -> _Peer | None:
    """Where the peer on ``channel`` stands (None: it did not answer). Health SERVING means
    it runs its groups from its Raft data (a node under repair, asking its peers whether it
    lost its data, or looking for a cluster to join is NOT_SERVING)."""
    stub = npbg.NodeServiceStub(channel)
    try:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=JOIN_ASK_TIMEOUT_S
        )
    except grpc.RpcError:
        return None
    if health.status == health_pb2.HealthCheckResponse.SERVING:
        led = await led_groups(stub, [META_GROUP], metadata=metadata, timeout_s=JOIN_ASK_TIMEOUT_S)
        if any(g.name == META_GROUP for g in led):
            return _Peer.LEADS
        # A peer that knows the meta leader will do: a node added to the cluster may be
        # configured with one running node only (docs/operations.md, "Adding a node").
        with contextlib.suppress(grpc.RpcError):
            desc = await stub.Describe(
                npb.DescribeRequest(asker=asker), metadata=metadata, timeout=JOIN_ASK_TIMEOUT_S
            )
            if desc.meta_leader:
                return _Peer.KNOWS_LEADER
        return _Peer.SERVES
    knows = await knows_asker(stub, asker=asker, metadata=metadata, timeout_s=JOIN_ASK_TIMEOUT_S)
    if knows is None:
        return None
    return _Peer.KNOWS if knows else _Peer.EMPTY


async def seek_cluster(
    data: Path,
    *,
    node_id: str,
    repair_id: str,
    peers: Mapping[str, str],
    forwarder: Forwarder,
    auth: AuthConfig | None,
) -> None:
    """Before a ``--join`` repair (``prepare`` left ``data/CHECKING``; otherwise this
    returns at once): ask every peer (``peers``: name -> address, this node excluded) over
    and over until one leads the meta group, then write the marker (naming it) durably and
    drop ``CHECKING``, and return: the repair goes on (``RepairClient``). Call it with the
    server up and NOT_SERVING (peers started with ``--join`` too must see this one), and
    before anything is written to the Raft environment. Owned by the node's loop.

    No cluster to join: when every peer has answered and the last answer of each was
    "not serving, never saw this node running" (a peer that answered so and then stopped
    counts as it answered: the others of a new cluster stop too), this node goes on
    answering for ``JOIN_VERDICT_LINGER_S``, drops a marker an older version wrote, and
    raises ``DataLossError`` saying to start the nodes without ``--join``. It never forms a
    cluster itself: a peer that serves, saw this node before or does not answer may belong
    to a cluster this node cannot reach or that is still starting, so it keeps asking (and
    logs why every ``REPAIR_LOG_EVERY_S``). Cancelled (the node stopped), it leaves
    ``CHECKING``: the next start removes the environment and is a new one."""
    if not (data / CHECKING_MARKER).exists():
        return
    metadata = probe_metadata(auth)
    last: dict[str, _Peer] = {}  # each peer's last answer
    logged_at = time.monotonic()
    while True:
        answers = await asyncio.gather(
            *(
                _ask_peer(forwarder.channel(a), asker=node_id, metadata=metadata)
                for a in peers.values()
            )
        )
        now = dict(zip(peers, answers, strict=True))
        leader = next((n for n, seen in now.items() if seen is _Peer.LEADS), None)
        knower = next((n for n, seen in now.items() if seen is _Peer.KNOWS_LEADER), None)
        leader = leader or knower
        if leader is not None:
            # Durable before the first RepairNode call: the meta leader acts on it (takes
            # this node out of the meta group), and a restart must then resume the repair.
            _write_marker(data, repair_id, JOIN_REASON, meta_leader=leader)
            end_check(data, None)  # nothing written to the environment yet: it stays
            log.warning(
                "--join: %s %s: joining the cluster as a new member (repair %s)",
                leader,
                (now[leader] or _Peer.LEADS).value,
                repair_id,
            )
            return
        last.update({n: seen for n, seen in now.items() if seen is not None})
        if len(last) == len(peers) and all(seen is _Peer.EMPTY for seen in last.values()):
            await _no_cluster_to_join(data, node_id, sorted(peers))
        if time.monotonic() - logged_at > REPAIR_LOG_EVERY_S:
            logged_at = time.monotonic()
            log.warning(
                "--join: no meta leader answers yet; waiting, with nothing written (this node"
                " may be stopped and started without --join at any time): %s",
                "; ".join(_peer_line(n, now.get(n), last.get(n)) for n in sorted(peers)),
            )
        await asyncio.sleep(JOIN_ASK_EVERY_S)


def _peer_line(name: str, now: _Peer | None, last: _Peer | None) -> str:
    if now is not None:
        return f"{name} {now.value}"
    if last is not None:
        return f"{name} does not answer (it {last.value})"
    return f"{name} does not answer"


async def _no_cluster_to_join(data: Path, node_id: str, peers: list[str]) -> None:
    """Every peer is empty too: raise ``DataLossError`` (after ``JOIN_VERDICT_LINGER_S``,
    see ``seek_cluster``). ``CHECKING`` stays: the next start removes the environment."""
    log.error(
        "no cluster to join: %s answered and none holds Raft data: stopping in %.0f s",
        ", ".join(peers),
        JOIN_VERDICT_LINGER_S,
    )
    await asyncio.sleep(JOIN_VERDICT_LINGER_S)
    found = (
        f"every peer ({', '.join(peers)}) answered, and none serves or has seen this node"
        f" ({node_id}) running: they hold no Raft data either"
    )
    if (data / MARKER).exists():  # an older version's --join marker that no cluster took up
        finish(data)
        raise DataLossError(
            f"no cluster to take this node in: {found}. The repair marker {data / MARKER}"
            " that --join of an older version left before any cluster answered is removed:"
            " start the nodes again without --join to form a new cluster"
            " (docs/operations.md)"
        )
    raise DataLossError(
        f"--join: no cluster to join: {found} (all started with --join, or all wiped)."
        " Start the nodes without --join to form a new cluster; --join only brings a node"
        " that lost its data back into a running cluster (docs/operations.md)"
    )


# -- the damaged node's side ------------------------------------------------------------------

_CLIENT_API = "/raftstream.v1."


def _refusal(peer: tuple[str, str] | None) -> UnavailableError:
    """NOT_LEADER naming a peer (nothing applied: every client retries it there, publishes
    without a msg id too); UNAVAILABLE when no peer is known up."""
    why = "this node is rejoining the cluster (repair after data loss, --join)"
    if peer is None:
        return UnavailableError(f"{why}: try another node")
    return NotLeaderError(f"{why}: try {peer[0]}", leader=peer[0], leader_addr=peer[1])


class RepairGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """While ``repairing()``, every client API call (``raftstream.v1``) is refused before
    anything is applied, NOT_LEADER with the hint ``elsewhere()`` gives (a peer not known
    down, as (name, client address)), so the SDK retries there whatever the call: a node
    under repair has no state it may answer from. The Raft, repair and health services
    pass."""

    def __init__(
        self,
        repairing: Callable[[], bool],
        elsewhere: Callable[[], tuple[str, str] | None] = lambda: None,
    ) -> None:
        self._repairing = repairing
        self._elsewhere = elsewhere

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(_CLIENT_API) or not self._repairing():
            return handler
        kw = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }

        async def unary(request: Any, context: Any) -> Any:
            await abort(context, _refusal(self._elsewhere()))

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            await abort(context, _refusal(self._elsewhere()))
            yield None  # pragma: no cover (abort raises)

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(unary, **kw)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(streaming, **kw)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(unary, **kw)
        return grpc.stream_stream_rpc_method_handler(streaming, **kw)


class RepairClient:
    """Drives this node's repair: asks the meta leader, through any peer, for the next step
    until it is done. ``on_meta_term`` is awaited once, with the answer that lets the node
    start the meta group (at its ``meta_term``, from its ``meta_founders``); ``on_done``
    when the repair is over. Owned by the node's loop."""

    def __init__(
        self,
        *,
        node_id: str,
        repair_id: str,
        peers: Sequence[str],
        forwarder: Forwarder,
        on_meta_term: Callable[[rpb.RepairNodeResponse], Awaitable[None]],
        on_done: Callable[[], Awaitable[None]],
        auth: AuthConfig | None = None,
    ) -> None:
        self._me = node_id
        self._id = repair_id
        self._peers = list(peers)
        self._forwarder = forwarder
        self._on_meta_term = on_meta_term
        self._on_done = on_done
        self._auth = auth  # its calls carry the node token (peers refuse them otherwise)
        self._turn = 0
        self._hint: str | None = None  # the meta leader's address, as a peer named it
        self._failing_since: float | None = None
        self._refusal = ""  # the last refusal logged, and when
        self._refused_at = 0.0

    async def run(self) -> None:
        meta_started = False
        while True:
            resp = await self._ask()
            if resp.meta_term and not meta_started:
                await self._on_meta_term(resp)
                meta_started = True
            if resp.phase == rpb.REPAIR_PHASE_DONE and meta_started:
                log.info("repair %s done: back in every group", self._id)
                await self._on_done()
                return
            await asyncio.sleep(REPAIR_POLL_S)

    async def _ask(self) -> rpb.RepairNodeResponse:
        req = rpb.RepairNodeRequest(node=self._me, repair_id=self._id)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(RaftStreamError),
            wait=wait_fixed(REPAIR_RETRY_S),
            before_sleep=lambda state: self._note_failure(
                state.outcome.exception() if state.outcome is not None else None
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                # The meta leader a peer named last time, else any peer: a peer that is
                # not the leader refuses a node's call (it is marked forwarded) naming the
                # leader, whose address a node added later may have from nowhere else.
                addr, self._hint = self._hint, None
                if addr is None:
                    addr = self._peers[self._turn % len(self._peers)]
                    self._turn += 1
                try:
                    with acting_as(cluster_caller(self._auth)):
                        resp: rpb.RepairNodeResponse = await self._forwarder.unary(
                            addr,
                            _SVC + "RepairNode",
                            req,
                            rpb.RepairNodeResponse.FromString,
                            timeout_s=REPAIR_CALL_TIMEOUT_S,
                        )
                except NotLeaderError as exc:
                    self._hint = exc.leader_addr or None
                    raise
                self._failing_since = None
                return resp
        raise InvalidArgumentError("peers", "no peer to ask")  # pragma: no cover

    def _note_failure(self, exc: BaseException | None) -> None:
        """Log why the repair does not go on: a refusal an operator must act on (a removed
        node) at once and then every ``REPAIR_LOG_EVERY_S``; no meta leader answering only
        once that lasted ``REPAIR_LOG_EVERY_S`` (a peer that is not the leader refuses the
        node's call when it cannot forward it: the next peer is asked)."""
        now = time.monotonic()
        if isinstance(exc, PreconditionError):
            self._failing_since = None  # a meta leader answered
            if str(exc) != self._refusal or now - self._refused_at > REPAIR_LOG_EVERY_S:
                self._refusal, self._refused_at = str(exc), now
                log.warning("repair %s: refused: %s", self._id, exc)
            return
        if self._failing_since is None:
            self._failing_since = now
        elif now - self._failing_since > REPAIR_LOG_EVERY_S:
            self._failing_since = now
            log.warning(
                "repair %s: no meta leader answers (a majority down or damaged?): this node "
                "keeps refusing to serve until a healthy majority repairs it (last error: %s)",
                self._id,
                exc,
            )


class RepairServicer(rpbg.RepairServiceServicer):
    """``raftstream.repair.v1.RepairService`` on every node: forwards to the meta leader,
    which takes the steps (``repair_step``) and records what the stream leaders report.
    Only nodes reach it (``cluster/security/auth.py`` NodeCallsInterceptor: a node certificate with
    ``[tls]``, else a node token with ``[auth]``): a client must never make the meta leader
    take a healthy node out of the cluster."""

    def __init__(self, ctx: ServiceContext) -> None:
        self._ctx = ctx

    @map_errors
    async def RepairNode(
        self, request: rpb.RepairNodeRequest, context: Any
    ) -> rpb.RepairNodeResponse:
        ctx = self._ctx
        if not ctx.meta.is_leader:
            if ctx.forwarded(context):
                raise ctx.meta.not_leader()
            return await ctx.to_meta_leader(
                _SVC + "RepairNode", request, rpb.RepairNodeResponse.FromString, time_left(context)
            )
        return await repair_step(ctx, request.node, request.repair_id)

    @map_errors
    async def ReportCleared(
        self, request: rpb.ReportClearedRequest, context: Any
    ) -> rpb.ReportClearedResponse:
        ctx = self._ctx
        if not ctx.meta.is_leader:
            if ctx.forwarded(context):
                raise ctx.meta.not_leader()
            return await ctx.to_meta_leader(
                _SVC + "ReportCleared",
                request,
                rpb.ReportClearedResponse.FromString,
                time_left(context),
            )
        entry = RepairCleared(
            node=request.node,
            repair_id=request.repair_id,
            group=request.group,
            term=int(request.term),
            ts_ns=self._ctx.clock.time_ns(),
        )
        await ctx.meta.propose(entry, time_left(context))
        return rpb.ReportClearedResponse()


async def report_cleared(
    ctx: ServiceContext, node: str, repair_id: str, group: str, term: int
) -> None:
    """A stream group's leader: tell the meta leader ``node`` is out of ``group`` at
    ``term`` (through the meta leader, wherever it is)."""
    req = rpb.ReportClearedRequest(node=node, repair_id=repair_id, group=group, term=term)
    if ctx.meta.is_leader:
        entry = RepairCleared(
            node=node, repair_id=repair_id, group=group, term=term, ts_ns=ctx.clock.time_ns()
        )
        await ctx.meta.propose(entry, REPAIR_CALL_TIMEOUT_S)
        return
    with acting_as(cluster_caller(ctx.config.auth)):  # a node-to-node call: the node token
        await ctx.to_meta_leader(
            _SVC + "ReportCleared", req, rpb.ReportClearedResponse.FromString, REPAIR_CALL_TIMEOUT_S
        )
