"""A stream's ``subject_transform``: JetStream's subject mapping applied before storing.

Moved here from ``stream_config.py`` (issue 34), which re-exports ``SubjectTransform``.
``SubjectTransform.validate`` checks a transform; ``apply`` rewrites a literal subject with
the compiled ``dest`` (compiled once per distinct transform and cached: it runs on every
publish).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from raftstream.engine.subjects import (
    FWC,
    PWC,
    subject_matches,
    tokenize,
    validate_filter,
    validate_subject,
)
from raftstream.errors import InvalidArgumentError

__all__ = ["SubjectTransform"]

_FUNC_TOKEN = re.compile(r"^\{\{\s*([A-Za-z]+)\s*\(([^()]*)\)\s*\}\}$")
_DOLLAR_TOKEN = re.compile(r"^\$([0-9]+)$")
# One destination token of a compiled transform: ("lit", text), ("wc", index),
# ("part", (buckets, index, ...)) or ("rest", 0) for a trailing '>'.
_Op = tuple[str, Any]


@dataclass(frozen=True, slots=True)
class SubjectTransform:
    """JetStream's stream ``subject_transform``: rewrite a matching subject before storing.

    ``src`` is a filter (empty means ``>``); ``dest`` is built token by token from literals
    and these JetStream mapping references to ``src``'s ``*`` tokens (numbered from 1):
    ``$n`` and ``{{wildcard(n)}}`` (the n-th ``*`` token), ``{{partition(p,n,...)}}`` (FNV-1a
    of the referenced tokens, concatenated, modulo ``p``, as JetStream computes it), and a
    trailing ``>`` when ``src`` ends in ``>`` (the tokens that ``>`` matched). JetStream's
    other mapping functions (split, slice, ...) and positional ``*`` in ``dest`` are refused
    by ``validate`` with a rule naming what is supported.
    """

    src: str
    dest: str

    def validate(self) -> None:
        """Raise ``InvalidArgumentError`` naming ``subject_transform.src``/``.dest``."""
        _compile(self.src or FWC, self.dest)

    def apply(self, subject: str) -> str:
        """The stored subject for literal ``subject``: transformed when ``src`` matches it,
        else unchanged. The transform must be valid (``validate``)."""
        src = self.src or FWC
        if not subject_matches(src, subject):
            return subject
        return _render(_compile(src, self.dest), tokenize(src), tokenize(subject))

    def to_dict(self) -> dict[str, str]:
        return {"src": self.src, "dest": self.dest}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SubjectTransform:
        for key in raw:
            if key not in ("src", "dest"):
                raise InvalidArgumentError(f"subject_transform.{key}", "unknown field")
        src = raw.get("src") or ""
        dest = raw.get("dest")
        if not isinstance(src, str):
            raise InvalidArgumentError("subject_transform.src", "must be a string")
        if not isinstance(dest, str):
            raise InvalidArgumentError("subject_transform.dest", "is required (a string)")
        return cls(src=src, dest=dest)


def _int_args(text: str, field_name: str) -> tuple[int, ...]:
    try:
        return tuple(int(a.strip()) for a in text.split(","))
    except ValueError:
        raise InvalidArgumentError(field_name, f"arguments must be integers: {text!r}") from None


def _compile_token(tok: str, wildcards: int, field_name: str) -> _Op:
    """One ``dest`` token to its op, with indexes checked against ``src``'s wildcards."""

    def index(i: int) -> int:
        if not 1 <= i <= wildcards:
            raise InvalidArgumentError(
                field_name, f"wildcard index {i} out of range (src has {wildcards} '*' tokens)"
            )
        return i

    if m := _DOLLAR_TOKEN.match(tok):
        return ("wc", index(int(m.group(1))))
    if m := _FUNC_TOKEN.match(tok):
        func, args = m.group(1).lower(), _int_args(m.group(2), field_name)
        if func == "wildcard" and len(args) == 1:
            return ("wc", index(args[0]))
        if func == "partition" and len(args) >= 2 and args[0] > 0:
            return ("part", (args[0], *(index(a) for a in args[1:])))
        raise InvalidArgumentError(
            field_name,
            f"unsupported mapping {tok!r}: supported are $n, {{{{wildcard(n)}}}} and "
            "{{partition(p,n,...)}} with p > 0",
        )
    if "{{" in tok or "}}" in tok:
        raise InvalidArgumentError(field_name, f"malformed mapping function: {tok!r}")
    if tok == PWC:
        raise InvalidArgumentError(
            field_name, "positional '*' is not supported in dest; use $n or {{wildcard(n)}}"
        )
    return ("lit", tok)


@lru_cache(maxsize=256)
def _compile(src: str, dest: str) -> tuple[_Op, ...]:
    """Check a transform and compile ``dest``; cached because it runs on every publish."""
    validate_filter(src, "subject_transform.src")
    dfield = "subject_transform.dest"
    if not dest:
        raise InvalidArgumentError(dfield, "is required")
    src_tokens = tokenize(src)
    dest_tokens = tokenize(dest)
    wildcards = src_tokens.count(PWC)
    ops: list[_Op] = []
    for i, tok in enumerate(dest_tokens):
        if tok == FWC:
            if i != len(dest_tokens) - 1 or src_tokens[-1] != FWC:
                raise InvalidArgumentError(
                    dfield, "'>' only as the last token, and only when src ends in '>'"
                )
            ops.append(("rest", 0))
        else:
            ops.append(_compile_token(tok, wildcards, dfield))
    # Every literal piece must make a valid subject; mapped tokens are valid by construction.
    validate_subject(".".join(t if op == "lit" else "x" for op, t in ops), dfield)
    return tuple(ops)


def _fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def _render(ops: tuple[_Op, ...], src: tuple[str, ...], subject: tuple[str, ...]) -> str:
    stars = [subject[i] for i, t in enumerate(src) if t == PWC]
    out: list[str] = []
    for op, arg in ops:
        if op == "lit":
            out.append(arg)
        elif op == "wc":
            out.append(stars[arg - 1])
        elif op == "part":
            key = "".join(stars[i - 1] for i in arg[1:]).encode()
            out.append(str(_fnv1a_32(key) % arg[0]))
        else:
            out.extend(subject[len(src) - 1 :])
    return ".".join(out)
