"""``raftstream pub`` and ``raftstream sub``.

``pub SUBJECT DATA --count N`` publishes N messages; ``{{Count}}`` in DATA, in headers and
in ``--msg-id`` becomes the message's number (1..N), ``{{ID}}`` a random id, ``{{Unix}}``
the time in seconds and ``{{Time}}`` the time in RFC 3339. The messages go out pipelined
(in order) and each is reported with its stream sequence as soon as a quorum stored it (in
order), as the nats CLI does: when one is refused (a ``--discard new`` limit, say), what was
stored is on screen before the one error line, which names the first failure and counts
what was published (``--json``: one entry per message, an ``error`` object for a failed one).

DATA is text, published in UTF-8; data piped on stdin is published byte for byte (binary
too: placeholders are filled in without decoding anything else).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import click

from raftstream import errors
from raftstream._args import check_queue_name
from raftstream.cli.common import (
    Conn,
    connection_options,
    describe_error,
    echo_json,
    echo_raw,
    fail,
    json_option,
    message_data,
    run,
    seq_runs,
    text_arg,
)
from raftstream.cli.consumer import NAMED_DELIVER, format_msg, msg_json, start_seq
from raftstream.config import ConsumerConfig, DeliverPolicy, format_rfc3339_ns
from raftstream.subscribe import find_stream

if TYPE_CHECKING:
    from raftstream.client import Client
    from raftstream.models import ConsumerInfo, PubAck
    from raftstream.msg import Msg

__all__ = ["pub", "render", "sub"]

_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
EPHEMERAL_INACTIVE_S = 60
PULL_BATCH_MSGS_MAX = 256
PULL_WAIT_S = 1.0
SEQ_RUNS_SHOWN_MAX = 8  # runs of published sequences a failed pub's error line names
Shower = Callable[["Msg"], None]


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


def render_data(data: bytes, count: int) -> bytes:
    """``render`` over a payload of any bytes: the placeholders filled in, every other byte
    unchanged (UTF-8 with surrogateescape decodes and encodes any bytes back exactly, so
    binary data is never altered or refused)."""
    if b"{{" not in data:
        return data
    text = data.decode("utf-8", "surrogateescape")
    return render(text, count).encode("utf-8", "surrogateescape")


def _headers(items: tuple[str, ...], count: int) -> dict[str, str]:
    """``-H KEY:VALUE`` options as headers, placeholders filled in for message ``count``."""
    out = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY:VALUE, got {item!r}", param_hint="--header")
        if key.strip() in out:  # the last would win silently
            raise click.BadParameter(
                f"{key.strip()!r} given twice: a message holds one value per header name",
                param_hint="--header",
            )
        out[key.strip()] = render(value.strip(), count)
    return out


Reporter = Callable[[int, "PubAck | errors.RaftStreamError"], None]


async def _publish_all(
    c: Client,
    subject: str,
    data: bytes,
    *,
    count: int,
    headers: tuple[str, ...],
    msg_id: str | None,
    expected_stream: str | None,
    report: Reporter,
) -> list[PubAck | errors.RaftStreamError]:
    """Publish ``count`` rendered messages pipelined; ``report(size, outcome)`` for each, in
    order, as its outcome comes (its ack, or its typed error). Every message is waited for,
    also after one fails: a refusal of one (a limit, say) says nothing of the others, which
    may be stored. Returns the outcomes in order. A failure before a message could be
    queued (a bad argument, the client closing) raises, after reporting those queued."""
    futures: list[tuple[int, asyncio.Future[PubAck]]] = []
    outcomes: list[PubAck | errors.RaftStreamError] = []
    try:
        for i in range(1, count + 1):
            payload = render_data(data, i)
            fut = await c.publish_async(
                subject,
                payload,
                headers=_headers(headers, i) or None,
                msg_id=render(msg_id, i) if msg_id else None,
                expected_stream=expected_stream,
            )
            futures.append((len(payload), fut))
            # Report whatever is already answered, in order, while the rest is queued.
            while len(outcomes) < len(futures) and futures[len(outcomes)][1].done():
                outcomes.append(_settled(futures[len(outcomes)], report))
        for queued in futures[len(outcomes) :]:
            await asyncio.wait([queued[1]])
            outcomes.append(_settled(queued, report))
        return outcomes
    except BaseException:
        for _, fut in futures:  # one error line, not one per queued message
            fut.add_done_callback(_retrieve)
        raise


def _settled(
    queued: tuple[int, asyncio.Future[PubAck]], report: Reporter
) -> PubAck | errors.RaftStreamError:
    """The outcome of a settled publish, reported; an error that is not a raftstream one
    (a bug) is raised."""
    size, fut = queued
    exc = fut.exception()
    if exc is not None and not isinstance(exc, errors.RaftStreamError):
        raise exc
    outcome: PubAck | errors.RaftStreamError = exc if exc is not None else fut.result()
    report(size, outcome)
    return outcome


def _retrieve(fut: asyncio.Future[PubAck]) -> None:
    """Mark a failed future's error as seen (asyncio would log it at exit otherwise)."""
    if not fut.cancelled():
        fut.exception()


