"""Key-value buckets on streams, laid out as JetStream lays them out.

A bucket ``B`` is the stream ``KV_B`` capturing ``$KV.B.>``; a key ``k`` is the subject
``$KV.B.k``; a value is a message, its revision the message's stream sequence. The stream
keeps ``history`` messages per subject (``max_msgs_per_subject``), allows rollup headers
(a purge keeps only its marker), denies deleting single messages, and discards new
messages when full. Deletes and purges are markers: an empty message with the header
``KV-Operation: DEL`` or ``KV-Operation: PURGE`` (the purge also ``Nats-Rollup: sub``).

A ``KeyValue`` belongs to the loop of its client. Writes (``put``, ``create``, ``update``,
``delete``, ``purge``) are answered once replicated on a quorum; on a timeout or a broken
connection the outcome is unknown (the write may or may not have happened, as for any
publish): read the key to find out. ``update`` is a compare-and-set on the key's last
revision (``expected_last_subject_seq``): of writers racing with the same ``last``, exactly
one wins; the others get ``KeyWrongLastSequenceError``.

Watches (``watch``, ``watchall``, and ``keys``/``history`` built on them) are ordered
consumers: the latest entry per key (or the whole history) first, then ``None`` once (the end
of the initial data), then updates as they happen.

Mirrors and sources. A mirror bucket (``mirror=``, a bucket here or, as a ``StreamSource``
with ``external``, in another cluster) is a read-only copy: its stream mirrors the origin's,
so it keeps the origin's revisions and subjects (``$KV.<origin>.<key>``), and reads and
watches find them there; a write through it goes to the origin's subject, so it reaches the
origin when the origin is in this cluster (``BucketNotFoundError`` naming the origin when
not), and the mirror shortly after. A bucket with ``sources`` takes the keys of other
buckets besides its own: each source's ``$KV.<source>.>`` is stored as ``$KV.<bucket>.>``
(unless the ``StreamSource`` filters or transforms subjects itself), under the bucket's own
revisions. A purge at the origin rolls the key up in the copy too (only its marker stays),
once every node of the cluster runs a version that does so.

Errors speak of buckets, not of their streams: a bucket that is missing (never made, or
deleted under a ``KeyValue`` or a running watch) is ``BucketNotFoundError`` naming the
bucket, a bucket that exists with other settings ``AlreadyExistsError`` naming it, and a
bad ``create_key_value`` argument ``InvalidArgumentError`` naming the argument (nothing is
sent). A stream named ``KV_B`` that was not made as a bucket (``bucket_of``) is no bucket.

This module holds ``KeyValue`` and the bucket management ``Client`` calls (create, update,
open, delete, statuses); what a bucket is without a client (names, limits, the backing
stream's config, entries and status) is in ``raftstream._kv_model``, and watches
(``KeyWatcher``) in ``raftstream._kv_watch``. Their public names are importable from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from raftstream import errors
from raftstream._args import INT64_MAX, check_seconds
from raftstream._kv_model import (
    BUCKET_BYTES_MAX,
    HISTORY_MAX,
    MAX_VALUE_SIZE_MAX,
    NS_PER_S,
    REPLICAS_MAX,
    STORAGE_TYPES,
    STREAM_NAME_BYTES_MAX,
    STREAM_PREFIX,
    SUBJECT_BYTES_MAX,
    SUBJECT_PREFIX,
    TTL_MAX_S,
    TTL_MIN_S,
    KeyValueEntry,
    KeyValueOp,
    KeyValueStatus,
    as_bucket_error,
    bucket_not_found,
    bucket_of,
    bucket_stream_config,
    int_in,
    mirrored,
    origin_bucket,
    stream_missing,
    validate_bucket,
    validate_key,
)
from raftstream._kv_watch import KeyWatcher, transient_only
from raftstream.config import UNLIMITED, ConsumerConfig, DeliverPolicy, StreamConfig, StreamSource
from raftstream.models import RawStreamMsg, StreamInfo
from raftstream.msg import Msg
from raftstream.ordered import subscribe_ordered
from raftstream.subscribe import PushOptions

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = [
    "BUCKET_BYTES_MAX",
    "HISTORY_MAX",
    "MAX_VALUE_SIZE_MAX",
    "REPLICAS_MAX",
    "STORAGE_TYPES",
    "STREAM_NAME_BYTES_MAX",
    "TTL_MAX_S",
    "TTL_MIN_S",
    "KeyValue",
    "KeyValueEntry",
    "KeyValueOp",
    "KeyValueStatus",
    "KeyWatcher",
    "bucket_of",
    "bucket_statuses",
    "bucket_stream_config",
    "create_bucket",
    "delete_bucket",
    "mirrored",
    "open_bucket",
    "update_bucket",
    "validate_bucket",
    "validate_key",
]

HDR_OPERATION = "KV-Operation"
HDR_ROLLUP = "Nats-Rollup"
ROLLUP_SUBJECT = "sub"
WATCH_HEARTBEAT_S = 5.0


def _operation(headers: Mapping[str, str]) -> KeyValueOp:
    op = headers.get(HDR_OPERATION)
    if op is None:
        return KeyValueOp.PUT
    try:
        return KeyValueOp(op)
    except ValueError:
        return KeyValueOp.PUT


def _wrong_last(
    key: str, last: int | None, exc: errors.RaftStreamError
) -> errors.KeyWrongLastSequenceError:
    details = {**exc.details, "key": key, "expected_last": last}
    return errors.KeyWrongLastSequenceError(
        f"key {key!r}: its last revision is not {last} ({exc.message})", **details
    )


async def _bucket_info(client: Client, bucket: str, *, timeout: float | None) -> StreamInfo:
    """The info of the bucket's stream; ``BucketNotFoundError`` when there is none or it is
    not a bucket's (``bucket_of``)."""
    validate_bucket(bucket)
    stream = STREAM_PREFIX + bucket
    try:
        info = await client.stream_info(stream, timeout=timeout)
    except errors.NotFoundError:
        raise bucket_not_found(bucket) from None
    if bucket_of(info.config) != bucket:
        raise bucket_not_found(bucket, f": the stream {stream!r} was not made as a bucket")
    return info


