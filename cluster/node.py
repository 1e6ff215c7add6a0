"""The node process: one event loop, one gRPC server, the Raft host and every group.

A ``Node`` owns, on the event loop that ran ``start()``:

- one ``grpc.aio`` server on ``listen`` serving the client API (``raftstream.v1``), the Raft
  service (``raftstream.raft.v1``, from ``raft/transport``), grpc health checking and
  server reflection, with message sizes bounded by ``limits.grpc_message_bytes_max`` and
  every client request checked, and put under a deadline, by ``cluster/limits.py``;
- the ``RaftHost`` driving the meta group (on every node) and the stream groups the meta
  state assigns to this node (``cluster/meta_group.py`` starts and stops them);
- replica changes: the leader of each stream group this node leads moves the group's Raft
  membership toward the meta state's peers, one server at a time (``cluster/membership.py``);
  a replica the meta state moved away lingers until it is out of the membership;
- the data directory: ``raft/`` holds the Raft logs of every group in one LMDB environment
  (fsynced: it is what "acknowledged" rests on), ``store/`` the engine stores of every
  stream in another, which is a cache rebuilt from the Raft logs at every start (wiped
  here), so it needs no fsync (see ``cluster/stream_group.py``). Two environments because
  ``LmdbLogStorage`` opens its own (one environment for both needs it to take an open one);
- prometheus metrics on ``metrics_listen`` (when set) and structured logs (node, group,
  term on every record that has them);
- with ``[tls]``: the port speaks TLS only and requires a CA-signed certificate from every
  caller, and every channel to another node (Raft, forwarding, health probes) is mutual TLS
  with this node's certificate (docs/tls.md).

A restart rebuilds everything from the node's own data: the meta group from its snapshot
and log, then the stream groups it assigns here, each from its snapshot and log. Raft data
that fails its checks is quarantined first and the node rejoins its groups as a new member,
health NOT_SERVING until the healthy cluster has repaired it (``cluster/repair.py``).

Failure: ``start`` raises (and leaves nothing running) when the port or the data directory
cannot be used. ``stop`` is graceful: on SIGTERM or SIGINT it first hands the leaderships
held here to live peers (lame duck, bounded), then health goes NOT_SERVING, the server stops
taking calls (a short grace for those in flight), then the host, the groups, transport and
storage close.

Health: the standard gRPC health service answers for ``""`` (the process serves its API:
liveness; NOT_SERVING under repair and while stopping) and for ``raftstream.ready``
(SERVING while the node knows a meta leader: readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import fcntl
import gc
import logging
import os
import shutil
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from raftstream.cluster import heap
from raftstream.cluster.assignments import StreamAssignment
from raftstream.cluster.auth import (
    Authenticator,
    AuthInterceptor,
    NodeCallsInterceptor,
    acting_as,
    cluster_metadata,
    node_caller,
    node_token,
)
from raftstream.cluster.config import Address, NodeConfig
from raftstream.cluster.context import ServiceContext
from raftstream.cluster.descriptions import (
    LOG_FEATURES,
    DescriptionBook,
    NodeDescription,
    describe_self,
    free_bytes,
)
from raftstream.cluster.forward import Forwarder
from raftstream.cluster.known_peers import (
    KnownPeers,
    begin_check,
    clear_interrupted_check,
    end_check,
)
from raftstream.cluster.limits import LimitsInterceptor, server_options
from raftstream.cluster.membership import MembershipDriver
from raftstream.cluster.meta_group import META_GROUP, MetaGroup
from raftstream.cluster.metrics import ConsumerNumbers, LatencyInterceptor, NodeMetrics
from raftstream.cluster.node_book import NodeBook
from raftstream.cluster.private_files import (
    check_owner,
    make_private_dir,
    open_private,
    warn_if_loose,
)
from raftstream.cluster.raft_errors import app_error
from raftstream.cluster.repair import (
    RepairClient,
    RepairGate,
    RepairServicer,
    finish,
    prepare,
    report_cleared,
    seek_cluster,
)
from raftstream.cluster.services_cluster import ClusterServicer, led_group_infos
from raftstream.cluster.services_consume import ConsumeServicer
from raftstream.cluster.services_consumers import ConsumerServicer
from raftstream.cluster.services_node import (
    NodeServicer,
    asker_standing,
    describe_peer,
    led_groups,
    probe_metadata,
)
from raftstream.cluster.services_publish import PublishServicer
from raftstream.cluster.services_streams import StreamServicer, cluster_nodes
from raftstream.cluster.storage_room import StorageRoom
from raftstream.cluster.stream_leader import GroupDeps, StreamGroup
from raftstream.engine.lmdbstore import open_node_env
from raftstream.errors import (
    DataLossError,
    InvalidArgumentError,
    InvariantError,
    NotFoundError,
    RaftStreamError,
)
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto import raftstream_pb2_grpc as pbg
from raftstream.proto import repair_pb2 as rpb
from raftstream.proto import repair_pb2_grpc as rpbg
from raftstream.raft.errors import RaftError
from raftstream.raft.host import HostConfig, RaftHost
from raftstream.raft.storage import LmdbLogStorage
from raftstream.raft.transport import GrpcTransport, GrpcTransportConfig

__all__ = ["Node", "NodeFailedError", "configure_logging", "run_node"]


# Reconnect backoff of the channels to peers (forwarding, probes, cluster info's questions):
# gRPC's default grows to 120 s, so a peer back after half a minute down went unseen by
# this node's forwards and lists for up to ~12 s more (a user review; measured 11.7 s).
# Peers are on a LAN: retry within a second, as the Raft transport's channels do (0.5 s).
PEER_CHANNEL_BACKOFF: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
log = logging.getLogger(__name__)

PEER_PROBE_INTERVAL_S = 0.5
METRICS_EVERY_S = 1.0  # how often the gauges are refreshed (cluster/metrics.py)
HAND_OVER_WAIT_S = 2.0  # a planned stop waits this long at most for its leaderships to move
READY_SERVICE = "raftstream.ready"  # health service: SERVING while a meta leader is known
PEER_PROBE_TIMEOUT_S = 1.0
FRESH_ASK_EVERY_S = 0.1  # a node without Raft data asks its peers this often (known_peers)
FRESH_WAIT_LOG_S = 10.0  # and says it is waiting this often
# A ready node stays ready this long without a meta leader: an election takes 0.6-1.2 s
# (and a split vote one more round), a lost majority longer.
READY_GRACE_S = 2.0
PEER_DOWN_AFTER_S = 3.0  # a peer whose probes failed this long is down (placement, info)
# A replica this node no longer hosts (per the meta state) is dropped once it has applied
# its own removal, or once it has known no leader for this long (the leader stops talking
# to a removed member, which may never learn the removal committed).
LINGER_NO_LEADER_S = 5.0
REPAIR_APPLY_POLL_S = 0.05  # how often a repaired node looks whether it applied RepairDone
STOP_GRACE_S = 1.0
GROUP_START_RETRY_S = 1.0  # a stream group that failed to start is tried again this often
# The cyclic garbage collector's first generation runs after this many net allocations of
# tracked objects (Python's default is 700). See ``_tune_gc``.
GC_GEN0_THRESHOLD = 20_000
_SERVICE_NAMES = (
    "raftstream.v1.StreamService",
    "raftstream.v1.ConsumerService",
    "raftstream.v1.PublishService",
    "raftstream.v1.ConsumeService",
    "raftstream.v1.ClusterService",
    "raftstream.raft.v1.Raft",
    "raftstream.node.v1.NodeService",
)


class _Fields(logging.Filter):
    """Every record gets ``node``, ``group`` and ``term`` (``-`` when it has none)."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self._node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "node"):
            record.node = self._node
        for name in ("group", "term"):
            if not hasattr(record, name):
                setattr(record, name, "-")
        return True


