"""The cluster's members as the meta log records them: removed peers, added and forgotten nodes.

A part of ``MetaState`` (``cluster/meta/state.py``), changed only by its ``apply``, so it belongs
to the one thread or loop that applies the meta log. ``PeerRemove`` takes a peer out of
placement (``PeerAdd`` readmits it); ``NodeAdd`` adds a node, with its address, after the
cluster was formed; ``NodeForget`` takes a removed node out of the cluster for good once no
stream group names it. Each ``apply_*`` validates before it changes anything and raises
its refusal with the state unchanged, as ``MetaState.apply`` promises. Deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.config import Address
from raftstream.cluster.meta.entries import NodeAdd, NodeForget, PeerAdd, PeerRemove
from raftstream.cluster.meta.results import NodeAdded, NodeForgotten, PeerAdded, PeerRemoved
from raftstream.errors import ConflictError, InvalidArgumentError

__all__ = ["GroupsOf", "MetaMembers"]

# node -> the stream groups that name it as a peer, sorted as MetaState.streams_for_node
GroupsOf = Callable[[str], tuple[str, ...]]


class MetaMembers:
    """Removed peers, added nodes and forgotten nodes (see the module docstring)."""

    def __init__(
        self,
        *,
        removed: Iterable[str] = (),
        added: Mapping[str, str] | None = None,
        forgotten: Iterable[str] = (),
    ) -> None:
        self._removed: set[str] = set(removed)
        self._added: dict[str, str] = dict(added or {})  # node -> address: nodes NodeAdd added
        self._forgotten: set[str] = set(forgotten)  # nodes NodeForget took out for good

    # -- applying ------------------------------------------------------------------------------

    def apply_peer_remove(self, e: PeerRemove, groups_of: GroupsOf) -> PeerRemoved:
        validate_node_name(e.peer, "peer")
        newly = e.peer not in self._removed
        self._removed.add(e.peer)
        return PeerRemoved(e.peer, newly_removed=newly, groups=groups_of(e.peer))

    def apply_peer_add(self, e: PeerAdd) -> PeerAdded:
        validate_node_name(e.peer, "peer")
        readmitted = e.peer in self._removed
        self._removed.discard(e.peer)
        return PeerAdded(e.peer, readmitted=readmitted)

    def apply_node_add(self, e: NodeAdd) -> NodeAdded:
        validate_node_name(e.node, "peer")
        address = str(Address.parse(e.address, "address"))
        known = self._added.get(e.node)
        if known is not None and known != address:
            raise ConflictError(
                f"node {e.node!r} was added at {known}, not {address}", field="address"
            )
        for other, addr in self._added.items():
            if addr == address and other != e.node:
                raise ConflictError(f"node {other!r} serves on {address}", field="address")
        self._added[e.node] = address
        self._forgotten.discard(e.node)
        return NodeAdded(e.node, address, added=known is None)

    def apply_node_forget(self, e: NodeForget, groups_of: GroupsOf) -> NodeForgotten:
        validate_node_name(e.node, "peer")
        if e.node in self._forgotten:
            return NodeForgotten(e.node, forgotten=False)
        if e.node not in self._removed:
            raise ConflictError(
                f"node {e.node!r} was not removed: remove it first"
                f" (raftstream cluster peer-remove {e.node})",
                field="peer",
            )
        groups = groups_of(e.node)
        if groups:
            raise ConflictError(
                f"node {e.node!r} still holds replicas of {len(groups)} stream group(s)"
                f" ({', '.join(sorted(groups)[:5])}): wait until they are placed elsewhere",
                field="peer",
            )
        self._removed.discard(e.node)
        self._added.pop(e.node, None)
        self._forgotten.add(e.node)
        return NodeForgotten(e.node, forgotten=True)

    # -- checks --------------------------------------------------------------------------------

    def check_peers(self, peers: tuple[str, ...], replicas: int, *, exact: bool) -> None:
        """Distinct, valid, not removed; ``replicas`` of them (``exact``) or 1..``replicas``
        (an update or a repair may leave a group short while no node can take a replica)."""
        for p in peers:
            validate_node_name(p, "peers")
            if p in self._removed:
                raise InvalidArgumentError("peers", f"peer {p!r} was removed from the cluster")
        if len(set(peers)) != len(peers):
            raise InvalidArgumentError("peers", "a node may host only one replica of a group")
        if exact and len(peers) != replicas:
            raise InvalidArgumentError("peers", f"need {replicas} peers, got {len(peers)}")
        if not 1 <= len(peers) <= replicas:
            raise InvalidArgumentError("peers", f"need 1 to {replicas} peers, got {len(peers)}")

    # -- queries -------------------------------------------------------------------------------

    @property
    def removed_peers(self) -> frozenset[str]:
        return frozenset(self._removed)

    @property
    def forgotten_nodes(self) -> frozenset[str]:
        """The nodes ``NodeForget`` took out of the cluster for good."""
        return frozenset(self._forgotten)

    @property
    def added_nodes(self) -> Mapping[str, str]:
        """The nodes ``NodeAdd`` added to the cluster after it was formed, and their
        addresses (``host:port``), by name."""
        return MappingProxyType(dict(sorted(self._added.items())))
