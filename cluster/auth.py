"""Authentication, accounts and permissions of client calls (issue 10).

The ``[auth]`` section of the node config (parsed by ``parse_auth``) declares accounts with
their limits, and users (name + bcrypt password hash) and tokens (bcrypt hash of the
token), each mapped to an account with permissions. Without ``[auth]`` nothing here runs:
every call acts in the default account ``$G`` with every permission, as before.

A client API call (``/raftstream.v1.*``) carries its credentials as gRPC metadata,
``authorization: Bearer <token>`` or ``authorization: Basic base64(user:password)``.
``AuthInterceptor`` resolves them ONCE per call into a ``Caller`` (account, permissions)
and binds it to the call's task in a context variable; ``caller()`` reads it (the
servicers reach it through ``cluster/context.py``). Missing or rejected credentials end the
call with UNAUTHENTICATED before any servicer runs. Health and reflection calls need no
credentials; node-to-node calls are guarded by ``NodeCallsInterceptor`` (below).

A node also acts for an account itself, on its own behalf: deleting an ephemeral consumer
gone inactive through the meta leader, reading a mirror's or source's origin in this cluster.
It then sends a **node token** (``node_caller``): ``Bearer rs-node.<account>.<mac>``, the MAC
an HMAC-SHA256 of the account under the cluster's node key: derived from ``[auth]
node_secret_file`` (a secret file the same on every node), or, without it, from the whole
``[auth]`` section (then whoever reads the config can mint tokens: its bcrypt hashes become
password-equivalent; docs/security.md). It grants every permission in that account, never
``$SYS``. With ``[tls]`` a node token is accepted only on a connection whose verified
certificate is a node certificate, so a minted token is worthless to a client.

Node-to-node services (Raft, repair, node descriptions: ``NODE_SERVICE_PREFIXES``) are not
client calls; ``NodeCallsInterceptor`` keeps them to nodes: with ``[tls]`` the caller's
certificate must be a node certificate, else (with ``[auth]``) the call must carry a node
token. Without either, a development cluster trusts its network. The one exception is
``NodeService.Prove`` without ``[tls]``: a node proves there that it holds the node key
before any node credentials are sent to it (``cluster/node_proof.py``), so it wants none.

bcrypt is slow on purpose (tens of milliseconds per check): a verified result is cached in
memory, bounded (``verified_cache_entries_max``), keyed by a SHA-256 of the credentials;
the plaintext is never stored, and every check runs in a worker thread, never on the
event loop. A forwarded call (``cluster/forward.py``) carries the caller's credentials
along, so the node that answers it resolves the same identity.

Secrets never reach logs, metrics, errors or ``repr()``: hashes and credentials are
excluded from the dataclasses' repr, and errors name the field, never the value.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import contextvars
import fnmatch
import hashlib
import hmac
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt
import grpc

from raftstream.cluster.handlers import rewrap
from raftstream.cluster.meta_entries import DEFAULT_ACCOUNT
from raftstream.cluster.names import validate_account
from raftstream.engine.subjects import subject_matches, validate_filter
from raftstream.errors import (
    InvalidArgumentError,
    LimitError,
    PermissionDeniedError,
    RaftStreamError,
    UnauthenticatedError,
    UnavailableError,
)
from raftstream.proto.errors import abort
from raftstream.raft.transport.tls import peer_node_names

__all__ = [
    "ANONYMOUS",
    "AUTHORIZATION_KEY",
    "LIMIT_KEYS",
    "NODE_PROVE_METHOD",
    "SYSTEM_ACCOUNT",
    "TOKEN_KEYS",
    "USER_CALLS_MAX",
    "USER_KEYS",
    "AccountLimits",
    "AuthConfig",
    "AuthInterceptor",
    "Authenticator",
    "Caller",
    "NodeCallsInterceptor",
    "Permissions",
    "Principal",
    "UserCalls",
    "acting_as",
    "bcrypt_cost",
    "bind_caller",
    "caller",
    "cluster_metadata",
    "hash_secret",
    "node_caller",
    "node_key",
    "node_token",
    "parse_auth",
]

AUTHORIZATION_KEY = "authorization"
# Cluster-wide operations (meta leader step-down, peer removal, every account's groups in
# cluster info) are for users of this account when auth is configured.
SYSTEM_ACCOUNT = "$SYS"
VERIFIED_CACHE_ENTRIES_MAX = 4096
# Integer keys of [auth] are at most int64, as cluster/config.py's: tomllib reads any size,
# and the counts and bytes they bound are int64.
_INT64_MAX = 2**63 - 1
CREDENTIALS_BYTES_MAX = 4096  # an authorization value longer than this is refused unread
# bcrypt checks running at once (worker threads): a storm of bad credentials queues here
# instead of taking every core from the node's Raft and client work.
BCRYPT_CHECKS_CONCURRENT_MAX = 2
# bcrypt checks running or queued at once: beyond, a call is refused UNAVAILABLE (retriable)
# at once rather than queued for minutes behind a storm of bad credentials.
BCRYPT_CHECKS_PENDING_MAX = 64
# Client API calls one user (account and user) has open on one node at once: one more is
# RESOURCE_EXHAUSTED before its request is read, so no one user takes every place a node
# has (streaming_calls_max, waiting fetches) from the others. Nodes acting for an account
# (node tokens) are not counted: their links and relays have bounds of their own.
USER_CALLS_MAX = 1024
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
_CLIENT_API_PREFIX = "/raftstream.v1."
log = logging.getLogger(__name__)

NODE_TOKEN_PREFIX = "rs-node."
NODE_USER = "$node"  # the user name of a node acting for an account
NODE_SECRET_BYTES_MIN = 32  # a node_secret_file shorter than this is refused
REFUSAL_LOG_INTERVAL_S = 60.0  # at most one warning this often about refused node calls
# Services only nodes call (Raft, repair after data loss, placement descriptions).
NODE_SERVICE_PREFIXES = ("/raftstream.raft.v1.", "/raftstream.repair.v1.", "/raftstream.node.v1.")
# The one node call without a node token: a node proves there that it holds the node key
# before any node credentials are sent to it (cluster/node_proof.py), so its caller (the
# meta leader adding it) sends none.
NODE_PROVE_METHOD = "/raftstream.node.v1.NodeService/Prove"


def hash_secret(secret: str, *, rounds: int = 12) -> str:
    """A bcrypt hash of ``secret`` for the config (``raftstream auth hash-password``)."""
    raw = secret.encode("utf-8")
    if not raw or len(raw) > 72:  # bcrypt reads 72 bytes at most: longer would be cut
        raise InvalidArgumentError("password", "must be 1 to 72 bytes")
    return bcrypt.hashpw(raw, bcrypt.gensalt(rounds)).decode("ascii")


def bcrypt_cost(secret_hash: bytes) -> int:
    """The cost (log2 of the rounds) of a bcrypt hash ``$2b$<cost>$...`` that parse_auth
    accepted (``_BCRYPT_HASH``)."""
    return int(secret_hash[4:6])


# -- values ----------------------------------------------------------------------------------


# Answers ``Permissions.may_publish`` keeps per subject (then it starts over): every publish
# asks, per message on a PublishStream call, and publishes repeat a few subjects.
PUBLISH_PERMISSION_MEMO_ENTRIES_MAX = 4096


@dataclass(frozen=True, slots=True, kw_only=True)
class Permissions:
    """What a user may do in its account. ``publish``: subject filters (``orders.>``,
    matched as subjects are); ``read`` (stream info, get, consume, consumer info) and
    ``manage`` (create, update, delete, purge streams and consumers; it implies ``read``):
    stream name patterns (``*`` any run of characters, ``?`` one, as shell globs). Default:
    everything."""

    publish: tuple[str, ...] = (">",)
    read: tuple[str, ...] = ("*",)
    manage: tuple[str, ...] = ("*",)
    # may_publish's answers by subject: a pure function of ``publish``, so a hit is exactly
    # what matching gives; not part of the value (equality, hash, repr).
    _publish_memo: dict[str, bool] = field(
        default_factory=dict, init=False, compare=False, hash=False, repr=False
    )

    def may_publish(self, subject: str) -> bool:
        memo = self._publish_memo
        allowed = memo.get(subject)
        if allowed is None:
            allowed = any(subject_matches(p, subject) for p in self.publish)
            if len(memo) >= PUBLISH_PERMISSION_MEMO_ENTRIES_MAX:
                memo.clear()
            memo[subject] = allowed
        return allowed

    def may_read(self, stream: str) -> bool:
        """``read`` matches, or ``manage`` does: who defines a stream may see what it made."""
        return any(fnmatch.fnmatchcase(stream, p) for p in self.read) or self.may_manage(stream)

    def may_manage(self, stream: str) -> bool:
        return any(fnmatch.fnmatchcase(stream, p) for p in self.manage)

    @property
    def may_read_all(self) -> bool:
        """Every stream name matches ``read`` or ``manage`` (a ``*`` pattern): a list need
        not be filtered."""
        return "*" in self.read or "*" in self.manage


ALL = Permissions()


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountLimits:
    """``[auth.accounts.<name>]``: limits counted across the cluster by the meta leader;
    ``None`` is unlimited. Storage is the sum of the account's streams' ``max_bytes``
    reservations times their replicas, per storage type (docs/security.md)."""

    max_streams: int | None = None
    max_consumers: int | None = None
    max_memory_bytes: int | None = None
    max_file_bytes: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """A user or a token of the config: ``secret_hash`` is the bcrypt hash (never shown)."""

    name: str
    kind: str  # "user" or "token"
    secret_hash: bytes = field(repr=False)
    account: str
    permissions: Permissions = ALL


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """The validated ``[auth]`` section (``parse_auth``)."""

    accounts: Mapping[str, AccountLimits]
    users: Mapping[str, Principal]
    tokens: tuple[Principal, ...] = ()
    verified_cache_entries_max: int = VERIFIED_CACHE_ENTRIES_MAX
    user_calls_max: int = USER_CALLS_MAX
    # The contents of node_secret_file (stripped): the key of node tokens. None: the key is
    # derived from the section itself (see node_key). Never shown.
    node_secret: bytes | None = field(default=None, repr=False)
    # Where node_secret was read from (its mode is checked at start: cluster/config.py).
    node_secret_file: Path | None = None

    def limits(self, account: str) -> AccountLimits:
        return self.accounts.get(account) or AccountLimits()


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who a call acts for: its account, user (None without auth) and permissions.
    ``credentials`` is the call's own authorization metadata, kept to forward it (never
    shown). ``system``: may run cluster-wide operations."""

    account: str
    user: str | None
    permissions: Permissions
    system: bool
    credentials: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def check_publish(self, subject: str) -> None:
        if not self.permissions.may_publish(subject):
            raise PermissionDeniedError(
                f"user {self.user!r} may not publish to {subject!r}", subject=subject
            )

    def check_read(self, stream: str) -> None:
        if not self.permissions.may_read(stream):
            raise PermissionDeniedError(
                f"user {self.user!r} may not read stream {stream!r}", stream=stream
            )

    def check_manage(self, stream: str) -> None:
        if not self.permissions.may_manage(stream):
            raise PermissionDeniedError(
                f"user {self.user!r} may not manage stream {stream!r}", stream=stream
            )

    def check_system(self, what: str) -> None:
        if not self.system:
            raise PermissionDeniedError(f"{what} is for the {SYSTEM_ACCOUNT} account")


