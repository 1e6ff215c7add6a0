"""``audit export``: the audit tables of a data root as Parquet files (pyarrow).

Layout under ``out``: ``<table>/<node>/<name>.parquet``, one file per stream (or Raft group)
per node, ``name`` being the stream's group id made safe for a file name; ``streams`` has
one file per node. An audit reads the tree back with ``--parquet out`` (Spark reads each
table directory recursively), so the files can live on shared storage. The rows are exactly
those of the data source (both come from ``tables.read_part``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from raftstream.audit.tables import (
    DEFAULT_ROWS_PER_PARTITION,
    SCHEMAS,
    TABLES,
    plan_parts,
    read_part,
)

__all__ = ["ExportSummary", "export"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class ExportSummary:
    """What ``export`` wrote: rows per table and the number of files."""

    rows: dict[str, int]
    files: int


def _file_name(name: str) -> str:
    # Group ids hold ':' and '$' ("S:$G:ORDERS"); keep them readable yet portable.
    return _UNSAFE.sub("_", name or "node") + ".parquet"


def export(
    root: str, out: str, *, rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
) -> ExportSummary:
    """Write every table of the data root ``root`` under ``out`` (created); returns counts.

    Reads ``root`` read-only (it should be quiescent, see ``layout``). Existing files of the
    same names are replaced. A partition's rows stream through one writer, so memory stays
    at one record batch.
    """
    rows = dict.fromkeys(TABLES, 0)
    files = 0
    for table in TABLES:
        writers: dict[Path, pq.ParquetWriter] = {}
        try:
            for part in plan_parts(root, table, rows_per_partition):
                target = Path(out) / table / part.node / _file_name(part.name)
                if target not in writers:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    writers[target] = pq.ParquetWriter(target, SCHEMAS[table])
                for batch in read_part(part):
                    writers[target].write_batch(batch)
                    rows[table] += batch.num_rows
        finally:
            for w in writers.values():
                w.close()
        files += len(writers)
    return ExportSummary(rows, files)
