"""Acknowledgements: the ack kinds, their payloads, and the ack token (reply subject) format.

A delivered message carries an ack token, a reply subject a client publishes its ack to
unchanged. Two token forms exist (JetStream ADR-15), both parsed here:

- v2, 11 tokens or more (tokens past the 11th are reserved and ignored)::

    $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<stream_seq>.<consumer_seq>.<timestamp>.<pending>

  where the domain ``_`` means "no domain";
- v1, exactly 9 tokens (legacy)::

    $JS.ACK.<stream>.<consumer>.<delivered>.<stream_seq>.<consumer_seq>.<timestamp>.<pending>

``<timestamp>`` is the message's stored time in ns since the epoch. Anything else (another
prefix, 10 tokens, a numeric token that is not a non-negative decimal integer, an empty
token) is refused with ``InvalidArgumentError`` naming ``ack_subject`` and the rule broken.

Ack payloads: ``+ACK`` (an empty payload is an ack too), ``-NAK`` optionally followed by a
delay (``{"delay": <ns>}`` or a duration such as ``1.5s``/``500ms``), ``+WPI`` (work in
progress), ``+TERM`` optionally followed by a reason, and ``+NXT`` optionally followed by a
pull request (``{"batch": n, ...}`` or a bare batch size).
"""

from __future__ import annotations

import enum
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from raftstream.errors import InvalidArgumentError

__all__ = [
    "ACK_PREFIX",
    "NO_DOMAIN",
    "AckCommand",
    "AckKind",
    "AckMetadata",
    "build_ack_subject",
    "encode_ack_payload",
    "parse_ack_payload",
    "parse_ack_subject",
]

ACK_PREFIX = "$JS.ACK"
NO_DOMAIN = "_"
V1_TOKENS = 9
V2_TOKENS_MIN = 11
ACK_PAYLOAD_BYTES_MAX = 4096


class AckKind(enum.StrEnum):
    """The ack kinds, valued as their wire payload."""

    ACK = "+ACK"
    NAK = "-NAK"
    PROGRESS = "+WPI"
    TERM = "+TERM"
    NEXT = "+NXT"


class AckMetadata(NamedTuple):
    """What an ack token says about one delivery.

    ``domain`` and ``account`` are None for the 9-token form; ``domain`` is None as well when
    the token carries ``_`` (no domain). ``timestamp`` is ns since the epoch.

    A named tuple, where the engine's other values are frozen dataclasses: one is made for
    every ack a node receives, and a tuple is made in a fraction of a frozen dataclass's
    time (which sets each field through a guarded ``__setattr__``). Immutable all the same.
    """

    stream: str
    consumer: str
    num_delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp: int
    num_pending: int
    domain: str | None = None
    account: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AckCommand:
    """A parsed ack payload.

    ``delay_ns`` is set for ``-NAK`` with a delay (0: redeliver at once); ``reason`` for
    ``+TERM``; ``next_request`` for ``+NXT`` (the pull request's JSON object, or None for the
    default of one message).
    """

    kind: AckKind
    delay_ns: int = 0
    reason: str = ""
    next_request: dict[str, Any] | None = None


def _bad(rule: str) -> InvalidArgumentError:
    return InvalidArgumentError("ack_subject", rule)


# A character a name token must not hold (one regex search: this runs on every ack).
_BAD_TOKEN_CHAR = re.compile(r"[ \t\r\n.*>]")
# The v2 token with exactly 11 tokens, every rule checked (what the server builds): the
# common case, read in one match; anything else takes the token-by-token path.
_NAME = r"([^ \t\r\n.*>]+)"
_NUM = r"([0-9]+)"
_V2_EXACT = re.compile(r"\$JS\.ACK\." + r"\.".join((_NAME,) * 4 + (_NUM,) * 5))


def _check_token(value: str, what: str) -> str:
    if not value or _BAD_TOKEN_CHAR.search(value):
        raise _bad(f"{what} token must be a non-empty name without '.', wildcards or spaces")
    return value


def build_ack_subject(
    *,
    stream: str,
    consumer: str,
    num_delivered: int,
    stream_seq: int,
    consumer_seq: int,
    timestamp: int,
    num_pending: int,
    domain: str | None = None,
    account: str = "_",
) -> str:
    """The v2 (11-token) ack token for one delivery; ``domain`` None is written as ``_``."""
    if min(num_delivered, stream_seq, consumer_seq, timestamp, num_pending) < 0:
        raise _bad("numeric tokens must not be negative")
    head = _token_head(domain or NO_DOMAIN, account, stream, consumer)
    return f"{head}.{num_delivered}.{stream_seq}.{consumer_seq}.{timestamp}.{num_pending}"


@functools.lru_cache(maxsize=1024)
def _token_head(domain: str, account: str, stream: str, consumer: str) -> str:
    """``$JS.ACK.<domain>.<account>.<stream>.<consumer>``, its names checked; cached, as a
    consumer's deliveries all share it (one token is built per delivery)."""
    names = (
        _check_token(domain, "domain"),
        _check_token(account, "account"),
        _check_token(stream, "stream"),
        _check_token(consumer, "consumer"),
    )
    return ".".join((ACK_PREFIX, *names))


