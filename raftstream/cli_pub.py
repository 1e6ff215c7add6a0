"""``raftstream pub`` and ``raftstream sub``.

``pub SUBJECT DATA --count N`` publishes N messages; ``{{Count}}`` in DATA, in headers and
in ``--msg-id`` becomes the message's number (1..N), ``{{ID}}`` a random id, ``{{Unix}}``
the time in seconds and ``{{Time}}`` the time in RFC 3339. The messages go out pipelined
(in order) and each is reported with its stream sequence once a quorum stored it.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from raftstream import errors
from raftstream.cli_common import (
    Conn,
    connection_options,
    echo_json,
    fail,
    json_option,
    run,
)
from raftstream.cli_consumer import _msg_json, format_msg
from raftstream.config import ConsumerConfig, format_rfc3339_ns

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.models import PubAck
    from raftstream.msg import Msg

__all__ = ["pub", "render", "sub"]

_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
SUB_BATCH_MSGS_MAX = 256
SUB_POLL_S = 1.0
EPHEMERAL_INACTIVE_S = 60


def render(template: str, count: int) -> str:
    """``template`` with ``{{Count}}``, ``{{ID}}``, ``{{Unix}}`` and ``{{Time}}`` filled in;
    ``click.UsageError`` for any other placeholder."""

    def value(m: re.Match[str]) -> str:
        key = m.group(1)
        makers: dict[str, Callable[[], str]] = {
            "Count": lambda: str(count),
            "ID": lambda: secrets.token_hex(8),
            "Unix": lambda: str(int(time.time())),
            "Time": lambda: format_rfc3339_ns(time.time_ns()),
        }
        if key not in makers:
            raise click.UsageError(f"unknown placeholder {{{{{key}}}}} (Count, ID, Unix, Time)")
        return makers[key]()

    return _PLACEHOLDER.sub(value, template)


def _headers(items: tuple[str, ...], count: int) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY:VALUE, got {item!r}", param_hint="--header")
        out[key.strip()] = render(value.strip(), count)
    return out


async def _publish_all(
    c: Client,
    subject: str,
    data: str,
    *,
    count: int,
    headers: tuple[str, ...],
    msg_id: str | None,
    expected_stream: str | None,
) -> list[tuple[int, PubAck]]:
    """Publish ``count`` rendered messages pipelined; their (size, ack) in order. The first
    failure raises (earlier messages are stored; later ones may be)."""
    futures = []
    for i in range(1, count + 1):
        payload = render(data, i).encode()
        fut = await c.publish_async(
            subject,
            payload,
            headers=_headers(headers, i) or None,
            msg_id=render(msg_id, i) if msg_id else None,
            expected_stream=expected_stream,
        )
        futures.append((len(payload), fut))
    return [(size, await fut) for size, fut in futures]


@click.command("pub")
@click.argument("subject")
@click.argument("data", required=False)
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("-H", "--header", "headers", multiple=True, metavar="KEY:VALUE",
              help="A header (repeatable); placeholders work here too.")  # fmt: skip
@click.option("--msg-id", help="Nats-Msg-Id for deduplication (e.g. order-{{Count}}).")
@click.option("--expect-stream", help="Refuse unless the subject is stored by this stream.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors.")
@json_option
@connection_options
def pub(
    conn: Conn,
    subject: str,
    data: str | None,
    count: int,
    headers: tuple[str, ...],
    msg_id: str | None,
    expect_stream: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Publish DATA (or stdin) to SUBJECT and wait for the stream's acknowledgement.

    \b
    Examples:
      raftstream pub orders.eu 'order {{Count}}' --count 10 --msg-id 'o-{{Count}}'
      echo '{"id": 1}' | raftstream pub orders.eu -H Content-Type:application/json
    """
    if data is None:
        if sys.stdin.isatty():
            raise click.UsageError("give DATA or pipe it on stdin")
        data = sys.stdin.read()
    acks = run(
        conn,
        lambda c: _publish_all(
            c,
            subject,
            data,
            count=count,
            headers=headers,
            msg_id=msg_id,
            expected_stream=expect_stream,
        ),
    )
    if as_json:
        echo_json([ack for _, ack in acks])
        return
    for size, ack in [] if quiet else acks:
        dup = " (duplicate)" if ack.duplicate else ""
        click.echo(f"Published {size} bytes to {subject}: stream {ack.stream} seq {ack.seq}{dup}")


