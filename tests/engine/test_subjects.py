"""Subjects: the validation rules, literal matching, overlap and subset checks.

Behaviour pinned here is JetStream's subject model (tokens separated by ``.``, ``*`` for one
token, ``>`` for one or more trailing tokens) with the stricter rules of issue 2: whitespace,
control characters and partial-token wildcards are refused, and user streams cannot capture
the reserved ``$JS``/``$JSC``/``$SYS``/``$NRG`` spaces.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftstream.engine.subjects import (
    SUBJECT_BYTES_MAX,
    has_wildcards,
    is_subset,
    subject_matches,
    subjects_collide,
    tokenize,
    validate_filter,
    validate_queue,
    validate_stream_subject,
    validate_subject,
)
from raftstream.errors import InvalidArgumentError

# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "subject",
    ["a", "orders", "orders.eu.new", "a-b_c.d~e", "$KV.bucket.key", "ünïcode.ключ", "1.2.3"],
)
def test_valid_literal_subjects_pass_unchanged(subject: str) -> None:
    """A literal subject of non-empty, wildcard-free tokens is accepted and returned as is."""
    assert validate_subject(subject) == subject
    assert validate_filter(subject) == subject


@pytest.mark.parametrize("subject", ["*", ">", "a.*", "a.>", "*.b.>", "*.*", "a.*.c"])
def test_filters_accept_whole_token_wildcards(subject: str) -> None:
    """Filters may use ``*`` anywhere and ``>`` as the last token."""
    assert validate_filter(subject) == subject
    assert has_wildcards(subject)


@pytest.mark.parametrize("subject", ["a.*", "a.>", "*", ">"])
def test_literal_subjects_refuse_wildcards(subject: str) -> None:
    """What is published is a literal subject: no wildcards at all."""
    with pytest.raises(InvalidArgumentError, match="literal"):
        validate_subject(subject)


@pytest.mark.parametrize("subject", ["", ".", "a.", ".a", "a..b", "a.b.", "..", "a.*..>"])
def test_empty_subject_or_token_is_refused(subject: str) -> None:
    """An empty subject or an empty token (leading, trailing or doubled dot) is invalid."""
    with pytest.raises(InvalidArgumentError, match="empty"):
        validate_filter(subject)


@pytest.mark.parametrize(
    "subject",
    ["a b", " a", "a ", "a.b\tc", "a\n", "a\r.b", "a\fb", "a\vb", "a\u00a0b", "a\u3000b"],
)
def test_whitespace_is_refused(subject: str) -> None:
    """Whitespace (ASCII or Unicode) anywhere in a subject is invalid."""
    with pytest.raises(InvalidArgumentError, match="whitespace"):
        validate_filter(subject)


@pytest.mark.parametrize("subject", ["a\x00b", "a.\x01", "\x1f", "a\x7fb"])
def test_control_characters_are_refused(subject: str) -> None:
    """NUL and other control characters are refused (JetStream refuses NUL in subjects)."""
    with pytest.raises(InvalidArgumentError, match="control"):
        validate_filter(subject)


@pytest.mark.parametrize("subject", ["a*", "*a", "a.b*", "a>", ">a", "a.*b.c", "a.b>.c", "**"])
def test_partial_token_wildcards_are_refused(subject: str) -> None:
    """A wildcard must be a whole token: ``a*`` is refused, not read as a literal."""
    with pytest.raises(InvalidArgumentError, match="whole tokens"):
        validate_filter(subject)


@pytest.mark.parametrize("subject", [">.a", "a.>.b", ">.>", ">.*"])
def test_full_wildcard_only_last(subject: str) -> None:
    """``>`` matches the rest of the subject, so it may only be the last token."""
    with pytest.raises(InvalidArgumentError, match="last token"):
        validate_filter(subject)


def test_length_limit_counts_utf8_bytes() -> None:
    """A subject may be SUBJECT_BYTES_MAX bytes (UTF-8), not one more."""
    at_limit = "a" * SUBJECT_BYTES_MAX
    assert validate_subject(at_limit) == at_limit
    with pytest.raises(InvalidArgumentError, match="at most"):
        validate_subject("a" * (SUBJECT_BYTES_MAX + 1))
    # 'é' is two bytes: half as many characters already reach the limit.
    two_byte = "é" * (SUBJECT_BYTES_MAX // 2)
    assert validate_subject(two_byte) == two_byte
    with pytest.raises(InvalidArgumentError, match="at most"):
        validate_subject(two_byte + "a")


@pytest.mark.parametrize("value", [None, 1, b"a.b", ["a"]])
def test_non_strings_are_refused(value: object) -> None:
    """Only ``str`` is a subject (bytes too: decoding is the caller's job)."""
    with pytest.raises(InvalidArgumentError, match="string"):
        validate_filter(value)


def test_lone_surrogate_is_a_clear_error() -> None:
    """A string that cannot be encoded as UTF-8 is refused with InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError, match="UTF-8"):
        validate_subject("a.\ud800")


def test_errors_name_the_field_and_rule() -> None:
    """Errors carry the field that failed (as the caller named it) and the rule broken."""
    with pytest.raises(InvalidArgumentError) as info:
        validate_filter("a..b", "config.subjects[2]")
    assert info.value.field == "config.subjects[2]"
    assert "empty tokens" in info.value.rule
    assert info.value.details["field"] == "config.subjects[2]"


@pytest.mark.parametrize(
    "subject", ["$JS", "$JS.API.>", "$JS.API.STREAM.CREATE.x", "$JSC.>", "$SYS.>", "$NRG.a.b"]
)
def test_stream_subjects_refuse_reserved_prefixes(subject: str) -> None:
    """A user stream may not capture the system's reserved ``$`` spaces."""
    with pytest.raises(InvalidArgumentError, match="reserved") as info:
        validate_stream_subject(subject)
    assert info.value.field == "subjects"
    # The same subject is a fine filter or publish subject: the rule is for streams only.
    validate_filter(subject)


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.EVENT.>",
        "$JS.EVENT.ADVISORY.>",
        "$JS.EVENT.ADVISORY.API",
        "$SYS.ACCOUNT.*.CONNECT",
        "$KV.orders.>",
        "$O.store.>",
        "$JSX.a",
        "JS.API.>",
        ">",
        "*.API.>",
        "orders.*",
    ],
)
def test_stream_subjects_outside_reserved_spaces_pass(subject: str) -> None:
    """JetStream lets streams capture advisories (``$JS.EVENT.>``) and account events, and
    KV/object-store spaces; only the whole first token is compared, so ``$JSX`` is free;
    wildcard first tokens are a stream-config matter, not a subject rule."""
    assert validate_stream_subject(subject) == subject


