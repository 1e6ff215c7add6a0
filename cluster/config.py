"""The node configuration: a TOML file (``[cluster]``, ``[raft]``, ``[limits]``, ``[auth]``)
and CLI flags.

``load_config(path=None, **overrides)`` reads the file with ``tomllib`` (when given), lays
the flags over it (``--name --listen --data --peers ...`` map to the ``[cluster]`` keys of
the same name; a flag left at ``None`` does not override), fills in defaults and validates
everything before the node starts. Every refusal is an ``InvalidArgumentError`` whose
``field`` is the TOML key (``cluster.listen``, ``limits.payload_bytes_max``) and whose
message says where the value came from (the file's path, or the flag) and the rule broken.
Unknown sections and keys are refused, never ignored: a typo must not silently leave a
default in place.

The result is a frozen ``NodeConfig`` (keyword-only); ``docs/configuration.md`` documents
every key with its type, default and rule. Relative ``data`` paths are relative to the
working directory of the process, as a flag's would be.

Secret files (``[auth] node_secret_file``, ``[tls] key_file``, and the config file itself
when it holds ``[auth]``'s bcrypt hashes) are meant to be readable by the node only; one
readable by group or others is logged as a WARNING naming the file and its mode
(``warn_readable_secrets``), as ssh does for keys, but does not stop the node.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.security.auth_parse import parse_auth
from raftstream.cluster.security.auth_values import AuthConfig
from raftstream.cluster.security.tls import TlsSettings, parse_tls
from raftstream.errors import InvalidArgumentError

__all__ = [
    "CALL_TIMEOUT_MS_CEILING",
    "HEADERS_BYTES_CEILING",
    "INT64_MAX",
    "KIB",
    "MIB",
    "PAYLOAD_BYTES_CEILING",
    "Address",
    "Limits",
    "NodeConfig",
    "RaftSettings",
    "load_config",
    "parse_peers",
    "warn_readable_secrets",
]

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
STORAGE_BYTES_MIN = 1 * MIB
# Issue 10: the payload limit is configurable but never above 64 MiB.
PAYLOAD_BYTES_CEILING = 64 * MIB
HEADERS_BYTES_CEILING = 1 * MIB
# Every integer key is at most int64: tomllib reads integers of any size, and the node keeps
# sizes, counts and times as int64 (protobuf fields, the meta log) or size_t (LMDB's map).
INT64_MAX = 2**63 - 1
# How deep a config file's tables and arrays may nest (a legal one nests 5: a section, the
# [auth] users array, a user's table, its permissions, their lists).
CONFIG_DEPTH_MAX = 32
# A call's time becomes a gRPC deadline, an int64 count of ns since the epoch (year 2262):
# a longer one fails every forwarded call at once with DEADLINE_EXCEEDED. One year.
CALL_TIMEOUT_MS_CEILING = 365 * 24 * 3600 * 1000
# Room a gRPC message needs beyond payload and headers (subject, ids, framing).
_ENVELOPE_BYTES = 64 * KIB
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_LABEL_BYTES_MAX = 255
# Permission bits that make a secret readable by someone other than the node's user.
_SHARED_READ_BITS = stat.S_IRGRP | stat.S_IROTH
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Address:
    """A ``host:port`` (IPv6 hosts in brackets: ``[::1]:7101``). ``str()`` gives it back."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: object, field_name: str) -> Address:
        """``InvalidArgumentError(field_name, ...)`` unless ``text`` is ``host:port`` with a
        port in 1..65535 and a host without whitespace."""
        if not isinstance(text, str) or not text:
            raise InvalidArgumentError(field_name, "must be a 'host:port' string")
        host, sep, port_text = text.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
            _check_ipv6(host, field_name)
        elif ":" in host:
            raise InvalidArgumentError(field_name, f"IPv6 hosts go in brackets: {text!r}")
        if not sep or not host or any(c.isspace() or not c.isprintable() for c in host):
            raise InvalidArgumentError(field_name, f"must be 'host:port', got {text!r}")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise InvalidArgumentError(field_name, f"port must be 1 to 65535, got {text!r}")
        return cls(host, int(port_text))


