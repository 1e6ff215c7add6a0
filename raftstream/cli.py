"""The ``raftstream`` command line (click). ``main`` is the console-script entry point.

``raftstream`` is a click group; each command is a function registered on it, so later
commands (streams, consumers, publish, bench...) are added with ``@cli.command()``. The
node code (``raftstream.cluster``) is imported lazily inside ``server``: the SDK and the
other commands never load it.

``raftstream server`` runs one node (flags, or ``--config node.toml``, or both: flags win),
or with ``--local-cluster N`` starts N node processes on 127.0.0.1 for development, prints
how to reach them and stops them all on Ctrl-C.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from raftstream.audit.cli import audit
from raftstream.cli_auth import auth
from raftstream.cli_bench import bench
from raftstream.cli_cluster import cluster
from raftstream.cli_common import CLI_EPILOG, add_group_connection_options
from raftstream.cli_consumer import consumer
from raftstream.cli_kv import kv
from raftstream.cli_pub import pub, sub
from raftstream.cli_stream import stream
from raftstream.errors import DataLossError, InvalidArgumentError

__all__ = ["cli", "main"]

LOCAL_FIRST_PORT = 7101
LOCAL_METRICS_FIRST_PORT = 9101
LOCAL_STOP_WAIT_S = 10.0
LOCAL_NODES_MAX = 7

SERVER_HELP = """Run a raftstream node.

\b
Example (a 3-node cluster; run the same with n2 and n3 on their own addresses):
  raftstream server --name n1 --listen 127.0.0.1:7101 --data ./data/n1 \\
      --peers n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103 \\
      --metrics-listen 127.0.0.1:9101
\b
Or everything on this machine at once:
  raftstream server --local-cluster 3 --data ./data
"""


@click.group(name="raftstream", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """raftstream: a replicated stream store (JetStream's model, Raft over gRPC, LMDB)."""


@cli.command(help=SERVER_HELP)
@click.option("--name", help="This node's name (must appear in --peers).")
@click.option("--listen", help="host:port for the client API and the Raft service.")
@click.option("--data", type=click.Path(file_okay=False), help="Data directory.")
@click.option("--peers", help="Every node: n1=host:port,n2=host:port,...")
@click.option("--metrics-listen", help="host:port for Prometheus /metrics.")
@click.option("--cluster-name", help="The cluster's name (placement.cluster matches it).")
@click.option("--tags", help="This node's placement tags, comma-separated.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file.")
@click.option(
    "--local-cluster",
    type=click.IntRange(1, LOCAL_NODES_MAX),
    default=None,
    help="Start N local nodes on 127.0.0.1:7101.. (data under --data, ./data).",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
)
def server(
    name: str | None,
    listen: str | None,
    data: str | None,
    peers: str | None,
    metrics_listen: str | None,
    cluster_name: str | None,
    tags: str | None,
    config_path: str | None,
    local_cluster: int | None,
    log_level: str,
) -> None:
    if local_cluster is not None:
        _run_local_cluster(local_cluster, Path(data or "./data"), log_level)
        return
    # Imported here: the node is not part of the SDK (layering: the SDK never loads it).
    import asyncio
    import logging

    from raftstream.cluster.config import load_config
    from raftstream.cluster.node import configure_logging, run_node

    try:
        config = load_config(
            config_path,
            name=name,
            listen=listen,
            data=data,
            peers=peers,
            metrics_listen=metrics_listen,
            cluster_name=cluster_name,
            tags=tags,
        )
    except InvalidArgumentError as exc:
        click.echo(f"raftstream server: invalid configuration: {exc}", err=True)
        sys.exit(2)
    configure_logging(config.name, getattr(logging, log_level))
    try:
        asyncio.run(run_node(config))
    except DataLossError as exc:
        # Damaged stored data (e.g. a truncated LMDB file): refuse to serve, in one line.
        click.echo(f"raftstream server: refusing to start: DataLossError: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"raftstream server: {exc}", err=True)
        sys.exit(1)


def _local_peers(n: int) -> str:
    return ",".join(f"n{i + 1}=127.0.0.1:{LOCAL_FIRST_PORT + i}" for i in range(n))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _run_local_cluster(n: int, data: Path, log_level: str) -> None:
    """Start ``n`` node processes, print how to reach them, stop them on Ctrl-C."""
    peers = _local_peers(n)
    procs: list[subprocess.Popen[bytes]] = []
    # Ctrl-C and SIGTERM both stop every node (set explicitly: a shell may start a
    # background job with SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for i in range(n):
            args = [
                sys.executable, "-m", "raftstream.cluster",
                "--name", f"n{i + 1}",
                "--listen", f"127.0.0.1:{LOCAL_FIRST_PORT + i}",
                "--data", str(data / f"n{i + 1}"),
                "--peers", peers,
                "--metrics-listen", f"127.0.0.1:{LOCAL_METRICS_FIRST_PORT + i}",
                "--log-level", log_level,
            ]  # fmt: skip
            procs.append(subprocess.Popen(args))
        _print_local_banner(n, data)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        click.echo("raftstream: a node exited; stopping the others", err=True)
    except KeyboardInterrupt:
        click.echo("\nraftstream: stopping the local cluster...", err=True)
    finally:
        _stop_all(procs)


def _print_local_banner(n: int, data: Path) -> None:
    servers = [f"127.0.0.1:{LOCAL_FIRST_PORT + i}" for i in range(n)]
    click.echo(f"raftstream: local cluster of {n} nodes, data under {data}")
    for i, s in enumerate(servers):
        click.echo(
            f"  n{i + 1}  {s}  metrics http://127.0.0.1:{LOCAL_METRICS_FIRST_PORT + i}/metrics"
        )
    click.echo("\nConnect with the SDK:\n")
    click.echo("    import asyncio, raftstream")
    click.echo("    async def main():")
    click.echo(f"        js = await raftstream.connect(servers={servers!r})")
    click.echo(
        '        await js.add_stream(raftstream.StreamConfig(name="ORDERS", '
        'subjects=["orders.>"], num_replicas=3))'
    )
    click.echo('        print(await js.publish("orders.1", b"hello"))')
    click.echo("        await js.close()")
    click.echo("    asyncio.run(main())\n")
    click.echo("Ctrl-C stops every node.")


def _stop_all(procs: Sequence[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + LOCAL_STOP_WAIT_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# The client commands (raftstream/cli_*.py): SDK only, the node is never imported by them.
for _command in (cluster, stream, consumer, pub, sub, kv, bench):
    cli.add_command(_command)
# Offline audits of node data dirs; Spark is imported only when an audit runs.
cli.add_command(audit)
# Helpers for the node's [auth] section (bcrypt hashes); they talk to no node.
cli.add_command(auth)
cli.epilog = CLI_EPILOG
add_group_connection_options(cli)


def main(argv: Sequence[str] | None = None) -> None:
    """The console-script entry point (``raftstream = "raftstream.cli:main"``)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="raftstream")
