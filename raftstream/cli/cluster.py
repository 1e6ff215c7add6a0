"""``raftstream cluster ...``: info, step-down, balance, peer-remove, peer-add."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from raftstream.cli.common import (
    NS_PER_S,
    Conn,
    confirm_or_refuse,
    connection_options,
    echo_json,
    fail,
    fmt_bytes,
    json_option,
    print_fields,
    print_table,
    run,
)
from raftstream.errors import RaftStreamError

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.models import ClusterGroup, ClusterInfo, GroupInfo

__all__ = ["BalancePlan", "Move", "cluster", "plan_balance"]

# Fewer meta voters than this tolerate no failed one: a forget that leaves fewer warns.
META_VOTERS_SAFE = 3


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cluster() -> None:
    """Inspect and operate the cluster: info, step-down, balance, peer-remove, peer-add.

    \b
    Example:
      raftstream cluster info -s 127.0.0.1:7101,127.0.0.1:7102
    """


def _replicas(group: GroupInfo) -> str:
    """A group's followers, each with its state (offline, current or its lag)."""
    parts = []
    for r in group.replicas:
        state = "offline" if r.offline else ("current" if r.current else f"lag {r.lag}")
        parts.append(f"{r.name}({state})")
    return ", ".join(parts) or "-"


def _show_cluster(info: ClusterInfo) -> None:
    """The cluster as fields (name, meta leader) and two tables: nodes, groups."""
    print_fields(
        f"Cluster {info.name or '-'}",
        [("Meta leader", info.meta_leader or "none"), ("Answered by", info.answered_by)],
    )
    nodes = [
        (
            n.name + (" *" if n.name == info.meta_leader else ""),
            n.addr,
            "yes" if n.online else "NO",
            "removed" if n.removed else "voter" if n.voter else "learner",
            f"{n.last_seen_ns / NS_PER_S:.1f}s ago" if n.last_seen_ns else "now",
            ",".join(n.tags) or "-",
            fmt_bytes(n.free_bytes) if n.described else "?",
        )
        for n in info.nodes
    ]
    headers = ["Name", "Address", "Online", "Role", "Seen", "Tags", "Free"]
    print_table("Nodes (* meta leader)", headers, nodes)
    labels = group_labels(info)
    groups = [
        (
            labels[i],
            g.group.leader or "NONE",
            g.group.term,
            g.group.commit_index,
            _replicas(g.group),
        )
        for i, g in enumerate(info.groups)
    ]
    print_table("Groups", ["Group", "Leader", "Term", "Commit", "Followers"], groups)


def group_labels(info: ClusterInfo) -> list[str]:
    """Each group's name for humans: ``meta``, or ``stream NAME``; ``stream ACCOUNT/NAME``
    when the groups listed span several accounts (a ``$SYS`` user sees every account's,
    and two accounts may each have an ORDERS)."""
    accounts = {g.account for g in info.groups if g.stream is not None}
    return [
        "meta"
        if g.stream is None
        else f"stream {g.account}/{g.stream}"
        if len(accounts) > 1
        else f"stream {g.stream}"
        for g in info.groups
    ]


@cluster.command("info")
@json_option
@connection_options
def info_cmd(conn: Conn, as_json: bool) -> None:
    """Show the nodes, the meta leader and every group's leader and followers.

    Each node's placement tags and free space are as it last described itself to the
    answering node ("?" under Free: not heard from yet).

    \b
    Example:
      raftstream cluster info --json
    """
    info = run(conn, lambda c: c.cluster_info())
    if as_json:
        echo_json(info)
    else:
        _show_cluster(info)


@cluster.command("step-down")
@click.option("--stream", help="Move this stream's leadership instead of the meta leader's.")
@click.option(
    "--consumer",
    help="With --stream: ask through this consumer. Consumers are led with their stream, "
    "so the whole stream's leadership moves (publishes and every consumer).",
)
@click.option("--preferred", help="The node that should lead next.")
@connection_options
def step_down_cmd(
    conn: Conn, stream: str | None, consumer: str | None, preferred: str | None
) -> None:
    """Ask a leader (the meta group's, or a stream's) to step down.

    Consumers replicate through their stream's Raft group and are led by the stream's
    leader, so --consumer moves the leadership of the whole stream: its publishes and
    every one of its consumers, not that consumer alone (unlike JetStream).

    \b
    Examples:
      raftstream cluster step-down
      raftstream cluster step-down --stream ORDERS --preferred n2
      raftstream cluster step-down --stream ORDERS --consumer proc   # moves ORDERS
    """
    if consumer and not stream:
        raise click.UsageError("--consumer needs --stream")

    async def body(c: Client) -> str | None:
        if stream and consumer:
            return await c.consumer_leader_stepdown(stream, consumer, preferred=preferred)
        if stream:
            return await c.stream_leader_stepdown(stream, preferred=preferred)
        return await c.meta_leader_stepdown(preferred=preferred)

    click.echo(step_down_message(stream, consumer, run(conn, body)))


