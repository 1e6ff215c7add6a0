"""A stream's ``mirror`` and ``sources``: where a stream copies its messages from.

JetStream's shape and names: a ``StreamSource`` names the origin stream, where to start
(``opt_start_seq`` or ``opt_start_time``: int nanoseconds since the epoch in Python, an RFC
3339 string in the JSON, as for consumers), which messages (``filter_subject`` or
``subject_transforms``, never both) and, for an origin in another cluster, ``external``
(``ExternalStream.api``: that cluster's client ``host:port`` addresses; JetStream names an
API prefix there, a NATS subject, which has no meaning over gRPC).

``source_key`` is the identity of a link in the replicated state: the origin's name, plus
its cluster's addresses when external. Two links with one key would copy into one position,
so ``check_links`` refuses duplicates. Cycle detection across streams lives in
``find_cycle``: the meta leader passes every stream of the account.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from raftstream.engine.consumer_config import format_rfc3339_ns, parse_rfc3339_ns
from raftstream.engine.subjects import validate_filter
from raftstream.errors import InvalidArgumentError

__all__ = [
    "API_ADDRS_MAX",
    "SOURCES_MAX",
    "ExternalStream",
    "StreamSource",
    "find_cycle",
    "source_key",
]

# Bounds on what one config may ask for: a few origins and a few addresses each in practice.
SOURCES_MAX = 64
API_ADDRS_MAX = 16
SUBJECT_TRANSFORMS_MAX = 16


def _check_addr(field_name: str, addr: object) -> str:
    """A ``host:port`` with a port in 1..65535 and no whitespace."""
    if not isinstance(addr, str) or not addr or any(c.isspace() for c in addr):
        raise InvalidArgumentError(field_name, "each address must be a non-empty host:port")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(field_name, f"must be host:port with a port 1-65535: {addr!r}")
    return addr


@dataclass(frozen=True, slots=True, kw_only=True)
class ExternalStream:
    """An origin in another cluster: that cluster's client API addresses (``host:port``)."""

    api: tuple[str, ...]

    def validate(self, field_name: str) -> None:
        where = f"{field_name}.external.api"
        if not self.api:
            raise InvalidArgumentError(where, "at least one host:port address is required")
        if len(self.api) > API_ADDRS_MAX:
            raise InvalidArgumentError(where, f"at most {API_ADDRS_MAX} addresses")
        for addr in self.api:
            _check_addr(where, addr)

    def to_dict(self) -> dict[str, Any]:
        return {"api": list(self.api)}

    @classmethod
    def from_dict(cls, raw: object, field_name: str) -> ExternalStream:
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError(f"{field_name}.external", "must be an object with 'api'")
        for key in raw:
            if key not in ("api", "deliver"):
                raise InvalidArgumentError(f"{field_name}.external.{key}", "unknown field")
        api = raw.get("api")
        if isinstance(api, str):  # one address, or a comma-separated list
            api = [a.strip() for a in api.split(",") if a.strip()]
        if not isinstance(api, list | tuple) or not all(isinstance(a, str) for a in api):
            raise InvalidArgumentError(f"{field_name}.external.api", "must be a list of host:port")
        return cls(api=tuple(api))


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceTransform:
    """One of a source's ``subject_transforms``: take ``src`` messages, store as ``dest``."""

    src: str
    dest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSource:
    """One origin of a mirror or a source (see the module docstring)."""

    name: str
    opt_start_seq: int = 0
    opt_start_time: int = 0  # ns since the epoch; 0: not set
    filter_subject: str | None = None
    subject_transforms: tuple[SourceTransform, ...] = ()
    external: ExternalStream | None = None

    def validate(self, field_name: str) -> None:
        """``InvalidArgumentError`` naming ``field_name``.<what> and the rule."""
        from raftstream.engine.stream_config import SubjectTransform, check_stream_name

        check_stream_name(self.name, f"{field_name}.name")
        if self.opt_start_seq < 0:
            raise InvalidArgumentError(f"{field_name}.opt_start_seq", "must not be negative")
        if self.opt_start_time < 0:
            raise InvalidArgumentError(f"{field_name}.opt_start_time", "must not be negative")
        if self.opt_start_seq and self.opt_start_time:
            raise InvalidArgumentError(
                f"{field_name}.opt_start_seq", "opt_start_seq and opt_start_time are exclusive"
            )
        if self.filter_subject is not None:
            validate_filter(self.filter_subject, f"{field_name}.filter_subject")
            if self.subject_transforms:
                raise InvalidArgumentError(
                    f"{field_name}.filter_subject",
                    "filter_subject and subject_transforms are exclusive",
                )
        if len(self.subject_transforms) > SUBJECT_TRANSFORMS_MAX:
            raise InvalidArgumentError(
                f"{field_name}.subject_transforms", f"at most {SUBJECT_TRANSFORMS_MAX}"
            )
        for t in self.subject_transforms:
            try:
                SubjectTransform(src=t.src, dest=t.dest or t.src or ">").validate()
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"{field_name}.subject_transforms", exc.rule) from None
        if self.external is not None:
            self.external.validate(field_name)

    @property
    def filters(self) -> tuple[str, ...]:
        """The origin subjects this link takes (empty: all)."""
        if self.filter_subject:
            return (self.filter_subject,)
        return tuple(t.src or ">" for t in self.subject_transforms)

    def stored_subject(self, subject: str) -> str:
        """The subject a copied message is stored under: the first transform whose ``src``
        matches it rewrites it (``dest`` empty: unchanged)."""
        if not self.subject_transforms:
            return subject  # the common link: no import, no loop (runs per copied message)
        from raftstream.engine.stream_config import SubjectTransform
        from raftstream.engine.subjects import subject_matches

        for t in self.subject_transforms:
            src = t.src or ">"
            if subject_matches(src, subject):
                return SubjectTransform(src=src, dest=t.dest).apply(subject) if t.dest else subject
        return subject

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.opt_start_seq:
            out["opt_start_seq"] = self.opt_start_seq
        if self.opt_start_time:
            out["opt_start_time"] = format_rfc3339_ns(self.opt_start_time)
        if self.filter_subject is not None:
            out["filter_subject"] = self.filter_subject
        if self.subject_transforms:
            out["subject_transforms"] = [
                {"src": t.src, "dest": t.dest} for t in self.subject_transforms
            ]
        if self.external is not None:
            out["external"] = self.external.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: object, field_name: str) -> StreamSource:
        """Parse JetStream JSON; types checked, unknown keys refused (rules: ``validate``)."""
        if not isinstance(raw, Mapping):
            raise InvalidArgumentError(field_name, "must be an object with at least 'name'")
        allowed = {f for f in cls.__dataclass_fields__}
        for key in raw:
            if key not in allowed:
                raise InvalidArgumentError(f"{field_name}.{key}", "unknown field")
        name = raw.get("name")
        if not isinstance(name, str):
            raise InvalidArgumentError(f"{field_name}.name", "is required (a string)")
        ints = {}
        for key in ("opt_start_seq", "opt_start_time"):
            v = raw.get(key) or 0
            if key == "opt_start_time" and isinstance(v, str):
                v = parse_rfc3339_ns(v, f"{field_name}.{key}")
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgumentError(f"{field_name}.{key}", "must be an integer")
            ints[key] = v
        filt = raw.get("filter_subject") or None
        if filt is not None and not isinstance(filt, str):
            raise InvalidArgumentError(f"{field_name}.filter_subject", "must be a string")
        ext = raw.get("external")
        return cls(
            name=name,
            filter_subject=filt,
            subject_transforms=_parse_transforms(raw.get("subject_transforms"), field_name),
            external=None if ext is None else ExternalStream.from_dict(ext, field_name),
            **ints,
        )


