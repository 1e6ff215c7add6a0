"""Node descriptions: what each node tells the others about itself, for placement.

Placement (``cluster/meta/placement.py``) ranks nodes by placement cluster, tags and free space,
but a node's config holds only its OWN cluster name and tags, and only the node itself can
measure its free space. So every node describes itself (``describe_self``: name, cluster
name, tags, free bytes, version) and answers ``raftstream.node.v1.NodeService/Describe``
with that (``cluster/services/node.py``); its peer prober (``cluster/node/node.py``) asks every
peer once per probe round and keeps the answers in a ``DescriptionBook``. ``node_infos``
then turns the book into placement's view. Why pulled by the prober rather than proposed
into the meta log: docs/cluster-design.md, "Placement".

A peer not heard from yet is placed as before this existed: in this node's placement
cluster, with no tags and no free space (it ranks after described nodes with as many
assets, and never qualifies for a tagged placement). A description is never expired: a
down node's stale one does not matter, because placement skips nodes that are not live.

Free bytes (``free_bytes``) is the smaller of the space an unprivileged writer may still
use on the filesystem of the data directory and the room left in each of the node's LMDB
maps (map size minus the data file's size: the file grows as pages are used): whichever
runs out first stops the node's writes.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from raftstream.cluster.common.clock import SYSTEM_CLOCK, NodeClock
from raftstream.cluster.common.names import validate_node_name
from raftstream.cluster.config import NodeConfig
from raftstream.cluster.meta.placement import NodeInfo
from raftstream.errors import InvalidArgumentError
from raftstream.proto import node_pb2 as npb

__all__ = [
    "LOG_FEATURES",
    "LOG_FEATURE_COPY_AT",
    "LOG_FEATURE_COPY_ROLLUP",
    "LOG_FEATURE_LINKED_FILTERS",
    "LOG_FEATURE_NODE_ADD",
    "LOG_FEATURE_SNAPSHOT_RECORDS",
    "DescriptionBook",
    "NodeDescription",
    "describe_self",
    "free_bytes",
    "node_infos",
    "raftstream_version",
]

TAGS_MAX = 64  # tags in one description (a node's config has a handful)
LABEL_BYTES_MAX = 255  # a cluster name, tag or version string
LMDB_DATA_FILE = "data.mdb"
# Log entry kinds added after the first version that this node reads (node.proto,
# ``log_features``): a group's leader proposes one only when every replica reads it.
LOG_FEATURE_COPY_AT = "copy_at"  # engine ``Copy.origin_ts_ns``: a mirror keeps origin times
# Stream snapshots of version 4 (the store's own message records, cluster/stream/snapshot.py):
# a snapshot is not a log entry, but a leader sends its own to a replica that fell behind.
LOG_FEATURE_SNAPSHOT_RECORDS = "snapshot_records"
# The meta entry ``NodeAdd`` (a node added to the cluster under a new name).
LOG_FEATURE_NODE_ADD = "node_add"
# A consumer whose filter matches no subject a mirror's or a sourced stream's ``subjects``
# name (it stores its origins' subjects): an earlier version refuses it when applying.
LOG_FEATURE_LINKED_FILTERS = "linked_filters"
# The engine's ``Copy.rollup`` (a rollup at a mirror's or a source's origin rolls up the copy).
LOG_FEATURE_COPY_ROLLUP = "copy_rollup"
LOG_FEATURES = frozenset(
    {
        LOG_FEATURE_COPY_AT,
        LOG_FEATURE_SNAPSHOT_RECORDS,
        LOG_FEATURE_NODE_ADD,
        LOG_FEATURE_LINKED_FILTERS,
        LOG_FEATURE_COPY_ROLLUP,
    }
)


@functools.cache
def raftstream_version() -> str:
    """The installed raftstream version ("unknown" when run from an uninstalled tree): the
    version of the code this process runs, so looked up once (a lookup reads the installed
    packages' metadata, about 0.5 ms, and every peer asks for a description twice a
    second)."""
    try:
        return importlib.metadata.version("raftstream")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _label(value: object, field_name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field_name, "must be a non-empty string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgumentError(field_name, "must not contain whitespace or control characters")
    if len(value.encode("utf-8", "surrogatepass")) > LABEL_BYTES_MAX:
        raise InvalidArgumentError(field_name, f"must be at most {LABEL_BYTES_MAX} bytes")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDescription:
    """One node as it described itself at ``described_ns`` (its wall clock, ns since the
    epoch). Validated on construction: ``InvalidArgumentError`` names the field."""

    name: str
    cluster: str
    tags: frozenset[str] = field(default_factory=frozenset)
    free_bytes: int = 0
    version: str = "unknown"
    described_ns: int = 0
    log_features: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        validate_node_name(self.name, "name")
        _label(self.cluster, "cluster")
        _label(self.version, "version")
        tags = frozenset(self.tags)
        if len(tags) > TAGS_MAX:
            raise InvalidArgumentError("tags", f"at most {TAGS_MAX} tags")
        for t in tags:
            _label(t, "tags")
        object.__setattr__(self, "tags", tags)
        features = frozenset(self.log_features)
        if len(features) > TAGS_MAX:
            raise InvalidArgumentError("log_features", f"at most {TAGS_MAX} features")
        for f in features:
            _label(f, "log_features")
        object.__setattr__(self, "log_features", features)
        if self.free_bytes < 0:
            raise InvalidArgumentError("free_bytes", "must be 0 or more")
        if self.described_ns < 0:
            raise InvalidArgumentError("described_ns", "must be 0 or more")

    def to_pb(self) -> npb.NodeDescription:
        return npb.NodeDescription(
            name=self.name,
            cluster=self.cluster,
            tags=sorted(self.tags),
            free_bytes=self.free_bytes,
            version=self.version,
            described_ns=self.described_ns,
            log_features=sorted(self.log_features),
        )

    @classmethod
    def from_pb(cls, m: npb.NodeDescription) -> NodeDescription:
        """The description in ``m``; ``InvalidArgumentError`` when a field breaks a rule
        (a peer answering garbage is not believed)."""
        if len(m.tags) != len(set(m.tags)):
            raise InvalidArgumentError("tags", "duplicate tag")
        return cls(
            name=m.name,
            cluster=m.cluster,
            tags=frozenset(m.tags),
            free_bytes=int(m.free_bytes),
            version=m.version,
            described_ns=int(m.described_ns),
            log_features=frozenset(m.log_features),
        )


class DescriptionBook:
    """The freshest description of each peer this node has heard (not its own: that one is
    measured when asked, ``describe_self``). Owned by the node's event loop."""

    def __init__(self, *, peers: Collection[str]) -> None:
        self._peers = frozenset(peers)
        self._by_name: dict[str, NodeDescription] = {}

    def record(self, probed: str, desc: NodeDescription) -> bool:
        """Keep ``desc``, the answer of peer ``probed``, unless an equally fresh or fresher
        one is held (answers may arrive out of order); True when kept.
        ``InvalidArgumentError`` (nothing changes) when ``probed`` is not a configured peer
        or the answer names another node (a misconfigured address)."""
        if probed not in self._peers:
            raise InvalidArgumentError("name", f"{probed!r} is not a configured peer")
        if desc.name != probed:
            raise InvalidArgumentError("name", f"peer {probed!r} describes itself as {desc.name!r}")
        held = self._by_name.get(probed)
        if held is not None and held.described_ns >= desc.described_ns:
            return False
        self._by_name[probed] = desc
        return True

    def add_peers(self, names: Collection[str]) -> None:
        """Peers added to the cluster since (``cluster/services/node_book.py``)."""
        self._peers |= frozenset(names)

    def get(self, name: str) -> NodeDescription | None:
        return self._by_name.get(name)

    def all_read(self, peers: Collection[str], feature: str) -> bool | None:
        """Whether each of ``peers`` (not this node) described itself as reading log
        feature ``feature``: False when one described itself without it (a version from
        before the feature), else None while one has not been heard from yet."""
        unknown = False
        for name in peers:
            desc = self._by_name.get(name)
            if desc is None:
                unknown = True
            elif feature not in desc.log_features:
                return False
        return None if unknown else True

    def snapshot(self) -> Mapping[str, NodeDescription]:
        """A read-only copy: later records do not change it."""
        return MappingProxyType(dict(self._by_name))