def test_stream_subject_exception_must_be_a_subset() -> None:
    """Overlapping an allowed space is not enough: ``$JS.*.>`` reaches into ``$JS.API``."""
    with pytest.raises(InvalidArgumentError, match="reserved"):
        validate_stream_subject("$JS.*.>")
    with pytest.raises(InvalidArgumentError, match="reserved"):
        validate_stream_subject("$JS.EVENT")


@pytest.mark.parametrize("queue", ["workers", "svc.v2", "q*"])
def test_queue_names_are_opaque_labels(queue: str) -> None:
    """Queue names only follow the character rules; their shape carries no meaning."""
    assert validate_queue(queue) == queue


@pytest.mark.parametrize("queue", ["", "a b", "q\x00", 3])
def test_queue_names_refuse_empty_whitespace_and_non_strings(queue: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        validate_queue(queue)
    assert info.value.field == "queue"


# ---------------------------------------------------------------------------------------------
# Matching, overlap and subsets: tables


@pytest.mark.parametrize(
    ("filter_", "subject", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.b", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("*.b", "a.b", True),
        ("*.*", "a.b", True),
        ("*", "a.b", False),
        ("a.>", "a.b", True),
        ("a.>", "a.b.c.d", True),
        ("a.>", "a", False),
        (">", "a", True),
        (">", "a.b.c", True),
        ("*.>", "a", False),
        ("*.>", "a.b", True),
        ("a.*.c.>", "a.x.c.d.e", True),
        ("a.*.c.>", "a.x.d.d", False),
    ],
)
def test_subject_matches_table(filter_: str, subject: str, expected: bool) -> None:
    """``*`` is exactly one token, ``>`` one or more trailing tokens, literals compare exactly."""
    assert subject_matches(filter_, subject) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "*.b", True),
        ("a.*", "b.*", False),
        ("a.>", "a", False),
        ("a.>", "a.b.c", True),
        ("a.>", "*.*", True),
        ("*", "a.b", False),
        ("*", ">", True),
        ("*.*", "a.>", True),
        ("*.*", "a", False),
        (">", "a.b.c", True),
        ("a.*.c", "a.b.>", True),
        ("a.*.c", "a.b.d", False),
        ("a.b.c", "a.b", False),
    ],
)
def test_subjects_collide_table(a: str, b: str, expected: bool) -> None:
    """Two filters collide when one literal subject is matched by both (stream overlap)."""
    assert subjects_collide(a, b) is expected
    assert subjects_collide(b, a) is expected


