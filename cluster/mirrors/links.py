"""The set of mirror/source links of one stream group, kept in line with its config.

``StreamGroup`` owns one ``LinkSet``: ``sync`` (called when its leader barrier applies and
after every apply while it leads; cheap when the config did not change) starts a
``MirrorLink`` per origin of the current config and stops those the config dropped;
``stop_all`` runs when leadership is lost, ``close`` when the group closes (it waits for the
links to end, ``LINK_CLOSE_WAIT_S`` at most, then abandons their cleanup). ``source_infos``
builds the ``StreamSourceInfo`` of ``GetStreamInfo`` from the replicated positions plus,
where a link runs here, its leader-local lag, activity and error. The proto's ``lag`` has
no "unknown": while a link has learnt nothing of its origin (or none runs here yet) it is
sent as 0 with an ``error`` saying the lag is not known, never as a plain 0. Owned by the
node's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.mirrors.link import LinkHost, LinkInfo, MirrorLink, link_consumer_name
from raftstream.engine.origins import OriginState
from raftstream.engine.stream_config import StreamConfig
from raftstream.engine.stream_source import StreamSource, source_key
from raftstream.proto import raftstream_pb2 as pb
from raftstream.raft.transport.tls import PeerTls

__all__ = ["LinkSet", "links_of"]

# The error shown with lag 0 while the lag is not known (and the link has no error of its own).
LAG_UNKNOWN_STARTING = "the link has not reached its origin yet: lag not known"
LAG_UNKNOWN_NOT_RUNNING = "no link runs on this leader yet: lag not known"
# How long ``close`` (the group closes: its node stops, or the group left it) waits for its
# links' sessions to end before abandoning their cleanup (``MirrorLink.abandon``). Against
# an origin that answers, a session ends in milliseconds; when the whole cluster stops at
# once the origin answers nothing, and each link waited about 4 s for it.
LINK_CLOSE_WAIT_S = 0.5
ABANDON_POLL_S = 0.05  # how often an abandoned cleanup is interrupted again
ABANDON_TRIES_MAX = 40  # then ``close`` returns anyway, logging the links still ending
log = logging.getLogger(__name__)


def links_of(config: StreamConfig) -> tuple[StreamSource, ...]:
    """The origins ``config`` copies from: its mirror, or its sources."""
    return (config.mirror,) if config.mirror is not None else config.sources


class LinkSet:
    """The running links of one stream group (module docstring)."""

    def __init__(
        self,
        *,
        host: LinkHost,
        account: str,
        stream: str,
        servers: Callable[[], tuple[str, ...]],
        log_extra: dict[str, str],
        tls: PeerTls | None = None,
        token: str | None = None,
        clock: NodeClock = SYSTEM_CLOCK,
    ) -> None:
        self._host = host
        self._clock = clock  # the stream group's, for its links
        self._tls = tls  # the node's TLS, for every link's connection (docs/tls.md)
        self._token = token  # the account's node token, for same-cluster origins
        self._account = account
        self._stream = stream
        self._servers = servers
        self._extra = log_extra
        self._links: dict[str, MirrorLink] = {}
        self._config: StreamConfig | None = None
        self._stopping: dict[asyncio.Task[None], MirrorLink] = {}  # link.stop() running

    def sync(self, config: StreamConfig) -> None:
        """Start the links ``config`` asks for, stop the others (this node leads)."""
        if config is self._config:
            return
        self._config = config
        mirror = config.mirror is not None
        wanted = {source_key(s): s for s in links_of(config)}
        for key in [k for k, link in self._links.items() if wanted.get(k) != link.source]:
            self._stop_later(self._links.pop(key))
        for key, src in wanted.items():
            if key in self._links:
                continue
            link = MirrorLink(
                host=self._host,
                source=src,
                mirror=mirror,
                consumer_name=link_consumer_name(self._account, self._stream, src, mirror=mirror),
                servers=self._servers,
                log_extra=self._extra,
                tls=self._tls,
                token=self._token,
                clock=self._clock,
            )
            self._links[key] = link
            link.start()

    def stop_all(self) -> None:
        """Leadership lost: stop every link (their sessions end at once)."""
        self._config = None
        for link in self._links.values():
            self._stop_later(link)
        self._links.clear()

    async def close(self) -> None:
        """Stop every link and wait for them, ``LINK_CLOSE_WAIT_S`` at most: then their
        cleanup is abandoned (a stop must not wait on an origin that does not answer)."""
        self.stop_all()
        stopping = dict(self._stopping)
        if not stopping:
            return
        _, late = await asyncio.wait(stopping, timeout=LINK_CLOSE_WAIT_S)
        for _ in range(ABANDON_TRIES_MAX):
            if not late:
                return
            for task in late:
                stopping[task].abandon()
            _, late = await asyncio.wait(late, timeout=ABANDON_POLL_S)
        if late:
            keys = ", ".join(sorted(stopping[t].key for t in late))
            log.warning("links to %s did not end; closing anyway", keys, extra=self._extra)

    def _stop_later(self, link: MirrorLink) -> None:
        task = asyncio.get_running_loop().create_task(link.stop())
        self._stopping[task] = link
        task.add_done_callback(lambda t: self._stopping.pop(t, None))

    def source_infos(
        self, config: StreamConfig, origins: Mapping[str, OriginState]
    ) -> list[pb.StreamSourceInfo]:
        """One ``StreamSourceInfo`` per origin of ``config``, in config order."""
        out = []
        for src in links_of(config):
            key = source_key(src)
            link = self._links.get(key)
            live = link.info() if link is not None else LinkInfo(None, -1, None, running=False)
            pos = origins.get(key, OriginState())
            error = live.error
            if live.lag is None and error is None:
                error = LAG_UNKNOWN_STARTING if live.running else LAG_UNKNOWN_NOT_RUNNING
            out.append(
                pb.StreamSourceInfo(
                    name=src.name,
                    external_api=list(src.external.api) if src.external is not None else [],
                    lag=live.lag or 0,  # None: not known, and ``error`` says so
                    active_ns=live.active_ns,
                    error=error or "",
                    last_origin_seq=pos.last_seq,
                    skipped=[pb.SkippedRange(first_seq=lo, last_seq=hi) for lo, hi in pos.skipped],
                    skipped_msgs=pos.skipped_msgs,
                    filter_subject=src.filter_subject or "",
                    running=live.running,
                )
            )
        return out
