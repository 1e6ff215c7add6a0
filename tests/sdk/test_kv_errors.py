"""Key-value errors against fake servers (``tests/support/fakes.py``): what a KV user is told, in
the words of buckets and keys (``raftstream/kv.py``, module docstring "Errors speak of
buckets").

Pins: a revision that is not there is ``KeyNotFoundError`` naming the revision and why (not
kept under the bucket's history, another key's, beyond the latest); a missing or deleted
bucket is ``BucketNotFoundError`` naming the bucket on every path (open, delete, get, put,
update, create, delete/purge markers, status, watch), never the ``KV_`` stream; a bucket
that exists with other settings is ``AlreadyExistsError`` naming the bucket and the settings
that differ; every bad ``create_key_value`` argument is ``InvalidArgumentError`` naming the
argument, and nothing is sent; an update of the TTL sets the duplicate window as a create
does (any TTL a create takes, an update takes), and a bad one names ``ttl``; only streams
made as buckets are buckets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import raftstream
from raftstream import errors
from raftstream.client import Client
from raftstream.config import StreamConfig
from raftstream.engine import stream_config as eng_stream
from raftstream.kv import NS_PER_S, bucket_of, bucket_statuses, bucket_stream_config
from raftstream.proto import raftstream_pb2 as pb
from tests.support.fakes import FakeNode, Nodes

KEY_SUBJECT = "$KV.CFG.a.b"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def info_pb(cfg: StreamConfig, *, last_seq: int = 0) -> pb.StreamInfo:
    return pb.StreamInfo(
        config_json=json.dumps(cfg.to_dict()),
        state=pb.StreamState(messages=last_seq, last_seq=last_seq),
        created_ns=1,
    )


def serve_info(node: FakeNode, cfg: StreamConfig, *, last_seq: int = 0) -> None:
    async def info(req: Any, ctx: Any) -> pb.StreamInfo:
        if req.name != cfg.name:
            raise errors.NotFoundError(f"stream {req.name!r} not found", field="stream")
        return info_pb(cfg, last_seq=last_seq)

    node.on("GetStreamInfo", info)


def refuse(exc: errors.RaftStreamError) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(req: Any, ctx: Any) -> Any:
        raise exc

    return handler


async def connected(node: FakeNode) -> Client:
    return await raftstream.connect([node.addr], timeout=5)


# -- 1. a revision that is not there ----------------------------------------------------------


def test_get_of_a_revision_the_history_dropped_names_the_revision_and_the_history():
    """``kv get --revision 1`` after history=2 dropped it: a KeyNotFoundError (still),
    naming revision 1 of the key and the 2 revisions kept per key, not 'key not found'."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, bucket_stream_config("CFG", history=2), last_seq=3)
            node.on("GetMessage", refuse(errors.NotFoundError("no message at sequence 1", seq=1)))
            async with await connected(node) as rs:
                kv = await rs.key_value("CFG")
                with pytest.raises(errors.KeyNotFoundError) as e:
                    await kv.get("a.b", revision=1)
        text = str(e.value)
        assert "revision 1 of key 'a.b'" in text
        assert "no longer kept" in text and "keeps 2 revisions per key" in text
        assert "not a revision of that key" in text
        assert e.value.details["revision"] == 1 and e.value.details["key"] == "a.b"
        assert not isinstance(e.value, errors.KeyDeletedError)

    run(main())


def test_get_of_another_keys_revision_or_one_beyond_the_latest_says_so():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, bucket_stream_config("CFG", history=2), last_seq=4)

            async def get(req: Any, ctx: Any) -> pb.GetMessageResponse:
                if req.seq > 4:
                    raise errors.NotFoundError(f"no message at sequence {req.seq}", seq=req.seq)
                msg = pb.Msg(subject="$KV.CFG.other", seq=req.seq, ts_ns=1, data=b"x")
                return pb.GetMessageResponse(message=msg)

            node.on("GetMessage", get)
            async with await connected(node) as rs:
                kv = await rs.key_value("CFG")
                with pytest.raises(errors.KeyNotFoundError) as other:
                    await kv.get("a.b", revision=4)
                with pytest.raises(errors.KeyNotFoundError) as beyond:
                    await kv.get("a.b", revision=99)
                with pytest.raises(errors.InvalidArgumentError) as bad:
                    await kv.get("a.b", revision=0)
        assert "revision 4 of key 'a.b' not found" in str(other.value)
        assert "another key's" in str(other.value)
        assert "revision 99 of key 'a.b'" in str(beyond.value)
        assert "latest revision is 4" in str(beyond.value)
        assert bad.value.field == "revision"

    run(main())


