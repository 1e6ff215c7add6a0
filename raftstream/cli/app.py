"""The ``raftstream`` command line (click): the ``raftstream`` group and its commands.
``raftstream.cli.main`` is the console-script entry point; it calls ``run``.

``raftstream`` is a click group; each command is a function registered on it, so later
commands (streams, consumers, publish, bench...) are added with ``@cli.command()``. The
node code (``raftstream.cluster``) is imported lazily, when ``server`` runs one node
(``_serve_one_node``): the SDK and the other commands never load it.

``raftstream server`` runs one node (flags, or ``--config node.toml``, or both: flags win),
or with ``--local-cluster N`` starts N node processes on this machine for development, prints
how to reach them and stops them all on Ctrl-C (``--tls``: with throw-away certificates
made under ``<data>/certs``). ``raftstream certs`` makes such certificates (docs/tls.md).
The processes are started and stopped by ``raftstream.tooling.localcluster`` (the launcher the
benchmark, the tests and the chaos harness share); the ports (n1 on ``--listen``, default
127.0.0.1:7101, the others on the next ones; metrics 2000 above), the banner, the
certificates and Ctrl-C are this command's own.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from raftstream._args import PORT_MAX, check_address
from raftstream.audit.cli import audit
from raftstream.cli.auth import auth
from raftstream.cli.bench import bench
from raftstream.cli.cluster import cluster
from raftstream.cli.common import CLI_EPILOG, add_group_connection_options
from raftstream.cli.consumer import consumer
from raftstream.cli.kv import kv
from raftstream.cli.pub import pub, sub
from raftstream.cli.stream import stream
from raftstream.errors import DataLossError, InvalidArgumentError

if TYPE_CHECKING:
    from raftstream.tooling.certs import CertSet

__all__ = ["cli", "run"]

LOCAL_HOST = "127.0.0.1"
LOCAL_FIRST_PORT = 7101
# Each local node's metrics port is this far above its client port (7101 -> 9101).
LOCAL_METRICS_PORT_OFFSET = 2000
LOCAL_STOP_WAIT_S = 10.0
LOCAL_NODES_MAX = 7

SERVER_HELP = """Run a raftstream node.

\b
Example (a 3-node cluster; run the same with n2 and n3 on their own addresses):
  raftstream server --name n1 --listen 127.0.0.1:7101 --data ./data/n1 \\
      --peers n1=127.0.0.1:7101,n2=127.0.0.1:7102,n3=127.0.0.1:7103 \\
      --metrics-listen 127.0.0.1:9101
\b
Or everything on this machine at once (--tls: mutual TLS, certificates made under
./data/certs), n1 on 127.0.0.1:7101 and the others on the next ports (metrics on
9101..), or from another first address with --listen (n1 on 127.0.0.1:7201, n2 on 7202,
... metrics on 9201..); --name, --peers, --config, --join, --cluster-name, --tags and
--tls-ca/--tls-cert/--tls-key are for one node:
  raftstream server --local-cluster 3 --data ./data [--tls] [--listen 127.0.0.1:7201]
\b
A node whose data was lost (or a new machine under its name) comes back empty with --join:
it rejoins every group as a new member (docs/operations.md).
"""

CERTS_HELP = """Make a throw-away CA and certificates for local TLS (docs/tls.md).

\b
Writes ca.pem and ca-key.pem, node-<name>.pem and node-<name>-key.pem per node,
client-<name>.pem and client-<name>-key.pem per client (keys mode 0600). For development
only: the CA key lies beside the certificates and nothing can be revoked.
\b
Example:
  raftstream certs --dir ./certs --nodes n1,n2,n3
  raftstream server --name n1 ... --tls-ca certs/ca.pem \\
      --tls-cert certs/node-n1.pem --tls-key certs/node-n1-key.pem