def step_down_message(stream: str | None, consumer: str | None, leader: str | None) -> str:
    """What ``cluster step-down`` prints once leadership moved to ``leader`` (None: not
    known yet). A consumer step-down says that its stream's leadership moved."""
    new = f"new leader: {leader or 'not known yet'}"
    if stream and consumer:
        return (
            f"consumer {stream}/{consumer}: its stream {stream}'s leader stepped down "
            f"(consumers are led with their stream); {new}"
        )
    return f"{'stream ' + stream if stream else 'meta'} leader stepped down; {new}"


@dataclass(frozen=True, slots=True)
class Move:
    """One planned leadership move: ``stream``'s leadership from node ``src`` to ``dst``."""

    stream: str
    src: str
    dst: str


@dataclass(frozen=True, slots=True)
class BalancePlan:
    """The moves, and the stream leaders per online node before and after them."""

    moves: list[Move]
    before: dict[str, int]
    after: dict[str, int]


def plan_balance(info: ClusterInfo, movable: Callable[[ClusterGroup], bool]) -> BalancePlan:
    """The moves that even out how many stream groups each online node leads. Every stream
    group with a leader counts toward its node's load; only ``movable`` ones are moved,
    each at most once, and only to a follower that is online and current. A move is
    planned while it takes a group from a node that leads at least two more than the
    follower it goes to (so each move makes the spread smaller, and the plan ends)."""
    counts = {n.name: 0 for n in info.nodes if n.online and not n.removed}
    led: dict[str, list[ClusterGroup]] = {name: [] for name in counts}
    for g in info.groups:
        leader = g.group.leader
        if g.stream is None or leader not in counts:
            continue
        counts[leader] += 1
        if movable(g):
            led[leader].append(g)
    before = dict(counts)
    moves: list[Move] = []
    while True:
        best: tuple[int, str, ClusterGroup, str] | None = None
        for src in counts:
            for g in led[src]:
                for r in g.group.replicas:
                    ok = r.name in counts and r.current and not r.offline
                    gain = counts[src] - counts.get(r.name, 0)
                    if ok and gain >= 2 and (best is None or gain > best[0]):
                        best = (gain, src, g, r.name)
        if best is None:
            return BalancePlan(moves, before, counts)
        _, src, g, dst = best
        assert g.stream is not None  # only stream groups are in ``led``
        moves.append(Move(g.stream, src, dst))
        led[src].remove(g)
        counts[src] -= 1
        counts[dst] += 1


@cluster.command("balance")
@click.option("--dry-run", is_flag=True, help="Print the moves; move nothing.")
@json_option
@connection_options
def balance_cmd(conn: Conn, dry_run: bool, as_json: bool) -> None:
    """Even out stream leaderships across the online nodes.

    After a rolling restart the nodes that stayed up lead every stream (a restarted node
    comes back as a follower). This moves leaderships, one stream at a time, from nodes
    that lead more to followers that lead fewer (online and current only), as `step-down
    --stream S --preferred N` would; consumers move with their stream. Each move is a
    planned hand-over: publishes and fetches in flight are answered or retried by the
    clients. Only the streams of your own account are moved; with several accounts, run it
    as a user of each.

    \b
    Examples:
      raftstream cluster balance --dry-run
      raftstream cluster balance
    """

    async def body(c: Client) -> tuple[BalancePlan, list[str]] | None:
        info = await c.cluster_info()
        own = set(await c.stream_names())
        streams = [g for g in info.groups if g.stream is not None]
        if len({g.account for g in streams}) > 1 or (
            streams and not any(g.stream in own for g in streams)
        ):  # a $SYS user: it sees other accounts' groups and can move none of them
            return None
        plan = plan_balance(info, lambda g: g.stream in own)
        results = []
        for m in [] if dry_run else plan.moves:
            try:
                leader = await c.stream_leader_stepdown(m.stream, preferred=m.dst)
            except RaftStreamError as exc:
                results.append(f"failed: {exc}")
                continue
            results.append("moved" if leader == m.dst else f"now led by {leader or 'unknown'}")
        return plan, results

    outcome = run(conn, body)
    if outcome is None:
        fail(
            "cluster balance moves the streams of its user's own account, and this user sees "
            "other accounts' streams (a $SYS user): run it as a user of each account"
        )
    plan, results = outcome
    moves, before, after = plan.moves, plan.before, plan.after
    if as_json:
        echo_json(
            {
                "moves": [
                    {"stream": m.stream, "from": m.src, "to": m.dst, "result": r}
                    for m, r in zip(moves, results or ["planned"] * len(moves), strict=True)
                ],
                "leaders_before": before,
                "leaders_planned": after,
            }
        )
    elif not moves:
        spread = ", ".join(f"{n} {k}" for n, k in sorted(before.items()))
        click.echo(f"Balanced: stream leaders per node: {spread or 'no online node'}")
    else:
        rows = [
            (m.stream, m.src, m.dst, r)
            for m, r in zip(moves, results or ["planned (--dry-run)"] * len(moves), strict=True)
        ]
        print_table("Leadership moves", ["Stream", "From", "To", "Result"], rows)
        counts = [(n, before[n], after[n]) for n in sorted(before)]
        print_table("Stream leaders per node", ["Node", "Before", "Planned"], counts)
    if any(r.startswith("failed") for r in results):
        fail("some moves failed (above); run it again once the cluster is healthy")


