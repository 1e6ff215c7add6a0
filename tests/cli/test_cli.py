"""The ``raftstream`` command line as a user runs it, against a real 3-node cluster.

Most runs are real subprocesses of the installed console script (stdout is a pipe, so the
output is the plain form); a few fast ones use click's CliRunner. What is pinned is what
docs/cli.md documents: tables and fields by name, ``--json`` that parses, one-line errors
naming the problem (NOT_FOUND, a validation error's field) and the exit codes 0 / 1 / 2.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from raftstream.cli.app import cli
from tests.support.polling import wait_for

from .runner import RAFTSTREAM, cli_env, ok, rs

pytestmark = pytest.mark.integration


def invoke(cluster: Any, *args: str) -> Any:
    """The same through CliRunner (in process, fast); servers given with -s."""
    return CliRunner().invoke(cli, [*args, "-s", ",".join(cluster.servers)])


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("raftstream: error: "), lines[0]
    return lines[0]


# -- streams ---------------------------------------------------------------------------------


def test_stream_add_info_ls_rm(cluster: Any) -> None:
    out = ok(cluster, "stream", "add", "ORDERS", "--subjects", "orders.>", "--replicas", "3",
             "--max-age", "1h", "--dupe-window", "30s", "--description", "orders")  # fmt: skip
    assert "Stream ORDERS" in out and "Replicas: 3" in out and "Max age: 1h" in out

    info = json.loads(ok(cluster, "stream", "info", "ORDERS", "--json"))
    assert info["config"]["num_replicas"] == 3
    assert info["config"]["max_age"] == 3600 * 10**9
    assert info["config"]["duplicate_window"] == 30 * 10**9
    assert info["config"]["subjects"] == ["orders.>"]
    assert info["cluster"]["leader"] in ("n1", "n2", "n3")

    table = ok(cluster, "stream", "ls").splitlines()
    assert table[1].split()[:3] == ["Name", "Subjects", "Replicas"]
    assert any(line.split()[:3] == ["ORDERS", "orders.>", "3"] for line in table)
    assert "ORDERS" in json.loads(ok(cluster, "stream", "ls", "--names", "--json"))

    refused = rs(cluster, "stream", "rm", "ORDERS")  # stdin is not a TTY: no prompt
    assert refused.returncode == 2
    assert "stdin is not a terminal: pass -f" in one_error_line(refused)

    assert "Deleted stream ORDERS" in ok(cluster, "stream", "rm", "ORDERS", "-f")
    gone = rs(cluster, "stream", "info", "ORDERS")
    assert gone.returncode == 1
    assert "NOT_FOUND" in one_error_line(gone) and "ORDERS" in gone.stderr


def test_pub_with_count_substitution_then_get_rmm_purge(cluster: Any) -> None:
    ok(cluster, "stream", "add", "PUB", "--subjects", "pub.*", "--replicas", "3")
    out = ok(cluster, "pub", "pub.a", "order {{Count}}", "--count", "3",
             "--msg-id", "id-{{Count}}", "-H", "X-Seq:{{Count}}")  # fmt: skip
    lines = out.strip().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == ["1", "2", "3"]
    assert all("stream PUB seq" in line and "7 bytes" in line for line in lines)

    again = json.loads(ok(cluster, "pub", "pub.a", "x", "--msg-id", "id-2", "--json"))
    assert again == [{"stream": "PUB", "seq": 2, "duplicate": True, "domain": None}]

    msg = json.loads(ok(cluster, "stream", "get", "PUB", "2", "--json"))
    assert (msg["seq"], msg["data"], msg["subject"]) == (2, "order 2", "pub.a")
    assert msg["headers"]["X-Seq"] == "2" and msg["headers"]["Nats-Msg-Id"] == "id-2"
    assert "order 3" in ok(cluster, "stream", "get", "PUB", "--last-for", "pub.a")

    assert "Deleted message 2" in ok(cluster, "stream", "rmm", "PUB", "2", "-f")
    missing = rs(cluster, "stream", "get", "PUB", "2")
    assert missing.returncode == 1 and "NOT_FOUND" in one_error_line(missing)

    ok(cluster, "pub", "pub.b", "b {{Count}}", "--count", "2", "--quiet")
    assert "Purged 1 messages" in ok(cluster, "stream", "purge", "PUB", "--subject", "pub.a",
                                     "--keep", "1", "-f")  # fmt: skip
    state = json.loads(ok(cluster, "stream", "info", "PUB", "--json"))["state"]
    assert (state["messages"], state["last_seq"]) == (3, 5)
    assert "Purged 3 messages" in ok(cluster, "stream", "purge", "PUB", "-f")


def test_stream_edit_and_config_file(cluster: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "s.json"
    cfg.write_text(json.dumps({"name": "CFG", "subjects": ["cfg.>"], "max_msgs": 50}))
    out = ok(cluster, "stream", "add", "--config", str(cfg), "--max-bytes", "1K")
    assert "Max messages: 50" in out and "Max bytes: 1.0 KiB" in out
    res = invoke(cluster, "stream", "edit", "CFG", "--max-msgs", "10", "--deny-purge", "--json")
    assert res.exit_code == 0, res.output
    config = json.loads(res.stdout)["config"]
    assert (config["max_msgs"], config["max_bytes"], config["deny_purge"]) == (10, 1024, True)
    assert config["subjects"] == ["cfg.>"]  # untouched fields kept
    # A user review: a key the config has no field for was dropped without a word (a
    # misspelt limit, JetStream's no_ack), and a file naming another stream edited this one.
    # Such a key is a usage error naming --config (exit 2; a later review: it exited 1).
    for body, field in (({"max_msg": 5}, "'max_msg'"), ({"no_ack": True}, "'no_ack'")):
        cfg.write_text(json.dumps({"name": "CFG", **body}))
        for args in (("add", "--config"), ("edit", "CFG", "--config")):
            res = rs(cluster, "stream", *args, str(cfg))
            line = res.stderr.strip().splitlines()[-1]
            assert res.returncode == 2 and "--config" in line, (args, res.stderr)
            assert f"{field}: not a field of" in line, (args, line)
    cfg.write_text(json.dumps({"name": "OTHER", "max_msgs": 5}))
    res = rs(cluster, "stream", "edit", "CFG", "--config", str(cfg))
    assert res.returncode == 1 and "names stream 'OTHER', not 'CFG'" in one_error_line(res)
    assert json.loads(ok(cluster, "stream", "info", "CFG", "--json"))["config"]["max_msgs"] == 10
    ccfg = tmp_path / "c.json"
    ccfg.write_text(json.dumps({"durable_name": "w", "max_ack_pendng": 5}))
    res = rs(cluster, "consumer", "add", "CFG", "--config", str(ccfg))
    assert res.returncode == 2 and "'max_ack_pendng': not a field of" in res.stderr
    ok(cluster, "stream", "rm", "CFG", "-f")


# -- consumers -------------------------------------------------------------------------------


def test_consumer_add_next_ack_info_ls_rm(cluster: Any) -> None:
    ok(cluster, "stream", "add", "WORK", "--subjects", "work.>", "--replicas", "3")
    ok(cluster, "pub", "work.1", "job {{Count}}", "--count", "3", "--quiet")
    out = ok(cluster, "consumer", "add", "WORK", "worker", "--filter", "work.>",
             "--max-deliver", "5", "--ack-wait", "30s", "--backoff", "30s,60s")  # fmt: skip
    assert "Kind: pull" in out and "Max deliver: 5" in out and "Backoff: 30s, 1m" in out

    out = ok(cluster, "consumer", "next", "WORK", "worker", "--count", "2", "--ack")
    assert "job 1" in out and "job 2" in out and "[#1] WORK > worker" in out
    info = json.loads(ok(cluster, "consumer", "info", "WORK", "worker", "--json"))
    assert info["ack_floor"]["stream_seq"] == 2 and info["num_ack_pending"] == 0

    nxt = json.loads(ok(cluster, "consumer", "next", "WORK", "worker", "--json"))
    assert [(m["stream_seq"], m["data"]) for m in nxt] == [(3, "job 3")]
    info = json.loads(ok(cluster, "consumer", "info", "WORK", "worker", "--json"))
    assert info["num_ack_pending"] == 1  # not acked without --ack

    empty = rs(cluster, "consumer", "next", "WORK", "worker", "--wait", "0.5")
    assert empty.returncode == 1 and "TIMEOUT" in one_error_line(empty)
    # A mistyped name is an error, not a new durable consumer.
    typo = rs(cluster, "consumer", "next", "WORK", "wroker", "--wait", "0.5")
    assert typo.returncode == 1 and "NOT_FOUND" in one_error_line(typo)
    assert "wroker" not in ok(cluster, "consumer", "ls", "WORK")

    table = ok(cluster, "consumer", "ls", "WORK").splitlines()
    # Unprocessed 0, ack pending 1 (job 3), last delivered stream seq 3.
    assert any(line.split() == ["worker", "pull", "explicit", "0", "1", "0", "3"] for line in table)
    assert "Deleted consumer WORK > worker" in ok(cluster, "consumer", "rm", "WORK", "worker", "-f")
    assert "No consumers on stream WORK" in ok(cluster, "consumer", "ls", "WORK")
    ok(cluster, "stream", "rm", "WORK", "-f")


def test_consumer_next_prints_each_message_as_it_comes(cluster: Any) -> None:
    """Two available of 100 asked, with a long --wait: both are on screen while the command
    still waits for more, and a third published then is shown too (it printed nothing until
    --wait passed, a user review)."""
    ok(cluster, "stream", "add", "TRICKLE", "--subjects", "trickle.>", "--replicas", "3")
    ok(cluster, "pub", "trickle.1", "drop {{Count}}", "--count", "2", "--quiet")
    ok(cluster, "consumer", "add", "TRICKLE", "reader")
    proc = subprocess.Popen(
        [str(RAFTSTREAM), "consumer", "next", "TRICKLE", "reader", "--count", "100",
         "--wait", "25"],  # one request within a node's 30 s cap: it ended only then
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True, env=cli_env(cluster),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]  # a header line and a body each
        assert [line.strip() for line in lines[1::2]] == ["drop 1", "drop 2"]
        # Still waiting for the other 98: one published now comes (the whole request's
        # answer came only when its wait was over, and the command ended with it).
        ok(cluster, "pub", "trickle.1", "drop 3", "--quiet")
        assert [proc.stdout.readline() for _ in range(2)][1].strip() == "drop 3"
    finally:
        proc.kill()
        proc.wait()


def test_consumer_push_config_file_pause_resume(cluster: Any, tmp_path: Path) -> None:
    assert invoke(cluster, "stream", "add", "PUSH", "--subjects", "push.>").exit_code == 0
    bad = tmp_path / "bad.json"  # a field's bad value: one error line, no traceback
    bad.write_text(json.dumps({"durable_name": "cc", "ack_policy": "bogus"}))
    res = rs(cluster, "consumer", "add", "PUSH", "--config", str(bad))
    assert res.returncode == 1 and "ack_policy" in one_error_line(res)
    bad.write_text(json.dumps({"name": "X", "subjects": "x.>"}))
    res = rs(cluster, "stream", "add", "--config", str(bad))
    assert res.returncode == 1 and "subjects" in one_error_line(res)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"durable_name": "audit", "ack_policy": "all"}))
    res = invoke(cluster, "consumer", "add", "PUSH", "--config", str(cfg), "--push",
                 "--heartbeat", "5s", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    config = json.loads(res.stdout)["config"]
    assert config["ack_policy"] == "all" and config["deliver_subject"] == "deliver.audit"
    assert config["idle_heartbeat"] == 5 * 10**9

    res = invoke(cluster, "consumer", "pause", "PUSH", "audit", "--until", "10m", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["paused"] is True
    res = invoke(cluster, "consumer", "resume", "PUSH", "audit")
    assert res.exit_code == 0 and "Resumed PUSH > audit" in res.stdout
    # A time in the past printed "Paused ... until 2020" and paused nothing (a user review).
    res = rs(cluster, "consumer", "pause", "PUSH", "audit", "--until", "2020-01-01T00:00:00Z")
    assert res.returncode == 2 and "--until" in res.stderr and "in the past" in res.stderr
    assert json.loads(ok(cluster, "consumer", "info", "PUSH", "audit", "--json"))["paused"] is False
    # Switching kinds named a pull-only field of the edited config (max_waiting).
    for name, kind in (("audit", "--pull"), ("audit", "--deliver-subject="), ("work", "--push")):
        if name == "work" and "work" not in ok(cluster, "consumer", "ls", "PUSH", "-n"):
            ok(cluster, "consumer", "add", "PUSH", "work")
        res = rs(cluster, "consumer", "edit", "PUSH", name, kind)
        line = one_error_line(res)
        assert res.returncode == 1, (kind, line)
        assert "deliver_subject: can not switch a consumer between pull and push" in line, line
    assert invoke(cluster, "stream", "rm", "PUSH", "-f").exit_code == 0


# -- errors ----------------------------------------------------------------------------------


def test_refused_values_name_their_field_with_exit_1(cluster: Any) -> None:
    res = rs(cluster, "stream", "add", "BAD", "--subjects", "bad.>", "--max-age", "50ms")
    assert res.returncode == 1
    assert "INVALID_ARGUMENT: max_age: must be at least 100ms" in one_error_line(res)

    ok(cluster, "stream", "add", "VAL", "--subjects", "val.>")
    res = rs(cluster, "consumer", "add", "VAL", "c1", "--max-pending", "-3")
    assert res.returncode == 1 and "max_ack_pending" in one_error_line(res)
    res = rs(cluster, "consumer", "add", "NOPE", "c1")
    assert res.returncode == 1 and "NOT_FOUND" in one_error_line(res)
    res = rs(cluster, "pub", "nostream.x", "m", "--count", "3")  # one line, not one per message
    line = one_error_line(res)
    assert res.returncode == 1 and "NO_STREAM_MATCH" in line and "nostream.x" in res.stderr
    ok(cluster, "stream", "rm", "VAL", "-f")


def test_usage_errors_exit_2(cluster: Any) -> None:
    res = rs(cluster, "stream", "add", "X", "--max-age", "soon")
    assert res.returncode == 2 and "not a duration" in res.stderr
    res = rs(cluster, "stream", "get", "X")
    assert res.returncode == 2 and "either SEQ or --last-for" in res.stderr
    res = rs(cluster, "pub", "a.b", "{{Nope}}")
    assert res.returncode == 2 and "unknown placeholder" in res.stderr


def test_unreachable_server_is_one_line_exit_1(cluster: Any, free_dead_addr: str) -> None:
    res = rs(cluster, "stream", "ls", "-s", free_dead_addr, "--timeout", "0.5")
    line = one_error_line(res)  # the SDK's reason: UNAVAILABLE (or its NOT_CONNECTED kind)
    assert res.returncode == 1 and ("UNAVAILABLE" in line or "NOT_CONNECTED" in line), line


# -- sub, cluster, bench ---------------------------------------------------------------------


def test_sub_count_reads_then_cleans_up(cluster: Any) -> None:
    ok(cluster, "stream", "add", "SUB", "--subjects", "sub.>", "--replicas", "3")
    ok(cluster, "pub", "sub.x", "m{{Count}}", "--count", "4", "--quiet")
    out = ok(cluster, "sub", "sub.x", "--count", "3", "--raw")
    assert out.split() == ["m1", "m2", "m3"]
    line = ok(cluster, "sub", "sub.>", "--count", "1", "--deliver", "last", "--json")
    assert json.loads(line)["data"] == "m4"
    ordered = ok(cluster, "sub", "sub.>", "--ordered", "--count", "4", "--json").splitlines()
    assert [json.loads(m)["stream_seq"] for m in ordered] == [1, 2, 3, 4]
    assert json.loads(ok(cluster, "consumer", "ls", "SUB", "--json")) == []  # ephemerals gone

    # A durable named on the command line outlives it, and acked messages stay acked.
    assert ok(cluster, "sub", "sub.x", "--durable", "keep", "--count", "2", "--raw").split() == [
        "m1",
        "m2",
    ]
    assert ok(cluster, "sub", "sub.x", "--durable", "keep", "--count", "1", "--raw").split() == [
        "m3"
    ]
    assert json.loads(ok(cluster, "consumer", "ls", "SUB", "--names", "--json")) == ["keep"]
    res = rs(cluster, "sub", "sub.x", "--ordered", "--durable", "keep")
    assert res.returncode == 2
    ok(cluster, "stream", "rm", "SUB", "-f")


def test_kv_add_put_get_history_ls_del_watch(cluster: Any) -> None:
    out = ok(cluster, "kv", "add", "CONF", "--history", "5", "--replicas", "3")
    assert "Bucket CONF" in out and "History per key: 5" in out
    assert ok(cluster, "kv", "put", "CONF", "app.color", "blue").strip().endswith("revision 1")
    assert "revision 2" in ok(cluster, "kv", "put", "CONF", "app.color", "green", "--last", "1")
    stale = rs(cluster, "kv", "put", "CONF", "app.color", "red", "--last", "1")
    assert stale.returncode == 1 and "KEY_WRONG_LAST_SEQUENCE" in one_error_line(stale)
    ok(cluster, "kv", "put", "CONF", "app.size", "3")

    assert ok(cluster, "kv", "get", "CONF", "app.color", "--raw").strip() == "green"
    first = json.loads(ok(cluster, "kv", "get", "CONF", "app.color", "--revision", "1", "--json"))
    assert (first["value"], first["revision"], first["operation"]) == ("blue", 1, "PUT")
    history = json.loads(ok(cluster, "kv", "history", "CONF", "app.color", "--json"))
    assert [(h["revision"], h["value"]) for h in history] == [(1, "blue"), (2, "green")]

    buckets = json.loads(ok(cluster, "kv", "ls", "--json"))
    assert [(b["bucket"], b["values"], b["history"]) for b in buckets] == [("CONF", 3, 5)]
    assert sorted(json.loads(ok(cluster, "kv", "ls", "CONF", "--json"))) == [
        "app.color",
        "app.size",
    ]
    assert "Deleted CONF > app.size" in ok(cluster, "kv", "del", "CONF", "app.size", "-f")
    missing = rs(cluster, "kv", "get", "CONF", "app.size")
    assert missing.returncode == 1 and "KEY_DELETED" in one_error_line(missing)
    assert json.loads(ok(cluster, "kv", "ls", "CONF", "--json")) == ["app.color"]

    watched = ok(cluster, "kv", "watch", "CONF", "--count", "2").splitlines()
    assert "PUT CONF > app.color revision 2: green" in watched[0]
    assert "DEL CONF > app.size revision 4" in watched[1]
    gone = rs(cluster, "kv", "info", "NOBUCKET")
    assert gone.returncode == 1 and "BUCKET_NOT_FOUND" in one_error_line(gone)
    assert "Deleted bucket CONF" in ok(cluster, "kv", "rm", "CONF", "-f")


def test_kv_mirror_and_sources(cluster: Any) -> None:
    ok(cluster, "kv", "add", "ORIGX", "--history", "2")
    ok(cluster, "kv", "put", "ORIGX", "k", "v1")
    out = ok(cluster, "kv", "add", "MX", "--history", "2", "--mirror", "ORIGX")
    assert "Mirror of: ORIGX" in out
    out = ok(cluster, "kv", "add", "ALLX", "--source", "ORIGX", "--source", "MX")
    assert "Sources: ORIGX, MX" in out
    info = json.loads(ok(cluster, "kv", "info", "MX", "--json"))
    assert (info["mirror"], info["sources"]) == ("ORIGX", [])
    wait_for(
        "the mirror to hold k",
        lambda: rs(cluster, "kv", "get", "MX", "k", "--raw").stdout.strip() == "v1",
        30,
        interval_s=0.2,
    )
    assert ok(cluster, "kv", "put", "MX", "k", "v2").strip().endswith("revision 2")
    assert ok(cluster, "kv", "get", "ORIGX", "k", "--raw").strip() == "v2"
    both = rs(cluster, "kv", "add", "BADX", "--mirror", "ORIGX", "--source", "MX")
    assert both.returncode == 1 and "mirror: a bucket mirrors one bucket" in one_error_line(both)
    for bucket in ("ALLX", "MX", "ORIGX"):
        ok(cluster, "kv", "rm", bucket, "-f")


def test_cluster_info_and_step_down(cluster: Any) -> None:
    info = json.loads(ok(cluster, "cluster", "info", "--json"))
    assert sorted(n["name"] for n in info["nodes"]) == ["n1", "n2", "n3"]
    assert info["meta_leader"] in ("n1", "n2", "n3")
    plain = ok(cluster, "cluster", "info")
    assert "Meta leader: " + info["meta_leader"] in plain and "Nodes" in plain
    # -s and --timeout may also come before the command, as with the nats CLI.
    before = CliRunner().invoke(cli, ["-s", ",".join(cluster.servers), "cluster", "info"])
    assert before.exit_code == 0 and "Meta leader: " in before.stdout
    res = invoke(cluster, "cluster", "step-down")
    assert res.exit_code == 0 and "meta leader stepped down" in res.stdout
    # peer-remove is for a dead node: an online one is refused, and nothing changes.
    res_rm = rs(cluster, "cluster", "peer-remove", "n3", "-f")
    assert res_rm.returncode == 1
    assert "error: FAILED_PRECONDITION: node n3 is online" in one_error_line(res_rm)
    # So is forgetting it; forgetting a name the cluster does not know names the field.
    res_forget = rs(cluster, "cluster", "peer-remove", "n3", "--forget", "-f")
    assert res_forget.returncode == 1
    assert "error: FAILED_PRECONDITION: node n3 is online" in one_error_line(res_forget)
    res_unknown = rs(cluster, "cluster", "peer-remove", "n9", "--forget", "-f")
    assert res_unknown.returncode == 1
    assert "peer: 'n9' is not a node of this cluster" in one_error_line(res_unknown)
    after = json.loads(ok(cluster, "cluster", "info", "--json"))
    assert sorted(n["name"] for n in after["nodes"]) == ["n1", "n2", "n3"]
    # peer-add readmits a removed node; a member is left as it is, an unknown name refused.
    assert "Peer n3 was not removed; nothing to do" in ok(cluster, "cluster", "peer-add", "n3")
    res_add = rs(cluster, "cluster", "peer-add", "n9")
    assert res_add.returncode == 1 and "'n9' is not a node of this cluster" in one_error_line(
        res_add
    )
    # peer-add --address adds a new node: a node at its own address is left as it is, a bad
    # address or one another node serves on is refused naming the field.
    n1 = cluster.addr("n1")
    same = ok(cluster, "cluster", "peer-add", "n1", "--address", n1)
    assert f"Node n1 is in the cluster already at {n1}; nothing to do" in same
    for addr, why in [("nowhere", "address: must be 'host:port'"), (n1, "node 'n1' serves on")]:
        res_new = rs(cluster, "cluster", "peer-add", "n9", "--address", addr)
        assert res_new.returncode == 1 and why in one_error_line(res_new), res_new.stderr
    after_add = json.loads(ok(cluster, "cluster", "info", "--json"))
    assert sorted(n["name"] for n in after_add["nodes"]) == ["n1", "n2", "n3"]


def test_consumer_step_down_says_that_its_stream_moved(cluster: Any) -> None:
    """Consumers are led with their stream (docs/cli.md, operator review finding 8): a
    consumer step-down moves the whole stream's leadership, and its output says so."""
    ok(cluster, "stream", "add", "SDOWN", "--subjects", "sdown.>", "--replicas", "3")
    ok(cluster, "consumer", "add", "SDOWN", "proc")

    def stream_leader() -> str:
        info = json.loads(ok(cluster, "cluster", "info", "--json"))
        (group,) = [g for g in info["groups"] if g["stream"] == "SDOWN"]
        return str(group["group"]["leader"])

    to = next(n for n in ("n1", "n2", "n3") if n != stream_leader())
    out = ok(cluster, "cluster", "step-down", "--stream", "SDOWN", "--consumer", "proc",
             "--preferred", to)  # fmt: skip
    assert out.strip() == (
        f"consumer SDOWN/proc: its stream SDOWN's leader stepped down (consumers are led "
        f"with their stream); new leader: {to}"
    )
    assert stream_leader() == to


