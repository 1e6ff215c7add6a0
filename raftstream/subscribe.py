"""The subscribe workflow (ADR-15): find the stream, look up or create the consumer, check
that it fits the subscription, attach.

These functions implement ``Client.subscribe``, ``subscribe_bind``, ``pull_subscribe`` and
``pull_subscribe_bind``; they run on the client's loop. Every refusal is a typed error:

- no subject and no stream: ``InvalidArgumentError`` (field ``subject``);
- the stream is the one stream capturing the subject: ``NoStreamMatchError`` when none or
  several do;
- heartbeats or flow control with a queue: ``InvalidArgumentError`` (the server would send
  them to random members); a pull subscription that asks for ack policy none or all:
  ``InvalidArgumentError`` (field ``ack_policy``; as in ADR-15 and the Go client this is
  about the requested config: binding to an existing pull consumer with another ack
  policy is allowed, its messages then ignore acks when the policy is none);
- an existing consumer that does not fit: ``ConsumerMismatchError`` naming the field — pull
  vs push, a non-queue subscription to a queue consumer, a queue name that is not the
  consumer's deliver group (or a consumer without one), a filter subject that is not the
  subscription's subject, a requested config field that differs from the consumer's (an
  existing consumer's config is never changed by subscribing);
- a second non-queue subscription to a push consumer that is bound already:
  ``DuplicateSubscriptionError``. The server reports ``push_bound`` in ``ConsumerInfo``;
  the client also remembers its own bound push consumers, so this holds within one client
  even against a server that does not fill ``push_bound``.

A queue subscription without a durable name uses the queue name as the durable (so members
share one consumer). A create that loses a race ("already exists") falls back to a lookup
and the same checks. The SDK remembers which consumers it created (a create that answered
OK; an identical concurrent create also answers OK, so two racing creators may both think
they created it, as ADR-15 notes) and deletes them at the end of ``unsubscribe()`` and
``drain()``, except a queue group's: one member leaving must not stop the others (ADR-15
notes the problem: the first member creates the consumer, and its ``drain()`` deleted it
under the rest). A queue group's consumer is a durable named after the group; delete it
(``delete_consumer``) when the group is gone.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_fixed

from raftstream import errors
from raftstream._args import check_queue_name, check_seconds
from raftstream._push import (
    PENDING_BYTES_MAX,
    PENDING_MSGS_MAX,
    ErrorCallback,
    MsgCallback,
    PushSubscription,
    PushTarget,
)
from raftstream.config import AckPolicy, ConsumerConfig, DeliverPolicy
from raftstream.models import ConsumerInfo
from raftstream.pull import PullSubscription

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = [
    "PushOptions",
    "check_config",
    "check_push_fit",
    "new_inbox",
    "pull_subscribe",
    "pull_subscribe_bind",
    "subscribe",
    "subscribe_bind",
]

NS_PER_S = 1_000_000_000
INBOX_PREFIX = "_INBOX"
# Fields a subscription may leave to the existing consumer or that identify it; every other
# field the caller set (differs from its default) must equal the consumer's.
_UNCHECKED_FIELDS = frozenset(
    {"durable_name", "name", "deliver_subject", "deliver_group", "filter_subject", "metadata"}
)
_DEFAULTS = ConsumerConfig()
CREATED_LOOKUP_WAIT_S = 5.0
CREATED_LOOKUP_POLL_S = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class PushOptions:
    """How a push subscription delivers: callback, acks, buffer limits, error callback."""

    cb: MsgCallback | None = None
    manual_ack: bool = False
    error_cb: ErrorCallback | None = None
    pending_msgs_max: int = PENDING_MSGS_MAX
    pending_bytes_max: int = PENDING_BYTES_MAX


def new_inbox() -> str:
    """A unique deliver subject for a push consumer the SDK creates (over gRPC it only names
    the push subscription)."""
    return f"{INBOX_PREFIX}.{secrets.token_hex(11)}"


def seconds_to_ns(value: float | None, field: str) -> int:
    """A seconds option (``idle_heartbeat=5``) as config ns; None: 0 (unset). A str, NaN or
    a negative number is ``InvalidArgumentError`` naming ``field``."""
    if value is None:
        return 0
    return int(check_seconds(field, value, zero_ok=True) * NS_PER_S)


# -- checks -----------------------------------------------------------------------------------


def check_config(requested: ConsumerConfig, existing: ConsumerConfig, name: str) -> None:
    """Refuse a requested config that differs from the existing consumer's in any field the
    caller set (``ConsumerMismatchError`` naming the first such field)."""
    for f in fields(ConsumerConfig):
        if f.name in _UNCHECKED_FIELDS:
            continue
        want = getattr(requested, f.name)
        if want == getattr(_DEFAULTS, f.name):
            continue
        have = getattr(existing, f.name)
        if want != have:
            raise errors.ConsumerMismatchError(
                f.name,
                "differs from the existing consumer's",
                f"consumer {name!r}: {f.name} is {_show(have)} but {_show(want)} was "
                "requested (subscribing does not change an existing consumer)",
            )


def _show(value: object) -> str:
    return repr(value.value) if isinstance(value, enum.Enum) else repr(value)


def check_filter(info: ConsumerInfo, subject: str | None) -> None:
    """The consumer's filter (if any) must be the subscription's subject."""
    cfg = info.config
    filters = (cfg.filter_subject,) if cfg.filter_subject else cfg.filter_subjects
    if subject and filters and subject not in filters:
        raise errors.ConsumerMismatchError(
            "filter_subject",
            "must match the subject",
            f"consumer {info.name!r} filters {list(filters)} but the subscription's subject "
            f"is {subject!r}",
        )


def check_push_fit(info: ConsumerInfo, queue: str | None, *, bound_here: bool) -> None:
    """ADR-15's push checks: push vs pull, queue group binding, duplicate subscription."""
    cfg = info.config
    if cfg.is_pull:
        raise errors.ConsumerMismatchError(
            "deliver_subject",
            "push subscription to a pull consumer",
            f"consumer {info.name!r} is a pull consumer: use pull_subscribe",
        )
    group = cfg.deliver_group
    if queue is None:
        if group:
            raise errors.ConsumerMismatchError(
                "deliver_group",
                "non-queue subscription to a queue consumer",
                f"consumer {info.name!r} was created for queue group {group!r}: "
                "a non-queue subscription is refused",
            )
        if info.push_bound or bound_here:
            raise errors.DuplicateSubscriptionError(
                f"duplicate subscription: consumer {info.name!r} already has a subscriber",
                stream=info.stream,
                consumer=info.name,
            )
        return
    if not group:
        raise errors.ConsumerMismatchError(
            "deliver_group",
            "queue subscription to a consumer without a deliver group",
            f"consumer {info.name!r} was created without a deliver group: "
            f"queue {queue!r} cannot bind to it",
        )
    if group != queue:
        raise errors.ConsumerMismatchError(
            "deliver_group",
            "queue name differs from the consumer's deliver group",
            f"consumer {info.name!r} was created for queue group {group!r}, not {queue!r}",
        )
    if cfg.idle_heartbeat or cfg.flow_control:
        raise errors.ConsumerMismatchError(
            "idle_heartbeat", "heartbeats and flow control are not supported over queues"
        )


