"""The nodes of the cluster and where each one serves: what every "the other nodes" reads.

A cluster's nodes are its **founders**, the nodes that formed it (the configured ``peers`` of
the nodes that started it), and the nodes **added** since (``raftstream cluster peer-add
NAME --address HOST:PORT``: a ``NodeAdd`` in the meta state, applied on every node). A
node's own ``peers`` may also name nodes (its own entry, at least); every name in any of the
three is a node of the cluster, unless the cluster forgot it (``raftstream cluster
peer-remove NAME --forget``: a ``NodeForget``), even where a config still names it.

Where a node serves, first match wins: this node's configured ``peers`` (the operator's word
on this machine), the meta state's address for an added node, then the addresses the meta
leader gave this node when it joined (a node added later need only configure itself and one
running node).

**The meta group's founding membership.** Every replica of a Raft group must start from the
same initial membership (``RaftHost.add_group``); the meta group's is derived from its
founders (``meta_members``). So the founders are written down the first time the meta group
starts on a node (``data/cluster.json``, durably, before the group runs) and read from there
at every later start: adding a node to a founder's ``peers`` afterwards changes nothing
about the group. A node added later (or one rejoining after losing its data) is told the
founders by the meta leader when it joins (``RepairNodeResponse.meta_founders``) and writes
them the same way. A node with a meta log but no ``cluster.json`` (made by a version that
had no way to add nodes) takes its configured ``peers`` as the founders, as that version did.

Owned by the node's event loop.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from raftstream.cluster.common.durable import write_json
from raftstream.cluster.config import NodeConfig
from raftstream.errors import DataLossError

__all__ = ["CLUSTER_FILE", "NodeBook"]

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"


class NodeBook:
    """The cluster's nodes and their addresses, as this node knows them (module docstring)."""

    def __init__(self, config: NodeConfig) -> None:
        self._config = config
        self._path = Path(config.data) / CLUSTER_FILE
        self._founders: tuple[str, ...] | None = None
        self._joined: dict[str, str] = {}  # addresses the meta leader gave on joining
        self._added: dict[str, str] = {}  # NodeAdd's, from the meta state
        self._forgotten: frozenset[str] = frozenset()  # NodeForget's, from the meta state
        self._all: dict[str, str] = {}
        self._rebuild()

    # -- the record ------------------------------------------------------------------------

    def load(self) -> None:
        """Read ``data/cluster.json`` if there is one. ``DataLossError`` if it is unreadable:
        the meta group's membership rests on it."""
        try:
            raw = json.loads(self._path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise DataLossError(f"{self._path} is unreadable: {exc}") from None
        founders = raw.get("meta_founders") if isinstance(raw, dict) else None
        addresses = raw.get("addresses", {}) if isinstance(raw, dict) else None
        if (
            not isinstance(founders, list)
            or not founders
            or not all(isinstance(f, str) for f in founders)
            or not isinstance(addresses, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in addresses.items())
        ):
            raise DataLossError(f"{self._path} does not hold meta_founders and addresses")
        self._founders = tuple(sorted(founders))
        self._joined = dict(addresses)
        self._rebuild()

    def record(self, founders: Iterable[str], addresses: Mapping[str, str]) -> None:
        """Write the meta group's founders (and the addresses a joiner was given) durably;
        called before the meta group starts."""
        self._founders = tuple(sorted(founders))
        self._joined = dict(addresses)
        self._rebuild()
        write_json(
            self._path,
            {
                "meta_founders": list(self._founders),
                "addresses": dict(sorted(self._joined.items())),
            },
        )

    def founders(self) -> tuple[str, ...]:
        """The meta group's founders: the recorded ones, else (a node that forms a new
        cluster, or one made by an older version) its configured peers, recorded now."""
        if self._founders is None:
            self.record(self._config.peers, {})
            log.info("meta group founders recorded: %s", ", ".join(self._founders or ()))
        assert self._founders is not None
        return self._founders

    @property
    def known_founders(self) -> tuple[str, ...] | None:
        """The founders if recorded (None: this node has not started the meta group yet)."""
        return self._founders

    # -- the meta state's part ---------------------------------------------------------------

    def set_added(self, added: Mapping[str, str], forgotten: Iterable[str] = ()) -> list[str]:
        """Take the meta state's added and forgotten nodes; return the names new to this
        book."""
        before = set(self._all)
        self._added = dict(added)
        self._forgotten = frozenset(forgotten)
        self._rebuild()
        return sorted(set(self._all) - before)

    # -- queries -----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        out = dict(self._joined)
        out.update(self._added)
        out.update((n, str(a)) for n, a in self._config.peers.items())
        for name in self._founders or ():
            out.setdefault(name, "")  # a founder with no known address: listed, not dialled
        me = self._config.name
        self._all = {n: a for n, a in sorted(out.items()) if n not in self._forgotten or n == me}

    def addresses(self) -> Mapping[str, str]:
        """Every node of the cluster (this one included) and its address ("" when unknown),
        sorted by name."""
        return self._all

    def names(self) -> tuple[str, ...]:
        return tuple(self._all)

    def address(self, node: str) -> str | None:
        """Where ``node`` serves (None: not a node of the cluster, or no address known)."""
        return self._all.get(node) or None

    def peers(self) -> dict[str, str]:
        """Every other node with a known address."""
        me = self._config.name
        return {n: a for n, a in self._all.items() if n != me and a}

    def __contains__(self, node: object) -> bool:
        return node in self._all

    def is_founder(self, node: str) -> bool:
        return self._founders is not None and node in self._founders
