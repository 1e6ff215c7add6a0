"""Prometheus metrics of one node (prometheus_client), served on ``metrics_listen``.

Every metric lives in the node's own ``CollectorRegistry`` (not the process-global one), so
tests may run several nodes in one process. Labels stay low-cardinality: the RPC method and
its gRPC code, the Raft group id (one per stream), never a subject or a message id.

Group gauges (applied index, term, leader, store sizes) are refreshed by ``observe_group``,
called by the node's leadership monitor; counters move where the event happens. What a
group's leader alone knows (how far each replica is behind, each consumer's backlog) is
refreshed less often (``observe_led``): a series is exported by the node leading its group
and dropped when it stops leading, so a sum over the cluster counts each once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from raftstream.cluster.common.handlers import rewrap
from raftstream.cluster.common.metrics_http import METRICS_PATH, MetricsServer
from raftstream.cluster.common.names import split_group_id
from raftstream.proto.errors import ABORT_REASON

__all__ = [
    "CONSUMER_GAUGES",
    "GROUP_LABELS",
    "METRICS_PATH",
    "ConsumerNumbers",
    "LatencyInterceptor",
    "NodeMetrics",
    "group_labels",
]

# Every per-group series: the Raft group id, and a stream group's account and stream apart
# (empty for the meta group), so a query can sum or filter by stream without parsing ids.
GROUP_LABELS = ("group", "account", "stream")


def group_labels(group: str) -> tuple[str, str, str]:
    """The ``GROUP_LABELS`` values of Raft group ``group``."""
    return (group, *(split_group_id(group) or ("", "")))


# (field of ConsumerNumbers, metric name, help), labelled by group and consumer.
CONSUMER_GAUGES = (
    (
        "pending",
        "raftstream_consumer_pending_messages",
        "Stored messages the consumer has yet to deliver (num_pending)",
    ),
    (
        "ack_pending",
        "raftstream_consumer_ack_pending_messages",
        "Delivered messages awaiting their ack (num_ack_pending)",
    ),
    (
        "redelivered",
        "raftstream_consumer_redelivered_messages",
        "Messages awaiting an ack that were delivered more than once (num_redelivered)",
    ),
    (
        "waiting",
        "raftstream_consumer_waiting_requests",
        "Pull requests waiting for messages (num_waiting)",
    ),
    (
        "delivered_seq",
        "raftstream_consumer_delivered_stream_sequence",
        "Stream sequence of the last delivery",
    ),
    (
        "ack_floor_seq",
        "raftstream_consumer_ack_floor_stream_sequence",
        "Stream sequence at and below which every delivery is acknowledged",
    ),
)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerNumbers:
    """One consumer's figures for ``CONSUMER_GAUGES`` (from its leader's info)."""

    pending: int
    ack_pending: int
    redelivered: int
    waiting: int
    delivered_seq: int
    ack_floor_seq: int


_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class NodeMetrics:
    """The metrics of node ``node`` (a label on nothing: one registry per node)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self._http: MetricsServer | None = None
        # The (group, peer) and (group, consumer) series the last observe_led set.
        self._lag_keys: set[tuple[str, str]] = set()
        self._consumer_keys: set[tuple[str, str]] = set()
        r = self.registry
        # Registered in this order, which is the order of the families on /metrics.
        self.rpc_latency = Histogram(
            "raftstream_rpc_latency_seconds",
            "Client API call latency, by method, gRPC code and raftstream reason (empty for"
            " OK; NOT_LEADER is a redirect the client follows, not a failure)",
            ["method", "code", "reason"],
            registry=r,
            buckets=_LATENCY_BUCKETS_S,
        )
        self._register_raft(r)
        self._register_node(r)
        self._register_led(r)
        self._register_loop(r)

    def _register_raft(self, r: CollectorRegistry) -> None:
        """Raft: proposals and commits by group kind, and each group's state on this node."""
        self.proposals = Counter(
            "raftstream_raft_proposals", "Raft proposals made, by group kind", ["kind"], registry=r
        )
        self.proposal_failures = Counter(
            "raftstream_raft_proposal_failures",
            "Raft proposals that failed or timed out, by group kind",
            ["kind"],
            registry=r,
        )
        self.commits = Counter(
            "raftstream_raft_committed_entries",
            "Committed Raft entries applied, by group kind",
            ["kind"],
            registry=r,
        )
        self.applied_index = Gauge(
            "raftstream_raft_applied_index", "Last applied index", GROUP_LABELS, registry=r
        )
        self.term = Gauge("raftstream_raft_term", "Current term", GROUP_LABELS, registry=r)
        self.is_leader = Gauge(
            "raftstream_raft_is_leader",
            "1 when this node leads the group",
            GROUP_LABELS,
            registry=r,
        )
        self.halted = Gauge(
            "raftstream_raft_group_halted",
            "1 when the group stopped on this node (a failed apply: a full store, a bug); "
            "restart the node once the cause is gone",
            GROUP_LABELS,
            registry=r,
        )
        self.leader_changes = Counter(
            "raftstream_raft_leader_changes",
            "Leadership changes seen by this node",
            GROUP_LABELS,
            registry=r,
        )

    def _register_node(self, r: CollectorRegistry) -> None:
        """Stores, publishes, peers' health, storage room, and the node's process."""
        self.store_msgs = Gauge(
            "raftstream_stream_messages", "Messages stored", GROUP_LABELS, registry=r
        )
        self.store_bytes = Gauge(
            "raftstream_stream_bytes", "Bytes stored", GROUP_LABELS, registry=r
        )
        self.published = Counter(
            "raftstream_published_messages", "Messages acknowledged by PubAck", registry=r
        )
        self.peer_up = Gauge(
            "raftstream_peer_up",
            "1 while the peer answers this node's health probes; 0 once it has not for "
            "the time after which it counts as down",
            ["peer"],
            registry=r,
        )
        self.storage_room = Gauge(
            "raftstream_storage_room_bytes",
            "Bytes this node can still store: the least of the disk's free space and each "
            "LMDB map's unused room (publishes are refused below a reserve: docs/limits.md)",
            registry=r,
        )
        ProcessCollector(registry=r)  # CPU, memory, open files of the node's process
        PlatformCollector(registry=r)

    def _register_led(self, r: CollectorRegistry) -> None:
        """What only a group's leader knows (``observe_led``): replica lag, consumer backlog."""
        self.peer_lag = Gauge(
            "raftstream_raft_peer_lag_entries",
            "Entries a replica's log is behind its leader's (exported by the group's leader)",
            [*GROUP_LABELS, "peer"],
            registry=r,
        )
        self.consumer_gauges = [
            Gauge(
                name,
                f"{doc} (exported by the stream's leader)",
                [*GROUP_LABELS, "consumer"],
                registry=r,
            )
            for _, name, doc in CONSUMER_GAUGES
        ]

    def _register_loop(self, r: CollectorRegistry) -> None:
        """The node's event loop lag and how many publishes a Raft entry carries."""
        self.loop_lag = Histogram(
            "raftstream_event_loop_lag_seconds",
            "How late the node's event loop woke a timer set every half Raft tick: time it was busy"
            " with one callback (a long apply, a snapshot step) while every group waited",
            registry=r,
            buckets=_LATENCY_BUCKETS_S,
        )
        self.publish_batch_entries = Histogram(
            "raftstream_publish_batch_entries",
            "Publishes carried per Raft entry",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )

    def observe_led(
        self,
        lags: dict[tuple[str, str], int],
        consumers: dict[tuple[str, str], ConsumerNumbers],
    ) -> None:
        """Set what the groups this node leads know, and drop every series of the last call
        not in this one (a group no longer led here, a consumer or peer gone).

        ``lags``: (group, peer) -> entries the peer's log is behind the leader's;
        ``consumers``: (group, consumer) -> its figures."""
        for (group, peer), lag in lags.items():
            self.peer_lag.labels(*group_labels(group), peer).set(lag)
        for (group, consumer), nums in consumers.items():
            labels = (*group_labels(group), consumer)
            for gauge, (field, _, _) in zip(self.consumer_gauges, CONSUMER_GAUGES, strict=True):
                gauge.labels(*labels).set(getattr(nums, field))
        for group, peer in self._lag_keys - lags.keys():
            with contextlib.suppress(KeyError):
                self.peer_lag.remove(*group_labels(group), peer)
        for group, consumer in self._consumer_keys - consumers.keys():
            for gauge in self.consumer_gauges:
                with contextlib.suppress(KeyError):
                    gauge.remove(*group_labels(group), consumer)
        self._lag_keys = set(lags)
        self._consumer_keys = set(consumers)

    def observe_group(
        self, group: str, *, applied: int, term: int, leader: bool, halted: bool = False
    ) -> None:
        """A halted group leads nothing, whatever its last role (it showed as leader). The
        group's leader-change counter is shown from the start (0), not from its first
        change, so a rate over it has a series to start from."""
        labels = group_labels(group)
        self.leader_changes.labels(*labels)
        self.applied_index.labels(*labels).set(applied)
        self.term.labels(*labels).set(term)
        self.is_leader.labels(*labels).set(1 if leader and not halted else 0)
        self.halted.labels(*labels).set(1 if halted else 0)

    def observe_store(self, group: str, *, msgs: int, size_bytes: int) -> None:
        """What a stream group's replica here stores."""
        labels = group_labels(group)
        self.store_msgs.labels(*labels).set(msgs)
        self.store_bytes.labels(*labels).set(size_bytes)

    def leader_changed(self, group: str) -> None:
        self.leader_changes.labels(*group_labels(group)).inc()

    def forget_group(self, group: str) -> None:
        """Drop a removed group's series (their label values would otherwise stay forever)."""
        for gauge in (
            self.applied_index,
            self.term,
            self.is_leader,
            self.halted,
            self.store_msgs,
            self.store_bytes,
            self.leader_changes,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*group_labels(group))

    async def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` over HTTP on ``host:port`` from the running event loop, each
        connection bounded in count, time and size (``cluster/common/metrics_http.py``); any other
        path is 404 naming ``/metrics``. ``OSError`` naming the address and the key when it
        cannot listen there."""
        server = MetricsServer(self.registry)
        await server.start(host, port)
        self._http = server

    async def close(self) -> None:
        """Stop serving (a node's metrics live as long as its process; tests close them)."""
        http, self._http = self._http, None
        if http is not None:
            await http.close()


def _code_name(context: Any) -> str:
    code = context.code()
    if code is None:
        return "OK"
    return str(getattr(code, "name", code))


class LatencyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Observes every client API call's duration (a streamed call: until it ends) in
    ``rpc_latency`` by method, final gRPC code and the reason the call was refused with
    (``ABORT_REASON``: an alert on UNAVAILABLE can leave out NOT_LEADER, the redirects a
    client follows). The Raft service and health checks are left out: they are not client
    calls."""

    def __init__(self, metrics: NodeMetrics, *, prefix: str = "/raftstream.v1.") -> None:
        self._m = metrics
        self._prefix = prefix

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(self._prefix):
            return handler
        name = method.rsplit("/", 1)[-1]
        return rewrap(
            handler,
            unary_unary=lambda behavior: self._unary(name, behavior),
            unary_stream=lambda behavior: self._streamed(name, behavior),
            # (a call refused before its request is read: cluster/security/auth.py ``_refusal``)
            stream_unary=lambda behavior: self._unary(name, behavior),
            stream_stream=lambda behavior: self._streamed(name, behavior),
        )

    def _unary(self, name: str, behavior: Callable[..., Awaitable[Any]]) -> Any:
        async def timed(request: Any, context: Any) -> Any:
            start = time.perf_counter()
            try:
                return await behavior(request, context)
            finally:
                self._observe(name, context, start)

        return timed

    def _streamed(self, name: str, behavior: Callable[..., AsyncIterator[Any]]) -> Any:
        async def timed(request: Any, context: Any) -> AsyncIterator[Any]:
            start = time.perf_counter()
            try:
                async for item in behavior(request, context):
                    yield item
            finally:
                self._observe(name, context, start)

        return timed

    def _observe(self, name: str, context: Any, start: float) -> None:
        elapsed = time.perf_counter() - start
        code = _code_name(context)
        reason = ABORT_REASON.get() if code != "OK" else ""
        self._m.rpc_latency.labels(name, code, reason).observe(elapsed)