def configure_logging(node: str, level: int = logging.INFO) -> None:
    """Structured one-line logs: time, level, node, group, term, logger, message."""
    handler = logging.StreamHandler()
    handler.addFilter(_Fields(node))
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s node=%(node)s group=%(group)s term=%(term)s "
            "%(name)s: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class Node:
    """One raftstream node (see the module docstring). Keyword-only: ``Node(config=...)``."""

    def __init__(self, *, config: NodeConfig, join: bool = False) -> None:
        self.config = config
        self._join = join  # ``raftstream server --join`` (cluster/repair.py ``prepare``)
        self._known_peers = KnownPeers(Path(config.data))  # loaded at start
        self.metrics = NodeMetrics(config.name)
        self.groups: dict[str, StreamGroup] = {}
        self._peer_seen: dict[str, int] = {}
        self._peer_failing: dict[str, float] = {}  # peer -> monotonic time probes began to fail
        # Each peer's latest description (placement, cluster info), asked for by the prober.
        self._descriptions = DescriptionBook(peers=[n for n in config.peers if n != config.name])
        # The cluster's nodes and addresses: the configured peers, the meta group's founders
        # and the nodes added since (cluster/node_book.py); loaded at start.
        self.nodes = NodeBook(config)
        # The meta state's added and forgotten nodes, as last taken (_learn_nodes).
        self._nodes_seen: tuple[Mapping[str, str], frozenset[str]] = ({}, frozenset())
        self._dialled: dict[str, str] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        self._reconcile_lock = asyncio.Lock()
        self._lingering: dict[str, float | None] = {}  # group -> since when leaderless
        self._start_errors: dict[str, str] = {}  # group -> the error its start last raised
        self._live_peers: frozenset[str] = frozenset()  # as the meta leader last saw them
        self._removed = False  # this node, in the applied meta state (``_note_removed``)
        # Set when the Raft host stopped on its own (its log write failed: a full disk, an
        # I/O error): the node cannot go on, and ``run_node`` stops it (``_check_host``).
        self.failed = asyncio.Event()
        self._room: StorageRoom | None = None  # once the environments are open (start)
        self._server: Any = None
        self._meta_started = False
        self._repair_id: str | None = None
        self._checking = False  # started without Raft data, asking its peers (known_peers)
        self._health: health.aio.HealthServicer | None = None
        self._ready = False  # READY_SERVICE's status
        self._no_meta_leader_since: float | None = None  # monotonic; None: one is known
        self._meta_leader_warned = False
        self._peers_reported_down: set[str] = set()
        self._data_lock = -1  # the data directory's lock (``lock_data_dir``) while it runs
        self.bound_port = 0

    # -- start ------------------------------------------------------------------------------

    async def start(self) -> None:
        data = Path(self.config.data)
        if not data.exists():
            # A listen address that cannot be bound fails here, before the data directory
            # is made: gRPC finds out only after the Raft environment was created in it.
            # (An existing directory is locked first: a second node started on a running
            # one's config is told which process holds it.)
            check_listen(self.config.listen)
        # Before anything touches the data: a second node on the same directory would wipe
        # the running one's store under it (the scrub and rmtree in ``_start``).
        self._data_lock = lock_data_dir(data)
        try:
            await self._start()
        except BaseException as exc:
            # A half-started node (a port taken, say): its gRPC server stopped here, on the
            # loop; left to the garbage collector it would print a traceback at exit.
            if self._server is not None:
                await self._server.stop(None)
            self._unlock_data()
            if isinstance(exc, RaftError):  # the Raft log refused to open (DataLossError)
                raise app_error(exc) from exc
            raise

    def _unlock_data(self) -> None:
        if self._data_lock >= 0:
            unlock_data_dir(self._data_lock)
            self._data_lock = -1

    async def _start(self) -> None:
        cfg = self.config
        data = Path(cfg.data)
        store_dir = data / "store"
        # Damaged Raft data is found and quarantined before anything opens it; the node then
        # runs no group until its peers took it out of their membership (cluster/repair.py).
        self.nodes.load()
        self._descriptions.add_peers(self.nodes.peers())
        peers = self.nodes.peers()
        self._known_peers.load()
        clear_interrupted_check(data, data / "raft")
        self._repair_id = prepare(data, has_peers=bool(peers), join=self._join)
        # Raft streams carry the node token: a peer without [tls] knows them for a node's.
        tcfg = GrpcTransportConfig(call_metadata=cluster_metadata(cfg.auth))
        self._tls = cfg.tls.load() if cfg.tls is not None else None
        options = server_options(cfg.limits, raft_message_bytes_max=tcfg.message_bytes_max)
        self._forwarder = Forwarder(
            channel_options=[*options, *PEER_CHANNEL_BACKOFF],
            credentials=self._tls.channel_credentials() if self._tls is not None else None,
        )
        # No Raft data: a new node, or one that lost its data (cluster/known_peers.py).
        fresh = (
            self._repair_id is None and not (data / "raft" / "data.mdb").exists() and bool(peers)
        )
        if fresh:
            begin_check(data)
        # The engine stores are a cache of the Raft logs: rebuilt from them at every start.
        shutil.rmtree(store_dir, ignore_errors=True)
        # Address space, not disk: the file grows with the data (LMDB needs the bound).
        map_size = cfg.limits.storage_bytes_max
        self._storage = LmdbLogStorage(data / "raft", map_size_bytes=map_size)
        self._env = open_node_env(store_dir, sync=False, map_size_bytes=map_size)
        self._room = StorageRoom(data, [self._storage.env, self._env], map_size)
        for path in (data / "raft", data / "raft" / "data.mdb", data / "raft" / "lock.mdb"):
            warn_if_loose(path)  # made before this version, or by hand
        self._transport = GrpcTransport(cfg.name, peers=peers, config=tcfg, tls=self._tls)
        self._dialled = dict(peers)  # what the transport was told, per peer
        self.host = RaftHost(
            cfg.name,
            storage=self._storage,
            transport=self._transport,
            config=_host_config(cfg),
            map_error=app_error,  # the host's errors reach cluster/ as raftstream's own
        )
        self.meta = MetaGroup(
            node_id=cfg.name,
            host=self.host,
            metrics=self.metrics,
            proposal_timeout_ms=cfg.raft.proposal_timeout_ms,
            client_addr=self._client_addr,
            reconcile=self._reconcile,
            nodes=lambda: cluster_nodes(self.ctx),
        )
        self._membership = MembershipDriver(
            node_id=cfg.name,
            host=self.host,
            repairs=lambda: self.meta.state.repairs.pending(),
            report_cleared=lambda *a: report_cleared(self.ctx, *a),
        )
        self.ctx = ServiceContext(
            config=cfg,
            nodes=self.nodes,
            host=self.host,
            meta=self.meta,
            groups=self.groups,
            forwarder=self._forwarder,
            metrics=self.metrics,
            peer_seen_ns=lambda: self._peer_seen,
            peer_down=self._peer_down,
            describe_self=self._describe_self,
            peer_descriptions=self._descriptions.snapshot,
            peer_led_groups=self._peer_led_groups,
        )
        await self._start_server(options)
        if fresh:
            # After the server started (peers starting empty too can answer each other),
            # before any group runs: nothing has been written yet.
            await self._refuse_if_forgotten(peers, data)
        elif self._repair_id is not None:
            # --join: the repair waits for a running cluster's meta leader (cluster/repair.py).
            await self._health_servicer().set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            await seek_cluster(
                data,
                node_id=cfg.name,
                repair_id=self._repair_id,
                peers=peers,
                forwarder=self._forwarder,
                auth=cfg.auth,
            )
        self.host.start()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._monitor(), name="leadership-monitor"),
            loop.create_task(self._probe_peers(), name="peer-prober"),
            loop.create_task(self._release_heap(), name="heap-release"),
        ]
        if self._repair_id is None:
            self._start_meta()
        else:
            client = RepairClient(
                node_id=cfg.name,
                repair_id=self._repair_id,
                peers=list(peers.values()),
                forwarder=self._forwarder,
                auth=cfg.auth,
                on_meta_term=self._rejoin_meta,
                on_done=self._repair_done,
            )
            self._tasks.append(loop.create_task(client.run(), name="repair"))
        if cfg.metrics_listen is not None:
            await self.metrics.serve(cfg.metrics_listen.host, cfg.metrics_listen.port)
        # grpc's health service starts out SERVING: a node under repair must say it is not.
        status = health_pb2.HealthCheckResponse
        serving = status.SERVING if self._repair_id is None else status.NOT_SERVING
        await self._health_servicer().set("", serving)
        await self._health_servicer().set(READY_SERVICE, status.NOT_SERVING)  # the monitor sets it
        if cfg.auth is not None and cfg.auth.node_secret is None:
            log.warning(
                "[auth] has no node_secret_file: node tokens are keyed by the [auth] section, "
                "so whoever reads this config can mint them (docs/security.md)"
            )
        log.info("node started on %s (data %s)", cfg.listen, data)

    async def _refuse_if_forgotten(self, peers: dict[str, str], data: Path) -> None:
        """A node that started without Raft data: ask the peers whether they saw it running
        (``cluster/known_peers.py``) until one says so or enough have answered that, with
        this node, they make a majority (a node that cannot reach that many could not take
        part anyway). Meanwhile it is NOT_SERVING and answers no client. If a peer saw it,
        it lost its data: the empty Raft environment this start created is removed and
        ``DataLossError`` says to rejoin with ``--join``."""
        self._checking = True
        await self._health_servicer().set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        needed = (len(peers) + 1) // 2  # answers that make a majority with this node
        creds = self._tls.channel_credentials() if self._tls is not None else None
        metadata = probe_metadata(self.config.auth)
        waiting_since = time.monotonic()

        async def ask(addr: str) -> tuple[bool, bool] | None:
            # A channel per question: a shared one would back off for a second after a
            # peer that is still starting refused the connection.
            async with (
                grpc.aio.insecure_channel(addr)
                if creds is None
                else grpc.aio.secure_channel(addr, creds)
            ) as ch:
                return await asker_standing(
                    npbg.NodeServiceStub(ch),
                    asker=self.config.name,
                    metadata=metadata,
                    timeout_s=PEER_PROBE_TIMEOUT_S,
                )

        names = list(peers)
        raft_dir = data / "raft"
        try:
            while True:
                answers = await asyncio.gather(*(ask(peers[n]) for n in names))
                known = [n for n, a in zip(names, answers, strict=True) if a and a[0]]
                if known:
                    break
                outside = [n for n, a in zip(names, answers, strict=True) if a and a[1]]
                if outside:
                    raise DataLossError(
                        f"{', '.join(outside)} {'runs' if len(outside) == 1 else 'run'} a"
                        f" cluster that this node ({self.config.name}) did not found: a node"
                        " added to a running cluster starts empty with --join, once"
                        f" `raftstream cluster peer-add {self.config.name} --address"
                        f" {self.config.advertise}` added it (docs/operations.md)"
                    )
                if sum(a is not None for a in answers) >= needed:
                    end_check(data, None)
                    self._checking = False
                    return
                if time.monotonic() - waiting_since > FRESH_WAIT_LOG_S:
                    waiting_since = time.monotonic()
                    log.warning(
                        "no Raft data here: waiting for %d of the peers to say whether they"
                        " saw this node before (one that lost its data must rejoin with"
                        " --join)",
                        needed,
                    )
                await asyncio.sleep(FRESH_ASK_EVERY_S)
        finally:
            if self._checking:  # refused, or stopped while asking: nothing may stay
                await self.host.stop()  # never started: this shuts its writer thread down
                await self._transport.close()
                await self._forwarder.close()
                self._storage.close()
                self._env.close()
                end_check(data, raft_dir)  # the environment is this start's, and empty
        raise DataLossError(
            f"{raft_dir} holds no Raft data, but {', '.join(known)} saw this node"
            f" ({self.config.name}) running before: it lost its data. Start it with --join to"
            " rejoin the cluster as a new member (docs/operations.md), or remove every node's"
            " data to start a new cluster"
        )

    def _outsider(self, asker: str) -> bool:
        """Whether ``asker`` did not found the cluster this node runs (False before this
        node started the meta group: it knows no founders then)."""
        founders = self.nodes.known_founders
        return self._meta_started and founders is not None and asker not in founders

    def _start_meta(self) -> None:
        cfg = self.config
        replay_to = self._storage.log(META_GROUP).hard_state().commit
        # From the founding membership, the same on every replica (cluster/node_book.py).
        self.meta.start(self.nodes.founders(), cfg.meta_voters_max, replay_to)
        self._meta_started = True

    async def _rejoin_meta(self, resp: rpb.RepairNodeResponse) -> None:
        """Under repair or joining, out of the meta group's membership: record the founders
        and the nodes the meta leader named, then start the group empty at its term (no
        older leader's message is then accepted), to be added as a learner."""
        if resp.meta_founders:  # (an older meta leader names none: the configured peers)
            await asyncio.to_thread(self.nodes.record, resp.meta_founders, dict(resp.addresses))
            self._learn_nodes()
        await self.host.raise_term(META_GROUP, int(resp.meta_term))
        self._start_meta()

    def _learn_nodes(self) -> None:
        """Take the meta state's added and forgotten nodes: dial each new node (or new
        address) from now on and ask it to describe itself; probe a forgotten one no more."""
        state = self.meta.state
        self.nodes.set_added(state.added_nodes, state.forgotten_nodes)
        peers = self.nodes.peers()
        for name, addr in peers.items():
            if name not in self._dialled and name not in self._peer_seen:
                # Down until it answers: placement must not put replicas on a node that
                # was added but may not run yet (the nodes this one knew at start, from its
                # config or its record, get the usual grace: they are probably up).
                self._peer_failing.setdefault(name, time.monotonic() - PEER_DOWN_AFTER_S)
                self._peers_reported_down.add(name)  # (no "unreachable" warning for that)
            if self._dialled.get(name) != addr:
                log.info("node %s serves on %s", name, addr)
                self._transport.set_peer(name, addr)
                self._dialled[name] = addr
        for name in state.forgotten_nodes & self._dialled.keys():
            if name in peers or not self.host.untrack_peer(name):
                continue  # a replica here still counts it: dialled until the next restart
            log.info("node %s was taken out of the cluster: no longer dialled", name)
            self._transport.remove_peer(name)
            del self._dialled[name]
            self._peer_failing.pop(name, None)
            self._peers_reported_down.discard(name)
        self._descriptions.add_peers(peers)

    async def _repair_done(self) -> None:
        """The meta leader closed the repair: once this replica has applied that too, the
        groups it replayed while under repair are joined, never created, from now on."""
        me, repair_id = self.config.name, self._repair_id
        while True:
            rec = self.meta.state.repairs.get(me)
            if rec is not None and rec.repair_id == repair_id and rec.done:
                break
            await asyncio.sleep(REPAIR_APPLY_POLL_S)
        self.meta.fresh_groups.clear()
        self._repair_id = None
        finish(Path(self.config.data))
        await self._health_servicer().set("", health_pb2.HealthCheckResponse.SERVING)
        log.info("repaired: serving again")

    async def _start_server(self, options: list[tuple[str, int]]) -> None:
        interceptors: tuple[Any, ...] = (
            LatencyInterceptor(self.metrics),
            # No answers while repaired or checking whether it lost its data.
            RepairGate(
                lambda: self._repair_id is not None or self._checking, self._peer_up_for_clients
            ),
        )
        auth = None if self.config.auth is None else Authenticator(self.config.auth)
        tls = self._tls is not None
        if auth is not None or tls:  # Raft, repair, descriptions: nodes only
            interceptors = (*interceptors, NodeCallsInterceptor(authenticator=auth, tls=tls))
        if auth is not None:  # who calls: resolved once per call, refused early
            interceptors = (*interceptors, AuthInterceptor(auth, node_certificates=tls))
        # Limits after latency (a refused request is observed with its status code) and
        # after authentication (an unknown caller learns nothing about request rules).
        interceptors = (*interceptors, LimitsInterceptor(self.config.limits))
        # No SO_REUSEPORT (gRPC's default on Linux): a second node on a taken port must
        # fail, not share it.
        server_opts = [*options, ("grpc.so_reuseport", 0)]
        server = grpc.aio.server(options=server_opts, interceptors=interceptors)
        ctx = self.ctx
        pbg.add_StreamServiceServicer_to_server(StreamServicer(ctx), server)
        pbg.add_ConsumerServiceServicer_to_server(ConsumerServicer(ctx), server)
        pbg.add_PublishServiceServicer_to_server(PublishServicer(ctx), server)
        pbg.add_ConsumeServiceServicer_to_server(ConsumeServicer(ctx), server)
        pbg.add_ClusterServiceServicer_to_server(ClusterServicer(ctx), server)
        rpbg.add_RepairServiceServicer_to_server(RepairServicer(ctx), server)
        npbg.add_NodeServiceServicer_to_server(
            NodeServicer(
                auth=self.config.auth,
                describe=self._describe_self,
                knows=self._known_peers.__contains__,
                outsider=self._outsider,
                meta_leader=lambda: self.meta.leader if self._meta_started else None,
                led=lambda groups: led_group_infos(ctx, groups),
                name=self.config.name,
                address=str(self.config.advertise),
            ),
            server,
        )
        server.add_generic_rpc_handlers((self._transport.rpc_handler(),))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        names = (
            *_SERVICE_NAMES,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        )
        reflection.enable_server_reflection(names, server)
        self._server = server  # from here on ``start`` stops it if anything fails
        listen = str(self.config.listen)
        try:
            if self._tls is None:
                self.bound_port = int(server.add_insecure_port(listen))
            else:
                creds = self._tls.server_credentials()
                self.bound_port = int(server.add_secure_port(listen, creds))
        except RuntimeError:  # gRPC's "Failed to bind", naming no cause
            self.bound_port = 0
        if self.bound_port == 0:
            raise _cannot_listen(listen)
        await server.start()

    def _health_servicer(self) -> health.aio.HealthServicer:
        h = self._health
        if h is None:
            raise InvariantError("the health service starts with the server")
        return h

    async def _peer_led_groups(
        self, peer: str, groups: Sequence[str], timeout_s: float
    ) -> list[pb.GroupInfo]:
        addr = self.nodes.address(peer)
        if addr is None:
            return []
        stub = npbg.NodeServiceStub(self._forwarder.channel(str(addr)))
        metadata = probe_metadata(self.config.auth)
        return await led_groups(stub, groups, metadata=metadata, timeout_s=timeout_s)

    def _describe_self(self) -> NodeDescription:
        """This node's description now; free space over both LMDB maps, as their databases
        use them (``StorageRoom``: room a purge freed counts again) once they are open, by
        their files' sizes before (``OSError``: the data directory cannot be examined)."""
        if self._room is not None:
            return describe_self(self.config, self._room.measure())
        data = Path(self.config.data)
        size = self.config.limits.storage_bytes_max
        maps = ((data / "raft", size), (data / "store", size))
        return describe_self(self.config, free_bytes(data, maps))

    def _client_addr(self, node: str) -> str | None:
        return self.nodes.address(node)

    # -- groups -----------------------------------------------------------------------------

    def _deps(self) -> GroupDeps:
        return GroupDeps(
            node_id=self.config.name,
            host=self.host,
            env=self._env,
            limits=self.config.limits,
            metrics=self.metrics,
            proposal_timeout_ms=self.config.raft.proposal_timeout_ms,
            client_addr=self._client_addr,
            consumers_of=self._consumers_of,
            stream_of=self._stream_of,
            delete_consumer=self._delete_consumer,
            cluster_addrs=self._cluster_addrs,
            client_tls=self._tls,
            link_token=lambda account: node_token(self.config.auth, account),
            storage_room=self._storage_room,
            storage_admitted=self._storage_admitted,
            replicas_read=self._replicas_read,
        )

    def _replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        """Whether this node and each other of ``peers`` read log entries of ``feature``:
        the others as they last described themselves (``cluster/descriptions.py``); None
        while one has not described itself yet."""
        if feature not in LOG_FEATURES:
            return False
        return self._descriptions.all_read([p for p in peers if p != self.config.name], feature)

    def _storage_admitted(self, size: int) -> None:
        if self._room is not None:
            self._room.admitted(size)

    def _storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        """The replica among ``peers`` with the least storage room: this node as measured
        (``StorageRoom``), the others as they last described themselves (not yet
        described: not counted); with the reserve. None when nothing is known."""
        room = self._room
        if room is None:
            return None
        tightest: tuple[str, int] | None = None
        with contextlib.suppress(OSError):  # the data directory unreadable right now
            tightest = (self.config.name, room.room_bytes())
        for peer in peers:
            desc = self._descriptions.get(peer) if peer != self.config.name else None
            if desc is not None and (tightest is None or desc.free_bytes < tightest[1]):
                tightest = (peer, desc.free_bytes)
        return None if tightest is None else (*tightest, room.reserve_bytes)

    def _cluster_addrs(self) -> tuple[str, ...]:
        """This cluster's client API addresses (a mirror/source link to a local origin)."""
        return tuple(a for a in self.nodes.addresses().values() if a)

    async def _delete_consumer(self, account: str, stream: str, name: str) -> None:
        """Through the meta leader, as a client of ``account`` would: the node acts for the
        account with its node token when ``[auth]`` is configured (cluster/auth.py)."""
        req = pb.DeleteConsumerRequest(stream=stream, consumer=name)
        with acting_as(node_caller(self.config.auth, account)):
            await self.ctx.to_meta_leader(
                "/raftstream.v1.ConsumerService/DeleteConsumer",
                req,
                pb.DeleteConsumerResponse.FromString,
                self.config.limits.request_timeout_ms / 1000,
            )

    def _consumers_of(self, account: str, stream: str) -> tuple[Any, ...]:
        try:
            return self.meta.state.consumers_of(account, stream)
        except NotFoundError:
            return ()

    def _stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        try:
            return self.meta.state.stream(account, stream)
        except NotFoundError:
            return None

    async def _reconcile(self, wanted_streams: tuple[StreamAssignment, ...]) -> None:
        """Start the stream groups assigned here, stop the others once they left the
        group's Raft membership, let leaders sequence consumer and config changes (called
        by the meta group's reconciler)."""
        async with self._reconcile_lock:
            wanted = {sa.group: sa for sa in wanted_streams}
            existing = {sa.group for sa in self.meta.state.all_streams()}
            for group in [g for g in self.groups if g not in wanted]:
                if self._may_drop(group, group in existing):
                    await self._drop_group(group)
            failed = False
            for group, sa in wanted.items():
                self._lingering.pop(group, None)
                if group not in self.groups:
                    try:
                        await self._start_group(sa)
                    except Exception as exc:  # one bad assignment: the others still start
                        self._start_failed(group, exc)
                        failed = True
                    else:
                        self._start_errors.pop(group, None)
            for g in self.groups.values():
                g.reconcile()
            if failed:
                asyncio.get_running_loop().call_later(GROUP_START_RETRY_S, self.meta.poke)

    def _start_failed(self, group: str, exc: Exception) -> None:
        """A stream group that could not start here: said once per distinct error (a bug,
        or data this version cannot read: an ERROR with its traceback), and tried again
        every ``GROUP_START_RETRY_S`` while every other group runs."""
        said = repr(exc)
        if self._start_errors.get(group) == said:
            return
        self._start_errors[group] = said
        if isinstance(exc, DataLossError):
            log.error("stream group cannot start here: %s", exc, extra={"group": group})
        elif isinstance(exc, RaftStreamError):
            log.warning("stream group cannot start yet: %s", exc, extra={"group": group})
        else:
            log.error(
                "stream group cannot start here: %s", said, exc_info=exc, extra={"group": group}
            )

    async def _start_group(self, sa: StreamAssignment) -> None:
        """Create the group as one of its initial members (a stream just added here), or
        join it empty (added later, or unknown: a joiner never campaigns and learns the
        membership from the leader's snapshot; see ``RaftHost.create_group``)."""
        group = sa.group
        rec = self.meta.state.repairs.get(self.config.name)
        rejoin_term = rec.may_rejoin(group) if rec is not None else None
        if self._repair_id is not None and (
            rec is None or rec.repair_id != self._repair_id or rejoin_term is None
        ):
            return  # under repair and still a member there: it must not run the group yet
        if rejoin_term is not None:
            # Rejoining after data loss: never at a term older than the group's leader that
            # dropped this node from the membership (cluster/repair.py).
            await self.host.raise_term(group, rejoin_term)
        g = StreamGroup(self._deps(), sa)
        g.replica.starting = True
        try:
            if group in self.meta.fresh_groups and self._repair_id is None:
                await self.host.create_group(group, voters=sa.peers, state_machine=g.replica)
            else:
                self.host.join_group(group, state_machine=g.replica)
        finally:
            g.replica.starting = False
        self.groups[group] = g
        log.info("stream group started", extra={"group": group})

    def _may_drop(self, group: str, stream_exists: bool) -> bool:
        """A replica the meta state no longer places here: drop it at once when the stream
        is gone, else only once the group's membership no longer names this node, or it
        has had no leader for ``LINGER_NO_LEADER_S`` (it was removed; a voter that left
        early could cost the group its quorum before the leader removed it)."""
        if not stream_exists:
            return True
        host, me = self.host, self.config.name
        if me not in (*host.voters(group), *host.learners(group)):
            return True
        now = time.monotonic()
        if host.leader(group) is not None:
            self._lingering[group] = None
            return False
        since = self._lingering.get(group) or now
        self._lingering[group] = since
        return now - since >= LINGER_NO_LEADER_S

    async def _drop_group(self, group: str) -> None:
        g = self.groups.pop(group)
        self._lingering.pop(group, None)
        # Out of the host first: nothing may apply to the store once it is dropped.
        await self.host.remove_group(group)
        await g.close(drop=True)
        self.metrics.forget_group(group)
        log.info("stream group removed", extra={"group": group})

    # -- background work --------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Leadership changes (RaftHost has no callback for them): look every tick."""
        tick_s = self.config.raft.tick_ms / 1000
        meta_leader: str | None = None
        loop = asyncio.get_running_loop()
        metrics_due = 0.0
        while True:
            asleep = loop.time()
            await asyncio.sleep(tick_s / 2)
            self.metrics.loop_lag.observe(max(0.0, loop.time() - asleep - tick_s / 2))
            if await self._check_host():
                return
            observe = loop.time() >= metrics_due
            if observe:
                metrics_due = loop.time() + METRICS_EVERY_S
            for g in list(self.groups.values()):
                try:
                    g.check_leadership(observe=observe)
                    sa = self._stream_of(g.account, g.name)
                    if sa is not None and sa.group == g.group:
                        self._membership.step(sa)
                except RaftStreamError as exc:
                    log.warning("leadership check failed: %r", exc, extra={"group": g.group})
            if self._lingering:
                self.meta.poke()  # a removed replica waits to be dropped
            if not self._meta_started:
                continue  # under repair, not yet back in the meta group
            seen = (self.meta.state.added_nodes, self.meta.state.forgotten_nodes)
            if seen != self._nodes_seen:
                self._nodes_seen = seen
                self._learn_nodes()
            st = self.host.status(META_GROUP)
            await self._set_ready(bool(st.leader))
            if observe:
                self.metrics.observe_group(
                    META_GROUP,
                    applied=st.applied,
                    term=st.term,
                    leader=st.leader == self.config.name,
                )
            if st.leader == self.config.name:
                live = frozenset(n for n in self.nodes.names() if self.ctx.peer_live(n))
                if live != self._live_peers:
                    # A node that came online (back, readmitted, repaired) may take the
                    # replicas of groups left short: the meta leader plans again.
                    self._live_peers = live
                    self.meta.poke()
            self._note_removed()
            if st.leader != meta_leader:
                meta_leader = st.leader
                self.meta.poke()  # a new meta leader resumes any interrupted repair
                self.metrics.leader_changed(META_GROUP)
                log.info(
                    "meta leader is %s",
                    meta_leader or "-",
                    extra={"group": META_GROUP, "term": st.term},
                )
            if observe:
                self._observe_stores()
                self._observe_led(st.leader == self.config.name)

    async def _check_host(self) -> bool:
        """True once the Raft host stopped on its own: then this node stops serving (health
        NOT_SERVING, so clients and peers go elsewhere and its leaderships move) and
        ``failed`` is set. Kept running, it looked healthy (Online, SERVING, its last
        leaderships in the metrics) while every write it took failed (a user review: a full
        disk); stopped, it is plainly down, as Kafka stops a broker whose log dir failed."""
        exc = self.host.failure
        if exc is None or self.failed.is_set():
            return exc is not None
        log.critical(
            "this node stops: its Raft log can no longer be written (%r). Free disk space "
            "or fix the disk under %s, then start it again: it catches up from its peers",
            exc,
            self.config.data,
        )
        with contextlib.suppress(InvariantError):
            await self._health_servicer().set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.failed.set()
        return True

    def _note_removed(self) -> None:
        """Say so when this node is taken out of the cluster or readmitted: a removed node
        keeps running but hosts nothing (docs/operations.md)."""
        removed = self.config.name in self.meta.state.removed_peers
        if removed == self._removed:
            return
        self._removed = removed
        if removed:
            log.warning(
                "this node was removed from the cluster (peer-remove): no replica is placed"
                " on it until it is readmitted (raftstream cluster peer-add %s)",
                self.config.name,
            )
        else:
            log.info("this node was readmitted to the cluster (peer-add)")

    async def _set_ready(self, meta_leader_known: bool) -> None:
        """``READY_SERVICE``'s health status: SERVING while this node knows a meta leader
        (so it can create, change and place streams and consumers), through an election
        (``readiness``); ``""`` stays the process's liveness. A meta leader missing for
        ``PEER_DOWN_AFTER_S`` is logged once as a WARNING (an election takes less)."""
        now = time.monotonic()
        if meta_leader_known:
            if self._meta_leader_warned:
                log.info("the meta group has a leader again", extra={"group": META_GROUP})
            self._no_meta_leader_since = None
            self._meta_leader_warned = False
        elif self._no_meta_leader_since is None:
            self._no_meta_leader_since = now
        elif not self._meta_leader_warned and now - self._no_meta_leader_since >= (
            PEER_DOWN_AFTER_S
        ):
            self._meta_leader_warned = True
            log.warning(
                "no meta leader for %.0f s: streams and consumers cannot be created, changed"
                " or placed until a majority of the nodes is back (unreachable: %s)",
                PEER_DOWN_AFTER_S,
                ", ".join(sorted(self._peers_reported_down)) or "none seen yet",
                extra={"group": META_GROUP},
            )
        missing_s = 0.0 if self._no_meta_leader_since is None else now - self._no_meta_leader_since
        ready = (
            readiness(
                was_ready=self._ready, meta_leader_known=meta_leader_known, missing_s=missing_s
            )
            and not self.failed.is_set()
            and not self._stopped.is_set()
        )
        if ready == self._ready:
            return
        self._ready = ready
        status = health_pb2.HealthCheckResponse
        await self._health_servicer().set(
            READY_SERVICE, status.SERVING if ready else status.NOT_SERVING
        )

    def _observe_led(self, meta_leader: bool) -> None:
        """The metrics only a group's leader knows: replica lag and consumer backlogs."""
        lags: dict[tuple[str, str], int] = {}
        consumers: dict[tuple[str, str], ConsumerNumbers] = {}
        now = time.time_ns()
        groups = [g.group for g in self.groups.values() if g.ready]
        for group in [META_GROUP, *groups] if meta_leader else groups:
            with contextlib.suppress(RaftStreamError):  # a group just removed
                for peer, lag in self.host.peer_lags(group).items():
                    lags[(group, peer)] = lag
        for g in self.groups.values():
            for c in g.led_consumers():
                i = c.info(now)
                consumers[(g.group, c.name)] = ConsumerNumbers(
                    pending=i.num_pending,
                    ack_pending=i.num_ack_pending,
                    redelivered=i.num_redelivered,
                    waiting=i.num_waiting,
                    delivered_seq=i.delivered.stream_seq,
                    ack_floor_seq=i.ack_floor.stream_seq,
                )
        self.metrics.observe_led(lags, consumers)

    def _observe_stores(self) -> None:
        if self._room is not None:
            with contextlib.suppress(OSError):  # an unreadable data dir shows elsewhere
                self.metrics.storage_room.set(self._room.measure())
        for group, g in self.groups.items():
            st = g.replica.store.state()
            self.metrics.observe_store(group, msgs=st.msgs, size_bytes=st.bytes)

    async def _release_heap(self) -> None:
        """Give freed memory back to the system now and then (``cluster/heap.py``)."""
        while True:
            await asyncio.sleep(heap.HEAP_RELEASE_EVERY_S)
            await asyncio.to_thread(heap.release)

    async def _probe_peers(self) -> None:
        """Who is up (placement, cluster info): a health check per peer per interval, then,
        from a serving peer, its description (tags, free space: cluster/descriptions.py)."""
        stubs: dict[str, health_pb2_grpc.HealthStub] = {}
        describers: dict[str, npbg.NodeServiceStub] = {}
        dialled: dict[str, str] = {}
        metadata = probe_metadata(self.config.auth)
        while True:
            peers = self.nodes.peers()  # a node added to the cluster is probed from now on
            for n, a in peers.items():
                if dialled.get(n) != a:
                    dialled[n] = a
                    stubs[n] = health_pb2_grpc.HealthStub(self._forwarder.channel(a))
                    describers[n] = npbg.NodeServiceStub(self._forwarder.channel(a))

            async def probe(name: str, stub: health_pb2_grpc.HealthStub) -> None:
                ok = False
                with contextlib.suppress(grpc.RpcError):
                    resp = await stub.Check(
                        health_pb2.HealthCheckRequest(), timeout=PEER_PROBE_TIMEOUT_S
                    )
                    ok = resp.status == health_pb2.HealthCheckResponse.SERVING
                if ok:
                    self._peer_seen[name] = time.time_ns()
                    self._peer_failing.pop(name, None)
                    if name in self._peers_reported_down:
                        self._peers_reported_down.discard(name)
                        log.info("peer %s is reachable again", name)
                    self.metrics.peer_up.labels(name).set(1)
                    await self._describe_peer(name, describers[name], metadata)
                else:
                    self._peer_failing.setdefault(name, time.monotonic())
                    if self._peer_down(name) and name not in self._peers_reported_down:
                        self._peers_reported_down.add(name)
                        self.metrics.peer_up.labels(name).set(0)
                        log.warning(
                            "peer %s (%s) is unreachable: no health answer for %.0f s; the"
                            " groups it holds replicas of are short a member",
                            name,
                            self.nodes.address(name),
                            PEER_DOWN_AFTER_S,
                        )

            await asyncio.gather(*(probe(n, stubs[n]) for n in peers))
            await asyncio.sleep(PEER_PROBE_INTERVAL_S)

    async def _describe_peer(
        self, name: str, stub: npbg.NodeServiceStub, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        """Record ``name``'s description; a failed call keeps the last one (the next round
        asks again), a description that breaks a rule is logged and not believed."""
        try:
            desc = await describe_peer(
                stub, asker=self.config.name, metadata=metadata, timeout_s=PEER_PROBE_TIMEOUT_S
            )
            self._descriptions.record(name, desc)
            self._known_peers.add(name)  # it ran with Raft data (cluster/known_peers.py)
        except grpc.RpcError as exc:
            log.debug("peer %s did not describe itself: %s", name, exc.code())
        except InvalidArgumentError as exc:
            log.warning("peer %s described itself wrongly: %s", name, exc)

    def _peer_up_for_clients(self) -> tuple[str, str] | None:
        """A peer not known down, as (name, client address): where a refused client goes."""
        for name, addr in self.nodes.peers().items():
            if not self._peer_down(name):
                return name, addr
        return None

    def _peer_down(self, name: str) -> bool:
        since = self._peer_failing.get(name)
        return since is not None and time.monotonic() - since >= PEER_DOWN_AFTER_S

    # -- stop -------------------------------------------------------------------------------

    async def _hand_over(self) -> None:
        """Before a planned stop, move every leadership held here to a live voter, the one
        furthest along, as NATS's lame-duck mode and etcd do: clients then follow a
        redirect instead of waiting out an election timeout. Bounded by
        ``HAND_OVER_WAIT_S``: what has not moved by then is left to an election."""
        me = self.config.name
        held = [g.group for g in self.groups.values() if self.host.leader(g.group) == me]
        if self._meta_started and self.host.leader(META_GROUP) == me:
            held.append(META_GROUP)
        asked = []
        for group in held:
            with contextlib.suppress(RaftStreamError):  # removed, or no longer led here
                lags = self.host.peer_lags(group)
                live = [p for p in self.host.voters(group) if p in lags and not self._peer_down(p)]
                if live:
                    self.host.transfer_leadership(group, min(live, key=lambda p: lags[p]))
                    asked.append(group)
        if not asked:
            return
        log.info("stopping: handing %d leaderships over to peers", len(asked))
        loop = asyncio.get_running_loop()
        start = loop.time()

        def still_held() -> list[str]:
            out = []
            for group in asked:
                with contextlib.suppress(RaftStreamError):
                    if self.host.leader(group) == me:
                        out.append(group)
            return out

        left = still_held()
        while left and loop.time() - start < HAND_OVER_WAIT_S:
            await asyncio.sleep(0.02)
            left = still_held()
        log.info(
            "handed %d of %d leaderships over in %.2f s%s",
            len(asked) - len(left),
            len(asked),
            loop.time() - start,
            f" (left to an election: {', '.join(left)})" if left else "",
        )

    async def stop(self, *, hand_over: bool = False) -> None:
        """Graceful stop (see the module docstring). Idempotent. ``hand_over``: first move
        this node's leaderships to its peers (``_hand_over``), as a planned stop does."""
        if self._stopped.is_set():
            return
        if hand_over and not self.failed.is_set() and self.host.failure is None:
            try:
                await self._hand_over()
            except Exception:  # a stop must go on whatever the hand-over met
                log.exception("handing leaderships over failed; stopping anyway")
        self._stopped.set()
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace=STOP_GRACE_S)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.meta.stop()
        await self._membership.close()
        # The host first: until it stops it may apply a commit (a follower learning one) to
        # a group, and a group's store must not be closed under it (the group would halt).
        await self.host.stop()
        # Together: each waits up to LINK_CLOSE_WAIT_S for its mirror links to end (an origin
        # in this cluster stops too, and answers nothing), so the waits overlap.
        await asyncio.gather(*(g.close(drop=False) for g in list(self.groups.values())))
        await self.host.stop()  # never started: this shuts its writer thread down
        await self._transport.close()
        await self._forwarder.close()
        self._storage.close()
        self._env.close()
        # Its port is free again (a node stopped in a test's process).
        await self.metrics.close()
        self._unlock_data()
        log.info("node stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _host_config(cfg: NodeConfig) -> HostConfig:
    r = cfg.raft
    return HostConfig(
        tick_ms=r.tick_ms,
        election_tick=r.election_ticks,
        heartbeat_tick=r.heartbeat_ticks,
        proposal_timeout_ms=r.proposal_timeout_ms,
        proposals_pending_max=r.proposals_pending_max,
        inbox_msgs_max=r.inbox_msgs_max,
        snapshot_entries=r.snapshot_entries,
        lazy_linger_ms=r.ack_linger_ms,
    )


DATA_LOCK_FILE = "LOCK"


def lock_data_dir(data: Path) -> int:
    """Take the node's exclusive lock on ``data`` (``flock`` on ``data/LOCK``, which holds
    the owner's pid); the open descriptor, held until ``unlock_data_dir`` or the process
    ends (the kernel drops the lock then, even after kill -9). ``OSError`` naming the
    holder when another process has it. ``data`` is created 0700, a looser one warned of;
    ``PermissionError`` when another user owns it, ``OSError`` when ``LOCK`` is a symbolic
    link (``cluster/private_files.py``: a root node must not write its pid through one)."""
    make_private_dir(data)
    check_owner(data)
    fd = open_private(data / DATA_LOCK_FILE, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise OSError(
            f"data directory {data} is in use by another raftstream node (pid {holder}):"
            " stop it first, or give this node a directory of its own"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def unlock_data_dir(fd: int) -> None:
    os.close(fd)  # the lock goes with the descriptor; the file stays (harmless)


def _tune_gc() -> None:
    """Collect less often, and never again look through what the start made.

    Each message makes short-lived objects (futures, entries, protobuf messages, acks),
    nearly all freed by reference counting, yet at the default threshold they started a
    collection every 700 allocations: 5-7 % of a stream leader's CPU under ``publish_async``
    load (about 1,300 collections in a 3-run bench, measured with ``gc.callbacks``). With
    the first generation at ``GC_GEN0_THRESHOLD``, and the modules, protobuf descriptors and
    groups of the start frozen (``gc.freeze``, so full collections skip them), the bench's
    collections took 0.08 s instead of 1.6 s over the three nodes, and R3 ``publish_async``
    gained about 7 %. Cyclic garbage is still collected, only in larger steps."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def readiness(*, was_ready: bool, meta_leader_known: bool, missing_s: float) -> bool:
    """Whether a node is ready (``READY_SERVICE``): it knows a meta leader, or it was ready
    and has known none for less than ``READY_GRACE_S`` (an election: a load balancer taking
    every node out of service for each one would turn a meta election into an outage of
    the data path, which does not need the meta group)."""
    return meta_leader_known or (was_ready and missing_s < READY_GRACE_S)


def _cannot_listen(listen: object) -> OSError:
    return OSError(
        f"cannot listen on {listen}: the port is taken (another node?) or the address is not"
        " this machine's"
    )


def check_listen(listen: Address) -> None:
    """Raise ``OSError`` (as the gRPC server would) when ``listen`` cannot be bound now: a
    port another process listens on, or an address not this machine's. A probe socket with
    SO_REUSEADDR, as gRPC's: a port left in TIME_WAIT by a node that just stopped is free.
    A name that does not resolve is left to gRPC to report."""
    try:
        infos = socket.getaddrinfo(listen.host, listen.port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError:
            raise _cannot_listen(listen) from None


async def run_node(config: NodeConfig, *, join: bool = False) -> None:
    """Run a node until SIGINT or SIGTERM, then stop it gracefully. ``join``: a node with
    no Raft data joins the running cluster as a new member (``cluster/repair.py``)."""
    # A crash in C code (gRPC, LMDB) then leaves a Python traceback in the node's log rather
    # than a silent exit.
    faulthandler.enable()
    node = Node(config=config, join=join)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.info("%s received: stopping", sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    # Start may wait a long time (a node without Raft data waits for its peers' answers):
    # a signal meanwhile abandons it (start cleans up after itself).
    starting = loop.create_task(node.start())
    stopping = loop.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        log.info("stopped while starting")
        return
    starting.result()  # its error, if it failed
    _tune_gc()
    try:
        waits = [loop.create_task(stop.wait()), loop.create_task(node.failed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
    finally:
        await node.stop(hand_over=stop.is_set())
    if node.failed.is_set():
        raise NodeFailedError(f"its Raft log can no longer be written: {node.host.failure!r}")


class NodeFailedError(Exception):
    """The node stopped on its own: its Raft host failed (``Node._check_host``)."""
