"""Bad flag values are usage errors naming the flag (exit 2), found before any connection
(docs/cli.md "Exit codes", "Values", "Servers"; the bad-input review, P5, P7, P8, P10).

Pinned, in process with click's CliRunner and a ``Conn.connect`` that fails the test if it
is reached (no cluster):

- an empty element of a comma-separated flag (``--subjects ''``, ``'a,,b'``, ``--filter ''``,
  ``--placement-tags ''``...) is refused naming the flag: dropped, ``stream edit ORDERS
  --subjects ''`` replaced the stream's subjects (P5);
- ``--deliver`` digits are a start sequence from 1 to 2**63-1 (``consumer add``, ``sub``); a
  larger one halted the stream (P2's client side), 0 named the wrong rule (P8); ``sub
  --deliver`` lists its choices; ``sub --queue`` states the queue name rule (P10);
- a malformed ``-s`` address or ``$RAFTSTREAM_SERVERS`` (``nohostport``, port 99999,
  ``',,,'``) names the flag or the variable, rather than "cannot connect" (P10);
- ``kv`` revisions above int64 are usage errors naming the flag;
- a ``--config`` file value the SDK refuses (a time that is no date, ``"headers_only":
  "yes"``) is one error line naming the field, exit 1, not a Python traceback (P3, P7);
- a bench mode refuses the options it would ignore (``bench pub --subs``);
- a TLS file that cannot be read, or a certificate without its key, names the flag (or
  the variable) with the SDK's rule; a ``--config`` file that cannot be read, is no JSON
  or has a key that is no field names ``--config``; a sequence above 2**63-1 names its
  argument (``stream get``, ``rmm``, ``purge``): usage errors, exit 2, where they exited 1;
- ``sub --queue G --durable D`` is refused (the group's consumer is the durable G);
- docs/cli.md names only options that exist (it named ``consumer edit --config``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from raftstream.cli.app import cli
from raftstream.cli.common import Conn, split_csv

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
INT64_MAX = 2**63 - 1


@pytest.fixture(autouse=True)
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case here must be refused before a connection is made."""

    async def connect(self: Conn) -> Any:
        raise AssertionError(f"connected to {self.servers}: the value was not refused first")

    monkeypatch.setattr(Conn, "connect", connect)
    monkeypatch.delenv("RAFTSTREAM_SERVERS", raising=False)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env)


def usage_error(res: Result, flag: str, *words: str) -> None:
    """Exit 2, one click usage error naming ``flag`` (and ``words``), no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    error = next(line for line in res.output.splitlines() if line.startswith("Error:"))
    assert flag in error, error
    for word in words:
        assert word in error, error


# -- comma-separated flags (P5) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("stream", "add", "X", "--subjects", ""), "--subjects"),  # SS8
        (("stream", "add", "X", "--subjects", "x3.a,,x3.b"), "--subjects"),  # X3
        (("stream", "add", "X", "--subjects", "a,"), "--subjects"),
        (("stream", "add", "X", "--subjects", "a", "--subjects", " "), "--subjects"),
        (("stream", "edit", "ORDERS", "--subjects", ""), "--subjects"),  # X11
        (("stream", "add", "X", "--placement-tags", ""), "--placement-tags"),  # X12
        (("stream", "add", "X", "--source", "A,,B"), "--source"),
        (("stream", "add", "X", "--mirror", "O", "--mirror-external", ""), "--mirror-external"),
        (("consumer", "add", "S", "c", "--filter", ""), "--filter"),  # X8
        (("consumer", "edit", "S", "c", "--filter", "a,,b"), "--filter"),
        (("consumer", "add", "S", "c", "--backoff", "1s,,2s"), "--backoff"),
    ],
)
def test_an_empty_element_of_a_comma_separated_flag_is_a_usage_error(
    args: tuple[str, ...], flag: str
) -> None:
    usage_error(invoke(*args), flag, "empty value")


def test_split_csv_still_strips_and_flattens() -> None:
    assert split_csv(("a, b", "c"), "--subjects") == ["a", "b", "c"]
    assert split_csv((), "--subjects") == []
    with pytest.raises(click.BadParameter):
        split_csv(("a,,b",), "--subjects")


# -- --deliver, --queue (P2 client side, P8, P10) -----------------------------------------------


@pytest.mark.parametrize("seq", [str(INT64_MAX + 1), "99999999999999999999", "0"])
@pytest.mark.parametrize("command", [("consumer", "add", "S", "c"), ("sub", "s.x")])
def test_a_deliver_sequence_is_1_to_int64_max(command: tuple[str, ...], seq: str) -> None:
    """HZ1: --deliver 99999999999999999999 was accepted and halted the stream at once."""
    usage_error(invoke(*command, "--deliver", seq), "--deliver", str(INT64_MAX))


@pytest.mark.parametrize("value", ["sometime", "-3", "²", "1.5"])
def test_sub_deliver_lists_its_choices(value: str) -> None:
    """SB7/SB12: 'Invalid value for --deliver: 'sometime'' gave no choices."""
    usage_error(
        invoke("sub", "s.x", "--deliver", value), "--deliver", "all, last, new, last_per_subject"
    )


@pytest.mark.parametrize("queue", ["q 1", "q.1", "", "q>"])
def test_sub_queue_states_the_rule(queue: str) -> None:
    """SB6: 'queue: not a valid queue name: 'q 1'', no rule, exit 1."""
    usage_error(invoke("sub", "s.x", "--queue", queue), "--queue", "whitespace", "'.'")


def test_sub_queue_with_durable_is_a_usage_error() -> None:
    """It created a push consumer d2 with deliver group g2: the usage line shows them as
    alternatives, and the group's consumer is the durable named GROUP (a user review)."""
    res = invoke("sub", "q.>", "--queue", "g2", "--durable", "d2")
    usage_error(res, "--durable", "--queue", "durable named GROUP")


