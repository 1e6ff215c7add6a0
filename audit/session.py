"""The Spark session of an audit, and the audit tables loaded from either input.

``spark_session`` never hard-codes a master when Spark already has one: under
``spark-submit`` (its driver gets ``PYSPARK_GATEWAY_PORT``) or with an active SparkContext the
existing setup is used unchanged. Otherwise it starts a session sized for a shared machine
on ``local[2]`` (or the given master): 1 GiB of driver memory, 512 MiB executors, few
shuffle partitions, no UI, loopback only, and the running interpreter (this venv) as the
workers' Python.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

from raftstream.audit.checks import AuditTables
from raftstream.audit.source import FORMAT, register
from raftstream.audit.tables import DEFAULT_ROWS_PER_PARTITION, TABLES, spark_ddl

__all__ = ["DEFAULT_MASTER", "HISTORY_DDL", "load_tables", "spark_session"]

DEFAULT_MASTER = "local[2]"
HISTORY_DDL = "op STRING, stream STRING, seq BIGINT, msg_id STRING, outcome STRING"
_LOCAL_CONF = {
    "spark.driver.memory": "1g",
    "spark.executor.memory": "512m",  # a standalone worker offers 1 GiB by default here
    "spark.cores.max": "2",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.adaptive.enabled": "true",
}


def _local_env() -> None:
    # Loopback only, and the workers run this interpreter (the venv has raftstream).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_session(
    *, master: str | None = None, remote: str | None = None, app: str = "raftstream-audit"
) -> SparkSession:
    """A session for the audit, with the ``raftstream`` data source registered.

    ``remote`` (``sc://host:port``) connects through Spark Connect. ``master`` is used only
    when Spark has none yet (module docstring); None then means ``local[2]``. The caller
    stops the session (``spark.stop()``) when it created it.
    """
    _local_env()
    if remote is not None:
        spark = SparkSession.builder.remote(remote).appName(app).getOrCreate()
        register(spark)
        return spark
    builder = SparkSession.builder.appName(app)
    # spark-submit launches this driver with the JVM already up and passes its port: the
    # submitted conf (master included) then applies unchanged.
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    if SparkContext._active_spark_context is None and not submitted:
        builder = builder.master(master or DEFAULT_MASTER)
        for key, value in _LOCAL_CONF.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _parquet_table(spark: SparkSession, root: str, table: str) -> DataFrame:
    path = Path(root) / table
    if not path.exists():
        return spark.createDataFrame([], spark_ddl(table))
    return (
        spark.read.schema(spark_ddl(table)).option("recursiveFileLookup", "true").parquet(str(path))
    )


def load_tables(
    spark: SparkSession,
    *,
    data: str | None = None,
    parquet: str | None = None,
    history: str | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
) -> AuditTables:
    """The audit tables from a data root (``data``, through the data source) or from an
    export (``parquet``); exactly one must be given. Each table is cached: the rules read
    them many times. ``history`` is a JSON-lines client history (``HISTORY_DDL``)."""
    if (data is None) == (parquet is None):
        raise ValueError("give exactly one of data or parquet")
    frames: dict[str, DataFrame] = {}
    for table in TABLES:
        if data is not None:
            df = (
                spark.read.format(FORMAT)
                .option("path", data)
                .option("table", table)
                .option("rowsPerPartition", str(rows_per_partition))
                .load()
            )
        else:
            df = _parquet_table(spark, str(parquet), table)
        frames[table] = df.cache()
    hist = spark.read.schema(HISTORY_DDL).json(history) if history is not None else None
    return AuditTables(
        messages=frames["messages"],
        raft_log=frames["raft_log"],
        consumers=frames["consumers"],
        streams=frames["streams"],
        history=hist,
    )