def check_pull_fit(info: ConsumerInfo) -> None:
    cfg = info.config
    if not cfg.is_pull:
        raise errors.ConsumerMismatchError(
            "deliver_subject",
            "pull subscription to a push consumer",
            f"consumer {info.name!r} is a push consumer: use subscribe",
        )


def check_pull_ack_policy(policy: AckPolicy) -> None:
    if policy in (AckPolicy.NONE, AckPolicy.ALL):
        raise errors.InvalidArgumentError(
            "ack_policy", f"a pull subscription needs ack policy explicit, not {policy.value}"
        )


def check_queue_options(queue: str | None, cfg: ConsumerConfig) -> None:
    """Queue rules of the requested config: a ``deliver_group`` only as the queue name,
    no heartbeats, no flow control."""
    if cfg.deliver_group and cfg.deliver_group != queue:
        raise errors.InvalidArgumentError(
            "deliver_group", "must be the queue name: pass queue= to make a queue subscription"
        )
    if queue is None:
        return
    check_queue_name(queue)
    if cfg.idle_heartbeat:
        raise errors.InvalidArgumentError(
            "idle_heartbeat", "heartbeats are not supported with a queue subscription"
        )
    if cfg.flow_control:
        raise errors.InvalidArgumentError(
            "flow_control", "flow control is not supported with a queue subscription"
        )


