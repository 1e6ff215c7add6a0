"""The layering rules of ARCHITECTURE.md: imports point down only.

``engine`` never imports raft, cluster, grpc or asyncio; ``raft.core`` imports no IO, no
asyncio, no clock and no global randomness. Checked in a fresh interpreter so that nothing
another test imported leaks in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = {
    "raftstream.engine": ["grpc", "asyncio", "raftstream.raft", "raftstream.cluster"],
    "raftstream.raft.core": ["grpc", "asyncio", "lmdb", "time", "random", "socket", "threading"],
}

PROBE = """
import importlib, pkgutil, sys
before = set(sys.modules)
pkg = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(info.name)
print("\\n".join(sorted(set(sys.modules) - before)))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_in_their_layer(package: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, package], check=True, capture_output=True, text=True
    ).stdout.split()
    loaded = set(out)
    bad = sorted(m for m in loaded for f in FORBIDDEN[package] if m == f or m.startswith(f + "."))
    assert not bad, f"{package} pulled in {bad}"