def test_help_texts_state_the_new_bounds() -> None:
    sub_help = invoke("sub", "--help").output
    assert "2**63-1" in sub_help and "whitespace" in sub_help
    assert "2**63-1" in invoke("consumer", "add", "--help").output


# -- servers (P10) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "flag"),
    [
        (("stream", "ls", "-s", "nohostport"), {}, "--server"),  # CLI1
        (("stream", "ls", "-s", "127.0.0.1:99999"), {}, "--server"),  # CLI2
        (("-s", "127.0.0.1:99999", "stream", "ls"), {}, "--server"),  # before the command
        (("stream", "ls", "-s", ""), {}, "--server"),
        (("stream", "ls", "-s", "a:1,,b:2"), {}, "--server"),
        (("stream", "ls"), {"RAFTSTREAM_SERVERS": ",,,"}, "RAFTSTREAM_SERVERS"),  # CLI7
        (("stream", "ls"), {"RAFTSTREAM_SERVERS": "nohostport"}, "RAFTSTREAM_SERVERS"),
    ],
)
def test_a_malformed_server_address_is_a_usage_error_naming_where_it_came_from(
    args: tuple[str, ...], env: dict[str, str], flag: str
) -> None:
    usage_error(invoke(*args, env=env), flag)


@pytest.mark.parametrize("url", ["nats://127.0.0.1:7101", "grpc://localhost:7101"])
def test_a_url_is_refused_for_its_scheme_not_as_an_ipv6_host(url: str) -> None:
    """A NATS user's habit (``-s nats://...``) was told "IPv6 hosts go in brackets"."""
    usage_error(invoke("-s", url, "stream", "ls"), "--server", "without a scheme")


def test_pub_refuses_a_header_given_twice_rather_than_keep_the_last() -> None:
    res = invoke("pub", "orders.t", "x", "-H", "A:1", "-H", "A:2")
    usage_error(res, "--header", "'A' given twice")


@pytest.mark.parametrize("nodes", ["", ",", " , "])
def test_certs_without_a_node_name_is_a_usage_error(tmp_path: Path, nodes: str) -> None:
    """It made a CA and no node certificate, and exited 0 (a user review)."""
    out = tmp_path / "certs"
    usage_error(invoke("certs", "--dir", str(out), "--nodes", nodes), "--nodes", "node name")
    assert not out.exists()  # nothing made


def test_servers_from_flags_env_or_default_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAFTSTREAM_SERVERS", "")  # set but empty: as if unset
    assert Conn.from_options((), 5).servers == ("127.0.0.1:7101",)
    monkeypatch.setenv("RAFTSTREAM_SERVERS", "a:1, [::1]:7102")
    assert Conn.from_options((), 5).servers == ("a:1", "[::1]:7102")
    # A bad variable does not matter when -s is given.
    monkeypatch.setenv("RAFTSTREAM_SERVERS", ",,,")
    assert Conn.from_options(("c:3",), 5).servers == ("c:3",)


