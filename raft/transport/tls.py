"""Mutual TLS between nodes: credentials from PEM bytes, and who the verified peer is.

When a node has TLS configured, its one gRPC port requires a client certificate signed by
the cluster CA from every caller (gRPC's Python API can either not ask for a client
certificate or require and verify one; it cannot ask and verify only if one is given), so
TLS alone cannot tell a node from a client holding a certificate of the same CA. The Raft
service therefore also checks the certificate's role: a node certificate carries the URI SAN
``urn:raftstream:node:<name>`` (``NODE_URI_PREFIX``) and both extended key usages, server
and client auth (it serves the node's port and dials the other nodes), and a Raft batch or
snapshot is accepted only when its ``src`` is one of the names so certified (a node cannot
speak for another). ``raftstream.tooling.certs`` issues certificates that follow this convention;
the prefix is repeated there because the transport does not import the SDK (a test checks
they agree).

The role is read from the verified peer certificate itself (``x509_pem_cert`` of gRPC's auth
context, parsed with ``cryptography``), never from gRPC's SAN lists: its
``x509_subject_alternative_name`` mixes every SAN type, so a client certificate with the
string as a DNS or e-mail SAN (which a PKI letting clients pick their names would issue)
passed for a node before (docs/security.md, "Threat model and review").

Revocation is not checked: a leaked node key is good until its certificate expires, or
until the cluster's CA is replaced (docs/tls.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

__all__ = ["NODE_URI_PREFIX", "PeerTls", "certificate_node_names", "peer_node_names"]

NODE_URI_PREFIX = "urn:raftstream:node:"
# The verified peer (leaf) certificate in gRPC's auth context, PEM-encoded.
_PEER_CERT_PROPERTY = "x509_pem_cert"
_NODE_USAGES = frozenset({ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH})
# Parsed peer certificates kept (by PEM): the check runs on every inbound node-to-node call,
# and a cluster's callers are its few nodes (plus clients, each with one certificate).
PEER_CERT_CACHE_ENTRIES_MAX = 256


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
    client certificate or a plaintext call). ``context`` is a gRPC servicer context; only
    a server that verifies client certificates against the CA (``server_credentials``)
    may rely on the answer."""
    auth = context.auth_context() or {}
    pems: list[Any] = list(auth.get(_PEER_CERT_PROPERTY) or ())
    if len(pems) != 1:  # plaintext (none); several leaves would be gRPC's bug: trust none
        return frozenset()
    raw = pems[0]
    return certificate_node_names(raw if isinstance(raw, bytes) else str(raw).encode())


@functools.lru_cache(maxsize=PEER_CERT_CACHE_ENTRIES_MAX)
def certificate_node_names(pem: bytes) -> frozenset[str]:
    """The node names a PEM certificate carries as a node certificate: the names in its URI
    SANs ``urn:raftstream:node:<name>``, when it has both the server and client auth
    extended key usages; else (or when it does not parse) none. Says nothing about the
    chain: the caller relies on the TLS handshake for that."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound, x509.DuplicateExtension):
        return frozenset()
    # Both usages, as docs/tls.md says node certificates carry: a client-auth-only
    # certificate (what clients get) is never a node, whatever names it holds.
    if not _NODE_USAGES.issubset(usages):
        return frozenset()
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    return frozenset(
        u[len(NODE_URI_PREFIX) :]
        for u in uris
        if u.startswith(NODE_URI_PREFIX) and len(u) > len(NODE_URI_PREFIX)
    )
