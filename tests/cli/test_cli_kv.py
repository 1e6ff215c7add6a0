"""``raftstream kv`` as a NATS JetStream KV user meets it (docs/cli.md, "kv"), against the
shared real 3-node cluster; the user review's findings, one test each.

Pins: ``kv ls`` says ``No buckets defined`` when there are none (``--json``: ``[]``), as
``stream ls`` says ``No streams defined``, and lists only streams made as buckets;
``kv get --revision`` of a revision the history dropped names the revision and the history;
errors name buckets, never their ``KV_`` streams, and are printed once (``kv add`` over a
bucket with other settings, ``kv watch`` of a bucket deleted meanwhile); every option of
every kv command has a help text; ``kv info`` shows the limits, storage and the replicas'
health, and its JSON gives the TTL in nanoseconds like the rest of the command line.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import click
import click.testing
import pytest

from raftstream.cli.kv import kv

from .runner import RAFTSTREAM, cli_env, ok, rs

pytestmark = pytest.mark.integration

WATCH_END_LIMIT_S = 45  # a safety net against hangs, not a timed assertion


def error_line(res: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a failed run (exit 1)."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr)
    return lines[0]


# -- 5. kv ls ----------------------------------------------------------------------------------


def test_kv_ls_says_none_and_lists_only_streams_made_as_buckets(cluster: Any) -> None:
    """First in the module: the module's cluster has no bucket yet. A plain stream named
    KV_FAKE is no bucket: not listed, not opened."""
    ok(cluster, "stream", "add", "KV_FAKE", "--subjects", "fake.x")
    assert ok(cluster, "kv", "ls").strip() == "No buckets defined"
    assert "KV_FAKE" in ok(cluster, "stream", "ls")  # a stream all the same
    assert json.loads(ok(cluster, "kv", "ls", "--json")) == []
    ok(cluster, "kv", "add", "REAL", "--history", "3")
    listed = ok(cluster, "kv", "ls")
    assert "REAL" in listed and "FAKE" not in listed
    assert [b["bucket"] for b in json.loads(ok(cluster, "kv", "ls", "--json"))] == ["REAL"]
    info = rs(cluster, "kv", "info", "FAKE")
    assert "BUCKET_NOT_FOUND: bucket 'FAKE' not found" in error_line(info)
    ok(cluster, "kv", "rm", "REAL", "-f")
    ok(cluster, "stream", "rm", "KV_FAKE", "-f")


# -- 4. help texts -----------------------------------------------------------------------------


def test_every_option_of_every_kv_command_has_a_help_text() -> None:
    missing = [
        f"kv {name} {'/'.join(p.opts)}"
        for name, cmd in kv.commands.items()
        for p in cmd.params
        if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
    ]
    assert missing == []
    assert {"--storage", "--replicas", "--description"} <= {
        opt for p in kv.commands["add"].params for opt in p.opts
    }


# -- 1. a revision the history dropped ---------------------------------------------------------


def test_kv_get_of_a_dropped_revision_names_the_revision(cluster: Any) -> None:
    ok(cluster, "kv", "add", "REVS", "--history", "2")
    for value in ("1", "2", "3"):
        ok(cluster, "kv", "put", "REVS", "a.b", value)
    ok(cluster, "kv", "put", "REVS", "other", "x")
    dropped = error_line(rs(cluster, "kv", "get", "REVS", "a.b", "--revision", "1"))
    assert dropped.startswith("raftstream: error: KEY_NOT_FOUND: revision 1 of key 'a.b'")
    assert "keeps 2 revisions per key" in dropped
    other = error_line(rs(cluster, "kv", "get", "REVS", "a.b", "--revision", "4"))
    assert "KEY_NOT_FOUND: revision 4 of key 'a.b' not found" in other
    assert ok(cluster, "kv", "get", "REVS", "a.b", "--revision", "3", "--raw") == "3"
    ok(cluster, "kv", "rm", "REVS", "-f")


# -- 2. bucket names, once ---------------------------------------------------------------------


def test_kv_add_over_a_bucket_with_other_settings_names_the_bucket(cluster: Any) -> None:
    ok(cluster, "kv", "add", "TTL")
    ok(cluster, "kv", "add", "TTL")  # the same settings: idempotent
    line = error_line(rs(cluster, "kv", "add", "TTL", "--ttl", "5s"))
    assert line.startswith(
        "raftstream: error: ALREADY_EXISTS: bucket 'TTL' already exists with a different "
        "configuration"
    )
    assert "ttl forever (asked 5s)" in line and "KV_TTL" not in line
    ok(cluster, "kv", "rm", "TTL", "-f")


def test_kv_watch_of_a_bucket_deleted_meanwhile_ends_with_one_line_naming_it(
    cluster: Any,
) -> None:
    ok(cluster, "kv", "add", "TMPB", "--replicas", "3")
    ok(cluster, "kv", "put", "TMPB", "k", "v")
    watch = subprocess.Popen(
        [str(RAFTSTREAM), "kv", "watch", "TMPB"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(cluster),
    )
    try:
        assert watch.stdout is not None
        assert "PUT TMPB > k revision 1: v" in watch.stdout.readline()  # the watch is on
        ok(cluster, "kv", "rm", "TMPB", "-f")
        out, err = watch.communicate(timeout=WATCH_END_LIMIT_S)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    lines = [line for line in err.splitlines() if not line.startswith("(end of current")]
    assert watch.returncode == 1, (out, err)
    assert lines == ["raftstream: error: BUCKET_NOT_FOUND: bucket 'TMPB' not found"], err


def test_kv_commands_on_a_missing_bucket_name_the_bucket(cluster: Any) -> None:
    for args in (
        ("get", "NOPE", "k"),
        ("put", "NOPE", "k", "v"),
        ("info", "NOPE"),
        ("ls", "NOPE"),
        ("history", "NOPE", "k"),
        ("watch", "NOPE"),
        ("rm", "NOPE", "-f"),
    ):
        line = error_line(rs(cluster, "kv", *args))
        assert line == "raftstream: error: BUCKET_NOT_FOUND: bucket 'NOPE' not found", args


# -- 6. kv info --------------------------------------------------------------------------------


def test_kv_info_shows_limits_storage_and_replica_health_ttl_in_ns_in_json(cluster: Any) -> None:
    ok(
        cluster,
        "kv", "add", "INFO", "--replicas", "3", "--ttl", "5s", "--max-value-size", "1K",
        "--max-bytes", "1M", "--storage", "memory", "--description", "settings",
    )  # fmt: skip
    fields = dict(
        line.strip().split(": ", 1) for line in ok(cluster, "kv", "info", "INFO").splitlines()[1:]
    )
    assert fields["TTL"] == "5s"
    assert (fields["Max value size"], fields["Max bytes"]) == ("1.0 KiB", "1.0 MiB")
    assert (fields["Storage"], fields["Replicas"], fields["Description"]) == (
        "memory",
        "3",
        "settings",
    )
    assert fields["Leader"] in ("n1", "n2", "n3")
    replicas = {k: v for k, v in fields.items() if k.startswith("Replica ")}
    assert len(replicas) == 2 and all("lag" in v for v in replicas.values())

    data = json.loads(ok(cluster, "kv", "info", "INFO", "--json"))
    assert "ttl_s" not in data
    assert data["ttl"] == 5 * 1_000_000_000  # nanoseconds, as docs/cli.md "Output" says
    stream_cfg = json.loads(ok(cluster, "stream", "info", "KV_INFO", "--json"))["config"]
    assert data["ttl"] == stream_cfg["max_age"]  # the same units as the stream's JSON
    assert (data["max_value_size"], data["max_bytes"], data["storage"]) == (
        1024,
        1 << 20,
        "memory",
    )
    assert (data["replicas"], data["description"]) == (3, "settings")
    assert data["cluster"]["leader"] == fields["Leader"]
    assert len(data["cluster"]["replicas"]) == 2
    listed = json.loads(ok(cluster, "kv", "ls", "--json"))
    assert [b["ttl"] for b in listed if b["bucket"] == "INFO"] == [5 * 1_000_000_000]
    ok(cluster, "kv", "rm", "INFO", "-f")


def test_kv_add_with_a_ttl_below_the_minimum_names_ttl(cluster: Any) -> None:
    line = error_line(rs(cluster, "kv", "add", "SHORT", "--ttl", "50ms"))
    assert line.startswith("raftstream: error: INVALID_ARGUMENT: ttl: ")
    assert "max_age" not in line
    gone = error_line(rs(cluster, "kv", "info", "SHORT"))
    assert "BUCKET_NOT_FOUND" in gone  # nothing was created


def test_kv_create_update_and_purge_as_the_nats_cli_names_them(cluster: Any) -> None:
    """``kv create`` (only when the key has no value), ``kv update ... REV``
    (compare-and-set) and ``kv purge`` (the key's history gone), as nats has them."""
    ok(cluster, "kv", "add", "CUP", "--history", "5")
    assert "revision 1" in ok(cluster, "kv", "create", "CUP", "k", "one")
    taken = error_line(rs(cluster, "kv", "create", "CUP", "k", "again"))
    assert "KEY_EXISTS: key 'k' exists (revision 1)" in taken
    assert "revision 2" in ok(cluster, "kv", "update", "CUP", "k", "two", "1")
    stale = error_line(rs(cluster, "kv", "update", "CUP", "k", "three", "1"))
    assert "KEY_WRONG_LAST_SEQUENCE" in stale
    assert ok(cluster, "kv", "get", "CUP", "k", "--raw") == "two"
    ok(cluster, "kv", "purge", "CUP", "k", "-f")
    history = json.loads(ok(cluster, "kv", "history", "CUP", "k", "--json"))
    assert [h["operation"] for h in history] == ["PURGE"]
    assert "revision 4" in ok(cluster, "kv", "create", "CUP", "k", "anew")  # purged: no value
    ok(cluster, "kv", "rm", "CUP", "-f")


def test_kv_edit_changes_the_settings_given(cluster: Any) -> None:
    """``kv edit`` as nats has it: the options given change, the others stay; none is a
    usage error; the storage is not an option (a stream cannot change it)."""
    ok(cluster, "kv", "add", "KED", "--history", "4", "--ttl", "1h")
    for i in range(3):
        ok(cluster, "kv", "put", "KED", "k", f"v{i}")
    edited = json.loads(ok(cluster, "kv", "edit", "KED", "--history", "2", "--replicas", "3",
                           "--json"))  # fmt: skip
    assert (edited["history"], edited["replicas"], edited["ttl"]) == (2, 3, 3600 * 10**9)
    history = json.loads(ok(cluster, "kv", "history", "KED", "k", "--json"))
    assert [h["value"] for h in history] == ["v1", "v2"]
    assert "TTL" in ok(cluster, "kv", "edit", "KED", "--ttl", "0")
    assert json.loads(ok(cluster, "kv", "info", "KED", "--json"))["ttl"] == 0
    nothing = rs(cluster, "kv", "edit", "KED")
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    ok(cluster, "kv", "rm", "KED", "-f")


def test_kv_edit_takes_a_ttl_under_two_minutes_as_kv_add_does(cluster: Any) -> None:
    """``kv add TTL2 --ttl 10m; kv edit TTL2 --ttl 30s`` was refused 'duplicate_window: must
    not be larger than max_age' (a stream field the user never set) while ``kv add --ttl 1s``
    worked: an edit of the TTL sets the duplicate window as ``add`` does (docs/cli.md)."""
    ok(cluster, "kv", "add", "TTL2", "--ttl", "10m")
    edited = json.loads(ok(cluster, "kv", "edit", "TTL2", "--ttl", "30s", "--json"))
    assert edited["ttl"] == 30 * 10**9
    ok(cluster, "kv", "rm", "TTL2", "-f")


# -- a bucket no replica answered for ----------------------------------------------------------


def _offline_status() -> Any:
    from raftstream.kv import KeyValueStatus
    from raftstream.models import StreamConfig, StreamInfo, StreamState

    info = StreamInfo(
        config=StreamConfig(name="KV_LONE", subjects=("$KV.LONE.>",), max_msgs_per_subject=5),
        state=StreamState(
            messages=0, bytes=0, first_seq=0, first_ts_ns=0, last_seq=0, last_ts_ns=0
        ),
        cluster=None,
        created_ns=0,
        state_known=False,
    )
    return KeyValueStatus.from_stream_info("LONE", info)


def test_a_bucket_no_replica_answered_for_is_not_shown_empty(monkeypatch: Any) -> None:
    """Listed while every node hosting it was down, a bucket showed 0 values and 0 bytes,
    as an empty bucket (a user review; ``stream ls`` already said so): ``kv ls`` and
    ``kv info`` now say its state is unknown, and the JSON gives null counts."""
    import raftstream.cli.kv as cli_kv

    status = _offline_status()
    fields = dict(cli_kv._status_fields(status))
    assert fields["State"].startswith("unknown: no replica answered")
    assert "Values stored" not in fields and "Bytes" not in fields
    as_json = cli_kv._status_json(status)
    assert (as_json["values"], as_json["bytes"], as_json["state_known"]) == (None, None, False)

    monkeypatch.setattr(cli_kv, "run", lambda conn, fn: [status])
    listed = click.testing.CliRunner().invoke(kv, ["ls"])
    assert listed.exit_code == 0, listed.output
    (row,) = [line for line in listed.output.splitlines() if "LONE" in line]
    assert row.split()[1:2] == ["?"] and "offline: no replica answered" in row, row


def test_kv_json_gives_a_revision_time_in_created_ns_as_every_other_json_time() -> None:
    """docs/cli.md "Output": times are nanoseconds in ``..._ns`` fields, not JetStream's RFC
    3339 ``created``; kv get/history/watch printed ``"created": "2026-...Z"`` (a user
    review)."""
    import raftstream.cli.kv as cli_kv
    from raftstream.kv import KeyValueEntry

    entry = KeyValueEntry(
        bucket="CONFIG", key="a", value=b"1", revision=3, created_ns=1_700_000_000_123_456_789
    )
    as_json = cli_kv._entry_json(entry)
    assert as_json["created_ns"] == 1_700_000_000_123_456_789 and "created" not in as_json
