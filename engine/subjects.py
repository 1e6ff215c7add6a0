"""Subjects: validation, matching, overlap and subset checks.

A subject is a string of tokens separated by ``.``. Filters may use two wildcards, each a whole
token: ``*`` matches exactly one token and ``>`` matches one or more tokens and may only be
the last token. Literal subjects (what is published) carry no wildcards.

Rules (checked by ``validate_*``, each failure an InvalidArgumentError naming the field):

- a subject is a non-empty ``str`` of valid UTF-8, at most ``SUBJECT_BYTES_MAX`` bytes;
- no whitespace (any Unicode whitespace) and no control characters (NUL included) anywhere;
- no empty token (``a..b``, ``.a``, ``a.``);
- a wildcard is a whole token: ``a*`` or ``b>`` is refused rather than read as a literal, so
  that a typo never silently becomes a subject nobody publishes to;
- ``>`` only as the last token (``>.a`` is refused);
- literal subjects (``validate_subject``) carry no wildcards at all;
- a user stream (``validate_stream_subject``) may not capture the system's reserved spaces.

Matching functions (``subject_matches``, ``subjects_collide``, ``is_subset``,
``first_overlap``, ``OverlapIndex``) assume their arguments were validated; on unvalidated
input they answer without raising, but the answer has no meaning. The functions here are
pure and safe to call from any thread (an ``OverlapIndex`` is immutable).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from raftstream.errors import InvalidArgumentError

__all__ = [
    "FWC",
    "PWC",
    "RESERVED_ALLOWED",
    "RESERVED_PREFIXES",
    "SUBJECT_BYTES_MAX",
    "OverlapIndex",
    "first_overlap",
    "has_wildcards",
    "is_subset",
    "subject_matches",
    "subjects_collide",
    "tokenize",
    "validate_filter",
    "validate_queue",
    "validate_stream_subject",
    "validate_subject",
]

PWC = "*"
FWC = ">"
SUBJECT_BYTES_MAX = 4096
# Subject spaces that belong to the system. raftstream's API is gRPC, not subjects, but the
# names are kept free so that tools written for JetStream never see a user stream there.
RESERVED_PREFIXES = ("$JS", "$JSC", "$SYS", "$NRG")
# Inside the reserved spaces, JetStream lets a stream capture its advisories and account
# events (a common monitoring set-up); a stream subject that is a subset of one of these is
# accepted.
RESERVED_ALLOWED = ("$JS.EVENT.>", "$SYS.ACCOUNT.>")
# Unicode whitespace plus the C0 controls and DEL: a NUL or a newline inside a subject is a
# framing bug upstream, never a name someone meant.
_FORBIDDEN_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
# Tokenizing is on the publish path; a small bounded cache keeps repeated subjects cheap
# without letting a stream of distinct (possibly 4 KiB) subjects pin much memory.
_TOKENIZE_CACHE_ENTRIES_MAX = 8192


@lru_cache(maxsize=_TOKENIZE_CACHE_ENTRIES_MAX)
def tokenize(subject: str) -> tuple[str, ...]:
    """Split a subject into its tokens (no validation; see ``validate_*``).

    The returned tuple is shared between callers (it is cached) and immutable.
    """
    return tuple(subject.split("."))


def has_wildcards(subject: str) -> bool:
    """True when any token is ``*`` or ``>``."""
    return any(t in (PWC, FWC) for t in tokenize(subject))


def _check_text(subject: object, field: str) -> str:
    """The character-level rules: type, non-empty, UTF-8, byte length, forbidden characters."""
    if not isinstance(subject, str):
        raise InvalidArgumentError(field, "must be a string")
    if not subject:
        raise InvalidArgumentError(field, "must not be empty")
    try:
        size_bytes = len(subject.encode("utf-8"))
    except UnicodeEncodeError:
        # Lone surrogates: the subject could never be stored or sent as UTF-8.
        raise InvalidArgumentError(field, f"must be valid UTF-8: {subject!r}") from None
    if size_bytes > SUBJECT_BYTES_MAX:
        raise InvalidArgumentError(field, f"must be at most {SUBJECT_BYTES_MAX} bytes")
    if _FORBIDDEN_CHARS.search(subject):
        raise InvalidArgumentError(
            field, f"must not contain whitespace or control characters: {subject!r}"
        )
    return subject


def _check_tokens(subject: str, field: str, *, wildcards: bool) -> None:
    """The token-level rules: no empty token, wildcards whole and well placed."""
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


def _check(subject: object, field: str, *, wildcards: bool) -> str:
    s = _check_text(subject, field)
    _check_tokens(s, field, wildcards=wildcards)
    return s


def validate_subject(subject: object, field: str = "subject") -> str:
    """Check a literal subject (as published); raise InvalidArgumentError naming ``field``."""
    return _check(subject, field, wildcards=False)


def validate_filter(subject: object, field: str = "filter_subject") -> str:
    """Check a subject filter (wildcards allowed); raise InvalidArgumentError naming ``field``."""
    return _check(subject, field, wildcards=True)


def validate_queue(queue: object, field: str = "queue") -> str:
    """Check a queue group name: the character rules of a subject, any token shape.

    Queue names are opaque labels (``workers``, ``svc.v2``), so wildcard characters and dots
    carry no meaning in them; only emptiness, size and whitespace/control characters matter.
    """
    return _check_text(queue, field)


def validate_stream_subject(subject: object, field: str = "subjects") -> str:
    """Check a subject a user stream captures: a filter outside the reserved spaces.

    A subject is refused when its first token is one of ``RESERVED_PREFIXES`` (``$JS``,
    ``$JS.API.>``, ``$SYS.x``...), unless it is a subset of one of ``RESERVED_ALLOWED``. As in
    JetStream, a wildcard first token (``>``, ``*.API.>``) is not refused here: such a stream
    captures far more than the reserved space, and whether that is allowed is a stream
    configuration rule, not a subject rule.
    """
    s = validate_filter(subject, field)
    first = tokenize(s)[0]
    if first in RESERVED_PREFIXES and not any(is_subset(s, ok) for ok in RESERVED_ALLOWED):
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
    """True when some literal subject is matched by both ``a`` and ``b`` (symmetric)."""
    if a == b:
        return True
    ta = tokenize(a)
    tb = tokenize(b)
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        # '>' absorbs the rest of the other side as long as it has at least one more token.
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
        # A '>' in ``sub`` also matches subjects longer than anything a non-'>' ``sup`` token
        # allows, and a '*' in ``sub`` matches tokens a literal ``sup`` token does not.
        if s == FWC:
            return False
        if p == PWC:
            continue
        if s != p:
            return False
    return len(ts) == len(tp)


class OverlapIndex:
    """A fixed list of filters, answering "which of them collide with this one?"
    (``subjects_collide``) with a few bitwise ANDs per token of the query instead of a
    comparison with each (issue 39: a pairwise check of a few thousand subjects held the
    event loop for seconds).

    Bit ``j`` of every mask stands for ``subjects[j]``. Per token position ``i`` the index
    keeps the filters with literal ``v`` there, with ``*``, with ``>``, with any token at all
    (``longer``), and with a ``>`` before it (those match anything from there on). Two
    filters collide when every position is compatible: equal literals, or a ``*`` on
    either side, or a ``>`` on either side from where it stands, with the other side not
    ended there. A query costs O(its tokens) big-integer ANDs of len(subjects) bits:
    the total for a list checked against itself is about the total of its tokens (bounded
    by the config's size), whatever wildcards it holds. Build one per check; immutable.
    """

    __slots__ = ("_all", "_fwc_before", "_literal", "_longer", "_pwc", "_subjects")

    def __init__(self, subjects: Sequence[str]) -> None:
        self._subjects = tuple(subjects)
        toks = [tokenize(s) for s in self._subjects]
        depth = max((len(t) for t in toks), default=0)
        literal: list[dict[str, int]] = [{} for _ in range(depth)]
        pwc = [0] * depth
        fwc = [0] * depth
        longer = [0] * (depth + 1)  # longer[depth] stays 0: nobody has a token there
        for j, tokens in enumerate(toks):
            bit = 1 << j
            for i, tok in enumerate(tokens):
                longer[i] |= bit
                if tok == PWC:
                    pwc[i] |= bit
                elif tok == FWC:
                    fwc[i] |= bit
                else:
                    literal[i][tok] = literal[i].get(tok, 0) | bit
        before = [0] * (depth + 1)  # before[i]: a '>' at a position below i
        for i in range(depth):
            before[i + 1] = before[i] | fwc[i]
        self._all = (1 << len(toks)) - 1
        self._literal = literal
        self._pwc = [p | f for p, f in zip(pwc, fwc, strict=True)]  # '>' takes a '*''s place
        self._longer = longer
        self._fwc_before = before

    def colliding(self, subject: str) -> int:
        """The mask of the filters ``subject`` collides with (0: none)."""
        depth = len(self._literal)
        before = self._fwc_before
        mask = self._all
        tokens = tokenize(subject)
        for i, tok in enumerate(tokens):
            if i >= depth:
                # Past every filter's last token: only those that ended in a '>' go on.
                return mask & before[depth]
            anything = before[i]  # their '>' came earlier: they match whatever is here
            if tok == FWC:
                return mask & (self._longer[i] | anything)  # theirs must not end before
            if tok == PWC:
                mask &= self._longer[i] | anything
            else:
                mask &= self._literal[i].get(tok, 0) | self._pwc[i] | anything
            if not mask:
                return 0
        # ``subject`` ends here: theirs must end here too, or have matched the rest by '>'.
        return mask & ~self._longer[len(tokens)]

    def first_colliding(self, subject: str) -> str | None:
        """The first filter (in list order) that ``subject`` collides with, or None."""
        mask = self.colliding(subject)
        return self._subjects[(mask & -mask).bit_length() - 1] if mask else None


def first_overlap(subjects: Sequence[str]) -> tuple[str, str] | None:
    """The first pair of ``subjects`` (``(subjects[i], subjects[j])``, ``i < j``, the
    smallest ``i`` then ``j``) that overlap (``subjects_collide``; a duplicate overlaps
    itself), or None: what comparing every pair in order answers, at the cost of an
    ``OverlapIndex`` query per subject. The subjects must be valid filters."""
    index = OverlapIndex(subjects)
    for i, s in enumerate(subjects):
        later = index.colliding(s) >> (i + 1)
        if later:
            return s, subjects[i + (later & -later).bit_length()]
    return None
