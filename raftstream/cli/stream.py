"""``raftstream stream ...``: add, edit, info, ls, rm, purge, get, rmm.

Every ``StreamConfig`` field has a flag with the nats CLI's name where it has one
(``--max-age 1h``, ``--dupe-window 2m``, ``--max-bytes 1GB``). Flags left out are not sent,
so ``stream edit`` changes only what it names and ``stream add --config FILE.json`` takes
the file's values unless a flag overrides them. The server validates; a refused value
comes back as ``INVALID_ARGUMENT: <field>: <rule>`` with exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from raftstream import errors
from raftstream._args import INT64_MAX
from raftstream.cli.common import (
    DURATION,
    SIZE,
    UNKNOWN_STATE,
    Conn,
    confirm_or_refuse,
    connection_options,
    describe_error,
    echo_json,
    fail,
    fmt_bytes,
    fmt_duration_ns,
    fmt_time_ns,
    json_option,
    print_fields,
    print_table,
    run,
    seq_runs,
    split_csv,
)
from raftstream.config import StreamConfig, StreamSource

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.models import RawStreamMsg, StreamInfo, StreamSourceInfo

__all__ = [
    "STREAM_FLAGS",
    "Flag",
    "config_flags",
    "given_flags",
    "key_values",
    "load_config_file",
    "stream",
]

R = TypeVar("R")
APPLY_POLL_S = 0.05
# JetStream's StreamMaxReplicas, which the server enforces; the flag refuses what its help
# says is out of range rather than sending it (the API's num_replicas 0 means 1: not a flag
# value).
REPLICAS_MAX = 5


@dataclass(frozen=True, slots=True)
class Flag:
    """One config flag: its option declaration, the config field it sets, and how."""

    decl: str
    field: str
    help: str
    type: Any = None
    is_bool: bool = False
    multiple: bool = False

    @property
    def param(self) -> str:
        """The Python name click gives the value (from the first long option)."""
        return self.decl.split("/")[0].removeprefix("--").replace("-", "_")

    @property
    def decls(self) -> list[str]:
        """click declarations: a boolean flag gets its ``--no-`` twin unless it names one."""
        if self.is_bool and "/" not in self.decl:
            return [f"{self.decl}/--no-{self.decl.removeprefix('--')}", self.param]
        return [self.decl, self.param]


STREAM_FLAGS: tuple[Flag, ...] = (
    Flag("--subjects", "subjects", "Subjects captured (repeatable or comma-separated).",
         multiple=True),
    Flag("--replicas", "num_replicas", "Number of replicas.", click.IntRange(1, REPLICAS_MAX)),
    Flag("--description", "description", "Free text description."),
    Flag("--retention", "retention", "Retention policy.",
         click.Choice(["limits", "interest", "workqueue"])),
    Flag("--storage", "storage", "Storage type.", click.Choice(["file", "memory"])),
    Flag("--discard", "discard", "When full, discard old messages or refuse new.",
         click.Choice(["old", "new"])),
    Flag("--discard-new-per-subject", "discard_new_per_subject",
         "With --discard new, apply the per-subject limit to new messages.", is_bool=True),
    Flag("--max-msgs", "max_msgs", "Messages kept at most (-1: unlimited).", int),
    Flag("--max-bytes", "max_bytes", "Bytes kept at most (1GB, 512M; -1: unlimited).", SIZE),
    Flag("--max-age", "max_age", "Oldest message kept (1h, 30s, 7d; 0: no limit).", DURATION),
    Flag("--max-msgs-per-subject", "max_msgs_per_subject",
         "Messages kept per subject (-1: unlimited).", int),
    Flag("--max-msg-size", "max_msg_size", "Largest message accepted (-1: unlimited).", SIZE),
    Flag("--max-consumers", "max_consumers", "Consumers allowed (-1: unlimited).", int),
    Flag("--dupe-window", "duplicate_window", "Window for msg-id deduplication (2m).", DURATION),
    Flag("--allow-rollup", "allow_rollup_hdrs", "Allow Nats-Rollup headers.", is_bool=True),
    Flag("--deny-delete", "deny_delete", "Refuse deleting single messages.", is_bool=True),
    Flag("--deny-purge", "deny_purge", "Refuse purges.", is_bool=True),
    Flag("--allow-direct", "allow_direct", "Allow direct gets from any replica.", is_bool=True),
    Flag("--allow-msg-ttl", "allow_msg_ttl", "Allow per-message TTLs.", is_bool=True),
    Flag("--sealed", "sealed", "Seal the stream (no more writes or deletes; edit only).",
         is_bool=True),
    Flag("--first-seq", "first_seq", "The first sequence of a new stream.",
         click.IntRange(0, INT64_MAX)),
    Flag("--metadata", "metadata", "Metadata KEY=VALUE (repeatable).", multiple=True),
    Flag("--transform-src", "transform_src", "Subject transform source (with --transform-dest)."),
    Flag("--transform-dest", "transform_dest", "Subject transform destination."),
    Flag("--placement-cluster", "placement_cluster", "Place the stream in this cluster."),
    Flag("--placement-tags", "placement_tags", "Place on nodes with these tags (comma-separated).",
         multiple=True),
    Flag("--mirror", "mirror", "Mirror this origin stream (read-only copy, same sequences; "
         "only when the stream is created)."),
    Flag("--mirror-external", "mirror_external",
         "The mirror's origin is in another cluster at host:port (repeatable or comma-separated).",
         multiple=True),
    Flag("--source", "source", "Copy messages from these origin streams (repeatable or "
         "comma-separated).", multiple=True),
)  # fmt: skip


def config_flags(flags: tuple[Flag, ...]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Add one click option per flag, each defaulting to None (not given)."""

    def decorate(f: Callable[..., R]) -> Callable[..., R]:
        for flag in reversed(flags):
            if flag.is_bool:
                f = click.option(*flag.decls, default=None, help=flag.help)(f)
            else:
                f = click.option(
                    *flag.decls, type=flag.type, multiple=flag.multiple, help=flag.help
                )(f)
        return f

    return decorate


