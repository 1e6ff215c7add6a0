"""The ``audit`` command group: ``run`` (the audit) and ``export`` (tables as Parquet).

Wired into ``raftstream audit ...`` by ``raftstream/cli.py`` and runnable on its own as
``python -m raftstream.audit``. ``run`` exits 1 when a failing rule has findings, 2 on a
usage error, 0 otherwise.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from raftstream.cli.common import describe_error, fail
from raftstream.errors import DataLossError

if TYPE_CHECKING:
    from raftstream.audit.checks import AuditTables
    from raftstream.audit.report import ReplicaPosition

# Spark and pyarrow load inside the commands: ``raftstream --help`` (this group is part of
# the main command line) must not pay for importing them.
DEFAULT_ROWS_PER_PARTITION = 1_000_000  # tables.DEFAULT_ROWS_PER_PARTITION

__all__ = ["audit"]


@contextmanager
def _readable(data: str, copy: bool) -> Iterator[str]:
    """The directory to read: a consistent copy of ``data`` (removed afterwards) or, with
    ``copy`` off, ``data`` itself, which must then be quiescent (``layout``). A node's
    environment that LMDB cannot map whole (a truncated data file), or a Raft record that
    fails its checksum (``scrub_root``), ends the command with one line naming the file or
    the node and group, before Spark starts."""
    # The node's own decoders (engine, raft), loaded when an audit runs: the command line
    # stays a client until then (tests/cli/test_cli_layering.py).
    from raftstream.audit.layout import check_root, scrub_root, snapshot_root

    snap = None
    try:
        check_root(data)
        snap = snapshot_root(data) if copy else None
        scrub_root(snap if snap is not None else data)
    except DataLossError as exc:
        if snap is not None:
            shutil.rmtree(snap, ignore_errors=True)
        fail(
            f"{describe_error(exc)} (the audit needs every node's data readable: repair that"
            " node, or audit a copy of --data without its directory)"
        )
    if snap is None:
        yield data
        return
    try:
        yield str(snap)
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def _positions(t: AuditTables) -> tuple[ReplicaPosition, ...]:
    from pyspark.sql import functions as F

    from raftstream.audit.report import ReplicaPosition

    s = t.streams.where(F.col("last_seq").isNotNull()).collect()
    return tuple(
        ReplicaPosition(
            stream=f"{r['account']}/{r['stream']}" if r["account"] else str(r["stream"]),
            node=str(r["node"]),
            first_seq=int(r["first_seq"] or 0),
            last_seq=int(r["last_seq"] or 0),
            commit=int(r["commit"] or 0),
        )
        for r in s
    )


@click.group()
def audit() -> None:
    """Offline consistency audits of node data directories (Spark)."""


_copy_option = click.option(
    "--copy/--no-copy",
    default=True,
    show_default=True,
    help="Read a consistent copy of --data (--no-copy: read it in place; nodes stopped).",
)
_rows_option = click.option(
    "--rows-per-partition",
    type=click.IntRange(min=1),
    default=DEFAULT_ROWS_PER_PARTITION,
    show_default=True,
    help="Split a stream's messages (a group's entries) into partitions of this many.",
)


@audit.command()
@click.option("--data", type=click.Path(file_okay=False), help="Data root: one dir per node.")
@click.option("--parquet", type=click.Path(file_okay=False), help="Read an export instead.")
@click.option("--history", type=click.Path(dir_okay=False, exists=True), help="Client history.")
@click.option("--master", help="Spark master (default local[2]; ignored under spark-submit).")
@click.option("--remote", help="Spark Connect URL, sc://HOST:PORT.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Write a JSON report.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), help="Write an HTML report.")
@_copy_option
@_rows_option
def run(
    data: str | None,
    parquet: str | None,
    history: str | None,
    master: str | None,
    remote: str | None,
    json_out: str | None,
    html_out: str | None,
    copy: bool,
    rows_per_partition: int,
) -> None:
    """Audit node data (--data) or an export (--parquet); exit 1 on any failure."""
    from pyspark import SparkContext

    from raftstream.audit.checks import run_checks
    from raftstream.audit.report import AuditReport, exit_code, print_summary, to_html, to_json
    from raftstream.audit.session import load_tables, spark_session

    if (data is None) == (parquet is None):
        raise click.UsageError("give exactly one of --data and --parquet")
    if master is not None and remote is not None:
        raise click.UsageError("--master and --remote exclude each other")
    started = time.monotonic()
    # The data first (checked, copied), then Spark: a node's unreadable data ends the command
    # in one line, without a Spark start.
    with _readable(data, copy) if data is not None else _nothing() as root:
        owned = SparkContext._active_spark_context is None
        spark = spark_session(master=master, remote=remote)
        try:
            t = load_tables(
                spark,
                data=root if data is not None else None,
                parquet=parquet,
                history=history,
                rows_per_partition=rows_per_partition,
            )
            results = tuple(run_checks(t))
            report = AuditReport(
                source=data or str(parquet),
                results=results,
                positions=_positions(t),
                rows={"messages": t.messages.count(), "raft_log": t.raft_log.count()},
                seconds=time.monotonic() - started,
            )
        finally:
            if owned:
                spark.stop()
    print_summary(report)
    if json_out:
        Path(json_out).write_text(to_json(report))
    if html_out:
        Path(html_out).write_text(to_html(report))
    raise SystemExit(exit_code(report))


@contextmanager
def _nothing() -> Iterator[str]:
    yield ""


@audit.command()
@click.option("--data", required=True, type=click.Path(file_okay=False, exists=True))
@click.option("--out", required=True, type=click.Path(file_okay=False))
@_copy_option
@_rows_option
def export(data: str, out: str, copy: bool, rows_per_partition: int) -> None:
    """Write the audit tables of --data as Parquet under --out."""
    from raftstream.audit.export import export as export_tables

    with _readable(data, copy) as root:
        summary = export_tables(root, out, rows_per_partition=rows_per_partition)
    rows = ", ".join(f"{k} {v}" for k, v in summary.rows.items())
    click.echo(f"wrote {summary.files} files under {out}: {rows}")