@cluster.command("peer-remove")
@click.argument("name")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@click.option("--online", "allow_online", is_flag=True,
              help="Remove the node even though it is online.")  # fmt: skip
@click.option(
    "--forget",
    is_flag=True,
    help="Also take it out of the cluster for good (once its replicas moved).",
)
@connection_options
def peer_remove_cmd(conn: Conn, name: str, force: bool, allow_online: bool, forget: bool) -> None:
    """Remove a dead node from the cluster; its replicas are placed elsewhere.

    A node the cluster sees online is refused unless --online is given: removing a live
    node by mistake takes a copy of each of its streams away at once. Bring a removed node
    back with peer-add.

    With --forget, the node also leaves the cluster for good, once no stream has a replica
    on it (until then the command says what is left: run it again): it leaves the meta
    group, whose quorum then no longer counts it, and every node's list. Do not start it
    again; to bring the machine back, wipe its data and add it anew (peer-add --address).
    A meta group left with fewer than three voters is warned of: it then tolerates no
    failed node until one is added.

    \b
    Examples:
      raftstream cluster peer-remove n3 -f
      raftstream cluster peer-remove n3 --forget -f
    """

    # One connection, one event loop: grpc.aio cannot outlive a loop (a second
    # ``asyncio.run`` in the process printed "Event loop is closed" from gRPC's poller).
    voters: list[int] = []  # the meta group's voters after a forget

    async def remove(c: Client) -> bool:
        what = "remove node {} from the cluster" + (" and forget it" if forget else "")
        confirm_or_refuse(what.format(name), force)
        # The meta leader checks the caller's permission first, then that the node is dead.
        done = await c.remove_peer(name, refuse_online=not allow_online, forget=forget)
        if forget:
            with contextlib.suppress(RaftStreamError):  # only for the warning below
                info = await c.cluster_info()
                voters.append(sum(1 for n in info.nodes if n.voter))
        return done

    done = run(conn, remove)
    if forget:
        click.echo(f"Forgot node {name}" if done else f"Node {name} was forgotten already")
        if voters and voters[0] < META_VOTERS_SAFE:
            click.echo(
                f"Warning: the meta group has {voters[0]} voter{'s' if voters[0] != 1 else ''}"
                " now: it keeps working only while all of them do; add a node"
                " (peer-add NAME --address HOST:PORT) to tolerate a failure again",
                err=True,
            )
    elif done:
        click.echo(f"Removed peer {name}")
    else:
        click.echo(f"Peer {name} was removed already; nothing to do")


@cluster.command("peer-add")
@click.argument("name")
@click.option(
    "--address",
    metavar="HOST:PORT",
    help="Add NAME as a new node serving on HOST:PORT (without it: readmit a removed node).",
)
@connection_options
def peer_add_cmd(conn: Conn, name: str, address: str | None) -> None:
    """Readmit a node that peer-remove took out, or add a new node (--address).

    Readmitted, replicas may be placed on it again; streams left short of their replica
    count get a replica on it once it is online. A node that kept its data directory just
    restarts. A node whose data was lost (or a new machine under its name) starts empty
    with `raftstream server --join`: it rejoins every group as a new member.

    With --address, NAME is a new node: every node learns where it serves. It joins once
    running empty with `raftstream server --join` (its peers: itself and at least one
    running node): the meta group takes it in, and streams may be placed on it once it is
    online. With [auth] and without [tls], start it first: it is added only once it proves
    it is node NAME of this cluster at that address (docs/operations.md).

    \b
    Examples:
      raftstream cluster peer-add n3
      raftstream cluster peer-add n4 --address 10.0.0.4:7101
    """
    done = run(conn, lambda c: c.add_peer(name, address=address))
    if address:
        if done:
            click.echo(
                f"Added node {name} ({address}); it joins once running with"
                " `raftstream server --join`"
            )
        else:
            click.echo(f"Node {name} is in the cluster already at {address}; nothing to do")
    elif done:
        click.echo(f"Readmitted peer {name}")
    else:
        click.echo(f"Peer {name} was not removed; nothing to do")
