"""The command line's value parsing and output helpers (no cluster): durations and sizes as
docs/cli.md documents them, ``{{Count}}`` templates, one-line errors naming the field."""

from __future__ import annotations

from dataclasses import replace

import click
import pytest
from click.testing import CliRunner

from raftstream import errors
from raftstream.cli.app import cli
from raftstream.cli.cluster import group_labels, step_down_message
from raftstream.cli.common import (
    Conn,
    describe_error,
    fmt_bytes,
    fmt_duration_ns,
    parse_duration_ns,
    parse_size,
    parse_time_or_ago_ns,
)
from raftstream.cli.pub import render
from raftstream.cli.stream import _info_fields
from raftstream.config import StreamConfig
from raftstream.models import (
    ClusterGroup,
    ClusterInfo,
    GroupInfo,
    ReplicaInfo,
    StreamInfo,
    StreamState,
)

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [("30s", 30 * S), ("1h", 3600 * S), ("1m30s", 90 * S), ("250ms", S // 4), ("2d", 172800 * S),
     ("1.5s", 3 * S // 2), ("10", 10 * S), ("0", 0), ("500us", 500_000)],
)  # fmt: skip
def test_durations(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "soon", "1x", "-5s", "1h foo", "s"])
def test_bad_durations_raise(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ns(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("1024", 1024), ("1K", 1024), ("1KB", 1024), ("2MiB", 2 << 20), ("1g", 1 << 30),
     ("-1", -1), ("unlimited", -1)],
)  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_bad_size_raises() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_time_or_duration_from_now() -> None:
    assert parse_time_or_ago_ns("2030-01-01T00:00:00Z", future=True) == 1893456000 * S
    import time

    now = time.time_ns()
    ahead = parse_time_or_ago_ns("10m", future=True)
    assert 599 * S < ahead - now < 601 * S
    assert parse_time_or_ago_ns("1h", future=False) < now


def test_formatting() -> None:
    assert fmt_duration_ns(90 * S) == "1m30s" and fmt_duration_ns(0) == "0s"
    # Below a second, three significant digits ("active 13.5977ms ago" read as noise).
    assert [fmt_duration_ns(v) for v in (13_597_700, 250_000_000, 50_000, 7)] == [
        "13.6ms",
        "250ms",
        "0.05ms",
        "7ns",
    ]
    assert fmt_duration_ns(999_999_999) == "1s"
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(-1) == "unlimited" and fmt_bytes(5) == "5 B"


def test_count_placeholder_and_unknown_ones() -> None:
    assert render("order {{Count}} / {{ Count }}", 7) == "order 7 / 7"
    assert len(render("{{ID}}", 1)) == 16 and render("{{ID}}", 1) != render("{{ID}}", 1)
    with pytest.raises(click.UsageError, match="unknown placeholder"):
        render("{{Nope}}", 1)


def test_errors_are_one_line_with_reason_and_field() -> None:
    line = describe_error(errors.InvalidArgumentError("max_msgs", "must be -1 or positive"))
    assert line == "INVALID_ARGUMENT: max_msgs: must be -1 or positive"
    assert describe_error(errors.NotFoundError("stream 'X' not found")).startswith("NOT_FOUND: ")


def test_servers_from_flags_env_or_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAFTSTREAM_SERVERS", raising=False)
    assert Conn.from_options((), 5).servers == ("127.0.0.1:7101",)
    monkeypatch.setenv("RAFTSTREAM_SERVERS", "a:1, b:2")
    assert Conn.from_options((), 5).servers == ("a:1", "b:2")
    assert Conn.from_options(("c:3,d:4", "e:5"), 5).servers == ("c:3", "d:4", "e:5")


def test_tables_are_rich_on_a_terminal_and_plain_in_a_pipe(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import raftstream.cli.common as common

    rows = [("ORDERS", "orders.>", 3)]
    common.print_table("Streams", ["Name", "Subjects", "Replicas"], rows)
    plain = capsys.readouterr().out.splitlines()
    assert plain == ["Streams", "Name    Subjects  Replicas", "ORDERS  orders.>  3"]

    monkeypatch.setattr(common, "_is_terminal", lambda: True)
    common.print_table("Streams", ["Name", "Subjects", "Replicas"], rows)
    drawn = capsys.readouterr().out
    assert "┃" in drawn and "ORDERS" in drawn and "orders.>" in drawn
    common.print_fields("Stream ORDERS", [("Replicas", 3)])
    assert "Replicas" in capsys.readouterr().out


def test_stream_info_says_when_fewer_replicas_are_placed_than_configured() -> None:
    """A removed peer whose replica found no node to move to leaves an R3 stream with two
    copies: `Replicas: 3` alone hid that."""
    state = StreamState(messages=0, bytes=0, first_seq=0, first_ts_ns=0, last_seq=0, last_ts_ns=0)
    replica = ReplicaInfo(name="n2", current=True, offline=False, active_ns=0, lag=0)

    def info(replicas: tuple[ReplicaInfo, ...]) -> StreamInfo:
        return StreamInfo(
            config=StreamConfig(name="K", subjects=("k",), num_replicas=3),
            state=state,
            cluster=GroupInfo(name="S:$G:K", leader="n1", replicas=replicas),
            created_ns=0,
        )

    short = dict(_info_fields(info((replica,))))
    assert short["Under-replicated"] == "2 of 3 replicas placed"
    full = dict(_info_fields(info((replica, replace(replica, name="n3")))))
    assert "Under-replicated" not in full


def test_cluster_info_names_the_account_when_groups_span_several() -> None:
    """A $SYS user sees every account's streams, and two accounts may each have an ORDERS:
    the group names then carry the account; with one account they stay short."""

    def info(*streams: tuple[str, str]) -> ClusterInfo:
        group = GroupInfo(name="g", leader="n1")
        return ClusterInfo(
            name="c",
            meta_leader="n1",
            nodes=(),
            groups=(
                ClusterGroup(account=None, stream=None, group=group),
                *(ClusterGroup(account=a, stream=s, group=group) for a, s in streams),
            ),
            answered_by="n1",
        )

    assert group_labels(info(("A", "ORDERS"), ("B", "ORDERS"))) == [
        "meta",
        "stream A/ORDERS",
        "stream B/ORDERS",
    ]
    assert group_labels(info(("$G", "ORDERS"))) == ["meta", "stream ORDERS"]


def test_step_down_messages_say_what_moved() -> None:
    """A consumer step-down moves its stream's leadership (docs/cli.md, "cluster
    step-down"; operator review finding 8): its output and --help say so."""
    assert step_down_message("EVENTS", "proc", "n2") == (
        "consumer EVENTS/proc: its stream EVENTS's leader stepped down (consumers are led "
        "with their stream); new leader: n2"
    )
    assert step_down_message("EVENTS", None, "n2") == (
        "stream EVENTS leader stepped down; new leader: n2"
    )
    assert step_down_message(None, None, None) == (
        "meta leader stepped down; new leader: not known yet"
    )
    help_text = " ".join(CliRunner().invoke(cli, ["cluster", "step-down", "--help"]).stdout.split())
    assert "moves the leadership of the whole stream" in help_text
    assert "Consumers are led with their stream" in help_text
