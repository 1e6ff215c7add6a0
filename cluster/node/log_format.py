"""The node's log format: one structured line per record, with node, group and term."""

from __future__ import annotations

import logging

__all__ = ["configure_logging"]


class _Fields(logging.Filter):
    """Every record gets ``node``, ``group`` and ``term`` (``-`` when it has none)."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self._node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "node"):
            record.node = self._node
        for name in ("group", "term"):
            if not hasattr(record, name):
                setattr(record, name, "-")
        return True


def configure_logging(node: str, level: int = logging.INFO) -> None:
    """Structured one-line logs: time, level, node, group, term, logger, message."""
    handler = logging.StreamHandler()
    handler.addFilter(_Fields(node))
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s node=%(node)s group=%(group)s term=%(term)s "
            "%(name)s: %(message)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
