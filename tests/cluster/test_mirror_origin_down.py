"""Integration: stream info tells a dead origin from an idle one (docs/mirrors.md, "Stream
info": ``active_ns`` is the time since the link last heard from the origin, ``error`` why
the link does not copy).

Two R1 origins on n3 (a limits one, read with the ordered consumer, and an interest one,
read with the link's pull consumer), each mirrored on n1/n2. While both are idle the
mirrors show a small ``active_ns`` and no error (an idle origin answers). Then n3 is
killed: the ordered consumer keeps retrying on its own and delivers nothing, exactly as
for an idle origin, yet ``active_ns`` must grow past a few seconds and ``error`` say why.
Once n3 is back, both recover: new messages are copied, ``error`` clears and ``active_ns``
is small again. Waits poll; nothing asserts on timing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

import raftstream
from raftstream.config import Placement, StreamSource
from raftstream.models import StreamSourceInfo
from tests.support.cluster import LocalCluster, run, running
from tests.support.mirrors import settled, wait_copied
from tests.support.polling import retry_async, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ORIGIN_NODE = "n3"
TAGS = {"n1": ["links"], "n2": ["links"], ORIGIN_NODE: ["origin"]}
MIRRORS = {"LOM": "LO", "LIM": "LI"}  # mirror -> origin (limits, interest)
NS_PER_S = 1_000_000_000
UNHEARD_NS = 6 * NS_PER_S  # well past the 2 s a quiet wait of the link lasts
HEARD_NS = 3 * NS_PER_S
PRIVATE_NAME = re.compile(r"^_\w*:")


@pytest.fixture
def tagged3() -> Iterator[LocalCluster]:
    """Three nodes: the origins are placed on n3, the mirrors on n1 and n2."""
    with running(LocalCluster(3, tags=TAGS)) as c:
        yield c


async def _link(js: raftstream.Client, stream: str) -> StreamSourceInfo:
    info = await js.stream_info(stream)
    assert info.mirror is not None
    return info.mirror


async def _publish(js: raftstream.Client, origin: str, first: int, count: int) -> None:
    for i in range(first, first + count):
        await retry_async(lambda i=i: js.publish(f"{origin.lower()}.x", b"%d" % i))


def test_a_dead_origin_shows_as_unheard_with_an_error_and_recovers(tagged3: LocalCluster) -> None:
    c = tagged3

    async def body() -> None:
        js = await raftstream.connect(servers=c.servers, timeout=20)
        try:
            on_origin = Placement(tags=("origin",))
            on_links = Placement(tags=("links",))
            for origin, retention in (("LO", "limits"), ("LI", "interest")):
                await js.add_stream(
                    raftstream.StreamConfig(
                        name=origin,
                        subjects=(f"{origin.lower()}.>",),
                        retention=retention,
                        placement=on_origin,
                    )
                )
            for mirror, origin in MIRRORS.items():
                await js.add_stream(
                    raftstream.StreamConfig(
                        name=mirror, mirror=StreamSource(name=origin), placement=on_links
                    )
                )
            for stream in (*MIRRORS, *MIRRORS.values()):
                leader = wait_for(f"{stream}'s leader", lambda s=stream: c.stream_leader(s))
                assert (leader == ORIGIN_NODE) == (stream in MIRRORS.values()), (stream, leader)

            async def interest_held() -> bool:
                return len(await js.consumer_names("LI")) == 1  # the mirror's consumer

            await settled(interest_held, "the interest mirror's consumer on LI")
            for origin in MIRRORS.values():
                await _publish(js, origin, 0, 5)
            for mirror in MIRRORS:
                await wait_copied(js, mirror, 5)

            async def healthy(mirror: str) -> bool:
                link = await _link(js, mirror)
                return link.error is None and 0 <= link.active_ns < HEARD_NS and link.lag == 0

            for mirror in MIRRORS:  # idle, not dead: it answers
                await settled(lambda m=mirror: healthy(m), f"{mirror} idle and healthy")

            c.kill(ORIGIN_NODE)

            async def unheard(mirror: str) -> bool:
                link = await _link(js, mirror)
                if link.error is not None:
                    assert not PRIVATE_NAME.match(link.error), link.error
                return link.error is not None and link.active_ns > UNHEARD_NS

            for mirror in MIRRORS:
                await settled(
                    lambda m=mirror: unheard(m),
                    f"{mirror}: active_ns past {UNHEARD_NS} ns and an error, origin down",
                )

            c.start(ORIGIN_NODE)
            c.wait_serving(ORIGIN_NODE)
            for origin in MIRRORS.values():
                await _publish(js, origin, 5, 5)
            for mirror in MIRRORS:
                await wait_copied(js, mirror, 10)
                await settled(lambda m=mirror: healthy(m), f"{mirror} heard from again")
                assert (await js.stream_info(mirror)).state.messages == 10
        finally:
            await js.close()

    run(body())
