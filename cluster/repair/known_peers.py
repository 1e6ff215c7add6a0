"""The peers this node has seen running: what tells a node that lost its data from a new one.

A node that starts without Raft data cannot tell by itself whether it is a member of a new cluster
or an old member whose disk was lost or wiped. Started empty in the second case, it would vote and
acknowledge from an empty log that its peers count (Raft thesis §11.7), and it would answer clients
from an empty meta state ("stream not found"). So every node records each peer it has described
successfully (the peer was serving, so it had Raft data), and a node without Raft data asks its
peers first (``NodeService.Describe``, ``knows_asker``), before any group runs and until enough have
answered to make a majority with it: if one has seen it before, it refuses to start and says to
rejoin with ``--join`` (``cluster/repair/repair.py``). It asks with its server up, so nodes of a new
cluster, all empty, answer each other.

The record is a JSON list in ``data/known-peers.json``, written durably
(``cluster/common/durable.py``) when a peer is seen for the first time (a handful of writes in a
node's life). Owned by the node's event loop.

While a node asks, ``data/CHECKING`` exists (written durably before the empty Raft
environment is created, removed once the answer allows the start). A start that found it
was interrupted while asking (a crash, a kill -9): the Raft environment it left is empty and
is removed, so the node asks again rather than take that environment for its data. A node
started with ``--join`` is marked the same way until a running cluster's meta leader answers
(``cluster/repair/repair.py`` ``prepare`` and ``seek_cluster``): one that stopped before that, or
found no cluster to join, left an empty environment too, and starts the next time as if new.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from raftstream.cluster.common.durable import fsync_dir, write_json

__all__ = [
    "CHECKING_MARKER",
    "KNOWN_PEERS_FILE",
    "KnownPeers",
    "begin_check",
    "clear_interrupted_check",
    "end_check",
]

KNOWN_PEERS_FILE = "known-peers.json"
CHECKING_MARKER = "CHECKING"
log = logging.getLogger(__name__)


class KnownPeers:
    """The set of peers seen running, persisted under the data directory ``data``."""

    def __init__(self, data: Path) -> None:
        self._path = data / KNOWN_PEERS_FILE
        self._names: set[str] = set()

    def load(self) -> None:
        """Read the record (once the node holds its data directory's lock)."""
        try:
            raw = json.loads(self._path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            # Unreadable: start over (the worst case is not recognising a peer that lost its
            # data, the protection this file adds, never a wrong refusal).
            log.warning("ignoring unreadable %s: %s", self._path, exc)
            return
        if isinstance(raw, list):
            self._names = {n for n in raw if isinstance(n, str)}

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def add(self, name: str) -> None:
        """Record ``name`` as seen running (durably, the first time)."""
        if name in self._names:
            return
        self._names.add(name)
        try:
            write_json(self._path, sorted(self._names))
        except OSError as exc:  # a full disk: retried when the peer is next described
            self._names.discard(name)
            log.warning("cannot record peer %s in %s: %s", name, self._path, exc)


def clear_interrupted_check(data: Path, raft_dir: Path) -> None:
    """At start, before anything looks at ``raft_dir``: a marker left by a start that ended
    while it asked (module docstring) removes that start's empty environment."""
    if (data / CHECKING_MARKER).exists():
        log.warning(
            "the last start ended while it asked its peers (or looked for a cluster to join):"
            " removing the empty %s it left",
            raft_dir,
        )
        end_check(data, raft_dir)


def begin_check(data: Path) -> None:
    """Before a node without Raft data creates its environment to ask its peers."""
    (data / CHECKING_MARKER).touch()
    fsync_dir(data)


def end_check(data: Path, raft_dir: Path | None) -> None:
    """The asking is over: the marker goes, and with ``raft_dir`` (refused, or stopped while
    asking) the empty environment this start created."""
    if raft_dir is not None:
        shutil.rmtree(raft_dir, ignore_errors=True)
    (data / CHECKING_MARKER).unlink(missing_ok=True)
    fsync_dir(data)
