"""Fixtures of the SDK's integration tests: a real 3-node cluster (``tests/cluster``'s
``LocalCluster``: node processes on free 127.0.0.1 ports, always killed and removed).

``cluster`` is shared by the tests of one module (each test uses its own streams), so a
module pays for one start; tests that kill or freeze nodes take ``own_cluster``. Node log
tails are printed when a test that used them failed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster, failed_test, running


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One started 3-node cluster for the whole test module."""
    with running(LocalCluster(3), lines=40) as c:
        yield c


@pytest.fixture
def tails(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[None]:
    """Print the shared cluster's log tails if this test fails."""
    yield
    if failed_test(request):
        print(cluster.tails(40))


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-node cluster of this test alone (it may kill or freeze nodes)."""
    with running(LocalCluster(3), request=request, lines=40) as c:
        yield c
