"""The one typed error hierarchy of raftstream.

Every error carries a status code (the gRPC code numbering, without importing grpc, so the
engine and the Raft core can raise these too) and whether a retry may succeed. The mapping to
and from gRPC status lives in one place, ``raftstream.proto.errors``; structured details (a
leader hint, the field that failed validation) travel as attributes, never parsed from text.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar

__all__ = [
    "AlreadyExistsError",
    "BucketNotFoundError",
    "CallCancelledError",
    "CallbackError",
    "ClientClosedError",
    "Code",
    "ConflictError",
    "ConsumerMismatchError",
    "DataLossError",
    "DeadlineExceededError",
    "DuplicateError",
    "DuplicateSubscriptionError",
    "ExpectedLastMsgIdError",
    "ExpectedLastSeqError",
    "ExpectedLastSubjectSeqError",
    "ExpectedStreamError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvariantError",
    "KeyDeletedError",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeyWrongLastSequenceError",
    "LimitError",
    "MissedHeartbeatError",
    "NoLeaderError",
    "NoStreamMatchError",
    "NotConnectedError",
    "NotFoundError",
    "NotLeaderError",
    "PermissionDeniedError",
    "PreconditionError",
    "RaftStreamError",
    "SequenceGapError",
    "SubscriptionClosedError",
    "UnauthenticatedError",
    "UnavailableError",
    "invariant",
]


class Code(enum.IntEnum):
    """Status codes, numbered as gRPC numbers them."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RaftStreamError(Exception):
    """Base of every raftstream error.

    ``code`` is the status a client sees; ``retriable`` says whether the same request may
    succeed later unchanged (a leader change, a timeout), as opposed to a request that is
    wrong (bad input, a failed precondition). ``reason`` is a stable machine-readable name.
    """

    code: ClassVar[Code] = Code.UNKNOWN
    retriable: ClassVar[bool] = False
    reason: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(RaftStreamError):
    """Bad input. ``field`` names the offending field and ``rule`` the rule it broke."""

    code = Code.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, rule: str, message: str | None = None) -> None:
        super().__init__(message or f"{field}: {rule}", field=field, rule=rule)
        self.field = field
        self.rule = rule


class NotFoundError(RaftStreamError):
    code = Code.NOT_FOUND
    reason = "NOT_FOUND"


class AlreadyExistsError(RaftStreamError):
    code = Code.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class PermissionDeniedError(RaftStreamError):
    code = Code.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class UnauthenticatedError(RaftStreamError):
    """No credentials, or credentials the server does not accept (the message never
    carries them)."""

    code = Code.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class LimitError(RaftStreamError):
    """A limit was hit (max_msgs with discard new, max_ack_pending, a payload size...)."""

    code = Code.RESOURCE_EXHAUSTED
    reason = "LIMIT"


class PreconditionError(RaftStreamError):
    """The request is well formed but the current state refuses it."""

    code = Code.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class ExpectedStreamError(PreconditionError):
    reason = "WRONG_EXPECTED_STREAM"


class ExpectedLastSeqError(PreconditionError):
    reason = "WRONG_LAST_SEQUENCE"


class ExpectedLastSubjectSeqError(PreconditionError):
    reason = "WRONG_LAST_SUBJECT_SEQUENCE"


class ExpectedLastMsgIdError(PreconditionError):
    reason = "WRONG_LAST_MSG_ID"


class ConflictError(RaftStreamError):
    code = Code.ABORTED
    reason = "CONFLICT"


class DuplicateError(RaftStreamError):
    code = Code.ALREADY_EXISTS
    reason = "DUPLICATE"


class DataLossError(RaftStreamError):
    """Stored bytes failed their checksum: never return them as data."""

    code = Code.DATA_LOSS
    reason = "DATA_LOSS"


class UnavailableError(RaftStreamError):
    code = Code.UNAVAILABLE
    retriable = True
    reason = "UNAVAILABLE"


class CallbackError(RaftStreamError):
    """A subscription's callback raised (the exception is ``__cause__``): given to the
    client's ``error_cb``, as nats.py does; the message is not acked and comes again after
    its ack wait. The subscription goes on."""

    code = Code.UNKNOWN
    reason = "CALLBACK_FAILED"


class ClientClosedError(UnavailableError):
    """The client was closed (``close()``): nothing is sent any more, and nothing waits for
    a server (nats.py's ``ConnectionClosedError``). Not retriable."""

    retriable = False
    reason = "CLIENT_CLOSED"


