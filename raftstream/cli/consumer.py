"""``raftstream consumer ...``: add, edit, info, ls, rm, next, pause, resume.

``consumer add STREAM NAME`` makes a durable consumer; every ``ConsumerConfig`` field has a
flag (nats CLI names: ``--filter``, ``--ack``, ``--deliver``, ``--max-pending``...), or
``--config FILE.json`` gives them all (flags win). ``--deliver`` takes ``all``, ``last``,
``new``, ``last_per_subject``, a stream sequence (``100``) or a start time (RFC 3339 or a
duration ago: ``1h``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from raftstream import errors
from raftstream.cli.common import (
    DURATION,
    SIZE,
    Conn,
    confirm_or_refuse,
    connection_options,
    describe_error,
    echo_json,
    fail,
    fmt_duration_ns,
    fmt_time_ns,
    json_option,
    jsonable,
    parse_duration_ns,
    parse_time_or_ago_ns,
    print_fields,
    print_table,
    run,
    split_csv,
)
from raftstream.cli.stream import Flag, config_flags, given_flags, key_values, load_config_file
from raftstream.config import ConsumerConfig

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.models import ConsumerInfo, SequenceInfo
    from raftstream.msg import Msg

__all__ = ["NAMED_DELIVER", "consumer", "format_msg", "msg_json", "start_seq"]

NAMED_DELIVER = ("all", "last", "new", "last_per_subject")
INT64_MAX = 2**63 - 1  # the server's sequences are int64
DEFAULT_PUSH_PREFIX = "deliver"
FETCH_LEFT_MIN_S = 0.05  # ``consumer next`` asks again only with at least this much time left

CONSUMER_FLAGS: tuple[Flag, ...] = (
    Flag("--filter", "filter", "Filter subject(s) (repeatable or comma-separated).",
         multiple=True),
    Flag("--ack", "ack_policy", "Ack policy.", click.Choice(["explicit", "all", "none"])),
    Flag("--deliver", "deliver", "Start: all, last, new, last_per_subject, a sequence "
         "(1 to 2**63-1), or a time (RFC 3339, or a duration ago such as 1h)."),
    Flag("--replay", "replay_policy", "Replay policy.", click.Choice(["instant", "original"])),
    Flag("--max-deliver", "max_deliver", "Deliveries per message at most (-1: unlimited).",
         int),
    Flag("--ack-wait", "ack_wait", "Time to ack before redelivery (30s).", DURATION),
    Flag("--backoff", "backoff", "Redelivery delays, comma-separated (1s,5s,30s).",
         multiple=True),
    Flag("--max-pending", "max_ack_pending", "Unacknowledged messages at most.", int),
    Flag("--pull/--push", "pull", "A pull consumer (default) or a push consumer.",
         is_bool=True),
    Flag("--deliver-subject", "deliver_subject", "Push: the delivery subject (name)."),
    Flag("--deliver-group", "deliver_group", "Push: the queue group."),
    Flag("--heartbeat", "idle_heartbeat", "Push: idle heartbeat interval (5s).", DURATION),
    Flag("--flow-control", "flow_control", "Push: flow control.", is_bool=True),
    Flag("--max-waiting", "max_waiting", "Pull: waiting pull requests at most.", int),
    Flag("--max-batch", "max_batch", "Pull: batch size per request at most.", int),
    Flag("--max-expires", "max_expires", "Pull: request expiry at most.", DURATION),
    Flag("--max-pull-bytes", "max_bytes", "Pull: bytes per request at most.", SIZE),
    Flag("--inactive-threshold", "inactive_threshold", "Delete after this long idle.",
         DURATION),
    Flag("--headers-only", "headers_only", "Deliver headers only.", is_bool=True),
    Flag("--sample", "sample_freq", "Sampling percentage for ack metrics (e.g. 10%)."),
    Flag("--rate-limit", "rate_limit_bps", "Push: bits per second at most.", int),
    Flag("--description", "description", "Free text description."),
    Flag("--metadata", "metadata", "Metadata KEY=VALUE (repeatable).", multiple=True),
    Flag("--replicas", "num_replicas", "Replicas (0: the stream's).", click.IntRange(min=0)),
    Flag("--memory", "mem_storage", "Keep the consumer's state in memory.", is_bool=True),
)  # fmt: skip


def _deliver(value: str) -> dict[str, Any]:
    """``--deliver`` as deliver_policy (+ opt_start_seq / opt_start_time)."""
    if value in NAMED_DELIVER:
        return {"deliver_policy": value}
    if value.isascii() and value.isdigit():
        return {"deliver_policy": "by_start_sequence", "opt_start_seq": start_seq(value)}
    try:
        start = parse_time_or_ago_ns(value, future=False)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected {', '.join(NAMED_DELIVER)}, a sequence or a time",
            param_hint="--deliver",
        ) from None
    return {"deliver_policy": "by_start_time", "opt_start_time": start}


def start_seq(value: str, flag: str = "--deliver") -> int:
    """``--deliver SEQ`` digits as a stream sequence, 1 to 2**63-1 (a usage error naming
    ``flag`` otherwise: 0 is no sequence, and a larger one does not fit the server's int64
    sequences)."""
    seq = int(value)
    if not 1 <= seq <= INT64_MAX:
        raise click.BadParameter(
            f"a start sequence must be 1 to {INT64_MAX}, not {value}", param_hint=flag
        )
    return seq


def _backoff(items: tuple[str, ...]) -> tuple[int, ...]:
    """``--backoff 1s,5s,30s`` as ns durations (a usage error otherwise)."""
    try:
        return tuple(parse_duration_ns(v) for v in split_csv(items, "--backoff"))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--backoff") from None


def consumer_params(name: str | None, values: dict[str, Any]) -> dict[str, Any]:
    """ConsumerConfig keyword arguments from the given flags."""
    given = given_flags(CONSUMER_FLAGS, values)
    filters = split_csv(given.pop("filter", ()), "--filter")
    if len(filters) == 1:
        given["filter_subject"] = filters[0]
    elif filters:
        given["filter_subjects"] = filters
    if "deliver" in given:
        given.update(_deliver(given.pop("deliver")))
    if "backoff" in given:
        given["backoff"] = _backoff(given["backoff"])
    if "metadata" in given:
        given["metadata"] = key_values(given["metadata"], "--metadata")
    pull = given.pop("pull", None)
    if pull is False and "deliver_subject" not in given:
        given["deliver_subject"] = f"{DEFAULT_PUSH_PREFIX}.{name or 'ephemeral'}"
    if pull is True and "deliver_subject" in given:
        raise click.UsageError("--pull and --deliver-subject cannot be combined")
    return given


def _ago(seqs: SequenceInfo, what: str) -> str:
    """``, last delivery 1.2s ago`` when the server knows when (JetStream's last_active)."""
    if not seqs.last_active_ns:
        return ""
    return f", last {what} {fmt_duration_ns(max(0, time.time_ns() - seqs.last_active_ns))} ago"


def _info_fields(info: ConsumerInfo) -> list[tuple[str, Any]]:
    """A consumer's config and state as (name, value) pairs for humans."""
    c = info.config
    filters = c.filter_subjects or ((c.filter_subject,) if c.filter_subject else ())
    pairs: list[tuple[str, Any]] = [
        ("Stream", info.stream),
        ("Name", info.name),
        ("Description", c.description or "-"),
        ("Kind", "pull" if c.is_pull else f"push to {c.deliver_subject}"),
        ("Filter", ", ".join(filters) or "-"),
        ("Deliver policy", c.deliver_policy.value),
        ("Ack policy", c.ack_policy.value),
        ("Ack wait", fmt_duration_ns(c.ack_wait)),
        ("Max deliver", c.max_deliver if c.max_deliver > 0 else "unlimited"),
        ("Max ack pending", c.max_ack_pending),
        ("Replay policy", c.replay_policy.value),
        ("Created", fmt_time_ns(info.created_ns)),
        ("Delivered", f"consumer seq {info.delivered.consumer_seq}, "
                      f"stream seq {info.delivered.stream_seq}{_ago(info.delivered, 'delivery')}"),
        ("Ack floor", f"consumer seq {info.ack_floor.consumer_seq}, "
                      f"stream seq {info.ack_floor.stream_seq}{_ago(info.ack_floor, 'ack')}"),
        ("Ack pending", info.num_ack_pending),
        ("Redelivered", info.num_redelivered),
        ("Waiting pulls", info.num_waiting),
        ("Unprocessed", info.num_pending),
        ("Paused", f"yes, {fmt_duration_ns(info.pause_remaining_ns)} left"
                   if info.paused else "no"),
    ]  # fmt: skip
    if c.backoff:
        pairs.append(("Backoff", ", ".join(fmt_duration_ns(b) for b in c.backoff)))
    if info.cluster is not None:
        pairs.append(("Leader", info.cluster.leader or "none"))
    return pairs


def show_info(info: ConsumerInfo, as_json: bool) -> None:
    """A consumer's info as JSON or fields."""
    if as_json:
        echo_json(info)
    else:
        print_fields(f"Consumer {info.stream} > {info.name}", _info_fields(info))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def consumer() -> None:
    """Manage consumers: add, edit, info, ls, rm, next, pause, resume.

    \b
    Example:
      raftstream consumer add ORDERS worker --filter 'orders.eu.>' --ack explicit
    """


@consumer.command("add")
@click.argument("stream")
@click.argument("name", required=False)
@config_flags(CONSUMER_FLAGS)
@click.option("--config", "config_file", type=click.Path(dir_okay=False), help="JSON config.")
@json_option
@connection_options
def add_cmd(
    conn: Conn,
    stream: str,
    name: str | None,
    config_file: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Create a durable consumer on STREAM (pull unless --push or --deliver-subject).

    \b
    Examples:
      raftstream consumer add ORDERS worker --filter 'orders.eu.>' --max-deliver 5
      raftstream consumer add ORDERS audit --push --deliver-subject audit --heartbeat 5s
      raftstream consumer add ORDERS --config worker.json
    """
    raw = load_config_file(config_file, ConsumerConfig)
    if name:
        raw["durable_name"] = name
    if not (raw.get("durable_name") or raw.get("name")):
        raise click.UsageError("a consumer NAME (or a --config file with one) is required")
    try:
        cfg = ConsumerConfig.from_dict(raw)
        cfg = replace(cfg, **consumer_params(name or cfg.durable_name, flags))
    except TypeError as exc:
        fail(f"--config: {exc}")
    except errors.RaftStreamError as exc:  # a field's value (an unknown enum name, ...)
        fail(describe_error(exc))
    show_info(run(conn, lambda c: c.add_consumer(stream, cfg)), as_json)


@consumer.command("edit")
@click.argument("stream")
@click.argument("name")
@config_flags(CONSUMER_FLAGS)
@json_option
@connection_options
def edit_cmd(conn: Conn, stream: str, name: str, as_json: bool, **flags: Any) -> None:
    """Change a consumer: the named flags over its current config (the server refuses
    fields that cannot change, by name).

    \b
    Example:
      raftstream consumer edit ORDERS worker --max-deliver 10 --ack-wait 1m
    """
    pull = flags.get("pull")
    params = consumer_params(name, flags)

    async def body(c: Client) -> ConsumerInfo:
        current = (await c.consumer_info(stream, name)).config
        if pull is not None or "deliver_subject" in params:
            wants_pull = pull if pull is not None else not params["deliver_subject"]
            if wants_pull != current.is_pull:  # before the fields of one kind on the other
                raise errors.InvalidArgumentError(
                    "deliver_subject", "can not switch a consumer between pull and push"
                )
        return await c.update_consumer(stream, replace(current, **params))

    show_info(run(conn, body), as_json)


@consumer.command("info")
@click.argument("stream")
@click.argument("name")
@json_option
@connection_options
def info_cmd(conn: Conn, stream: str, name: str, as_json: bool) -> None:
    """Show a consumer's config and state.

    \b
    Example:
      raftstream consumer info ORDERS worker
    """
    show_info(run(conn, lambda c: c.consumer_info(stream, name)), as_json)


async def _infos(c: Client, stream: str) -> list[ConsumerInfo]:
    """Every consumer's info, one ``consumer_info`` each: the server's ListConsumers answers
    configs with zeroed state (delivered, pending), so the listing alone would mislead."""
    names = await c.consumer_names(stream)
    return list(await asyncio.gather(*(c.consumer_info(stream, n) for n in names)))


@consumer.command("ls")
@click.argument("stream")
@click.option("-n", "--names", "names_only", is_flag=True, help="Names only.")
@json_option
@connection_options
def ls_cmd(conn: Conn, stream: str, names_only: bool, as_json: bool) -> None:
    """List the consumers of STREAM.

    \b
    Example:
      raftstream consumer ls ORDERS
    """
    if names_only:
        names = run(conn, lambda c: c.consumer_names(stream))
        if as_json:
            echo_json(names)
        for n in [] if as_json else names:
            click.echo(n)
        return
    infos = sorted(run(conn, lambda c: _infos(c, stream)), key=lambda i: i.name)
    if as_json:
        echo_json(infos)
        return
    if not infos:
        click.echo(f"No consumers on stream {stream}")
        return
    rows = [
        (
            i.name,
            "pull" if i.config.is_pull else "push",
            i.config.ack_policy.value,
            i.num_pending,
            i.num_ack_pending,
            i.num_redelivered,
            i.delivered.stream_seq,
            "paused" if i.paused else "",
        )
        for i in infos
    ]
    headers = [
        "Name",
        "Kind",
        "Ack",
        "Unprocessed",
        "Ack pending",
        "Redelivered",
        "Last seq",
        "State",
    ]
    print_table(f"Consumers of {stream}", headers, rows)


@consumer.command("rm")
@click.argument("stream")
@click.argument("name")
@click.option("-f", "--force", is_flag=True, help="Do not ask for confirmation.")
@connection_options
def rm_cmd(conn: Conn, stream: str, name: str, force: bool) -> None:
    """Delete a consumer.

    \b
    Example:
      raftstream consumer rm ORDERS worker -f
    """
    confirm_or_refuse(f"delete consumer {stream} > {name}", force)
    run(conn, lambda c: c.delete_consumer(stream, name))
    click.echo(f"Deleted consumer {stream} > {name}")


def format_msg(msg: Msg) -> str:
    """A delivered message for humans: a header line, its headers, its payload as text
    (bytes that are not UTF-8 shown as U+FFFD; ``--raw`` and ``--json`` keep them)."""
    body = msg.data.decode("utf-8", errors="replace")
    try:
        md = msg.metadata
        where = f"[#{md.stream_seq}] {md.stream} > {md.consumer} (delivered {md.num_delivered})"
    except Exception:  # an unparsable token still shows the message
        where = "[?]"
    lines = [f"{where} {msg.subject}"]
    lines.extend(f"  {k}: {v}" for k, v in msg.headers.items())
    lines.append(body)
    return "\n".join(lines)


def msg_json(msg: Msg) -> dict[str, Any]:
    """A delivered message as JSON data, with its ack token's metadata; the payload as
    ``stream get --json`` gives it (text when it is UTF-8, else base64: ``jsonable``)."""
    md = msg.metadata
    return {
        "subject": msg.subject,
        "stream_seq": md.stream_seq,
        "consumer_seq": md.consumer_seq,
        "delivered": md.num_delivered,
        "pending": md.num_pending,
        "headers": dict(msg.headers),
        "data": jsonable(msg.data),
    }


async def _next(
    c: Client, stream: str, name: str, *, count: int, ack: bool, wait_s: float, as_json: bool
) -> None:
    """Fetch up to ``count`` messages, one pull request each, printing each as it comes (or
    one JSON list at the end), ack when asked: acks are confirmed, so an acked message is
    not delivered again. No message within ``wait_s`` is a TIMEOUT error. The consumer must
    exist (NOT_FOUND otherwise: a mistyped name must not create a durable consumer).

    One message per request, as the nats CLI does: a request for all ``count`` waited for
    all of them, so 17 available of 1000 asked showed nothing until ``--wait`` passed, and
    a Ctrl-C meanwhile left the 17 delivered but never shown (a user review)."""
    sub = await c.pull_subscribe_bind(stream, name)
    received: list[dict[str, Any]] = []
    # One wait for the whole command: a fetch that came back short was asked again with a
    # whole --wait of its own, so 3 of 5 messages took twice --wait (a user review).
    deadline = time.monotonic() + wait_s
    while len(received) < count:
        left_s = deadline - time.monotonic()
        if received and left_s < FETCH_LEFT_MIN_S:
            break  # fewer than asked: show what came
        try:
            msgs = await sub.fetch(1, timeout=max(left_s, FETCH_LEFT_MIN_S))
        except errors.DeadlineExceededError:
            if received:
                break
            raise
        for msg in msgs:
            received.append(msg_json(msg))
            if not as_json:
                click.echo(format_msg(msg))
            if ack:
                await msg.ack_sync()
    if as_json:
        echo_json(received)


@consumer.command("next")
@click.argument("stream")
@click.argument("name")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--ack/--no-ack", default=False, help="Acknowledge what is received.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds to wait for messages.")  # fmt: skip
@json_option
@connection_options
def next_cmd(
    conn: Conn, stream: str, name: str, count: int, ack: bool, wait_s: float, as_json: bool
) -> None:
    """Fetch the next message(s) from a pull consumer, optionally acknowledging them.

    \b
    Example:
      raftstream consumer next ORDERS worker --count 10 --ack
    """
    run(
        conn,
        lambda c: _next(c, stream, name, count=count, ack=ack, wait_s=wait_s, as_json=as_json),
    )


@consumer.command("pause")
@click.argument("stream")
@click.argument("name")
@click.option("--until", "until", required=True, metavar="TIME|DURATION",
              help="RFC 3339 time or a duration from now (10m).")  # fmt: skip
@json_option
@connection_options
def pause_cmd(conn: Conn, stream: str, name: str, until: str, as_json: bool) -> None:
    """Stop delivery until a time.

    \b
    Examples:
      raftstream consumer pause ORDERS worker --until 10m
      raftstream consumer pause ORDERS worker --until 2030-01-01T00:00:00Z
    """
    try:
        until_ns = parse_time_or_ago_ns(until, future=True)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--until") from None
    if until_ns <= time.time_ns():  # the server would take it as "not paused" (a resume)
        raise click.BadParameter(
            f"{until} is in the past (to resume: raftstream consumer resume)",
            param_hint="--until",
        )
    info = run(conn, lambda c: c.pause_consumer(stream, name, until_ns))
    if as_json:
        echo_json(info)
    elif info.paused:
        click.echo(f"Paused {stream} > {name} until {fmt_time_ns(info.pause_until_ns)}")
    else:  # the time passed on the way
        click.echo(f"{stream} > {name} is not paused: {until} has passed")


@consumer.command("resume")
@click.argument("stream")
@click.argument("name")
@json_option
@connection_options
def resume_cmd(conn: Conn, stream: str, name: str, as_json: bool) -> None:
    """Resume a paused consumer.

    \b
    Example:
      raftstream consumer resume ORDERS worker
    """
    info = run(conn, lambda c: c.resume_consumer(stream, name))
    if as_json:
        echo_json(info)
    else:
        click.echo(f"Resumed {stream} > {name}")
