"""Mirror buckets and buckets with sources (raftstream.kv, "Mirrors and sources"), against a
real 3-node cluster: a mirror keeps the origin's revisions and keys, reads and watches them,
and sends its writes to the origin; a bucket with sources holds their keys as its own
besides its own writes; each is listed as a bucket; bad links are refused naming the
argument, before anything is sent.
"""

from __future__ import annotations

import pytest

from raftstream import errors
from raftstream.config import StreamSource
from raftstream.kv import KeyValue, KeyValueOp, bucket_statuses, bucket_stream_config
from tests.support.cluster import LocalCluster
from tests.support.polling import until

from .live import connected, run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("tails")]


async def _value(kv: KeyValue, key: str) -> bytes | None:
    try:
        return (await kv.get(key)).value
    except (errors.KeyNotFoundError, errors.KeyDeletedError):
        return None


def test_a_mirror_bucket_reads_the_origins_keys_and_writes_to_the_origin(
    cluster: LocalCluster,
) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            origin = await rs.create_key_value("ORIG", history=3, replicas=3)
            r1 = await origin.put("app.color", b"blue")
            await origin.put("app.size", b"3")
            mirror = await rs.create_key_value("COPY", history=3, replicas=3, mirror="ORIG")
            assert mirror.mirror_of == "ORIG"
            same = await rs.create_key_value("COPY", history=3, replicas=3, mirror="ORIG")
            assert same.mirror_of == "ORIG"  # identical: idempotent
            info = await rs.stream_info("KV_COPY")
            assert info.config.subjects == () and info.config.mirror is not None
            assert info.config.mirror.name == "KV_ORIG"

            async def copied() -> bool | None:
                return await _value(mirror, "app.size") == b"3" or None

            await until(copied, what="the mirror holds app.size")
            got = await mirror.get("app.color")
            assert (got.bucket, got.key, got.value, got.revision) == ("COPY", "app.color",
                                                                     b"blue", r1)  # fmt: skip
            # A write through the mirror lands in the origin, then in the mirror.
            r3 = await mirror.put("app.color", b"green")
            assert (await origin.get("app.color")).revision == r3
            await until(lambda: _green(mirror), what="the mirror holds the write made through it")
            with pytest.raises(errors.KeyWrongLastSequenceError):
                await mirror.update("app.color", b"red", last=r1)  # checked at the origin
            await origin.delete("app.size")

            async def deleted() -> bool | None:
                try:
                    await mirror.get("app.size")
                except errors.KeyDeletedError:
                    return True
                return None

            await until(deleted, what="the delete marker copied")
            assert sorted(await mirror.keys()) == ["app.color"]
            hist = await mirror.history("app.color")
            assert [(e.value, e.operation) for e in hist] == [
                (b"blue", KeyValueOp.PUT),
                (b"green", KeyValueOp.PUT),
            ]
            # A purge at the origin rolls the key up in the mirror too: only its marker stays.
            await origin.purge("app.color")

            async def rolled_up() -> bool | None:
                hist = await mirror.history("app.color")
                return [e.operation for e in hist] == [KeyValueOp.PURGE] or None

            await until(rolled_up, what="the purge rolled up in the mirror")
            await origin.put("app.color", b"green")
            await until(lambda: _green(mirror), what="the mirror holds the new value")
            # Opened by name, it is still the mirror; both are listed as buckets.
            again = await rs.key_value("COPY")
            assert again.mirror_of == "ORIG" and (await again.get("app.color")).value == b"green"
            statuses = {s.bucket: s for s in await bucket_statuses(rs)}
            assert statuses["COPY"].mirror == "ORIG" and statuses["ORIG"].mirror is None
            # With its origin gone, a write says where writes go.
            await rs.delete_key_value("ORIG")
            with pytest.raises(errors.BucketNotFoundError) as gone:
                await again.put("app.color", b"x")
            assert "bucket 'ORIG' not found here: bucket 'COPY' mirrors it" in str(gone.value)
            await rs.delete_key_value("COPY")

    run(body())


async def _green(kv: KeyValue) -> bool | None:
    return await _value(kv, "app.color") == b"green" or None


def test_a_bucket_with_sources_holds_their_keys_as_its_own(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            eu = await rs.create_key_value("EU", replicas=3)
            us = await rs.create_key_value("US", replicas=3)
            await eu.put("paris", b"fr")
            await us.put("boston", b"ma")
            world = await rs.create_key_value(
                "WORLD", history=2, replicas=3, sources=["EU", StreamSource(name="KV_US")]
            )
            assert world.mirror_of is None
            await rs.create_key_value(  # identical: idempotent
                "WORLD", history=2, replicas=3, sources=["EU", StreamSource(name="KV_US")]
            )
            await world.put("tokyo", b"jp")  # its own keys too
            cfg = (await rs.stream_info("KV_WORLD")).config
            assert cfg.subjects == ("$KV.WORLD.>",)
            assert [(s.name, [(t.src, t.dest) for t in s.subject_transforms])
                    for s in cfg.sources] == [
                ("KV_EU", [("$KV.EU.>", "$KV.WORLD.>")]),
                ("KV_US", [("$KV.US.>", "$KV.WORLD.>")]),
            ]  # fmt: skip

            async def all_three() -> bool | None:
                return sorted(await world.keys()) == ["boston", "paris", "tokyo"] or None

            await until(all_three, what="WORLD holds every source's keys")
            assert (await world.get("paris")).value == b"fr"
            await eu.put("paris", b"fr2")
            await eu.purge("paris")  # rolls the key up in WORLD too

            async def rolled_up() -> bool | None:
                hist = await world.history("paris")
                return [e.operation for e in hist] == [KeyValueOp.PURGE] or None

            await until(rolled_up, what="the purge rolled up in WORLD")
            status = await world.status()
            assert status.sources == ("EU", "US") and status.mirror is None
            with pytest.raises(errors.AlreadyExistsError) as differs:
                await rs.create_key_value("WORLD", history=2, replicas=3, sources=["EU"])
            assert "sources EU, US (asked EU)" in str(differs.value)
            for b in ("WORLD", "EU", "US"):
                await rs.delete_key_value(b)

    run(body())


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"mirror": "A", "sources": ["B"]}, "mirror", "not both"),
        ({"mirror": "B"}, "mirror", "cannot mirror itself"),
        ({"mirror": "bad.name"}, "mirror", "letters, digits"),
        ({"mirror": 7}, "mirror", "a bucket name or a StreamSource"),
        ({"sources": ["B"]}, "sources", "cannot source itself"),
        ({"sources": [StreamSource(name="KV_x y")]}, "sources", "letters, digits"),
        ({"sources": 3}, "sources", "must be a list of buckets"),
    ],
)
def test_bad_links_are_refused_naming_the_argument(
    kwargs: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(errors.InvalidArgumentError) as bad:
        bucket_stream_config("B", **kwargs)  # type: ignore[arg-type]
    assert bad.value.details["field"] == field and words in str(bad.value)