# -- 2. bucket names, not stream names --------------------------------------------------------


def test_a_deleted_bucket_is_bucket_not_found_naming_the_bucket_on_every_path():
    """The bucket's stream is gone under an open KeyValue: the node answers NOT_FOUND about
    the stream ('stream ... not found', field stream) or the subject ('no stream matches
    subject', field subject); the user is told the bucket is not found."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, bucket_stream_config("GONE"))
            async with await connected(node) as rs:
                kv = await rs.key_value("GONE")
                # Now delete it: every RPC about it says the stream is missing.
                missing = errors.NotFoundError("stream 'KV_GONE' not found", field="stream")
                for rpc in ("GetStreamInfo", "GetMessage", "DeleteStream", "CreateConsumer"):
                    node.on(rpc, refuse(missing))
                node.on(
                    "Publish",
                    refuse(
                        errors.NotFoundError(
                            "no stream matches subject '$KV.GONE.k'", field="subject"
                        )
                    ),
                )
                calls: dict[str, Callable[[], Awaitable[Any]]] = {
                    "key_value": lambda: rs.key_value("GONE"),
                    "delete_key_value": lambda: rs.delete_key_value("GONE"),
                    "get": lambda: kv.get("k"),
                    "get revision": lambda: kv.get("k", revision=3),
                    "put": lambda: kv.put("k", b"v"),
                    "update": lambda: kv.update("k", b"v", last=2),
                    "create": lambda: kv.create("k", b"v"),
                    "delete": lambda: kv.delete("k"),
                    "purge": lambda: kv.purge("k"),
                    "status": kv.status,
                    "watch": kv.watch,
                    "keys": lambda: kv.keys(timeout=2),
                    "history": lambda: kv.history("k", timeout=2),
                }
                for name, call in calls.items():
                    with pytest.raises(errors.BucketNotFoundError) as e:
                        await call()
                    assert str(e.value) == "bucket 'GONE' not found", name
                    assert e.value.details["bucket"] == "GONE", name

    run(main())


def test_a_message_that_is_missing_is_still_a_key_error_not_a_bucket_error():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, bucket_stream_config("CFG"))
            node.on("GetMessage", refuse(errors.NotFoundError("no message matches '$KV.CFG.k'")))
            async with await connected(node) as rs:
                with pytest.raises(errors.KeyNotFoundError) as e:
                    await (await rs.key_value("CFG")).get("k")
        assert not isinstance(e.value, errors.BucketNotFoundError)
        assert str(e.value) == "key 'k' not found"

    run(main())


def _taken(node: FakeNode, existing: StreamConfig) -> None:
    serve_info(node, existing)
    node.on(
        "CreateStream",
        refuse(
            errors.AlreadyExistsError(
                f"stream {existing.name!r} already exists with a different configuration",
                field="name",
            )
        ),
    )


def test_create_over_a_bucket_with_other_settings_names_the_bucket_and_what_differs():
    """``kv add TTL --ttl 5s`` over TTL made without a TTL: AlreadyExistsError about bucket
    'TTL' (which settings differ), never about the stream 'KV_TTL'."""

    async def main() -> None:
        async with Nodes(1) as (node,):
            _taken(node, bucket_stream_config("TTL"))
            async with await connected(node) as rs:
                with pytest.raises(errors.AlreadyExistsError) as e:
                    await rs.create_key_value("TTL", ttl=5, history=3)
        text = str(e.value)
        assert text.startswith("bucket 'TTL' already exists with a different configuration")
        assert "ttl forever (asked 5s)" in text and "history 1 (asked 3)" in text
        assert "KV_" not in text
        assert e.value.details["bucket"] == "TTL"

    run(main())


def test_create_over_a_stream_that_is_not_a_bucket_says_so():
    async def main() -> None:
        async with Nodes(1) as (node,):
            _taken(node, StreamConfig(name="KV_FAKE", subjects=("fake.x",)))
            async with await connected(node) as rs:
                with pytest.raises(errors.AlreadyExistsError) as e:
                    await rs.create_key_value("FAKE")
        assert "bucket 'FAKE' cannot be created" in str(e.value)
        assert "not a bucket" in str(e.value)

    run(main())


# -- 3. create_key_value arguments ------------------------------------------------------------

BAD_ARGUMENTS: list[tuple[str, Any, str]] = [
    ("storage", "disk", "'file', 'memory'"),
    ("storage", 1, "'file', 'memory'"),
    ("history", 0, "1 to 64"),
    ("history", 65, "1 to 64"),
    ("history", "5", "1 to 64"),
    ("history", True, "1 to 64"),
    ("ttl", -1, "seconds"),
    ("ttl", 0.05, "0.1"),
    ("ttl", "5s", "seconds"),
    ("ttl", math.nan, "seconds"),
    ("ttl", math.inf, "seconds"),
    ("ttl", 10**12, "seconds"),
    ("replicas", 0, "1 to 5"),
    ("replicas", 6, "1 to 5"),
    ("replicas", 2.0, "1 to 5"),
    ("max_value_size", -2, "unlimited"),
    ("max_value_size", 2**31, "unlimited"),
    ("max_value_size", "1K", "unlimited"),
    ("max_bytes", -5, "unlimited"),
    ("max_bytes", 1.5, "unlimited"),
    ("description", 7, "string"),
]


@pytest.mark.parametrize(("field", "value", "rule"), BAD_ARGUMENTS)
def test_every_bad_create_argument_is_invalid_argument_naming_it_and_nothing_is_sent(
    field: str, value: Any, rule: str
) -> None:
    async def main() -> None:
        async with Nodes(1) as (node,):
            node.on("CreateStream", refuse(errors.InvariantError("must not be called")))
            async with await connected(node) as rs:
                with pytest.raises(errors.InvalidArgumentError) as e:
                    await rs.create_key_value("X", **{field: value})
            assert node.calls_to("CreateStream") == []
        assert type(e.value) is errors.InvalidArgumentError
        assert e.value.field == field
        assert rule in e.value.rule and str(e.value).startswith(f"{field}: ")

    run(main())


def test_good_create_arguments_pass_the_checks():
    cfg = bucket_stream_config(
        "OK", history=64, ttl=0.1, max_value_size=0, max_bytes=1 << 30, storage="memory"
    )
    assert (cfg.max_age, cfg.storage.value, cfg.max_msgs_per_subject) == (10**8, "memory", 64)
    assert bucket_stream_config("OK", ttl=0).max_age == 0  # 0 and None: forever


# -- 4. update_key_value: the duplicate window follows the ttl --------------------------------


def _eng(cfg: StreamConfig) -> eng_stream.StreamConfig:
    return eng_stream.StreamConfig.from_dict(cfg.to_dict())


def _node_made(cfg: StreamConfig) -> StreamConfig:
    """``cfg`` as the node stores it once created: its defaults (the duplicate window among
    them) filled in by the engine's own rules."""
    return StreamConfig.from_dict(eng_stream.check_create(_eng(cfg)).to_dict())


