"""Ordered consumers: every message of a subject filter once, in stream order, across server
failovers, without acks.

An ordered subscription owns an ephemeral push consumer with ack policy none, flow control
and idle heartbeats. It checks each delivery's consumer sequence: the application sees a
message only when it is exactly the next one. When anything is off — a gap in the consumer
sequence (a delivery or a heartbeat ahead of what arrived), missing heartbeats (3x the
interval; also reported to the error callback), a ``409`` status (leadership change,
consumer deleted), a broken call (the stream leader died) — it resets: it makes a NEW
consumer that starts at the stream sequence after the last one handed over
(``deliver_policy`` ``by_start_sequence``), deletes the old one in the background, and
attaches again (tenacity backoff; no limit while subscribed, since a
failover may take a while). Messages already buffered stay; nothing is handed over twice.

Owned by the client's loop, like every subscription. Errors that a reset cannot cure (the
stream is gone, the server refuses the config) end the subscription: they go to the error
callback and ``next_msg`` raises them.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING

from raftstream import errors
from raftstream._push import PushSubscription, PushTarget, Reattach, msg_size_bytes
from raftstream.config import AckPolicy, ConsumerConfig, DeliverPolicy
from raftstream.models import ConsumerInfo
from raftstream.proto import raftstream_pb2 as pb
from raftstream.subscribe import PushOptions, find_stream, new_inbox

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = ["OrderedSubscription", "check_ordered_options", "ordered_config", "subscribe_ordered"]

NS_PER_S = 1_000_000_000
ORDERED_HEARTBEAT_NS_DEFAULT = 5 * NS_PER_S
ORDERED_NAME_PREFIX = "ORD_"
STATUS_CONFLICT = 409
# Fields an ordered consumer manages itself; a config that sets them is refused.
_MANAGED = ("durable_name", "name", "deliver_subject", "deliver_group")


def check_ordered_options(
    *, queue: str | None, durable: str | None, manual_ack: bool, cfg: ConsumerConfig
) -> None:
    """An ordered consumer is ephemeral, unshared and unacked: refuse what contradicts it."""
    if queue is not None:
        raise errors.InvalidArgumentError("queue", "not with an ordered consumer")
    if durable:
        raise errors.InvalidArgumentError("durable", "an ordered consumer is ephemeral")
    if manual_ack:
        raise errors.InvalidArgumentError("manual_ack", "an ordered consumer is not acked")
    for name in _MANAGED:
        if getattr(cfg, name):
            raise errors.InvalidArgumentError(name, "set by the ordered consumer itself")
    if cfg.max_deliver > 1:
        raise errors.InvalidArgumentError("max_deliver", "an ordered consumer delivers once")


def ordered_config(base: ConsumerConfig, *, name: str, start_seq: int) -> ConsumerConfig:
    """The consumer of one ordered attempt: ``base`` (filter, deliver policy, heartbeat,
    headers_only...) made ephemeral, unacked and flow-controlled; from ``start_seq`` on
    when nonzero."""
    cfg = replace(
        base,
        name=name,
        durable_name=None,
        deliver_subject=new_inbox(),
        deliver_group=None,
        ack_policy=AckPolicy.NONE,
        max_deliver=1,
        max_ack_pending=0,
        flow_control=True,
        idle_heartbeat=base.idle_heartbeat or ORDERED_HEARTBEAT_NS_DEFAULT,
    )
    if start_seq:
        cfg = replace(
            cfg,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq,
            opt_start_time=0,
        )
    return cfg


def _name() -> str:
    return ORDERED_NAME_PREFIX + secrets.token_hex(8).upper()


def _target(info: ConsumerInfo) -> PushTarget:
    return PushTarget(
        stream=info.stream,
        consumer=info.name,
        ack_none=True,
        idle_heartbeat_ns=info.config.idle_heartbeat,
        flow_control=True,
    )


class OrderedSubscription(PushSubscription):
    """See the module docstring. ``initial_info`` is the first consumer's info (its
    ``num_pending`` says how many messages the filter held when the subscription began);
    ``resets`` counts the consumers made since."""

    def __init__(
        self,
        *,
        client: Client,
        subject: str,
        base: ConsumerConfig,
        info: ConsumerInfo,
        options: PushOptions,
    ) -> None:
        super().__init__(
            router=client._router,
            acker=client._acker,
            target=_target(info),
            subject=subject,
            error_cb=options.error_cb or client._error_cb,
            cb=options.cb,
            manual_ack=True,
            pending_msgs_max=options.pending_msgs_max,
            pending_bytes_max=options.pending_bytes_max,
            connect_timeout_s=client._timeout_s,
            on_close=self._delete_current,
            consumer_info=client.consumer_info,
        )
        self._client = client
        self._base = base
        self.initial_info = info
        self.resets = 0
        # False while the current consumer can be attached again as it is: at first (made by
        # subscribe_ordered) and after a refusal that delivered nothing (NOT_LEADER).
        self._needs_reset = False
        self._next_name: str | None = None  # kept across failed creates: idempotent retry
        self._deletes: set[asyncio.Task[None]] = set()
        self._deleted: set[str] = set()

    @property
    def last_stream_seq(self) -> int:
        """The stream sequence of the last message handed to the buffer (0: none yet)."""
        return self._last_sseq

    async def _before_attach(self) -> None:
        if self._needs_reset:
            await self._reset()
        self._needs_reset = True  # any later failure of this call needs a new consumer

    async def _reset(self) -> None:
        """Replace the consumer: a new one from the next stream sequence."""
        self._delete_later(self._target.consumer)
        if self._next_name is None:
            self._next_name = _name()
        start_seq = self._last_sseq + 1 if self._last_sseq else 0  # 0: the base's policy
        cfg = ordered_config(self._base, name=self._next_name, start_seq=start_seq)
        try:
            info = await self._client.add_consumer(self.stream, cfg)
        except (errors.NotFoundError, errors.InvalidArgumentError):
            raise  # the stream is gone or the config is refused: a reset cannot cure it
        except errors.RaftStreamError as exc:
            raise Reattach(exc) from None
        self._next_name = None
        self._target = _target(info)
        self._last_cseq = 0
        self.resets += 1

    def _delete_later(self, name: str) -> None:
        if name in self._deleted:
            return
        self._deleted.add(name)
        task = asyncio.get_running_loop().create_task(self._delete(name))
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete(self, name: str) -> None:
        # Best effort: an ephemeral the server may have lost with its leader.
        with contextlib.suppress(errors.RaftStreamError):
            await self._client.delete_consumer(self.stream, name)

    async def _delete_current(self) -> None:
        self._delete_later(self._target.consumer)
        await asyncio.gather(*self._deletes, return_exceptions=True)

    # -- the checks that trigger a reset ----------------------------------------------------

    async def _on_msg(self, m: pb.Msg) -> None:
        msg = self._make_msg(m)
        meta = msg.metadata
        if meta.consumer_seq != self._last_cseq + 1:
            raise Reattach(self._gap_error(self._last_cseq + 1, meta.consumer_seq))
        self._last_cseq = meta.consumer_seq
        self._last_sseq = meta.stream_seq
        self._buffer.put(msg, msg_size_bytes(m))

    async def _on_heartbeat(self, hb: pb.Heartbeat) -> None:
        if hb.stalled:
            self._answer(hb.stalled)
        if hb.last_consumer_seq > self._last_cseq:
            raise Reattach(self._gap_error(self._last_cseq + 1, hb.last_consumer_seq))

    def _gap_error(self, expected: int, got: int) -> errors.SequenceGapError:
        return errors.SequenceGapError(
            f"ordered {self.stream}/{self.consumer}: expected consumer sequence {expected}, "
            f"got {got}",
            expected=expected,
            got=got,
        )

    async def _missed_heartbeat(self, idle_s: float) -> None:
        await super()._missed_heartbeat(idle_s)  # reported as for any push subscription
        raise Reattach(errors.MissedHeartbeatError(f"no heartbeat for {idle_s:.3f}s"))

    def _on_status(self, status: pb.PullStatus) -> None:
        if status.code == STATUS_CONFLICT:
            text = f"{status.code} {status.description}"
            raise Reattach(errors.ConflictError(text, status=status.code))
        super()._on_status(status)

    def _classify(self, exc: errors.RaftStreamError) -> BaseException:
        if isinstance(exc, errors.NotLeaderError) and not self._last_cseq:
            self._needs_reset = False  # refused before delivering: attach it elsewhere
            return Reattach(exc, exc.leader_addr)
        if exc.retriable or exc.code == errors.Code.CANCELLED:
            return Reattach(exc)
        if isinstance(exc, errors.NotFoundError | errors.ConflictError):
            return Reattach(exc)
        return exc

    async def shutdown(self) -> None:
        await super().shutdown()
        for task in list(self._deletes):
            task.cancel()


async def subscribe_ordered(
    client: Client,
    subject: str,
    *,
    stream: str | None,
    cfg: ConsumerConfig,
    options: PushOptions,
    timeout: float | None = None,
) -> OrderedSubscription:
    """Create the first consumer (its errors raise here) and start the subscription."""
    stream = await find_stream(client, subject, stream, timeout)
    base = cfg
    if subject and not cfg.filter_subject and not cfg.filter_subjects:
        base = replace(cfg, filter_subject=subject)
    first = ordered_config(base, name=_name(), start_seq=0)
    info = await client.add_consumer(stream, first, timeout=timeout)
    sub = OrderedSubscription(client=client, subject=subject, base=base, info=info, options=options)
    client._registry.register(sub, bound=False, ephemeral_created=True)
    sub.start()
    return sub