def given_flags(flags: tuple[Flag, ...], values: dict[str, Any]) -> dict[str, Any]:
    """field -> value for the flags the user gave (multiple options: non-empty)."""
    out: dict[str, Any] = {}
    for flag in flags:
        value = values.get(flag.param)
        if value is None or (flag.multiple and not value):
            continue
        out[flag.field] = value
    return out


def stream_params(values: dict[str, Any]) -> dict[str, Any]:
    """StreamConfig keyword arguments from the given flags (composite fields assembled)."""
    given = given_flags(STREAM_FLAGS, values)
    if "subjects" in given:
        given["subjects"] = split_csv(given["subjects"], "--subjects")
    if "metadata" in given:
        given["metadata"] = key_values(given["metadata"], "--metadata")
    src, dest = given.pop("transform_src", None), given.pop("transform_dest", None)
    if src is not None or dest is not None:
        given["subject_transform"] = {"src": src or ">", "dest": dest or ""}
    cluster, tags = given.pop("placement_cluster", None), given.pop("placement_tags", None)
    if cluster is not None or tags is not None:
        given["placement"] = {"cluster": cluster, "tags": split_csv(tags or [], "--placement-tags")}
    mirror, external = given.pop("mirror", None), given.pop("mirror_external", None)
    if external is not None and mirror is None:
        raise click.UsageError("--mirror-external needs --mirror")
    if mirror == "":
        # Not a removal: promoting a mirror cannot be undone, so it takes its own flag
        # rather than an empty (maybe unset) shell variable.
        raise click.BadParameter(
            "the origin stream name is empty (to remove a mirror: stream edit NAME --no-mirror)",
            param_hint="--mirror",
        )
    if mirror is not None:
        given["mirror"] = {"name": mirror}
        if external is not None:
            given["mirror"]["external"] = {"api": split_csv(external, "--mirror-external")}
    if "source" in given:
        given["sources"] = [{"name": n} for n in split_csv(given.pop("source"), "--source")]
    return given


def key_values(items: tuple[str, ...], option: str) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict (a usage error names the bad one)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint=option)
        out[key] = value
    return out


