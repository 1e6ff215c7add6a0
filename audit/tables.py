"""The four audit tables: their schemas, how a data root splits into partitions, and the
rows of one partition as Arrow record batches.

Used both by the Spark data source (``source.py``, each partition read in a Python worker)
and by the Parquet export (``export.py``), so the two inputs of an audit hold the same rows.
docs/audit.md documents every column.

Partitions: ``messages`` one or more per stream per node (a store larger than
``rows_per_partition`` splits by sequence range), ``raft_log`` one or more per group per
node (split by index range), ``consumers`` and ``streams`` one per node. A ``Part`` is a
small picklable value; reading it opens the node's environments read-only
(``layout.open_readonly``) and closes them before returning.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from raftstream.audit import logview as lv
from raftstream.audit.layout import NodeDir, discover_nodes, open_readonly
from raftstream.audit.readers import (
    GroupInfo,
    content_hash,
    iter_raft_entries,
    iter_store_msgs,
    open_named_db,
    raft_groups,
    read_snapshot_data,
    snapshot_header,
    split_group,
    store_streams,
)
from raftstream.engine.consumer_store import DB_META, DB_PENDING, ConsumerKey, LmdbConsumerStore
from raftstream.engine.entries import HDR_MSG_ID
from raftstream.engine.store import StoredMsg
from raftstream.errors import DataLossError

__all__ = [
    "BATCH_ROWS",
    "DEFAULT_ROWS_PER_PARTITION",
    "HDR_STREAM_SOURCE",
    "SCHEMAS",
    "TABLES",
    "Part",
    "pack_parts",
    "plan_parts",
    "read_part",
    "spark_ddl",
]

BATCH_ROWS = 8192  # rows per Arrow record batch handed to Spark or to the Parquet writer
DEFAULT_ROWS_PER_PARTITION = 1_000_000
META_GROUP = "meta"  # cluster/meta/group.py
# JetStream's header on a mirrored or sourced message: "<origin stream> <origin seq> ...".
HDR_STREAM_SOURCE = "Nats-Stream-Source"

_S, _I, _B = pa.string(), pa.int64(), pa.bool_()
_SEQS = pa.list_(pa.int64())
SCHEMAS: dict[str, pa.Schema] = {
    "messages": pa.schema(
        [
            *[("node", _S), ("stream", _S), ("account", _S), ("seq", _I)],
            *[("raft_term", _I), ("raft_index", _I), ("ts_ns", _I), ("subject", _S)],
            *[("msg_id", _S), ("hash", _S), ("origin_hash", _S), ("size", _I)],
            *[("origin_stream", _S), ("origin_seq", _I)],
        ]
    ),
    "raft_log": pa.schema(
        [
            *[("node", _S), ("group", _S), ("stream", _S), ("account", _S)],
            *[("index", _I), ("term", _I), ("type", _S), ("kind", _S), ("data_hash", _S)],
            *[("commit", _I), ("publishes", _I), ("deleted_seqs", _SEQS)],
            *[("purge", _B), ("expire", _B), ("rollup", _B)],
        ]
    ),
    "consumers": pa.schema(
        [
            *[("node", _S), ("stream", _S), ("account", _S), ("consumer", _S)],
            *[("ack_policy", _S), ("delivered_stream_seq", _I), ("delivered_consumer_seq", _I)],
            *[("ack_floor_stream_seq", _I), ("num_pending", _I), ("pending_seqs", _SEQS)],
            *[("acked_seqs", _SEQS), ("replay_error", _S)],
        ]
    ),
    "streams": pa.schema(
        [
            *[("node", _S), ("stream", _S), ("account", _S), ("group", _S)],
            *[("first_seq", _I), ("last_seq", _I), ("msgs", _I), ("bytes", _I)],
            *[("commit", _I), ("last_index", _I), ("last_term", _I), ("snapshot_index", _I)],
            *[("max_msgs", _I), ("max_bytes", _I), ("max_age_ns", _I)],
            *[("max_msgs_per_subject", _I), ("retention", _S), ("duplicate_window_ns", _I)],
            *[("mirror", _S), ("sources", pa.list_(_S))],
        ]
    ),
}
TABLES = tuple(SCHEMAS)
_DDL = {pa.string(): "STRING", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}
DEFAULT_DUPLICATE_WINDOW_NS = 120 * 10**9  # JetStream's default, as engine/stream_config.py


def spark_ddl(table: str) -> str:
    """The Spark DDL schema string of ``table`` (same columns and order as ``SCHEMAS``)."""
    cols = []
    for f in SCHEMAS[table]:
        if pa.types.is_list(f.type):
            cols.append(f"`{f.name}` ARRAY<{_DDL[f.type.value_type]}>")
        else:
            cols.append(f"`{f.name}` {_DDL[f.type]}")
    return ", ".join(cols)


@dataclass(frozen=True, slots=True)
class Part:
    """One partition: ``table`` rows of ``name`` (store name or group id) on node ``node``
    at ``path``; ``lo``/``hi`` bound the sequences (messages) or indexes (raft_log)."""

    table: str
    node: str
    path: str
    name: str = ""
    stream_id: int = 0
    lo: int = 0
    hi: int = 0


def pack_parts(parts: list[Part], rows_per_partition: int) -> list[tuple[Part, ...]]:
    """Group the parts of each node into Spark partitions of about ``rows_per_partition``
    sequences (or indexes): a large stream keeps its own partitions, small streams of a node
    share one, since each Spark task costs a round trip to a Python worker."""
    out: list[tuple[Part, ...]] = []
    cur: list[Part] = []
    size = 0
    for p in parts:
        n = max(1, p.hi - p.lo)
        if cur and (cur[0].node != p.node or size + n > rows_per_partition):
            out.append(tuple(cur))
            cur, size = [], 0
        cur.append(p)
        size += n
    if cur:
        out.append(tuple(cur))
    return out


def plan_parts(root: str, table: str, rows_per_partition: int) -> list[Part]:
    """The partitions of ``table`` for every node under ``root`` (see the module doc)."""
    if table not in SCHEMAS:
        raise ValueError(f"unknown table {table!r}; one of {', '.join(TABLES)}")
    out: list[Part] = []
    for node in discover_nodes(root):
        out += _node_parts(node, table, max(1, rows_per_partition))
    return out


def _node_parts(node: NodeDir, table: str, step: int) -> list[Part]:
    path = str(node.path)
    if table == "streams":
        return [Part(table, node.name, path)]
    if table == "messages":
        if node.store is None:
            return []
        with _env(node.store) as env:
            streams = store_streams(env)
        return [
            Part(
                table, node.name, path, s.name, s.stream_id, lo, min(lo + step, s.meta.last_seq + 1)
            )
            for s in streams
            for lo in range(max(1, s.meta.first_seq), s.meta.last_seq + 1, step)
        ]
    if node.raft is None:
        return []
    with _env(node.raft) as env:
        groups = raft_groups(env)
    if table == "consumers":
        # Consumer rows are few (one per consumer): one partition per node, not per group.
        return (
            [Part(table, node.name, path)] if any(g.group.startswith("S:") for g in groups) else []
        )
    return [
        Part(table, node.name, path, g.group, 0, lo, min(lo + step, g.last_index + 1))
        for g in groups
        for lo in range(g.snapshot.index + 1, g.last_index + 1, step)
    ]


class _env:
    """Context manager: a read-only environment at ``path`` (None: no environment)."""

    def __init__(self, path: Path | None) -> None:
        self._env = open_readonly(path) if path is not None else None

    def __enter__(self) -> Any:
        return self._env

    def __exit__(self, *exc: object) -> None:
        if self._env is not None:
            self._env.close()


def read_part(part: Part) -> Iterator[pa.RecordBatch]:
    """The rows of ``part`` as record batches of at most ``BATCH_ROWS`` rows."""
    node = NodeDir(part.node, Path(part.path))
    readers = {
        "messages": _message_rows,
        "raft_log": _raft_rows,
        "consumers": _consumer_rows,
        "streams": _stream_rows,
    }
    schema = SCHEMAS[part.table]
    rows: list[dict[str, Any]] = []
    for row in readers[part.table](node, part):
        rows.append(row)
        if len(rows) >= BATCH_ROWS:
            yield pa.RecordBatch.from_pylist(rows, schema=schema)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def _group_info(env: Any, group: str) -> GroupInfo | None:
    if env is None:
        return None
    return next((g for g in raft_groups(env) if g.group == group), None)


def _snapshot_last_seq(env: Any, info: GroupInfo | None) -> int:
    if info is None or info.snapshot.index == 0:
        return 0
    try:
        return int(snapshot_header(read_snapshot_data(env, info.prefix)).get("last_seq", 0))
    except DataLossError:
        return 0


def _origin(headers: Any) -> tuple[str | None, int | None]:
    text = headers.get(HDR_STREAM_SOURCE)
    if not text:
        return None, None
    parts = str(text).split()
    if len(parts) < 2 or not parts[1].isdigit():
        return parts[0] if parts else None, None
    return parts[0], int(parts[1])


def _origin_hash(m: StoredMsg) -> str:
    """The content hash of a mirrored or sourced message as its origin stored it: the
    source header (the only thing a mirror or source adds) left out."""
    own = {k: v for k, v in m.headers.items() if k != HDR_STREAM_SOURCE}
    return content_hash(m.subject, own, m.data)


# The LinkIndex of the last group log read in this process. A stream larger than
# rows_per_partition is read as several partitions of one node, mostly by the same reused
# Python worker: without this each of them decoded the group's whole log again (and built
# its key map again), so reading a stream grew with its size times its partition count.
# Keyed by what identifies one log's content: the environment's path and data file
# (modification time, size), the group, its last entry's index and term, its snapshot.
_LAST_LINK_INDEX: list[tuple[tuple[Any, ...], lv.LinkIndex]] = []


def _link_index(node: NodeDir, raft: Any, info: GroupInfo | None) -> lv.LinkIndex:
    """The ``LinkIndex`` of ``info``'s group log on ``node`` (empty without one)."""
    path = node.raft
    if info is None or raft is None or path is None:
        return lv.LinkIndex(())
    stat = (path / "data.mdb").stat()
    key = (
        str(path.resolve()),
        stat.st_mtime_ns,
        stat.st_size,
        info.group,
        info.last_index,
        info.last_term,
        info.snapshot.index,
    )
    if _LAST_LINK_INDEX and _LAST_LINK_INDEX[0][0] == key:
        return _LAST_LINK_INDEX[0][1]
    _LAST_LINK_INDEX.clear()  # the previous one goes before the next is built (memory)
    index = lv.LinkIndex(iter_raft_entries(raft, info.prefix))
    _LAST_LINK_INDEX.append((key, index))
    return index