@pytest.mark.parametrize(
    ("sub", "sup", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.*", True),
        ("a.b", "a.>", True),
        ("a.b", ">", True),
        ("a.*", "a.>", True),
        ("a.>", "a.*", False),
        ("a.*", "a.b", False),
        ("a.>", ">", True),
        (">", "*.>", False),
        ("*.>", ">", True),
        ("a", "a.>", False),
        ("a.b.c", "a.*", False),
        ("a.*.*", "a.>", True),
        ("a.*.*", "a.*.>", True),
        ("*.b", "a.b", False),
    ],
)
def test_is_subset_table(sub: str, sup: str, expected: bool) -> None:
    """``sub`` is a subset of ``sup`` when every subject ``sub`` matches, ``sup`` matches."""
    assert is_subset(sub, sup) is expected


def test_tokenize_splits_on_dots() -> None:
    assert tokenize("a.*.>") == ("a", "*", ">")
    assert tokenize("a") == ("a",)
    assert not has_wildcards("a.b")


# ---------------------------------------------------------------------------------------------
# Properties, against brute-force oracles

# A small alphabet makes collisions frequent; "z" never appears in filters, so it stands for
# "any other token" when enumerating literal subjects.
_ALPHABET = ("a", "b", "c")
_WITNESS_TOKENS = (*_ALPHABET, "z")
_TOKENS_MAX = 4

literal_tokens = st.lists(st.sampled_from(_ALPHABET), min_size=1, max_size=_TOKENS_MAX)
literals = literal_tokens.map(".".join)


@st.composite
def filters(draw: st.DrawFn) -> str:
    """Valid filters over the small alphabet: literals, '*' anywhere, maybe a final '>'."""
    toks = draw(st.lists(st.sampled_from((*_ALPHABET, "*")), min_size=0, max_size=_TOKENS_MAX))
    if not toks or draw(st.booleans()):
        toks.append(">")
    return ".".join(toks)


def _regex_oracle(filter_: str) -> re.Pattern[str]:
    """An independent matcher: '*' is one dot-free run, '>' one or more of anything."""
    parts = [
        "[^.]+" if t == "*" else ".+" if t == ">" else re.escape(t) for t in filter_.split(".")
    ]
    return re.compile("^" + r"\.".join(parts) + "$")


def _universe(*subjects: str) -> list[str]:
    """Every literal subject over the witness alphabet, long enough to expose any
    difference between the given filters (one token longer than the longest)."""
    longest = max(len(s.split(".")) for s in subjects) + 1
    return [
        ".".join(toks)
        for n in range(1, longest + 1)
        for toks in itertools.product(_WITNESS_TOKENS, repeat=n)
    ]


