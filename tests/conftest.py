"""Shared pytest configuration."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# CI machines are shared and noisy: no deadlines on examples, more examples in CI.
settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")

# Each pytest-xdist worker picks listening ports from its own slice of the range (workers do
# not share raftstream.tooling.localnet's record of ports handed out; see PORT_SLICE_ENV).
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit():
    _count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    os.environ["RAFTSTREAM_PORT_SLICE"] = f"{int(_worker[2:])}/{_count}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item, so fixtures can tell a failed test
    (tests.support.cluster.running)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
