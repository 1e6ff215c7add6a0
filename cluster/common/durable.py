"""Small durable writes in a node's data directory: markers and records that must survive
a crash once written (the repair marker, the lost-data check's marker, the known peers).

``write_json`` writes a temporary file (``FILE_MODE``, 0600), fsyncs it, renames it over the
target and fsyncs the directory, so a crash leaves the old contents or the new, never a
torn file, and the rename itself is durable. ``fsync_dir`` makes a file's creation, rename
or removal in ``path`` durable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from raftstream.cluster.common.private_files import open_private

__all__ = ["fsync_dir", "write_json"]


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON, durably (module docstring). ``OSError`` as
    the file system raises it."""
    tmp = path.with_name(path.name + ".tmp")
    # A fresh file, so it is created FILE_MODE (a leftover one keeps the mode it had).
    tmp.unlink(missing_ok=True)
    # Removed first: a planted link is unlinked, never written through (O_EXCL|O_NOFOLLOW
    # refuse one that appears meanwhile; cluster/common/private_files.py).
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as fh:
        json.dump(value, fh)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    fsync_dir(path.parent)