def load_config_file(path: str | None, of: type[Any] | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (JetStream's config JSON), or {} without one. With
    ``of`` (a config dataclass), a key that is none of its fields is an error naming it:
    the SDK's ``from_dict`` skips unknown keys (a newer server's answers), which would drop
    a misspelt limit, or a JetStream field raftstream lacks (``no_ack``), without a word.
    A file that cannot be read, is no JSON object or has such a key is a usage error naming
    ``--config`` (exit 2), found before anything is sent."""
    if path is None:
        return {}
    try:
        raw = json.loads(Path(path).read_text())
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path!r}: {exc.strerror or exc}", param_hint="--config"
        ) from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise click.BadParameter(f"{path!r} is not JSON: {exc}", param_hint="--config") from None
    if not isinstance(raw, dict):
        raise click.BadParameter(f"{path!r}: expected a JSON object", param_hint="--config")
    if of is not None:
        unknown = sorted(set(raw) - {f.name for f in fields(of)})
        if unknown:
            raise click.BadParameter(
                f"{path!r}: {', '.join(map(repr, unknown))}: not "
                f"{'a field' if len(unknown) == 1 else 'fields'} of raftstream's "
                f"{of.__name__} (docs/cli.md)",
                param_hint="--config",
            )
    return raw


def _opt(n: int) -> str:
    """A count limit for humans: -1 is unlimited."""
    return "unlimited" if n < 0 else str(n)


def _info_fields(info: StreamInfo) -> list[tuple[str, Any]]:
    """A stream's config, state and replicas as (name, value) pairs for humans."""
    c, s = info.config, info.state
    pairs: list[tuple[str, Any]] = [
        ("Name", c.name),
        ("Description", c.description or "-"),
        ("Subjects", ", ".join(c.subjects) or "-"),
        ("Replicas", c.num_replicas),
        ("Storage", c.storage.value),
        ("Retention", c.retention.value),
        ("Discard", c.discard.value),
        ("Max messages", _opt(c.max_msgs)),
        ("Max bytes", fmt_bytes(c.max_bytes)),
        ("Max age", fmt_duration_ns(c.max_age) if c.max_age else "unlimited"),
        ("Max msgs per subject", _opt(c.max_msgs_per_subject)),
        ("Max message size", fmt_bytes(c.max_msg_size)),
        ("Duplicate window", fmt_duration_ns(c.duplicate_window)),
        ("Created", fmt_time_ns(info.created_ns)),
    ]
    if not info.state_known:
        pairs.append(("State", UNKNOWN_STATE))
    else:
        pairs += [
            ("Messages", s.messages),
            ("Bytes", fmt_bytes(s.bytes)),
            ("First sequence", s.first_seq),
            ("Last sequence", s.last_seq),
            ("Last message", fmt_time_ns(s.last_ts_ns)),
            ("Deleted", s.num_deleted),
            ("Subjects stored", s.num_subjects),
            ("Consumers", s.consumer_count),
        ]
    links = [("Mirror", info.mirror)] if info.mirror is not None else []
    links += [("Source", s) for s in info.sources]
    configured = [c.mirror] if c.mirror is not None else []
    configured += list(c.sources)
    for label, link in links:
        pairs.append((f"{label} {link.name}", _link_state(link)))
        how = next((_link_config(o) for o in configured if o.name == link.name), "")
        if how:
            pairs.append((f"{label} {link.name} copies", how))
    if info.cluster is not None:
        pairs.append(("Leader", info.cluster.leader or "none"))
        for r in info.cluster.replicas:
            state = "offline" if r.offline else ("current" if r.current else "catching up")
            pairs.append((f"Replica {r.name}", f"{state}, lag {r.lag}"))
        placed = len(info.cluster.replicas) + (1 if info.cluster.leader else 0)
        if info.cluster.leader and placed < info.config.num_replicas:
            # A removed peer whose replica found no node to move to, say.
            pairs.append(
                ("Under-replicated", f"{placed} of {info.config.num_replicas} replicas placed")
            )
    return pairs


def _subjects_cell(c: StreamConfig) -> str:
    """``stream ls``'s subjects column: a mirror has none of its own, so it says whose."""
    cell = ",".join(c.subjects)
    if c.mirror is not None:
        cell = f"(mirror of {c.mirror.name})"
    if c.sources:
        cell = f"{cell} (sources {','.join(o.name for o in c.sources)})".strip()
    return cell


def _link_config(origin: StreamSource) -> str:
    """What a mirror/source copies, when it is not simply everything ("" then)."""
    parts = []
    if origin.filter_subject:
        parts.append(f"only {origin.filter_subject}")
    parts += [f"{t.src} as {t.dest}" for t in origin.subject_transforms]
    if origin.opt_start_seq:
        parts.append(f"from origin seq {origin.opt_start_seq}")
    if origin.opt_start_time:
        parts.append(f"from {fmt_time_ns(origin.opt_start_time)}")
    return "; ".join(parts)


def _link_state(link: StreamSourceInfo) -> str:
    """One mirror/source link for humans: where, how far, how recent, what went wrong."""
    parts = [f"external {','.join(link.external)}" if link.external else "this cluster"]
    parts.append(f"last origin seq {link.last_origin_seq}, lag {link.lag}")
    if not link.running:
        parts.append("not running")
    elif link.active_ns >= 0:
        parts.append(f"active {fmt_duration_ns(link.active_ns)} ago")
    if link.skipped_msgs:
        ranges = " ".join(f"{lo}-{hi}" for lo, hi in link.skipped)
        parts.append(f"skipped {link.skipped_msgs} ({ranges})")
    if link.error:
        parts.append(f"error: {link.error}")
    return "; ".join(parts)


def show_info(info: StreamInfo, as_json: bool) -> None:
    """A stream's info as JSON or fields."""
    if as_json:
        echo_json(info)
    else:
        print_fields(f"Stream {info.config.name}", _info_fields(info))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def stream() -> None:
    """Manage streams: add, edit, info, ls, rm, purge, get, rmm.

    \b
    Example:
      raftstream stream add ORDERS --subjects 'orders.>' --replicas 3 --max-age 7d
    """


@stream.command("add")
@click.argument("name", required=False)
@config_flags(STREAM_FLAGS)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="JSON config.")
@json_option
@connection_options
def add_cmd(
    conn: Conn, name: str | None, config_file: str | None, as_json: bool, **flags: Any
) -> None:
    """Create a stream from flags and/or a JSON config file (flags win).

    \b
    Examples:
      raftstream stream add ORDERS --subjects 'orders.>' --replicas 3 --max-age 1h
      raftstream stream add --config orders.json
    """
    raw = load_config_file(config_file, StreamConfig)
    if name:
        raw["name"] = name
    if not raw.get("name"):
        raise click.UsageError("a stream NAME (or a --config file with a name) is required")
    try:
        cfg = StreamConfig.from_dict(raw)
        cfg = replace(cfg, **stream_params(flags))
    except TypeError as exc:
        fail(f"--config: {exc}")
    except errors.RaftStreamError as exc:  # a field's value (an unknown enum name, ...)
        fail(describe_error(exc))
    info = run(conn, lambda c: c.add_stream(cfg))
    show_info(info, as_json)


