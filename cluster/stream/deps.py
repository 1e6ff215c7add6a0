"""What a stream group needs from its node: ``GroupDeps`` and the small protocols in it.

A ``StreamGroup`` (``cluster/stream/group.py``) reads the meta state, reaches the cluster's
nodes and weighs the replicas' storage room through the protocols below; the node's parts
implement them (``cluster/node/groups.py``, ``node_peers.py``, ``node_storage.py``), a test
or the whole-node simulator gives its own. ``GroupDeps`` keeps the calls the group makes
(``deps.consumers_of(...)``, ``deps.storage_room(...)``, ...) and passes each to its
protocol. Everything belongs to the node's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.config import Limits
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.raft.host import RaftHost
from raftstream.raft.transport.tls import PeerTls

__all__ = [
    "NO_FEATURES",
    "NO_LINKS",
    "NO_ROOMS",
    "ClusterLinks",
    "GroupDeps",
    "MetaView",
    "ReplicaFeatures",
    "StorageRooms",
]


class MetaView(Protocol):
    """The meta state as this node applied it, and the one change a stream group asks of
    the meta leader."""

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        """The stream's consumers (none when the stream is unknown)."""
        ...

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        """The stream's assignment; None when the meta state has no such stream."""
        ...

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        """Ask the meta leader to delete a consumer gone inactive (``inactive_threshold``);
        raises what the meta leader (or forwarding to it) raised."""
        ...


class ClusterLinks(Protocol):
    """Where this cluster's nodes serve their client API, and what a link to one sends."""

    def client_addr(self, node: str) -> str | None:
        """Node name -> its client API address (None: not known)."""
        ...

    def cluster_addrs(self) -> tuple[str, ...]:
        """This cluster's client API addresses: where a mirror/source link finds a local
        origin."""
        ...

    def link_token(self, account: str) -> str | None:
        """The credentials a link to a same-cluster origin sends for ``account`` (with
        [auth], the node token of that account; None: none)."""
        ...


class StorageRooms(Protocol):
    """The storage room of a group's replicas (``cluster/node/storage_room.py``)."""

    def storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        """(peers) -> the replica with the least storage room left and that room in bytes,
        with the reserve a publish must leave; None: not known."""
        ...

    def storage_admitted(self, size: int) -> None:
        """A publish of ``size`` bytes was admitted (it takes room before it is written)."""
        ...


class ReplicaFeatures(Protocol):
    """Which kinds of log entry the replicas read (``cluster/meta/descriptions.py``)."""

    def replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        """(peers, log feature) -> whether every one of them reads that kind of log entry
        (``LOG_FEATURES``); None: not known yet for every peer."""
        ...


class _NoLinks:
    """No address known for any node, no origin in this cluster, no credentials."""

    def client_addr(self, node: str) -> str | None:
        return None

    def cluster_addrs(self) -> tuple[str, ...]:
        return ()

    def link_token(self, account: str) -> str | None:
        return None


class _NoRooms:
    """Storage room never known: publishes are not checked against it."""

    def storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        return None

    def storage_admitted(self, size: int) -> None:
        return None


class _NoFeatures:
    """No replica is known to read any optional kind of log entry."""

    def replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        return False


NO_LINKS: ClusterLinks = _NoLinks()
NO_ROOMS: StorageRooms = _NoRooms()
NO_FEATURES: ReplicaFeatures = _NoFeatures()


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDeps:
    """What a stream group needs from its node."""

    node_id: str
    host: RaftHost
    env: Any
    limits: Limits
    metrics: NodeMetrics
    proposal_timeout_ms: int
    meta: MetaView  # the meta state's streams and consumers
    links: ClusterLinks = NO_LINKS  # the cluster's nodes' client addresses, links' tokens
    # The node's TLS (``[tls]``): mirror/source links connect with it; None: plaintext.
    client_tls: PeerTls | None = None
    rooms: StorageRooms = NO_ROOMS  # the replicas' storage room
    features: ReplicaFeatures = NO_FEATURES  # the log entries the replicas read
    # The node's clocks (a simulation gives its own): the leader's stamps come from it.
    clock: NodeClock = SYSTEM_CLOCK

    def client_addr(self, node: str) -> str | None:
        """Node name -> its client API address (``ClusterLinks``)."""
        return self.links.client_addr(node)

    def consumers_of(self, account: str, stream: str) -> tuple[ConsumerAssignment, ...]:
        """The stream's consumers in the meta state (``MetaView``)."""
        return self.meta.consumers_of(account, stream)

    def stream_of(self, account: str, stream: str) -> StreamAssignment | None:
        """The stream's assignment in the meta state (``MetaView``)."""
        return self.meta.stream_of(account, stream)

    async def delete_consumer(self, account: str, stream: str, name: str) -> None:
        """Ask the meta leader to delete a consumer gone inactive (``MetaView``)."""
        await self.meta.delete_consumer(account, stream, name)

    def cluster_addrs(self) -> tuple[str, ...]:
        """This cluster's client API addresses (``ClusterLinks``)."""
        return self.links.cluster_addrs()

    def link_token(self, account: str) -> str | None:
        """What a link to a same-cluster origin sends for ``account`` (``ClusterLinks``)."""
        return self.links.link_token(account)

    def storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        """The tightest replica among ``peers``, its room and the reserve (``StorageRooms``)."""
        return self.rooms.storage_room(peers)

    def storage_admitted(self, size: int) -> None:
        """A publish of ``size`` bytes was admitted (``StorageRooms``)."""
        self.rooms.storage_admitted(size)

    def replicas_read(self, peers: Sequence[str], feature: str) -> bool | None:
        """Whether every one of ``peers`` reads log feature ``feature`` (``ReplicaFeatures``)."""
        return self.features.replicas_read(peers, feature)
