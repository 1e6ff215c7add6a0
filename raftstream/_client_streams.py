"""The stream management part of ``Client``: create, change, delete, inspect and list
streams, and read, purge or delete their messages.

``Client`` derives from ``StreamsAPI``; each method is one call through ``ClientCore._call``
(its timeout, retries and typed errors as the ``raftstream.client`` module docstring says).
"""

from __future__ import annotations

import json
from typing import Any

from raftstream import errors
from raftstream._args import check_durations_ns, check_int
from raftstream._client_core import ClientCore
from raftstream._conn import Stubs
from raftstream.config import StreamConfig, config_with
from raftstream.models import RawStreamMsg, StreamInfo
from raftstream.proto import raftstream_pb2 as pb

__all__ = ["StreamsAPI"]


class StreamsAPI(ClientCore):
    """``Client``'s stream methods (see the module docstring)."""

    async def add_stream(
        self, config: StreamConfig | None = None, *, timeout: float | None = None, **params: Any
    ) -> StreamInfo:
        """Create a stream from ``config`` and/or JetStream field ``params`` (``params``
        override ``config``). Idempotent for an identical config; ``AlreadyExistsError`` for a
        different one; ``InvalidArgumentError`` names a refused field. A ``params`` key that
        is no field is ``UnknownFieldError`` (an ``InvalidArgumentError`` and a
        ``TypeError``), raised before anything is sent."""
        cfg = config_with(StreamConfig, config, params)
        check_durations_ns(cfg)
        req = pb.CreateStreamRequest(config_json=json.dumps(cfg.to_dict()))

        async def invoke(stubs: Stubs, left_s: float) -> StreamInfo:
            return StreamInfo.from_pb(await stubs.streams.CreateStream(req, timeout=left_s))

        return await self._call(cfg.name, invoke, timeout=timeout, idempotent=True)

    async def update_stream(
        self, config: StreamConfig | None = None, *, timeout: float | None = None, **params: Any
    ) -> StreamInfo:
        """Replace a stream's config (the complete new config, as ``add_stream`` takes it)."""
        cfg = config_with(StreamConfig, config, params)
        check_durations_ns(cfg)
        req = pb.UpdateStreamRequest(config_json=json.dumps(cfg.to_dict()))

        async def invoke(stubs: Stubs, left_s: float) -> StreamInfo:
            return StreamInfo.from_pb(await stubs.streams.UpdateStream(req, timeout=left_s))

        return await self._call(cfg.name, invoke, timeout=timeout, idempotent=True)

    async def delete_stream(self, name: str, *, timeout: float | None = None) -> bool:
        """Delete a stream with its messages and consumers. Not retried on an ambiguous
        failure (it may have happened); ``NotFoundError`` when missing."""
        req = pb.DeleteStreamRequest(name=name)

        async def invoke(stubs: Stubs, left_s: float) -> bool:
            await stubs.streams.DeleteStream(req, timeout=left_s)
            return True

        return await self._call(name, invoke, timeout=timeout, idempotent=False)

    async def stream_info(
        self,
        name: str,
        *,
        subjects_filter: str | None = None,
        deleted_details: bool = False,
        timeout: float | None = None,
    ) -> StreamInfo:
        """A stream's config, state and replicas; with ``subjects_filter`` (``">"`` for all)
        ``state.subjects`` holds message counts per matching subject."""
        req = pb.StreamInfoRequest(
            name=name, subjects_filter=subjects_filter or "", deleted_details=deleted_details
        )

        async def invoke(stubs: Stubs, left_s: float) -> StreamInfo:
            return StreamInfo.from_pb(await stubs.streams.GetStreamInfo(req, timeout=left_s))

        return await self._call(name, invoke, timeout=timeout, idempotent=True)

    async def streams_info(
        self, *, subject: str | None = None, timeout: float | None = None
    ) -> list[StreamInfo]:
        """Every stream's info (all pages), or those capturing ``subject``."""

        async def page(stubs: Stubs, left_s: float, offset: int) -> tuple[list[Any], pb.Page]:
            req = pb.ListStreamsRequest(offset=offset, subject=subject or "")
            resp = await stubs.streams.ListStreams(req, timeout=left_s)
            return [StreamInfo.from_pb(s) for s in resp.streams], resp.page

        return await self._paged(page, timeout=timeout)

    async def stream_names(
        self, *, subject: str | None = None, timeout: float | None = None
    ) -> list[str]:
        """Every stream's name (all pages), or those capturing ``subject``."""

        async def page(stubs: Stubs, left_s: float, offset: int) -> tuple[list[Any], pb.Page]:
            req = pb.StreamNamesRequest(offset=offset, subject=subject or "")
            resp = await stubs.streams.StreamNames(req, timeout=left_s)
            return list(resp.names), resp.page

        return await self._paged(page, timeout=timeout)

    async def purge_stream(
        self,
        name: str,
        *,
        subject: str | None = None,
        seq: int | None = None,
        keep: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Remove messages (all; by ``subject`` filter; below ``seq``; all but the newest
        ``keep``). Returns how many were purged. Not retried on an ambiguous failure."""
        req = pb.PurgeStreamRequest(name=name)
        if subject is not None:
            req.subject = subject
        if seq is not None:
            req.seq = check_int("seq", seq, minimum=1)
        if keep is not None:
            req.keep = check_int("keep", keep, minimum=0)

        async def invoke(stubs: Stubs, left_s: float) -> int:
            return int((await stubs.streams.PurgeStream(req, timeout=left_s)).purged)

        return await self._call(name, invoke, timeout=timeout, idempotent=False)

    async def get_msg(
        self,
        stream: str,
        seq: int | None = None,
        *,
        subject: str | None = None,
        next: bool = False,
        timeout: float | None = None,
    ) -> RawStreamMsg:
        """A stored message: by ``seq``; the last on ``subject``; or with ``next`` the first
        on ``subject`` at or after ``seq``. ``NotFoundError`` when there is none."""
        req = pb.GetMessageRequest(stream=stream)
        if subject is None:
            if seq is None:
                raise errors.InvalidArgumentError("seq", "seq or subject is required")
            req.seq = check_int("seq", seq, minimum=1)
        elif next:
            req.next_by_subject = subject
            req.start_seq = check_int("seq", seq or 0, minimum=0)
        else:
            req.last_by_subject = subject

        async def invoke(stubs: Stubs, left_s: float) -> RawStreamMsg:
            resp = await stubs.streams.GetMessage(req, timeout=left_s)
            return RawStreamMsg.from_pb(stream, resp.message)

        return await self._call(stream, invoke, timeout=timeout, idempotent=True)

    async def get_last_msg(
        self, stream: str, subject: str, *, timeout: float | None = None
    ) -> RawStreamMsg:
        """The newest message on ``subject``; ``NotFoundError`` when there is none."""
        return await self.get_msg(stream, subject=subject, timeout=timeout)

    async def delete_msg(
        self, stream: str, seq: int, *, no_erase: bool = False, timeout: float | None = None
    ) -> bool:
        """Remove one message (its bytes erased unless ``no_erase``)."""
        check_int("seq", seq, minimum=1)
        req = pb.DeleteMessageRequest(stream=stream, seq=seq, no_erase=no_erase)

        async def invoke(stubs: Stubs, left_s: float) -> bool:
            await stubs.streams.DeleteMessage(req, timeout=left_s)
            return True

        return await self._call(stream, invoke, timeout=timeout, idempotent=False)