def _check_ipv6(host: str, field_name: str) -> None:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        raise InvalidArgumentError(field_name, f"not an IPv6 address: {host!r}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftSettings:
    """``[raft]``: timing of every group on the node, in ticks of ``tick_ms``."""

    tick_ms: int = 100
    election_ticks: int = 6
    heartbeat_ticks: int = 1
    proposal_timeout_ms: int = 5_000
    proposals_pending_max: int = 100_000
    inbox_msgs_max: int = 200_000
    snapshot_entries: int = 10_000
    ack_linger_ms: int = 5

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "ack_linger_ms":
                _positive(f"raft.{f.name}", getattr(self, f.name))
        linger = self.ack_linger_ms
        if isinstance(linger, bool) or not isinstance(linger, int):
            raise InvalidArgumentError("raft.ack_linger_ms", "must be an integer")
        if linger > INT64_MAX:
            raise InvalidArgumentError("raft.ack_linger_ms", f"must be at most {INT64_MAX} (int64)")
        if not 0 <= linger <= self.tick_ms:
            raise InvalidArgumentError("raft.ack_linger_ms", "must be 0 to raft.tick_ms")
        if self.election_ticks <= self.heartbeat_ticks:
            # A follower must hear several heartbeats before it may time out, or a healthy
            # leader loses its followers to elections.
            raise InvalidArgumentError("raft.election_ticks", "must exceed raft.heartbeat_ticks")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """``[limits]``: every bound a client can reach, the unit in each name.

    What each bounds, its error and why: docs/limits.md; the checks: ``cluster/security/limits.py``.
    The gRPC message size is not a key: it follows from the payload and header limits
    (``grpc_message_bytes_max``), so the two cannot disagree.
    """

    payload_bytes_max: int = 1 * MIB
    headers_bytes_max: int = 64 * KIB
    headers_count_max: int = 256
    publish_batch_entries_max: int = 256
    publish_batch_bytes_max: int = 4 * MIB
    publish_async_pending_max: int = 4_096
    pull_batch_msgs_max: int = 10_000
    pull_batch_bytes_max: int = 64 * MIB
    pull_waiting_max: int = 512
    request_timeout_ms: int = 5_000
    call_timeout_max_ms: int = 60_000
    # Cluster-wide, every account together (checked by the meta leader): each stream is a
    # Raft group on its nodes, so even without [auth] account limits the count is bounded.
    streams_max: int = 10_000
    consumers_max: int = 100_000
    # Client API calls with a stream open on this node at once (Fetch, PublishStream,
    # AckStream, Consume): each holds memory until it ends, and bidi sessions have no deadline.
    streaming_calls_max: int = 4_096
    # The most each of the node's two LMDB environments (data/raft, data/store) may hold: its
    # map size (address space; the files grow as data does). Past it writes fail: a publish
    # is refused, and a Raft log that cannot be written stops the node (docs/limits.md).
    storage_bytes_max: int = 64 * GIB

    def __post_init__(self) -> None:
        for f in fields(self):
            _positive(f"limits.{f.name}", getattr(self, f.name))
        if self.storage_bytes_max < STORAGE_BYTES_MIN:
            raise InvalidArgumentError("limits.storage_bytes_max", "must be at least 1 MiB")
        if self.payload_bytes_max > PAYLOAD_BYTES_CEILING:
            raise InvalidArgumentError(
                "limits.payload_bytes_max", f"must be at most {PAYLOAD_BYTES_CEILING} (64 MiB)"
            )
        if self.headers_bytes_max > HEADERS_BYTES_CEILING:
            raise InvalidArgumentError(
                "limits.headers_bytes_max", f"must be at most {HEADERS_BYTES_CEILING} (1 MiB)"
            )
        if self.publish_batch_bytes_max < self.message_bytes_max:
            raise InvalidArgumentError(
                "limits.publish_batch_bytes_max",
                "must hold one largest message: payload_bytes_max + headers_bytes_max",
            )
        if self.call_timeout_max_ms > CALL_TIMEOUT_MS_CEILING:
            raise InvalidArgumentError(
                "limits.call_timeout_max_ms",
                f"must be at most {CALL_TIMEOUT_MS_CEILING} (1 year)",
            )
        if self.request_timeout_ms > self.call_timeout_max_ms:
            raise InvalidArgumentError(
                "limits.request_timeout_ms", "must be at most limits.call_timeout_max_ms"
            )

    @property
    def message_bytes_max(self) -> int:
        """One largest message: ``payload_bytes_max + headers_bytes_max``. A response that
        carries messages (fetch, push, +NXT) groups them only up to this many bytes
        (``cluster/services/convert.py`` ``add_bounded``)."""
        return self.payload_bytes_max + self.headers_bytes_max

    @property
    def grpc_message_bytes_max(self) -> int:
        """The gRPC message size the node sends and receives: one largest message
        (``message_bytes_max``, which also bounds the messages grouped in a response) and
        its envelope (subject, ids, framing), at least 4 MiB (the gRPC default, so small
        limits do not shrink ordinary batches). The SDK's channels take the largest this
        can be (64 MiB + 1 MiB + 64 KiB)."""
        return max(4 * MIB, self.message_bytes_max + _ENVELOPE_BYTES)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """A validated node configuration (see the module docstring and docs/configuration.md).

    ``peers`` maps every node's name to its address, this node included, sorted by name;
    ``tags`` are this node's placement tags, sorted; ``cluster_name`` is what a stream's
    ``placement.cluster`` matches.
    """

    name: str
    listen: Address
    data: Path
    peers: Mapping[str, Address]
    metrics_listen: Address | None = None
    cluster_name: str = "raftstream"
    tags: tuple[str, ...] = ()
    meta_voters_max: int = 5
    raft: RaftSettings = field(default_factory=RaftSettings)
    limits: Limits = field(default_factory=Limits)
    # [auth] (cluster/security/auth.py); None: no authentication, everything in the default account.
    auth: AuthConfig | None = None
    # [tls] (cluster/security/tls.py, docs/tls.md); None: plaintext.
    tls: TlsSettings | None = None

    def __post_init__(self) -> None:
        validate_node_name(self.name, "cluster.name")
        if not str(self.data):
            raise InvalidArgumentError("cluster.data", "must be a directory path")
        object.__setattr__(self, "peers", MappingProxyType(dict(sorted(self.peers.items()))))
        _check_peers(self)
        _check_label("cluster.cluster_name", self.cluster_name)
        for tag in self.tags:
            _check_label("cluster.tags", tag)
        if len(set(self.tags)) != len(self.tags):
            raise InvalidArgumentError("cluster.tags", "duplicate tag")
        object.__setattr__(self, "tags", tuple(sorted(self.tags)))
        if not 1 <= self.meta_voters_max <= 7:
            raise InvalidArgumentError("cluster.meta_voters_max", "must be 1 to 7")
        if self.metrics_listen is not None and self.metrics_listen == self.listen:
            raise InvalidArgumentError("cluster.metrics_listen", "must differ from listen")

    @property
    def advertise(self) -> Address:
        """The address other nodes reach this one at (its entry in ``peers``)."""
        return self.peers[self.name]


def _positive(field_name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(field_name, "must be an integer")
    if value <= 0:
        raise InvalidArgumentError(field_name, "must be positive")
    if value > INT64_MAX:
        raise InvalidArgumentError(field_name, f"must be at most {INT64_MAX} (int64)")


def _check_label(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field_name, "must be a non-empty string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgumentError(field_name, "must not contain whitespace or control characters")
    if len(value.encode("utf-8", "surrogatepass")) > _LABEL_BYTES_MAX:
        raise InvalidArgumentError(field_name, f"must be at most {_LABEL_BYTES_MAX} bytes")


def _check_peers(cfg: NodeConfig) -> None:
    """Names valid, addresses distinct, this node among them and reachable where it listens."""
    seen: dict[Address, str] = {}
    for name, addr in cfg.peers.items():
        validate_node_name(name, "cluster.peers")
        if addr in seen:
            raise InvalidArgumentError(
                "cluster.peers", f"{seen[addr]!r} and {name!r} share the address {addr}"
            )
        seen[addr] = name
    own = cfg.peers.get(cfg.name)
    if own is None:
        raise InvalidArgumentError("cluster.name", f"{cfg.name!r} is not in cluster.peers")
    # The node listens where its peers will dial it, or on every interface at that port.
    if cfg.listen.host in _WILDCARD_HOSTS:
        if cfg.listen.port != own.port:
            raise InvalidArgumentError(
                "cluster.listen", f"port {cfg.listen.port} differs from peers' {own}"
            )
    elif cfg.listen != own:
        raise InvalidArgumentError(
            "cluster.listen", f"{cfg.listen} differs from this node's peers entry {own}"
        )


def parse_peers(value: object, field_name: str = "cluster.peers") -> dict[str, Address]:
    """``n1=host:port,n2=host:port`` (the flag) or a TOML table ``{n1 = "host:port"}``."""
    pairs: list[tuple[object, object]]
    if isinstance(value, str):
        pairs = []
        for item in value.split(","):
            name, sep, addr = item.strip().partition("=")
            if not sep:
                raise InvalidArgumentError(field_name, f"expected name=host:port, got {item!r}")
            pairs.append((name.strip(), addr.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise InvalidArgumentError(field_name, "must be 'n1=host:port,...' or a table")
    if not pairs:
        raise InvalidArgumentError(field_name, "must name at least this node")
    peers: dict[str, Address] = {}
    for raw_name, raw_addr in pairs:
        name = validate_node_name(raw_name, field_name)
        if name in peers:
            raise InvalidArgumentError(field_name, f"peer {name!r} named twice")
        peers[name] = Address.parse(raw_addr, field_name)
    return peers


# -- loading --------------------------------------------------------------------------------

_SECTIONS: Mapping[str, type[Any]] = {
    "cluster": NodeConfig,
    "raft": RaftSettings,
    "limits": Limits,
    "auth": AuthConfig,
    "tls": TlsSettings,
}
_CLUSTER_KEYS = frozenset(f.name for f in fields(NodeConfig)) - {"raft", "limits", "auth", "tls"}


def load_config(path: str | Path | None = None, **overrides: Any) -> NodeConfig:
    """The validated configuration from the TOML file at ``path`` and ``overrides``.

    ``overrides`` are the ``[cluster]`` keys as CLI flags give them (``name``, ``listen``,
    ``data``, ``peers``, ``metrics_listen``, ``cluster_name``, ``tags``, ``meta_voters_max``),
    and ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file`` for the ``[tls]`` keys;
    ``None`` values are ignored. Raises ``InvalidArgumentError`` naming the TOML key, with
    the file or flag in the message, for an unreadable file, an unknown section or key, a
    missing required key, a wrong type or a broken rule.
    """
    origin = str(path) if path is not None else "defaults"
    raw = _read_toml(Path(path)) if path is not None else {}
    sources: dict[str, str] = {}
    for section, table in raw.items():
        for key in table:
            sources[f"{section}.{key}"] = origin
    cluster = dict(raw.get("cluster", {}))
    tls = dict(raw.get("tls", {}))
    for key in ("ca_file", "cert_file", "key_file"):  # --tls-ca, --tls-cert, --tls-key
        value = overrides.pop(f"tls_{key}", None)
        if value is not None:
            tls[key] = value
            sources[f"tls.{key}"] = f"--tls-{key.removesuffix('_file')}"
    for key, value in overrides.items():
        if key not in _CLUSTER_KEYS:
            raise InvalidArgumentError(f"--{key}", "unknown option", f"--{key}: unknown option")
        if value is not None:
            cluster[key] = value
            sources[f"cluster.{key}"] = f"--{key.replace('_', '-')}"
    try:
        cfg = _build(cluster, raw.get("raft", {}), raw.get("limits", {}))
        cfg = cfg if "auth" not in raw else replace(cfg, auth=parse_auth(raw["auth"]))
        tls_settings = parse_tls(tls, cfg.name)
        cfg = cfg if tls_settings is None else replace(cfg, tls=tls_settings)
    except InvalidArgumentError as exc:
        where = sources.get(exc.field)
        if where is None:  # nobody set it: missing, or a default that breaks a rule
            missing = exc.rule.startswith("is required")
            default = exc.field in _known_keys()
            where = _unset_source(exc.field, path) if missing or not default else "defaults"
        raise InvalidArgumentError(
            exc.field, exc.rule, f"{where}: {exc.field}: {exc.rule}"
        ) from None
    warn_readable_secrets(cfg, None if path is None else Path(path))
    return cfg


def warn_readable_secrets(cfg: NodeConfig, config_file: Path | None) -> list[Path]:
    """Log a WARNING for each secret file of ``cfg`` that group or others may read: the
    node secret, the TLS private key, and ``config_file`` when it holds ``[auth]`` (bcrypt
    hashes of passwords and tokens, which also key node tokens without a node secret).
    Returns those files. Never refuses: deployments that ran with looser modes keep
    starting, and the log says what to change (docs/security.md, "File modes")."""
    files: list[tuple[Path, str]] = []
    if cfg.auth is not None:
        if config_file is not None:
            files.append((config_file, "the password and token hashes of [auth]"))
        if cfg.auth.node_secret_file is not None:
            files.append((cfg.auth.node_secret_file, "the node secret ([auth] node_secret_file)"))
    if cfg.tls is not None:
        files.append((cfg.tls.key_file, "this node's TLS private key ([tls] key_file)"))
    shared = []
    for file, holds in files:
        try:
            mode = stat.S_IMODE(os.stat(file).st_mode)
        except OSError:  # read successfully a moment ago; nothing to say about it now
            continue
        if mode & _SHARED_READ_BITS:
            shared.append(file)
            log.warning(
                "%s is readable by group or others (mode %04o): it holds %s; make it "
                "readable by the node's user only (chmod 600)",
                file,
                mode,
                holds,
            )
    return shared


def _known_keys() -> set[str]:
    return {f"{s}.{f.name}" for s, cls in _SECTIONS.items() for f in fields(cls)}


def _unset_source(key: str, path: str | Path | None) -> str:
    """Where a key nobody set should have come from: the config file when there is one,
    else the flag (``cluster.peers``: ``--peers``), else the defaults."""
    if path is not None:
        return str(path)
    section, _, name = key.partition(".")
    if section == "cluster" and name in _CLUSTER_KEYS:
        return f"--{name.replace('_', '-')}"
    return "defaults"


def _read_toml(path: Path) -> dict[str, dict[str, Any]]:
    """The file's tables, or ``InvalidArgumentError`` (field ``config``) for a file that
    cannot be read, is not UTF-8, nests deeper than ``CONFIG_DEPTH_MAX`` or is not TOML:
    the command line reports it and exits 2, never with a traceback."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(
            "config", f"cannot read: {exc.strerror}", f"{path}: cannot read: {exc.strerror}"
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        rule = f"not UTF-8 at byte {exc.start}"
        raise InvalidArgumentError("config", rule, f"config file {path}: {rule}") from None
    # tomllib recurses once per level of arrays and inline tables: a file nested past
    # Python's recursion limit stops it with RecursionError; one nested less deeply, but past
    # CONFIG_DEPTH_MAX, is refused once parsed.
    try:
        raw = tomllib.loads(text)
    except RecursionError:
        _too_deep(path)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgumentError("config", f"not valid TOML: {exc}", f"{path}: {exc}") from None
    if _value_depth(raw) > CONFIG_DEPTH_MAX:
        _too_deep(path)
    for section, table in raw.items():
        if not isinstance(table, dict):  # a key before any [section] header
            where = "cluster" if section in _CLUSTER_KEYS else "a section"
            rule = f"top-level key {section!r}: keys go under a [section] header ({where})"
            raise InvalidArgumentError(section, rule, f"{path}: {rule}")
        if section not in _SECTIONS:
            rule = f"unknown section [{section}] (known: {', '.join(_SECTIONS)})"
            raise InvalidArgumentError(section, rule, f"{path}: {rule}")
    return raw


def _too_deep(path: Path) -> NoReturn:
    rule = f"nesting deeper than {CONFIG_DEPTH_MAX} levels"
    raise InvalidArgumentError("config", rule, f"config file {path}: {rule}") from None


def _value_depth(value: Any, depth: int = 0) -> int:
    """How deep ``value``'s tables and arrays nest, stopping past ``CONFIG_DEPTH_MAX``."""
    if depth > CONFIG_DEPTH_MAX:
        return depth
    if isinstance(value, dict):
        return max((_value_depth(v, depth + 1) for v in value.values()), default=depth)
    if isinstance(value, list):
        return max((_value_depth(v, depth + 1) for v in value), default=depth)
    return depth


def _build(cluster: dict[str, Any], raft: dict[str, Any], limits: dict[str, Any]) -> NodeConfig:
    _check_keys("raft", raft, RaftSettings)
    _check_keys("limits", limits, Limits)
    _check_keys("cluster", cluster, NodeConfig)
    for key in ("name", "listen", "data", "peers"):
        if key not in cluster:
            raise InvalidArgumentError(f"cluster.{key}", "is required")
    kwargs: dict[str, Any] = {
        "name": cluster["name"],
        "listen": Address.parse(cluster["listen"], "cluster.listen"),
        "data": _path(cluster["data"]),
        "peers": parse_peers(cluster["peers"]),
        "raft": RaftSettings(**raft),
        "limits": Limits(**limits),
    }
    if cluster.get("metrics_listen") is not None:
        kwargs["metrics_listen"] = Address.parse(
            cluster["metrics_listen"], "cluster.metrics_listen"
        )
    if "tags" in cluster:
        kwargs["tags"] = _tags(cluster["tags"])
    for key in ("cluster_name", "meta_voters_max"):
        if key in cluster:
            kwargs[key] = cluster[key]
    _check_types(kwargs)
    return NodeConfig(**kwargs)


def _check_keys(section: str, table: Mapping[str, Any], cls: type[Any]) -> None:
    known = {f.name for f in fields(cls)} - {"raft", "limits", "auth", "tls"}
    for key in table:
        if key not in known:
            raise InvalidArgumentError(f"{section}.{key}", "unknown key")


def _check_types(kwargs: Mapping[str, Any]) -> None:
    # Strings are checked by their rules in NodeConfig; an integer must not be a bool.
    voters = kwargs.get("meta_voters_max", 5)
    if isinstance(voters, bool) or not isinstance(voters, int):
        raise InvalidArgumentError("cluster.meta_voters_max", "must be an integer")


def _path(value: object) -> Path:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError("cluster.data", "must be a directory path")
    return Path(value)


def _tags(value: object) -> tuple[str, ...]:
    """A TOML array of strings, or the flag's comma-separated list."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",")) if value else ()
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise InvalidArgumentError("cluster.tags", "must be a list of strings")
    return tuple(value)
