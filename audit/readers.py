"""Raw reads of a node's environments with the engine's and the Raft storage's own codecs.

Nothing here writes: the environments come from ``layout.open_readonly``. Every record is
decoded with the codec that wrote it (``engine/lmdbrecords.py``, ``raft/storage/codec.py``),
so a record that fails its CRC raises ``DataLossError`` here exactly as on the node. The
store classes themselves are not used because opening an ``LmdbStreamStore`` registers the
stream (a write); these functions walk the same keys read-only.

Layouts read (see the modules named above for the bytes):

- store env: ``rs.meta`` (``N name`` -> stream id, ``M id`` -> meta), ``rs.msgs``
  (``id seq`` -> message), and, when present, the engine consumer DBs
  (``engine/consumer_store.py``);
- raft env: ``groups`` (group id -> 4-byte prefix), ``entries``, ``hardstate``, ``snapmeta``,
  ``snapgen`` and ``snapchunks`` (the snapshot data in chunks), ``snapdata`` (the older
  layout's single value; ``raft/storage/lmdb_storage.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lmdb

from raftstream.cluster.common.names import split_group_id
from raftstream.cluster.common.raft_errors import app_error
from raftstream.engine.lmdbrecords import (
    ID,
    SEQ,
    StreamMeta,
    decode_id,
    decode_meta,
    decode_msg,
)
from raftstream.engine.store import StoredMsg
from raftstream.errors import DataLossError
from raftstream.raft.errors import DataLossError as RaftDataLossError
from raftstream.raft.storage import codec
from raftstream.raft.storage.lmdb_storage import read_snapshot_value
from raftstream.raft.types import Entry, HardState, SnapshotMeta

__all__ = [
    "GroupInfo",
    "StoredStream",
    "content_hash",
    "iter_raft_entries",
    "iter_store_msgs",
    "open_named_db",
    "raft_groups",
    "read_snapshot_data",
    "snapshot_header",
    "split_group",
    "store_streams",
]

_STORE_META_DB = b"rs.meta"
_STORE_MSGS_DB = b"rs.msgs"
_RAFT_DBS = (b"groups", b"entries", b"hardstate", b"snapmeta", b"snapdata")
HASH_BYTES = 16  # blake2b digest size of the content hash (hex: 32 characters)


def open_named_db(env: Any, name: bytes) -> Any | None:
    """The handle of named DB ``name``, or None when the environment has none."""
    try:
        return env.open_db(name, create=False)
    except (lmdb.NotFoundError, lmdb.ReadonlyError):
        return None


def split_group(name: str) -> tuple[str, str]:
    """(account, stream) of a stream group id ``S:<account>:<stream>``; a name of another
    shape (an engine store opened outside the cluster) is its own stream, account ``""``."""
    return split_group_id(name) or ("", name)


def content_hash(subject: str, headers: Any, data: bytes) -> str:
    """blake2b hex of a message's subject, headers (sorted) and payload: what replicas must
    agree on at a sequence. The encoding is length-prefixed so no two messages collide by
    concatenation."""
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    parts: list[bytes] = [subject.encode()]
    for k in sorted(headers):
        parts += (k.encode(), str(headers[k]).encode())
    for p in parts:
        h.update(struct.pack(">I", len(p)))
        h.update(p)
    h.update(data)
    return h.hexdigest()


# -- the stream store ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredStream:
    """A stream registered in a store environment: its store name, id and meta record."""

    name: str
    stream_id: int
    meta: StreamMeta


def store_streams(env: Any) -> list[StoredStream]:
    """Every stream registered in the store environment, sorted by name."""
    meta_db = open_named_db(env, _STORE_META_DB)
    if meta_db is None:
        return []
    out: list[StoredStream] = []
    with env.begin(db=meta_db) as txn:
        cur = txn.cursor()
        found = cur.set_range(b"N")
        while found and cur.key()[:1] == b"N":
            key, value = bytes(cur.key()), bytes(cur.value())
            sid = decode_id(key, value)
            meta_key = b"M" + ID.pack(sid)
            raw = txn.get(meta_key)
            meta = decode_meta(meta_key, bytes(raw)) if raw is not None else StreamMeta()
            out.append(StoredStream(key[1:].decode(), sid, meta))
            found = cur.next()
    return sorted(out, key=lambda s: s.name)


def iter_store_msgs(env: Any, stream_id: int, lo: int, hi: int) -> Iterator[StoredMsg]:
    """The stored messages of stream ``stream_id`` with ``lo <= seq < hi``, in order.

    One read transaction for the whole walk: the environment is a quiescent copy, so a
    long-lived reader pins nothing a writer needs.
    """
    msgs_db = open_named_db(env, _STORE_MSGS_DB)
    if msgs_db is None:
        return
    prefix = ID.pack(stream_id)
    end = prefix + SEQ.pack(hi)
    with env.begin(db=msgs_db) as txn:
        cur = txn.cursor()
        found = cur.set_range(prefix + SEQ.pack(lo))
        while found:
            key = bytes(cur.key())
            if key >= end or not key.startswith(prefix):
                return
            yield decode_msg(key, bytes(cur.value()))
            found = cur.next()


# -- the Raft logs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One Raft group's durable state on a node: its key prefix, hard state (``commit``),
    snapshot meta and the index/term of its last stored entry."""

    group: str
    prefix: bytes
    hard_state: HardState
    snapshot: SnapshotMeta
    last_index: int
    last_term: int


