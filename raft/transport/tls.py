"""Mutual TLS between nodes: credentials from PEM bytes, and who the verified peer is.

When a node has TLS configured, its one gRPC port requires a client certificate signed by
the cluster CA from every caller (gRPC's Python API can either not ask for a client
certificate or require and verify one; it cannot ask and verify only if one is given), so
TLS alone cannot tell a node from a client holding a certificate of the same CA. The Raft
service therefore also checks the certificate's role: a node certificate carries the URI SAN
``urn:raftstream:node:<name>`` (``NODE_URI_PREFIX``), and a Raft batch or snapshot is
accepted only when its ``src`` is one of the names so certified (a node cannot speak for
another). ``raftstream.certs`` issues certificates that follow this convention; the prefix
is repeated there because the transport does not import the SDK (a test checks they agree).

Revocation is not checked: a leaked node key is good until its certificate expires, or
until the cluster's CA is replaced (docs/tls.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

__all__ = ["NODE_URI_PREFIX", "PeerTls", "peer_node_names"]

NODE_URI_PREFIX = "urn:raftstream:node:"
# gRPC puts a verified peer certificate's URI SANs under ``peer_uri`` (and every SAN under
# ``x509_subject_alternative_name``, for older releases that lack the former).
_SAN_PROPERTIES = ("peer_uri", "x509_subject_alternative_name")


@dataclass(frozen=True, slots=True, repr=False)
class PeerTls:
    """A node's TLS material, PEM-encoded: the cluster CA(s) it trusts, its certificate
    (chain) and private key. ``repr`` omits everything: the key must not reach a log."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials to dial another node: verify it against the CA, present our cert."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=self.key_pem,
            certificate_chain=self.cert_pem,
        )

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials of the node's port: TLS only (plaintext is refused at the handshake)
        and a client certificate signed by the CA required from every caller."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.ca_pem,
            require_client_auth=True,
        )


def peer_node_names(context: Any) -> frozenset[str]:
    """The node names the caller's verified certificate vouches for (empty: none, e.g. a
    client certificate or a plaintext call). ``context`` is a gRPC servicer context."""
    auth = context.auth_context() or {}
    names: set[str] = set()
    for prop in _SAN_PROPERTIES:
        for raw in auth.get(prop, ()):
            value = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if value.startswith(NODE_URI_PREFIX) and len(value) > len(NODE_URI_PREFIX):
                names.add(value[len(NODE_URI_PREFIX) :])
    return frozenset(names)
