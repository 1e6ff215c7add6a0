"""A real 3-node cluster shared by the CLI tests of one module (starting one costs seconds;
each test uses its own stream names, so they do not see each other's data).

The cluster is ``tests.support.cluster.LocalCluster``: free 127.0.0.1 ports, a temporary
directory, every process killed (by pid) and the directory removed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster, free_port, running


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A started 3-node cluster (``LocalCluster``); node log tails printed on failure."""
    with running(LocalCluster(3), request=request, lines=40) as c:
        yield c


@pytest.fixture
def free_dead_addr() -> str:
    """A 127.0.0.1 address nothing listens on."""
    return f"127.0.0.1:{free_port()}"
