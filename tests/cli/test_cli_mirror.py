"""``raftstream stream add --mirror/--mirror-external/--source`` and the link lines of
``stream info`` (docs/cli.md, docs/mirrors.md)."""

from __future__ import annotations

import click
import pytest

from raftstream.cli.stream import _link_state, stream_params
from raftstream.config import StreamConfig
from raftstream.models import StreamSourceInfo


def test_mirror_and_source_flags_become_jetstream_fields() -> None:
    params = stream_params({"mirror": "ORDERS", "mirror_external": ("h1:1,h2:2",)})
    assert params == {"mirror": {"name": "ORDERS", "external": {"api": ["h1:1", "h2:2"]}}}
    cfg = StreamConfig(name="M", **params)
    assert cfg.to_dict()["mirror"] == {"name": "ORDERS", "external": {"api": ["h1:1", "h2:2"]}}
    sources = stream_params({"source": ("EU,US", "ASIA")})
    assert [s["name"] for s in sources["sources"]] == ["EU", "US", "ASIA"]


def test_mirror_external_alone_is_a_usage_error() -> None:
    with pytest.raises(click.UsageError):
        stream_params({"mirror_external": ("h:1",)})


def test_a_link_line_shows_position_lag_skips_and_error() -> None:
    link = StreamSourceInfo(
        name="O",
        external=("h:1",),
        lag=7,
        active_ns=2_000_000_000,
        error="UnavailableError: down",
        last_origin_seq=40,
        skipped=((1, 9),),
        skipped_msgs=9,
        running=True,
    )
    line = _link_state(link)
    for part in ("external h:1", "last origin seq 40, lag 7", "skipped 9 (1-9)", "error: Unav"):
        assert part in line
    assert "not running" in _link_state(StreamSourceInfo(name="O"))


def test_a_stream_no_replica_answered_for_shows_its_state_unknown() -> None:
    """Listed through a node while every node hosting it is down, a stream came back with
    zeros and showed as empty (a user review); its info now says the state is unknown."""
    from raftstream.cli.stream import _info_fields
    from raftstream.models import StreamInfo, StreamState

    info = StreamInfo(
        config=StreamConfig(name="LONE", subjects=("lone.>",)),
        state=StreamState(
            messages=0, bytes=0, first_seq=0, first_ts_ns=0, last_seq=0, last_ts_ns=0
        ),
        cluster=None,
        created_ns=0,
        state_known=False,
    )
    fields = dict(_info_fields(info))
    assert fields["State"].startswith("unknown: no replica answered")
    assert "Messages" not in fields


def test_info_says_what_a_link_copies_and_ls_names_the_origin() -> None:
    """A filtered or transformed link showed only its position (a user review): stream info
    now says what it copies, and stream ls marks mirrors and sources."""
    from raftstream.cli.stream import _info_fields, _subjects_cell
    from raftstream.config import StreamSource, SubjectTransform
    from raftstream.models import StreamInfo, StreamState

    mirror = StreamConfig(
        name="M", mirror=StreamSource(name="ORD", filter_subject="ord.eu.>", opt_start_seq=100)
    )
    info = StreamInfo(
        config=mirror,
        state=StreamState(
            messages=0, bytes=0, first_seq=0, first_ts_ns=0, last_seq=0, last_ts_ns=0
        ),
        cluster=None,
        created_ns=0,
        mirror=StreamSourceInfo(name="ORD", running=True),
    )
    fields = dict(_info_fields(info))
    assert fields["Mirror ORD copies"] == "only ord.eu.>; from origin seq 100"
    assert _subjects_cell(mirror) == "(mirror of ORD)"
    to_all = SubjectTransform(src="us.*", dest="all.us.$1")
    us = StreamSource(name="US", subject_transforms=(to_all,))
    agg = StreamConfig(name="ALL", subjects=("all.>",), sources=(us, StreamSource(name="EU")))
    assert _subjects_cell(agg) == "all.> (sources US,EU)"
    info = StreamInfo(
        config=agg,
        state=info.state,
        cluster=None,
        created_ns=0,
        sources=(StreamSourceInfo(name="US", running=True), StreamSourceInfo(name="EU")),
    )
    fields = dict(_info_fields(info))
    assert fields["Source US copies"] == "us.* as all.us.$1"
    assert "Source EU copies" not in fields  # everything: nothing to say