# Without [auth]: the default account, every permission (today's behaviour).
ANONYMOUS = Caller(account=DEFAULT_ACCOUNT, user=None, permissions=ALL, system=True)
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("raftstream_caller")


def caller() -> Caller:
    """The caller of the call running in this task (``ANONYMOUS`` without auth)."""
    return _CALLER.get(ANONYMOUS)


def bind_caller(who: Caller) -> None:
    """Bind ``who`` to the current task (and the tasks it starts from now on)."""
    _CALLER.set(who)


@contextlib.contextmanager
def acting_as(who: Caller) -> Iterator[None]:
    """``who`` is the caller inside the block (its forwarded calls carry its credentials);
    the previous caller again after it."""
    token = _CALLER.set(who)
    try:
        yield
    finally:
        _CALLER.reset(token)


def node_key(config: AuthConfig) -> bytes:
    """The key of node tokens: a digest of ``node_secret_file``'s secret when set (the same
    file on every node), else of the whole [auth] section (then the section's hashes are as
    secret as the key: docs/security.md)."""
    if config.node_secret is not None:
        return hashlib.sha256(b"raftstream node token\0secret\0" + config.node_secret).digest()
    principals = [
        [p.kind, p.name, p.account, p.secret_hash.decode("ascii")]
        for p in (*config.users.values(), *config.tokens)
    ]
    text = json.dumps([sorted(config.accounts), principals], sort_keys=True)
    return hashlib.sha256(b"raftstream node token\0" + text.encode("utf-8")).digest()