def _message_rows(node: NodeDir, part: Part) -> Iterator[dict[str, Any]]:
    account, stream = split_group(part.name)
    with ExitStack() as stack:
        store = stack.enter_context(_env(node.store))
        raft = stack.enter_context(_env(node.raft))
        info = _group_info(raft, part.name)
        linker = lv.Linker(_link_index(node, raft, info))
        linked_from = _snapshot_last_seq(raft, info) + 1
        for m in iter_store_msgs(store, part.stream_id, part.lo, part.hi):
            msg_id = m.headers.get(HDR_MSG_ID)
            link = linker.link(lv.link_key(m.data, msg_id)) if m.seq >= linked_from else None
            origin_stream, origin_seq = _origin(m.headers)
            h = content_hash(m.subject, m.headers, m.data)
            yield {
                "node": node.name,
                "stream": stream,
                "account": account,
                "seq": m.seq,
                "raft_term": link[0] if link else None,
                "raft_index": link[1] if link else None,
                "ts_ns": m.ts,
                "subject": m.subject,
                "msg_id": msg_id,
                "hash": h,
                "origin_hash": h if origin_stream is None else _origin_hash(m),
                "size": m.size,
                "origin_stream": origin_stream,
                "origin_seq": origin_seq,
            }


def _raft_rows(node: NodeDir, part: Part) -> Iterator[dict[str, Any]]:
    account, stream = split_group(part.name) if part.name.startswith("S:") else ("", "")
    with _env(node.raft) as raft:
        info = _group_info(raft, part.name)
        if info is None:
            return
        for e in iter_raft_entries(raft, info.prefix, part.lo):
            if e.index >= part.hi:
                return
            s = lv.summarize(e, part.name)
            yield {
                "node": node.name,
                "group": part.name,
                "stream": stream or None,
                "account": account or None,
                "index": e.index,
                "term": e.term,
                "type": e.type.name.lower(),
                "kind": s.kind,
                "data_hash": content_hash("", {}, e.data),
                "commit": info.hard_state.commit,
                "publishes": s.publishes,
                "deleted_seqs": s.deleted_seqs,
                "purge": s.purge,
                "expire": s.expire,
                "rollup": s.rollup,
            }