def _sub_config(deliver: str, durable: str | None) -> ConsumerConfig:
    """The consumer ``sub`` creates when none exists (ephemeral ones clean up when idle)."""
    policy: dict[str, Any] = {"deliver_policy": deliver}
    if deliver.isdigit():
        policy = {"deliver_policy": "by_start_sequence", "opt_start_seq": int(deliver)}
    inactive = 0 if durable else EPHEMERAL_INACTIVE_S * 1_000_000_000
    return ConsumerConfig(inactive_threshold=inactive, **policy)


async def _sub_pull(
    c: Client,
    subject: str,
    *,
    stream: str | None,
    durable: str | None,
    deliver: str,
    count: int | None,
    ack: bool,
    show: Callable[[Msg], None],
) -> int:
    """Consume over a pull consumer (durable, or ephemeral and deleted afterwards) until
    ``count`` messages arrived (None: until interrupted). Returns how many arrived."""
    sub = await c.pull_subscribe(subject, durable, stream, _sub_config(deliver, durable))
    got = 0
    try:
        while count is None or got < count:
            want = min(SUB_BATCH_MSGS_MAX, (count - got) if count else SUB_BATCH_MSGS_MAX)
            try:
                msgs = await sub.fetch(want, timeout=SUB_POLL_S)
            except errors.DeadlineExceededError:
                continue  # nothing new yet: keep waiting
            for msg in msgs:
                show(msg)
                if ack:
                    await msg.ack()
            got += len(msgs)
    finally:
        if durable is None:
            await _forget(c, sub.stream, sub.consumer)
    return got


async def _forget(c: Client, stream: str, consumer: str) -> None:
    with contextlib.suppress(errors.RaftStreamError):  # else it expires when inactive
        await c.delete_consumer(stream, consumer)


@click.command("sub")
@click.argument("subject")
@click.option("--stream", help="The stream (default: the one capturing SUBJECT).")
@click.option("--durable", help="Use (or create) this durable consumer.")
@click.option("--queue", help="Share the work with other subscribers of this queue group.")
@click.option("--ordered", is_flag=True, help="Ordered consumer (every message once, in order).")
@click.option("--deliver", default="all", show_default=True,
              help="Start: all, last, new, last_per_subject or a stream sequence.")  # fmt: skip
@click.option("--count", type=click.IntRange(min=1), help="Stop after N messages.")
@click.option("--ack/--no-ack", default=True, show_default=True, help="Acknowledge messages.")
@click.option("--raw", is_flag=True, help="Print payloads only.")
@json_option
@connection_options
def sub(
    conn: Conn,
    subject: str,
    stream: str | None,
    durable: str | None,
    queue: str | None,
    ordered: bool,
    deliver: str,
    count: int | None,
    ack: bool,
    raw: bool,
    as_json: bool,
) -> None:
    """Receive messages stored on SUBJECT (Ctrl-C stops; --count N stops after N).

    \b
    Examples:
      raftstream sub 'orders.>' --count 10
      raftstream sub orders.eu --durable eu-reader --deliver new
    """
    if ordered and (durable or queue):
        raise click.UsageError("--ordered cannot be combined with --durable or --queue")
    if deliver not in ("all", "last", "new", "last_per_subject") and not deliver.isdigit():
        raise click.BadParameter(f"{deliver!r}", param_hint="--deliver")

    def show(msg: Msg) -> None:
        if as_json:
            click.echo(json.dumps(_msg_json(msg)))
        else:
            click.echo(format_msg(msg, raw=raw))

    if ordered:
        fail("--ordered needs the SDK's ordered consumer, which this build does not have")
    run(
        conn,
        lambda c: _sub_pull(
            c,
            subject,
            stream=stream,
            durable=durable or queue,
            deliver=deliver,
            count=count,
            ack=ack,
            show=show,
        ),
    )
