"""The byte form of a whole ``MetaState``, for Raft log compaction and catch-up.

Layout: ``b"RSMETA" | u8 SNAPSHOT_VERSION | u32 crc32(body) | body``, the body canonical JSON
(UTF-8, sorted keys, no spaces; streams sorted by (account, name), consumers by name,
removed peers sorted), so equal states give equal bytes on every node and the determinism
tests can compare bytes. JSON for the same reasons as the entries (``meta_entries``): the
state is definitions only, small, with canonical JSON forms already. The checksum catches
a torn or bit-flipped snapshot: ``decode_snapshot`` raises ``DataLossError`` rather than
restore something half-right. The subject index is not stored; restoring rebuilds it.
Repairs after data loss (``cluster/meta/repairs.py``) are stored under ``repairs`` only when
there are any, so a state that never had one encodes as before; so are the nodes added to
the cluster (``added_nodes``, name -> address) and those taken out for good
(``forgotten_nodes``).
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import DataLossError, RaftStreamError

__all__ = ["SNAPSHOT_VERSION", "DecodedSnapshot", "decode_snapshot", "encode_snapshot"]

SNAPSHOT_VERSION = 1
_MAGIC = b"RSMETA"
_HEADER = struct.Struct("<6sBI")


@dataclass(frozen=True, slots=True)
class DecodedSnapshot:
    """What ``decode_snapshot`` read; ``MetaState.restore`` builds the state from it."""

    streams: tuple[StreamAssignment, ...]
    consumers: tuple[ConsumerAssignment, ...]
    removed_peers: tuple[str, ...]
    last_ts_ns: int
    repairs: dict[str, Any] = field(default_factory=dict)  # RepairBook.to_json's form
    added_nodes: dict[str, str] = field(default_factory=dict)  # node -> address
    forgotten_nodes: tuple[str, ...] = ()


def encode_snapshot(
    *,
    streams: Sequence[StreamAssignment],
    consumers: Iterable[ConsumerAssignment],
    removed_peers: Sequence[str],
    last_ts_ns: int,
    repairs: dict[str, Any] | None = None,
    added_nodes: dict[str, str] | None = None,
    forgotten_nodes: Sequence[str] = (),
) -> bytes:
    """The snapshot bytes; ``streams`` and ``consumers`` come in canonical order (the
    caller sorts them)."""
    by_stream: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ca in consumers:
        by_stream.setdefault((ca.account, ca.stream), []).append(
            {"config": ca.config.to_dict(), "created_ns": ca.created_ns}
        )
    body = {
        "last_ts_ns": last_ts_ns,
        "removed_peers": list(removed_peers),
        "streams": [
            {
                "account": sa.account,
                "config": sa.config.to_dict(),
                "peers": list(sa.peers),
                "created_ns": sa.created_ns,
                "consumers": by_stream.get((sa.account, sa.name), []),
            }
            for sa in streams
        ],
    }
    if repairs:
        body["repairs"] = repairs
    if added_nodes:
        body["added_nodes"] = dict(added_nodes)
    if forgotten_nodes:
        body["forgotten_nodes"] = list(forgotten_nodes)
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return _HEADER.pack(_MAGIC, SNAPSHOT_VERSION, zlib.crc32(raw)) + raw


def decode_snapshot(data: bytes) -> DecodedSnapshot:
    """Read ``encode_snapshot``'s bytes; ``DataLossError`` for anything else."""
    if len(data) < _HEADER.size:
        raise DataLossError("meta snapshot truncated")
    magic, version, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC or version != SNAPSHOT_VERSION:
        raise DataLossError(f"meta snapshot: unknown magic or version {magic!r}/{version}")
    raw = data[_HEADER.size :]
    if zlib.crc32(raw) != crc:
        raise DataLossError("meta snapshot checksum mismatch")
    try:
        return _decode_body(json.loads(raw.decode("utf-8")))
    except (ValueError, KeyError, TypeError, AttributeError, RaftStreamError) as exc:
        if isinstance(exc, DataLossError):
            raise
        raise DataLossError(f"meta snapshot unreadable: {exc!r}") from None


def _decode_body(body: dict[str, Any]) -> DecodedSnapshot:
    streams: list[StreamAssignment] = []
    consumers: list[ConsumerAssignment] = []
    for raw in body["streams"]:
        account = _str(raw["account"])
        config = StreamConfig.from_dict(raw["config"]).validate()
        streams.append(
            StreamAssignment(
                account=account,
                config=config,
                peers=tuple(_str(p) for p in raw["peers"]),
                group=stream_group_id(account, config.name),
                created_ns=_int(raw["created_ns"]),
            )
        )
        for rc in raw["consumers"]:
            consumers.append(
                ConsumerAssignment(
                    account=account,
                    stream=config.name,
                    config=ConsumerConfig.from_dict(rc["config"]),
                    created_ns=_int(rc["created_ns"]),
                )
            )
    return DecodedSnapshot(
        streams=tuple(streams),
        consumers=tuple(consumers),
        removed_peers=tuple(_str(p) for p in body["removed_peers"]),
        last_ts_ns=_int(body["last_ts_ns"]),
        repairs=dict(body.get("repairs", {})),
        added_nodes={_str(n): _str(a) for n, a in dict(body.get("added_nodes", {})).items()},
        forgotten_nodes=tuple(_str(n) for n in body.get("forgotten_nodes", [])),
    )


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value
