"""Giving the memory a node freed back to the system.

glibc's malloc keeps freed memory for the process's next allocations, and gives back only
what lies free at the top of its heap. A node frees a lot at once now and then: a
compaction builds a stream's snapshot in pieces (2,048 records each) and joins them, about
3 times the stream's bytes at the peak, and drops it all once written; a restart or an
installed snapshot decodes one. The small objects the node keeps meanwhile land between
the freed pieces, so the heap cannot shrink, and the node's resident memory stays at the
compaction's peak until the next one: measured on a 52 MB stream (100,000 messages of 512
bytes), three compactions left the heap 61, 85 and 91 MiB bigger; ``malloc_trim`` brought
it back to 16 MiB over the start (the small objects kept), in 5 ms.

So the node calls ``release`` every ``HEAP_RELEASE_EVERY_S`` (``cluster/node/node.py``), in a
thread: glibc's ``malloc_trim(0)`` returns the free pages of every arena (about 20 µs when
there is nothing to return). Where the C library has no ``malloc_trim`` (not glibc), it
does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

__all__ = ["HEAP_RELEASE_EVERY_S", "release"]

HEAP_RELEASE_EVERY_S = 30.0


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    # The symbols the process has loaded, libc's among them: ctypes.util.find_library would
    # run ldconfig in a child process for the same answer.
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release() -> bool:
    """Give the heap's free memory back to the system; True if some was (False: none, or
    no ``malloc_trim`` here). Blocks for as long as that takes (ms): call it off the loop."""
    trim = _malloc_trim()
    return trim is not None and trim(0) == 1
