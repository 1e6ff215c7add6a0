"""``raftstream kv ...``: key-value buckets (the SDK's ``raftstream.kv``).

A bucket ``B`` is the stream ``KV_B``; ``kv ls`` lists buckets (streams made as buckets
only; or, given one, its keys); ``kv put --last REV`` is a compare-and-set; ``kv watch``
prints the latest value of each key, then every change as it happens (Ctrl-C or ``--count``
stops). ``--json`` gives durations in nanoseconds, as the rest of the command line does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from raftstream._args import INT64_MAX
from raftstream.cli.common import (
    DURATION,
    NS_PER_S,
    SIZE,
    UNKNOWN_STATE,
    Conn,
    confirm_or_refuse,
    connection_options,
    echo_json,
    echo_raw,
    fmt_bytes,
    fmt_duration_ns,
    fmt_time_ns,
    json_option,
    jsonable,
    message_data,
    print_fields,
    print_table,
    run,
)
from raftstream.kv import HISTORY_MAX, REPLICAS_MAX, bucket_statuses

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.kv import KeyValueEntry, KeyValueStatus
    from raftstream.models import GroupInfo

__all__ = ["kv"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def kv() -> None:
    """Key-value buckets: add, put, create, update, get, del, purge, ls, watch, history,
    info, rm.

    \b
    Example:
      raftstream kv add CONFIG --history 5 --replicas 3
      raftstream kv put CONFIG app.color blue
    """


def _status_fields(s: KeyValueStatus) -> list[tuple[str, Any]]:
    """A bucket's settings, state and replicas' health as (name, value) pairs for humans."""
    pairs: list[tuple[str, Any]] = [
        ("Bucket", s.bucket),
        ("Description", s.description or "-"),
        ("Stream", s.stream_info.config.name),
        ("Values stored", s.values),
        ("History per key", s.history),
        ("TTL", fmt_duration_ns(s.ttl_ns) if s.ttl_ns else "forever"),
        ("Max value size", fmt_bytes(s.max_value_size)),
        ("Max bytes", fmt_bytes(s.max_bytes)),
        ("Storage", s.storage.value),
        ("Bytes", fmt_bytes(s.bytes)),
        ("Replicas", s.replicas),
    ]
    if s.mirror is not None:
        pairs.insert(3, ("Mirror of", s.mirror))
    if s.sources:
        pairs.insert(3, ("Sources", ", ".join(s.sources)))
    if not s.state_known:
        pairs = [p for p in pairs if p[0] not in ("Values stored", "Bytes")]
        pairs.append(("State", UNKNOWN_STATE))
    return pairs + _health_fields(s.stream_info.cluster, s.replicas)


def _health_fields(cluster: GroupInfo | None, replicas: int) -> list[tuple[str, Any]]:
    """The leader and each other replica's state, as ``stream info`` shows them."""
    if cluster is None:
        return []
    pairs: list[tuple[str, Any]] = [("Leader", cluster.leader or "none")]
    for r in cluster.replicas:
        state = "offline" if r.offline else ("current" if r.current else "catching up")
        pairs.append((f"Replica {r.name}", f"{state}, lag {r.lag}"))
    placed = len(cluster.replicas) + (1 if cluster.leader else 0)
    if cluster.leader and placed < replicas:
        pairs.append(("Under-replicated", f"{placed} of {replicas} replicas placed"))
    return pairs


def _show_status(s: KeyValueStatus, as_json: bool) -> None:
    """A bucket's state as JSON or fields."""
    if as_json:
        echo_json(_status_json(s))
    else:
        print_fields(f"Bucket {s.bucket}", _status_fields(s))


