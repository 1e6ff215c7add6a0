"""A throw-away certificate authority for local TLS: a CA, node and client certificates.

For development and tests only (``raftstream certs``, ``make certs``, ``make run TLS=1``):
the CA key is written next to the certificates, validity is short (7 days by default) and
nothing can be revoked. A production cluster uses certificates from its own PKI; the node
only needs them to follow the two conventions below (docs/tls.md).

Conventions the node relies on:

- a node certificate carries the URI SAN ``urn:raftstream:node:<name>`` (``NODE_URI_PREFIX``
  + the node's name) and both extended key usages, server and client: it serves the node's
  port and dials the other nodes. The node's Raft service accepts traffic only from a peer
  whose verified certificate has such a SAN for the node named in the traffic;
- a client certificate has the client usage only and the URI SAN
  ``urn:raftstream:client:<name>``: it can call the client API but never the Raft service.

Every certificate also carries the ``hosts`` as SANs (DNS names, or IP addresses for
literals), 127.0.0.1 and localhost by default, so a client can check the node's name.
Keys are ECDSA P-256, written with mode 0600; certificates are PEM, mode 0644.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftstream.errors import InvalidArgumentError

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CLIENT_URI_PREFIX",
    "DEFAULT_HOSTS",
    "DEFAULT_VALIDITY_DAYS",
    "NODE_URI_PREFIX",
    "CertPair",
    "CertSet",
    "generate",
]

# Must equal raftstream.raft.transport.tls.NODE_URI_PREFIX (the transport does not import
# the SDK; tests/security/test_tls.py checks the two agree).
NODE_URI_PREFIX = "urn:raftstream:node:"
CLIENT_URI_PREFIX = "urn:raftstream:client:"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
DEFAULT_VALIDITY_DAYS = 7
VALIDITY_DAYS_MAX = 398  # what browsers accept for a leaf; plenty for a throw-away CA
CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
# Clocks of the machines involved may disagree a little: start validity slightly earlier.
_BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class CertPair:
    """Paths of one PEM certificate and its key."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class CertSet:
    """What ``generate`` wrote: the CA's certificate (and key), and a pair per node and client."""

    ca: Path
    ca_key: Path
    nodes: dict[str, CertPair]
    clients: dict[str, CertPair]


def generate(
    out_dir: str | Path,
    *,
    nodes: Sequence[str],
    clients: Sequence[str] = ("client",),
    hosts: Sequence[str] = DEFAULT_HOSTS,
    validity_days: int = DEFAULT_VALIDITY_DAYS,
    overwrite: bool = False,
) -> CertSet:
    """Write a new CA and certificates signed by it into ``out_dir`` (created if missing).

    Files: ``ca.pem`` and ``ca-key.pem``, ``node-<name>.pem`` and ``node-<name>-key.pem``
    per node, ``client-<name>.pem`` and ``client-<name>-key.pem`` per client. Raises
    ``InvalidArgumentError`` (nothing written) for a bad name, host or validity, or when a
    file exists and ``overwrite`` is false.
    """
    _check_args(nodes, clients, hosts, validity_days)
    out = Path(out_dir)
    names = [CA_CERT_FILE, CA_KEY_FILE]
    names += [f for n in nodes for f in (f"node-{n}.pem", f"node-{n}-key.pem")]
    names += [f for c in clients for f in (f"client-{c}.pem", f"client-{c}-key.pem")]
    if not overwrite:
        existing = [n for n in names if (out / n).exists()]
        if existing:
            raise InvalidArgumentError("dir", f"{out / existing[0]} exists (--force replaces it)")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_after = now + datetime.timedelta(days=validity_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_cert(ca_key, now - _BACKDATE, not_after)
    _write(out / CA_CERT_FILE, _cert_pem(ca_cert), 0o644)
    _write(out / CA_KEY_FILE, _key_pem(ca_key), 0o600)
    issued: dict[str, dict[str, CertPair]] = {"node": {}, "client": {}}
    for role, prefix, members in (
        ("node", NODE_URI_PREFIX, nodes),
        ("client", CLIENT_URI_PREFIX, clients),
    ):
        for name in members:
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _leaf_cert(
                ca_cert,
                ca_key,
                key,
                name=name,
                uri=prefix + name,
                hosts=hosts,
                server=role == "node",
                not_before=now - _BACKDATE,
                not_after=not_after,
            )
            pair = CertPair(out / f"{role}-{name}.pem", out / f"{role}-{name}-key.pem")
            _write(pair.cert, _cert_pem(cert), 0o644)
            _write(pair.key, _key_pem(key), 0o600)
            issued[role][name] = pair
    return CertSet(
        ca=out / CA_CERT_FILE,
        ca_key=out / CA_KEY_FILE,
        nodes=issued["node"],
        clients=issued["client"],
    )


def _check_args(
    nodes: Sequence[str], clients: Sequence[str], hosts: Sequence[str], validity_days: int
) -> None:
    for field, names in (("nodes", nodes), ("clients", clients)):
        if len(set(names)) != len(names):
            raise InvalidArgumentError(field, "a name is given twice")
        for n in names:
            # The name goes into file names and a URI: keep it to a safe alphabet.
            if not n or not all(c.isalnum() or c in "-_" for c in n) or len(n) > 64:
                raise InvalidArgumentError(field, f"{n!r}: 1 to 64 of [A-Za-z0-9_-]")
    if not nodes and not clients:
        raise InvalidArgumentError("nodes", "at least one node or client")
    if not hosts:
        raise InvalidArgumentError("hosts", "at least one host name or IP address")
    for h in hosts:
        if not h or any(c.isspace() for c in h):
            raise InvalidArgumentError("hosts", f"{h!r} is not a host name or IP address")
    if isinstance(validity_days, bool) or not 1 <= validity_days <= VALIDITY_DAYS_MAX:
        raise InvalidArgumentError("validity_days", f"must be 1 to {VALIDITY_DAYS_MAX}")


def _ca_cert(
    key: ec.EllipticCurvePrivateKey, not_before: datetime.datetime, not_after: datetime.datetime
) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "raftstream (throw-away)"),
            x509.NameAttribute(NameOID.COMMON_NAME, "raftstream local CA"),
        ]
    )
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    key: ec.EllipticCurvePrivateKey,
    *,
    name: str,
    uri: str,
    hosts: Sequence[str],
    server: bool,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.Certificate:
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
    sans += [_host_name(h) for h in hosts]
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` with ``mode`` from the first byte (a key is never world-readable, not
    even for a moment), replacing what was there."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), mode)  # the umask may have narrowed it
        fh.write(data)
