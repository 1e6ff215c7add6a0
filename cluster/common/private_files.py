"""A node's data directory and files are private to the user running it (issue 39,
finding 7: created 0755/0644, any local user could ``grep -a`` a KV secret out of
``store/data.mdb`` or another account's messages out of ``raft/data.mdb``).

Directories are created ``DIR_MODE`` (0700) and files ``FILE_MODE`` (0600), as the key and
secret files are; a directory or file found looser (readable or writable by group or
others) is used as it is, with a WARNING naming its path and mode, since changing the
modes an operator set is theirs to do (``chmod``).

A node opens its own files with ``open_private`` (issue 39, finding 8): ``O_NOFOLLOW`` and
``O_CLOEXEC``, so a symbolic link planted in the data directory is refused, naming its path,
never followed (``data/LOCK -> /tmp/victim`` made a root node write its pid into the
victim); and ``check_owner`` refuses a data directory that another user owns.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "check_owner",
    "make_private_dir",
    "open_private",
    "warn_if_loose",
]

DIR_MODE = 0o700
FILE_MODE = 0o600

log = logging.getLogger(__name__)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) ``DIR_MODE``; warn when it exists looser.
    ``OSError`` as the file system raises it."""
    if not path.exists():
        path.mkdir(parents=True, mode=DIR_MODE)
    warn_if_loose(path)


def warn_if_loose(path: Path) -> bool:
    """Log a WARNING naming ``path`` and its mode when group or others may read, write or
    enter it (the mode itself, never a symlink's target); whether it did. A missing path
    is not loose."""
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
    if not mode & 0o077:
        return False
    want = DIR_MODE if path.is_dir() else FILE_MODE
    log.warning(
        "%s is mode %04o: other local users may read this node's data (its streams, KV"
        " values, credentials' records); it should be %04o (chmod %04o %s)",
        path,
        mode,
        want,
        want,
        path,
    )
    return True


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags)`` without following a symbolic link at ``path`` (and
    close-on-exec), creating it ``FILE_MODE``. ``OSError`` naming the path when it is a
    link; others as the file system raises them."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and path.is_symlink()):
            raise OSError(
                exc.errno,
                f"{path} is a symbolic link: a node opens none of its own files through one"
                " (remove it)",
            ) from None
        raise


def check_owner(path: Path) -> None:
    """``PermissionError`` naming ``path`` and its owner unless the user running the node
    owns it: files another user can replace (links, a LOCK) must not be written as us."""
    owner = os.stat(path).st_uid
    me = os.geteuid()
    if owner != me:
        raise PermissionError(
            f"data directory {path} is owned by uid {owner}, not by the user running this"
            f" node (uid {me}): give the node a directory of its own (chown, or --data)"
        )