def test_bench_pub_prints_a_table_and_removes_its_stream(cluster: Any) -> None:
    out = ok(cluster, "bench", "pub", "bench.t", "--msgs", "200", "--size", "64",
             "--replicas", "3", "--pubs", "2")  # fmt: skip
    lines = out.splitlines()
    assert lines[1].split()[:6] == ["Role", "Clients", "Msgs", "Seconds", "Msgs/s", "MB/s"]
    assert "p99" in lines[1]
    assert lines[2].split()[:3] == ["pub", "2", "200"]
    assert "BENCH" not in json.loads(ok(cluster, "stream", "ls", "--names", "--json"))

    report = json.loads(ok(cluster, "bench", "pubsub", "bench.t", "--msgs", "100", "--json"))
    assert [r["role"] for r in report["results"]] == ["pub", "sub"]
    assert report["results"][1]["msgs"] == 100 and report["results"][0]["msgs_per_s"] > 0
    assert set(report["results"][0]["latency_ms"]) == {"p50", "p90", "p99"}

    report = json.loads(ok(cluster, "bench", "sub", "bench.t", "--msgs", "100", "--subs", "2",
                           "--json"))  # fmt: skip
    (sub,) = report["results"]
    assert (sub["role"], sub["clients"], sub["msgs"], sub["bytes"]) == ("sub", 2, 200, 200 * 128)


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out.extend(_commands(cmd, (*prefix, name)))
        else:
            out.append((*prefix, name))
    return out


def test_help_everywhere_shows_an_example() -> None:
    paths = [p for p in _commands(cli) if p[0] not in ("server", "audit")]
    assert ("stream", "add") in paths and ("bench", "pubsub") in paths
    for path in paths:
        res = CliRunner().invoke(cli, [*path, "--help"])
        assert res.exit_code == 0 and "Example" in res.output, path
        assert "raftstream " + " ".join(path) in res.output, path
