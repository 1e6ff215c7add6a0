"""Fixtures of the SDK's integration tests: a real 3-node cluster (``tests/cluster``'s
``LocalCluster``: node processes on free 127.0.0.1 ports, always killed and removed).

``cluster`` is shared by the tests of one module (each test uses its own streams), so a
module pays for one start; tests that kill or freeze nodes take ``own_cluster``. Node log
tails are printed when a test that used them failed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.node_harness import LocalCluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _print_tails_if_failed(request: pytest.FixtureRequest, c: LocalCluster) -> None:
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(c.tails(40))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One started 3-node cluster for the whole test module."""
    c = LocalCluster(3)
    try:
        c.start_all()
        yield c
    except BaseException:
        print(c.tails(40))
        raise
    finally:
        c.close()


@pytest.fixture
def tails(request: pytest.FixtureRequest, cluster: LocalCluster) -> Iterator[None]:
    """Print the shared cluster's log tails if this test fails."""
    yield
    _print_tails_if_failed(request, cluster)


@pytest.fixture
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-node cluster of this test alone (it may kill or freeze nodes)."""
    c = LocalCluster(3)
    try:
        c.start_all()
        yield c
        _print_tails_if_failed(request, c)
    except BaseException:
        print(c.tails(40))
        raise
    finally:
        c.close()
