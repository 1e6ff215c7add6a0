"""The node's auth interceptors: client API calls resolved to a ``Caller`` and bound to
their task (``AuthInterceptor``); node-to-node services kept to nodes
(``NodeCallsInterceptor``).

A refused call's request is never read (``_refusal``): without credentials a caller holds no
more of the node than its call's headers. A user's open calls on a node are bounded
(``UserCalls``, ``[auth] user_calls_max``). With ``[tls]`` a node token is accepted only on a
connection whose verified certificate is a node certificate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from raftstream.cluster.common.handlers import rewrap
from raftstream.cluster.security.auth_credentials import CREDENTIALS_BYTES_MAX, Authenticator
from raftstream.cluster.security.auth_tokens import NODE_USER, cluster_caller
from raftstream.cluster.security.auth_values import AUTHORIZATION_KEY, Caller, bind_caller, caller
from raftstream.errors import (
    LimitError,
    PermissionDeniedError,
    RaftStreamError,
    UnauthenticatedError,
)
from raftstream.proto.errors import abort
from raftstream.raft.transport.tls import peer_node_names

__all__ = [
    "NODE_PROVE_METHOD",
    "NODE_SERVICE_PREFIXES",
    "REFUSAL_LOG_INTERVAL_S",
    "AuthInterceptor",
    "NodeCallsInterceptor",
    "UserCalls",
]

_CLIENT_API_PREFIX = "/raftstream.v1."
# The logger's name from before the auth modules were split: log filters name it.
log = logging.getLogger("raftstream.cluster.security.auth")
REFUSAL_LOG_INTERVAL_S = 60.0  # at most one warning this often about refused node calls
# Services only nodes call (Raft, repair after data loss, placement descriptions).
NODE_SERVICE_PREFIXES = ("/raftstream.raft.v1.", "/raftstream.repair.v1.", "/raftstream.node.v1.")
# The one node call without a node token: a node proves there that it holds the node key
# before any node credentials are sent to it (cluster/security/node_proof.py), so its caller (the
# meta leader adding it) sends none.
NODE_PROVE_METHOD = "/raftstream.node.v1.NodeService/Prove"


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
