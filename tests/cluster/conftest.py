"""The cluster tests' fixture: ``cluster3``, a real 3-node cluster on loopback
(``tests/support/cluster.py``). The meta entry builders are in ``tests/support/meta.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import LocalCluster, running

# -- real node processes (integration) ---------------------------------------------------------


@pytest.fixture
def cluster3(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A started 3-node cluster of real processes on loopback, in a temporary directory.
    Always killed and removed afterwards; its nodes' log tails are printed on failure."""
    with running(LocalCluster(3), request=request, fail_on_exit=True) as c:
        yield c
