"""The ``raftstream`` PySpark data source: node data directories as Spark tables.

Usage (after ``register(spark)``)::

    spark.read.format("raftstream").option("path", "./data").option("table", "messages").load()

Options: ``path`` (the data root, one directory per node; required), ``table`` (one of
``messages``, ``raft_log``, ``consumers``, ``streams``; default ``messages``) and
``rowsPerPartition`` (a stream's messages, or a group's entries, split into partitions of at
most this many sequences or indexes; default 1,000,000).

Partitions are planned on the driver side by reading each node's stream metas and Raft group
bounds; each partition is read in a Python worker, which yields Arrow record batches. The
``path`` must be readable at the same location by every executor (local mode; shared storage
on a cluster), and quiescent: ``layout.snapshot_root`` makes such a copy (``audit run`` reads
one by default). Nothing is ever written to it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from raftstream.audit.tables import (
    DEFAULT_ROWS_PER_PARTITION,
    TABLES,
    Part,
    pack_parts,
    plan_parts,
    read_part,
    spark_ddl,
)

__all__ = ["FORMAT", "RaftstreamDataSource", "register"]

FORMAT = "raftstream"


class _Partition(InputPartition):
    """The ``tables.Part`` values of one Spark partition, carried to a Python worker
    (pickled); all of one node (``tables.pack_parts``)."""

    def __init__(self, parts: tuple[Part, ...]) -> None:
        super().__init__(parts)
        self.parts = parts


class RaftstreamDataSource(DataSource):
    """Reads one audit table of a data root (see the module docstring for the options)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _table(self) -> str:
        table = str(self.options.get("table", "messages"))
        if table not in TABLES:
            raise ValueError(f"option table={table!r}: one of {', '.join(TABLES)}")
        return table

    def schema(self) -> str:
        return spark_ddl(self._table())

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("option path (the data root) is required")
        rows = int(self.options.get("rowsPerPartition", DEFAULT_ROWS_PER_PARTITION))
        return _Reader(str(path), self._table(), rows)


class _Reader(DataSourceReader):
    def __init__(self, root: str, table: str, rows_per_partition: int) -> None:
        self._root = root
        self._table = table
        self._rows = rows_per_partition

    def partitions(self) -> Sequence[InputPartition]:
        parts = plan_parts(self._root, self._table, self._rows)
        # Spark needs at least one partition; an empty one reads no rows.
        return [_Partition(ps) for ps in pack_parts(parts, self._rows)] or [_Partition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        parts: tuple[Part, ...] = partition.parts  # type: ignore[attr-defined]
        for part in parts:
            yield from read_part(part)


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("raftstream")`` available in ``spark``'s session."""
    spark.dataSource.register(RaftstreamDataSource)
