"""The cluster benchmark's ``mirror`` part (issue 7): copy rate and lag of a mirror.

An origin stream and a mirror of it, both with ``num_replicas`` R (R3: origin and mirror
each replicated on all three nodes; their leaders may or may not share a node). While the
origin takes ``publish_async`` traffic (a client connected to its leader), the mirror's
lag (origin messages acknowledged minus mirror's last sequence) is sampled from
``stream_info`` every ``LAG_POLL_S``; once publishing ends, the mirror is waited for until it
holds the origin's last sequence. Figures:

- ``msgs_per_s``: messages copied per second, from the first publish until the mirror held
  the last one;
- ``lag_p50_msgs`` / ``lag_max_msgs``: the lag sampled in the second half of the publishing
  (steady state; the first half includes the link's start) and when it ended;
- ``catchup_s``: how long the mirror needed after the last publish was acknowledged;
- ``published_per_s``: the origin's acknowledged publish rate meanwhile.

Both streams are deleted afterwards. CPU is counted from the first publish until caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import raftstream
from raftstream.bench.cluster_nodes import BenchNodes
from raftstream.bench.cluster_parts import (
    CLIENT_TIMEOUT_S,
    DRAIN_TIMEOUT_S,
    Limits,
    Sample,
    _CpuWindow,
    _leader_client,
    _percentile,
    _publish_async_for,
    _stream_leader,
    _streams,
)
from raftstream.client import Client
from raftstream.config import StreamConfig, StreamSource

__all__ = ["part_mirror"]

LAG_POLL_S = 0.1


async def _sample_lag(
    admin: Client, mirror: str, origin: str, into: list[tuple[float, int]]
) -> None:
    """Append (time, origin last seq - mirror last seq) every LAG_POLL_S until cancelled."""
    while True:
        o, m = await asyncio.gather(admin.stream_info(origin), admin.stream_info(mirror))
        into.append((time.perf_counter(), max(0, o.state.last_seq - m.state.last_seq)))
        await asyncio.sleep(LAG_POLL_S)


async def _wait_mirrored(admin: Client, mirror: str, last_seq: int) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (await admin.stream_info(mirror)).state.last_seq < last_seq:
        if time.monotonic() > deadline:
            raise TimeoutError(f"mirror {mirror} not at {last_seq} after {DRAIN_TIMEOUT_S}s")
        await asyncio.sleep(LAG_POLL_S / 10)


async def part_mirror(nodes: BenchNodes, replicas: int, limits: Limits) -> Sample:
    """See the module docstring."""
    n = next(_streams)
    origin, mirror = f"BMO{replicas}_{n}", f"BMM{replicas}_{n}"
    subject = f"{origin.lower()}.a"
    admin = await raftstream.connect(servers=nodes.servers, timeout=CLIENT_TIMEOUT_S)
    try:
        await admin.add_stream(
            StreamConfig(name=origin, subjects=(f"{origin.lower()}.>",), num_replicas=replicas)
        )
        await admin.add_stream(
            StreamConfig(name=mirror, mirror=StreamSource(name=origin), num_replicas=replicas)
        )
        leader = await _stream_leader(admin, origin)
        client = await _leader_client(nodes, leader, limits.window)
        cpu = _CpuWindow(nodes)
        lags: list[tuple[float, int]] = []
        try:
            cpu.start()
            started = time.perf_counter()
            sampler = asyncio.get_running_loop().create_task(
                _sample_lag(admin, mirror, origin, lags)
            )
            try:
                outcomes, pub_s = await _publish_async_for(
                    client, subject, limits.msgs, limits.seconds
                )
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            published_at = time.perf_counter()
            last_seq = (await admin.stream_info(origin)).state.last_seq
            lags.append((published_at, last_seq - (await admin.stream_info(mirror)).state.last_seq))
            await _wait_mirrored(admin, mirror, last_seq)
            done = time.perf_counter()
            wall_s, cpu_s = cpu.stop(leader)
        finally:
            await client.close()
        await admin.delete_stream(mirror)
        await admin.delete_stream(origin)
    finally:
        await admin.close()
    half = started + (published_at - started) / 2
    # The second half of the publishing; all of it when that is too short to sample.
    steady = sorted(float(lag) for t, lag in lags if t >= half) or sorted(
        float(lag) for _, lag in lags
    )
    figures = {
        "msgs_per_s": last_seq / (done - started),
        "lag_p50_msgs": _percentile(steady, 0.5),
        "lag_max_msgs": steady[-1] if steady else float("nan"),
        "catchup_s": done - published_at,
        "published_per_s": outcomes.ok / pub_s,
    }
    return Sample(
        figures=figures,
        msgs=last_seq,
        leader=leader,
        wall_s=wall_s,
        cpu_s=cpu_s,
        errors=outcomes.summary(),
    )