def _status_json(s: KeyValueStatus) -> dict[str, Any]:
    """A bucket's state as JSON data: ``ttl`` in nanoseconds (0: forever) and sizes in
    bytes (-1: unlimited), as in the stream's JSON; ``cluster`` as ``stream info --json``
    gives it (leader, replicas with current/offline/lag), null on a single node; ``mirror``
    the bucket it mirrors (null: none), ``sources`` the buckets it takes keys from; ``values``
    and ``bytes`` null, ``state_known`` false, when no replica answered."""
    return {
        "bucket": s.bucket,
        "description": s.description,
        "values": s.values if s.state_known else None,
        "history": s.history,
        "ttl": s.ttl_ns,
        "max_value_size": s.max_value_size,
        "max_bytes": s.max_bytes,
        "storage": s.storage.value,
        "bytes": s.bytes if s.state_known else None,
        "state_known": s.state_known,
        "replicas": s.replicas,
        "mirror": s.mirror,
        "sources": list(s.sources),
        "stream": s.stream_info.config.name,
        "cluster": jsonable(s.stream_info.cluster),
    }


@kv.command("add")
@click.argument("bucket")
@click.option("--history", type=click.IntRange(1, HISTORY_MAX), default=1, show_default=True,
              help=f"Revisions kept per key (1-{HISTORY_MAX}).")  # fmt: skip
@click.option("--ttl", type=DURATION, help="How long a value lives (1h; default forever).")
@click.option("--max-value-size", type=SIZE, default="-1", help="Largest value (1K; -1 any).")
@click.option("--max-bytes", type=SIZE, default="-1", help="Bucket size limit (-1 none).")
@click.option("--storage", type=click.Choice(["file", "memory"]), default="file",
              show_default=True, help="Keep values on disk (file) or in memory.")  # fmt: skip
@click.option("--replicas", type=click.IntRange(1, REPLICAS_MAX), default=1, show_default=True,
              help=f"Copies of the bucket on different nodes (1-{REPLICAS_MAX}).")  # fmt: skip
@click.option("--description", default="", help="Free text describing the bucket.")
@click.option("--mirror", metavar="BUCKET",
              help="A read-only copy of BUCKET (writes go to BUCKET).")  # fmt: skip
@click.option("--source", "sources", metavar="BUCKET", multiple=True,
              help="Also take BUCKET's keys (repeat for more).")  # fmt: skip
