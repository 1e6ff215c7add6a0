"""The node process: one event loop, one gRPC server, the Raft host and every group.

A ``Node`` owns, on the event loop that ran ``start()``:

- one ``grpc.aio`` server on ``listen`` serving the client API (``raftstream.v1``), the Raft
  service (``raftstream.raft.v1``, from ``raft/transport``), grpc health checking and
  server reflection, with message sizes bounded by ``limits.grpc_message_bytes_max`` and
  every client request checked, and put under a deadline, by ``cluster/security/limits.py``;
- the ``RaftHost`` driving the meta group (on every node) and the stream groups the meta
  state assigns to this node (the meta group's reconciler, ``cluster/meta/group.py``, has
  ``cluster/node/groups.py`` start and stop them);
- replica changes: the leader of each stream group this node leads moves the group's Raft
  membership toward the meta state's peers, one server at a time (``cluster/stream/membership.py``);
  a replica the meta state moved away lingers until it is out of the membership;
- the data directory: ``raft/`` holds the Raft logs of every group in one LMDB environment
  (fsynced: it is what "acknowledged" rests on), ``store/`` the engine stores of every
  stream in another, which is a cache rebuilt from the Raft logs at every start (wiped
  there), so it needs no fsync (``cluster/node/storage.py``);
- prometheus metrics on ``metrics_listen`` (when set) and structured logs (node, group,
  term on every record that has them);
- with ``[tls]``: the port speaks TLS only and requires a CA-signed certificate from every
  caller, and every channel to another node (Raft, forwarding, health probes) is mutual TLS
  with this node's certificate (docs/tls.md).

A restart rebuilds everything from the node's own data: the meta group from its snapshot
and log, then the stream groups it assigns here, each from its snapshot and log. Raft data
that fails its checks is quarantined first and the node rejoins its groups as a new member,
health NOT_SERVING until the healthy cluster has repaired it (``cluster/repair/repair.py``).

Failure: ``start`` raises (and leaves nothing running) when the port or the data directory
cannot be used. ``stop`` is graceful: on SIGTERM or SIGINT it first hands the leaderships
held here to live peers (lame duck, bounded), then health goes NOT_SERVING, the server stops
taking calls (a short grace for those in flight), then the host, the groups, transport and
storage close.

Health: the standard gRPC health service answers for ``""`` (the process serves its API:
liveness; NOT_SERVING under repair and while stopping) and for ``raftstream.ready``
(SERVING while the node knows a meta leader: readiness).

``Node`` is the face; its parts, each in a module of its own, own their state:
``NodeServer`` (``cluster/node/server.py``: the gRPC server and health), ``NodeStorage``
(``node_storage.py``: the LMDB environments and the storage room), ``NodePeers``
(``node_peers.py``: peer liveness, descriptions, addresses), ``NodeRepair``
(``node_repair.py``: the meta group's start, a repair or join), ``NodeGroups``
(``node_groups.py``: the stream groups' lifecycle, the hand-over at a planned stop) and
``NodeMonitor`` (``node_monitor.py``: leadership, readiness, a failed host, the gauges);
``ForgottenCheck`` (``node_forgotten.py``) runs once at a start without Raft data, and
``node_process.py`` holds the process's chores (the data directory's lock, the listen
check, the garbage collector's tuning).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal
from pathlib import Path

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.raft_errors import app_error
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.descriptions import DescriptionBook
from raftstream.cluster.meta.group import MetaGroup
from raftstream.cluster.node.forgotten import ForgottenCheck
from raftstream.cluster.node.groups import NodeGroups
from raftstream.cluster.node.log_format import configure_logging
from raftstream.cluster.node.monitor import NodeMonitor, release_heap
from raftstream.cluster.node.peers import NodePeers
from raftstream.cluster.node.process import (
    check_listen,
    lock_data_dir,
    tune_gc,
    unlock_data_dir,
)
from raftstream.cluster.node.repair import NodeRepair
from raftstream.cluster.node.server import READY_SERVICE, NodeServer
from raftstream.cluster.node.storage import NodeStorage
from raftstream.cluster.repair.known_peers import (
    KnownPeers,
    begin_check,
    clear_interrupted_check,
    end_check,
)
from raftstream.cluster.repair.repair import (
    RepairClient,
    RepairGate,
    prepare,
    report_cleared,
    seek_cluster,
)
from raftstream.cluster.security.auth import cluster_metadata
from raftstream.cluster.security.limits import server_options
from raftstream.cluster.services.cluster import led_group_infos
from raftstream.cluster.services.context import ServiceContext
from raftstream.cluster.services.forward import Forwarder
from raftstream.cluster.services.node import NodeServicer
from raftstream.cluster.services.node_book import NodeBook
from raftstream.cluster.services.streams import cluster_nodes
from raftstream.cluster.stream.group import StreamGroup
from raftstream.cluster.stream.membership import MembershipDriver
from raftstream.raft.errors import RaftError
from raftstream.raft.host import HostConfig, RaftHost
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

STOP_GRACE_S = 1.0


class Node:
    """One raftstream node (see the module docstring). Keyword-only: ``Node(config=...)``.
    The face of its parts: ``start`` assembles them, ``stop`` takes them down."""

    def __init__(self, *, config: NodeConfig, join: bool = False) -> None:
        self.config = config
        self._join = join  # ``raftstream server --join`` (cluster/repair/repair.py ``prepare``)
        self._known_peers = KnownPeers(Path(config.data))  # loaded at start
        self.metrics = NodeMetrics(config.name)
        # The stream groups by group id: ``NodeGroups`` changes it, the servicers read it.
        self.groups: dict[str, StreamGroup] = {}
        # Each peer's latest description (placement, cluster info), asked for by the prober.
        self._descriptions = DescriptionBook(peers=[n for n in config.peers if n != config.name])
        # The cluster's nodes and addresses: the configured peers, the meta group's founders
        # and the nodes added since (cluster/services/node_book.py); loaded at start.
        self.nodes = NodeBook(config)
        self.storage = NodeStorage(config=config, descriptions=self._descriptions)
        self.server = NodeServer(config=config, metrics=self.metrics)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        # Set when the Raft host stopped on its own (its log write failed: a full disk, an
        # I/O error): the node cannot go on, and ``run_node`` stops it
        # (``NodeMonitor.check_host``).
        self.failed = asyncio.Event()
        self._data_lock = -1  # the data directory's lock (``lock_data_dir``) while it runs

    @property
    def bound_port(self) -> int:
        """The port the gRPC server listens on (0 before it started)."""
        return self.server.bound_port

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
            await self.server.abandon()
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
        # Damaged Raft data is found and quarantined before anything opens it; the node then
        # runs no group until its peers took it out of their membership (cluster/repair/repair.py).
        self.nodes.load()
        self._descriptions.add_peers(self.nodes.peers())
        peers = self.nodes.peers()
        self._known_peers.load()
        clear_interrupted_check(data, data / "raft")
        repair_id = prepare(data, has_peers=bool(peers), join=self._join)
        tcfg, options = self._channels()
        # No Raft data: a new node, or one that lost its data (cluster/repair/known_peers.py).
        fresh = repair_id is None and not (data / "raft" / "data.mdb").exists() and bool(peers)
        if fresh:
            begin_check(data)
        self._open_raft(tcfg)
        self._assemble(repair_id)
        await self._start_server(options)
        if fresh:
            # After the server started (peers starting empty too can answer each other),
            # before any group runs: nothing has been written yet.
            await self._refuse_if_forgotten(peers, data)
        elif repair_id is not None:
            # --join: the repair waits for a running cluster's meta leader
            # (cluster/repair/repair.py).
            await self.server.set_health("", False)
            await seek_cluster(
                data,
                node_id=cfg.name,
                repair_id=repair_id,
                peers=peers,
                forwarder=self._forwarder,
                auth=cfg.auth,
            )
        self.host.start()
        self._run(repair_id, list(peers.values()))
        if cfg.metrics_listen is not None:
            await self.metrics.serve(cfg.metrics_listen.host, cfg.metrics_listen.port)
        # grpc's health service starts out SERVING: a node under repair must say it is not.
        await self.server.set_health("", self.repair.repair_id is None)
        await self.server.set_health(READY_SERVICE, False)  # the monitor sets it
        if cfg.auth is not None and cfg.auth.node_secret is None:
            log.warning(
                "[auth] has no node_secret_file: node tokens are keyed by the [auth] section, "
                "so whoever reads this config can mint them (docs/security.md)"
            )
        log.info("node started on %s (data %s)", cfg.listen, data)

    def _channels(self) -> tuple[GrpcTransportConfig, list[tuple[str, int]]]:
        """Load the TLS material and make the forwarder; returns the Raft transport's
        config and the channel options of the server and of the node's channels."""
        cfg = self.config
        # Raft streams carry the node token: a peer without [tls] knows them for a node's.
        tcfg = GrpcTransportConfig(call_metadata=cluster_metadata(cfg.auth))
        self._tls = cfg.tls.load() if cfg.tls is not None else None
        options = server_options(cfg.limits, raft_message_bytes_max=tcfg.message_bytes_max)
        self._forwarder = Forwarder(
            channel_options=[*options, *PEER_CHANNEL_BACKOFF],
            credentials=self._tls.channel_credentials() if self._tls is not None else None,
        )
        return tcfg, options

    def _open_raft(self, tcfg: GrpcTransportConfig) -> None:
        """Open the data (the engine stores wiped) and make the Raft transport and host."""
        cfg = self.config
        self.storage.open()
        peers = self.nodes.peers()
        self._transport = GrpcTransport(cfg.name, peers=peers, config=tcfg, tls=self._tls)
        self.host = RaftHost(
            cfg.name,
            storage=self.storage.log,
            transport=self._transport,
            config=_host_config(cfg),
            map_error=app_error,  # the host's errors reach cluster/ as raftstream's own
        )

    def _assemble(self, repair_id: str | None) -> None:
        """Make the node's parts over its host: peers, the meta group, the servicers'
        context, then the rest (``_assemble_groups``)."""
        cfg = self.config
        self.peers = NodePeers(
            config=cfg,
            nodes=self.nodes,
            metrics=self.metrics,
            descriptions=self._descriptions,
            known_peers=self._known_peers,
            storage=self.storage,
            forwarder=self._forwarder,
            transport=self._transport,
            host=self.host,
        )
        self.meta = MetaGroup(
            node_id=cfg.name,
            host=self.host,
            metrics=self.metrics,
            proposal_timeout_ms=cfg.raft.proposal_timeout_ms,
            client_addr=self.nodes.address,
            reconcile=lambda wanted: self.stream_groups.reconcile(wanted),
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
            peers=self.peers,
        )
        self._assemble_groups(repair_id)

    def _assemble_groups(self, repair_id: str | None) -> None:
        """The parts over the meta group: repair, stream groups, monitor."""
        cfg = self.config
        self.repair = NodeRepair(
            config=cfg,
            repair_id=repair_id,
            host=self.host,
            meta=self.meta,
            nodes=self.nodes,
            storage=self.storage,
            peers=self.peers,
            server=self.server,
        )
        self.stream_groups = NodeGroups(
            config=cfg,
            host=self.host,
            meta=self.meta,
            metrics=self.metrics,
            groups=self.groups,
            ctx=self.ctx,
            membership=self._membership,
            repair=self.repair,
            storage=self.storage,
            peers=self.peers,
            tls=self._tls,
        )
        self.monitor = NodeMonitor(
            config=cfg,
            host=self.host,
            meta=self.meta,
            metrics=self.metrics,
            ctx=self.ctx,
            groups=self.stream_groups,
            peers=self.peers,
            repair=self.repair,
            server=self.server,
            storage=self.storage,
            failed=self.failed,
            stopped=self._stopped,
        )

    async def _start_server(self, options: list[tuple[str, int]]) -> None:
        ctx = self.ctx
        node_servicer = NodeServicer(
            auth=self.config.auth,
            describe=self.peers.describe_self,
            knows=self._known_peers.__contains__,
            outsider=self.repair.outsider,
            meta_leader=self.repair.meta_leader,
            led=lambda groups: led_group_infos(ctx, groups),
            name=self.config.name,
            address=str(self.config.advertise),
        )
        await self.server.start(
            ctx=ctx,
            # No answers while repaired or checking whether it lost its data.
            gate=RepairGate(self.repair.refusing, self.peers.up_for_clients),
            node_servicer=node_servicer,
            raft_handler=self._transport.rpc_handler(),
            tls=self._tls,
            options=options,
        )

    def _run(self, repair_id: str | None, peer_addrs: list[str]) -> None:
        """Start the node's background work: the monitor, the prober, the heap's release,
        and the meta group (or, under repair, the repair that starts it)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.monitor.run(), name="leadership-monitor"),
            loop.create_task(self.peers.probe(), name="peer-prober"),
            loop.create_task(release_heap(), name="heap-release"),
        ]
        if repair_id is None:
            self.repair.start_meta()
        else:
            client = RepairClient(
                node_id=self.config.name,
                repair_id=repair_id,
                peers=peer_addrs,
                forwarder=self._forwarder,
                auth=self.config.auth,
                on_meta_term=self.repair.rejoin_meta,
                on_done=self.repair.done,
            )
            self._tasks.append(loop.create_task(client.run(), name="repair"))

    async def _refuse_if_forgotten(self, peers: dict[str, str], data: Path) -> None:
        """A node that started without Raft data: ask the peers whether they saw it running
        (``cluster/node/forgotten.py``). Meanwhile it is NOT_SERVING and answers no client.
        If a peer saw it, it lost its data: the empty Raft environment this start created
        is removed and ``DataLossError`` says to rejoin with ``--join``."""
        self.repair.checking = True
        await self.server.set_health("", False)
        try:
            await ForgottenCheck(config=self.config, peers=peers, tls=self._tls).run()
        except BaseException:  # refused, or stopped while asking: nothing may stay
            await self.host.stop()  # never started: this shuts its writer thread down
            await self._transport.close()
            await self._forwarder.close()
            self.storage.close()
            end_check(data, data / "raft")  # the environment is this start's, and empty
            raise
        end_check(data, None)
        self.repair.checking = False

    # -- stop -------------------------------------------------------------------------------

    async def stop(self, *, hand_over: bool = False) -> None:
        """Graceful stop (see the module docstring). Idempotent. ``hand_over``: first move
        this node's leaderships to its peers (``NodeGroups.hand_over``), as a planned stop does."""
        if self._stopped.is_set():
            return
        if hand_over and not self.failed.is_set() and self.host.failure is None:
            try:
                await self.stream_groups.hand_over(meta_too=self.repair.meta_started)
            except Exception:  # a stop must go on whatever the hand-over met
                log.exception("handing leaderships over failed; stopping anyway")
        self._stopped.set()
        await self.server.stop(STOP_GRACE_S)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.meta.stop()
        await self._membership.close()
        # The host first: until it stops it may apply a commit (a follower learning one) to
        # a group, and a group's store must not be closed under it (the group would halt).
        await self.host.stop()
        await self.stream_groups.close()
        await self.host.stop()  # never started: this shuts its writer thread down
        await self._transport.close()
        await self._forwarder.close()
        self.storage.close()
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


async def run_node(config: NodeConfig, *, join: bool = False) -> None:
    """Run a node until SIGINT or SIGTERM, then stop it gracefully. ``join``: a node with
    no Raft data joins the running cluster as a new member (``cluster/repair/repair.py``)."""
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
    tune_gc()
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
    """The node stopped on its own: its Raft host failed (``NodeMonitor.check_host``)."""
