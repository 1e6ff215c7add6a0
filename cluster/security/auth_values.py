"""Who a call acts for: permissions, account limits, principals, the ``[auth]`` config
value, and the ``Caller`` bound to the running call's task (``caller``, ``acting_as``).

Plain values and one context variable, no IO: ``cluster/security/auth_credentials.py`` resolves a
call's credentials into a ``Caller`` and ``cluster/security/auth_interceptors.py`` binds it before
the servicer runs. Without ``[auth]`` every call is ``ANONYMOUS``: the default account, every
permission. Secrets (hashes, credentials) are excluded from the dataclasses' repr.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from raftstream.cluster.common.names import DEFAULT_ACCOUNT
from raftstream.engine.subjects import subject_matches
from raftstream.errors import PermissionDeniedError

__all__ = [
    "ALL",
    "ANONYMOUS",
    "AUTHORIZATION_KEY",
    "PUBLISH_PERMISSION_MEMO_ENTRIES_MAX",
    "SYSTEM_ACCOUNT",
    "USER_CALLS_MAX",
    "VERIFIED_CACHE_ENTRIES_MAX",
    "AccountLimits",
    "AuthConfig",
    "Caller",
    "Permissions",
    "Principal",
    "acting_as",
    "bind_caller",
    "caller",
]

AUTHORIZATION_KEY = "authorization"
# Cluster-wide operations (meta leader step-down, peer removal, every account's groups in
# cluster info) are for users of this account when auth is configured.
SYSTEM_ACCOUNT = "$SYS"
VERIFIED_CACHE_ENTRIES_MAX = 4096
# Client API calls one user (account and user) has open on one node at once: one more is
# RESOURCE_EXHAUSTED before its request is read, so no one user takes every place a node
# has (streaming_calls_max, waiting fetches) from the others. Nodes acting for an account
# (node tokens) are not counted: their links and relays have bounds of their own.
USER_CALLS_MAX = 1024


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
