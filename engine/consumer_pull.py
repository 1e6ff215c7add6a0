"""Pull requests, their outcomes, deliveries, and the bounded queue of waiting requests.

Waiting requests are leader-local, as in JetStream: they are not replicated, and a new leader
answers the old leader's requests with 409 Leadership Change. Everything here is driven by
``now_ns`` from the caller; nothing reads the clock.

Outcomes mirror JetStream's pull statuses: messages; ``404 No Messages`` (a no_wait request
found nothing); ``408 Request Timeout`` (expired, or a no_wait request that got part of its
batch); ``409`` for exceeded limits (max_waiting, max_batch, max_expires, max_bytes, a
message larger than the request's max_bytes), consumer deleted and leadership change;
``100 Idle Heartbeat`` while a request waits; ``400 Bad Request`` for a malformed request.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from raftstream.engine.ack import build_ack_subject
from raftstream.engine.store import StoredMsg
from raftstream.errors import InvalidArgumentError, invariant

__all__ = [
    "Delivery",
    "PullEvent",
    "PullRequest",
    "PullStatus",
    "StatusCode",
    "WaitingQueue",
    "WaitingRequest",
    "delivery_event",
]

HDR_MSG_SIZE = "Nats-Msg-Size"
HDR_PENDING_MSGS = "Nats-Pending-Messages"
HDR_PENDING_BYTES = "Nats-Pending-Bytes"


class StatusCode(enum.IntEnum):
    IDLE_HEARTBEAT = 100
    BAD_REQUEST = 400
    NO_MESSAGES = 404
    REQUEST_TIMEOUT = 408
    CONFLICT = 409


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One message handed to a client, with what its ack token carries.

    ``data`` is empty and ``headers`` carries ``Nats-Msg-Size`` for headers_only consumers.
    """

    stream: str
    consumer: str
    msg: StoredMsg
    consumer_seq: int
    deliveries: int
    num_pending: int
    headers_only: bool = False
    domain: str | None = None
    account: str = "_"

    @property
    def stream_seq(self) -> int:
        return self.msg.seq

    @property
    def subject(self) -> str:
        return self.msg.subject

    @property
    def data(self) -> bytes:
        return b"" if self.headers_only else self.msg.data

    @property
    def headers(self) -> Mapping[str, str]:
        if not self.headers_only:
            return self.msg.headers
        return {**self.msg.headers, HDR_MSG_SIZE: str(len(self.msg.data))}

    @property
    def reply(self) -> str:
        """The ack token (v2 form) a client acks this delivery with."""
        return build_ack_subject(
            stream=self.stream,
            consumer=self.consumer,
            num_delivered=self.deliveries,
            stream_seq=self.msg.seq,
            consumer_seq=self.consumer_seq,
            timestamp=self.msg.ts,
            num_pending=self.num_pending,
            domain=self.domain,
            account=self.account,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PullStatus:
    """A status answer. ``pending_msgs``/``pending_bytes``: what the request still wanted.

    Heartbeats carry the consumer's last delivered consumer and stream sequences.
    """

    code: StatusCode
    description: str
    pending_msgs: int = 0
    pending_bytes: int = 0
    last_consumer_seq: int = 0
    last_stream_seq: int = 0

    @property
    def terminal(self) -> bool:
        """True when the request is finished (every status but a heartbeat)."""
        return self.code is not StatusCode.IDLE_HEARTBEAT


@dataclass(frozen=True, slots=True, kw_only=True)
class PullEvent:
    """Something to send to the client of request ``reply``: a delivery or a status."""

    reply: str
    delivery: Delivery | None = None
    status: PullStatus | None = None


# The leader makes a Delivery and a PullEvent per message it hands out: ``delivery_event``
# builds both without the frozen dataclasses' ``__init__`` (a guarded ``__setattr__`` per
# field, twice the cost), setting every slot itself, so it must know them all.
_DELIVERY_SLOTS = (
    "stream",
    "consumer",
    "msg",
    "consumer_seq",
    "deliveries",
    "num_pending",
    "headers_only",
    "domain",
    "account",
)
if Delivery.__slots__ != _DELIVERY_SLOTS or PullEvent.__slots__ != ("reply", "delivery", "status"):
    raise ImportError("Delivery or PullEvent fields changed; update delivery_event")
(
    _d_stream,
    _d_consumer,
    _d_msg,
    _d_consumer_seq,
    _d_deliveries,
    _d_num_pending,
    _d_headers_only,
    _d_domain,
    _d_account,
) = (getattr(Delivery, name).__set__ for name in _DELIVERY_SLOTS)
_e_reply, _e_delivery, _e_status = (
    getattr(PullEvent, name).__set__ for name in ("reply", "delivery", "status")
)


def delivery_event(
    reply: str,
    *,
    stream: str,
    consumer: str,
    msg: StoredMsg,
    consumer_seq: int,
    deliveries: int,
    num_pending: int,
    headers_only: bool,
    domain: str | None,
    account: str,
) -> PullEvent:
    """``PullEvent(reply=reply, delivery=Delivery(...))``: the same value, made faster."""
    new = object.__new__
    d = new(Delivery)
    _d_stream(d, stream)
    _d_consumer(d, consumer)
    _d_msg(d, msg)
    _d_consumer_seq(d, consumer_seq)
    _d_deliveries(d, deliveries)
    _d_num_pending(d, num_pending)
    _d_headers_only(d, headers_only)
    _d_domain(d, domain)
    _d_account(d, account)
    e = new(PullEvent)
    _e_reply(e, reply)
    _e_delivery(e, d)
    _e_status(e, None)
    return e


@dataclass(frozen=True, slots=True, kw_only=True)
class PullRequest:
    """A pull request (JetStream JSON: batch, expires, no_wait, max_bytes, idle_heartbeat).

    ``expires`` and ``idle_heartbeat`` are ns; 0 means never / none. ``reply`` identifies the
    requester (a reply subject or a stream id); events are addressed to it.
    """

    batch: int = 1
    expires: int = 0
    no_wait: bool = False
    max_bytes: int = 0
    idle_heartbeat: int = 0
    reply: str = ""

    def __post_init__(self) -> None:
        for name in ("batch", "expires", "max_bytes", "idle_heartbeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(name, "must be a non-negative integer")
        if not isinstance(self.no_wait, bool):
            raise InvalidArgumentError("no_wait", "must be a boolean")
        if self.batch < 1:
            raise InvalidArgumentError("batch", "must be at least 1")
        if self.idle_heartbeat and (not self.expires or self.idle_heartbeat * 2 > self.expires):
            raise InvalidArgumentError("idle_heartbeat", "needs expires of at least twice it")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, reply: str = "") -> PullRequest:
        known = {"batch", "expires", "no_wait", "max_bytes", "idle_heartbeat"}
        for key in data:
            if key not in known:
                raise InvalidArgumentError(str(key), "is not a pull request field")
        return cls(reply=reply, **dict(data))


@dataclass(slots=True)
class WaitingRequest:
    """A request in the queue and how much of it is left."""

    request: PullRequest
    remaining_msgs: int
    remaining_bytes: int  # 0 when the request has no byte limit
    delivered: int
    expires_at_ns: int  # 0: never
    heartbeat_at_ns: int  # 0: no heartbeats

    @classmethod
    def start(cls, request: PullRequest, now_ns: int) -> WaitingRequest:
        return cls(
            request=request,
            remaining_msgs=request.batch,
            remaining_bytes=request.max_bytes,
            delivered=0,
            expires_at_ns=now_ns + request.expires if request.expires else 0,
            heartbeat_at_ns=now_ns + request.idle_heartbeat if request.idle_heartbeat else 0,
        )

    def status(self, code: StatusCode, description: str) -> PullEvent:
        return PullEvent(
            reply=self.request.reply,
            status=PullStatus(
                code=code,
                description=description,
                pending_msgs=self.remaining_msgs,
                pending_bytes=self.remaining_bytes,
            ),
        )

    def took(self, size_bytes: int, now_ns: int) -> None:
        self.remaining_msgs -= 1
        self.delivered += 1
        if self.request.max_bytes:
            self.remaining_bytes -= size_bytes
        if self.request.idle_heartbeat:
            self.heartbeat_at_ns = now_ns + self.request.idle_heartbeat

    @property
    def done(self) -> bool:
        return self.remaining_msgs == 0 or (
            self.request.max_bytes > 0 and self.remaining_bytes <= 0
        )


class WaitingQueue:
    """A FIFO of at most ``max_waiting`` requests, served round-robin one message at a time.

    Owned by the consumer leader; not thread-safe.
    """

    def __init__(self, *, max_waiting: int) -> None:
        invariant(max_waiting >= 0, "max_waiting is not negative")
        self._max_waiting = max_waiting
        self._q: deque[WaitingRequest] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[WaitingRequest]:
        return iter(self._q)

    @property
    def full(self) -> bool:
        return len(self._q) >= self._max_waiting

    def add(self, w: WaitingRequest) -> None:
        invariant(not self.full, "waiting queue overflow")
        self._q.append(w)

    def head(self) -> WaitingRequest | None:
        return self._q[0] if self._q else None

    def pop_head(self) -> WaitingRequest:
        return self._q.popleft()

    def rotate(self) -> None:
        """Move the head to the tail: the next message goes to the next request."""
        self._q.rotate(-1)

    def remove(self, reply: str) -> WaitingRequest | None:
        """Take out the request of ``reply`` without answering it (its requester is gone);
        the request removed, or None when none is waiting (it finished already)."""
        for i, w in enumerate(self._q):
            if w.request.reply == reply:
                del self._q[i]
                return w
        return None

    def expire(self, now_ns: int) -> list[PullEvent]:
        """Finish requests whose ``expires`` passed with 408 Request Timeout."""
        events: list[PullEvent] = []
        keep: deque[WaitingRequest] = deque()
        for w in self._q:
            if w.expires_at_ns and w.expires_at_ns <= now_ns:
                events.append(w.status(StatusCode.REQUEST_TIMEOUT, "Request Timeout"))
            else:
                keep.append(w)
        self._q = keep
        return events

    def finish_no_wait(self) -> list[PullEvent]:
        """Nothing more is available now: finish no_wait requests (404 or 408 if partial)."""
        events: list[PullEvent] = []
        keep: deque[WaitingRequest] = deque()
        for w in self._q:
            if not w.request.no_wait:
                keep.append(w)
            elif w.delivered:
                events.append(w.status(StatusCode.REQUEST_TIMEOUT, "Request Timeout"))
            else:
                events.append(w.status(StatusCode.NO_MESSAGES, "No Messages"))
        self._q = keep
        return events

    def heartbeats(self, now_ns: int, last_cseq: int, last_sseq: int) -> list[PullEvent]:
        """A 100 Idle Heartbeat to every waiting request whose heartbeat is due."""
        events: list[PullEvent] = []
        for w in self._q:
            if w.heartbeat_at_ns and w.heartbeat_at_ns <= now_ns:
                w.heartbeat_at_ns = now_ns + w.request.idle_heartbeat
                status = PullStatus(
                    code=StatusCode.IDLE_HEARTBEAT,
                    description="Idle Heartbeat",
                    last_consumer_seq=last_cseq,
                    last_stream_seq=last_sseq,
                )
                events.append(PullEvent(reply=w.request.reply, status=status))
        return events

    def drain(self, description: str) -> list[PullEvent]:
        """Finish every waiting request with 409 ``description`` (deleted, leader change)."""
        events = [w.status(StatusCode.CONFLICT, description) for w in self._q]
        self._q.clear()
        return events

    def next_wake_ns(self) -> int:
        """The earliest expiry or heartbeat among waiting requests (0: none)."""
        times = [t for w in self._q for t in (w.expires_at_ns, w.heartbeat_at_ns) if t]
        return min(times, default=0)