@stream.command("edit")
@click.argument("name")
@config_flags(STREAM_FLAGS)
@click.option(
    "--no-mirror",
    "no_mirror",
    is_flag=True,
    help="Remove the mirror: promote it to an ordinary stream that keeps its messages and "
    "accepts publishes on --subjects (without them: its own name). Cannot be undone.",
)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="JSON config.")
@json_option
@connection_options
def edit_cmd(
    conn: Conn, name: str, no_mirror: bool, config_file: str | None, as_json: bool, **flags: Any
) -> None:
    """Change a stream: the named flags (and the file's fields) over its current config.

    A mirror cannot be added to an existing stream nor pointed at another origin; it can be
    removed with --no-mirror, which promotes the stream (docs/mirrors.md).

    \b
    Examples:
      raftstream stream edit ORDERS --max-msgs 100000 --description "orders, capped"
      raftstream stream edit ORDERS_COPY --no-mirror --subjects 'orders.>'
    """
    raw = load_config_file(config_file, StreamConfig)
    if raw.get("name", name) != name:  # JetStream: "stream name in subject does not match"
        fail(f"--config {config_file}: it names stream {raw['name']!r}, not {name!r}")
    params = stream_params(flags)
    if no_mirror:
        if "mirror" in params:
            raise click.UsageError("--no-mirror and --mirror cannot be combined")
        params["mirror"] = None  # sent as no mirror: JetStream's {"mirror": null}

    async def body(c: Client) -> StreamInfo:
        have = (await c.stream_info(name)).config
        if no_mirror and have.mirror is None:
            raise errors.InvalidArgumentError("mirror", f"{name} is not a mirror (--no-mirror)")
        current = have.to_dict()
        cfg = replace(StreamConfig.from_dict({**current, **raw, "name": name}), **params)
        info = await c.update_stream(cfg)
        return await _applied(c, info, cfg, {*params, *raw}, conn.timeout_s)

    show_info(run(conn, body), as_json)