def _node_mac(key: bytes, account: str) -> str:
    return hmac.new(key, account.encode("utf-8"), hashlib.sha256).hexdigest()


def node_token(config: AuthConfig | None, account: str) -> str | None:
    """The token this node sends when it acts for ``account`` (None without ``[auth]``):
    what an SDK client the node runs for the account passes as ``connect(token=...)``."""
    if config is None:
        return None
    return f"{NODE_TOKEN_PREFIX}{account}.{_node_mac(node_key(config), account)}"


def cluster_metadata(config: AuthConfig | None) -> tuple[tuple[str, str], ...]:
    """What a node sends on its node-to-node calls (Raft, repair, descriptions) so that
    ``NodeCallsInterceptor`` of a peer without ``[tls]`` knows it for a node: the node token
    of the config's first account (any account's proves the sender holds the node key);
    nothing without ``[auth]``."""
    if config is None or not config.accounts:
        return ()
    return ((AUTHORIZATION_KEY, f"Bearer {node_token(config, min(config.accounts))}"),)


def cluster_caller(config: AuthConfig | None) -> Caller:
    """This node on its own node-to-node business: its forwarded calls (``Forwarder``)
    carry ``cluster_metadata``. Use with ``acting_as``."""
    return Caller(
        account=DEFAULT_ACCOUNT,
        user=NODE_USER,
        permissions=Permissions(publish=(), read=(), manage=()),
        system=False,
        credentials=cluster_metadata(config),
    )