# -- kv revisions (P8) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("kv", "put", "B", "k", "v", "--last", str(INT64_MAX + 1)), "--last"),  # KP12
        (("kv", "get", "B", "k", "--revision", str(INT64_MAX + 1)), "--revision"),  # KG4
        (("kv", "update", "B", "k", "v", str(INT64_MAX + 1)), "REVISION"),
    ],
)
def test_kv_revisions_above_int64_are_usage_errors(args: tuple[str, ...], flag: str) -> None:
    usage_error(invoke(*args), flag, str(INT64_MAX))


# -- TLS files, --config files, sequences: caught locally, so usage errors -----------------------


@pytest.mark.parametrize(
    ("args", "env", "flag", "rule"),
    [
        (("--tls-ca", "CA", "--tls-cert", "CERT"), {}, "--tls-key", "tls_cert and tls_key go"),
        (("--tls-key", "KEY"), {}, "--tls-cert", "tls_cert and tls_key go together"),
        (("--tls-ca", "/nonexist"), {}, "--tls-ca", "cannot read '/nonexist'"),
        ((), {"RAFTSTREAM_TLS_CA": "/nonexist"}, "$RAFTSTREAM_TLS_CA", "cannot read"),
    ],
)
def test_a_tls_file_the_client_cannot_use_is_a_usage_error(
    args: tuple[str, ...], env: dict[str, str], flag: str, rule: str
) -> None:
    """They exited 1 (``INVALID_ARGUMENT: tls_key: ...``), as a refusal by the server."""
    usage_error(invoke("stream", "ls", *args, env=env), flag, rule)
    usage_error(invoke(*args, "stream", "ls", env=env), flag, rule)  # before the command


