"""Moved: the cluster helpers are in tests/support/cluster.py, the polling helpers in
tests/support/polling.py. This module only re-exports them for the modules that still
import them from here; import from tests.support instead."""

from __future__ import annotations

from tests.support.cluster import LocalCluster, free_port, run, running, until_led
from tests.support.polling import retry_async, wait_for

__all__ = ["LocalCluster", "free_port", "retry_async", "run", "running", "until_led", "wait_for"]
