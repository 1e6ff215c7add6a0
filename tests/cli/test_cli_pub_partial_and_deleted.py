"""``pub --count`` when some messages are refused, and ``stream info --deleted``, against a
real 3-node cluster (docs/cli.md "pub and sub" and "stream info").

- Review: ``pub lim.a 'x{{Count}}' --count 5`` on a stream with ``--max-msgs 3 --discard
  new`` printed only ``raftstream: error: LIMIT: maximum messages exceeded`` although three
  messages were stored: acks were printed only when all succeeded. Now each ack is printed
  as it comes and the one error line says what was published (``-q``: only that line;
  ``--json``: one entry per message).
- Review: ``stream_info(name, deleted_details=True)`` gave ``num_deleted=9`` and
  ``deleted=()``. JetStream's ``deleted_details`` fills ``state.deleted`` with the deleted
  sequences; ``stream info --deleted`` shows them.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from raftstream.cli.pub import seq_ranges

from .runner import ok, rs

pytestmark = pytest.mark.integration


def _error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("raftstream: error: "), lines[0]
    return lines[0]


def _limited_stream(cluster: Any, name: str, subjects: str) -> None:
    ok(cluster, "stream", "add", name, "--subjects", subjects, "--replicas", "3",
       "--max-msgs", "3", "--discard", "new")  # fmt: skip


def test_pub_count_prints_what_was_stored_before_the_refusal(cluster: Any) -> None:
    _limited_stream(cluster, "LIMP", "limp.*")
    res = rs(cluster, "pub", "limp.a", "x{{Count}}", "--count", "5")
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["1", "2", "3"]
    assert all(line.startswith("Published 2 bytes to limp.a: stream LIMP seq") for line in lines)
    err = _error_line(res)
    assert "LIMIT: maximum messages exceeded" in err
    assert "(2 of 5 failed, first at message 4; 3 published: seq 1-3)" in err
    info = json.loads(ok(cluster, "stream", "info", "LIMP", "--json"))
    assert info["state"]["messages"] == 3


def test_pub_count_quiet_and_json_on_a_partial_refusal(cluster: Any) -> None:
    _limited_stream(cluster, "LIMQ", "limq.*")
    quiet = rs(cluster, "pub", "limq.a", "x{{Count}}", "--count", "4", "-q")
    assert quiet.returncode == 1 and quiet.stdout == ""
    assert "1 of 4 failed, message 4; 3 published: seq 1-3" in _error_line(quiet)

    again = rs(cluster, "pub", "limq.a", "y", "--count", "2", "--json")  # all refused now
    assert again.returncode == 1
    entries = json.loads(again.stdout)
    assert [e["error"]["reason"] for e in entries] == ["LIMIT", "LIMIT"]
    assert "2 of 2 failed, first at message 1; none published)" in _error_line(again)

    _limited_stream(cluster, "LIMJ", "limj.*")
    res = rs(cluster, "pub", "limj.a", "z{{Count}}", "--count", "5", "--json")
    assert res.returncode == 1
    entries = json.loads(res.stdout)  # one entry per message, in order
    assert [e.get("seq") for e in entries[:3]] == [1, 2, 3]
    assert all(e["stream"] == "LIMJ" and not e["duplicate"] for e in entries[:3])
    assert [e["error"]["reason"] for e in entries[3:]] == ["LIMIT", "LIMIT"]
    _error_line(res)

    # One message refused: the error line alone, as before (no JSON, no counts).
    single = rs(cluster, "pub", "limj.a", "w", "--json")
    assert single.returncode == 1 and single.stdout == ""
    assert _error_line(single) == "raftstream: error: LIMIT: maximum messages exceeded"


def test_seq_ranges_names_ranges_and_stops() -> None:
    assert seq_ranges([3, 1, 2, 7, 9, 10]) == "1-3, 7, 9-10"
    assert seq_ranges(list(range(1, 40, 2))).endswith(", ...")


def test_stream_info_deleted_lists_the_deleted_sequences(cluster: Any) -> None:
    ok(cluster, "stream", "add", "DELS", "--subjects", "dels.*", "--replicas", "3")
    ok(cluster, "pub", "dels.a", "m{{Count}}", "--count", "12", "-q")
    for seq in ("3", "4", "5", "9", "12"):  # 12: the last, removed from the end
        ok(cluster, "stream", "rmm", "DELS", seq, "-f")
    ok(cluster, "stream", "rmm", "DELS", "1", "-f")  # the first moves: not a deleted one

    plain = json.loads(ok(cluster, "stream", "info", "DELS", "--json"))
    assert plain["state"]["num_deleted"] == 5
    assert plain["state"]["deleted"] == []  # only when asked for

    state = json.loads(ok(cluster, "stream", "info", "DELS", "--deleted", "--json"))["state"]
    assert (state["first_seq"], state["last_seq"], state["num_deleted"]) == (2, 12, 5)
    assert state["deleted"] == [3, 4, 5, 9, 12]

    out = ok(cluster, "stream", "info", "DELS", "--deleted")
    tail = out[out.index("Deleted sequences") :].splitlines()
    rows = [line.split() for line in tail[2:]]
    assert rows == [["3", "5", "3"], ["9", "9", "1"], ["12", "12", "1"]]
    assert "lowest" not in out  # all of them were sent


def test_pub_and_sub_say_the_same_when_no_stream_matches(cluster: Any) -> None:
    """A bad-input review: ``pub`` said "no stream captures subject" and ``sub`` "no stream
    matches subject" for the same mistake, and then NOT_FOUND against NO_STREAM_MATCH: one
    mistake, one code and one message."""
    pub = rs(cluster, "pub", "nomatch.a", "x")
    sub = rs(cluster, "sub", "nomatch.a", "--count", "1")
    words = "NO_STREAM_MATCH: no stream matches subject 'nomatch.a'"
    assert pub.returncode == sub.returncode == 1, (pub.stderr, sub.stderr)
    assert words in _error_line(pub) and words in _error_line(sub)