async def open_bucket(client: Client, bucket: str, *, timeout: float | None) -> KeyValue:
    """``Client.key_value``: the bucket if its stream exists and is a bucket's."""
    info = await _bucket_info(client, bucket, timeout=timeout)
    return KeyValue(client, bucket, mirror_of=mirrored(info.config))


async def delete_bucket(client: Client, bucket: str, *, timeout: float | None) -> bool:
    """``Client.delete_key_value``: delete the bucket's stream (never a stream of that name
    that is not a bucket's: ``BucketNotFoundError``)."""
    await _bucket_info(client, bucket, timeout=timeout)
    try:
        return await client.delete_stream(STREAM_PREFIX + bucket, timeout=timeout)
    except errors.NotFoundError:
        raise bucket_not_found(bucket) from None


async def create_bucket(
    client: Client, bucket: str, cfg: StreamConfig, *, timeout: float | None
) -> KeyValue:
    """``Client.create_key_value``: make the bucket's stream ``cfg`` (from
    ``bucket_stream_config``). Idempotent for an identical bucket; ``AlreadyExistsError``
    naming the bucket (and the settings that differ) when one with other settings exists,
    or naming the stream when a stream of the bucket's stream name exists that is not a
    bucket."""
    try:
        await client.add_stream(cfg, timeout=timeout)
    except errors.AlreadyExistsError:
        raise await _bucket_exists(client, bucket, cfg, timeout=timeout) from None
    return KeyValue(client, bucket, mirror_of=mirrored(cfg))


