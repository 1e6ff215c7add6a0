"""``raftstream.node.v1.NodeService``: a node's description, asked for by its peers' probers,
the groups it leads, asked for by a peer answering cluster info (``LedGroups``), and the
proof that it holds the cluster's node key, asked for by a meta leader adding it by address
(``Prove``, ``cluster/security/node_proof.py``: the one call here that needs no node token).

Node to node only (``cluster/meta/descriptions.py`` says what a description holds and why). The
service lives outside ``/raftstream.v1.``, so the client API's interceptors (accounts,
request limits, the repair gate) leave it alone: a node under repair still describes itself,
which is harmless because placement skips nodes that are not serving. With ``[auth]`` the
caller must send a node token (``cluster/security/auth.py``; an HMAC check, no bcrypt): only nodes
of the cluster learn the tags and free space (users read them in cluster info, which checks
their credentials). With ``[tls]`` the call is mutual TLS like every call between nodes,
and ``cluster/security/auth.py`` NodeCallsInterceptor refuses a caller whose certificate is not a
node certificate.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from raftstream.cluster.meta.descriptions import NodeDescription
from raftstream.cluster.security.auth_tokens import node_token
from raftstream.cluster.security.auth_values import AUTHORIZATION_KEY, AuthConfig
from raftstream.cluster.security.node_proof import node_proof
from raftstream.errors import PreconditionError, UnauthenticatedError, UnavailableError
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.proto import raftstream_pb2 as pb
from raftstream.proto.errors import map_errors

__all__ = [
    "NodeServicer",
    "asker_standing",
    "describe_peer",
    "knows_asker",
    "led_groups",
    "probe_metadata",
]


def probe_metadata(auth: AuthConfig | None) -> tuple[tuple[str, str], ...]:
    """What a prober sends with ``Describe``: nothing without ``[auth]``, else a node token
    of the config's first account (any account's token proves the sender holds the
    cluster's ``[auth]`` section; it grants nothing here but the description)."""
    if auth is None or not auth.accounts:
        return ()
    token = node_token(auth, min(auth.accounts))
    return ((AUTHORIZATION_KEY, f"Bearer {token}"),)


class NodeServicer(npbg.NodeServiceServicer):
    """Answers ``Describe`` with ``describe()`` (called per request: free space is measured
    then), ``knows(asker)`` (``cluster/repair/known_peers.py``) and ``outsider(asker)`` (the
    asker did not found this node's cluster: ``cluster/services/node_book.py``) and
    ``meta_leader()``, ``LedGroups`` with ``led(groups)``, and ``Prove`` as node ``name``
    reached at ``address`` (its own entry in ``peers``). Keyword-only:
    ``NodeServicer(auth=..., describe=..., knows=..., outsider=..., meta_leader=...,
    led=..., name=..., address=...)``."""

    def __init__(
        self,
        *,
        auth: AuthConfig | None,
        describe: Callable[[], NodeDescription],
        knows: Callable[[str], bool] = lambda name: False,
        outsider: Callable[[str], bool] = lambda name: False,
        meta_leader: Callable[[], str | None] = lambda: None,
        led: Callable[[Sequence[str]], list[pb.GroupInfo]] = lambda groups: [],
        name: str = "",
        address: str = "",
    ) -> None:
        self._auth = auth
        self._name = name
        self._address = address
        # The authorization value of each account's node token (an HMAC: no bcrypt).
        self._accepted = (
            None
            if auth is None
            else tuple(f"Bearer {node_token(auth, a)}".encode() for a in sorted(auth.accounts))
        )
        self._describe = describe
        self._knows = knows  # whether this node has seen the asker running before
        self._outsider = outsider  # whether the asker is not a founder of this cluster
        self._meta_leader = meta_leader
        self._led = led  # the infos of the groups asked for that this node leads

    @map_errors
    async def Describe(self, request: npb.DescribeRequest, context: Any) -> npb.NodeDescription:
        if self._accepted is not None:
            self._check_node(context.invocation_metadata(), self._accepted)
        try:
            desc = self._describe()
        except OSError as exc:  # the data directory cannot be examined right now
            raise UnavailableError(f"cannot measure free space: {exc.strerror}") from None
        out = desc.to_pb()
        out.knows_asker = self._knows(request.asker)
        out.asker_outsider = bool(request.asker) and self._outsider(request.asker)
        out.meta_leader = self._meta_leader() or ""
        return out

    @map_errors
    async def LedGroups(self, request: npb.LedGroupsRequest, context: Any) -> npb.LedGroupsResponse:
        if self._accepted is not None:
            self._check_node(context.invocation_metadata(), self._accepted)
        return npb.LedGroupsResponse(groups=self._led(list(request.groups)))

    @map_errors
    async def Prove(self, request: npb.ProveRequest, context: Any) -> npb.ProveResponse:
        # No node token here (cluster/security/auth.py NodeCallsInterceptor lets this call through):
        # the answer proves this node holds the node key, and is worth nothing as a token.
        if self._auth is None:
            raise PreconditionError("this node has no [auth]: it holds no node key to prove")
        proof = node_proof(self._auth, bytes(request.nonce), self._name, self._address)
        return npb.ProveResponse(name=self._name, address=self._address, proof=proof)

    @staticmethod
    def _check_node(metadata: Any, accepted: tuple[bytes, ...]) -> None:
        values = [v for k, v in metadata or () if k == AUTHORIZATION_KEY]
        given = str(values[0]).encode("utf-8", "surrogatepass") if values else b""
        # Every candidate is compared, in constant time each: no early exit to time.
        ok = [hmac.compare_digest(given, want) for want in accepted]
        if not any(ok):
            raise UnauthenticatedError("node calls are for nodes (node token required)")