@pytest.mark.parametrize(
    ("made_ttl", "new_ttl", "window_s"),
    [(600, 30, 30), (None, 1, 1), (600, 0.1, 0.1), (30, 600, 120), (30, 0, 120), (1, 90, 90)],
)
def test_an_update_of_the_ttl_sets_the_duplicate_window_as_a_create_does(
    made_ttl: float | None, new_ttl: float, window_s: float
) -> None:
    """``kv add TTL2 --ttl 10m; kv edit TTL2 --ttl 30s`` (and ``kv edit --ttl 1s`` of a
    bucket kept forever) was refused 'duplicate_window: must not be larger than max_age': the
    update kept the 2-minute window the node gave the bucket at create. A create leaves the
    window to the node's default (2 min, or the TTL when shorter, as nats.go's KV sets it),
    and so does an update of the TTL: it leaves the bucket a create with that TTL makes. The
    fake node answers by the engine's own update rules (``check_update``)."""
    stored = _node_made(bucket_stream_config("TTL2", ttl=made_ttl, history=3))
    updated: list[StreamConfig] = []

    async def update(req: Any, ctx: Any) -> pb.StreamInfo:
        new = eng_stream.StreamConfig.from_dict(json.loads(req.config_json))
        cfg = eng_stream.check_update(_eng(stored), new)
        updated.append(StreamConfig.from_dict(cfg.to_dict()))
        return info_pb(updated[-1])

    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, stored)
            node.on("UpdateStream", update)
            async with await connected(node) as rs:
                await rs.update_key_value("TTL2", ttl=new_ttl)

    run(main())
    assert updated == [_node_made(bucket_stream_config("TTL2", ttl=new_ttl or None, history=3))]
    assert updated[0].duplicate_window == int(window_s * NS_PER_S)


