"""Shared by the audit tests: ONE local Spark session for the whole run (local[2], small
settings; starting a JVM costs seconds), and the synthetic data sets, built once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from raftstream.audit.checks import RuleResult, run_checks
from raftstream.audit.session import load_tables, spark_session

from .datasets import build_clean, build_faulty


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app="raftstream-audit-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(data root, history file) of the faulty data set."""
    root = tmp_path_factory.mktemp("faulty")
    return root / "data", build_faulty(root)


@pytest.fixture(scope="session")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("clean")
    return root / "data", build_clean(root)


@pytest.fixture(scope="session")
def faulty_results(spark: SparkSession, faulty: tuple[Path, Path]) -> list[RuleResult]:
    """Every rule's outcome on the faulty data set read from LMDB (one audit, shared)."""
    data, history = faulty
    tables = load_tables(spark, data=str(data), history=str(history), rows_per_partition=1000)
    try:
        return run_checks(tables)
    finally:
        for df in (tables.messages, tables.raft_log, tables.consumers, tables.streams):
            df.unpersist()