def free_bytes(data_dir: Path, lmdb_maps: Sequence[tuple[Path, int]]) -> int:
    """The smaller of the filesystem space left to an unprivileged writer under
    ``data_dir`` and the room left in each LMDB map (``(env directory, map size in
    bytes)``; map size minus the data file's size, 0 when full). ``OSError`` when
    ``data_dir`` cannot be examined; a map whose file does not exist yet has all its room."""
    room = [shutil.disk_usage(data_dir).free]  # statvfs f_bavail * f_frsize
    for env_dir, map_size_bytes in lmdb_maps:
        try:
            used = os.stat(env_dir / LMDB_DATA_FILE).st_size
        except FileNotFoundError:
            used = 0
        room.append(max(0, map_size_bytes - used))
    return min(room)


def describe_self(
    config: NodeConfig, free: int, clock: NodeClock = SYSTEM_CLOCK
) -> NodeDescription:
    """This node's description as of now, with ``free`` bytes of storage room (the node's
    ``StorageRoom``, or ``free_bytes`` before its environments are open)."""
    return NodeDescription(
        name=config.name,
        cluster=config.cluster_name,
        tags=frozenset(config.tags),
        free_bytes=free,
        version=raftstream_version(),
        described_ns=clock.time_ns(),
        log_features=LOG_FEATURES,
    )


def node_infos(
    *,
    config: NodeConfig,
    nodes: Collection[str],
    own: NodeDescription,
    peers: Mapping[str, NodeDescription],
    live: Callable[[str], bool],
) -> list[NodeInfo]:
    """Placement's view of every node of the cluster: this node from ``own``, each peer from
    its description in ``peers`` (a peer not described yet: this node's cluster name, no
    tags, no free space), live as ``live`` says; ``nodes``: every node's name."""
    out = []
    for name in nodes:
        desc = own if name == config.name else peers.get(name)
        if desc is None:
            out.append(
                NodeInfo(name=name, cluster=config.cluster_name, live=live(name), described=False)
            )
            continue
        out.append(
            NodeInfo(
                name=name,
                cluster=desc.cluster,
                tags=desc.tags,
                free_bytes=desc.free_bytes,
                live=live(name),
            )
        )
    return out
