"""Synthetic node data directories, written with the real storage APIs (tests and bench).

``SynthCluster`` lays out ``root/<node>/raft`` (``LmdbLogStorage``) and ``root/<node>/store``
(``open_node_env`` + ``LmdbStreamStore``) the way ``cluster/node/node.py`` does, and plays the
part of a stream leader: every operation becomes a Raft entry (meta entries encoded by
``cluster/meta/entries.py``, stream group entries by ``cluster/stream/entries.py``), is
written to the logs of the chosen replicas, and is applied to their stores by the engine's
``Stream`` state machine, as ``cluster/stream/replica.py`` applies committed entries. The
``fault_*`` methods then break one replica on purpose, below the log or beside it.

``publish_bulk`` is the benchmark's fast path: for a stream with no limits, no msg ids and no
preconditions, applying a publish is exactly one ``append``, so it appends in one store
transaction per batch instead of going through ``Stream.apply``.

Only ever point it at a new, empty directory: it writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftstream.audit.readers import store_streams
from raftstream.cluster.common.names import stream_group_id
from raftstream.cluster.meta.entries import AddStream, encode_entry
from raftstream.cluster.stream.entries import ConsumerOps, ConsumerPut, GroupEntry, StreamBatch
from raftstream.cluster.stream.entries import encode as encode_group
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import ConsumerOp, ConsumerState
from raftstream.engine.consumer_store import ConsumerKey, LmdbConsumerStore
from raftstream.engine.entries import Entry as EngineEntry
from raftstream.engine.entries import Publish
from raftstream.engine.lmdbrecords import encode_headers, encode_msgs, msg_lead, open_dbs
from raftstream.engine.lmdbstore import LmdbStreamStore, open_node_env
from raftstream.engine.stream import Stream
from raftstream.engine.stream_config import StreamConfig
from raftstream.errors import RaftStreamError
from raftstream.raft.storage import GroupWrite, LmdbLogStorage
from raftstream.raft.types import Entry, HardState

__all__ = ["META", "SynthCluster"]

META = "meta"
_SYNTH_MAP_BYTES = 16 * 1024**3  # address space only (the 10M-message bench needs > 1 GiB of log)


@dataclass(slots=True)
class _Node:
    name: str
    log: LmdbLogStorage
    env: Any
    stores: dict[str, LmdbStreamStore]
    streams: dict[str, Stream]


class SynthCluster:
    """``nodes`` replicas of every stream under ``root`` (see the module docstring).

    Single-threaded; ``close()`` closes every environment (the data stays).
    """

    def __init__(self, root: str | Path, nodes: Sequence[str] = ("n1", "n2", "n3")) -> None:
        self.root = Path(root)
        self.term = 1
        self.ts_ns = 1_700_000_000 * 10**9
        self._last: dict[tuple[str, str], int] = {}  # (node, group) -> last index
        self._hs_term: dict[tuple[str, str], int] = {}
        self.nodes: dict[str, _Node] = {}
        for name in nodes:
            d = self.root / name
            log = LmdbLogStorage(d / "raft", sync=False, map_size_bytes=_SYNTH_MAP_BYTES)
            env = open_node_env(d / "store", sync=False, map_size_bytes=_SYNTH_MAP_BYTES)
            self.nodes[name] = _Node(name, log, env, {}, {})

    def close(self) -> None:
        for n in self.nodes.values():
            for store in n.stores.values():
                store.close()
            n.log.close()
            n.env.close()

    # -- the log ------------------------------------------------------------------------------

    def _targets(self, nodes: Iterable[str] | None) -> list[_Node]:
        return [self.nodes[n] for n in (nodes if nodes is not None else self.nodes)]

    def append_raw(
        self, group: str, data: Sequence[bytes], *, nodes: Iterable[str] | None = None
    ) -> list[int]:
        """Append entries with ``data`` at the next indexes of ``group`` (current term) on
        ``nodes`` (all by default), committed; returns the indexes of the first target."""
        out: list[int] = []
        for n in self._targets(nodes):
            last = self._last.get((n.name, group), 0)
            entries = tuple(
                Entry(index=last + i + 1, term=self.term, data=d) for i, d in enumerate(data)
            )
            # The hard state's term never goes down, even when a test writes entries of an
            # older term (a term regression is a fault of the entries, not of the vote).
            term = max(self.term, self._hs_term.get((n.name, group), 0))
            self._hs_term[(n.name, group)] = term
            hs = HardState(term=term, commit=last + len(entries))
            n.log.write_batch([GroupWrite(group, hard_state=hs, entries=entries)])
            self._last[(n.name, group)] = last + len(entries)
            out = out or [e.index for e in entries]
        return out

    def tick(self, ns: int = 1_000_000) -> int:
        """Advance the leader's clock and return the new stamp."""
        self.ts_ns += ns
        return self.ts_ns

    # -- streams ------------------------------------------------------------------------------

    def add_stream(
        self, name: str, subjects: Sequence[str], *, account: str = "$G", **config: Any
    ) -> str:
        """Define a stream in the meta log and open its replica on every node; returns the
        group id. ``mirror``/``sources`` (JetStream JSON) go into the meta entry's config
        as written, since ``StreamConfig`` does not take them yet."""
        extra = {k: config.pop(k) for k in ("mirror", "sources") if k in config}
        cfg = StreamConfig(name=name, subjects=tuple(subjects), **config)
        raw = encode_entry(
            AddStream(account=account, config=cfg, peers=tuple(self.nodes), ts_ns=self.tick())
        )
        if extra:
            body = json.loads(raw[2:])
            body["config"].update(extra)
            raw = raw[:2] + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        self.append_raw(META, [raw])
        group = stream_group_id(account, name)
        for n in self.nodes.values():
            store = LmdbStreamStore(n.env, group)
            n.stores[group] = store
            n.streams[group] = Stream(cfg, store)
        return group

    def propose(
        self, group: str, batches: Sequence[GroupEntry], *, nodes: Iterable[str] | None = None
    ) -> list[int]:
        """Commit ``batches`` (one Raft entry each) to ``group`` on ``nodes`` and apply them;
        returns their indexes."""
        targets = list(nodes) if nodes is not None else list(self.nodes)
        indexes = self.append_raw(group, [encode_group(b) for b in batches], nodes=targets)
        for name in targets:
            for b in batches:
                if isinstance(b, StreamBatch):
                    self._apply(self.nodes[name], group, b.entries)
        return indexes

    def _apply(self, n: _Node, group: str, entries: Sequence[EngineEntry]) -> None:
        stream = n.streams[group]
        with n.stores[group].transaction():  # as StreamReplica: one transaction per batch
            for e in entries:
                # A refusal is the entry's replicated result, as on a node.
                with suppress(RaftStreamError):
                    stream.apply(e)

    def publish(
        self,
        group: str,
        count: int,
        *,
        subject: str,
        batch: int = 50,
        data: Callable[[int], bytes] = lambda i: b"msg-%d" % i,
        msg_id: Callable[[int], str | None] = lambda i: None,
        headers: Callable[[int], dict[str, str]] = lambda i: {},
        first: int = 0,
        nodes: Iterable[str] | None = None,
    ) -> None:
        """Publish ``count`` messages (numbered from ``first``, which ``data``, ``msg_id``
        and ``headers`` receive) in entries of ``batch`` publishes each."""
        targets = list(nodes) if nodes is not None else None
        for lo in range(first, first + count, batch):
            pubs = tuple(
                Publish(
                    ts_ns=self.tick(),
                    subject=subject,
                    data=data(i),
                    msg_id=msg_id(i),
                    headers=headers(i),
                )
                for i in range(lo, min(lo + batch, first + count))
            )
            self.propose(group, [StreamBatch(pubs)], nodes=targets)

    def publish_bulk(
        self, group: str, count: int, *, subject: str, payload_bytes: int, batch: int = 1000
    ) -> None:
        """The benchmark's fast path (module docstring): ``count`` messages, one Raft entry
        and one store transaction per ``batch``, on every node."""
        pad = b"x" * payload_bytes
        for lo in range(0, count, batch):
            pubs = tuple(
                Publish(ts_ns=self.tick(), subject=subject, data=b"%d:" % i + pad)
                for i in range(lo, min(lo + batch, count))
            )
            self.append_raw(group, [encode_group(StreamBatch(pubs))])
            for n in self.nodes.values():
                store = n.stores[group]
                with store.transaction():
                    for p in pubs:
                        store.append(p.subject, p.data, now_ns=p.ts_ns)

    def consumer(self, group: str, name: str, ops: Sequence[ConsumerOp], **config: Any) -> None:
        """Define consumer ``name`` in the group's log, then commit ``ops`` for it."""
        cfg = ConsumerConfig(durable_name=name, **config)
        put = ConsumerPut(name=name, config=cfg, ts_ns=self.tick())
        self.propose(group, [put, ConsumerOps(name, tuple(ops))])

    # -- faults -------------------------------------------------------------------------------

    def fault_rewrite(self, node: str, group: str, seq: int, data: bytes) -> None:
        """Replace the payload stored at ``seq`` on ``node`` with ``data``, behind the log's
        back, as a valid record (right CRC): a replica that silently diverged."""
        n = self.nodes[node]
        store = n.stores[group]
        old = store.load(seq)
        dbs = open_dbs(n.env)
        lead = msg_lead(old.subject.encode(), encode_headers(old.headers))
        sid = next(s.stream_id for s in store_streams(n.env) if s.name == group)
        ((key, value),) = encode_msgs(sid, [(seq, lead, data, old.ts, old.ttl_ns)])
        with n.env.begin(write=True) as txn:
            txn.put(key, value, db=dbs.msgs)

    def fault_drop(self, node: str, group: str, seqs: Iterable[int]) -> None:
        """Remove ``seqs`` from ``node``'s store with no entry in its log (lost data)."""
        store = self.nodes[node].stores[group]
        with store.transaction():
            for seq in seqs:
                store.delete(seq)

    def fault_consumer_state(
        self, node: str, stream: str, name: str, state: ConsumerState, **config: Any
    ) -> None:
        """Persist consumer state with the engine's ``LmdbConsumerStore`` on ``node``, as a
        consumer would resume from it (the audit checks it against the log's acks)."""
        cfg = ConsumerConfig(durable_name=name, **config)
        LmdbConsumerStore(env=self.nodes[node].env).write(
            ConsumerKey(stream=stream, consumer=name),
            state=state,
            upserts=state.pending,
            deletes=(),
            clear=True,
            config=cfg,
        )

    def fault_append(self, group: str, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Append a message to every replica's store directly, bypassing the stream state
        machine (and its deduplication); the log does not have it."""
        ts = self.tick()
        for n in self.nodes.values():
            n.stores[group].append(subject, data, headers=headers, now_ns=ts)
