"""Parsing the ``[auth]`` section of the node config (``parse_auth``), and bcrypt hashes.

Errors name the key (``auth.users[0].password``) and the rule, never a secret's value: a
plaintext secret pasted by mistake must not land in a log. ``hash_secret`` makes the hashes
the section holds (``raftstream auth hash-password``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt

from raftstream.cluster.common.names import validate_account
from raftstream.cluster.security.auth_values import (
    USER_CALLS_MAX,
    VERIFIED_CACHE_ENTRIES_MAX,
    AccountLimits,
    AuthConfig,
    Permissions,
    Principal,
)
from raftstream.engine.subjects import validate_filter
from raftstream.errors import InvalidArgumentError

__all__ = [
    "LIMIT_KEYS",
    "NODE_SECRET_BYTES_MIN",
    "TOKEN_KEYS",
    "USER_KEYS",
    "bcrypt_cost",
    "hash_secret",
    "parse_auth",
]

# Integer keys of [auth] are at most int64, as cluster/config.py's: tomllib reads any size,
# and the counts and bytes they bound are int64.
_INT64_MAX = 2**63 - 1
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
NODE_SECRET_BYTES_MIN = 32  # a node_secret_file shorter than this is refused


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