def _consumer_rows(node: NodeDir, part: Part) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        raft = stack.enter_context(_env(node.raft))
        store = stack.enter_context(_env(node.store))
        for info in raft_groups(raft) if raft is not None else []:
            if info.group.startswith("S:"):
                yield from _group_consumer_rows(node, info, raft, store)


def _group_consumer_rows(
    node: NodeDir, info: GroupInfo, raft: Any, store: Any
) -> Iterator[dict[str, Any]]:
    account, stream = split_group(info.group)
    images: dict[str, Any] = {}
    if info.snapshot.index:
        header = snapshot_header(read_snapshot_data(raft, info.prefix))
        images = lv.snapshot_images(header)
    replays = lv.replay_consumers(iter_raft_entries(raft, info.prefix), images)
    persisted = _persisted_consumers(store, stream)
    for name in sorted(set(replays) | set(persisted)):
        replay = replays.get(name)
        acked = replay.acked if replay is not None else set()
        if name in persisted:
            # Persisted engine state is what a consumer would resume from: check it
            # against the acknowledgements the log holds.
            cfg, state = persisted[name]
            error = ""
        else:
            cfg, state, error = replays[name].config, replays[name].state, replays[name].error
        floor = state.ack_floor_stream_seq
        yield {
            "node": node.name,
            "stream": stream,
            "account": account,
            "consumer": name,
            "ack_policy": str(cfg.ack_policy.value) if cfg is not None else None,
            "delivered_stream_seq": state.delivered_stream_seq,
            "delivered_consumer_seq": state.delivered_consumer_seq,
            "ack_floor_stream_seq": floor,
            "num_pending": len(state.pending),
            "pending_seqs": sorted(state.pending),
            "acked_seqs": sorted(s for s in acked if s > floor),
            "replay_error": error or None,
        }


