"""Ack tokens and ack payloads (JetStream ADR-15, "JSAck" and "Ack Handling")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftstream.engine.ack import (
    AckCommand,
    AckKind,
    AckMetadata,
    build_ack_subject,
    encode_ack_payload,
    parse_ack_payload,
    parse_ack_subject,
)
from raftstream.errors import InvalidArgumentError


def test_v2_token_parses_every_field() -> None:
    """ADR-15 v2: $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>
    .<timestamp>.<pending>."""
    m = parse_ack_subject("$JS.ACK.hub.ACC.ORDERS.worker.2.100.7.1700000000000000000.42")
    assert m == AckMetadata(
        domain="hub",
        account="ACC",
        stream="ORDERS",
        consumer="worker",
        num_delivered=2,
        stream_seq=100,
        consumer_seq=7,
        timestamp=1_700_000_000_000_000_000,
        num_pending=42,
    )


def test_domain_underscore_means_no_domain() -> None:
    """ADR-15: the server writes ``_`` when there is no domain; clients expose it as none."""
    assert parse_ack_subject("$JS.ACK._.ACC.S.C.1.2.3.4.5").domain is None


def test_v1_nine_token_form_is_accepted() -> None:
    """ADR-15 v1 (legacy, 9 tokens) must still parse; it has no domain and no account."""
    m = parse_ack_subject("$JS.ACK.S.C.1.2.3.4.5")
    assert (m.stream, m.consumer, m.num_delivered, m.stream_seq) == ("S", "C", 1, 2)
    assert (m.consumer_seq, m.timestamp, m.num_pending) == (3, 4, 5)
    assert m.domain is None and m.account is None


def test_tokens_after_the_eleventh_are_ignored() -> None:
    """ADR-15: new tokens may be appended to the v2 form; clients accept 11 or more."""
    m = parse_ack_subject("$JS.ACK._.ACC.S.C.1.2.3.4.5.random.more")
    assert m.num_pending == 5


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.S.C.1.2.3.4",  # 8 tokens
        "$JS.ACK.S.C.1.2.3.4.5.6",  # 10 tokens
        "$JS.NAK.S.C.1.2.3.4.5",  # wrong prefix
        "JS.ACK.S.C.1.2.3.4.5",
        "$JS.ACK.S.C.x.2.3.4.5",  # not a number
        "$JS.ACK.S.C.1.-2.3.4.5",  # negative
        "$JS.ACK.S.C.1.+2.3.4.5",
        "$JS.ACK._.ACC.S.C.1.2.3.4.five",
        "$JS.ACK..C.1.2.3.4.5",  # empty stream token
        "",
    ],
)
def test_malformed_tokens_are_refused(subject: str) -> None:
    """ADR-15: anything but 9 or 11+ tokens of the right types is an error."""
    with pytest.raises(InvalidArgumentError) as info:
        parse_ack_subject(subject)
    assert info.value.field == "ack_subject"


_names = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_u64 = st.integers(0, 2**64 - 1)


@given(_names, _names, _names | st.none(), _u64, _u64, _u64, _u64, _u64)
def test_build_then_parse_round_trips(
    stream: str, consumer: str, domain: str | None, n: int, s: int, c: int, t: int, p: int
) -> None:
    """Every token the server builds parses back to the same metadata."""
    subject = build_ack_subject(
        stream=stream,
        consumer=consumer,
        num_delivered=n,
        stream_seq=s,
        consumer_seq=c,
        timestamp=t,
        num_pending=p,
        domain=domain,
    )
    m = parse_ack_subject(subject)
    assert (m.stream, m.consumer, m.num_delivered, m.stream_seq) == (stream, consumer, n, s)
    assert (m.consumer_seq, m.timestamp, m.num_pending) == (c, t, p)
    assert m.domain == (None if domain in (None, "_") else domain)


def test_build_refuses_bad_tokens() -> None:
    """Names with '.' would shift the token positions: refused."""
    with pytest.raises(InvalidArgumentError):
        build_ack_subject(
            stream="a.b",
            consumer="c",
            num_delivered=1,
            stream_seq=1,
            consumer_seq=1,
            timestamp=1,
            num_pending=0,
        )


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"", AckCommand(kind=AckKind.ACK)),
        (b"+ACK", AckCommand(kind=AckKind.ACK)),
        (b"-NAK", AckCommand(kind=AckKind.NAK)),
        (b'-NAK {"delay": 2000000000}', AckCommand(kind=AckKind.NAK, delay_ns=2_000_000_000)),
        (b"-NAK 1.5s", AckCommand(kind=AckKind.NAK, delay_ns=1_500_000_000)),
        (b"-NAK 250ms", AckCommand(kind=AckKind.NAK, delay_ns=250_000_000)),
        (b"+WPI", AckCommand(kind=AckKind.PROGRESS)),
        (b"+TERM", AckCommand(kind=AckKind.TERM)),
        (b"+TERM bad payload", AckCommand(kind=AckKind.TERM, reason="bad payload")),
        (b"+NXT", AckCommand(kind=AckKind.NEXT)),
        (b"+NXT 5", AckCommand(kind=AckKind.NEXT, next_request={"batch": 5})),
        (
            b'+NXT {"batch": 2, "no_wait": true}',
            AckCommand(kind=AckKind.NEXT, next_request={"batch": 2, "no_wait": True}),
        ),
    ],
)
def test_ack_payloads(payload: bytes, expected: AckCommand) -> None:
    """The ack kinds of ADR-15 (+ACK, -NAK with an optional delay, +WPI, +TERM with a reason)
    and +NXT; an empty payload acks, as in JetStream."""
    cmd = parse_ack_payload(payload)
    assert cmd == expected
    assert parse_ack_payload(encode_ack_payload(cmd)) == cmd


@pytest.mark.parametrize(
    "payload",
    [b"+OK", b"+ACK now", b"-NAK soon", b'-NAK {"delay": -1}', b"-NAK {", b"+NXT [1]", b"\xff"],
)
def test_bad_payloads_are_refused(payload: bytes) -> None:
    """Unknown kinds and bad arguments are refused naming ack_payload."""
    with pytest.raises(InvalidArgumentError) as info:
        parse_ack_payload(payload)
    assert info.value.field == "ack_payload"