def test_an_update_that_changes_no_ttl_keeps_the_duplicate_window():
    """``kv edit --history 4`` changes no TTL: the stream's window stays as it is."""
    stored = dataclasses.replace(
        _node_made(bucket_stream_config("W", ttl=600)), duplicate_window=5 * NS_PER_S
    )

    async def main() -> Any:
        async with Nodes(1) as (node,):
            serve_info(node, stored)
            node.on("UpdateStream", lambda req, ctx: asyncio.sleep(0, info_pb(stored)))
            async with await connected(node) as rs:
                await rs.update_key_value("W", history=4)
            (call,) = node.calls_to("UpdateStream")
            return json.loads(call.request.config_json)

    sent = run(main())
    assert (sent["duplicate_window"], sent["max_msgs_per_subject"]) == (5 * NS_PER_S, 4)


def test_a_bad_ttl_in_an_update_names_ttl_and_nothing_is_sent():
    async def main() -> None:
        async with Nodes(1) as (node,):
            serve_info(node, _node_made(bucket_stream_config("TTL2", ttl=600)))
            async with await connected(node) as rs:
                for value in [v for f, v, _ in BAD_ARGUMENTS if f == "ttl"]:
                    with pytest.raises(errors.InvalidArgumentError) as e:
                        await rs.update_key_value("TTL2", ttl=value)
                    assert e.value.field == "ttl", value
            assert node.calls_to("UpdateStream") == []

    run(main())


# -- 5. which streams are buckets ---------------------------------------------------------------


def test_only_streams_made_as_buckets_are_buckets():
    assert bucket_of(bucket_stream_config("CFG", history=5)) == "CFG"
    assert bucket_of(StreamConfig(name="KV_FAKE", subjects=("fake.x",))) is None
    assert bucket_of(StreamConfig(name="KV_FAKE", subjects=("$KV.FAKE.>",))) is None  # history
    assert bucket_of(StreamConfig(name="ORDERS", subjects=("orders.>",))) is None


def test_bucket_listing_and_opening_leave_out_a_plain_stream_named_kv():
    async def main() -> None:
        fake = StreamConfig(name="KV_FAKE", subjects=("fake.x",))
        real = bucket_stream_config("CFG", history=3)
        async with Nodes(1) as (node,):

            async def listing(req: Any, ctx: Any) -> pb.ListStreamsResponse:
                return pb.ListStreamsResponse(
                    streams=[info_pb(fake), info_pb(real, last_seq=2), info_pb(StreamConfig(
                        name="ORDERS", subjects=("orders.>",)))],
                    page=pb.Page(total=3, offset=0, limit=256),
                )  # fmt: skip

            node.on("ListStreams", listing)
            serve_info(node, fake)
            async with await connected(node) as rs:
                statuses = await bucket_statuses(rs)
                with pytest.raises(errors.BucketNotFoundError) as e:
                    await rs.key_value("FAKE")
                with pytest.raises(errors.BucketNotFoundError):
                    await rs.delete_key_value("FAKE")
            assert node.calls_to("DeleteStream") == []  # a plain stream is never deleted
        assert [(s.bucket, s.history, s.values) for s in statuses] == [("CFG", 3, 2)]
        assert "bucket 'FAKE' not found" in str(e.value)

    run(main())