def _number(token: str, what: str) -> int:
    # Only plain decimal digits: int() would also take "+1", " 1" or "1_000".
    if not token.isascii() or not token.isdigit():
        raise _bad(f"{what} must be a non-negative decimal integer, got {token!r}")
    return int(token)


def _v2_metadata(
    domain: str,
    account: str,
    stream: str,
    consumer: str,
    delivered: str,
    stream_seq: str,
    consumer_seq: str,
    timestamp: str,
    pending: str,
) -> AckMetadata:
    """The ``AckMetadata`` of a v2 token's checked groups (positional: this runs on every
    ack). The same value as ``AckMetadata(...)`` with keywords."""
    return AckMetadata(
        stream,
        consumer,
        int(delivered),
        int(stream_seq),
        int(consumer_seq),
        int(timestamp),
        int(pending),
        None if domain == NO_DOMAIN else domain,
        account,
    )


def parse_ack_subject(subject: str) -> AckMetadata:
    """Parse a v1 (9-token) or v2 (11+-token) ack token into its metadata.

    Raises ``InvalidArgumentError`` (field ``ack_subject``) for anything else.
    """
    if not isinstance(subject, str):
        raise _bad("must be a string")
    m = _V2_EXACT.fullmatch(subject)
    if m is not None:
        return _v2_metadata(*m.groups())
    tokens = subject.split(".")
    if len(tokens) < 2 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise _bad(f"must start with {ACK_PREFIX}.")
    n = len(tokens)
    if n == V1_TOKENS:
        domain, account, rest = None, None, tokens[2:]
    elif n >= V2_TOKENS_MIN:
        raw_domain = _check_token(tokens[2], "domain")
        domain = None if raw_domain == NO_DOMAIN else raw_domain
        account, rest = _check_token(tokens[3], "account"), tokens[4:11]
    else:
        raise _bad(f"must have 9 tokens or at least 11, got {n}")
    return AckMetadata(
        stream=_check_token(rest[0], "stream"),
        consumer=_check_token(rest[1], "consumer"),
        num_delivered=_number(rest[2], "delivered count"),
        stream_seq=_number(rest[3], "stream sequence"),
        consumer_seq=_number(rest[4], "consumer sequence"),
        timestamp=_number(rest[5], "timestamp"),
        num_pending=_number(rest[6], "pending count"),
        domain=domain,
        account=account,
    )


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)$")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9}
_UNIT_NS["h"] = 3600 * 10**9


def _payload_error(rule: str) -> InvalidArgumentError:
    return InvalidArgumentError("ack_payload", rule)


def _parse_delay(text: str) -> int:
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError:
            raise _payload_error('-NAK delay must be JSON like {"delay": ns}') from None
        delay = obj.get("delay", 0) if isinstance(obj, dict) else None
        if not isinstance(delay, int) or isinstance(delay, bool) or delay < 0:
            raise _payload_error("-NAK delay must be a non-negative integer of ns")
        return delay
    m = _DURATION_RE.match(text)
    if m is None:
        raise _payload_error(f"-NAK delay must be a duration like 1s or 500ms, got {text!r}")
    return int(float(m.group(1)) * _UNIT_NS[m.group(2)])


def _parse_next(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    if text.isdigit():
        return {"batch": int(text)}
    try:
        obj = json.loads(text)
    except ValueError:
        raise _payload_error("+NXT takes a batch size or a JSON pull request") from None
    if not isinstance(obj, dict):
        raise _payload_error("+NXT pull request must be a JSON object")
    return obj


def parse_ack_payload(payload: bytes) -> AckCommand:
    """Parse an ack payload; an empty payload is ``+ACK`` (as in JetStream).

    Raises ``InvalidArgumentError`` (field ``ack_payload``) for an unknown kind or a bad
    argument.
    """
    if len(payload) > ACK_PAYLOAD_BYTES_MAX:
        raise _payload_error(f"must be at most {ACK_PAYLOAD_BYTES_MAX} bytes")
    try:
        text = payload.decode().strip()
    except UnicodeDecodeError:
        raise _payload_error("must be UTF-8") from None
    if not text:
        return AckCommand(kind=AckKind.ACK)
    head, _, arg = text.partition(" ")
    arg = arg.strip()
    try:
        kind = AckKind(head)
    except ValueError:
        raise _payload_error(f"unknown ack kind {head!r}") from None
    if kind is AckKind.NAK:
        return AckCommand(kind=kind, delay_ns=_parse_delay(arg) if arg else 0)
    if kind is AckKind.TERM:
        return AckCommand(kind=kind, reason=arg)
    if kind is AckKind.NEXT:
        return AckCommand(kind=kind, next_request=_parse_next(arg))
    if arg:
        raise _payload_error(f"{kind.value} takes no argument")
    return AckCommand(kind=kind)


def encode_ack_payload(cmd: AckCommand) -> bytes:
    """The wire payload of ``cmd`` (inverse of ``parse_ack_payload``)."""
    if cmd.kind is AckKind.NAK and cmd.delay_ns:
        return f'-NAK {{"delay": {cmd.delay_ns}}}'.encode()
    if cmd.kind is AckKind.TERM and cmd.reason:
        return f"+TERM {cmd.reason}".encode()
    if cmd.kind is AckKind.NEXT and cmd.next_request is not None:
        return ("+NXT " + json.dumps(cmd.next_request, sort_keys=True)).encode()
    return cmd.kind.value.encode()
