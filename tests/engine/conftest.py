"""Fixtures for the stream stores: a temporary LMDB node environment and both stores.

Other suites may use them: ``lmdb_env`` is an open node environment in a temporary
directory (closed after the test); ``store_kit`` is parametrized over the memory and LMDB
stores and builds stores with ``store_kit.make(limits=...)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftstream.engine.memstore import MemoryStreamStore
from raftstream.engine.store import StoreLimits, StreamStore

_LMDB_MAP_SIZE_BYTES = 256 * 1024 * 1024


def _lmdb_module() -> Any:
    from raftstream.engine import lmdbstore

    return lmdbstore


@pytest.fixture
def lmdb_path(tmp_path: Path) -> Path:
    return tmp_path / "node"


@pytest.fixture
def lmdb_env(lmdb_path: Path) -> Iterator[Any]:
    """An open node environment (``open_node_env``) in a temporary directory."""
    env = _lmdb_module().open_node_env(lmdb_path, map_size_bytes=_LMDB_MAP_SIZE_BYTES)
    yield env
    env.close()


class StoreKit:
    """Builds stores of one kind; ``durable`` says whether ``reopen`` keeps the data."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.durable = kind == "lmdb"
        self._path = path
        self._env: Any = None
        self._names = itertools.count()
        self._stores: list[StreamStore] = []

    def make(self, *, limits: StoreLimits | None = None, name: str | None = None) -> StreamStore:
        """A fresh store (a new stream name in the shared environment for LMDB)."""
        store: StreamStore
        if self.kind == "memory":
            store = MemoryStreamStore(limits=limits)
        else:
            mod = _lmdb_module()
            if self._env is None:
                self._env = mod.open_node_env(self._path, map_size_bytes=_LMDB_MAP_SIZE_BYTES)
            stream = name or f"S{next(self._names)}"
            store = mod.LmdbStreamStore(self._env, stream, limits=limits)
        self._stores.append(store)
        return store

    def reopen(self, store: StreamStore, name: str) -> StreamStore:
        """Close the environment and open it again (LMDB); the memory store is returned."""
        if self.kind == "memory":
            return store
        mod = _lmdb_module()
        self._env.close()
        self._env = mod.open_node_env(self._path, map_size_bytes=_LMDB_MAP_SIZE_BYTES)
        fresh: StreamStore = mod.LmdbStreamStore(self._env, name)
        self._stores.append(fresh)
        return fresh

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


@pytest.fixture(params=["memory", "lmdb"])
def store_kit(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKit]:
    """Both stores, one after the other: the same test runs on each."""
    kit = StoreKit(str(request.param), tmp_path / "node")
    yield kit
    kit.close()


@pytest.fixture
def store(store_kit: StoreKit) -> StreamStore:
    """A fresh unlimited store of each kind."""
    return store_kit.make()