async def describe_peer(
    stub: npbg.NodeServiceStub,
    *,
    asker: str,
    metadata: tuple[tuple[str, str], ...],
    timeout_s: float,
) -> NodeDescription:
    """Ask one peer for its description. ``grpc.RpcError`` when the call fails;
    ``InvalidArgumentError`` when the answer breaks a rule."""
    resp = await stub.Describe(
        npb.DescribeRequest(asker=asker), metadata=metadata, timeout=timeout_s
    )
    return NodeDescription.from_pb(resp)


async def knows_asker(
    stub: npbg.NodeServiceStub,
    *,
    asker: str,
    metadata: tuple[tuple[str, str], ...],
    timeout_s: float,
) -> bool | None:
    """Whether the peer has seen ``asker`` running before (``cluster/repair/known_peers.py``);
    None when it did not answer."""
    standing = await asker_standing(stub, asker=asker, metadata=metadata, timeout_s=timeout_s)
    return None if standing is None else standing[0]


async def asker_standing(
    stub: npbg.NodeServiceStub,
    *,
    asker: str,
    metadata: tuple[tuple[str, str], ...],
    timeout_s: float,
) -> tuple[bool, bool] | None:
    """(the peer has seen ``asker`` running before, the peer runs a cluster ``asker`` did
    not found: ``NodeDescription.asker_outsider``); None when it did not answer."""
    try:
        resp = await stub.Describe(
            npb.DescribeRequest(asker=asker), metadata=metadata, timeout=timeout_s
        )
    except grpc.RpcError:
        return None
    return bool(resp.knows_asker), bool(resp.asker_outsider)


async def led_groups(
    stub: npbg.NodeServiceStub,
    groups: Sequence[str],
    *,
    metadata: tuple[tuple[str, str], ...],
    timeout_s: float,
) -> list[pb.GroupInfo]:
    """The infos of the groups among ``groups`` that the peer leads, as it sees them; none
    when it does not answer (an older node without ``LedGroups`` included)."""
    try:
        resp = await stub.LedGroups(
            npb.LedGroupsRequest(groups=groups), metadata=metadata, timeout=timeout_s
        )
    except grpc.RpcError:
        return []
    return list(resp.groups)
