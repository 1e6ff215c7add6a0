"""The node gives freed heap memory back to the system (``cluster/node/heap.py``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from raftstream.cluster.config import Address, NodeConfig
from raftstream.cluster.node import heap
from raftstream.tooling.localnet import free_port

# Freed pieces of 1 MiB with small kept objects between them, as compactions leave the heap.
# Whether glibc gives such pieces back by itself depends on where the kept objects land and
# on its thresholds, which move as the process allocates (the same probe given to
# ``python -c`` kept nothing, from a file everything): the probe fixes both thresholds with
# ``mallopt`` (the pieces come from the heap; ``free`` never trims it), so only ``release``
# can give the pieces back.
_PROBE = textwrap.dedent(
    """
    import ctypes, gc, os
    from raftstream.cluster.node import heap
    from raftstream.tooling.procfs import status_kib

    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc = ctypes.CDLL(None)
    assert libc.mallopt(M_MMAP_THRESHOLD, 16 << 20) == 1
    assert libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1

    def anon_mib():
        return status_kib(os.getpid(), "RssAnon")["RssAnon"] // 1024

    before = anon_mib()
    kept = []
    pieces = []
    for _ in range(96):
        pieces.append(os.urandom(1 << 20))
        kept.append(os.urandom(1000))  # past pymalloc's 512 bytes: from malloc's heap
    del pieces
    gc.collect()
    freed = anon_mib()
    released = heap.release()
    print(before, freed, anon_mib(), released)
    """
)


@pytest.mark.skipif(heap._malloc_trim() is None, reason="no malloc_trim (not glibc)")
def test_release_gives_the_freed_heap_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    before, freed, after = map(int, out[:3])
    assert freed - before >= 64, f"glibc gave the pieces back by itself: {out}"  # the premise
    assert after - before < 16, f"the freed heap was not given back: {out}"
    assert out[3] == "True"


def test_a_running_node_releases_its_heap_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raftstream.cluster.node import node as node_module

    released = threading.Event()
    monkeypatch.setattr(heap, "HEAP_RELEASE_EVERY_S", 0.01)
    monkeypatch.setattr(heap, "release", released.set)  # called in a thread
    addr = Address("127.0.0.1", free_port())
    node = node_module.Node(
        config=NodeConfig(name="n1", listen=addr, data=tmp_path, peers={"n1": addr})
    )

    async def body() -> None:
        await node.start()
        try:
            assert await asyncio.to_thread(released.wait, 10), "no release in 10 s"
        finally:
            await node.stop()

    asyncio.run(body())
