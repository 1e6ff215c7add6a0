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
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from raftstream import errors
from raftstream.config import (
    UNLIMITED,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    StorageType,
    StreamConfig,
)
from raftstream.models import RawStreamMsg, StreamInfo
from raftstream.msg import Msg
from raftstream.ordered import OrderedSubscription, subscribe_ordered
from raftstream.subscribe import PushOptions

if TYPE_CHECKING:
    from raftstream.client import Client

__all__ = [
    "HISTORY_MAX",
    "KeyValue",
    "KeyValueEntry",
    "KeyValueOp",
    "KeyValueStatus",
    "KeyWatcher",
    "bucket_stream_config",
    "delete_bucket",
    "open_bucket",
    "validate_bucket",
    "validate_key",
]

NS_PER_S = 1_000_000_000
HISTORY_MAX = 64
STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV"
HDR_OPERATION = "KV-Operation"
HDR_ROLLUP = "Nats-Rollup"
ROLLUP_SUBJECT = "sub"
_BUCKET_RE = re.compile(r"[a-zA-Z0-9_-]+")
_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_RESERVED_KEY_PREFIX = "_kv"
WATCH_HEARTBEAT_S = 5.0


class KeyValueOp(enum.StrEnum):
    PUT = "PUT"
    DEL = "DEL"
    PURGE = "PURGE"


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyValueEntry:
    """One revision of a key. ``delta``: entries newer than this one in the watch (from the
    ack token's pending count; 0 for a direct ``get``). ``created_ns``: the stored time."""

    bucket: str
    key: str
    value: bytes
    revision: int
    created_ns: int
    operation: KeyValueOp = KeyValueOp.PUT
    delta: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyValueStatus:
    """A bucket's state: ``values`` stored (every revision and marker kept), ``history``
    per key, ``ttl_s`` (0: none), ``bytes``, and the backing stream's info."""

    bucket: str
    values: int
    history: int
    ttl_s: float
    bytes: int
    replicas: int
    stream_info: StreamInfo


def validate_bucket(bucket: str) -> str:
    if not isinstance(bucket, str) or not _BUCKET_RE.fullmatch(bucket):
        raise errors.InvalidArgumentError(
            "bucket", f"a bucket name is letters, digits, '_' and '-' only: {bucket!r}"
        )
    return bucket


def validate_key(key: str, *, wildcards: bool = False) -> str:
    """A key is dot-separated tokens of letters, digits and ``-/_=``; no empty token, no
    leading ``_kv``. With ``wildcards`` (watch) a token may be ``*`` and the last ``>``."""
    if not isinstance(key, str) or not key:
        raise errors.InvalidKeyError("key", "must be a non-empty string")
    tokens = key.split(".")
    for i, tok in enumerate(tokens):
        if wildcards and (tok == "*" or (tok == ">" and i == len(tokens) - 1)):
            continue
        if not tok or not _KEY_RE.fullmatch(tok):
            raise errors.InvalidKeyError(
                "key", f"not a valid key: {key!r} (tokens of letters, digits, '-/_=')"
            )
    if key.startswith(_RESERVED_KEY_PREFIX):
        raise errors.InvalidKeyError("key", f"{_RESERVED_KEY_PREFIX!r} starts reserved keys")
    return key


def bucket_stream_config(
    bucket: str,
    *,
    description: str = "",
    history: int = 1,
    ttl: float | None = None,
    max_value_size: int = UNLIMITED,
    max_bytes: int = UNLIMITED,
    storage: StorageType | str = StorageType.FILE,
    replicas: int = 1,
) -> StreamConfig:
    """The backing stream of a bucket (module docstring); ``ttl`` in seconds."""
    validate_bucket(bucket)
    if not 1 <= history <= HISTORY_MAX:
        raise errors.InvalidArgumentError("history", f"must be 1 to {HISTORY_MAX}")
    if ttl is not None and ttl < 0:
        raise errors.InvalidArgumentError("ttl", "must not be negative (seconds)")
    return StreamConfig(
        name=STREAM_PREFIX + bucket,
        description=description,
        subjects=(f"{SUBJECT_PREFIX}.{bucket}.>",),
        max_msgs_per_subject=history,
        max_bytes=max_bytes,
        max_age=int((ttl or 0) * NS_PER_S),
        max_msg_size=max_value_size,
        storage=StorageType(str(storage)),
        num_replicas=replicas,
        allow_rollup_hdrs=True,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        allow_direct=True,
    )


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


async def open_bucket(client: Client, bucket: str, *, timeout: float | None) -> KeyValue:
    """``Client.key_value``: the bucket if its stream exists."""
    validate_bucket(bucket)
    try:
        await client.stream_info(STREAM_PREFIX + bucket, timeout=timeout)
    except errors.NotFoundError:
        raise errors.BucketNotFoundError(f"bucket {bucket!r} not found", bucket=bucket) from None
    return KeyValue(client, bucket)


