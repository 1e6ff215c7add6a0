"""Client credentials: the ``authorization`` metadata every call of a client carries.

A node with ``[auth]`` (docs/security.md) refuses a call without accepted credentials with
UNAUTHENTICATED. The SDK sends them on EVERY call, unary and streamed alike, through one
client interceptor per channel (``credential_interceptors``), so no call site can forget
them. A token travels as ``Bearer <token>``, a user and password as ``Basic
base64(user:password)`` (RFC 7617's encoding; without TLS both cross the network in the
clear: use TLS wherever the network is not trusted).

The secret lives in the interceptor only; it is never part of a ``repr()``, a log record or
an error message.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import grpc

from raftstream import errors

__all__ = ["AUTHORIZATION_KEY", "authorization_value", "credential_interceptors"]

AUTHORIZATION_KEY = "authorization"


def authorization_value(
    *, token: str | None = None, user: str | None = None, password: str | None = None
) -> str | None:
    """The ``authorization`` metadata value for these credentials; None for none.

    Raises ``InvalidArgumentError`` (naming ``token``, ``user`` or ``password``, never their
    values) for a token with a user, a user without a password or the reverse, or a user name
    with ``:``."""
    if token and (user or password):
        raise errors.InvalidArgumentError("token", "give a token or a user and password, not both")
    if token:
        return f"Bearer {token}"
    if not user and not password:
        return None
    if not user:
        raise errors.InvalidArgumentError("user", "is required with a password")
    if not password:
        raise errors.InvalidArgumentError("password", "is required with a user")
    if ":" in user:
        raise errors.InvalidArgumentError("user", "must not contain ':'")
    pair = f"{user}:{password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


class _Credentials:
    """Adds ``authorization`` to a call's metadata. grpc.aio files each interceptor object
    under ONE call kind (the first interceptor class it is an instance of), so each kind
    gets an object of its own (the subclasses below)."""

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<hidden>)"

    def _details(self, details: Any) -> Any:
        md = grpc.aio.Metadata(*tuple(details.metadata or ()))
        md.add(AUTHORIZATION_KEY, self._value)
        return details._replace(metadata=md)


class _UnaryUnary(_Credentials, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStream(_Credentials, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnary(_Credentials, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStream(_Credentials, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def credential_interceptors(
    *, token: str | None = None, user: str | None = None, password: str | None = None
) -> tuple[grpc.aio.ClientInterceptor, ...]:
    """The channel interceptors that send these credentials (none without credentials)."""
    value = authorization_value(token=token, user=user, password=password)
    if value is None:
        return ()
    return (_UnaryUnary(value), _UnaryStream(value), _StreamUnary(value), _StreamStream(value))
