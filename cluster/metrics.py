"""Prometheus metrics of one node (prometheus_client), served on ``metrics_listen``.

Every metric lives in the node's own ``CollectorRegistry`` (not the process-global one), so
tests may run several nodes in one process. Labels stay low-cardinality: the RPC method and
its gRPC code, the Raft group id (one per stream), never a subject or a message id.

Group gauges (applied index, term, leader, store sizes) are refreshed by ``observe_group``,
called by the node's leadership monitor; counters move where the event happens.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

__all__ = ["NodeMetrics"]

_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class NodeMetrics:
    """The metrics of node ``node`` (a label on nothing: one registry per node)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpc_latency = Histogram(
            "raftstream_rpc_latency_seconds",
            "Client API call latency, by method and gRPC code",
            ["method", "code"],
            registry=r,
            buckets=_LATENCY_BUCKETS_S,
        )
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
            "raftstream_raft_applied_index", "Last applied index", ["group"], registry=r
        )
        self.term = Gauge("raftstream_raft_term", "Current term", ["group"], registry=r)
        self.is_leader = Gauge(
            "raftstream_raft_is_leader", "1 when this node leads the group", ["group"], registry=r
        )
        self.leader_changes = Counter(
            "raftstream_raft_leader_changes",
            "Leadership changes seen by this node",
            ["group"],
            registry=r,
        )
        self.store_msgs = Gauge(
            "raftstream_stream_messages", "Messages stored", ["group"], registry=r
        )
        self.store_bytes = Gauge("raftstream_stream_bytes", "Bytes stored", ["group"], registry=r)
        self.published = Counter(
            "raftstream_published_messages", "Messages acknowledged by PubAck", registry=r
        )
        self.publish_batch_entries = Histogram(
            "raftstream_publish_batch_entries",
            "Publishes carried per Raft entry",
            registry=r,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )

    def observe_group(self, group: str, *, applied: int, term: int, leader: bool) -> None:
        self.applied_index.labels(group).set(applied)
        self.term.labels(group).set(term)
        self.is_leader.labels(group).set(1 if leader else 0)

    def forget_group(self, group: str) -> None:
        """Drop a removed group's series (their label values would otherwise stay forever)."""
        for gauge in (
            self.applied_index,
            self.term,
            self.is_leader,
            self.store_msgs,
            self.store_bytes,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(group)

    def serve(self, host: str, port: int) -> None:
        """Serve ``/metrics`` over HTTP on ``host:port`` (a daemon thread of the library)."""
        start_http_server(port, addr=host, registry=self.registry)
