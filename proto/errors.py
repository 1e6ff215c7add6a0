"""The one place that maps ``raftstream.errors`` to and from gRPC status.

Server side: ``to_status(exc)`` builds a ``grpc.Status`` whose code is the error's ``code``
and whose trailing metadata carries grpcio-status rich details: a ``google.rpc.Status``
holding one ``google.rpc.ErrorInfo`` with ``domain`` ``"raftstream"``, ``reason`` the error
class's ``reason`` and ``metadata`` its details as strings (``field``, ``rule``, ``leader``,
``leader_addr``, ...; None values are left out). ``abort(context, exc)`` ends an aio RPC with
it, and ``map_errors`` wraps a servicer method (coroutine or async generator) so that a
raised ``RaftStreamError`` becomes that status. Anything that is not a ``RaftStreamError`` is
a bug: it becomes INTERNAL with reason ``INTERNAL`` and only the exception's type in the text.

Per-item failures inside stream RPCs (a publish in PublishStream, an ack in AckStream) travel
as ``raftstream.v1.Error`` messages with the same content: ``to_error_message`` and
``from_error_message``.

Errors of the Raft library (``raftstream.raft.errors``, its own hierarchy) never come here
as they are: the node turns them into ``raftstream.errors`` first, in one converter
(``raftstream.cluster.common.raft_errors.app_error``, which the Raft host is given); one that
slipped through would be a bug, sent as INTERNAL like any other.

Client side: ``from_rpc_error(err)`` turns a ``grpc.RpcError`` (``grpc.aio.AioRpcError``
included) into the typed exception, chosen by the ErrorInfo ``reason`` (never parsed from
the message text), with its attributes (``field``, ``rule``, ``leader``, ``leader_addr``)
restored. A status without raftstream details (a transport failure, the client's own
deadline) maps by code: UNAVAILABLE is ``UnavailableError`` (retriable), DEADLINE_EXCEEDED is
``DeadlineExceededError``, CANCELLED is ``CallCancelledError`` (an ``UnavailableError``), and
so on; INTERNAL "Internal error from Core", which the client's own gRPC core makes when a
call's connection breaks under a send or receive (never a status a server sent), is an
``UnavailableError`` too: the call broke, its outcome is unknown.
``details["grpc_code"]`` keeps the gRPC code's name.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar, cast

import grpc
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from raftstream import errors as e
from raftstream.proto import raftstream_pb2 as pb

__all__ = [
    "ABORT_REASON",
    "DOMAIN",
    "abort",
    "error_class",
    "from_error_message",
    "from_rpc_error",
    "map_errors",
    "to_error_message",
    "to_rich_status",
    "to_status",
]

DOMAIN = "raftstream"
INTERNAL_REASON = "INTERNAL"
log = logging.getLogger("raftstream.proto.errors")


# Without raftstream details, a status maps by code to the most specific class that has it.
_BY_CODE: Mapping[e.Code, type[e.RaftStreamError]] = {
    e.Code.CANCELLED: e.CallCancelledError,
    e.Code.INVALID_ARGUMENT: e.InvalidArgumentError,
    e.Code.DEADLINE_EXCEEDED: e.DeadlineExceededError,
    e.Code.NOT_FOUND: e.NotFoundError,
    e.Code.ALREADY_EXISTS: e.AlreadyExistsError,
    e.Code.PERMISSION_DENIED: e.PermissionDeniedError,
    e.Code.RESOURCE_EXHAUSTED: e.LimitError,
    e.Code.FAILED_PRECONDITION: e.PreconditionError,
    e.Code.ABORTED: e.ConflictError,
    e.Code.UNAVAILABLE: e.UnavailableError,
    e.Code.UNAUTHENTICATED: e.UnauthenticatedError,
    e.Code.DATA_LOSS: e.DataLossError,
}


def _all_subclasses(cls: type[e.RaftStreamError]) -> list[type[e.RaftStreamError]]:
    out: list[type[e.RaftStreamError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_class(reason: str, code: e.Code) -> type[e.RaftStreamError]:
    """The error class for ``reason`` with ``code``; the code's class when none matches.

    Classes defined in ``raftstream.errors`` win over subclasses defined elsewhere that reuse
    a reason; among those, the first defined wins. Looked up each time (errors are rare), so
    a subclass added by another module is found once it is imported.
    """
    candidates = [c for c in _all_subclasses(e.RaftStreamError) if c.reason == reason]
    candidates.sort(key=lambda c: c.__module__ != e.__name__)
    for cls in candidates:
        if cls.code == code:
            return cls
    return _BY_CODE.get(code, e.RaftStreamError)


# -- server side ------------------------------------------------------------------------------


def _metadata(exc: e.RaftStreamError) -> dict[str, str]:
    return {k: str(v) for k, v in exc.details.items() if v is not None}


def _parts(exc: BaseException) -> tuple[e.Code, str, str, dict[str, str]]:
    """(code, reason, message, metadata) of any exception; non-raftstream ones are INTERNAL."""
    if isinstance(exc, e.RaftStreamError):
        return exc.code, exc.reason, exc.message, _metadata(exc)
    return e.Code.INTERNAL, INTERNAL_REASON, f"internal error ({type(exc).__name__})", {}


def to_rich_status(exc: BaseException) -> status_pb2.Status:
    """The ``google.rpc.Status`` for ``exc``: code, message and one ErrorInfo."""
    code, reason, message, metadata = _parts(exc)
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)
    status = status_pb2.Status(code=int(code), message=message)
    status.details.add().Pack(info)
    return status


def to_status(exc: BaseException) -> grpc.Status:
    """The ``grpc.Status`` to end an RPC with for ``exc`` (rich details in its trailers)."""
    return rpc_status.to_status(to_rich_status(exc))


# The reason of the status the running call was ended with (``abort``): what the node's
# RPC metrics label a failed call with (NOT_LEADER, NO_LEADER, TIMEOUT...). Set in the
# call's own task, which is the one its interceptors run in.
ABORT_REASON: contextvars.ContextVar[str] = contextvars.ContextVar(
    "raftstream_abort_reason", default=""
)


# Set once the running call began to abort: gRPC awaits the status's send inside
# ``abort_with_status``, and a time cap that fires meanwhile (``cluster/security/limits.py``) must
# not abort the call a second time (grpc raises UsageError "Abort was already called!", logged with
# a traceback as an unexpected servicer error).
_ABORTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "raftstream_aborting", default=False
)


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    """End the current aio RPC with ``exc``'s status. Never returns (grpc raises). When the
    call is already aborting (its first abort was cut short, as by the node's time cap while
    the status was being sent), that first status stands and this raises
    ``CancelledError``: grpc accepts no AbortError but the one its own abort raised (another
    is logged as a servicer bug, "Abort error has been replaced!"), and a cancelled handler
    is what the call is."""
    if _ABORTING.get():
        raise asyncio.CancelledError(f"already aborting; not sent: {exc}")
    _ABORTING.set(True)
    ABORT_REASON.set(_parts(exc)[1])
    await context.abort_with_status(to_status(exc))
    raise AssertionError("unreachable: abort_with_status raises")  # pragma: no cover


def to_error_message(exc: BaseException) -> pb.Error:
    """The per-item ``raftstream.v1.Error`` for ``exc`` (same content as ``to_status``)."""
    code, reason, message, metadata = _parts(exc)
    return pb.Error(code=int(code), reason=reason, message=message, metadata=metadata)


F = TypeVar("F", bound=Callable[..., Any])


async def _abort_mapped(
    context: grpc.aio.ServicerContext, exc: Exception, method: Callable[..., Any]
) -> NoReturn:
    if not isinstance(exc, e.RaftStreamError):
        # A bug: the client gets INTERNAL without the text; the traceback goes to the log.
        log.error("bug in %s", method.__qualname__, exc_info=exc)
    await abort(context, exc)


def map_errors(method: F) -> F:
    """Wrap an aio servicer method so a raised exception ends the RPC with its mapped status.

    Works for coroutine methods (unary responses) and async generator methods (streamed
    responses). ``(self, request_or_iterator, context)`` is the expected signature. A
    ``RaftStreamError`` becomes its status; any other exception is a bug, logged with its
    traceback and sent as INTERNAL; aborts the handler made itself (``context.abort``) and
    cancellation pass through untouched.
    """
    if inspect.isasyncgenfunction(method):
        gen_method = cast(Callable[..., AsyncIterator[Any]], method)

        @functools.wraps(method)
        async def stream_wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in gen_method(self, request, context):
                    yield item
            except grpc.aio.AbortError:
                raise  # the handler aborted on its own: its status stands
            except Exception as exc:
                await _abort_mapped(context, exc, method)

        return cast(F, stream_wrapper)
    unary_method = cast(Callable[..., Awaitable[Any]], method)

    @functools.wraps(method)
    async def unary_wrapper(self: Any, request: Any, context: Any) -> Any:
        try:
            return await unary_method(self, request, context)
        except grpc.aio.AbortError:
            raise  # the handler aborted on its own: its status stands
        except Exception as exc:
            await _abort_mapped(context, exc, method)

    return cast(F, unary_wrapper)


# -- client side ------------------------------------------------------------------------------


def _build(
    cls: type[e.RaftStreamError], message: str, metadata: Mapping[str, str]
) -> e.RaftStreamError:
    """An instance of ``cls`` with its structured attributes restored from ``metadata``."""
    details: dict[str, Any] = dict(metadata)
    if issubclass(cls, e.InvalidArgumentError):
        field = details.pop("field", "")
        rule = details.pop("rule", message)
        exc: e.RaftStreamError = cls(field, rule, message)
    elif issubclass(cls, e.NotLeaderError):
        leader = details.pop("leader", None)
        leader_addr = details.pop("leader_addr", None)
        exc = cls(message, leader=leader, leader_addr=leader_addr, **details)
        details = {}
    else:
        try:
            exc = cls(message)
        except TypeError:  # a subclass with its own constructor: fall back to its code's class
            exc = _BY_CODE.get(cls.code, e.RaftStreamError)(message)
    exc.details.update(details)
    return exc


def from_error_message(err: pb.Error) -> e.RaftStreamError:
    """The typed exception for a per-item ``raftstream.v1.Error``."""
    code = _code(err.code)
    cls = error_class(err.reason, code)
    exc = _build(cls, err.message, err.metadata)
    exc.details.setdefault("grpc_code", code.name)
    return exc


def _code(value: int) -> e.Code:
    try:
        return e.Code(value)
    except ValueError:
        return e.Code.UNKNOWN


def _error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    try:
        rich = rpc_status.from_call(err)
    except ValueError:  # code or message in the details disagree with the status: ignore them
        return None
    if rich is None:
        return None
    for detail in rich.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == DOMAIN:
            return info
    return None


_NOT_SENT = "failed to connect to all addresses"  # gRPC's words: the call was never sent
# gRPC's words when the client's own core failed an operation of a call (grpc.aio's
# ``set_internal_error``: a send or receive on a call whose connection just died, e.g. a
# node killed under a PublishStream write). The status was never received from the server.
_BROKEN_IN_CORE = "Internal error from Core"


def _broken_in_core(err: grpc.RpcError, code: e.Code, message: str) -> bool:
    """Whether ``err`` is INTERNAL made by the client's gRPC core for a call that broke
    mid-way, not a status a server sent: gRPC formats a received status's debug string as
    ``CODE:message`` (older versions name the peer it came from), while the core's own one
    is the failed batch (``Failed "execute_batch": ...``). Called only without raftstream
    details (a raftstream server always sends them)."""
    if code is not e.Code.INTERNAL or message != _BROKEN_IN_CORE:
        return False
    debug_of = getattr(err, "debug_error_string", None)
    debug = str(debug_of() or "") if callable(debug_of) else ""
    received = debug.startswith(f"{code.name}:") or "received from peer" in debug
    return not received


def from_rpc_error(err: grpc.RpcError) -> e.RaftStreamError:
    """The typed exception for a failed call (``grpc.aio.AioRpcError`` or a sync one).

    Chosen by the ErrorInfo ``reason`` when the server sent raftstream details, else by the
    status code. ``details["grpc_code"]`` names the gRPC code either way. One exception to
    "by the code": INTERNAL "Internal error from Core" that the client's core made for a
    call whose connection broke mid-way (``_broken_in_core``) is an ``UnavailableError``
    like any other broken connection: retriable, outcome unknown.
    """
    status_code = cast(grpc.StatusCode, err.code())
    code = _code(int(status_code.value[0]))
    message = str(err.details() or status_code.name)
    info = _error_info(err)
    if info is None and _broken_in_core(err, code, message):
        exc: e.RaftStreamError = e.UnavailableError(
            f"the connection to the server broke ({message})"
        )
        exc.details["grpc_code"] = code.name
        return exc
    if info is None and code is e.Code.UNAVAILABLE and _NOT_SENT not in message:
        # gRPC's own words for a broken connection ("Stream removed", "Socket closed") read
        # like a raftstream stream being deleted: say what happened, keep them after.
        message = f"the connection to the server broke ({message})"
    if info is None:
        exc = _build(_BY_CODE.get(code, e.RaftStreamError), message, {})
    else:
        exc = _build(error_class(info.reason, code), message, info.metadata)
    exc.details.setdefault("grpc_code", code.name)
    return exc