@json_option
@connection_options
def add_cmd(
    conn: Conn,
    bucket: str,
    history: int,
    ttl: int | None,
    max_value_size: int,
    max_bytes: int,
    storage: str,
    replicas: int,
    description: str,
    mirror: str | None,
    sources: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create a bucket.

    With --mirror, the bucket is a read-only copy of another one in this cluster: reads and
    watches see its keys and revisions shortly after they are written, and writes through
    it go to that bucket. With --source (repeatable), it takes the keys of other buckets
    besides its own.

    \b
    Examples:
      raftstream kv add CONFIG --history 5 --ttl 24h --replicas 3
      raftstream kv add CONFIG_COPY --history 5 --mirror CONFIG
      raftstream kv add ALL --source CONFIG --source PRICES
    """

    async def body(c: Client) -> KeyValueStatus:
        bucket_kv = await c.create_key_value(
            bucket,
            description=description,
            history=history,
            ttl=ttl / NS_PER_S if ttl else None,
            max_value_size=max_value_size,
            max_bytes=max_bytes,
            storage=storage,
            replicas=replicas,
            mirror=mirror,
            sources=sources,
        )
        return await bucket_kv.status()

    _show_status(run(conn, body), as_json)


@kv.command("edit")
@click.argument("bucket")
@click.option("--history", type=click.IntRange(1, HISTORY_MAX),
              help=f"Revisions per key (1-{HISTORY_MAX}); fewer drops older ones.")  # fmt: skip
@click.option("--ttl", type=DURATION, help="How long a value lives (1h; 0: forever).")
@click.option("--max-value-size", type=SIZE, help="Largest value (1K; -1 any).")
@click.option("--max-bytes", type=SIZE, help="Bucket size limit (-1 none).")
@click.option("--replicas", type=click.IntRange(1, REPLICAS_MAX),
              help=f"Copies of the bucket on different nodes (1-{REPLICAS_MAX}).")  # fmt: skip
@click.option("--description", help="Free text describing the bucket.")
@json_option
@connection_options
def edit_cmd(
    conn: Conn,
    bucket: str,
    history: int | None,
    ttl: int | None,
    max_value_size: int | None,
    max_bytes: int | None,
    replicas: int | None,
    description: str | None,
    as_json: bool,
) -> None:
    """Change a bucket's settings; the ones not given stay as they are.

    The storage cannot change. Lowering --history drops the older revisions of each key
    beyond it.

    \b
    Example:
      raftstream kv edit CONFIG --history 10 --ttl 0 --replicas 3
    """
    given = (history, ttl, max_value_size, max_bytes, replicas, description)
    if all(v is None for v in given):
        raise click.UsageError(
            "nothing to change: give at least one of --history, --ttl, --max-value-size, "
            "--max-bytes, --replicas, --description"
        )

    async def body(c: Client) -> KeyValueStatus:
        bucket_kv = await c.update_key_value(
            bucket,
            description=description,
            history=history,
            ttl=None if ttl is None else ttl / NS_PER_S,
            max_value_size=max_value_size,
            max_bytes=max_bytes,
            replicas=replicas,
        )
        return await bucket_kv.status()

    _show_status(run(conn, body), as_json)


@kv.command("info")
@click.argument("bucket")
@json_option
@connection_options
def info_cmd(conn: Conn, bucket: str, as_json: bool) -> None:
    """Show a bucket's state.

    \b
    Example:
      raftstream kv info CONFIG
    """

    async def body(c: Client) -> KeyValueStatus:
        return await (await c.key_value(bucket)).status()

    _show_status(run(conn, body), as_json)


@kv.command("put")
@click.argument("bucket")
@click.argument("key")
@click.argument("value", required=False)
@click.option(
    "--last",
    type=click.IntRange(0, INT64_MAX),
    help="Only if the key's last revision is this (0: the key must not exist).",
)
@json_option
@connection_options
def put_cmd(
    conn: Conn, bucket: str, key: str, value: str | None, last: int | None, as_json: bool
) -> None:
    """Set KEY to VALUE (text, stored in UTF-8) or to stdin's bytes, unchanged (binary
    data too); prints the new revision.

    \b
    Examples:
      raftstream kv put CONFIG app.color blue
      raftstream kv put CONFIG app.color green --last 1
      raftstream kv put CONFIG logo < logo.png
    """
    _put(conn, bucket, key, value, last, as_json)


def _put(
    conn: Conn, bucket: str, key: str, value: str | None, last: int | None, as_json: bool
) -> None:
    """``put`` (``last`` None), ``create`` (0) or ``update`` (the revision it must be at)."""
    data = message_data(value, "VALUE")

    async def body(c: Client) -> int:
        b = await c.key_value(bucket)
        if last is None:
            return await b.put(key, data)
        if last == 0:
            return await b.create(key, data)
        return await b.update(key, data, last)

    revision = run(conn, body)
    if as_json:
        echo_json({"bucket": bucket, "key": key, "revision": revision})
    else:
        click.echo(f"{bucket} > {key} revision {revision}")


@kv.command("create")
@click.argument("bucket")
@click.argument("key")
@click.argument("value", required=False)
@json_option
@connection_options
def create_cmd(conn: Conn, bucket: str, key: str, value: str | None, as_json: bool) -> None:
    """Set KEY to VALUE (or stdin's bytes) only if the key has no value (never set, or
    deleted). Refused with KEY_EXISTS when it has one.

    \b
    Example:
      raftstream kv create CONFIG app.owner alice
    """
    _put(conn, bucket, key, value, 0, as_json)


@kv.command("update")
@click.argument("bucket")
@click.argument("key")
@click.argument("value")
@click.argument("revision", type=click.IntRange(1, INT64_MAX))
@json_option
@connection_options
def update_cmd(conn: Conn, bucket: str, key: str, value: str, revision: int, as_json: bool) -> None:
    """Set KEY to VALUE only if its latest revision is REVISION (compare-and-set, as
    put --last REVISION). Refused with KEY_WRONG_LAST_SEQUENCE when another write came
    first. VALUE is text; for stdin's bytes: kv put BUCKET KEY --last REVISION.

    \b
    Example:
      raftstream kv update CONFIG app.color red 4
    """
    _put(conn, bucket, key, value, revision, as_json)


def _entry_json(e: KeyValueEntry) -> dict[str, Any]:
    """A key revision as JSON data: the value as ``stream get --json`` gives message data
    (text when it is UTF-8, else base64: ``jsonable``); its time in ``created_ns``, as every
    other time in the CLI's JSON (docs/cli.md "Output")."""
    return {
        "bucket": e.bucket,
        "key": e.key,
        "revision": e.revision,
        "operation": e.operation.value,
        "created_ns": e.created_ns,
        "value": jsonable(e.value),
    }


