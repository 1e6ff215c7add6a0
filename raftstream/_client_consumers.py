"""The consumer management part of ``Client``: create, change, delete, inspect, list,
pause, resume and reset consumers.

``Client`` derives from ``ConsumersAPI``; each method is one call through
``ClientCore._call`` (its timeout, retries and typed errors as the ``raftstream.client``
module docstring says).
"""

from __future__ import annotations

import json
import time
from typing import Any

from raftstream import errors
from raftstream._args import check_durations_ns, check_int
from raftstream._client_core import ClientCore
from raftstream._conn import Stubs
from raftstream.config import ConsumerConfig, config_with
from raftstream.models import ConsumerInfo, PauseInfo
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["ConsumersAPI"]


class ConsumersAPI(ClientCore):
    """``Client``'s consumer methods (see the module docstring)."""

    async def add_consumer(
        self,
        stream: str,
        config: ConsumerConfig | None = None,
        *,
        timeout: float | None = None,
        **params: Any,
    ) -> ConsumerInfo:
        """Create a consumer from ``config`` and/or JetStream field ``params``. Idempotent for
        an identical config; ``AlreadyExistsError`` for a different one. Without a name or
        durable name the consumer is ephemeral and the server names it. A ``params`` key that
        is no field is ``UnknownFieldError`` (an ``InvalidArgumentError`` and a
        ``TypeError``), raised before anything is sent."""
        cfg = config_with(ConsumerConfig, config, params)
        check_durations_ns(cfg)
        req = pb.CreateConsumerRequest(stream=stream, config_json=json.dumps(cfg.to_dict()))

        async def invoke(stubs: Stubs, left_s: float) -> ConsumerInfo:
            return ConsumerInfo.from_pb(await stubs.consumers.CreateConsumer(req, timeout=left_s))

        # An ephemeral create is not idempotent: a repeat would make a second consumer.
        named = bool(cfg.name or cfg.durable_name)
        return await self._call(stream, invoke, timeout=timeout, idempotent=named)

    async def delete_consumer(
        self, stream: str, consumer: str, *, timeout: float | None = None
    ) -> bool:
        req = pb.DeleteConsumerRequest(stream=stream, consumer=consumer)

        async def invoke(stubs: Stubs, left_s: float) -> bool:
            await stubs.consumers.DeleteConsumer(req, timeout=left_s)
            return True

        return await self._call(stream, invoke, timeout=timeout, idempotent=False)

    async def consumer_info(
        self, stream: str, consumer: str, *, timeout: float | None = None
    ) -> ConsumerInfo:
        req = pb.ConsumerInfoRequest(stream=stream, consumer=consumer)

        async def invoke(stubs: Stubs, left_s: float) -> ConsumerInfo:
            return ConsumerInfo.from_pb(await stubs.consumers.GetConsumerInfo(req, timeout=left_s))

        return await self._call(stream, invoke, timeout=timeout, idempotent=True)

    async def consumers_info(
        self, stream: str, *, timeout: float | None = None
    ) -> list[ConsumerInfo]:
        """Every consumer of ``stream`` (all pages)."""

        async def page(stubs: Stubs, left_s: float, offset: int) -> tuple[list[Any], pb.Page]:
            req = pb.ListConsumersRequest(stream=stream, offset=offset)
            resp = await stubs.consumers.ListConsumers(req, timeout=left_s)
            return [ConsumerInfo.from_pb(c) for c in resp.consumers], resp.page

        return await self._paged(page, timeout=timeout)

    async def pause_consumer(
        self, stream: str, consumer: str, pause_until_ns: int, *, timeout: float | None = None
    ) -> PauseInfo:
        """Stop delivery until ``pause_until_ns`` (ns since the epoch, as ``time.time_ns()``
        counts: ``time.time_ns() + 600 * 10**9`` is ten minutes from now).

        A time that is not in the future (by this machine's clock) is refused with
        ``InvalidArgumentError`` naming ``pause_until_ns``, as ``raftstream consumer pause``
        refuses it: JetStream takes a past time as "not paused", so such a call would
        resume the consumer without a word, and a past value is mostly a wrong unit (a
        duration, or seconds since the epoch). To resume, call ``resume_consumer``. A time
        that passes while the call travels (or on a server whose clock is ahead) leaves the
        consumer not paused: check ``PauseInfo.paused``."""
        check_int("pause_until_ns", pause_until_ns, minimum=0)
        if pause_until_ns <= time.time_ns():
            raise errors.InvalidArgumentError(
                "pause_until_ns",
                f"must be in the future, in ns since the epoch (time.time_ns() + a delay), "
                f"not {pause_until_ns}; to resume, use resume_consumer",
            )
        req = pb.PauseConsumerRequest(
            stream=stream, consumer=consumer, pause_until_ns=pause_until_ns
        )

        async def invoke(stubs: Stubs, left_s: float) -> PauseInfo:
            return PauseInfo.from_pb(await stubs.consumers.PauseConsumer(req, timeout=left_s))

        return await self._call(stream, invoke, timeout=timeout, idempotent=True)

    async def resume_consumer(
        self, stream: str, consumer: str, *, timeout: float | None = None
    ) -> PauseInfo:
        req = pb.ResumeConsumerRequest(stream=stream, consumer=consumer)

        async def invoke(stubs: Stubs, left_s: float) -> PauseInfo:
            return PauseInfo.from_pb(await stubs.consumers.ResumeConsumer(req, timeout=left_s))

        return await self._call(stream, invoke, timeout=timeout, idempotent=True)

    async def update_consumer(
        self,
        stream: str,
        config: ConsumerConfig | None = None,
        *,
        timeout: float | None = None,
        **params: Any,
    ) -> ConsumerInfo:
        """Change an existing consumer (named in ``config`` and/or the JetStream field
        ``params``, as ``add_consumer`` takes them: the complete new config); immutable
        fields are refused by name, a missing consumer is ``NotFoundError``. A ``params`` key
        that is no field is ``UnknownFieldError``, raised before anything is sent."""
        cfg = config_with(ConsumerConfig, config, params)
        check_durations_ns(cfg)
        req = pb.UpdateConsumerRequest(stream=stream, config_json=json.dumps(cfg.to_dict()))

        async def invoke(stubs: Stubs, left_s: float) -> ConsumerInfo:
            return ConsumerInfo.from_pb(await stubs.consumers.UpdateConsumer(req, timeout=left_s))

        return await self._call(stream, invoke, timeout=timeout, idempotent=True)

    async def consumer_names(self, stream: str, *, timeout: float | None = None) -> list[str]:
        """Every consumer name of ``stream`` (all pages)."""

        async def page(stubs: Stubs, left_s: float, offset: int) -> tuple[list[Any], pb.Page]:
            req = pb.ConsumerNamesRequest(stream=stream, offset=offset)
            resp = await stubs.consumers.ConsumerNames(req, timeout=left_s)
            return list(resp.names), resp.page

        return await self._paged(page, timeout=timeout)

    async def reset_consumer(
        self, stream: str, consumer: str, seq: int | None = None, *, timeout: float | None = None
    ) -> ConsumerInfo:
        """Drop pending acks and restart delivery at ``seq`` (None: the deliver policy's
        start). Not retried on an ambiguous failure."""
        req = pb.ResetConsumerRequest(stream=stream, consumer=consumer)
        if seq is not None:
            req.seq = seq

        async def invoke(stubs: Stubs, left_s: float) -> ConsumerInfo:
            return ConsumerInfo.from_pb(await stubs.consumers.ResetConsumer(req, timeout=left_s))

        return await self._call(stream, invoke, timeout=timeout, idempotent=False)