async def _applied(
    c: Client, info: StreamInfo, cfg: StreamConfig, changed: set[str], timeout_s: float
) -> StreamInfo:
    """The stream's info once it shows the ``changed`` fields of ``cfg`` (the server's
    UpdateStream answer may still carry the previous config: the stream group applies the
    change just after), or the latest info when ``timeout_s`` runs out."""
    sent = cfg.to_dict()
    # A field changed to nothing (a removed mirror, ``null`` in the file) is absent in JSON.
    wanted = {k: sent.get(k) for k in changed}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = info.config.to_dict()
        if all(
            k not in got if v is None else got.get(k) == v
            for k, v in wanted.items()
            if v is None or k in got
        ):
            break
        await asyncio.sleep(APPLY_POLL_S)
        info = await c.stream_info(cfg.name)
    return info


@stream.command("info")
@click.argument("name")
@click.option("--subjects", "subjects_filter", help="Also count messages per subject (> all).")
@click.option("--deleted", "deleted_details", is_flag=True, help="Also list the deleted sequences.")
@json_option
@connection_options
def info_cmd(
    conn: Conn, name: str, subjects_filter: str | None, deleted_details: bool, as_json: bool
) -> None:
    """Show a stream's config, state and replicas.

    \b
    Example:
      raftstream stream info ORDERS --json
    """
    info = run(
        conn,
        lambda c: c.stream_info(
            name, subjects_filter=subjects_filter, deleted_details=deleted_details
        ),
    )
    show_info(info, as_json)
    if subjects_filter and not as_json:
        rows = sorted(info.state.subjects.items())
        print_table("Subjects", ["Subject", "Messages"], rows)
    if deleted_details and not as_json and info.state_known:
        _show_deleted(info.state.deleted, info.state.num_deleted)


def _show_deleted(deleted: tuple[int, ...], num_deleted: int) -> None:
    """The deleted sequences as runs; says so when the node sent only the lowest ones."""
    rows = [(lo, hi, hi - lo + 1) for lo, hi in seq_runs(deleted)]
    print_table("Deleted sequences", ["First", "Last", "Count"], rows)
    if len(deleted) < num_deleted:
        click.echo(f"(the lowest {len(deleted)} of {num_deleted} deleted sequences)")


@stream.command("ls")
@click.option("--subject", help="Only streams capturing this subject.")
@click.option("-n", "--names", "names_only", is_flag=True, help="Names only.")
@json_option
@connection_options
def ls_cmd(conn: Conn, subject: str | None, names_only: bool, as_json: bool) -> None:
    """List streams.

    \b
    Example:
      raftstream stream ls
    """
    if names_only:
        names = run(conn, lambda c: c.stream_names(subject=subject))
        if as_json:
            echo_json(names)
        for n in [] if as_json else names:
            click.echo(n)
        return
    infos = run(conn, lambda c: c.streams_info(subject=subject))
    if as_json:
        echo_json(infos)
        return
    rows = [
        (
            i.config.name,
            _subjects_cell(i.config),
            i.config.num_replicas,
            *(
                (
                    i.state.messages,
                    fmt_bytes(i.state.bytes),
                    i.state.consumer_count,
                    fmt_time_ns(i.state.last_ts_ns),
                )
                if i.state_known
                else ("?", "?", "?", "offline: no replica answered")
            ),
        )
        for i in sorted(infos, key=lambda i: i.config.name)
    ]
    if not rows:
        click.echo("No streams defined")
        return
    headers = ["Name", "Subjects", "Replicas", "Messages", "Bytes", "Consumers", "Last message"]
    print_table("Streams", headers, rows)