def test_the_tls_file_checked_is_the_one_that_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's own flag, else the group's, else the variable (docs/cli.md), named as
    such."""
    env_ca, group_ca, own_ca = (str(tmp_path / f"{n}.pem") for n in ("env", "group", "own"))
    monkeypatch.setenv("RAFTSTREAM_TLS_CA", env_ca)
    usage_error(invoke("stream", "ls"), "$RAFTSTREAM_TLS_CA", env_ca)
    usage_error(invoke("--tls-ca", group_ca, "stream", "ls"), "--tls-ca", group_ca)
    res = invoke("--tls-ca", group_ca, "stream", "ls", "--tls-ca", own_ca)
    usage_error(res, "--tls-ca", own_ca)


def test_a_tls_file_that_is_no_pem_names_its_flag(tmp_path: Path) -> None:
    text = tmp_path / "ca.txt"
    text.write_text("not a certificate\n")
    usage_error(invoke("stream", "ls", "--tls-ca", str(text)), "--tls-ca", "is not a PEM file")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, ("cannot read", "No such file or directory")),
        ("{not json", ("is not JSON",)),
        ("[1, 2]", ("expected a JSON object",)),
        (json.dumps({"name": "X3", "no_ack": True}), ("'no_ack': not a field of",)),
        (json.dumps({"name": "X3", "max_msg": 5, "no_ack": True}), ("'max_msg', 'no_ack'",)),
    ],
)
@pytest.mark.parametrize(
    "command", [("stream", "add", "X3"), ("stream", "edit", "X3"), ("consumer", "add", "S")]
)
def test_a_config_file_that_is_unreadable_or_no_config_is_a_usage_error(
    tmp_path: Path, command: tuple[str, ...], body: str | None, words: tuple[str, ...]
) -> None:
    """They exited 1 with ``raftstream: error: --config ...``."""
    path = tmp_path / "bad.json"
    if body is not None:
        path.write_text(body.replace("name", "durable_name") if command[0] == "consumer" else body)
    usage_error(invoke(*command, "--config", str(path)), "--config", *words)


@pytest.mark.parametrize(
    ("args", "param"),
    [
        (("stream", "get", "P", "{seq}"), "SEQ"),  # SG: INVALID_ARGUMENT: seq: ..., exit 1
        (("stream", "rmm", "P", "{seq}", "-f"), "SEQ"),
        (("stream", "purge", "P", "--seq", "{seq}", "-f"), "--seq"),
        (("stream", "purge", "P", "--keep", "{seq}", "-f"), "--keep"),
        (("stream", "add", "P", "--first-seq", "{seq}"), "--first-seq"),
    ],
)
@pytest.mark.parametrize("seq", [str(INT64_MAX + 1), "99999999999999999999"])
def test_a_sequence_above_int64_is_a_usage_error_as_0_is(
    args: tuple[str, ...], param: str, seq: str
) -> None:
    usage_error(invoke(*(a.format(seq=seq) for a in args)), param, str(INT64_MAX))


def test_stream_get_0_is_still_refused_and_int64_max_accepted() -> None:
    usage_error(invoke("stream", "get", "P", "0"), "SEQ", "1<=x")
    res = invoke("stream", "get", "P", str(INT64_MAX))  # valid: goes on to connect
    assert isinstance(res.exception, AssertionError) and "connected to" in str(res.exception)


# -- --config values the SDK refuses (P3, P7) ---------------------------------------------------


@pytest.mark.parametrize(
    ("command", "config", "field"),
    [
        (  # TZ1: a Python traceback
            ("consumer", "add", "CS"),
            {"durable_name": "c", "deliver_policy": "by_start_time",
             "opt_start_time": "2020-13-45T00:00:00Z"},
            "opt_start_time",
        ),
        (  # TZ3
            ("stream", "add"),
            {"name": "M", "mirror": {"name": "CS", "opt_start_time": "2020-13-45T00:00:00Z"}},
            "mirror.opt_start_time",
        ),
        (("consumer", "add", "CS"), {"durable_name": "c", "headers_only": "yes"}, "headers_only"),
        (("consumer", "add", "CS"), {"durable_name": "c", "mem_storage": "false"}, "mem_storage"),
        (("consumer", "add", "CS"), {"durable_name": "c", "opt_start_time": True},
         "opt_start_time"),  # TY8
        (("consumer", "add", "CS"), {"durable_name": "c", "description": 5}, "description"),
        (("consumer", "add", "CS"), {"durable_name": "c", "sample_freq": 50}, "sample_freq"),
        (("stream", "add"), {"name": "S", "deny_delete": "yes"}, "deny_delete"),
    ],
)  # fmt: skip
def test_a_config_file_value_the_sdk_refuses_is_one_error_line_naming_the_field(
    tmp_path: Path, command: tuple[str, ...], config: dict[str, Any], field: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    res = invoke(*command, "--config", str(path))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    assert f"raftstream: error: INVALID_ARGUMENT: {field}: " in res.output, res.output


# -- bench modes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("bench", "pub", "b.x", "--subs", "2"), "--subs"),
        (("bench", "sub", "b.x", "--pubs", "2"), "--pubs"),
        (("bench", "sub", "b.x", "--sync"), "--sync"),
    ],
)
def test_a_bench_mode_refuses_the_options_it_would_ignore(args: tuple[str, ...], flag: str) -> None:
    """``bench pub --subs 2`` ran one publisher and reported no subscriber: the option was
    listed by every mode and ignored by this one. ``bench sub`` fills its stream with one
    publisher (``--pubs`` and ``--sync`` did nothing)."""
    usage_error(invoke(*args), flag, "No such option")


def test_each_bench_mode_lists_what_it_uses() -> None:
    bench = cli.commands["bench"]
    assert isinstance(bench, click.Group)
    pub, sub, both = (_options(bench.commands[m]) for m in ("pub", "sub", "pubsub"))
    assert {"--pubs", "--sync"} <= pub and "--subs" not in pub
    assert "--subs" in sub and not {"--pubs", "--sync"} & sub
    assert {"--pubs", "--subs", "--sync"} <= both


# -- docs (P10) ---------------------------------------------------------------------------------


def _options(command: click.Command) -> set[str]:
    return {
        opt
        for p in command.params
        if isinstance(p, click.Option)
        for opt in (*p.opts, *p.secondary_opts)
    }


def test_docs_name_only_options_the_commands_have() -> None:
    """docs/cli.md said `consumer edit --config FILE`; consumer edit has no --config. Every
    `raftstream GROUP COMMAND ... --option` the page shows (in code spans and blocks) is
    checked against the command's options (and the global ones)."""
    text = DOCS.read_text()
    snippets = re.findall(r"`([^`\n]+)`", text) + text.splitlines()
    global_options = _options(cli) | {"--help"}
    checked, unknown = 0, []
    for snippet in snippets:
        words = snippet.replace("[", " ").replace("]", " ").replace("|", " ").split()
        if words[:1] == ["raftstream"]:
            words = words[1:]
        group = cli.commands.get(words[0]) if words else None
        if group is None or len(words) < 2:
            continue
        command: click.Command | None = group
        if isinstance(group, click.Group):
            command, words = group.commands.get(words[1]), words[2:]
        if command is None:
            continue
        for word in words:
            if word.startswith("--"):
                option = word.split("=")[0].rstrip(",.;:)'\"")
                checked += 1
                if option not in _options(command) | global_options:
                    unknown.append(f"{command.name} {option} in {snippet.strip()[:60]!r}")
    assert checked > 50  # the scan found the page's commands
    assert unknown == []