async def delete_bucket(client: Client, bucket: str, *, timeout: float | None) -> bool:
    """``Client.delete_key_value``: delete the bucket's stream."""
    validate_bucket(bucket)
    try:
        return await client.delete_stream(STREAM_PREFIX + bucket, timeout=timeout)
    except errors.NotFoundError:
        raise errors.BucketNotFoundError(f"bucket {bucket!r} not found", bucket=bucket) from None


class KeyValue:
    """A bucket (module docstring). Made by ``Client.key_value`` / ``create_key_value``."""

    def __init__(self, client: Client, bucket: str) -> None:
        self._client = client
        self.bucket = validate_bucket(bucket)
        self.stream = STREAM_PREFIX + bucket
        self._prefix = f"{SUBJECT_PREFIX}.{bucket}."

    def _subject(self, key: str, *, wildcards: bool = False) -> str:
        return self._prefix + validate_key(key, wildcards=wildcards)

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
        there is none; ``KeyDeletedError`` (``details["revision"]``) when it is a delete or
        purge marker."""
        subject = self._subject(key)
        try:
            if revision is None:
                raw = await self._client.get_last_msg(self.stream, subject)
            else:
                raw = await self._client.get_msg(self.stream, revision)
        except errors.NotFoundError:
            raise errors.KeyNotFoundError(f"key {key!r} not found", key=key) from None
        if raw.subject != subject:
            raise errors.KeyNotFoundError(
                f"revision {revision} is not of key {key!r}", key=key, revision=revision
            )
        entry = self._entry(raw)
        if entry.operation is not KeyValueOp.PUT:
            raise errors.KeyDeletedError(
                f"key {key!r} was deleted (revision {entry.revision})",
                key=key,
                revision=entry.revision,
            )
        return entry

    async def status(self) -> KeyValueStatus:
        info = await self._client.stream_info(self.stream)
        return KeyValueStatus(
            bucket=self.bucket,
            values=info.state.messages,
            history=info.config.max_msgs_per_subject,
            ttl_s=info.config.max_age / NS_PER_S,
            bytes=info.state.bytes,
            replicas=info.config.num_replicas,
            stream_info=info,
        )

    # -- writes -----------------------------------------------------------------------------

    async def put(self, key: str, value: bytes) -> int:
        """Store a new revision; returns it."""
        ack = await self._client.publish(self._subject(key), value)
        return ack.seq

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Store ``value`` only if the key's last revision is ``last`` (0: the key has never
        been written, or its history is gone). ``KeyWrongLastSequenceError`` otherwise."""
        try:
            ack = await self._client.publish(
                self._subject(key), value, expected_last_subject_seq=last
            )
        except errors.ExpectedLastSubjectSeqError as exc:
            raise _wrong_last(key, last, exc) from None
        return ack.seq

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
        try:
            ack = await self._client.publish(
                self._subject(key), b"", headers=headers, expected_last_subject_seq=last
            )
        except errors.ExpectedLastSubjectSeqError as exc:
            raise _wrong_last(key, last, exc) from None
        return ack.seq

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
        ``stop()`` (or ``async with``)."""
        subject = self._subject(keys, wildcards=True)
        policy = DeliverPolicy.ALL if include_history else DeliverPolicy.LAST_PER_SUBJECT
        cfg = ConsumerConfig(
            deliver_policy=policy,
            headers_only=meta_only,
            idle_heartbeat=int(heartbeat * NS_PER_S),
        )
        sub = await subscribe_ordered(
            self._client, subject, stream=self.stream, cfg=cfg, options=PushOptions()
        )
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


class KeyWatcher:
    """A running watch (see ``KeyValue.watch``); owns its ordered subscription."""

    def __init__(self, kv: KeyValue, sub: OrderedSubscription, *, ignore_deletes: bool) -> None:
        self._kv = kv
        self._sub = sub
        self._ignore_deletes = ignore_deletes
        # The filter held nothing when the watch began: the end marker comes first.
        self._initial_done = sub.initial_info.num_pending == 0
        self._marker_due = self._initial_done

    @property
    def subscription(self) -> OrderedSubscription:
        return self._sub

    async def updates(self, timeout: float | None = None) -> KeyValueEntry | None:
        """The next entry, or ``None`` once at the end of the initial data. Raises
        ``DeadlineExceededError`` when nothing came within ``timeout`` seconds (None: wait)."""
        while True:
            if self._marker_due:
                self._marker_due = False
                return None
            msg = await self._sub.next_msg(timeout)
            entry = self._kv.entry_of(msg)
            if not self._initial_done and entry.delta == 0:
                self._initial_done = True
                self._marker_due = True
            if self._ignore_deletes and entry.operation is not KeyValueOp.PUT:
                continue
            return entry

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> KeyValueEntry | None:
        try:
            return await self.updates(None)
        except errors.SubscriptionClosedError:
            raise StopAsyncIteration from None

    async def stop(self) -> None:
        """End the watch and delete its consumer."""
        await self._sub.unsubscribe()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