# -- lookups and creates ----------------------------------------------------------------------


async def find_stream(
    client: Client, subject: str | None, stream: str | None, timeout: float | None = None
) -> str:
    """``stream``, else the one stream capturing ``subject``."""
    if stream:
        return stream
    if not subject:
        raise errors.InvalidArgumentError("subject", "a subject or a stream is required")
    names = await client.stream_names(subject=subject, timeout=timeout)
    if len(names) != 1:
        found = "no stream matches" if not names else f"several streams ({names}) match"
        raise errors.NoStreamMatchError(f"{found} subject {subject!r}", subject=subject)
    return names[0]


async def lookup(
    client: Client, stream: str, name: str, timeout: float | None = None
) -> ConsumerInfo | None:
    try:
        return await client.consumer_info(stream, name, timeout=timeout)
    except errors.NotFoundError:
        return None


async def create_or_bind(
    client: Client,
    stream: str,
    cfg: ConsumerConfig,
    check: Callable[[ConsumerInfo], None],
    timeout: float | None = None,
) -> tuple[ConsumerInfo, bool]:
    """Create the consumer; on "already exists" (a racing creator with another config, or
    one that was not there at lookup time) look it up and ``check`` it. Returns the info
    and whether this call created it."""
    try:
        return await client.add_consumer(stream, cfg, timeout=timeout), True
    except errors.AlreadyExistsError:
        name = cfg.durable_name or cfg.name
        if not name:
            raise
        info = await _lookup_created(client, stream, name, timeout)
        check(info)
        return info, False


async def _lookup_created(
    client: Client, stream: str, name: str, timeout: float | None
) -> ConsumerInfo:
    """The info of a consumer the meta group knows: the stream group (or the node asked)
    may not have applied its creation yet, so NOT_FOUND is retried for a moment."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(errors.NotFoundError),
        stop=stop_after_delay(CREATED_LOOKUP_WAIT_S),
        wait=wait_fixed(CREATED_LOOKUP_POLL_S),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await client.consumer_info(stream, name, timeout=timeout)
    raise errors.InvariantError("tenacity ended without a result")  # pragma: no cover


# -- push ---------------------------------------------------------------------------------------


def push_config(
    config: ConsumerConfig | None,
    *,
    durable: str | None,
    idle_heartbeat: float | None,
    flow_control: bool,
    deliver_policy: DeliverPolicy | str | None,
    inactive_threshold: float | None,
) -> ConsumerConfig:
    """The requested config: ``config`` with the keyword options applied over it."""
    cfg = config or ConsumerConfig()
    changes: dict[str, Any] = {}
    if durable:
        changes["durable_name"] = durable
    if idle_heartbeat is not None:
        changes["idle_heartbeat"] = seconds_to_ns(idle_heartbeat, "idle_heartbeat")
    if flow_control:
        changes["flow_control"] = True
    if deliver_policy is not None:
        changes["deliver_policy"] = deliver_policy
    if inactive_threshold is not None:
        changes["inactive_threshold"] = seconds_to_ns(inactive_threshold, "inactive_threshold")
    return replace(cfg, **changes) if changes else cfg


async def subscribe(
    client: Client,
    subject: str,
    *,
    queue: str | None,
    stream: str | None,
    cfg: ConsumerConfig,
    options: PushOptions,
    timeout: float | None = None,
) -> PushSubscription:
    """The push workflow (module docstring); returns a started subscription."""
    check_queue_options(queue, cfg)
    stream = await find_stream(client, subject, stream, timeout)
    name = cfg.durable_name or cfg.name or queue
    info = await lookup(client, stream, name, timeout) if name else None

    def fits(found: ConsumerInfo) -> None:
        check_push_fit(found, queue, bound_here=client._registry.is_bound(stream, found.name))
        check_filter(found, subject)
        check_config(cfg, found.config, found.name)

    created = False
    if info is not None:
        fits(info)
    else:
        new = replace(
            cfg,
            durable_name=cfg.durable_name or (None if cfg.name else name),
            deliver_subject=cfg.deliver_subject or new_inbox(),
            deliver_group=queue,
            filter_subject=cfg.filter_subject or (subject if not cfg.filter_subjects else None),
        )
        info, created = await create_or_bind(client, stream, new, fits, timeout)
    return attach(client, info, subject=subject, queue=queue, created=created, options=options)


async def subscribe_bind(
    client: Client,
    stream: str,
    consumer: str,
    *,
    queue: str | None,
    options: PushOptions,
    timeout: float | None = None,
) -> PushSubscription:
    """Attach to an existing push consumer (``NotFoundError`` when there is none); the
    same fit checks, without a subject. Never deletes the consumer."""
    info = await client.consumer_info(stream, consumer, timeout=timeout)
    check_push_fit(info, queue, bound_here=client._registry.is_bound(stream, info.name))
    subject = info.config.filter_subject or ""
    return attach(client, info, subject=subject, queue=queue, created=False, options=options)


def attach(
    client: Client,
    info: ConsumerInfo,
    *,
    subject: str,
    queue: str | None,
    created: bool,
    options: PushOptions,
) -> PushSubscription:
    """Start a PushSubscription on ``info``'s consumer; registered with the client."""
    target = PushTarget(
        stream=info.stream,
        consumer=info.name,
        queue=queue,
        ack_none=info.config.ack_policy is AckPolicy.NONE,
        idle_heartbeat_ns=info.config.idle_heartbeat,
        flow_control=info.config.flow_control,
    )
    sub = PushSubscription(
        router=client._router,
        acker=client._acker,
        target=target,
        subject=subject,
        error_cb=options.error_cb or client._error_cb,
        cb=options.cb,
        manual_ack=options.manual_ack,
        pending_msgs_max=options.pending_msgs_max,
        pending_bytes_max=options.pending_bytes_max,
        connect_timeout_s=client._timeout_s,
        # A queue group's consumer is not deleted by a member leaving, even the one that
        # created it: the others may still be attached (ADR-15 notes the problem; deleting
        # it stopped every other member, 409 Consumer Deleted). It is a durable named after
        # the group; delete it explicitly when the group is gone.
        on_close=client._registry.closer(
            info.stream, info.name, delete=created and queue is None, bound=queue is None
        ),
        consumer_info=client.consumer_info,
    )
    ephemeral = created and not info.config.durable_name
    client._registry.register(sub, bound=queue is None, ephemeral_created=ephemeral)
    sub.start()
    return sub