class NotConnectedError(UnavailableError):
    """No connection to a server could be made in time; nothing was sent to it."""

    reason = "NOT_CONNECTED"


class NotLeaderError(UnavailableError):
    """This replica is not the leader; ``leader`` (may be None) is the known leader's id and
    ``leader_addr`` (may be None) its client address (host:port), for a client to follow."""

    reason = "NOT_LEADER"

    def __init__(
        self,
        message: str = "not the leader",
        *,
        leader: str | None = None,
        leader_addr: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, leader=leader, leader_addr=leader_addr, **details)
        self.leader = leader
        self.leader_addr = leader_addr


class NoLeaderError(UnavailableError):
    reason = "NO_LEADER"


class CallCancelledError(UnavailableError):
    """A call ended CANCELLED that this client did not cancel: the server or the transport
    ended it (a connection reset, a node shutting calls down, a node failing over under
    it). What it carried may or may not have taken effect (a publish in flight may be
    stored), so, like any ambiguous ``UnavailableError``, the SDK retries it only for an
    idempotent request (a read, a publish with a ``msg_id``)."""

    code = Code.CANCELLED
    reason = "CANCELLED"


class DeadlineExceededError(RaftStreamError, TimeoutError):
    """No answer within the call's time: its timeout, or a server's cap on it.

    Also a ``TimeoutError`` (the builtin, which ``asyncio.TimeoutError`` is), as a nats.py
    client's timeout is, so ``except TimeoutError`` around a ``fetch`` or a ``publish``
    catches it. What the call carried may or may not have taken effect."""

    code = Code.DEADLINE_EXCEEDED
    retriable = True
    reason = "TIMEOUT"


class InvariantError(RaftStreamError):
    """An internal invariant broke: a bug, never a user error."""

    code = Code.INTERNAL
    reason = "INVARIANT"


# -- the SDK's subscribe workflow and key-value buckets (client-side refusals) ---------------


class NoStreamMatchError(NotFoundError):
    """No stream captures the subject a publish names (the node's answer), or none or more
    than one captures the subject a subscription names (the SDK's subscribe workflow).
    A NOT_FOUND, so ``except NotFoundError`` still catches it."""

    reason = "NO_STREAM_MATCH"


class ConsumerMismatchError(InvalidArgumentError):
    """An existing consumer does not fit the subscription (pull vs push, queue group, filter
    subject, or a requested config field that differs); ``field`` names what differs."""

    reason = "CONSUMER_MISMATCH"


class DuplicateSubscriptionError(AlreadyExistsError):
    """A second non-queue subscription to a push consumer that already has one."""

    reason = "DUPLICATE_SUBSCRIPTION"


class SubscriptionClosedError(RaftStreamError):
    """The subscription was unsubscribed, drained, or its client closed."""

    code = Code.CANCELLED
    reason = "SUBSCRIPTION_CLOSED"


class MissedHeartbeatError(UnavailableError):
    """No message or heartbeat arrived for 3x the consumer's idle heartbeat interval
    (reported to the error callback; the subscription goes on, on a new call that avoids
    the silent node: it may hang while another node leads the stream)."""

    reason = "MISSED_HEARTBEAT"


class SequenceGapError(RaftStreamError):
    """A push subscription saw the consumer sequence jump (reported to the error callback):
    ``details["expected"]`` and ``details["got"]`` are consumer sequences."""

    code = Code.DATA_LOSS
    reason = "SEQUENCE_GAP"


class BucketNotFoundError(NotFoundError):
    reason = "BUCKET_NOT_FOUND"


class InvalidKeyError(InvalidArgumentError):
    reason = "INVALID_KEY"


class KeyNotFoundError(NotFoundError):
    """The key has no value (never set, or the history holds none at that revision)."""

    reason = "KEY_NOT_FOUND"


class KeyDeletedError(KeyNotFoundError):
    """The key's latest entry is a delete or purge marker; ``details["revision"]``."""

    reason = "KEY_DELETED"


class KeyWrongLastSequenceError(ExpectedLastSubjectSeqError):
    """A compare-and-set (``update``) lost: the key's last revision is not the expected one."""

    reason = "KEY_WRONG_LAST_SEQUENCE"


class KeyExistsError(KeyWrongLastSequenceError):
    """``create`` found the key holding a value."""

    reason = "KEY_EXISTS"


def invariant(cond: bool, msg: str) -> None:
    """Raise InvariantError unless ``cond``. Unlike ``assert``, survives ``python -O``."""
    if not cond:
        raise InvariantError(msg)