async def update_bucket(
    client: Client, bucket: str, changes: Mapping[str, object], *, timeout: float | None
) -> KeyValue:
    """``Client.update_key_value``: change the settings ``changes`` names (``_SETTINGS``'
    argument names but ``storage``, which a stream cannot change); every other field of the
    bucket's stream stays as it is, but for the duplicate window, which a new ``ttl`` sets
    as a create sets it (2 minutes, or the TTL when shorter). The values are checked as
    ``bucket_stream_config`` checks them (naming the argument) before anything is sent."""
    if "storage" in changes:
        raise errors.InvalidArgumentError(
            "storage", "cannot be changed: a bucket keeps the storage it was made with"
        )
    unknown = sorted(set(changes) - {name for name, _ in _SETTINGS})
    if unknown:
        raise errors.InvalidArgumentError(unknown[0], "is not a bucket setting")
    given = bucket_stream_config(bucket, **changes)  # type: ignore[arg-type]
    fields = {field: getattr(given, field) for name, field in _SETTINGS if name in changes}
    if "ttl" in changes:
        # The duplicate window follows the TTL as on create: bucket_stream_config leaves it 0,
        # which the node fills in by its one rule (2 min, or the TTL when shorter). Keeping
        # the stored window instead would refuse a TTL under it, naming duplicate_window.
        fields["duplicate_window"] = given.duplicate_window
    info = await _bucket_info(client, bucket, timeout=timeout)
    await client.update_stream(dataclasses.replace(info.config, **fields), timeout=timeout)
    return KeyValue(client, bucket, mirror_of=mirrored(info.config))


# The settings a bucket is made with: its argument name -> the stream config field.
_SETTINGS = (
    ("history", "max_msgs_per_subject"),
    ("ttl", "max_age"),
    ("max_value_size", "max_msg_size"),
    ("max_bytes", "max_bytes"),
    ("storage", "storage"),
    ("replicas", "num_replicas"),
    ("description", "description"),
)


def _setting(name: str, value: object) -> str:
    if name == "ttl" and isinstance(value, int):
        return f"{value / NS_PER_S:g}s" if value else "forever"
    if name in ("max_value_size", "max_bytes") and isinstance(value, int) and value <= 0:
        return "unlimited"
    return repr(value) if name == "description" else str(value)


def _links(links: StreamSource | Sequence[StreamSource] | None) -> str:
    """A mirror or sources, by bucket (or stream) name, for messages."""
    if links is None:
        return "none"
    many = (links,) if isinstance(links, StreamSource) else tuple(links)
    return ", ".join(origin_bucket(s.name) or s.name for s in many) or "none"


async def _bucket_exists(
    client: Client, bucket: str, wanted: StreamConfig, *, timeout: float | None
) -> errors.AlreadyExistsError:
    """The error for a create refused because the bucket's stream name is taken: what is
    there is looked up (best effort) to say what differs."""
    try:
        have: StreamConfig | None = (await client.stream_info(wanted.name, timeout=timeout)).config
    except errors.RaftStreamError:
        have = None  # deleted meanwhile, or unreachable: say what is known
    if have is not None and bucket_of(have) != bucket:
        return errors.AlreadyExistsError(
            f"bucket {bucket!r} cannot be created: a stream named {wanted.name!r} exists "
            "that is not a bucket",
            bucket=bucket,
        )
    diffs = []
    for name, field in _SETTINGS if have is not None else ():
        there, asked = getattr(have, field), getattr(wanted, field)
        if field in ("max_msg_size", "max_bytes") and asked == 0:
            asked = UNLIMITED  # the node stores 0 as unlimited
        if there != asked:
            diffs.append(f"{name} {_setting(name, there)} (asked {_setting(name, asked)})")
    if have is not None:
        for name, there_o, asked_o in (
            ("mirror", have.mirror, wanted.mirror),
            ("sources", have.sources, wanted.sources),
        ):
            if there_o != asked_o:
                diffs.append(f"{name} {_links(there_o)} (asked {_links(asked_o)})")
    differs = f": {', '.join(diffs)}" if diffs else ""
    return errors.AlreadyExistsError(
        f"bucket {bucket!r} already exists with a different configuration{differs}",
        bucket=bucket,
    )


