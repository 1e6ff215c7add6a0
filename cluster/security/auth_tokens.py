"""Node tokens: how a node proves, on a call, that it holds the cluster's node key.

A node acting for an account sends ``Bearer rs-node.<account>.<mac>``, the MAC an
HMAC-SHA256 of the account under the node key (``node_key``: derived from ``[auth]
node_secret_file``, or without it from the whole ``[auth]`` section; docs/security.md). It
grants every permission in that account, never ``$SYS``. Its node-to-node calls carry
``cluster_metadata``; ``node_caller`` and ``cluster_caller`` are the ``Caller`` values it
acts as (with ``acting_as``).
"""

from __future__ import annotations

import hashlib
import hmac
import json

from raftstream.cluster.common.names import DEFAULT_ACCOUNT
from raftstream.cluster.security.auth_values import (
    ALL,
    AUTHORIZATION_KEY,
    AuthConfig,
    Caller,
    Permissions,
)

__all__ = [
    "NODE_TOKEN_PREFIX",
    "NODE_USER",
    "cluster_caller",
    "cluster_metadata",
    "node_caller",
    "node_key",
    "node_mac",
    "node_token",
]

NODE_TOKEN_PREFIX = "rs-node."
NODE_USER = "$node"  # the user name of a node acting for an account


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


def node_mac(key: bytes, account: str) -> str:
    return hmac.new(key, account.encode("utf-8"), hashlib.sha256).hexdigest()


def node_token(config: AuthConfig | None, account: str) -> str | None:
    """The token this node sends when it acts for ``account`` (None without ``[auth]``):
    what an SDK client the node runs for the account passes as ``connect(token=...)``."""
    if config is None:
        return None
    return f"{NODE_TOKEN_PREFIX}{account}.{node_mac(node_key(config), account)}"


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