def seq_ranges(seqs: list[int]) -> str:
    """Sequences as ``1-3, 7, 9-10`` (sorted; at most ``SEQ_RUNS_SHOWN_MAX`` runs, then
    ``...``)."""
    runs = seq_runs(seqs)
    shown = [f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in runs[:SEQ_RUNS_SHOWN_MAX]]
    return ", ".join(shown) + (", ..." if len(runs) > SEQ_RUNS_SHOWN_MAX else "")


def _failure_line(outcomes: list[PubAck | errors.RaftStreamError]) -> str | None:
    """The error line of a ``pub`` with failed messages (None: none failed): the first
    failure, and with ``--count`` what was published around it."""
    failed = [(i, o) for i, o in enumerate(outcomes, 1) if isinstance(o, errors.RaftStreamError)]
    if not failed:
        return None
    first_at, first = failed[0]
    line = describe_error(first)
    if len(outcomes) == 1:
        return line
    seqs = [o.seq for o in outcomes if not isinstance(o, errors.RaftStreamError)]
    which = f"message {first_at}" if len(failed) == 1 else f"first at message {first_at}"
    published = f"{len(seqs)} published: seq {seq_ranges(seqs)}" if seqs else "none published"
    return f"{line} ({len(failed)} of {len(outcomes)} failed, {which}; {published})"


def _outcome_json(outcome: PubAck | errors.RaftStreamError) -> object:
    if isinstance(outcome, errors.RaftStreamError):
        return {"error": {"reason": outcome.reason, "message": outcome.message}}
    return outcome


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
    """Publish DATA (text, sent in UTF-8) or stdin's bytes, unchanged (binary data too), to
    SUBJECT and wait for the stream's acknowledgement.

    \b
    Examples:
      raftstream pub orders.eu 'order {{Count}}' --count 10 --msg-id 'o-{{Count}}'
      echo '{"id": 1}' | raftstream pub orders.eu -H Content-Type:application/json
      raftstream pub images.logo < logo.png
    """
    payload = message_data(data, "DATA")
    for item in headers:
        text_arg(item, "--header")
    _headers(headers, 1)  # refused before anything is sent
    if msg_id is not None:
        text_arg(msg_id, "--msg-id")

    def report(size: int, outcome: PubAck | errors.RaftStreamError) -> None:
        # Each ack as it comes (the nats CLI's way): what was stored is on screen before
        # a refusal's error line. Errors go in that one line at the end.
        if quiet or as_json or isinstance(outcome, errors.RaftStreamError):
            return
        dup = " (duplicate)" if outcome.duplicate else ""
        click.echo(
            f"Published {size} bytes to {subject}: stream {outcome.stream} seq {outcome.seq}{dup}"
        )

    outcomes = run(
        conn,
        lambda c: _publish_all(
            c,
            subject,
            payload,
            count=count,
            headers=headers,
            msg_id=msg_id,
            expected_stream=expect_stream,
            report=report,
        ),
    )
    failure = _failure_line(outcomes)
    if as_json and (failure is None or len(outcomes) > 1):
        echo_json([_outcome_json(o) for o in outcomes])  # one entry per message, in order
    if failure is not None:
        fail(failure)


def _sub_config(deliver: str | None) -> ConsumerConfig | None:
    """The requested start (None: leave it to an existing consumer, else all)."""
    if deliver is None:
        return None
    if deliver.isascii() and deliver.isdigit():
        return ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=int(deliver)
        )
    return ConsumerConfig(deliver_policy=DeliverPolicy(deliver))


async def _ensure_durable(
    c: Client, subject: str, stream: str | None, durable: str, cfg: ConsumerConfig | None
) -> tuple[str, ConsumerInfo]:
    """The durable named on the command line, created as a PULL consumer when missing
    (returns its stream and info). Created here rather than by a subscription because
    the SDK deletes consumers its subscriptions created, and this one must outlive the
    command; pull, so that ``--count N`` takes exactly N messages and leaves the rest
    for the next run (a push consumer would have sent more, to be redelivered only
    after the ack wait)."""
    if stream is None:
        stream = await find_stream(c, subject, None)  # as a subscription finds it (its words)
    try:
        return stream, await c.consumer_info(stream, durable)
    except errors.NotFoundError:
        base = replace(cfg or ConsumerConfig(), durable_name=durable)
        if subject and not base.filter_subject:
            base = replace(base, filter_subject=subject)
        return stream, await c.add_consumer(stream, base)


