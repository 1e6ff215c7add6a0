"""What ``audit.logview.summarize`` says one stream-group entry did, for the ``raft_log``
table: a rollup removes messages, whether a publish or a copy that applies its origin's
rollup (``Copy.rollup``) made it; a copy that stores its rollup header as it is removes
nothing. No Spark: the summary is plain Python."""

from __future__ import annotations

import pytest

from raftstream.audit.logview import summarize
from raftstream.cluster.stream.entries import StreamBatch, encode
from raftstream.engine.entries import HDR_ROLLUP, Copy, Entry, plain_publish
from raftstream.raft.types import Entry as RaftEntry


def _copy(rollup: bool, headers: dict[str, str]) -> Copy:
    return Copy(ts_ns=1, origin="O", origin_seq=2, prev_origin_seq=1, subject="k",
                headers=headers, rollup=rollup)  # fmt: skip


@pytest.mark.parametrize(
    ("entries", "rollup"),
    [
        ((_copy(True, {HDR_ROLLUP: "sub"}),), True),
        ((_copy(False, {HDR_ROLLUP: "sub"}),), False),  # stored as it is
        ((_copy(True, {}),), False),
        ((plain_publish(1, "k", b"v"), _copy(True, {HDR_ROLLUP: "all"})), True),
    ],
)
def test_a_rollup_copy_is_summarized_as_a_removal(entries: tuple[Entry, ...], rollup: bool) -> None:
    raw = RaftEntry(index=3, term=1, data=encode(StreamBatch(entries=entries)))
    s = summarize(raw, "S:$G:M")
    assert (s.kind, s.rollup) == ("stream", rollup)