def _parse_transforms(raw: object, field_name: str) -> tuple[SourceTransform, ...]:
    where = f"{field_name}.subject_transforms"
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise InvalidArgumentError(where, "must be a list of {src, dest} objects")
    out = []
    for t in raw:
        if not isinstance(t, Mapping) or set(t) - {"src", "dest"}:
            raise InvalidArgumentError(where, "each must be an object with 'src' and 'dest'")
        src, dest = t.get("src") or "", t.get("dest") or ""
        if not isinstance(src, str) or not isinstance(dest, str):
            raise InvalidArgumentError(where, "src and dest must be strings")
        out.append(SourceTransform(src=src, dest=dest))
    return tuple(out)


def source_key(src: StreamSource) -> str:
    """The link's identity in the replicated state: ``name``, or ``name@addr,addr`` when
    external (the same name in another cluster is another origin)."""
    if src.external is None:
        return src.name
    return src.name + "@" + ",".join(src.external.api)


def check_links(field_name: str, sources: Iterable[StreamSource], own_name: str) -> None:
    """No link to the stream itself (same cluster) and no two links with one key."""
    seen: set[str] = set()
    for i, src in enumerate(sources):
        where = f"{field_name}[{i}]" if field_name == "sources" else field_name
        src.validate(where)
        if src.external is None and src.name == own_name:
            raise InvalidArgumentError(f"{where}.name", "a stream cannot mirror or source itself")
        key = source_key(src)
        if key in seen:
            raise InvalidArgumentError(where, f"duplicate source {key!r}")
        seen.add(key)


def find_cycle(name: str, links: Mapping[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """A cycle through stream ``name`` in the same-cluster link graph ``links`` (stream ->
    the streams it mirrors or sources), as the path ``name -> ... -> name``; None if none.
    External links leave the cluster and are not followed (the other cluster is unknown)."""
    path: list[str] = [name]
    on_path = {name}
    done: set[str] = set()

    def walk(node: str) -> tuple[str, ...] | None:
        for nxt in links.get(node, ()):
            if nxt == name:
                return (*path, nxt)
            if nxt in on_path or nxt in done:
                continue
            path.append(nxt)
            on_path.add(nxt)
            found = walk(nxt)
            if found is not None:
                return found
            path.pop()
            on_path.discard(nxt)
            done.add(nxt)
        return None

    return walk(name)