"""


@click.group(name="raftstream", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """raftstream: a replicated stream store (JetStream's model, Raft over gRPC, LMDB)."""


@cli.command(help=SERVER_HELP)
@click.option("--name", help="This node's name (must appear in --peers).")
@click.option(
    "--listen",
    help="host:port for the client API and the Raft service (with --local-cluster: n1's; "
    "the other nodes take the next ports).",
)
@click.option("--data", type=click.Path(file_okay=False), help="Data directory.")
@click.option("--peers", help="Every node: n1=host:port,n2=host:port,...")
@click.option(
    "--metrics-listen",
    help="host:port for Prometheus /metrics (with --local-cluster: n1's, the others on the "
    "next ports; default 2000 above each node's --listen port).",
)
@click.option("--cluster-name", help="The cluster's name (placement.cluster matches it).")
@click.option("--tags", help="This node's placement tags, comma-separated.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML file.")
@click.option("--tls-ca", help="[tls] ca_file: PEM file of the cluster CA.")
@click.option("--tls-cert", help="[tls] cert_file: PEM file of this node's certificate.")
@click.option("--tls-key", help="[tls] key_file: PEM file of this node's private key.")
@click.option(
    "--tls",
    "local_tls",
    is_flag=True,
    help="With --local-cluster: mutual TLS, certificates made under <data>/certs.",
)
@click.option(
    "--local-cluster",
    type=click.IntRange(1, LOCAL_NODES_MAX),
    default=None,
    help="Start N local nodes, n1 on --listen (default 127.0.0.1:7101), the others on the "
    "next ports (data under --data, ./data); a node that fails is started again, the others "
    "serving on meanwhile.",
)
@click.option(
    "--join",
    is_flag=True,
    help="Join the running cluster as a new member when --data holds no Raft data (a lost"
    " disk, a replacement machine under this name): waits for its meta leader, and stops"
    " (exit 1) if every peer is empty too: start a new cluster without --join. Ignored once"
    " the node has data.",
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
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    local_tls: bool,
    local_cluster: int | None,
    join: bool,
    log_level: str,
) -> None:
    # A node a local launcher started dies with it (imported here: only a node needs it).
    from raftstream.tooling.localcluster import die_with_launcher

    die_with_launcher()
    if local_cluster is not None:
        _refuse_one_node_flags(
            {
                "--name": name,
                "--peers": peers,
                "--config": config_path,
                "--join": join,
                "--cluster-name": cluster_name,
                "--tags": tags,
                "--tls-ca": tls_ca,
                "--tls-cert": tls_cert,
                "--tls-key": tls_key,
            }
        )
        addrs, metrics = local_addresses(local_cluster, listen, metrics_listen)
        _run_local_cluster(
            Path(data or "./data"), addrs, metrics, log_level=log_level, tls=local_tls
        )
        return
    if local_tls:
        click.echo("raftstream server: --tls goes with --local-cluster", err=True)
        sys.exit(2)
    flags = {
        "name": name,
        "listen": listen,
        "data": data,
        "peers": peers,
        "metrics_listen": metrics_listen,
        "cluster_name": cluster_name,
        "tags": tags,
        "tls_ca_file": tls_ca,
        "tls_cert_file": tls_cert,
        "tls_key_file": tls_key,
    }
    _serve_one_node(config_path, flags, join=join, log_level=log_level)


def _refuse_one_node_flags(one_node: Mapping[str, object]) -> None:
    """``--local-cluster`` names and configures its nodes itself: a flag for one node given
    with it would be ignored, so it is a usage error (exit 2)."""
    for flag, given in one_node.items():
        if given:  # it was ignored: the local cluster names and configures its nodes
            hint = " (--tls makes the local cluster's certificates)" if "tls" in flag else ""
            raise click.UsageError(f"{flag} is for one node, not --local-cluster{hint}")


def _serve_one_node(
    config_path: str | None, flags: Mapping[str, str | None], *, join: bool, log_level: str
) -> None:
    """Run one node in this process until it stops: ``flags`` override the TOML file's
    keys (``load_config``). Exits 2 for a configuration the node refuses, 1 for a node
    that fails, stops on damaged data or cannot use its files or ports."""
    # Imported here: the node is not part of the SDK (layering: the SDK never loads it).
    import asyncio

    from raftstream.cluster.config import load_config
    from raftstream.cluster.node.node import NodeFailedError, configure_logging, run_node

    # What loading says (secret files readable by others) waits for the node's log format.
    said = _Keep()
    config_log = logging.getLogger("raftstream.cluster.config")
    config_log.addHandler(said)
    try:
        config = load_config(config_path, **flags)
    except InvalidArgumentError as exc:
        click.echo(f"raftstream server: invalid configuration: {exc}", err=True)
        sys.exit(2)
    finally:
        config_log.removeHandler(said)
    configure_logging(config.name, getattr(logging, log_level))
    for record in said.records:
        config_log.handle(record)
    try:
        asyncio.run(run_node(config, join=join))
    except InvalidArgumentError as exc:
        click.echo(f"raftstream server: {exc}", err=True)
        sys.exit(2)
    except NodeFailedError as exc:  # logged at CRITICAL with what to do
        click.echo(f"raftstream server: stopped: {exc}", err=True)
        sys.exit(1)
    except DataLossError as exc:
        # Damaged stored data (e.g. a truncated LMDB file): refuse to serve, in one line.
        click.echo(f"raftstream server: refusing to start: DataLossError: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"raftstream server: {exc}", err=True)
        sys.exit(1)


class _Keep(logging.Handler):
    """Keeps the records it is given (to be logged again once logging is set up)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def local_addresses(
    n: int, listen: str | None, metrics_listen: str | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The client and metrics addresses of the ``n`` local nodes, by name (n1, n2, ...): n1
    on ``listen`` (default 127.0.0.1:7101), the others on the next ports of its host;
    metrics likewise from ``metrics_listen``, by default 2000 above each client port on
    the same host. A malformed address, ports beyond 65535, or an address that would be
    both a node's and a metrics one, is a usage error naming the flag."""
    host, first = _first_port("--listen", listen or f"{LOCAL_HOST}:{LOCAL_FIRST_PORT}", n)
    if metrics_listen is None:
        metrics_host, metrics_first = host, first + LOCAL_METRICS_PORT_OFFSET
        if metrics_first + n - 1 > PORT_MAX:
            raise click.BadParameter(
                f"the metrics ports ({LOCAL_METRICS_PORT_OFFSET} above the nodes' ports) "
                f"would go beyond {PORT_MAX}: give --metrics-listen HOST:PORT too",
                param_hint="--listen",
            )
    else:
        metrics_host, metrics_first = _first_port("--metrics-listen", metrics_listen, n)
    names = [f"n{i + 1}" for i in range(n)]
    addrs = {name: f"{host}:{first + i}" for i, name in enumerate(names)}
    metrics = {name: f"{metrics_host}:{metrics_first + i}" for i, name in enumerate(names)}
    shared = sorted(set(addrs.values()) & set(metrics.values()))
    if shared:
        raise click.BadParameter(
            f"{shared[0]} would be both a node's address and a node's metrics address",
            param_hint="--metrics-listen",
        )
    return addrs, metrics


def _first_port(flag: str, addr: str, n: int) -> tuple[str, int]:
    """The host and port of ``addr`` (``HOST:PORT``, IPv6 in brackets), whose port and the
    ``n - 1`` after it are ports; else a usage error naming ``flag``."""
    try:
        check_address(flag, addr)
    except InvalidArgumentError as exc:
        raise click.BadParameter(exc.rule, param_hint=flag) from None
    host, _, port = addr.rpartition(":")
    if int(port) + n - 1 > PORT_MAX:
        raise click.BadParameter(
            f"{n} nodes from port {port} go beyond {PORT_MAX}", param_hint=flag
        )
    return host, int(port)


def _run_local_cluster(
    data: Path, addrs: Mapping[str, str], metrics: Mapping[str, str], *, log_level: str, tls: bool
) -> None:
    """Start a node process per entry of ``addrs`` (name -> client address; ``metrics``:
    name -> metrics address), print how to reach them, stop them on Ctrl-C. ``tls``: first
    make a new throw-away CA and certificates under ``data/certs``."""
    # Imported here: other commands need not load the launcher's health-check stubs.
    from raftstream.tooling.localcluster import Keeper, NodeLauncher

    names = list(addrs)
    host = addrs[names[0]].rpartition(":")[0].strip("[]")
    certs = _local_certs(names, host, data / "certs") if tls else None
    # The nodes' output goes to this terminal; the data directory is the user's to keep.
    # They die with this process, even a kill -9 of it (else they would hold the ports and
    # the data directories, and the next start would fail on them).
    nodes = NodeLauncher(
        data, addrs, logs=False, stop_timeout_s=LOCAL_STOP_WAIT_S, kill_on_parent_death=True
    )
    # Ctrl-C and SIGTERM both stop every node (set explicitly: a shell may start a
    # background job with SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        specs = {}
        for name in names:
            files = None
            if certs is not None:
                files = (certs.ca, certs.nodes[name].cert, certs.nodes[name].key)
            specs[name] = nodes.spec(
                name,
                metrics_listen=metrics[name],
                log_level=log_level,
                tls=files,
            )
            nodes.spawn(specs[name])
        _print_local_banner(data, addrs, metrics, certs, {m: nodes.pid(m) for m in names})
        # A node that fails is started again; the others serve on (localcluster.Keeper).
        keeper = Keeper(nodes, specs, say=lambda line: click.echo(f"raftstream: {line}", err=True))
        while keeper.check():
            time.sleep(0.5)
        click.echo("raftstream: no node left running", err=True)
        exit_code = 1 if keeper.failed else 0
    except KeyboardInterrupt:
        click.echo("\nraftstream: stopping the local cluster...", err=True)
        exit_code = 0
    finally:
        nodes.stop_all()
    sys.exit(exit_code)


def _local_certs(names: list[str], host: str, out: Path) -> CertSet:
    """A new CA, a certificate per local node and one client certificate (``client``), for
    127.0.0.1, localhost and ``host`` (the nodes' ``--listen`` host)."""
    from raftstream.tooling.certs import (  # cryptography: only when asked for
        DEFAULT_HOSTS,
        generate,
    )

    hosts = list(DEFAULT_HOSTS) + ([host] if host not in DEFAULT_HOSTS else [])
    try:
        return generate(out, nodes=names, hosts=hosts, overwrite=True)
    except InvalidArgumentError as exc:
        click.echo(f"raftstream server: cannot make certificates: {exc}", err=True)
        sys.exit(2)


def _print_local_banner(
    data: Path,
    addrs: Mapping[str, str],
    metrics: Mapping[str, str],
    certs: CertSet | None,
    pids: Mapping[str, int],
) -> None:
    servers = list(addrs.values())
    tls = "mutual TLS" if certs is not None else "plaintext"
    click.echo(f"raftstream: local cluster of {len(addrs)} nodes ({tls}), data under {data}")
    for name, addr in addrs.items():
        click.echo(f"  {name}  {addr}  pid {pids[name]}  metrics http://{metrics[name]}/metrics")
    click.echo(
        "A node that fails (try kill -9 on one) is started again with its data; the others "
        "serve on meanwhile."
    )
    tls_args = ""
    if certs is not None:
        client = certs.clients["client"]
        click.echo("\nThe CLI (or put these in $RAFTSTREAM_TLS_CA, _CERT, _KEY):\n")
        click.echo(
            f"    raftstream --tls-ca {certs.ca} --tls-cert {client.cert} "
            f"--tls-key {client.key} cluster info"
        )
        tls_args = (
            f", tls_ca={str(certs.ca)!r}, tls_cert={str(client.cert)!r}, "
            f"tls_key={str(client.key)!r}"
        )
    click.echo("\nConnect with the SDK:\n")
    click.echo("    import asyncio, raftstream")
    click.echo("    async def main():")
    click.echo(f"        js = await raftstream.connect(servers={servers!r}{tls_args})")
    click.echo(
        '        await js.add_stream(raftstream.StreamConfig(name="ORDERS", '
        'subjects=["orders.>"], num_replicas=3))'
    )
    click.echo('        print(await js.publish("orders.1", b"hello"))')
    click.echo("        await js.close()")
    click.echo("    asyncio.run(main())\n")
    click.echo("Ctrl-C stops every node.")


@cli.command(help=CERTS_HELP)
@click.option("--dir", "out_dir", default="./certs", show_default=True, help="Output directory.")
@click.option("--nodes", required=True, help="Node names, comma-separated (n1,n2,n3).")
@click.option("--clients", default="client", show_default=True, help="Client names.")
@click.option(
    "--hosts",
    default="127.0.0.1,localhost",
    show_default=True,
    help="Names and IP addresses the nodes are reached at (SANs of every certificate).",
)
@click.option("--days", default=7, show_default=True, type=int, help="Validity in days.")
@click.option("--force", is_flag=True, help="Replace existing files.")
def certs(out_dir: str, nodes: str, clients: str, hosts: str, days: int, force: bool) -> None:
    from raftstream.tooling.certs import generate  # cryptography: only when asked for

    def names(text: str) -> list[str]:
        return [v.strip() for v in text.split(",") if v.strip()]

    if not names(nodes):  # it made a CA and no node certificate, and said nothing
        raise click.BadParameter("at least one node name (n1,n2,n3)", param_hint="--nodes")
    try:
        made = generate(
            out_dir,
            nodes=names(nodes),
            clients=names(clients),
            hosts=names(hosts),
            validity_days=days,
            overwrite=force,
        )
    except InvalidArgumentError as exc:
        click.echo(f"raftstream certs: {exc}", err=True)
        sys.exit(2)
    click.echo(f"CA: {made.ca} (key {made.ca_key})")
    for label, pairs in (("node", made.nodes), ("client", made.clients)):
        for name, pair in pairs.items():
            click.echo(f"{label} {name}: {pair.cert} (key {pair.key})")
    click.echo(f"valid for {days} days; see docs/tls.md for the node and client flags")


# The client commands (raftstream/cli_*.py): SDK only, the node is never imported by them.
for _command in (cluster, stream, consumer, pub, sub, kv, bench):
    cli.add_command(_command)
# Offline audits of node data dirs; Spark is imported only when an audit runs.
cli.add_command(audit)
# Helpers for the node's [auth] section (bcrypt hashes); they talk to no node.
cli.add_command(auth)
cli.epilog = CLI_EPILOG
add_group_connection_options(cli)


def run(argv: Sequence[str] | None = None) -> None:
    """Run the command line on ``argv`` (``sys.argv`` when None); ``raftstream.cli.main``
    calls it once gRPC's settings are applied."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="raftstream")
