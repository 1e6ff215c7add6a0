"""What every ``raftstream`` client command shares: connection options, the async runner,
error reporting, value parsing (durations, sizes, times) and output (tables, JSON).

Exit codes (documented in docs/cli.md): 0 success, 1 an error (the server refused, a value
was rejected, nothing found, the cluster could not be reached), 2 a usage error (click's
own, or a confirmation that cannot be asked because stdin is not a terminal), 130 Ctrl-C
and 143 SIGTERM (128 + the signal, as a shell reports it; both end the command the same
way, its consumers and bench streams removed).

Human output is rich tables on a terminal and plain aligned columns otherwise (pipes, CI);
``--json`` prints JSON on every read command. This module imports the SDK only (never the
node): the command line is a client like any other.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import functools
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from raftstream import errors
from raftstream._args import check_address
from raftstream.config import format_rfc3339_ns, parse_rfc3339_ns

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = [
    "CLI_EPILOG",
    "DURATION",
    "SIZE",
    "UNKNOWN_STATE",
    "Conn",
    "add_group_connection_options",
    "arg_bytes",
    "confirm_or_refuse",
    "connection_options",
    "echo_json",
    "echo_raw",
    "fail",
    "fmt_bytes",
    "fmt_duration_ns",
    "fmt_time_ns",
    "json_option",
    "jsonable",
    "message_data",
    "parse_duration_ns",
    "parse_size",
    "parse_time_or_ago_ns",
    "print_fields",
    "print_table",
    "run",
    "seq_runs",
    "split_csv",
    "text_arg",
]

R = TypeVar("R")
T = TypeVar("T")

DEFAULT_SERVERS = "127.0.0.1:7101"
# A stream or bucket no replica answered for (``StreamInfo.state_known`` False).
UNKNOWN_STATE = "unknown: no replica answered (its nodes offline, or electing)"
DEFAULT_TIMEOUT_S = 5.0
SERVERS_ENV = "RAFTSTREAM_SERVERS"
# --user, --password, --token (docs/security.md): option name -> env variable.
AUTH_ENV = {
    "user": "RAFTSTREAM_USER",
    "password": "RAFTSTREAM_PASSWORD",
    "token": "RAFTSTREAM_TOKEN",
}
# --tls-ca, --tls-cert, --tls-key (PEM paths, docs/tls.md): option name -> env variable.
TLS_ENV = {
    "tls_ca": "RAFTSTREAM_TLS_CA",
    "tls_cert": "RAFTSTREAM_TLS_CERT",
    "tls_key": "RAFTSTREAM_TLS_KEY",
}
NS_PER_S = 1_000_000_000
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, Ctrl-C
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143: systemd, timeout, kubernetes stopping it

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "d": 86400 * NS_PER_S,
    "w": 7 * 86400 * NS_PER_S,
    "y": 365 * 86400 * NS_PER_S,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|y)")
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?$")
_UNLIMITED_WORDS = {"-1", "unlimited", "none", "inf"}


# -- connection ------------------------------------------------------------------------------


def split_csv(values: Iterable[str], flag: str) -> list[str]:
    """Repeatable and comma-separated values of ``flag``, flattened, spaces around each
    stripped. An empty element (``--subjects ''``, ``'a,,b'``, a trailing comma) is a usage
    error naming ``flag`` (exit 2): dropped, it silently changed what was asked (``stream
    edit ORDERS --subjects ''`` replaced the stream's subjects with its name)."""
    out = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                raise click.BadParameter(
                    f"an empty value in {value!r} (give each value, comma-separated, "
                    "without empty ones)",
                    param_hint=flag,
                )
            out.append(item)
    return out


def _servers(values: Iterable[str], flag: str) -> list[str]:
    """``-s`` values (or ``$RAFTSTREAM_SERVERS``, ``flag`` then names it): ``HOST:PORT``
    each, a usage error naming ``flag`` otherwise (the SDK's rule, ``check_servers``),
    rather than ``NOT_CONNECTED`` after the connect timeout."""
    listed = split_csv(values, flag)
    for addr in listed:
        try:
            check_address("servers", addr)
        except errors.InvalidArgumentError as exc:
            raise click.BadParameter(exc.rule, param_hint=flag) from None
    return listed


@dataclass(frozen=True, slots=True)
class Conn:
    """Where and how long: the servers to try and the per-call timeout (seconds); the TLS
    files (PEM paths; all None: plaintext); and the credentials (all None: none)."""

    servers: tuple[str, ...]
    timeout_s: float
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # Credentials (docs/security.md): never shown by repr().
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(
        cls, servers: Sequence[str], timeout_s: float | None, **given: str | None
    ) -> Conn:
        """The command's ``-s``/``--timeout``, else the ones given before the command
        (``raftstream -s HOST:PORT stream ls``), else ``$RAFTSTREAM_SERVERS`` and 5 s, else
        ``127.0.0.1:7101``. ``given``: the command's ``user``/``password``/``token`` and
        ``tls_ca``/``tls_cert``/``tls_key``, each else the group's, else
        ``$RAFTSTREAM_USER`` (``_PASSWORD``, ``_TOKEN``, ``_TLS_CA``, ``_TLS_CERT``,
        ``_TLS_KEY``)."""
        meta = _group_meta()
        creds = {
            name: given.get(name) or meta.get(_META_AUTH + name) or os.environ.get(env) or None
            for name, env in AUTH_ENV.items()
        }
        flagged = {name: given.get(name) or meta.get(_META_TLS + name) for name in TLS_ENV}
        tls = {name: flagged[name] or os.environ.get(env) or None for name, env in TLS_ENV.items()}
        _check_tls(tls, from_env={n for n in TLS_ENV if tls[n] and not flagged[n]})
        env = os.environ.get(SERVERS_ENV, "").strip()  # set but empty: as if unset
        listed = (
            _servers(servers, "--server")
            or _servers(meta.get(_META_SERVERS, ()), "--server")
            or _servers([env] if env else [], f"${SERVERS_ENV}")
        )
        if timeout_s is None:
            timeout_s = meta.get(_META_TIMEOUT) or DEFAULT_TIMEOUT_S
        servers_ = tuple(listed or [DEFAULT_SERVERS])
        return cls(servers=servers_, timeout_s=timeout_s, **creds, **tls)

    async def connect(self) -> Client:
        """A connected client (the caller closes it); ``UnavailableError`` when no server
        answers within the timeout, ``InvalidArgumentError`` for an unreadable TLS file."""
        from raftstream.client import connect  # the SDK loads grpc: only when needed

        return await connect(
            list(self.servers),
            timeout=self.timeout_s,
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            user=self.user,
            password=self.password,
            token=self.token,
        )


def _check_tls(tls: Mapping[str, str | None], from_env: set[str]) -> None:
    """The TLS files as the SDK's ``connect`` reads them, read here first: one that cannot
    be read, is no PEM, or a certificate without its key (or a key that is not the
    certificate's) is a usage error naming the flag, or the variable it came from
    (``from_env``), with the SDK's rule; not exit 1 as a refusal."""
    if not any(tls.values()):
        return
    from raftstream._conn import tls_credentials  # grpc: only when TLS is asked for

    try:
        tls_credentials(ca=tls["tls_ca"], cert=tls["tls_cert"], key=tls["tls_key"])
    except errors.InvalidArgumentError as exc:
        hint = f"${TLS_ENV[exc.field]}" if exc.field in from_env else _tls_decl(exc.field)
        raise click.BadParameter(exc.rule, param_hint=hint) from None


def connection_options(f: Callable[..., R]) -> Callable[..., R]:
    """Add ``-s/--server``, ``--timeout``, ``--tls-ca/--tls-cert/--tls-key`` and
    ``--user/--password/--token``; the command receives them as ``conn: Conn``."""

    @functools.wraps(f)
    def wrapper(*args: Any, server: tuple[str, ...], timeout: float | None, **kwargs: Any) -> R:
        given = {name: kwargs.pop(name) for name in (*TLS_ENV, *AUTH_ENV)}
        return f(*args, conn=Conn.from_options(server, timeout, **given), **kwargs)

    for name in reversed(AUTH_ENV):
        wrapper = click.option(f"--{name}", name, **_auth_attrs(name))(wrapper)
    for name in reversed(TLS_ENV):
        wrapper = click.option(_tls_decl(name), name, **_tls_attrs(name))(wrapper)
    wrapper = click.option(*_TIMEOUT_DECLS, **_timeout_attrs())(wrapper)
    return click.option(*_SERVER_DECLS, **_server_attrs())(wrapper)


_SERVER_DECLS = ("-s", "--server")
_TIMEOUT_DECLS = ("--timeout",)
_META_AUTH = "raftstream.auth."
_AUTH_HELP = {
    "user": "User name for a cluster with [auth]",
    "password": "The user's password (prefer the environment variable: a flag shows in ps)",
    "token": "Token for a cluster with [auth], instead of a user and password",
}


def _auth_attrs(name: str) -> dict[str, Any]:
    return {"default": None, "help": f"{_AUTH_HELP[name]} (default: ${AUTH_ENV[name]})."}


_META_TLS = "raftstream.tls."
_TLS_HELP = {
    "tls_ca": "PEM file of the CA that signed the nodes' certificates",
    "tls_cert": "PEM file of this client's certificate (a TLS cluster requires one)",
    "tls_key": "PEM file of this client's private key",
}


def _tls_decl(name: str) -> str:
    return "--" + name.replace("_", "-")


def _tls_attrs(name: str) -> dict[str, Any]:
    return {
        "default": None,
        "metavar": "FILE",
        "help": f"{_TLS_HELP[name]} (default: ${TLS_ENV[name]}).",
    }


_META_SERVERS = "raftstream.servers"
_META_TIMEOUT = "raftstream.timeout_s"


def _server_attrs() -> dict[str, Any]:
    return {
        "multiple": True,
        "metavar": "HOST:PORT",
        "help": f"Server(s) to use, repeatable or comma-separated, each HOST:PORT with a "
        f"port 1-65535 (default: ${SERVERS_ENV}, same format, else {DEFAULT_SERVERS}).",
    }


def _timeout_attrs() -> dict[str, Any]:
    return {
        "type": click.FloatRange(min=0.01),
        "default": None,
        "help": f"Seconds each call may take, retries included (default {DEFAULT_TIMEOUT_S:g}).",
    }


def _group_meta() -> dict[str, Any]:
    ctx = click.get_current_context(silent=True)
    return ctx.meta if ctx is not None else {}


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value:
            ctx.meta[key] = value

    return store


def add_group_connection_options(group: click.Group) -> None:
    """Let ``-s``/``--timeout``/``--tls-*``/``--user``... come before the command too
    (``raftstream -s H:P stream ls``, as with the nats CLI); stored in the context's meta,
    read by ``Conn``, so the group's own callback is unchanged. A command's own options
    win."""
    group.params.append(
        click.Option(
            _SERVER_DECLS, expose_value=False, callback=_remember(_META_SERVERS), **_server_attrs()
        )
    )
    group.params.append(
        click.Option(
            _TIMEOUT_DECLS,
            expose_value=False,
            callback=_remember(_META_TIMEOUT),
            **_timeout_attrs(),
        )
    )
    for name in AUTH_ENV:
        group.params.append(
            click.Option(
                [f"--{name}"],
                expose_value=False,
                callback=_remember(_META_AUTH + name),
                **_auth_attrs(name),
            )
        )
    for name in TLS_ENV:
        group.params.append(
            click.Option(
                [_tls_decl(name)],
                expose_value=False,
                callback=_remember(_META_TLS + name),
                **_tls_attrs(name),
            )
        )


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def run(conn: Conn, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect, run ``body(client)``, close; a raftstream error becomes one line on stderr
    and exit code 1. Ctrl-C exits 130, SIGTERM 143: either cancels ``body`` first, so what
    it made for the command alone is removed on the way out as when it ends by itself (the
    ephemeral consumer of ``sub``, the ordered one of ``kv watch``, the stream of
    ``bench``); a second SIGTERM kills at once."""
    terminated = False

    async def main() -> T:
        if threading.current_thread() is threading.main_thread():
            loop, task = asyncio.get_running_loop(), asyncio.current_task()

            def on_sigterm() -> None:
                nonlocal terminated
                terminated = True
                loop.remove_signal_handler(signal.SIGTERM)  # the next one: the default
                if task is not None:
                    task.cancel()

            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        client = await conn.connect()
        try:
            return await body(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except errors.RaftStreamError as exc:
        fail(describe_error(exc))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except asyncio.CancelledError:
        if not terminated:
            raise
        click.echo("terminated", err=True)
        sys.exit(EXIT_TERMINATED)


def describe_error(exc: errors.RaftStreamError) -> str:
    """One line: the reason (NOT_FOUND, INVALID_ARGUMENT...) and the message; a validation
    error names its field and rule."""
    text = str(exc) or exc.reason
    if isinstance(exc, errors.InvalidArgumentError) and exc.field not in text:
        text = f"{exc.field}: {text}"
    return f"{exc.reason}: {text}"


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``raftstream: error: <message>`` on stderr and exit with ``code``."""
    click.echo(f"raftstream: error: {message}", err=True)
    sys.exit(code)


def confirm_or_refuse(question: str, force: bool) -> None:
    """Go on when ``force``; else ask on a terminal; without one, refuse (exit 2): a script
    must say ``-f`` rather than hang on a prompt nobody answers."""
    if force:
        return
    if not sys.stdin.isatty():
        fail(f"{question} needs confirmation and stdin is not a terminal: pass -f", EXIT_USAGE)
    if not click.confirm(question, default=False):
        fail("cancelled")


# -- values ----------------------------------------------------------------------------------


def parse_duration_ns(text: str) -> int:
    """``1h``, ``30s``, ``1m30s``, ``250ms``, ``2d`` ... as ns; a bare number is seconds.
    ``ValueError`` otherwise."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        return int(float(s) * NS_PER_S)
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS_NS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration: {text!r} (examples: 30s, 1h, 1m30s, 250ms)")
    return int(total)


def parse_size(text: str) -> int:
    """``1024``, ``512K``, ``1MB``, ``2GiB`` (K = 1024, as the nats CLI counts); ``-1`` or
    ``unlimited`` is -1. ``ValueError`` otherwise."""
    s = text.strip().lower()
    if s in _UNLIMITED_WORDS:
        return -1
    m = _SIZE_RE.match(s)
    if m is None:
        raise ValueError(f"not a size: {text!r} (examples: 1024, 512K, 1MB, -1)")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def parse_time_or_ago_ns(text: str, *, future: bool) -> int:
    """An RFC 3339 time, or a duration from now (ahead when ``future``, else ago), as ns
    since the epoch. ``ValueError`` otherwise."""
    if "T" in text and ("-" in text or ":" in text):
        try:
            return parse_rfc3339_ns(text, "time")
        except errors.InvalidArgumentError as exc:
            raise ValueError(str(exc)) from None
    delta = parse_duration_ns(text)
    return time.time_ns() + (delta if future else -delta)


def arg_bytes(text: str, param_hint: str) -> bytes:
    """Message data given as a command-line argument, as bytes: text, in UTF-8. Argv bytes
    the locale could not decode (a Latin-1 terminal under a UTF-8 locale; Python keeps
    them surrogate-escaped, as ``os.fsdecode`` does) come back exactly as they were
    given, as ``os.fsencode`` gives them.
    A lone surrogate no decoding of argv makes (a caller passing a ``str`` of its own) is
    a usage error naming ``param_hint``, not a traceback."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        raise click.BadParameter(f"not text: {exc.reason}", param_hint=param_hint) from None


def text_arg(text: str, param_hint: str) -> str:
    """``text`` when it is UTF-8 text. For what travels as a string (a header, a msg-id),
    unlike message data: argv bytes that are not UTF-8 are a usage error naming
    ``param_hint``, not a traceback when the request is encoded."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        msg = "not UTF-8 text (only message data may be binary)"
        raise click.BadParameter(msg, param_hint=param_hint) from None
    return text


def message_data(value: str | None, name: str) -> bytes:
    """A message's payload: the argument ``value`` (``arg_bytes``), or, when it is None,
    all of stdin byte for byte (never decoded: binary data is stored unchanged, as the
    nats CLI stores it). Stdin on a terminal is a usage error asking for ``name``."""
    if value is not None:
        return arg_bytes(value, name)
    if sys.stdin.isatty():
        raise click.UsageError(f"give {name} or pipe it on stdin")
    return sys.stdin.buffer.read()


class _Duration(click.ParamType[int, Any]):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The value in its unit (ns or bytes); a usage error names the bad text."""
        if isinstance(value, int):
            return value
        try:
            return parse_duration_ns(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Size(click.ParamType[int, Any]):
    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The value in its unit (ns or bytes); a usage error names the bad text."""
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = _Duration()
SIZE = _Size()


# -- formatting ------------------------------------------------------------------------------


def fmt_bytes(n: int) -> str:
    """1536 -> ``1.5 KiB``; negative (unlimited) -> ``unlimited``."""
    if n < 0:
        return "unlimited"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable: the loop returns at TiB


def fmt_duration_ns(ns: int) -> str:
    """ns as ``1h2m3s`` / ``250ms`` / ``13.6ms`` (three significant digits below a second;
    the JSON output has the exact ns); 0 -> ``0s``."""
    if ns <= 0:
        return "0s"
    if ns < 1000:
        return f"{ns}ns"
    if ns < NS_PER_S - 500_000:  # below what rounds to 1000ms
        return f"{ns / 1_000_000:.3g}ms"
    ns = max(ns, NS_PER_S)
    seconds = ns // NS_PER_S
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)


def fmt_time_ns(ns: int) -> str:
    """RFC 3339 UTC, or ``never`` for 0."""
    return format_rfc3339_ns(ns) if ns > 0 else "never"


def jsonable(value: Any) -> Any:
    """A value as plain JSON data: configs in their JetStream JSON (``to_dict``), other
    dataclasses field by field, enums by value, bytes as text when they are UTF-8, else
    base64. The one convention for message data in JSON (``stream get``, ``sub``,
    ``consumer next``, ``kv get``/``history``/``watch``; docs/cli.md)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value


def echo_json(value: Any) -> None:
    """Print ``value`` (see ``jsonable``) as indented JSON on stdout."""
    click.echo(json.dumps(jsonable(value), indent=2, sort_keys=False))


def echo_raw(data: bytes, *, nl: bool = False) -> None:
    """Write ``data`` (``--raw``) to stdout's binary buffer unchanged: never decoded, so
    binary values come out byte for byte; a newline after it only when ``nl`` (to
    separate messages of a stream of them)."""
    click.echo(data + b"\n" if nl else data, nl=False)


def _is_terminal() -> bool:
    """Whether stdout is a terminal (rich output) rather than a pipe (plain)."""
    return sys.stdout.isatty()


def print_table(title: str | None, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table: rich on a terminal, plain aligned columns (header first) otherwise."""
    cells = [[str(c) for c in row] for row in rows]
    if _is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, header_style="bold")
        for h in headers:
            table.add_column(h, overflow="fold")  # narrow terminals: wrap, never cut
        for row in cells:
            table.add_row(*row)
        Console().print(table)
        return
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    if title:
        click.echo(title)
    for row in [list(headers), *cells]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def print_fields(title: str, pairs: Sequence[tuple[str, Any]]) -> None:
    """``name: value`` lines under a title (a two-column rich table on a terminal)."""
    if _is_terminal():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=False, box=None, title_justify="left")
        table.add_column(style="bold", justify="right")
        table.add_column(overflow="fold")
        for key, value in pairs:
            table.add_row(key, str(value))
        Console().print(table)
        return
    click.echo(title)
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        click.echo(f"  {key.rjust(width)}: {value}")


CLI_EPILOG = """\b
Examples:
  raftstream server --local-cluster 3
  raftstream stream add ORDERS --subjects 'orders.>' --replicas 3
  raftstream pub orders.eu 'order {{Count}}' --count 10
  raftstream consumer add ORDERS worker && raftstream consumer next ORDERS worker --ack
\b
Client commands take -s/--server HOST:PORT (repeatable or comma-separated; default
$RAFTSTREAM_SERVERS, else 127.0.0.1:7101), --timeout SECONDS, for a TLS cluster
--tls-ca/--tls-cert/--tls-key FILE ($RAFTSTREAM_TLS_CA, _CERT, _KEY) and, for a cluster with
[auth], --user/--password or --token ($RAFTSTREAM_USER, _PASSWORD, _TOKEN), after the
command or before it; read commands take --json. Every command's --help shows an example.
Exit codes: 0 success, 1 error (refused, not found, unreachable), 2 usage error.
"""


def seq_runs(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sequences (any order, repeats ignored) as ascending (first, last) runs of
    consecutive ones: ``[3, 1, 2, 7]`` is ``[(1, 3), (7, 7)]``."""
    runs: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs
