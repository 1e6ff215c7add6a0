"""What a node's Raft logs say: entry summaries, the message-to-entry link, stream configs
and consumer states, all derived from the decoded entries.

The link (which Raft entry stored the message at a sequence). Neither the store nor the log
records the sequence a publish got (it is the result of applying it), so it is derived:
messages and the publishes that produced them appear in the same order, the message at a
higher sequence always coming from a later publish. ``Linker`` walks both in order and links
each stored message to the next publish with the same key (payload and msg id). Publishes
that stored nothing (refused, deduplicated) or whose messages are gone (deleted, purged) are
skipped. A stored message that matches no publish (it predates the log's snapshot, or it
did not come from the log at all) gets no link, and does not move the walk. Ambiguity: a
refused publish with the very same payload and msg id just before the accepted one takes
the link; the (term, index) is then that of an entry a few positions earlier.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftstream.cluster.stream.entries import (
    ConsumerDelete,
    ConsumerOps,
    ConsumerPut,
    GroupEntry,
    StreamBatch,
    decode,
)
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import (
    Ack,
    Changes,
    ConsumerState,
    Reset,
    Start,
    apply_op,
    decode_state,
)
from raftstream.engine.entries import (
    HDR_MSG_ID,
    HDR_ROLLUP,
    Copy,
    DeleteMsg,
    Expire,
    Publish,
    Purge,
    UpdateConfig,
)
from raftstream.errors import DataLossError, InvariantError
from raftstream.raft.types import Entry, EntryType

__all__ = [
    "LINK_WINDOW_PUBLISHES",
    "ConsumerReplay",
    "EntrySummary",
    "LinkIndex",
    "Linker",
    "link_key",
    "meta_stream_configs",
    "replay_consumers",
    "summarize",
]

# A message is first looked for this many publishes ahead of the walk; beyond, an index
# by key is built once (only a log with a long run of removed or refused publishes needs it).
LINK_WINDOW_PUBLISHES = 4096
_KEY_BYTES = 8


def link_key(data: bytes, msg_id: str | None) -> int:
    """The 8-byte key that links a stored message to its publish: payload and msg id.

    The subject is left out on purpose: a subject transform changes it between the publish
    and the store. A collision can only misplace a (term, index) link, never hide a finding
    about content (content is compared by ``content_hash``)."""
    h = hashlib.blake2b(data, digest_size=_KEY_BYTES)
    if msg_id:
        h.update(b"\0" + msg_id.encode())
    return int.from_bytes(h.digest(), "big", signed=True)


@dataclass(slots=True)
class EntrySummary:
    """What one Raft entry of a stream group did, for the ``raft_log`` table."""

    kind: str
    publishes: int = 0
    deleted_seqs: list[int] = field(default_factory=list)
    purge: bool = False
    expire: bool = False
    rollup: bool = False
    config: dict[str, Any] | None = None


def _decode_group(entry: Entry) -> GroupEntry | None:
    if entry.type is EntryType.CONF_CHANGE:
        return None
    if not entry.data:
        return None  # a new leader's no-op
    return decode(entry.data)


def summarize(entry: Entry, group: str) -> EntrySummary:
    """The summary of ``entry`` of ``group``; unreadable data gives kind ``unreadable``
    (the entry passed its checksum, so its bytes are what was proposed)."""
    if entry.type is EntryType.CONF_CHANGE:
        return EntrySummary("conf_change")
    if not entry.data:
        return EntrySummary("noop")
    if not group.startswith("S:"):
        return EntrySummary("meta")
    try:
        ge = decode(entry.data)
    except DataLossError:
        return EntrySummary("unreadable")
    if isinstance(ge, StreamBatch):
        return _summarize_batch(ge)
    kinds = {ConsumerPut: "consumer_put", ConsumerDelete: "consumer_delete"}
    return EntrySummary(
        kinds.get(type(ge), "consumer_ops" if isinstance(ge, ConsumerOps) else "leader")
    )


def _summarize_batch(batch: StreamBatch) -> EntrySummary:
    s = EntrySummary("stream")
    for e in batch.entries:
        if isinstance(e, Publish):
            s.publishes += 1
            s.rollup = s.rollup or bool(e.headers.get(HDR_ROLLUP))
        elif isinstance(e, Copy):  # a rollup copy removes as a rollup publish does
            s.rollup = s.rollup or (e.rollup and bool(e.headers.get(HDR_ROLLUP)))
        elif isinstance(e, DeleteMsg):
            s.deleted_seqs.append(e.seq)
        elif isinstance(e, Purge):
            s.purge = True
        elif isinstance(e, Expire):
            s.expire = True
        elif isinstance(e, UpdateConfig):
            s.config = e.config.to_dict()
    return s


class LinkIndex:
    """The publishes of a group's log, in log order, for ``Linker`` walks (module doc).

    Three compact arrays (index, term, key) per publish, about 24 bytes each, and, built on
    the first walk that needs it, a map from key to positions. Read-only once built, so
    every walk over the same log can share one (``tables`` keeps the last one per Python
    worker: a stream split into several partitions decodes its log once, not once each).
    """

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.index = array("q")
        self.term = array("q")
        self.keys = array("q")
        for entry in entries:
            ge = _safe_decode(entry)
            if not isinstance(ge, StreamBatch):
                continue
            for e in ge.entries:
                if isinstance(e, Publish):
                    msg_id = e.msg_id or e.headers.get(HDR_MSG_ID)
                    self.index.append(entry.index)
                    self.term.append(entry.term)
                    self.keys.append(link_key(bytes(e.data), msg_id))
        self._by_key: dict[int, list[int]] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def positions(self, key: int) -> list[int]:
        """The positions of the publishes with ``key``, ascending."""
        if self._by_key is None:
            self._by_key = {}
            for i, k in enumerate(self.keys):
                self._by_key.setdefault(k, []).append(i)
        return self._by_key.get(key, [])


class Linker:
    """Links stored messages, in sequence order, to the publishes of a log (module doc).

    Built from the group's entries or from a ``LinkIndex`` of them (shared between walks).
    Not thread-safe; one walk per object.
    """

    def __init__(self, source: Iterable[Entry] | LinkIndex) -> None:
        self._log = source if isinstance(source, LinkIndex) else LinkIndex(source)
        self._pos = 0

    def __len__(self) -> int:
        return len(self._log)

    def link(self, key: int) -> tuple[int, int] | None:
        """(term, index) of the next publish with ``key``, or None (the walk stays put)."""
        keys, pos = self._log.keys, self._pos
        stop = min(len(keys), pos + LINK_WINDOW_PUBLISHES)
        for i in range(pos, stop):
            if keys[i] == key:
                return self._take(i)
        if stop == len(keys):
            return None
        hits = self._log.positions(key)
        j = bisect_left(hits, stop)
        return self._take(hits[j]) if j < len(hits) else None

    def _take(self, i: int) -> tuple[int, int]:
        self._pos = i + 1
        return self._log.term[i], self._log.index[i]


def _safe_decode(entry: Entry) -> GroupEntry | None:
    try:
        return _decode_group(entry)
    except DataLossError:
        return None  # reported by the raft_log table (kind "unreadable"), not here


def meta_stream_configs(entries: Iterable[Entry]) -> dict[str, dict[str, Any]]:
    """Group id -> the latest stream config (JetStream JSON) the meta log defines.

    Read from the raw JSON body (``u8 version | u8 kind | JSON``, ``cluster/meta/entries.py``)
    rather than through ``StreamConfig``, so fields the config class does not know yet
    (``mirror``, ``sources``) reach the audit. A deleted stream is forgotten.
    """
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        body = _meta_body(entry)
        if body is None or "stream" in body:
            continue  # not a stream definition (a consumer's carries its stream's name)
        account = str(body.get("account", ""))
        config = body.get("config")
        if isinstance(config, dict) and "name" in config:
            out[f"S:{account}:{config['name']}"] = config
        elif "name" in body and config is None:
            out.pop(f"S:{account}:{body['name']}", None)
    return out


def _meta_body(entry: Entry) -> dict[str, Any] | None:
    if entry.type is not EntryType.NORMAL or len(entry.data) < 3:
        return None
    try:
        body = json.loads(entry.data[2:])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


@dataclass(slots=True)
class ConsumerReplay:
    """A consumer's state replayed from its group's log, and the stream sequences its log
    acknowledged since the consumer last started over (``Start``/``Reset``)."""

    config: ConsumerConfig | None
    state: ConsumerState
    acked: set[int] = field(default_factory=set)
    error: str = ""


def replay_consumers(
    entries: Iterable[Entry], images: Mapping[str, tuple[ConsumerConfig, ConsumerState]]
) -> dict[str, ConsumerReplay]:
    """Consumers of a stream group, replayed with the engine's ``apply_op`` from the
    snapshot's ``images`` and the entries after it.

    The ``Start`` the leader computes from its store at creation is not in the log (every
    replica computes it), so a consumer created in the log starts from an empty state: its
    cursor and ack floor are then at most the true ones, never above. An op the engine
    refuses (``InvariantError``) stops that consumer's replay and is kept in ``error``.
    """
    out = {name: ConsumerReplay(cfg, st) for name, (cfg, st) in images.items()}
    for entry in entries:
        ge = _safe_decode(entry)
        if isinstance(ge, ConsumerPut):
            c = out.setdefault(ge.name, ConsumerReplay(ge.config, ConsumerState()))
            c.config = ge.config
        elif isinstance(ge, ConsumerDelete):
            out.pop(ge.name, None)
        elif isinstance(ge, ConsumerOps) and ge.name in out:
            _replay_ops(out[ge.name], ge)
    return out


def _replay_ops(c: ConsumerReplay, ops: ConsumerOps) -> None:
    if c.error or c.config is None:
        return
    for op in ops.ops:
        try:
            apply_op(c.state, c.config, op, Changes())
        except InvariantError as exc:
            c.error = str(exc)
            return
        if isinstance(op, Start | Reset):
            c.acked.clear()
        elif isinstance(op, Ack):
            c.acked.update(op.stream_seqs)


def snapshot_images(header: Mapping[str, Any]) -> dict[str, tuple[ConsumerConfig, ConsumerState]]:
    """The consumers of a stream snapshot header (``readers.snapshot_header``)."""
    out: dict[str, tuple[ConsumerConfig, ConsumerState]] = {}
    for c in header.get("consumers", []):
        out[str(c["name"])] = (
            ConsumerConfig.from_dict(c["config"]),
            decode_state(bytes.fromhex(c["state"])),
        )
    return out


def iter_publishes(entries: Iterable[Entry]) -> Iterator[tuple[Entry, Publish]]:
    """Every publish of a stream group's entries with the Raft entry carrying it."""
    for entry in entries:
        ge = _safe_decode(entry)
        if isinstance(ge, StreamBatch):
            for e in ge.entries:
                if isinstance(e, Publish):
                    yield entry, e
