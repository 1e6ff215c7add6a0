"""The ``[tls]`` section of the node configuration, checked before the node starts.

``[tls]`` has three keys, PEM file paths: ``ca_file`` (the cluster CA, or several
concatenated), ``cert_file`` (this node's certificate, optionally followed by its chain)
and ``key_file`` (its private key). All three or none: without the section the node speaks
plaintext; with it, its port speaks TLS only, requires a certificate signed by the CA from
every caller (clients and nodes alike) and accepts node-to-node calls (Raft, repair,
descriptions) only from node certificates (``raft/transport/tls.py``,
``cluster/security/auth.py`` NodeCallsInterceptor; docs/tls.md says why).

Checked at load, each refusal an ``InvalidArgumentError`` naming the key: every file is
readable and holds what it should; the key matches the certificate; the certificate is a
node certificate for this node's name (URI SAN ``urn:raftstream:node:<name>``: its peers
would refuse its Raft traffic otherwise) and within its validity period. The chain to the
CA is not checked here (intermediates may be involved): the TLS handshake checks it, and a
peer refuses a node whose chain does not verify. Files are read again when the node starts;
changing them takes a restart.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from raftstream.errors import InvalidArgumentError
from raftstream.raft.transport.tls import NODE_URI_PREFIX, PeerTls, certificate_node_names

__all__ = ["TlsSettings", "parse_tls"]

_KEYS = ("ca_file", "cert_file", "key_file")


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsSettings:
    """``[tls]``: where this node's TLS material is (relative paths: to the working dir)."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def load(self) -> PeerTls:
        """The PEM contents, for the server and every channel to a peer. Raises
        ``InvalidArgumentError`` naming the key when a file cannot be read."""
        return PeerTls(
            ca_pem=_read("tls.ca_file", self.ca_file),
            cert_pem=_read("tls.cert_file", self.cert_file),
            key_pem=_read("tls.key_file", self.key_file),
        )


def parse_tls(table: Mapping[str, Any], node_name: str) -> TlsSettings | None:
    """The checked ``[tls]`` section for node ``node_name`` (None when ``table`` is empty);
    see the module docstring for what is checked."""
    if not table:
        return None
    for key in table:
        if key not in _KEYS:
            raise InvalidArgumentError(f"tls.{key}", "unknown key")
    for key in _KEYS:
        if key not in table:
            raise InvalidArgumentError(f"tls.{key}", "is required when [tls] is present")
        value = table[key]
        if not isinstance(value, str | Path) or not str(value):
            raise InvalidArgumentError(f"tls.{key}", "must be a file path")
    settings = TlsSettings(**{k: Path(table[k]) for k in _KEYS})
    _check(settings, node_name)
    return settings


def _check(s: TlsSettings, node_name: str) -> None:
    pem = s.load()
    try:
        cas = x509.load_pem_x509_certificates(pem.ca_pem)
    except ValueError:
        raise InvalidArgumentError("tls.ca_file", "must hold PEM certificates") from None
    if not any(_is_ca(c) for c in cas):
        raise InvalidArgumentError("tls.ca_file", "holds no CA certificate")
    try:
        cert = x509.load_pem_x509_certificates(pem.cert_pem)[0]
    except ValueError:
        raise InvalidArgumentError("tls.cert_file", "must hold a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(pem.key_pem, password=None)
    except (ValueError, TypeError):
        # TypeError: an encrypted key (the node has no way to ask for a passphrase).
        raise InvalidArgumentError(
            "tls.key_file", "must hold an unencrypted PEM private key"
        ) from None
    if key.public_key() != cert.public_key():
        raise InvalidArgumentError("tls.key_file", "does not match the key of tls.cert_file")
    now = datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise InvalidArgumentError(
            "tls.cert_file",
            f"not valid now (valid {cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to "
            f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})",
        )
    uri = NODE_URI_PREFIX + node_name
    if uri not in _uris(cert):
        raise InvalidArgumentError(
            "tls.cert_file", f"is not a node certificate for {node_name!r} (no URI SAN {uri})"
        )
    if node_name not in certificate_node_names(pem.cert_pem):
        # Its peers would refuse every call from it (PERMISSION_DENIED): say so at start.
        raise InvalidArgumentError(
            "tls.cert_file",
            f"is not a node certificate for {node_name!r}: a node certificate has both the"
            " serverAuth and clientAuth extended key usages (docs/tls.md)",
        )


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def _read(field: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(field, f"cannot read {path}: {exc.strerror}") from None
