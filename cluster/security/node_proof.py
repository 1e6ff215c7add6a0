"""Proof that a server is a node of this cluster, before node credentials go to it (issue 39).

Every call a node makes as a node (Raft, repair, descriptions, forwards, a mirror or
source link reading a local origin) sends a node token to an address of the node book
(``cluster/services/node_book.py``): the operator's configured ``peers``, or a node added with
``AddPeer`` and an address. Without ``[tls]`` nothing in the connection says who answers,
so an address a ``$SYS`` user named would get node tokens, and with them every account.
So, with ``[auth]`` and without ``[tls]``, the meta leader adds a node by address only
once the server there has proven it holds the cluster's node key (``check_new_node``):

1. the meta leader sends ``NodeService.Prove`` a fresh random nonce, with NO credentials
   (on a bare channel: neither a node token nor the ``$SYS`` caller's own credentials);
2. the server answers its name, its address (its own entry in ``peers``) and an
   HMAC-SHA256 over the nonce, the name and the address, under a key derived from the node
   key (``node_proof``): a key of its own, so a proof is never a node token;
3. the meta leader recomputes it and compares in constant time; the name and the address
   must be the ones requested. Otherwise the add is refused and nothing changes.

A relay at another address passing the challenge on to a real node gets that node's
own name and address proven, never the ones requested; a node that answers for a name
proves only the name it has. With ``[tls]`` the node certificate is the identity instead
(docs/security.md, "Threat model and review").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets

import grpc

from raftstream.cluster.security.auth_interceptors import NODE_PROVE_METHOD
from raftstream.cluster.security.auth_tokens import node_key
from raftstream.cluster.security.auth_values import AuthConfig
from raftstream.errors import InvalidArgumentError, PermissionDeniedError, PreconditionError
from raftstream.proto import node_pb2 as npb
from raftstream.proto import node_pb2_grpc as npbg

__all__ = [
    "NONCE_BYTES",
    "NONCE_BYTES_MAX",
    "NONCE_BYTES_MIN",
    "PROVE_METHOD",
    "PROVE_TIMEOUT_S",
    "check_new_node",
    "node_proof",
]

PROVE_METHOD = NODE_PROVE_METHOD
NONCE_BYTES = 32  # what the meta leader sends
NONCE_BYTES_MIN = 16  # what a node answers: a short nonce would let answers be collected
NONCE_BYTES_MAX = 64
PROVE_TIMEOUT_S = 5.0  # the challenge's call, at most (less when the request has less left)
# An answer holds a name, an address and a digest: a few hundred bytes.
PROVE_MESSAGE_BYTES_MAX = 4096


def _proof_key(config: AuthConfig) -> bytes:
    # Derived, not the token key itself: an HMAC a node answers to anyone's nonce must never
    # be usable as a node token (a token is an HMAC of an account name under the node key).
    return hashlib.sha256(b"raftstream node proof\0" + node_key(config)).digest()


def node_proof(config: AuthConfig, nonce: bytes, name: str, address: str) -> bytes:
    """The proof that the holder of ``config``'s node key answers as node ``name`` at
    ``address`` to ``nonce``."""
    if not NONCE_BYTES_MIN <= len(nonce) <= NONCE_BYTES_MAX:
        raise InvalidArgumentError("nonce", f"must be {NONCE_BYTES_MIN} to {NONCE_BYTES_MAX} bytes")
    text = json.dumps([nonce.hex(), name, address]).encode("utf-8")
    return hmac.new(_proof_key(config), text, hashlib.sha256).digest()


async def check_new_node(
    config: AuthConfig, *, name: str, address: str, timeout_s: float = PROVE_TIMEOUT_S
) -> None:
    """Return once the server at ``address`` proved it is node ``name`` of this cluster
    (module docstring). ``PreconditionError`` when it cannot be asked (not reachable,
    or a version without ``Prove``): start it first; ``PermissionDeniedError`` when its
    answer is not the proof. Sends no credentials of any kind."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    options = [("grpc.max_receive_message_length", PROVE_MESSAGE_BYTES_MAX)]
    # A bare channel and no metadata: nothing of this node's or of the caller's goes out.
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = npbg.NodeServiceStub(channel)
        try:
            resp = await stub.Prove(npb.ProveRequest(nonce=nonce), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise _unasked(name, address, exc) from None
    if resp.name != name or resp.address != address:
        raise PermissionDeniedError(
            f"the server at {address} answers as node {resp.name!r} at {resp.address!r}, not"
            f" {name!r} at {address}: with [auth] and without [tls] a node is added by"
            " address only once it proves its name and address (its own entry in peers)"
        )
    if not hmac.compare_digest(resp.proof, node_proof(config, nonce, name, address)):
        raise PermissionDeniedError(
            f"the server at {address} did not prove it is a node of this cluster: with [auth]"
            " and without [tls] a node is added by address only once it proves it holds the"
            " cluster's node key (the same [auth] node_secret_file, or section)"
        )


def _unasked(name: str, address: str, exc: grpc.RpcError) -> PreconditionError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError | grpc.Call) else None
    if code == grpc.StatusCode.UNIMPLEMENTED:
        why = "runs a version that cannot prove it is a node: upgrade it"
    else:
        why = f"did not answer ({code.name if code is not None else 'no status'})"
    return PreconditionError(
        f"cannot add node {name!r}: the server at {address} {why}. With [auth] and without"
        f" [tls] a node is added by address only once it proves it is a node of this cluster:"
        f" start it first (raftstream server ... --join, with this cluster's [auth]), then add"
        " it"
    )
