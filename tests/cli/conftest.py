"""A real 3-node cluster shared by the CLI tests of one module (starting one costs seconds;
each test uses its own stream names, so they do not see each other's data).

The cluster is ``tests/cluster/node_harness.LocalCluster``: free 127.0.0.1 ports, a
temporary directory, every process killed (by pid) and the directory removed afterwards.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _harness() -> ModuleType:
    """``tests/cluster/node_harness.py``, loaded by path (tests/ is not a package)."""
    name = "raftstream_cli_tests_node_harness"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent.parent / "cluster" / "node_harness.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A started 3-node cluster (``LocalCluster``); node log tails printed on failure."""
    harness = _harness()
    with harness.running(harness.LocalCluster(3)) as c:
        try:
            yield c
        finally:
            if request.session.testsfailed:
                print(c.tails(40))


@pytest.fixture
def free_dead_addr() -> str:
    """A 127.0.0.1 address nothing listens on."""
    return f"127.0.0.1:{_harness().free_port()}"
