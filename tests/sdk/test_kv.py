"""Key-value buckets against a real 3-node cluster (JetStream's KV layout and semantics).

Pins: the bucket's stream layout; put/get (at a revision), history bounded by
``max_msgs_per_subject``; create fails on a live key but succeeds over a delete or purge
marker; update is a compare-and-set on the last revision, and of two clients racing with the
same revision exactly one wins every round; delete and purge markers (a purge rolls the key
up); keys, history, watches with their end-of-initial-data marker; key validation; status.
"""

from __future__ import annotations

import asyncio

import pytest

from raftstream import errors
from raftstream.config import DiscardPolicy
from raftstream.kv import KeyValueOp, KeyWatcher
from tests.support.cluster import LocalCluster
from tests.support.polling import until

from .live import connected, run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("tails")]

NS = 1_000_000_000
RACE_ROUNDS = 15


def test_buckets_are_streams_laid_out_as_jetstream_lays_them_out(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value(
                "CFG", history=5, ttl=3600, max_value_size=1024, replicas=3, description="d"
            )
            info = await rs.stream_info("KV_CFG")
            c = info.config
            assert c.subjects == ("$KV.CFG.>",)
            assert (c.max_msgs_per_subject, c.max_age, c.max_msg_size) == (5, 3600 * NS, 1024)
            assert c.allow_rollup_hdrs and c.deny_delete and c.discard is DiscardPolicy.NEW
            assert c.num_replicas == 3
            again = await rs.create_key_value(
                "CFG", history=5, ttl=3600, max_value_size=1024, replicas=3, description="d"
            )
            assert again.bucket == kv.bucket  # identical: idempotent
            with pytest.raises(errors.AlreadyExistsError):
                await rs.create_key_value("CFG", history=2)
            status = await (await rs.key_value("CFG")).status()
            assert (status.bucket, status.history, status.ttl_s, status.values) == (
                "CFG",
                5,
                3600.0,
                0,
            )
            with pytest.raises(errors.LimitError) as too_big:
                await kv.put("k", b"x" * 2000)  # over max_value_size
            # Named as the bucket's setting, not its stream's max_msg_size (a user review).
            assert too_big.value.details["limit"] == "max_value_size"
            assert "bucket 'CFG''s max_value_size" in str(too_big.value)
            await rs.delete_key_value("CFG")

            async def gone() -> bool | None:
                try:
                    await rs.key_value("CFG")
                except errors.BucketNotFoundError:
                    return True
                return None  # a node's meta state may lag the delete by an apply

            await until(gone, what="bucket CFG gone")
            with pytest.raises(errors.BucketNotFoundError):
                await rs.delete_key_value("CFG")
            with pytest.raises(errors.InvalidArgumentError):
                await rs.create_key_value("bad.name")
            with pytest.raises(errors.InvalidArgumentError):
                await rs.create_key_value("H", history=65)

    run(body())


def test_put_get_revisions_and_bounded_history(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("HIST", history=3, replicas=3)
            revs = [await kv.put("color", b"v%d" % i) for i in range(5)]
            assert revs == sorted(revs) and len(set(revs)) == 5
            latest = await kv.get("color")
            assert (latest.value, latest.revision, latest.key) == (b"v4", revs[4], "color")
            assert (await kv.get("color", revision=revs[3])).value == b"v3"
            with pytest.raises(errors.KeyNotFoundError):
                await kv.get("color", revision=revs[0])  # beyond history: gone
            await kv.put("other", b"o")
            with pytest.raises(errors.KeyNotFoundError):
                await kv.get("color", revision=revs[4] + 1)  # that revision is "other"'s
            with pytest.raises(errors.KeyNotFoundError):
                await kv.get("never")
            history = await kv.history("color")
            assert [e.value for e in history] == [b"v2", b"v3", b"v4"]
            assert [e.revision for e in history] == revs[2:]

    run(body())


def test_update_key_value_changes_what_it_is_given_and_keeps_the_rest(
    cluster: LocalCluster,
) -> None:
    """``update_key_value`` (``kv edit``): the settings given change, the others stay;
    fewer revisions drop the older ones; ttl 0 is forever; a bad value names its argument
    and changes nothing; a missing bucket is named."""

    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("EDIT", history=5, ttl=3600, description="d")
            revs = [await kv.put("k", b"v%d" % i) for i in range(4)]
            await rs.update_key_value("EDIT", history=2, max_value_size=1024)
            st = await kv.status()
            assert (st.history, st.max_value_size, st.ttl_ns) == (2, 1024, 3600 * 10**9)
            assert (st.description, st.replicas) == ("d", 1)
            assert [e.revision for e in await kv.history("k")] == revs[2:]
            cfg = (await rs.stream_info("KV_EDIT")).config
            assert cfg.allow_rollup_hdrs and cfg.deny_delete and cfg.allow_direct
            await rs.update_key_value("EDIT", ttl=0, description="")
            st = await kv.status()
            assert (st.ttl_ns, st.description, st.history) == (0, "", 2)
            with pytest.raises(errors.InvalidArgumentError, match="history"):
                await rs.update_key_value("EDIT", history=65)
            with pytest.raises(errors.InvalidArgumentError, match="ttl"):
                await rs.update_key_value("EDIT", ttl=-1)
            assert (await kv.status()).history == 2
            with pytest.raises(errors.BucketNotFoundError, match="NOPE"):
                await rs.update_key_value("NOPE", history=2)
            with pytest.raises(errors.InvalidArgumentError, match="history"):
                await rs.update_key_value("NOPE", history=0)  # checked before it is looked up

    run(body())


def test_update_key_value_takes_a_ttl_under_the_two_minute_duplicate_window(
    cluster: LocalCluster,
) -> None:
    """``kv add TTL2 --ttl 10m; kv edit TTL2 --ttl 30s`` and ``kv edit --ttl 1s`` of a bucket
    kept forever (both were refused 'duplicate_window: must not be larger than max_age'): an
    update of the TTL sets the duplicate window as a create does (2 min, or the TTL when
    shorter), so the bucket is the one ``kv add --ttl`` makes."""

    async def body() -> None:
        async with connected(cluster) as rs:

            async def ttl_and_window(bucket: str) -> tuple[int, int]:
                cfg = (await rs.stream_info(f"KV_{bucket}")).config
                return cfg.max_age, cfg.duplicate_window

            await rs.create_key_value("TTL2", ttl=600)
            await rs.update_key_value("TTL2", ttl=30)
            assert await ttl_and_window("TTL2") == (30 * NS, 30 * NS)
            await rs.update_key_value("TTL2", ttl=0)
            assert await ttl_and_window("TTL2") == (0, 120 * NS)
            await rs.create_key_value("FOREVER")
            await rs.update_key_value("FOREVER", ttl=1)
            await rs.create_key_value("TTL1", ttl=1)
            assert await ttl_and_window("FOREVER") == await ttl_and_window("TTL1") == (NS, NS)

    run(body())


def test_create_update_delete_and_purge(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("OPS", history=10, replicas=3)
            r1 = await kv.create("k", b"1")
            with pytest.raises(errors.KeyExistsError):
                await kv.create("k", b"again")
            r2 = await kv.update("k", b"2", last=r1)
            with pytest.raises(errors.KeyWrongLastSequenceError):
                await kv.update("k", b"stale", last=r1)
            d = await kv.delete("k")
            with pytest.raises(errors.KeyDeletedError) as e:
                await kv.get("k")
            assert e.value.details["revision"] == d
            r3 = await kv.create("k", b"3")  # over a delete marker
            assert (await kv.get("k")).value == b"3"
            history = await kv.history("k")
            assert [(h.revision, h.operation) for h in history] == [
                (r1, KeyValueOp.PUT),
                (r2, KeyValueOp.PUT),
                (d, KeyValueOp.DEL),
                (r3, KeyValueOp.PUT),
            ]
            with pytest.raises(errors.KeyWrongLastSequenceError):
                await kv.delete("k", last=r2)
            p = await kv.purge("k")
            history = await kv.history("k")  # the rollup removed everything before it
            assert [(h.revision, h.operation) for h in history] == [(p, KeyValueOp.PURGE)]
            with pytest.raises(errors.KeyDeletedError):
                await kv.get("k")
            assert await kv.create("k", b"4") > p  # over a purge marker

    run(body())


def test_keys_skip_deleted_and_purged_keys(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("KEYS", history=2, replicas=3)
            assert await kv.keys() == []
            for key in ("a", "b.c", "d", "e"):
                await kv.put(key, b"x")
            await kv.put("a", b"y")
            await kv.delete("d")
            await kv.purge("e")
            assert sorted(await kv.keys()) == ["a", "b.c"]

    run(body())


def test_watch_initial_values_then_marker_then_updates(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("W", history=5, replicas=3)
            await kv.put("a.1", b"old")
            await kv.put("a.1", b"new")
            await kv.put("a.2", b"two")
            await kv.put("b.1", b"other")
            async with await kv.watch("a.*") as w:
                initial = [await w.updates(10), await w.updates(10)]
                assert [(e.key, e.value) for e in initial if e] == [
                    ("a.1", b"new"),
                    ("a.2", b"two"),
                ]
                assert await w.updates(10) is None  # end of the initial data
                await kv.put("b.2", b"not watched")
                await kv.put("a.3", b"three")
                await kv.delete("a.1")
                e3 = await w.updates(10)
                d1 = await w.updates(10)
                assert e3 is not None and (e3.key, e3.value) == ("a.3", b"three")
                assert d1 is not None and (d1.key, d1.operation) == ("a.1", KeyValueOp.DEL)
            empty = await rs.create_key_value("WEMPTY", replicas=3)
            watcher = await empty.watchall()
            assert isinstance(watcher, KeyWatcher)
            assert await watcher.updates(10) is None  # nothing stored: the marker first
            await empty.put("x", b"1")
            entry = await watcher.updates(10)
            assert entry is not None and entry.value == b"1"
            await watcher.stop()

    run(body())


def test_keys_are_validated(cluster: LocalCluster) -> None:
    async def body() -> None:
        async with connected(cluster) as rs:
            kv = await rs.create_key_value("VAL", replicas=3)
            for bad in ("", ".a", "a.", "a..b", "a b", "a*", ">", "_kv.x", "a/b\n"):
                with pytest.raises(errors.InvalidKeyError):
                    await kv.put(bad, b"x")
            with pytest.raises(errors.InvalidKeyError):
                await kv.get("a.>")
            await kv.put("ok-key/with_=.parts", b"x")
            assert (await kv.get("ok-key/with_=.parts")).value == b"x"
            with pytest.raises(errors.InvalidKeyError):
                await kv.watch("a.>.b")

    run(body())


def test_compare_and_set_races_between_two_clients(cluster: LocalCluster) -> None:
    """Two clients read the same revision and both update with it: exactly one wins every
    round, and the bucket then holds the winner's value at the winner's revision."""

    async def body() -> None:
        async with connected(cluster) as one, connected(cluster) as two:
            kv1 = await one.create_key_value("RACE", history=64, replicas=3)
            kv2 = await two.key_value("RACE")
            last = await kv1.put("counter", b"0")
            for rnd in range(1, RACE_ROUNDS + 1):
                seen1 = (await kv1.get("counter")).revision
                seen2 = (await kv2.get("counter")).revision
                assert seen1 == seen2 == last
                outcomes = await asyncio.gather(
                    kv1.update("counter", b"%d-one" % rnd, last=seen1),
                    kv2.update("counter", b"%d-two" % rnd, last=seen2),
                    return_exceptions=True,
                )
                wins = [o for o in outcomes if isinstance(o, int)]
                losses = [o for o in outcomes if isinstance(o, BaseException)]
                assert len(wins) == 1, outcomes
                assert len(losses) == 1 and isinstance(losses[0], errors.KeyWrongLastSequenceError)
                winner = "one" if isinstance(outcomes[0], int) else "two"
                current = await kv2.get("counter")
                assert (current.revision, current.value) == (
                    wins[0],
                    b"%d-%s" % (rnd, winner.encode()),
                )
                last = wins[0]
            # create races too: one creator per fresh key
            for rnd in range(RACE_ROUNDS):
                outcomes = await asyncio.gather(
                    kv1.create(f"new.{rnd}", b"one"),
                    kv2.create(f"new.{rnd}", b"two"),
                    return_exceptions=True,
                )
                assert sum(isinstance(o, int) for o in outcomes) == 1, outcomes
                assert sum(isinstance(o, errors.KeyExistsError) for o in outcomes) == 1

    run(body())


def test_a_watch_of_a_bucket_deleted_meanwhile_ends_once_naming_the_bucket(
    cluster: LocalCluster,
) -> None:
    """The watch's end is raised by ``updates`` as ``BucketNotFoundError`` naming the
    bucket, and not also given to the error callback (the CLI printed it twice, naming the
    stream ``KV_TMPB``)."""

    async def body() -> None:
        errs: list[errors.RaftStreamError] = []
        async with connected(cluster, errs) as rs:
            kv = await rs.create_key_value("TMPB", replicas=3)
            await kv.put("k", b"v")
            async with await kv.watch() as w:
                first = await w.updates(10)
                assert first is not None and first.value == b"v"
                assert await w.updates(10) is None
                await rs.delete_key_value("TMPB")
                with pytest.raises(errors.BucketNotFoundError) as e:
                    await w.updates(60)
            assert str(e.value) == "bucket 'TMPB' not found"
            assert [x for x in errs if not x.retriable] == []
            with pytest.raises(errors.BucketNotFoundError):
                await kv.put("k", b"again")  # no stream captures its subject any more

    run(body())