def node_caller(config: AuthConfig | None, account: str) -> Caller:
    """This node acting for ``account``: every permission there, and (with ``[auth]``) a
    node token as its credentials. Use with ``acting_as``."""
    token = node_token(config, account)
    if token is None:
        return Caller(account=account, user=None, permissions=ALL, system=False)
    return Caller(
        account=account,
        user=NODE_USER,
        permissions=ALL,
        system=False,
        credentials=((AUTHORIZATION_KEY, f"Bearer {token}"),),
    )


# -- parsing [auth] ----------------------------------------------------------------------------

LIMIT_KEYS = ("max_streams", "max_consumers", "max_memory_bytes", "max_file_bytes")
_PERMISSION_KEYS = ("publish", "read", "manage")
USER_KEYS = frozenset({"user", "password", "account", *_PERMISSION_KEYS})
TOKEN_KEYS = frozenset({"name", "token", "account", *_PERMISSION_KEYS})
_AUTH_KEYS = frozenset(
    {
        "accounts",
        "users",
        "tokens",
        "verified_cache_entries_max",
        "user_calls_max",
        "node_secret_file",
    }
)


def parse_auth(table: Mapping[str, Any]) -> AuthConfig:
    """The ``[auth]`` TOML table, validated; ``InvalidArgumentError`` names the key
    (``auth.users[0].password``) and the rule, never a secret's value."""
    _known("auth", table, _AUTH_KEYS)
    accounts_raw = table.get("accounts", {})
    if not isinstance(accounts_raw, Mapping):
        raise InvalidArgumentError("auth.accounts", "must be a table of accounts")
    accounts = {
        validate_account(name, "auth.accounts"): _limits(f"auth.accounts.{name}", raw)
        for name, raw in accounts_raw.items()
    }
    users: dict[str, Principal] = {}
    for i, raw in enumerate(_array("auth.users", table.get("users", []))):
        p = _principal(f"auth.users[{i}]", raw, accounts, kind="user")
        if p.name in users:
            raise InvalidArgumentError(f"auth.users[{i}].user", f"user {p.name!r} named twice")
        users[p.name] = p
    tokens = [
        _principal(f"auth.tokens[{i}]", raw, accounts, kind="token")
        for i, raw in enumerate(_array("auth.tokens", table.get("tokens", [])))
    ]
    if len({t.name for t in tokens}) != len(tokens):
        raise InvalidArgumentError("auth.tokens", "token names must be distinct")
    if not users and not tokens:
        raise InvalidArgumentError("auth", "needs at least one user or token")
    cache_max = table.get("verified_cache_entries_max", VERIFIED_CACHE_ENTRIES_MAX)
    _count("auth.verified_cache_entries_max", cache_max, minimum=1)
    user_calls_max = table.get("user_calls_max", USER_CALLS_MAX)
    _count("auth.user_calls_max", user_calls_max, minimum=1)
    return AuthConfig(
        accounts=MappingProxyType(accounts),
        users=MappingProxyType(users),
        tokens=tuple(tokens),
        verified_cache_entries_max=cache_max,
        user_calls_max=user_calls_max,
        node_secret=_node_secret(table.get("node_secret_file")),
        node_secret_file=_path_or_none(table.get("node_secret_file")),
    )