def _persisted_consumers(store: Any, stream: str) -> dict[str, Any]:
    """Consumer states the engine's ``LmdbConsumerStore`` keeps in the store environment
    for ``stream`` (none when the environment has no consumer DBs)."""
    if store is None or open_named_db(store, DB_META) is None:
        return {}
    if open_named_db(store, DB_PENDING) is None:
        return {}
    cstore = LmdbConsumerStore(env=store)  # opens the two existing DBs: reads only
    out: dict[str, Any] = {}
    for name in cstore.names(stream):
        loaded = cstore.load(ConsumerKey(stream=stream, consumer=name))
        if loaded is not None:
            out[name] = loaded
    return out


def _stream_config(
    raft: Any, info: GroupInfo | None, meta_configs: dict[str, Any]
) -> dict[str, Any]:
    """The stream's config as the node's logs define it: the meta log's, replaced by the
    snapshot's and then by any ``UpdateConfig`` in the group's own log."""
    config: dict[str, Any] = dict(meta_configs.get(info.group, {})) if info is not None else {}
    if info is None:
        return config
    if info.snapshot.index:
        # An unreadable snapshot is reported by the raft_log table; the config then comes
        # from the logs alone.
        with suppress(DataLossError):
            config.update(snapshot_header(read_snapshot_data(raft, info.prefix)).get("config", {}))
    for e in iter_raft_entries(raft, info.prefix):
        s = lv.summarize(e, info.group)
        if s.config is not None:
            config.update(s.config)
    return config


def _stream_rows(node: NodeDir, part: Part) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        raft = stack.enter_context(_env(node.raft))
        store = stack.enter_context(_env(node.store))
        groups = {g.group: g for g in raft_groups(raft)} if raft is not None else {}
        stored = {s.name: s for s in store_streams(store)} if store is not None else {}
        meta = groups.get(META_GROUP)
        meta_configs = lv.meta_stream_configs(iter_raft_entries(raft, meta.prefix)) if meta else {}
        names = sorted({g for g in groups if g.startswith("S:")} | set(stored))
        for name in names:
            yield _stream_row(
                node.name, name, groups.get(name), stored.get(name), raft, meta_configs
            )


def _stream_row(
    node: str, name: str, info: GroupInfo | None, stored: Any, raft: Any, meta: dict[str, Any]
) -> dict[str, Any]:
    account, stream = split_group(name)
    cfg = _stream_config(raft, info, meta)
    m = stored.meta if stored is not None else None
    lim = m.limits if m is not None else None
    mirror = cfg.get("mirror")
    sources = cfg.get("sources")
    window = int(cfg.get("duplicate_window") or 0) or DEFAULT_DUPLICATE_WINDOW_NS
    return {
        "node": node,
        "stream": stream,
        "account": account,
        "group": name,
        "first_seq": m.first_seq if m else None,
        "last_seq": m.last_seq if m else None,
        "msgs": m.msgs if m else None,
        "bytes": m.bytes if m else None,
        "commit": info.hard_state.commit if info else None,
        "last_index": info.last_index if info else None,
        "last_term": info.last_term if info else None,
        "snapshot_index": info.snapshot.index if info else None,
        "max_msgs": lim.max_msgs if lim else None,
        "max_bytes": lim.max_bytes if lim else None,
        "max_age_ns": lim.max_age_ns if lim else None,
        "max_msgs_per_subject": lim.max_msgs_per_subject if lim else None,
        "retention": str(cfg.get("retention", "limits")),
        "duplicate_window_ns": window,
        "mirror": str(mirror["name"]) if isinstance(mirror, dict) and "name" in mirror else None,
        "sources": [str(s["name"]) for s in sources if isinstance(s, dict) and "name" in s]
        if isinstance(sources, list)
        else None,
    }