@kv.command("get")
@click.argument("bucket")
@click.argument("key")
@click.option("--revision", type=click.IntRange(1, INT64_MAX), help="This revision of the key.")
@click.option("--raw", is_flag=True,
              help="Write the value only, its bytes unchanged (no newline added).")  # fmt: skip
@json_option
@connection_options
def get_cmd(
    conn: Conn, bucket: str, key: str, revision: int | None, raw: bool, as_json: bool
) -> None:
    """Read a key's value (the latest, or --revision N). --raw writes the stored bytes
    unchanged; --json gives the value as text when it is UTF-8, else base64.

    \b
    Examples:
      raftstream kv get CONFIG app.color
      raftstream kv get CONFIG logo --raw > logo.png
    """

    async def body(c: Client) -> KeyValueEntry:
        return await (await c.key_value(bucket)).get(key, revision)

    entry = run(conn, body)
    if as_json:
        echo_json(_entry_json(entry))
    elif raw:
        echo_raw(entry.value)
    else:
        click.echo(f"{bucket} > {key} revision {entry.revision} created "
                   f"{fmt_time_ns(entry.created_ns)}\n")  # fmt: skip
        click.echo(entry.value.decode("utf-8", errors="replace"))


@kv.command("del")
@click.argument("bucket")
@click.argument("key")
@click.option("--purge", is_flag=True, help="Also remove the key's history.")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def del_cmd(conn: Conn, bucket: str, key: str, purge: bool, force: bool) -> None:
    """Delete a key (a delete marker; --purge drops its history too).

    \b
    Example:
      raftstream kv del CONFIG app.color -f
    """
    _delete(conn, bucket, key, purge, force)


def _delete(conn: Conn, bucket: str, key: str, purge: bool, force: bool) -> None:
    confirm_or_refuse(f"{'purge' if purge else 'delete'} key {key} of bucket {bucket}", force)

    async def body(c: Client) -> int:
        b = await c.key_value(bucket)
        return await (b.purge(key) if purge else b.delete(key))

    run(conn, body)
    click.echo(f"{'Purged' if purge else 'Deleted'} {bucket} > {key}")


@kv.command("purge")
@click.argument("bucket")
@click.argument("key")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def purge_cmd(conn: Conn, bucket: str, key: str, force: bool) -> None:
    """Remove a key's value and its whole history (as del --purge).

    \b
    Example:
      raftstream kv purge CONFIG app.color -f
    """
    _delete(conn, bucket, key, True, force)


@kv.command("rm")
@click.argument("bucket")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def rm_cmd(conn: Conn, bucket: str, force: bool) -> None:
    """Delete a bucket and every value in it.

    \b
    Example:
      raftstream kv rm CONFIG -f
    """
    confirm_or_refuse(f"delete bucket {bucket} and all its values", force)
    run(conn, lambda c: c.delete_key_value(bucket))
    click.echo(f"Deleted bucket {bucket}")


