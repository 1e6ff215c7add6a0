"""Where a node keeps its data, and how the audit opens it without ever writing to it.

A data root holds one directory per node (``data/<node>/``), as ``cluster/node/node.py`` lays
it out: ``raft/`` is the LMDB environment of every Raft log of the node (the source of
truth, fsynced) and ``store/`` the LMDB environment of the engine stream stores (a cache the
node rebuilds from its Raft logs at every start). A directory counts as a node when it has
either environment.

Read-only contract: environments are opened with ``readonly=True, lock=False``. Without the
lock LMDB cannot see a live writer, so the directory read must be quiescent: a stopped node,
or a copy made by ``snapshot_root`` (``env.copy``, what ``mdb_copy`` does) while the node was
stopped or idle. ``audit run`` copies by default and reads the copy; nothing here ever opens
an environment for writing or creates a file inside a node's directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb

from raftstream.engine.lmdbcheck import check_lmdb_env
from raftstream.errors import DataLossError

__all__ = [
    "ENV_MAX_DBS",
    "RAFT_DIR",
    "STORE_DIR",
    "NodeDir",
    "check_root",
    "discover_nodes",
    "open_readonly",
    "scrub_root",
    "snapshot_root",
]

RAFT_DIR = "raft"
STORE_DIR = "store"
ENV_MAX_DBS = 32  # more than either environment uses (5 + 2 consumer DBs in the store)
_DATA_FILE = "data.mdb"


@dataclass(frozen=True, slots=True)
class NodeDir:
    """One node's data directory: ``name`` is the directory name (the node id)."""

    name: str
    path: Path

    @property
    def raft(self) -> Path | None:
        """The Raft log environment, or None when the node has none."""
        p = self.path / RAFT_DIR
        return p if (p / _DATA_FILE).is_file() else None

    @property
    def store(self) -> Path | None:
        """The stream store environment, or None when the node has none."""
        p = self.path / STORE_DIR
        return p if (p / _DATA_FILE).is_file() else None


def discover_nodes(root: str | os.PathLike[str]) -> list[NodeDir]:
    """The node directories under ``root``, sorted by name (empty when there are none)."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = [NodeDir(p.name, p) for p in sorted(base.iterdir()) if p.is_dir()]
    return [n for n in found if n.raft is not None or n.store is not None]


def open_readonly(path: str | os.PathLike[str]) -> Any:
    """Open the environment at ``path`` read-only and lock-free (see the module docstring).

    The caller closes it. Raises ``lmdb.Error`` when ``path`` is no LMDB environment, and
    ``DataLossError`` naming the file when its data file is shorter than LMDB records (a
    read would SIGBUS the process: ``engine/lmdbcheck.py``).
    """
    check_lmdb_env(path)
    return lmdb.open(
        os.fspath(path),
        readonly=True,
        lock=False,
        max_dbs=ENV_MAX_DBS,
        readahead=False,  # scans are sequential per key range; the OS page cache suffices
        create=False,
    )


def check_root(root: str | os.PathLike[str]) -> None:
    """``DataLossError`` naming the first environment under ``root`` that LMDB cannot map
    whole (``check_lmdb_env``): checked before Spark starts, whose workers would otherwise
    die on it with a bus error."""
    for node in discover_nodes(root):
        for env in (node.raft, node.store):
            if env is not None:
                check_lmdb_env(env)


def scrub_root(root: str | os.PathLike[str]) -> None:
    """``DataLossError`` naming the node, and the group when known, whose Raft data has a
    record that fails its checksum (hard state, snapshot, any entry): the check a node makes
    at start (``cluster/repair/repair.py``), read-only here. Run before Spark starts: a worker
    that met it mid-query would end the audit with a JVM stack trace instead."""
    # Imported here: the readers pull in the engine's record layouts.
    from raftstream.audit.readers import iter_raft_entries, raft_groups, read_snapshot_data

    for node in discover_nodes(root):
        if node.raft is None:
            continue
        env = open_readonly(node.raft)
        try:
            for g in raft_groups(env):  # names the group of a bad hard state or last entry
                try:
                    read_snapshot_data(env, g.prefix)
                    for _ in iter_raft_entries(env, g.prefix):
                        pass
                except DataLossError as exc:
                    raise DataLossError(f"group {g.group}: {exc}", **exc.details) from None
        except DataLossError as exc:
            key = str(exc.details.get("key", ""))
            at = f" (entry index {int(key[-16:], 16)})" if len(key) == 24 else ""
            raise DataLossError(f"node {node.name} ({RAFT_DIR}/): {exc}{at}") from None
        finally:
            env.close()


def snapshot_root(root: str | os.PathLike[str], dest: str | os.PathLike[str] | None = None) -> Path:
    """Copy every node's environments under ``root`` into ``dest`` (a new temporary
    directory when None) and return it; the caller removes it (``shutil.rmtree``).

    Each environment is copied with ``env.copy`` (LMDB's consistent copy of the last
    committed transaction, what ``mdb_copy`` does) from a read-only, lock-free handle, so the
    copy is consistent when the node is stopped or idle (module docstring). Raises
    ``FileNotFoundError`` when ``root`` holds no node.
    """
    nodes = discover_nodes(root)
    if not nodes:
        raise FileNotFoundError(f"no node data directories under {root}")
    out = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="raftstream-audit-"))
    try:
        for node in nodes:
            for src in (node.raft, node.store):
                if src is None:
                    continue
                target = out / node.name / src.name
                target.mkdir(parents=True, exist_ok=True)
                env = open_readonly(src)
                try:
                    env.copy(os.fspath(target))
                finally:
                    env.close()
    except BaseException:
        if dest is None:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return out
