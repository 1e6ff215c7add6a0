"""The Raft library depends on nothing of the application (docs/architecture.md, "Layers":
"raft (a library: imports nothing of the application)"; issue 34, "``raft/`` depends on
nothing of the application: its errors are its own, its transport does not import the client
API's protobufs").

Checked in a fresh interpreter, with the namespace root ``raftstream`` stood in for by an
empty package (its ``__init__`` is the SDK's, which the library cannot choose, and it loads
``raftstream.errors`` itself): the modules that ``import raftstream.raft`` and every one of
its submodules load must include none of the application's. The Raft protobufs
(``raftstream.proto.raft_pb2``) are the library's own wire and allowed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FORBIDDEN = (
    "raftstream.errors",
    "raftstream.engine.lmdbcheck",
    "raftstream.proto.errors",
    "raftstream.proto.raftstream_pb2",
    "raftstream.cluster",
    "raftstream.engine",
)

PROBE = """
import importlib, importlib.util, pkgutil, sys, types
spec = importlib.util.find_spec("raftstream")
root = types.ModuleType("raftstream")
root.__path__ = list(spec.submodule_search_locations)
root.__spec__ = spec
sys.modules["raftstream"] = root  # the SDK's __init__ does not run
before = set(sys.modules)
pkg = importlib.import_module("raftstream.raft")
for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    importlib.import_module(info.name)
for extra in sys.argv[1:]:
    importlib.import_module(extra)
print("\\n".join(sorted(set(sys.modules) - before)))
"""


def _loaded_by_raft(*extra: str) -> set[str]:
    """What importing the whole of ``raftstream.raft`` (then ``extra``) loads."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *extra],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    return set(out)


def _forbidden(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded for f in FORBIDDEN if m == f or m.startswith(f + "."))


def test_raft_loads_nothing_of_the_application() -> None:
    loaded = _loaded_by_raft()
    assert "raftstream.raft.host" in loaded  # the probe walked the package
    assert "raftstream.raft.transport.grpc_transport" in loaded
    assert "raftstream.errors" not in loaded
    assert not _forbidden(loaded), f"raftstream.raft pulled in {_forbidden(loaded)}"


@pytest.mark.parametrize("module", ["raftstream.errors", "raftstream.proto.errors"])
def test_the_probe_sees_a_forbidden_import(module: str) -> None:
    """The probe bites: had raft imported ``module``, it would be reported."""
    assert module in _forbidden(_loaded_by_raft(module))