@stream.command("rm")
@click.argument("name")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def rm_cmd(conn: Conn, name: str, force: bool) -> None:
    """Delete a stream with all its messages and consumers.

    \b
    Example:
      raftstream stream rm ORDERS -f
    """
    confirm_or_refuse(f"delete stream {name} and all its messages", force)
    run(conn, lambda c: c.delete_stream(name))
    click.echo(f"Deleted stream {name}")


@stream.command("purge")
@click.argument("name")
@click.option("--subject", help="Only messages on this subject (wildcards allowed).")
@click.option("--seq", type=click.IntRange(1, INT64_MAX), help="Only messages below this sequence.")
@click.option("--keep", type=click.IntRange(0, INT64_MAX), help="Keep the newest N messages.")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@json_option
@connection_options
def purge_cmd(
    conn: Conn,
    name: str,
    subject: str | None,
    seq: int | None,
    keep: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Remove messages from a stream (all, by subject, below a sequence, or all but N).

    \b
    Examples:
      raftstream stream purge ORDERS -f
      raftstream stream purge ORDERS --subject orders.eu --keep 10 -f
    """
    if seq is not None and keep is not None:
        raise click.UsageError("--seq and --keep cannot be combined")
    confirm_or_refuse(f"purge messages of stream {name}", force)
    purged = run(conn, lambda c: c.purge_stream(name, subject=subject, seq=seq, keep=keep))
    if as_json:
        echo_json({"stream": name, "purged": purged})
    else:
        click.echo(f"Purged {purged} messages from stream {name}")


def show_msg(msg: RawStreamMsg, as_json: bool) -> None:
    """A stored message: JSON, or headers then the payload as text."""
    if as_json:
        echo_json(msg)
        return
    click.echo(f"Item: {msg.stream}#{msg.seq} received {fmt_time_ns(msg.ts_ns)} on {msg.subject}")
    for key, value in msg.headers.items():
        click.echo(f"  {key}: {value}")
    click.echo("")
    click.echo(msg.data.decode("utf-8", errors="replace"))


@stream.command("get")
@click.argument("name")
@click.argument("seq", type=click.IntRange(1, INT64_MAX), required=False)
@click.option("--last-for", "last_for", metavar="SUBJECT", help="The newest on this subject.")
@json_option
@connection_options
def get_cmd(conn: Conn, name: str, seq: int | None, last_for: str | None, as_json: bool) -> None:
    """Read one stored message, by sequence or the newest on a subject.

    \b
    Examples:
      raftstream stream get ORDERS 42
      raftstream stream get ORDERS --last-for orders.eu --json
    """
    if (seq is None) == (last_for is None):
        raise click.UsageError("give either SEQ or --last-for SUBJECT")
    msg = run(conn, lambda c: c.get_msg(name, seq, subject=last_for))
    show_msg(msg, as_json)


@stream.command("rmm")
@click.argument("name")
@click.argument("seq", type=click.IntRange(1, INT64_MAX))
@click.option("--no-erase", is_flag=True, help="Remove without overwriting the bytes.")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def rmm_cmd(conn: Conn, name: str, seq: int, no_erase: bool, force: bool) -> None:
    """Remove one message from a stream.

    \b
    Example:
      raftstream stream rmm ORDERS 42 -f
    """
    confirm_or_refuse(f"delete message {seq} of stream {name}", force)
    run(conn, lambda c: c.delete_msg(name, seq, no_erase=no_erase))
    click.echo(f"Deleted message {seq} of stream {name}")
