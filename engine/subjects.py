"""Subjects: validation, matching, overlap and subset checks.

A subject is a string of tokens separated by ``.``. Filters may use two wildcards, each a whole
token: ``*`` matches exactly one token and ``>`` matches one or more tokens and may only be
the last token. Literal subjects (what is published) carry no wildcards.
"""

from __future__ import annotations

from functools import lru_cache

from raftstream.errors import InvalidArgumentError

__all__ = [
    "FWC",
    "PWC",
    "RESERVED_PREFIXES",
    "SUBJECT_BYTES_MAX",
    "has_wildcards",
    "is_subset",
    "subject_matches",
    "subjects_collide",
    "tokenize",
    "validate_filter",
    "validate_stream_subject",
    "validate_subject",
]

PWC = "*"
FWC = ">"
SUBJECT_BYTES_MAX = 4096
# Subject spaces that belong to the system. raftstream's API is gRPC, not subjects, but the
# names are kept free so that tools written for JetStream never see a user stream there.
RESERVED_PREFIXES = ("$JS", "$JSC", "$SYS", "$NRG")
_WHITESPACE = frozenset(" \t\r\n\f\v")


@lru_cache(maxsize=65536)
def tokenize(subject: str) -> tuple[str, ...]:
    """Split a subject into its tokens (no validation; see ``validate_*``)."""
    return tuple(subject.split("."))


def has_wildcards(subject: str) -> bool:
    """True when any token is ``*`` or ``>``."""
    return any(t in (PWC, FWC) for t in tokenize(subject))


def _check(subject: object, field: str, *, wildcards: bool) -> str:
    if not isinstance(subject, str):
        raise InvalidArgumentError(field, "must be a string")
    if not subject:
        raise InvalidArgumentError(field, "must not be empty")
    if len(subject.encode("utf-8")) > SUBJECT_BYTES_MAX:
        raise InvalidArgumentError(field, f"must be at most {SUBJECT_BYTES_MAX} bytes")
    if any(c in _WHITESPACE for c in subject):
        raise InvalidArgumentError(field, f"must not contain whitespace: {subject!r}")
    tokens = tokenize(subject)
    last = len(tokens) - 1
    for i, tok in enumerate(tokens):
        if not tok:
            raise InvalidArgumentError(field, f"must not have empty tokens: {subject!r}")
        if tok in (PWC, FWC):
            if not wildcards:
                raise InvalidArgumentError(
                    field, f"must be a literal subject without wildcards: {subject!r}"
                )
            if tok == FWC and i != last:
                raise InvalidArgumentError(field, f"'>' may only be the last token: {subject!r}")
        elif PWC in tok or FWC in tok:
            raise InvalidArgumentError(field, f"wildcards must be whole tokens: {subject!r}")
    return subject


def validate_subject(subject: object, field: str = "subject") -> str:
    """Check a literal subject (as published); raise InvalidArgumentError naming ``field``."""
    return _check(subject, field, wildcards=False)


def validate_filter(subject: object, field: str = "filter_subject") -> str:
    """Check a subject filter (wildcards allowed)."""
    return _check(subject, field, wildcards=True)


def validate_stream_subject(subject: object, field: str = "subjects") -> str:
    """Check a subject a user stream captures: a filter outside the reserved spaces."""
    s = validate_filter(subject, field)
    first = tokenize(s)[0]
    if first in RESERVED_PREFIXES:
        raise InvalidArgumentError(
            field, f"{first!r} is a reserved subject prefix and cannot be captured: {s!r}"
        )
    return s


def subject_matches(filter_: str, subject: str) -> bool:
    """True when literal ``subject`` is matched by ``filter_`` (which may have wildcards)."""
    if filter_ == subject:
        return True
    ft = tokenize(filter_)
    st = tokenize(subject)
    for i, tok in enumerate(ft):
        if tok == FWC:
            return len(st) > i
        if i >= len(st):
            return False
        if tok != PWC and tok != st[i]:
            return False
    return len(ft) == len(st)


def subjects_collide(a: str, b: str) -> bool:
    """True when some literal subject is matched by both ``a`` and ``b``."""
    if a == b:
        return True
    ta = tokenize(a)
    tb = tokenize(b)
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == FWC:
            return y is not None
        if y == FWC:
            return x is not None
        if x is None or y is None:
            return False
        if x != y and x != PWC and y != PWC:
            return False
    return True


def is_subset(sub: str, sup: str) -> bool:
    """True when every literal subject matched by ``sub`` is also matched by ``sup``."""
    if sub == sup:
        return True
    ts = tokenize(sub)
    tp = tokenize(sup)
    for i, p in enumerate(tp):
        if p == FWC:
            return len(ts) > i
        if i >= len(ts):
            return False
        s = ts[i]
        if s == FWC:
            return False
        if p == PWC:
            continue
        if s != p:
            return False
    return len(ts) == len(tp)
