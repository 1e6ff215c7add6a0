"""Rules for the names the cluster layer adds: node (peer) names and account names, the
default account, and the Raft group ids made of them.

Both end up inside identifiers and keys (a group id is ``S:<account>:<stream>``, a node name
is a Raft node id and a metrics label), so the rules keep them printable and unambiguous.
Stream and consumer names keep their own rules (``engine/stream_config.py``,
``engine/consumer_config.py``).
"""

from __future__ import annotations

from raftstream.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_ACCOUNT",
    "NAME_BYTES_MAX",
    "split_group_id",
    "stream_group_id",
    "validate_account",
    "validate_node_name",
]

# The account every stream and consumer belongs to until authentication lands (issue 10);
# JetStream's global account has the same name.
DEFAULT_ACCOUNT = "$G"


NAME_BYTES_MAX = 255
# ':' separates the parts of a group id; '.', '*', '>' would break a subject that carries the
# name; '/' and '\\' a path; ',' and '=' the ``--peers n1=host:port,...`` syntax.
_ACCOUNT_FORBIDDEN = frozenset(":.*>/\\")
_NODE_FORBIDDEN = frozenset(":.*>/\\,=")


def _check(value: object, field: str, forbidden: frozenset[str]) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(field, "must be a non-empty string")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise InvalidArgumentError(field, "must not contain whitespace or control characters")
    bad = sorted(set(value) & forbidden)
    if bad:
        raise InvalidArgumentError(field, f"must not contain {''.join(bad)!r}")
    try:
        size_bytes = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgumentError(field, "must be valid UTF-8") from None
    if size_bytes > NAME_BYTES_MAX:
        raise InvalidArgumentError(field, f"must be at most {NAME_BYTES_MAX} bytes")
    return value


def validate_account(value: object, field: str = "account") -> str:
    """An account name: printable, no whitespace, none of ``: . * > / \\``."""
    return _check(value, field, _ACCOUNT_FORBIDDEN)


def validate_node_name(value: object, field: str = "name") -> str:
    """A node name: printable, no whitespace, none of ``: . * > / \\ , =``."""
    return _check(value, field, _NODE_FORBIDDEN)


def stream_group_id(account: str, stream: str) -> str:
    """The Raft group id of a stream: ``S:<account>:<stream>`` (docs/cluster-design.md).

    Unambiguous because account names may not contain ``:`` (stream names may).
    """
    return f"S:{account}:{stream}"


def split_group_id(group: str) -> tuple[str, str] | None:
    """``(account, stream)`` of a stream group's id (``stream_group_id``'s inverse); None
    for any other group (the meta group)."""
    kind, sep, rest = group.partition(":")
    if kind != "S" or not sep:
        return None
    account, sep, stream = rest.partition(":")
    return (account, stream) if sep else None