async def bucket_statuses(client: Client, *, timeout: float | None = None) -> list[KeyValueStatus]:
    """Every bucket's state, by name: the streams that are buckets (``bucket_of``); other
    streams, ``KV_``-named or not, are left out. One listing call, so a bucket deleted
    meanwhile is simply absent."""
    out = []
    for info in await client.streams_info(timeout=timeout):
        bucket = bucket_of(info.config)
        if bucket is not None:
            out.append(KeyValueStatus.from_stream_info(bucket, info))
    return sorted(out, key=lambda s: s.bucket)


class KeyValue:
    """A bucket (module docstring). Made by ``Client.key_value`` / ``create_key_value``.
    ``mirror_of``: the bucket a mirror bucket mirrors, whose subjects its keys keep and
    where its writes go (None: no mirror)."""

    def __init__(self, client: Client, bucket: str, *, mirror_of: str | None = None) -> None:
        self._client = client
        self.bucket = validate_bucket(bucket)
        self.stream = STREAM_PREFIX + bucket
        self.mirror_of = mirror_of
        self._prefix = f"{SUBJECT_PREFIX}.{mirror_of or bucket}."

    def _subject(self, key: str, *, wildcards: bool = False) -> str:
        """The key's subject; ``InvalidKeyError`` naming ``key`` for a malformed key or one
        longer than the subject's 4096 bytes leave after ``$KV.<bucket>.``."""
        validate_key(key, wildcards=wildcards)
        room = SUBJECT_BYTES_MAX - len(self._prefix)
        if len(key) > room:  # ASCII only: characters are bytes
            raise errors.InvalidKeyError(
                "key",
                f"must be at most {room} characters in bucket {self.bucket!r} (a subject is "
                f"at most {SUBJECT_BYTES_MAX} bytes, {self._prefix!r} included), not {len(key)}",
            )
        return self._prefix + key

    def _entry(self, m: RawStreamMsg) -> KeyValueEntry:
        return KeyValueEntry(
            bucket=self.bucket,
            key=m.subject[len(self._prefix) :],
            value=m.data,
            revision=m.seq,
            created_ns=m.ts_ns,
            operation=_operation(m.headers),
        )

    # -- reads ------------------------------------------------------------------------------

    async def get(self, key: str, revision: int | None = None) -> KeyValueEntry:
        """The key's latest value, or the entry at ``revision``. ``KeyNotFoundError`` when
        there is none (for a revision: saying it is not kept, or is another key's, with
        ``details["revision"]``); ``KeyDeletedError`` (``details["revision"]``) when it is a
        delete or purge marker; ``BucketNotFoundError`` when the bucket is gone."""
        subject = self._subject(key)
        if revision is not None:
            int_in("revision", revision, 1, INT64_MAX, f"must be an integer from 1 to {INT64_MAX}")
        try:
            if revision is None:
                raw = await self._client.get_last_msg(self.stream, subject)
            else:
                raw = await self._client.get_msg(self.stream, revision)
        except errors.NotFoundError as exc:
            if stream_missing(exc):
                raise bucket_not_found(self.bucket) from None
            if revision is None:
                raise errors.KeyNotFoundError(f"key {key!r} not found", key=key) from None
            raise await self._revision_not_found(key, revision) from None
        if raw.subject != subject:
            raise errors.KeyNotFoundError(
                f"revision {revision} of key {key!r} not found: revision {revision} is "
                "another key's",
                key=key,
                revision=revision,
            )
        entry = self._entry(raw)
        if entry.operation is not KeyValueOp.PUT:
            raise errors.KeyDeletedError(
                f"key {key!r} was deleted (revision {entry.revision})",
                key=key,
                revision=entry.revision,
            )
        return entry

    async def _revision_not_found(self, key: str, revision: int) -> errors.KeyNotFoundError:
        """Why ``revision`` is not there, from the bucket's state (best effort: a second
        lookup that may fail, then the reasons are given without numbers)."""
        try:
            info: StreamInfo | None = await self._client.stream_info(self.stream)
        except errors.RaftStreamError:
            info = None
        if info is not None and revision > info.state.last_seq:
            why = f"the bucket's latest revision is {info.state.last_seq}"
        else:
            n = info.config.max_msgs_per_subject if info is not None else None
            keeps = f"{n} revision{'s' if n != 1 else ''}" if n else "`history` revisions"
            why = (
                f"it is no longer kept (the bucket keeps {keeps} per key; purged and expired "
                "ones are dropped too) or it is not a revision of that key"
            )
        return errors.KeyNotFoundError(
            f"revision {revision} of key {key!r} not found: {why}", key=key, revision=revision
        )

    async def status(self) -> KeyValueStatus:
        """The bucket's state; ``BucketNotFoundError`` when it is gone."""
        try:
            info = await self._client.stream_info(self.stream)
        except errors.NotFoundError as exc:
            raise as_bucket_error(self.bucket, exc) from None
        return KeyValueStatus.from_stream_info(self.bucket, info)

    # -- writes -----------------------------------------------------------------------------

    async def _publish(
        self,
        key: str,
        value: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        last: int | None = None,
    ) -> int:
        """Publish to the key's subject; the revision. ``KeyWrongLastSequenceError`` when
        ``last`` is not the key's last revision, ``BucketNotFoundError`` when the bucket is
        gone (no stream captures the key's subject). A ``last`` that is no revision is
        refused naming ``last``, before anything is sent."""
        subject = self._subject(key)
        if last is not None:
            int_in(
                "last",
                last,
                0,
                INT64_MAX,
                f"must be an integer from 0 (the key has no value) to {INT64_MAX}",
            )
        try:
            ack = await self._client.publish(
                subject, value, headers=headers, expected_last_subject_seq=last
            )
        except errors.ExpectedLastSubjectSeqError as exc:
            raise _wrong_last(key, last, exc) from None
        except errors.NotFoundError as exc:
            if self.mirror_of is not None and stream_missing(exc):
                raise bucket_not_found(
                    self.mirror_of,
                    f" here: bucket {self.bucket!r} mirrors it and takes no writes of its own"
                    " (write to it in its cluster)",
                ) from None
            raise as_bucket_error(self.bucket, exc) from None
        except errors.LimitError as exc:
            if exc.details.get("limit") != "max_msg_size":
                raise
            # Said in the bucket's terms: its stream's max_msg_size is the bucket's
            # max_value_size (kv edit --max-value-size), which the user set by that name.
            raise errors.LimitError(
                f"the value of key {key!r} is larger than bucket {self.bucket!r}'s "
                f"max_value_size allows ({exc})",
                limit="max_value_size",
                bucket=self.bucket,
            ) from None
        return ack.seq

    async def put(self, key: str, value: bytes) -> int:
        """Store a new revision; returns it."""
        return await self._publish(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Store ``value`` only if the key's last revision is ``last`` (0: the key has never
        been written, or its history is gone). ``KeyWrongLastSequenceError`` otherwise."""
        return await self._publish(key, value, last=last)

    async def create(self, key: str, value: bytes) -> int:
        """Store ``value`` only if the key has no value: never written, or its latest entry
        is a delete or purge marker. ``KeyExistsError`` when it holds one."""
        try:
            return await self.update(key, value, last=0)
        except errors.KeyWrongLastSequenceError:
            pass
        try:
            entry = await self.get(key)
        except errors.KeyDeletedError as deleted:
            try:
                return await self.update(key, value, last=int(deleted.details["revision"]))
            except errors.KeyWrongLastSequenceError:
                pass  # someone wrote meanwhile
        except errors.KeyNotFoundError:
            pass
        else:
            raise errors.KeyExistsError(
                f"key {key!r} exists (revision {entry.revision})", key=key, revision=entry.revision
            )
        raise errors.KeyExistsError(f"key {key!r} was written concurrently", key=key)

    async def delete(self, key: str, *, last: int | None = None) -> int:
        """Write a delete marker (history before it is kept); with ``last``, only if the key's
        last revision is ``last``. Returns the marker's revision."""
        return await self._marker(key, KeyValueOp.DEL, last)

    async def purge(self, key: str, *, last: int | None = None) -> int:
        """Write a purge marker that rolls up the key: its whole history is removed and only
        the marker stays. Returns the marker's revision."""
        return await self._marker(key, KeyValueOp.PURGE, last)

    async def _marker(self, key: str, op: KeyValueOp, last: int | None) -> int:
        headers = {HDR_OPERATION: op.value}
        if op is KeyValueOp.PURGE:
            headers[HDR_ROLLUP] = ROLLUP_SUBJECT
        return await self._publish(key, b"", headers=headers, last=last)

    # -- watches ----------------------------------------------------------------------------

    async def watch(
        self,
        keys: str = ">",
        *,
        include_history: bool = False,
        ignore_deletes: bool = False,
        meta_only: bool = False,
        heartbeat: float = WATCH_HEARTBEAT_S,
    ) -> KeyWatcher:
        """Watch keys matching ``keys`` (``*`` and a final ``>`` allowed): the latest entry of
        each (``include_history``: every kept revision), then ``None`` once, then updates.
        ``ignore_deletes`` skips delete/purge markers; ``meta_only`` leaves values empty.
        ``heartbeat``: the ordered consumer's idle heartbeat, seconds. Stop it with
        ``stop()`` (or ``async with``).

        An error that ends the watch (the bucket deleted meanwhile: ``BucketNotFoundError``)
        is raised by ``updates`` only, not also given to the client's error callback, which
        gets the transient ones the watch recovers from (missed heartbeats)."""
        subject = self._subject(keys, wildcards=True)
        policy = DeliverPolicy.ALL if include_history else DeliverPolicy.LAST_PER_SUBJECT
        cfg = ConsumerConfig(
            deliver_policy=policy,
            headers_only=meta_only,
            idle_heartbeat=int(check_seconds("heartbeat", heartbeat, zero_ok=True) * NS_PER_S),
        )
        options = PushOptions(error_cb=transient_only(self._client._error_cb))
        try:
            sub = await subscribe_ordered(
                self._client, subject, stream=self.stream, cfg=cfg, options=options
            )
        except errors.NotFoundError as exc:
            raise as_bucket_error(self.bucket, exc) from None
        return KeyWatcher(self, sub, ignore_deletes=ignore_deletes)

    async def watchall(self, **options: bool | float) -> KeyWatcher:
        """``watch(">")``: every key."""
        return await self.watch(">", **options)  # type: ignore[arg-type]

    async def keys(self, *, timeout: float | None = None) -> list[str]:
        """Every key that holds a value (not deleted or purged), in stream order."""
        out: list[str] = []
        async with await self.watch(ignore_deletes=True, meta_only=True) as w:
            while (entry := await w.updates(timeout)) is not None:
                out.append(entry.key)
        return out

    async def history(self, key: str, *, timeout: float | None = None) -> list[KeyValueEntry]:
        """Every kept revision of ``key``, markers included, oldest first.
        ``KeyNotFoundError`` when there is none."""
        validate_key(key)
        out: list[KeyValueEntry] = []
        async with await self.watch(key, include_history=True) as w:
            while (entry := await w.updates(timeout)) is not None:
                out.append(entry)
        if not out:
            raise errors.KeyNotFoundError(f"key {key!r} not found", key=key)
        return out

    def entry_of(self, msg: Msg) -> KeyValueEntry:
        meta = msg.metadata
        return KeyValueEntry(
            bucket=self.bucket,
            key=msg.subject[len(self._prefix) :],
            value=msg.data,
            revision=meta.stream_seq,
            created_ns=meta.timestamp_ns,
            operation=_operation(msg.headers),
            delta=meta.num_pending,
        )
