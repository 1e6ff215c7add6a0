"""What a consumer changed since it last persisted, and the one write that persists it.

Part of ``Consumer`` (``consumer.py``): applying an op marks what it changed here; ``flush``
writes the changes to the ``ConsumerStateStore`` in one write. Threading: as the consumer.
"""

from __future__ import annotations

from collections.abc import Iterable

from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_state import ConsumerState
from raftstream.engine.consumer_store import ConsumerKey, ConsumerStateStore

__all__ = ["StateWriter"]


class StateWriter:
    """Changes not yet written to ``store`` for the consumer ``key``. A failed write
    propagates and keeps the marks, so the next flush writes them again."""

    def __init__(self, store: ConsumerStateStore, key: ConsumerKey) -> None:
        self._store = store
        self._key = key
        self._dirty: set[int] = set()  # pending entries changed (upserted or removed)
        self._meta_dirty = False
        self._config_dirty = False
        self._clear_pending = False

    def changed(self, stream_seqs: Iterable[int]) -> None:
        """An op was applied: the state's counters, and these pending entries, changed."""
        self._meta_dirty = True
        self._dirty.update(stream_seqs)

    def reset(self) -> None:
        """The pending entries were replaced wholesale: the next write clears and rewrites."""
        self._meta_dirty = True
        self._clear_pending = True
        self._dirty.clear()

    def config_changed(self) -> None:
        """The config changed: the next write stores it with the state."""
        self._config_dirty = True

    def remove(self) -> None:
        """Remove the consumer's stored config and state (the consumer is deleted)."""
        self._store.remove(self._key)

    def flush(self, state: ConsumerState, config: ConsumerConfig) -> None:
        """Persist what changed since the last flush (one state-store write), if anything."""
        if not (self._meta_dirty or self._dirty or self._config_dirty):
            return
        pending = state.pending
        if self._clear_pending:
            upserts = dict(pending)
            deletes: list[int] = []
        else:
            upserts = {s: pending[s] for s in self._dirty if s in pending}
            deletes = [s for s in self._dirty if s not in pending]
        self._store.write(
            self._key,
            state=state,
            upserts=upserts,
            deletes=deletes,
            clear=self._clear_pending,
            config=config if self._config_dirty else None,
        )
        self._dirty.clear()
        self._meta_dirty = False
        self._config_dirty = False
        self._clear_pending = False