def _path_or_none(path: object) -> Path | None:
    return Path(path) if isinstance(path, str) and path else None


def _node_secret(path: object) -> bytes | None:
    """The stripped contents of ``node_secret_file`` (None when the key is absent); errors
    name the key and the rule, never the contents."""
    if path is None:
        return None
    where = "auth.node_secret_file"
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(where, "must be a file path")
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise InvalidArgumentError(where, f"cannot read {path}: {exc.strerror}") from None
    if len(secret) < NODE_SECRET_BYTES_MIN:
        raise InvalidArgumentError(
            where, f"must hold at least {NODE_SECRET_BYTES_MIN} bytes of secret (e.g. 32 random)"
        )
    return secret


def _known(where: str, table: Mapping[str, Any], keys: frozenset[str]) -> None:
    for key in table:
        if key not in keys:
            raise InvalidArgumentError(f"{where}.{key}", "unknown key")


def _array(where: str, value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise InvalidArgumentError(where, "must be an array of tables ([[...]])")
    return value


def _count(where: str, value: object, *, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(where, "must be an integer")
    if value < minimum:
        raise InvalidArgumentError(where, f"must be at least {minimum}")
    if value > _INT64_MAX:
        raise InvalidArgumentError(where, f"must be at most {_INT64_MAX} (int64)")


def _limits(where: str, raw: object) -> AccountLimits:
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(where, "must be a table")
    _known(where, raw, frozenset(LIMIT_KEYS))
    for key, value in raw.items():
        _count(f"{where}.{key}", value)
    return AccountLimits(**raw)


def _principal(
    where: str, raw: Mapping[str, Any], accounts: Mapping[str, AccountLimits], *, kind: str
) -> Principal:
    name_key, secret_key = ("user", "password") if kind == "user" else ("name", "token")
    _known(where, raw, USER_KEYS if kind == "user" else TOKEN_KEYS)
    for key in (name_key, secret_key, "account"):
        if key not in raw:
            raise InvalidArgumentError(f"{where}.{key}", "is required")
    name = raw[name_key]
    if not isinstance(name, str) or not name or not name.isprintable() or ":" in name:
        raise InvalidArgumentError(f"{where}.{name_key}", "must be printable, without ':'")
    secret = raw[secret_key]
    if not isinstance(secret, str) or not _BCRYPT_HASH.match(secret):
        # Never echo the value: it may be a plaintext secret pasted by mistake.
        raise InvalidArgumentError(
            f"{where}.{secret_key}",
            "must be a bcrypt hash (raftstream auth hash-password), never the plaintext",
        )
    account = raw["account"]
    if account not in accounts:
        raise InvalidArgumentError(
            f"{where}.account", f"{account!r} is not declared in [auth.accounts]"
        )
    perms = {k: _patterns(f"{where}.{k}", raw[k], k) for k in _PERMISSION_KEYS if k in raw}
    return Principal(
        name=name,
        kind=kind,
        secret_hash=secret.encode("ascii"),
        account=account,
        permissions=Permissions(**perms),
    )


def _patterns(where: str, value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidArgumentError(where, "must be a list of non-empty strings")
    if key == "publish":
        for v in value:
            validate_filter(v, where)
    return tuple(value)


# -- resolving credentials ---------------------------------------------------------------------


class Authenticator:
    """Resolves a call's metadata into a ``Caller``, with a bounded cache of verified
    credentials (see the module docstring). Owned by the node's event loop."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self._config = config
        self._verified: OrderedDict[bytes, Principal] = OrderedDict()
        self._checks = asyncio.Semaphore(BCRYPT_CHECKS_CONCURRENT_MAX)
        self._pending = 0  # bcrypt checks running or waiting (BCRYPT_CHECKS_PENDING_MAX)
        self._node_key = node_key(config)
        # The unknown user's decoy check must cost what a known user's does, and bcrypt's
        # cost differs per hash (a cost raised later, ``hash-password --cost``): the
        # costliest configured hash, so no real user's refusal takes longer than an
        # unknown name's. parse_auth guarantees a user or a token.
        principals = (*config.users.values(), *config.tokens)
        self._decoy_hash = max((p.secret_hash for p in principals), key=bcrypt_cost)

    async def resolve(self, metadata: Sequence[tuple[str, Any]] | None) -> Caller:
        """The caller named by ``metadata``; ``UnauthenticatedError`` when it names none
        or its secret does not verify; ``UnavailableError`` (retriable) when
        ``BCRYPT_CHECKS_PENDING_MAX`` checks are under way already."""
        values = [v for k, v in metadata or () if k == AUTHORIZATION_KEY]
        if not values:
            raise UnauthenticatedError("credentials required (user and password, or token)")
        value = values[0]
        if not isinstance(value, str) or len(value) > CREDENTIALS_BYTES_MAX:
            raise UnauthenticatedError("unreadable credentials")
        node = self.node_account(value)
        if node is not None:
            return node_caller(self._config, node)
        principal = await self._principal(value)
        return Caller(
            account=principal.account,
            user=principal.name,
            permissions=principal.permissions,
            system=principal.account == SYSTEM_ACCOUNT,
            credentials=((AUTHORIZATION_KEY, value),),
        )

    def node_account(self, value: str) -> str | None:
        """The account of a valid node token (an HMAC check: no bcrypt), else None."""
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not token.startswith(NODE_TOKEN_PREFIX):
            return None
        account, _, mac = token[len(NODE_TOKEN_PREFIX) :].rpartition(".")
        if account not in self._config.accounts:
            return None
        return account if hmac.compare_digest(mac, _node_mac(self._node_key, account)) else None

    async def _principal(self, value: str) -> Principal:
        key = hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
        hit = self._verified.get(key)
        if hit is not None:
            self._verified.move_to_end(key)
            return hit
        scheme, _, rest = value.partition(" ")
        if scheme.lower() == "bearer":
            found = await self._token(rest.strip())
        elif scheme.lower() == "basic":
            found = await self._user(rest.strip())
        else:
            found = None
        if found is None:
            raise UnauthenticatedError("credentials not accepted")
        self._verified[key] = found
        while len(self._verified) > self._config.verified_cache_entries_max:
            self._verified.popitem(last=False)
        return found

    async def _user(self, encoded: str) -> Principal | None:
        try:
            text = base64.b64decode(encoded, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        name, sep, password = text.partition(":")
        if not sep:
            return None
        user = self._config.users.get(name)
        if user is None:
            # As slow as the costliest known user's check: the time of a refusal must not
            # tell an attacker which user names exist (its result is ignored).
            await self._verify(password, self._decoy_hash)
            return None
        return user if await self._verify(password, user.secret_hash) else None

    async def _token(self, token: str) -> Principal | None:
        for t in self._config.tokens:
            if await self._verify(token, t.secret_hash):
                return t
        return None

    async def _verify(self, secret: str, secret_hash: bytes) -> bool:
        raw = secret.encode("utf-8", "surrogatepass")
        if not raw or len(raw) > 72:
            return False
        if self._pending >= BCRYPT_CHECKS_PENDING_MAX:
            raise UnavailableError("too many credential checks under way on this node; retry")
        self._pending += 1
        try:
            async with self._checks:
                # bcrypt takes tens of milliseconds by design: off the event loop.
                return await asyncio.to_thread(bcrypt.checkpw, raw, secret_hash)
        finally:
            self._pending -= 1


# -- the server interceptor --------------------------------------------------------------------


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Resolves every client API call's credentials once, before its servicer runs, and
    binds the ``Caller`` to the call's task; refuses the call with UNAUTHENTICATED when
    they do not resolve. Calls outside ``/raftstream.v1.`` pass untouched (node-to-node
    services: ``NodeCallsInterceptor``; health, reflection).

    A refused call's request is never read (``_refusal``): without credentials a caller
    holds no more of the node than its call's headers (issue 39, finding 6: 4.4 MB
    requests without credentials were received and decoded in full, then refused). A user
    with ``user_calls_max`` calls open on this node has its next one refused
    RESOURCE_EXHAUSTED, unread too (``UserCalls``).

    ``node_certificates`` (the node has ``[tls]``): a node token is accepted only on a call
    whose verified certificate is a node certificate, so whoever mints one (from a leaked
    key or config) still cannot use it from a client's connection."""

    def __init__(self, authenticator: Authenticator, *, node_certificates: bool = False) -> None:
        self._auth = authenticator
        self._node_certificates = node_certificates
        self._calls = UserCalls(authenticator.config.user_calls_max)

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or not str(handler_call_details.method).startswith(_CLIENT_API_PREFIX):
            return handler
        try:
            who = await self._auth.resolve(handler_call_details.invocation_metadata)
        except RaftStreamError as exc:  # UNAUTHENTICATED, or UNAVAILABLE when checks pile up
            return _refusal(handler, exc)
        if who.user == NODE_USER:  # a node acting for an account: not a user's call
            if self._node_certificates:
                return _bound(handler, _node_certificate_gate(who))
            return _bound(handler, lambda _context: who)
        full = self._calls.refusal(who)
        if full is not None:  # the common case refused unread; ``_bound`` counts exactly
            return _refusal(handler, full)
        return _bound(handler, lambda _context: who, calls=self._calls)


class UserCalls:
    """Client API calls open per user (account and user) on this node, at most ``bound``
    each (``[auth] user_calls_max``). A call counts from when its behaviour starts to when
    it ends: never counted in, never counted out, whatever ends the call. Owned by the
    server's event loop."""

    def __init__(self, bound: int) -> None:
        self._bound = bound
        self._open: dict[tuple[str, str | None], int] = {}

    def refusal(self, who: Caller) -> LimitError | None:
        """The error refusing one more call of ``who``, or None while it has room."""
        if self._open.get((who.account, who.user), 0) < self._bound:
            return None
        return LimitError(
            f"user {who.user!r} has user_calls_max ({self._bound}) calls open on this node;"
            " retry once some end",
            limit="user_calls_max",
        )

    def take(self, who: Caller) -> LimitError | None:
        """Count a call of ``who`` in, or the error refusing it (then nothing is counted)."""
        refused = self.refusal(who)
        if refused is None:
            key = (who.account, who.user)
            self._open[key] = self._open.get(key, 0) + 1
        return refused

    def give(self, who: Caller) -> None:
        """Count a call of ``who`` out (one ``take`` let in)."""
        key = (who.account, who.user)
        left = self._open.get(key, 0) - 1
        if left > 0:
            self._open[key] = left
        else:
            self._open.pop(key, None)  # no entry per user who has no call open

    def open_calls(self, who: Caller) -> int:
        return self._open.get((who.account, who.user), 0)


def _refusal(handler: Any, exc: RaftStreamError) -> Any:
    """A handler that ends the call with ``exc`` and never reads its request. grpc.aio
    receives and deserializes a unary request in full before it runs a unary behaviour, so
    the refusal is a request-streaming handler whatever the method's kind (the wire is the
    same: the client cannot tell): its behaviour aborts without asking for a message, and
    gRPC drops what of the request had arrived."""
    serializer = handler.response_serializer

    if handler.response_streaming:

        async def refuse_streamed(_requests: Any, context: Any) -> AsyncIterator[Any]:
            await abort(context, exc)
            yield  # (never reached: abort raises) it makes this an async generator

        return grpc.stream_stream_rpc_method_handler(
            refuse_streamed, response_serializer=serializer
        )

    async def refuse(_requests: Any, context: Any) -> Any:
        await abort(context, exc)

    return grpc.stream_unary_rpc_method_handler(refuse, response_serializer=serializer)


def _node_certificate_gate(who: Caller) -> Callable[[Any], Caller | Exception]:
    def gate(context: Any) -> Caller | Exception:
        if peer_node_names(context):
            return who
        return UnauthenticatedError("node tokens are accepted from node certificates only")

    return gate


class NodeCallsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Keeps node-to-node services (``NODE_SERVICE_PREFIXES``: Raft, repair, descriptions)
    to nodes: a client must not, say, ask the meta leader to take a healthy node out of the
    cluster as if it were under repair. With ``tls``: the caller's verified certificate must
    be a node certificate (PERMISSION_DENIED otherwise; the Raft service then also checks
    that a batch's ``src`` is the node so certified). Else, with ``authenticator`` (the
    node's ``[auth]``): the call must carry a node token (UNAUTHENTICATED otherwise); the
    node acting for it is bound as the caller, so a forward to the meta leader carries it
    on. Install it only when the node has ``[tls]`` or ``[auth]``."""

    def __init__(self, *, authenticator: Authenticator | None, tls: bool) -> None:
        self._auth = authenticator
        self._tls = tls
        self._last_warning_s = -REFUSAL_LOG_INTERVAL_S

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(NODE_SERVICE_PREFIXES):
            return handler
        if self._tls:
            return _bound(handler, _node_certificate_required)
        if method == NODE_PROVE_METHOD:
            return handler
        who: Caller | Exception = UnauthenticatedError("node-to-node calls need a node token")
        values = [
            v for k, v in handler_call_details.invocation_metadata or () if k == AUTHORIZATION_KEY
        ]
        auth = self._auth
        value = values[0] if values else None
        if auth is not None and isinstance(value, str) and len(value) <= CREDENTIALS_BYTES_MAX:
            who = cluster_caller(auth.config) if auth.node_account(value) else who
        if isinstance(who, Exception):
            self._note_refusal(method)
        return _bound(handler, lambda _context: who)

    def _note_refusal(self, method: str) -> None:
        """A warning, at most every ``REFUSAL_LOG_INTERVAL_S``: a peer whose [auth] (or
        node_secret_file) differs is refused here, and would otherwise fail silently."""
        now = time.monotonic()
        if now - self._last_warning_s >= REFUSAL_LOG_INTERVAL_S:
            self._last_warning_s = now
            log.warning(
                "refused a node-to-node call (%s) without a valid node token: a client, or a "
                "node whose [auth] node_secret_file (or section) differs from this one's",
                method,
            )


def _node_certificate_required(context: Any) -> Caller | Exception:
    if peer_node_names(context):
        return caller()
    return PermissionDeniedError("node-to-node calls need a node certificate")


Gate = Callable[[Any], "Caller | Exception"]


def _bound(handler: Any, gate: Gate, *, calls: UserCalls | None = None) -> Any:
    """``handler`` with the caller ``gate(context)`` decides bound before its behaviour runs
    (or refused with the error it returns), counted in ``calls`` while it runs when given."""

    def unary(behavior: Any) -> Any:
        return _unary(behavior, gate, calls)

    def streamed(behavior: Any) -> Any:
        return _streamed(behavior, gate, calls)

    return rewrap(
        handler,
        unary_unary=unary,
        unary_stream=streamed,
        stream_unary=unary,
        stream_stream=streamed,
    )


async def _admit(context: Any, gate: Gate, calls: UserCalls | None) -> Caller:
    """The call's caller, bound to its task and counted in ``calls``; the call is aborted
    with the error when the gate or ``calls`` refuses it."""
    who = gate(context)
    if isinstance(who, Exception):
        await abort(context, who)
    refused = calls.take(who) if calls is not None else None
    if refused is not None:
        await abort(context, refused)
    bind_caller(who)
    return who


def _unary(behavior: Callable[..., Awaitable[Any]], gate: Gate, calls: UserCalls | None) -> Any:
    async def bound(request: Any, context: Any) -> Any:
        who = await _admit(context, gate, calls)
        try:
            return await behavior(request, context)
        finally:
            if calls is not None:
                calls.give(who)

    return bound


def _streamed(
    behavior: Callable[..., AsyncIterator[Any]], gate: Gate, calls: UserCalls | None
) -> Any:
    async def bound(request: Any, context: Any) -> AsyncIterator[Any]:
        who = await _admit(context, gate, calls)
        try:
            async for item in behavior(request, context):
                yield item
        finally:
            if calls is not None:
                calls.give(who)

    return bound
