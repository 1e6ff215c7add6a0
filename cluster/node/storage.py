"""The node's data on disk: its two LMDB environments and the storage room left in them.

``raft/`` holds the Raft logs of every group in one LMDB environment (fsynced: it is what
"acknowledged" rests on), ``store/`` the engine stores of every stream in another, which is
a cache rebuilt from the Raft logs at every start (wiped by ``open``), so it needs no fsync
(see ``cluster/stream/replica.py``). Two environments because ``LmdbLogStorage`` opens its own
(one environment for both needs it to take an open one).

``NodeStorage`` is the stream groups' ``StorageRooms`` (``cluster/stream/deps.py``): the room
of this node as measured, of its peers as they last described themselves. Owned by the
node's event loop.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raftstream.cluster.common.metrics import NodeMetrics
from raftstream.cluster.common.private_files import warn_if_loose
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.descriptions import (
    DescriptionBook,
    NodeDescription,
    describe_self,
    free_bytes,
)
from raftstream.cluster.node.storage_room import StorageRoom
from raftstream.cluster.stream.group import StreamGroup
from raftstream.engine.lmdbstore import open_node_env
from raftstream.raft.storage import LmdbLogStorage

__all__ = ["NodeStorage"]


class NodeStorage:
    """The node's LMDB environments (``open``, ``close``) and the room in them.
    ``descriptions``: the peers' latest descriptions (their free space)."""

    def __init__(self, *, config: NodeConfig, descriptions: DescriptionBook) -> None:
        self._config = config
        self._descriptions = descriptions
        self.room: StorageRoom | None = None  # once the environments are open

    def open(self) -> None:
        """Wipe the engine stores (a cache of the Raft logs: rebuilt from them at every
        start) and open both environments; raises what LMDB raised (``RaftError`` when the
        Raft log refuses to open)."""
        data = Path(self._config.data)
        store_dir = data / "store"
        shutil.rmtree(store_dir, ignore_errors=True)
        # Address space, not disk: the file grows with the data (LMDB needs the bound).
        map_size = self._config.limits.storage_bytes_max
        self.log = LmdbLogStorage(data / "raft", map_size_bytes=map_size)
        self.env: Any = open_node_env(store_dir, sync=False, map_size_bytes=map_size)
        self.room = StorageRoom(data, [self.log.env, self.env], map_size)
        for path in (data / "raft", data / "raft" / "data.mdb", data / "raft" / "lock.mdb"):
            warn_if_loose(path)  # made before this version, or by hand

    def close(self) -> None:
        """Close both environments (once nothing may write to them)."""
        self.log.close()
        self.env.close()

    def describe_self(self) -> NodeDescription:
        """This node's description now; free space over both LMDB maps, as their databases
        use them (``StorageRoom``: room a purge freed counts again) once they are open, by
        their files' sizes before (``OSError``: the data directory cannot be examined)."""
        if self.room is not None:
            return describe_self(self._config, self.room.measure())
        data = Path(self._config.data)
        size = self._config.limits.storage_bytes_max
        maps = ((data / "raft", size), (data / "store", size))
        return describe_self(self._config, free_bytes(data, maps))

    def storage_admitted(self, size: int) -> None:
        if self.room is not None:
            self.room.admitted(size)

    def storage_room(self, peers: Sequence[str]) -> tuple[str, int, int] | None:
        """The replica among ``peers`` with the least storage room: this node as measured
        (``StorageRoom``), the others as they last described themselves (not yet
        described: not counted); with the reserve. None when nothing is known."""
        room = self.room
        if room is None:
            return None
        me = self._config.name
        tightest: tuple[str, int] | None = None
        with contextlib.suppress(OSError):  # the data directory unreadable right now
            tightest = (me, room.room_bytes())
        for peer in peers:
            desc = self._descriptions.get(peer) if peer != me else None
            if desc is not None and (tightest is None or desc.free_bytes < tightest[1]):
                tightest = (peer, desc.free_bytes)
        return None if tightest is None else (*tightest, room.reserve_bytes)

    def observe(self, metrics: NodeMetrics, groups: Mapping[str, StreamGroup]) -> None:
        """Refresh the storage gauges: the room left here and each group's store."""
        if self.room is not None:
            with contextlib.suppress(OSError):  # an unreadable data dir shows elsewhere
                metrics.storage_room.set(self.room.measure())
        for group, g in groups.items():
            st = g.replica.store.state()
            metrics.observe_store(group, msgs=st.msgs, size_bytes=st.bytes)