async def _sub_pull(
    c: Client, stream: str, durable: str, *, count: int | None, ack: bool, show: Shower
) -> None:
    """Take messages from a pull durable, exactly ``count`` of them (None: until
    interrupted), each acked and confirmed before the next when ``ack``."""
    psub = await c.pull_subscribe("", durable=durable, stream=stream)
    got = 0
    while count is None or got < count:
        want = min(PULL_BATCH_MSGS_MAX, count - got if count else PULL_BATCH_MSGS_MAX)
        try:
            msgs = await psub.fetch(want, timeout=PULL_WAIT_S)
        except errors.DeadlineExceededError:
            continue  # nothing new yet
        for msg in msgs:
            show(msg)
            if ack:
                await msg.ack_sync()
        got += len(msgs)


async def _sub_push(
    c: Client,
    subject: str,
    *,
    stream: str | None,
    durable: str | None,
    queue: str | None,
    ordered: bool,
    cfg: ConsumerConfig | None,
    count: int | None,
    ack: bool,
    show: Shower,
) -> None:
    """Consume through the SDK's push subscribe (ADR-15 workflow: bind or create; an
    ordered consumer recreates itself across failovers) until ``count`` messages arrived
    (None: until interrupted). Consumers the SDK created are deleted at the end."""
    sub = await c.subscribe(
        subject,
        queue=queue,
        durable=durable,
        stream=stream,
        config=cfg,
        ordered_consumer=ordered,
        manual_ack=not ordered,  # acked below (an ordered consumer takes no acks)
        inactive_threshold=None if durable or queue else EPHEMERAL_INACTIVE_S,
    )
    got = 0
    try:
        while count is None or got < count:
            msg = await sub.next_msg(timeout=None)
            show(msg)
            if ack and not ordered:
                await msg.ack_sync()  # confirmed: the command may exit right after
            got += 1
    finally:
        await sub.unsubscribe()


async def _sub(
    c: Client,
    subject: str,
    *,
    stream: str | None,
    durable: str | None,
    queue: str | None,
    ordered: bool,
    deliver: str | None,
    count: int | None,
    ack: bool,
    show: Shower,
) -> None:
    """A durable alone: pull (``_ensure_durable``) unless it exists as a push consumer;
    everything else (ephemeral, queue, ordered): the SDK's push subscribe."""
    cfg = _sub_config(deliver)
    if durable:
        stream, info = await _ensure_durable(c, subject, stream, durable, cfg)
        if info.config.is_pull:
            await _sub_pull(c, stream, durable, count=count, ack=ack, show=show)
            return
    await _sub_push(
        c,
        subject,
        stream=stream,
        durable=durable,
        queue=queue,
        ordered=ordered,
        cfg=cfg,
        count=count,
        ack=ack,
        show=show,
    )


@click.command("sub")
@click.argument("subject")
@click.option("--stream", help="The stream (default: the one capturing SUBJECT).")
@click.option("--durable", help="Use (or create) this durable consumer.")
@click.option("--queue", help="Share the work with other subscribers of this queue group "
              "(a name without whitespace, '.', '*' or '>': it also names the group's "
              "consumer).")  # fmt: skip
@click.option("--ordered", is_flag=True, help="Ordered consumer (every message once, in order).")
@click.option("--deliver", help="Start: all (default), last, new, last_per_subject or a "
              "sequence (1 to 2**63-1).")  # fmt: skip
@click.option("--count", type=click.IntRange(min=1), help="Stop after N messages.")
@click.option("--ack/--no-ack", default=True, show_default=True, help="Acknowledge messages.")
@click.option("--raw", is_flag=True,
              help="Write payloads only, bytes unchanged, each followed by a newline.")  # fmt: skip
@json_option
@connection_options
def sub(
    conn: Conn,
    subject: str,
    stream: str | None,
    durable: str | None,
    queue: str | None,
    ordered: bool,
    deliver: str | None,
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
    if durable is not None and queue is not None:
        # The SDK would bind the group to the durable; the docs promise a durable named GROUP.
        raise click.UsageError(
            "--durable cannot be combined with --queue: a queue group's consumer is the "
            "durable named GROUP"
        )
    if queue is not None:
        try:
            check_queue_name(queue)
        except errors.InvalidArgumentError as exc:
            raise click.BadParameter(exc.rule, param_hint="--queue") from None
    if deliver is not None and deliver not in NAMED_DELIVER:
        if not (deliver.isascii() and deliver.isdigit()):
            raise click.BadParameter(
                f"{deliver!r}: expected {', '.join(NAMED_DELIVER)} or a start sequence "
                "(1 to 2**63-1)",
                param_hint="--deliver",
            )
        start_seq(deliver)

    def show(msg: Msg) -> None:
        if as_json:
            click.echo(json.dumps(msg_json(msg)))
        elif raw:
            echo_raw(msg.data, nl=True)
        else:
            click.echo(format_msg(msg))

    run(
        conn,
        lambda c: _sub(
            c,
            subject,
            stream=stream,
            durable=durable,
            queue=queue,
            ordered=ordered,
            deliver=deliver,
            count=count,
            ack=ack,
            show=show,
        ),
    )