@given(filters(), literals)
def test_property_matches_agrees_with_regex_oracle(filter_: str, subject: str) -> None:
    """subject_matches(f, s) iff the regex built from f matches s."""
    assert subject_matches(filter_, subject) is bool(_regex_oracle(filter_).match(subject))


@given(filters(), filters())
def test_property_collide_is_symmetric(a: str, b: str) -> None:
    assert subjects_collide(a, b) is subjects_collide(b, a)


@given(filters(), literals)
def test_property_literal_collides_iff_matched(filter_: str, subject: str) -> None:
    """For a literal s, collide(f, s) is exactly subject_matches(f, s)."""
    assert subjects_collide(filter_, subject) is subject_matches(filter_, subject)


@settings(max_examples=150)
@given(filters(), filters())
def test_property_collide_agrees_with_brute_force(a: str, b: str) -> None:
    """collide(a, b) iff some literal subject (enumerated) is matched by both."""
    witnessed = any(subject_matches(a, s) and subject_matches(b, s) for s in _universe(a, b))
    assert subjects_collide(a, b) is witnessed


@settings(max_examples=150)
@given(filters(), filters())
def test_property_subset_agrees_with_brute_force(a: str, b: str) -> None:
    """is_subset(a, b) iff no literal subject (enumerated) is matched by a but not by b."""
    counter = any(subject_matches(a, s) and not subject_matches(b, s) for s in _universe(a, b))
    assert is_subset(a, b) is not counter


@given(filters(), filters())
def test_property_subset_implies_collide(a: str, b: str) -> None:
    """A filter matches at least one subject, so a subset always overlaps its superset."""
    if is_subset(a, b):
        assert subjects_collide(a, b)


@st.composite
def _specialize(draw: st.DrawFn, filter_: str, *, literal: bool) -> str:
    """A filter (or, with ``literal``, a subject) matched within ``filter_``: each ``*`` may
    become a token, the final ``>`` one or more tokens (optionally still ending in ``>``)."""
    out: list[str] = []
    for tok in filter_.split("."):
        if tok == "*":
            out.append(draw(st.sampled_from(_ALPHABET if literal else (*_ALPHABET, "*"))))
        elif tok == ">":
            out.extend(draw(st.lists(st.sampled_from((*_ALPHABET, "*")), min_size=1, max_size=2)))
            if literal:
                out = [draw(st.sampled_from(_ALPHABET)) if t == "*" else t for t in out]
            elif draw(st.booleans()):
                out[-1] = ">"
        else:
            out.append(tok)
    return ".".join(out)


@st.composite
def subset_chains(draw: st.DrawFn) -> tuple[str, str, str]:
    """(sup, sub, subject): sub specializes sup, subject is a literal specializing sub."""
    sup = draw(filters())
    sub = draw(_specialize(sup, literal=False))
    subject = draw(_specialize(sub, literal=True))
    return sup, sub, subject


@given(subset_chains())
def test_property_subset_preserves_matches(chain: tuple[str, str, str]) -> None:
    """is_subset(a, b) and subject_matches(a, s) imply subject_matches(b, s)."""
    sup, sub, subject = chain
    assert is_subset(sub, sup)
    assert subject_matches(sub, subject)
    assert subject_matches(sup, subject)


@given(filters(), filters(), literals)
def test_property_subset_and_match_imply_match_on_random_triples(
    a: str, b: str, subject: str
) -> None:
    """The same implication on unrelated random triples (it holds vacuously when it must)."""
    if is_subset(a, b) and subject_matches(a, subject):
        assert subject_matches(b, subject)


@given(filters())
def test_property_subset_is_reflexive_and_generated_filters_are_valid(f: str) -> None:
    assert validate_filter(f) == f
    assert is_subset(f, f)
    assert is_subset(f, ">")
