"""Resolving a call's credentials into a ``Caller``: node tokens by HMAC, users and tokens
by bcrypt.

bcrypt is slow on purpose (tens of milliseconds per check): a verified result is cached in
memory, bounded (``verified_cache_entries_max``), keyed by a SHA-256 of the credentials;
the plaintext is never stored, and every check runs in a worker thread, never on the
event loop, at most ``BCRYPT_CHECKS_CONCURRENT_MAX`` at once and ``BCRYPT_CHECKS_PENDING_MAX``
running or queued. An unknown user's refusal costs what a known user's does.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import bcrypt

from raftstream.cluster.security.auth_parse import bcrypt_cost
from raftstream.cluster.security.auth_tokens import (
    NODE_TOKEN_PREFIX,
    node_caller,
    node_key,
    node_mac,
)
from raftstream.cluster.security.auth_values import (
    AUTHORIZATION_KEY,
    SYSTEM_ACCOUNT,
    AuthConfig,
    Caller,
    Principal,
)
from raftstream.errors import (
    UnauthenticatedError,
    UnavailableError,
)

__all__ = [
    "BCRYPT_CHECKS_CONCURRENT_MAX",
    "BCRYPT_CHECKS_PENDING_MAX",
    "CREDENTIALS_BYTES_MAX",
    "Authenticator",
]

CREDENTIALS_BYTES_MAX = 4096  # an authorization value longer than this is refused unread
# bcrypt checks running at once (worker threads): a storm of bad credentials queues here
# instead of taking every core from the node's Raft and client work.
BCRYPT_CHECKS_CONCURRENT_MAX = 2
# bcrypt checks running or queued at once: beyond, a call is refused UNAVAILABLE (retriable)
# at once rather than queued for minutes behind a storm of bad credentials.
BCRYPT_CHECKS_PENDING_MAX = 64


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
        return account if hmac.compare_digest(mac, node_mac(self._node_key, account)) else None

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