def _raft_dbs(env: Any) -> list[Any] | None:
    dbs = [open_named_db(env, name) for name in _RAFT_DBS]
    return None if any(db is None for db in dbs) else dbs


@contextlib.contextmanager
def _as_app_errors() -> Iterator[None]:
    """Raft's codec raises raft's own DataLossError (raft imports nothing of the
    application); the audit reports the application's, converted as the node converts it
    (``cluster/common/raft_errors.py``), so every caller catches one class."""
    try:
        yield
    except RaftDataLossError as exc:
        raise app_error(exc) from None


def raft_groups(env: Any) -> list[GroupInfo]:
    """Every group of the Raft environment, sorted by group id."""
    dbs = _raft_dbs(env)
    if dbs is None:
        return []
    groups_db, entries_db, hs_db, meta_db, _ = dbs
    out: list[GroupInfo] = []
    with env.begin() as txn:
        for key, value in txn.cursor(db=groups_db):
            prefix, name = bytes(value), bytes(key).decode()
            try:
                hs_raw = txn.get(prefix, db=hs_db)
                hs = codec.decode_hard_state(hs_raw) if hs_raw is not None else HardState()
                sm_raw = txn.get(prefix, db=meta_db)
                snap = (
                    codec.decode_snapshot_meta(sm_raw)[0] if sm_raw is not None else SnapshotMeta()
                )
                last_index, last_term = snap.index, snap.term
                cur = txn.cursor(db=entries_db)
                end = (int.from_bytes(prefix, "big") + 1).to_bytes(4, "big")
                found = cur.prev() if cur.set_range(end) else cur.last()
                if found and bytes(cur.key())[:4] == prefix:
                    last = codec.decode_entry(bytes(cur.key()), cur.value())
                    last_index, last_term = last.index, last.term
            except (DataLossError, RaftDataLossError) as exc:  # raft's codec: its own
                raise DataLossError(f"group {name}: {exc}", **exc.details) from None
            out.append(GroupInfo(name, prefix, hs, snap, last_index, last_term))
    return sorted(out, key=lambda g: g.group)


def iter_raft_entries(env: Any, prefix: bytes, lo: int = 0) -> Iterator[Entry]:
    """The stored entries of the group with key ``prefix`` from index ``lo``, in key order
    (index order), each verified against its checksum."""
    dbs = _raft_dbs(env)
    if dbs is None:
        return
    entries_db = dbs[1]
    with _as_app_errors(), env.begin(db=entries_db) as txn:
        cur = txn.cursor()
        found = cur.set_range(codec.entry_key(prefix, lo))
        while found:
            key = bytes(cur.key())
            if not key.startswith(prefix):
                return
            yield codec.decode_entry(key, cur.value())
            found = cur.next()


def read_snapshot_data(env: Any, prefix: bytes) -> bytes:
    """The group's latest snapshot data, verified against the checksum in its meta record
    (``b""`` when the group has no snapshot)."""
    dbs = _raft_dbs(env)
    if dbs is None:
        return b""
    meta_db, data_db = dbs[3], dbs[4]
    # The chunked layout's DBs (None in an environment written before it).
    gen_db, chunks_db = open_named_db(env, b"snapgen"), open_named_db(env, b"snapchunks")
    with _as_app_errors():
        with env.begin() as txn:
            meta_raw = txn.get(prefix, db=meta_db)
            if meta_raw is None:
                return b""
            _, data_crc = codec.decode_snapshot_meta(meta_raw)
            data = read_snapshot_value(txn, data_db, gen_db, chunks_db, prefix)
        return codec.verify_snapshot_data(data, data_crc)


# The stream snapshot's header (``cluster/stream/snapshot.py``): magic, version, JSON length.
_SNAP_HEAD = struct.Struct("<6sBI")
_SNAP_MAGIC = b"RSSTRM"


def snapshot_header(data: bytes) -> dict[str, Any]:
    """The JSON header of a stream group snapshot (config, ``last_seq``, consumers).

    Read here rather than through ``cluster/stream/snapshot.py`` because that module exposes
    only a restore into a live store; ``DataLossError`` when the bytes are no snapshot.
    """
    if len(data) < _SNAP_HEAD.size:
        raise DataLossError("stream snapshot truncated")
    magic, _version, n = _SNAP_HEAD.unpack_from(data, 0)
    if magic != _SNAP_MAGIC:
        raise DataLossError("not a stream snapshot")
    try:
        raw = json.loads(data[_SNAP_HEAD.size : _SNAP_HEAD.size + n])
    except ValueError as exc:
        raise DataLossError(f"unreadable stream snapshot header: {exc}") from exc
    if not isinstance(raw, dict):
        raise DataLossError("stream snapshot header is not an object")
    return raw
