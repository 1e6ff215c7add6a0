"""Authentication, accounts and permissions of client calls (issue 10).

The ``[auth]`` section of the node config (parsed by ``parse_auth``) declares accounts with
their limits, and users (name + bcrypt password hash) and tokens (bcrypt hash of the
token), each mapped to an account with permissions. Without ``[auth]`` nothing here runs:
every call acts in the default account ``$G`` with every permission, as before.

A client API call (``/raftstream.v1.*``) carries its credentials as gRPC metadata,
``authorization: Bearer <token>`` or ``authorization: Basic base64(user:password)``.
``AuthInterceptor`` resolves them ONCE per call into a ``Caller`` (account, permissions)
and binds it to the call's task in a context variable; ``caller()`` reads it (the
servicers reach it through ``cluster/services/context.py``). Missing or rejected credentials end the
call with UNAUTHENTICATED before any servicer runs. Health and reflection calls need no
credentials; node-to-node calls are guarded by ``NodeCallsInterceptor`` (below, and
``cluster/security/auth_interceptors.py``).

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
before any node credentials are sent to it (``cluster/security/node_proof.py``), so it wants none.

bcrypt is slow on purpose (tens of milliseconds per check): a verified result is cached in
memory, bounded (``verified_cache_entries_max``), keyed by a SHA-256 of the credentials;
the plaintext is never stored, and every check runs in a worker thread, never on the
event loop. A forwarded call (``cluster/services/forward.py``) carries the caller's credentials
along, so the node that answers it resolves the same identity.

Secrets never reach logs, metrics, errors or ``repr()``: hashes and credentials are
excluded from the dataclasses' repr, and errors name the field, never the value.

Where each part lives: the values (``Permissions``, ``AccountLimits``, ``AuthConfig``, ``Caller``)
and the running call's caller in ``cluster/security/auth_values.py``; parsing ``[auth]`` and bcrypt
hashes in ``cluster/security/auth_parse.py``; node tokens in ``cluster/security/auth_tokens.py``;
resolving credentials (``Authenticator``) in ``cluster/security/auth_credentials.py``; the
interceptors in ``cluster/security/auth_interceptors.py``. This module re-exports their public
names.
"""

from __future__ import annotations

from raftstream.cluster.security.auth_credentials import (
    BCRYPT_CHECKS_CONCURRENT_MAX,
    BCRYPT_CHECKS_PENDING_MAX,
    CREDENTIALS_BYTES_MAX,
    Authenticator,
)
from raftstream.cluster.security.auth_interceptors import (
    NODE_PROVE_METHOD,
    NODE_SERVICE_PREFIXES,
    REFUSAL_LOG_INTERVAL_S,
    AuthInterceptor,
    NodeCallsInterceptor,
    UserCalls,
)
from raftstream.cluster.security.auth_parse import (
    LIMIT_KEYS,
    NODE_SECRET_BYTES_MIN,
    TOKEN_KEYS,
    USER_KEYS,
    bcrypt_cost,
    hash_secret,
    parse_auth,
)
from raftstream.cluster.security.auth_tokens import (
    NODE_TOKEN_PREFIX,
    NODE_USER,
    cluster_caller,
    cluster_metadata,
    node_caller,
    node_key,
    node_token,
)
from raftstream.cluster.security.auth_values import (
    ALL,
    ANONYMOUS,
    AUTHORIZATION_KEY,
    PUBLISH_PERMISSION_MEMO_ENTRIES_MAX,
    SYSTEM_ACCOUNT,
    USER_CALLS_MAX,
    VERIFIED_CACHE_ENTRIES_MAX,
    AccountLimits,
    AuthConfig,
    Caller,
    Permissions,
    Principal,
    acting_as,
    bind_caller,
    caller,
)

__all__ = [
    "ALL",
    "ANONYMOUS",
    "AUTHORIZATION_KEY",
    "BCRYPT_CHECKS_CONCURRENT_MAX",
    "BCRYPT_CHECKS_PENDING_MAX",
    "CREDENTIALS_BYTES_MAX",
    "LIMIT_KEYS",
    "NODE_PROVE_METHOD",
    "NODE_SECRET_BYTES_MIN",
    "NODE_SERVICE_PREFIXES",
    "NODE_TOKEN_PREFIX",
    "NODE_USER",
    "PUBLISH_PERMISSION_MEMO_ENTRIES_MAX",
    "REFUSAL_LOG_INTERVAL_S",
    "SYSTEM_ACCOUNT",
    "TOKEN_KEYS",
    "USER_CALLS_MAX",
    "USER_KEYS",
    "VERIFIED_CACHE_ENTRIES_MAX",
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
    "cluster_caller",
    "cluster_metadata",
    "hash_secret",
    "node_caller",
    "node_key",
    "node_token",
    "parse_auth",
]
