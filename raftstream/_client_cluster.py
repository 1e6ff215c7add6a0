"""The cluster operations part of ``Client``: move a stream's, a consumer's or the meta
group's leadership, remove or add a node, and the cluster's state.

``Client`` derives from ``ClusterAPI``; each method is one call through ``ClientCore._call``
(its timeout, retries and typed errors as the ``raftstream.client`` module docstring says).
"""

from __future__ import annotations

from raftstream._client_core import ClientCore
from raftstream._conn import Stubs
from raftstream.models import ClusterInfo
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["ClusterAPI"]


class ClusterAPI(ClientCore):
    """``Client``'s cluster methods (see the module docstring)."""

    # -- leaders and peers (each moves leadership once: never retried when ambiguous) --------

    async def stream_leader_stepdown(
        self, stream: str, *, preferred: str | None = None, timeout: float | None = None
    ) -> str | None:
        """Move the stream's leadership (and its consumers'); returns the new leader if
        known."""
        req = pb.StreamStepDownRequest(stream=stream, preferred=preferred or "")

        async def invoke(stubs: Stubs, left_s: float) -> str | None:
            resp = await stubs.streams.StepDownStreamLeader(req, timeout=left_s)
            return resp.leader or None

        return await self._call(stream, invoke, timeout=timeout, idempotent=False)

    async def consumer_leader_stepdown(
        self,
        stream: str,
        consumer: str,
        *,
        preferred: str | None = None,
        timeout: float | None = None,
    ) -> str | None:
        """As ``stream_leader_stepdown``: consumers replicate through their stream's group."""
        req = pb.ConsumerStepDownRequest(
            stream=stream, consumer=consumer, preferred=preferred or ""
        )

        async def invoke(stubs: Stubs, left_s: float) -> str | None:
            resp = await stubs.consumers.StepDownConsumerLeader(req, timeout=left_s)
            return resp.leader or None

        return await self._call(stream, invoke, timeout=timeout, idempotent=False)

    async def meta_leader_stepdown(
        self, *, preferred: str | None = None, timeout: float | None = None
    ) -> str | None:
        """Ask the meta leader to step down; returns the new meta leader if known."""
        req = pb.MetaStepDownRequest(preferred=preferred or "")

        async def invoke(stubs: Stubs, left_s: float) -> str | None:
            resp = await stubs.cluster.StepDownMetaLeader(req, timeout=left_s)
            return resp.leader or None

        return await self._call(None, invoke, timeout=timeout, idempotent=False)

    async def remove_peer(
        self,
        peer: str,
        *,
        refuse_online: bool = False,
        forget: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Remove a (dead) node; the meta leader re-places its replicas. Returns False when
        the node was removed already (nothing changed). ``refuse_online``: refuse
        (``PreconditionError``) when the meta leader sees the node online.

        ``forget``: also take it out of the cluster for good (out of the meta group, off
        every node's list), once no stream has a replica on it; until then
        ``PreconditionError`` says what is left (call again). Returns False when it was
        forgotten already. ``add_peer(peer, address=...)`` may add it again, empty."""
        req = pb.RemovePeerRequest(peer=peer, refuse_online=refuse_online, forget=forget)

        async def invoke(stubs: Stubs, left_s: float) -> bool:
            resp = await stubs.cluster.RemovePeer(req, timeout=left_s)
            return bool(resp.forgotten) if forget else not resp.already_removed

        return await self._call(None, invoke, timeout=timeout, idempotent=forget)

    async def add_peer(
        self, peer: str, *, address: str | None = None, timeout: float | None = None
    ) -> bool:
        """Readmit a node ``remove_peer`` took out: replicas may be placed on it again, and
        streams left short of their replica count get one on it once it is online. Returns
        False when the node was not removed (nothing changed).

        With ``address`` (``host:port``, where it serves): add a NEW node to the cluster
        under the name ``peer``; every node learns its address, and the node then starts
        empty with ``raftstream server --join`` (docs/operations.md, "Adding a node").
        Returns False when it was added already at that address (nothing changed).

        Retried when ambiguous (both are idempotent)."""
        req = pb.AddPeerRequest(peer=peer, address=address or "")

        async def invoke(stubs: Stubs, left_s: float) -> bool:
            resp = await stubs.cluster.AddPeer(req, timeout=left_s)
            return bool(resp.added if address else resp.readmitted)

        return await self._call(None, invoke, timeout=timeout, idempotent=True)

    # -- cluster ------------------------------------------------------------------------------

    async def cluster_info(self, *, timeout: float | None = None) -> ClusterInfo:
        """Nodes, the meta leader, and every group's leader and replicas with their lag."""

        async def invoke(stubs: Stubs, left_s: float) -> ClusterInfo:
            resp = await stubs.cluster.GetClusterInfo(pb.ClusterInfoRequest(), timeout=left_s)
            return ClusterInfo.from_pb(resp)

        return await self._call(None, invoke, timeout=timeout, idempotent=True)