# -- pull ---------------------------------------------------------------------------------------


async def pull_subscribe(
    client: Client,
    subject: str,
    *,
    durable: str | None,
    stream: str | None,
    config: ConsumerConfig | None,
    timeout: float | None = None,
) -> PullSubscription:
    """The pull workflow: the same stream lookup, fit and config checks; a missing named
    consumer is created (ADR-15: a failed lookup is no error for pull)."""
    cfg = config or ConsumerConfig()
    check_pull_ack_policy(cfg.ack_policy)
    if not cfg.is_pull:
        raise errors.InvalidArgumentError("deliver_subject", "a pull consumer has none")
    stream = await find_stream(client, subject, stream, timeout)
    name = durable or cfg.durable_name or cfg.name
    info = await lookup(client, stream, name, timeout) if name else None

    def fits(found: ConsumerInfo) -> None:
        check_pull_fit(found)
        check_filter(found, subject)
        check_config(cfg, found.config, found.name)

    if info is not None:
        fits(info)
    else:
        new = replace(
            cfg,
            durable_name=cfg.durable_name or (None if cfg.name else name),
            filter_subject=cfg.filter_subject
            or (subject if subject and not cfg.filter_subjects else None),
        )
        info, created = await create_or_bind(client, stream, new, fits, timeout)
        if created and not info.config.durable_name:
            return client._pull_subscription(stream, info.name, ephemeral_created=True)
    return client._pull_subscription(stream, info.name)


async def pull_subscribe_bind(
    client: Client, stream: str, durable: str, timeout: float | None = None
) -> PullSubscription:
    """Bind to an existing pull consumer (``NotFoundError`` when there is none)."""
    info = await client.consumer_info(stream, durable, timeout=timeout)
    check_pull_fit(info)
    return client._pull_subscription(stream, info.name)
