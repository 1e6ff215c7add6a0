"""Where consumer state persists: a small Protocol, an LMDB implementation and a memory twin.

The LMDB store lives in the node's one LMDB environment beside the stream stores, in its own
fixed pair of named databases (never one database per consumer, so a thousand consumers cost
no more database handles than one):

- ``consumer_meta``: ``<stream>\\0<consumer>\\0c`` -> the config (JetStream JSON) and
  ``<stream>\\0<consumer>\\0s`` -> the state without its pending table;
- ``consumer_pending``: ``<stream>\\0<consumer>\\0<stream_seq as 8 bytes big-endian>`` ->
  one pending entry, so an ack rewrites one small row, not the whole table.

Every value carries a CRC-32 checked on read: a flipped bit is a ``DataLossError``, never
wrong state. Names cannot hold NUL (``consumer_config`` refuses non-printable characters and
stream names follow the same rule), so the prefixes of two consumers never collide.

Threading: LMDB write transactions are bound to a thread; call the LMDB store from the node's
writer thread, and never while that thread holds another write transaction on the same
environment (LMDB would deadlock on its own writer lock).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import (
    ConsumerState,
    Pending,
    decode_meta,
    decode_pending,
    encode_meta,
    encode_pending,
)
from raftstream.errors import DataLossError, invariant

__all__ = [
    "DB_META",
    "DB_PENDING",
    "ConsumerKey",
    "ConsumerStateStore",
    "LmdbConsumerStore",
    "MemoryConsumerStore",
]

DB_META = b"consumer_meta"
DB_PENDING = b"consumer_pending"
_CRC = struct.Struct("<I")
_SEQ = struct.Struct(">Q")  # big-endian so LMDB's byte order is sequence order


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerKey:
    stream: str
    consumer: str

    @property
    def prefix(self) -> bytes:
        invariant("\0" not in self.stream + self.consumer, "names hold no NUL")
        return self.stream.encode() + b"\0" + self.consumer.encode() + b"\0"


class ConsumerStateStore(Protocol):
    """Persists consumers' configs and states. Failure contract: ``DataLossError`` when a
    stored record fails its checksum; any other IO failure propagates unchanged."""

    def write(
        self,
        key: ConsumerKey,
        *,
        state: ConsumerState,
        upserts: Mapping[int, Pending],
        deletes: Iterable[int],
        clear: bool,
        config: ConsumerConfig | None = None,
    ) -> None:
        """Store the state's meta part and change pending rows, atomically, with the config
        when given. ``clear`` drops every pending row first (the upserts then hold the whole
        table)."""

    def load(self, key: ConsumerKey) -> tuple[ConsumerConfig, ConsumerState] | None:
        """The stored config and state, or None if the consumer was never stored."""

    def remove(self, key: ConsumerKey) -> None: ...

    def names(self, stream: str) -> list[str]:
        """The stored consumers of ``stream``, sorted."""

    def close(self) -> None: ...


def _config_bytes(config: ConsumerConfig) -> bytes:
    return json.dumps(config.to_dict(), sort_keys=True).encode()


def _config_from(raw: bytes) -> ConsumerConfig:
    return ConsumerConfig.from_dict(json.loads(raw))


class MemoryConsumerStore:
    """The in-memory twin. It keeps bytes, not objects, so tests exercise the encodings."""

    def __init__(self) -> None:
        self._configs: dict[ConsumerKey, bytes] = {}
        self._metas: dict[ConsumerKey, bytes] = {}
        self._pending: dict[ConsumerKey, dict[int, bytes]] = {}

    def write(
        self,
        key: ConsumerKey,
        *,
        state: ConsumerState,
        upserts: Mapping[int, Pending],
        deletes: Iterable[int],
        clear: bool,
        config: ConsumerConfig | None = None,
    ) -> None:
        if config is not None:
            self._configs[key] = _config_bytes(config)
        rows = self._pending.setdefault(key, {})
        if clear:
            rows.clear()
        for seq in deletes:
            rows.pop(seq, None)
        for seq, p in upserts.items():
            rows[seq] = encode_pending(seq, p)
        self._metas[key] = encode_meta(state)

    def load(self, key: ConsumerKey) -> tuple[ConsumerConfig, ConsumerState] | None:
        raw_cfg = self._configs.get(key)
        if raw_cfg is None:
            return None
        raw_meta = self._metas.get(key)
        state = decode_meta(raw_meta) if raw_meta is not None else ConsumerState()
        rows = self._pending.get(key, {})
        for seq in sorted(rows):  # the state keeps pending in sequence order
            row_seq, p = decode_pending(rows[seq])
            invariant(row_seq == seq, "pending row under its key")
            state.pending[seq] = p
        return _config_from(raw_cfg), state

    def remove(self, key: ConsumerKey) -> None:
        self._configs.pop(key, None)
        self._metas.pop(key, None)
        self._pending.pop(key, None)

    def names(self, stream: str) -> list[str]:
        return sorted(k.consumer for k in self._configs if k.stream == stream)

    def close(self) -> None:
        """Nothing to release; the data stays for a later "reopen" in tests."""


def _seal(payload: bytes) -> bytes:
    return _CRC.pack(zlib.crc32(payload)) + payload


def _unseal(value: bytes, what: str) -> bytes:
    if len(value) < _CRC.size:
        raise DataLossError(f"consumer record {what} is truncated")
    (crc,) = _CRC.unpack_from(value)
    payload = value[_CRC.size :]
    if zlib.crc32(payload) != crc:
        raise DataLossError(f"consumer record {what} failed its checksum")
    return payload


class LmdbConsumerStore:
    """Consumer state in the node's LMDB environment (see the module docstring).

    ``env`` is an open ``lmdb.Environment`` with room for two more named databases; it is
    owned by the caller (closed by whoever opened it, not by ``close``).
    """

    def __init__(self, *, env: Any) -> None:
        self._env = env
        self._meta = env.open_db(DB_META)
        self._rows = env.open_db(DB_PENDING)

    def write(
        self,
        key: ConsumerKey,
        *,
        state: ConsumerState,
        upserts: Mapping[int, Pending],
        deletes: Iterable[int],
        clear: bool,
        config: ConsumerConfig | None = None,
    ) -> None:
        prefix = key.prefix
        with self._env.begin(write=True) as txn:
            if config is not None:
                txn.put(prefix + b"c", _seal(_config_bytes(config)), db=self._meta)
            if clear:
                self._drop_prefix(txn, self._rows, prefix)
            for seq in deletes:
                txn.delete(prefix + _SEQ.pack(seq), db=self._rows)
            for seq, p in upserts.items():
                txn.put(prefix + _SEQ.pack(seq), _seal(encode_pending(seq, p)), db=self._rows)
            txn.put(prefix + b"s", _seal(encode_meta(state)), db=self._meta)

    def load(self, key: ConsumerKey) -> tuple[ConsumerConfig, ConsumerState] | None:
        prefix = key.prefix
        with self._env.begin() as txn:
            raw_cfg = txn.get(prefix + b"c", db=self._meta)
            if raw_cfg is None:
                return None
            config = _config_from(_unseal(raw_cfg, f"{key} config"))
            raw_meta = txn.get(prefix + b"s", db=self._meta)
            state = (
                decode_meta(_unseal(raw_meta, f"{key} state"))
                if raw_meta is not None
                else ConsumerState()
            )
            cur = txn.cursor(db=self._rows)
            if cur.set_range(prefix):
                for k, v in cur:
                    if not k.startswith(prefix):
                        break
                    seq, p = decode_pending(_unseal(v, f"{key} pending"))
                    invariant(_SEQ.pack(seq) == k[len(prefix) :], "pending row under its key")
                    state.pending[seq] = p
        return config, state

    def remove(self, key: ConsumerKey) -> None:
        with self._env.begin(write=True) as txn:
            self._drop_prefix(txn, self._rows, key.prefix)
            self._drop_prefix(txn, self._meta, key.prefix)

    @staticmethod
    def _drop_prefix(txn: Any, db: Any, prefix: bytes) -> None:
        cur = txn.cursor(db=db)
        if not cur.set_range(prefix):
            return
        while cur.key().startswith(prefix):
            if not cur.delete():
                break

    def names(self, stream: str) -> list[str]:
        prefix = stream.encode() + b"\0"
        out: list[str] = []
        with self._env.begin() as txn:
            cur = txn.cursor(db=self._meta)
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(prefix):
                        break
                    if k.endswith(b"\0c"):
                        out.append(k[len(prefix) : -2].decode())
        return sorted(out)

    def close(self) -> None:
        """Nothing of its own to release: the environment belongs to the node."""