@kv.command("ls")
@click.argument("bucket", required=False)
@json_option
@connection_options
def ls_cmd(conn: Conn, bucket: str | None, as_json: bool) -> None:
    """List buckets (streams made as buckets), or the keys of BUCKET.

    \b
    Examples:
      raftstream kv ls
      raftstream kv ls CONFIG
    """
    if bucket is not None:

        async def keys(c: Client) -> list[str]:
            return await (await c.key_value(bucket)).keys(timeout=conn.timeout_s)

        names = run(conn, keys)
        if as_json:
            echo_json(names)
        for name in [] if as_json else names:
            click.echo(name)
        return
    statuses = run(conn, lambda c: bucket_statuses(c, timeout=conn.timeout_s))
    if as_json:
        echo_json([_status_json(s) for s in statuses])
        return
    if not statuses:
        click.echo("No buckets defined")
        return
    rows: list[tuple[Any, ...]] = [
        (s.bucket, s.values, s.history, fmt_bytes(s.bytes), s.replicas, "")
        if s.state_known
        else (s.bucket, "?", s.history, "?", s.replicas, "offline: no replica answered")
        for s in statuses
    ]
    headers = ["Bucket", "Values", "History", "Bytes", "Replicas", "State"]
    if all(s.state_known for s in statuses):  # the column only when it says something
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    print_table("Buckets", headers, rows)


def _entry_line(e: KeyValueEntry) -> str:
    """A key revision on one line (the value only for a PUT)."""
    value = e.value.decode("utf-8", errors="replace")
    shown = f": {value}" if e.operation.value == "PUT" else ""
    return f"[{fmt_time_ns(e.created_ns)}] {e.operation.value} {e.bucket} > {e.key} " \
           f"revision {e.revision}{shown}"  # fmt: skip


@kv.command("history")
@click.argument("bucket")
@click.argument("key")
@json_option
@connection_options
def history_cmd(conn: Conn, bucket: str, key: str, as_json: bool) -> None:
    """Every kept revision of a key, oldest first (delete markers included).

    \b
    Example:
      raftstream kv history CONFIG app.color
    """

    async def body(c: Client) -> list[KeyValueEntry]:
        return await (await c.key_value(bucket)).history(key, timeout=conn.timeout_s)

    entries = run(conn, body)
    if as_json:
        echo_json([_entry_json(e) for e in entries])
        return
    rows = [
        (e.revision, e.operation.value, fmt_time_ns(e.created_ns), e.value.decode(errors="replace"))
        for e in entries
    ]
    print_table(f"History of {bucket} > {key}", ["Revision", "Op", "Created", "Value"], rows)


async def _watch(
    c: Client, bucket: str, keys: str, *, count: int | None, history: bool, as_json: bool
) -> None:
    """Print the initial values then updates until ``count`` entries were shown."""
    b = await c.key_value(bucket)
    shown = 0
    async with await b.watch(keys, include_history=history) as watcher:
        while count is None or shown < count:
            entry = await watcher.updates(None)
            if entry is None:
                click.echo("(end of current values; watching for changes)", err=True)
                continue
            click.echo(json.dumps(_entry_json(entry)) if as_json else _entry_line(entry))
            shown += 1


@kv.command("watch")
@click.argument("bucket")
@click.argument("keys", default=">")
@click.option("--count", type=click.IntRange(min=1), help="Stop after N entries.")
@click.option("--history", is_flag=True, help="Start with every kept revision.")
@json_option
@connection_options
def watch_cmd(
    conn: Conn, bucket: str, keys: str, count: int | None, history: bool, as_json: bool
) -> None:
    """Print the latest value of each key matching KEYS (default: all), then every change.

    \b
    Examples:
      raftstream kv watch CONFIG
      raftstream kv watch CONFIG 'app.*' --count 10 --json
    """
    run(
        conn,
        lambda c: _watch(c, bucket, keys, count=count, history=history, as_json=as_json),
    )
