"""Binary message data through the command line (docs/cli.md, "Message data"): stdin is
stored byte for byte by ``kv put`` and ``pub``; an argument is text, stored in UTF-8, and
argv bytes that were not UTF-8 come back as given; ``--raw`` writes the stored bytes
unchanged; ``--json`` gives message data as ``stream get --json`` does (text when it is
UTF-8, else base64); human output shows U+FFFD for undecodable bytes and never crashes.

Real subprocesses of the installed console script against the shared 3-node cluster,
with stdin, argv and stdout as bytes (no text decoding in between).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from typing import Any

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftstream.cli.common import arg_bytes
from raftstream.cli.pub import render_data
from raftstream.client import connect

from .runner import RAFTSTREAM, RUN_TIMEOUT_S, cli_env

BINARY = b"\xff\xfe\x00bin"  # not UTF-8, with a NUL: the user review's value
BINARY_B64 = base64.b64encode(BINARY).decode("ascii")  # "//4AYmlu"
REPLACEMENT = "\ufffd".encode()


def rsb(cluster: Any, *args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """Run ``raftstream ARGS`` with ``stdin`` piped in (not a TTY); output as bytes."""
    return subprocess.run(
        [str(RAFTSTREAM), *args],
        input=stdin,
        capture_output=True,
        env=cli_env(cluster),
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def okb(cluster: Any, *args: str | bytes, stdin: bytes = b"") -> bytes:
    """stdout of a run that must succeed: exit 0 and no traceback."""
    res = rsb(cluster, *args, stdin=stdin)
    assert res.returncode == 0, f"{args}: rc={res.returncode}\n{res.stdout!r}\n{res.stderr!r}"
    assert b"Traceback" not in res.stderr, res.stderr
    return res.stdout


def sdk(cluster: Any, body: Any) -> Any:
    """``body(client)`` through the SDK: what is stored, read without the CLI."""

    async def main() -> Any:
        c = await connect(cluster.servers, timeout=10)
        try:
            return await body(c)
        finally:
            await c.close()

    return asyncio.run(main())


async def _kv_value(c: Any, bucket: str, key: str) -> bytes:
    return (await (await c.key_value(bucket)).get(key)).value


# -- pub and kv put: stdin and arguments ------------------------------------------------------


@pytest.mark.integration
def test_binary_stdin_into_kv_put_is_stored_byte_exact(cluster: Any) -> None:
    okb(cluster, "kv", "add", "BINPUT")
    out = okb(cluster, "kv", "put", "BINPUT", "bin", stdin=BINARY)
    assert out.strip().endswith(b"revision 1")
    assert sdk(cluster, lambda c: _kv_value(c, "BINPUT", "bin")) == BINARY
    # A trailing newline on stdin is data too: stored as given.
    okb(cluster, "kv", "put", "BINPUT", "nl", stdin=b"line\n")
    assert sdk(cluster, lambda c: _kv_value(c, "BINPUT", "nl")) == b"line\n"
    okb(cluster, "kv", "rm", "BINPUT", "-f")


@pytest.mark.integration
def test_kv_put_value_argument_is_utf8_and_undecoded_argv_bytes_round_trip(
    cluster: Any,
) -> None:
    okb(cluster, "kv", "add", "BINARG")
    okb(cluster, "kv", "put", "BINARG", "text", "grün")
    assert sdk(cluster, lambda c: _kv_value(c, "BINARG", "text")) == "grün".encode()
    # argv bytes the (UTF-8) locale cannot decode (a Latin-1 terminal) are stored as given.
    okb(cluster, "kv", "put", "BINARG", "latin1", b"gr\xfcn\xff")
    assert sdk(cluster, lambda c: _kv_value(c, "BINARG", "latin1")) == b"gr\xfcn\xff"
    okb(cluster, "kv", "rm", "BINARG", "-f")


@pytest.mark.integration
def test_binary_stdin_into_pub_is_stored_byte_exact(cluster: Any) -> None:
    okb(cluster, "stream", "add", "BINPUB", "--subjects", "binpub.>")
    out = okb(cluster, "pub", "binpub.a", stdin=BINARY)
    assert b"Published 6 bytes to binpub.a: stream BINPUB seq 1" in out
    got = sdk(cluster, lambda c: c.get_msg("BINPUB", 1))
    assert got.data == BINARY

    # Placeholders are filled in; every other byte passes unchanged.
    okb(cluster, "pub", "binpub.b", "--count", "2", stdin=b"\xff{{Count}}\x00")
    datas = [sdk(cluster, lambda c, s=s: c.get_msg("BINPUB", s)).data for s in (2, 3)]
    assert datas == [b"\xff1\x00", b"\xff2\x00"]

    # An argument: text in UTF-8; undecodable argv bytes as given.
    okb(cluster, "pub", "binpub.c", "grün {{Count}}")
    okb(cluster, "pub", "binpub.c", b"\xfe\xff")
    datas = [sdk(cluster, lambda c, s=s: c.get_msg("BINPUB", s)).data for s in (4, 5)]
    assert datas == ["grün 1".encode(), b"\xfe\xff"]

    # Headers and msg-ids travel as strings: bytes that are not UTF-8 are a usage error.
    for option in ("-H", "--msg-id"):
        res = rsb(cluster, "pub", "binpub.d", "x", option, b"X:\xff")
        assert res.returncode == 2 and b"not UTF-8 text" in res.stderr, res.stderr
        assert b"Traceback" not in res.stderr
    okb(cluster, "stream", "rm", "BINPUB", "-f")


# -- kv get/history/watch: --raw and --json -------------------------------------------------


@pytest.mark.integration
def test_kv_get_raw_writes_the_stored_bytes_unchanged(cluster: Any) -> None:
    async def put(c: Any) -> int:
        bucket = await c.create_key_value("BINRAW")
        await bucket.put("text", b"green")
        return int(await bucket.put("bin", BINARY))

    sdk(cluster, put)
    assert okb(cluster, "kv", "get", "BINRAW", "bin", "--raw") == BINARY  # no newline added
    assert okb(cluster, "kv", "get", "BINRAW", "text", "--raw") == b"green"
    okb(cluster, "kv", "rm", "BINRAW", "-f")


@pytest.mark.integration
def test_kv_json_gives_values_as_stream_get_json_gives_data(cluster: Any) -> None:
    async def put(c: Any) -> list[int]:
        bucket = await c.create_key_value("BINJSON", history=5)
        return [int(await bucket.put("k", v)) for v in (b"plain", BINARY)]

    text_rev, bin_rev = sdk(cluster, put)
    stream_get = json.loads(okb(cluster, "stream", "get", "KV_BINJSON", str(bin_rev), "--json"))
    assert stream_get["data"] == BINARY_B64  # the convention the kv commands follow

    got = json.loads(okb(cluster, "kv", "get", "BINJSON", "k", "--json"))
    assert got["value"] == stream_get["data"] == BINARY_B64
    history = json.loads(okb(cluster, "kv", "history", "BINJSON", "k", "--json"))
    assert [(h["revision"], h["value"]) for h in history] == [
        (text_rev, "plain"),
        (bin_rev, BINARY_B64),
    ]
    lines = okb(cluster, "kv", "watch", "BINJSON", "--count", "1", "--json").splitlines()
    assert json.loads(lines[0])["value"] == BINARY_B64

    # Human output shows text (U+FFFD for bytes that are not UTF-8) and does not crash.
    assert REPLACEMENT in okb(cluster, "kv", "get", "BINJSON", "k")
    assert REPLACEMENT in okb(cluster, "kv", "history", "BINJSON", "k")
    assert REPLACEMENT in okb(cluster, "kv", "watch", "BINJSON", "--count", "1")
    okb(cluster, "kv", "rm", "BINJSON", "-f")


# -- sub, consumer next, stream get ----------------------------------------------------------


@pytest.mark.integration
def test_sub_and_consumer_next_keep_binary_data(cluster: Any) -> None:
    okb(cluster, "stream", "add", "BINSUB", "--subjects", "binsub.>")

    async def publish(c: Any) -> None:
        for data in (BINARY, b"text"):
            await c.publish("binsub.a", data)

    sdk(cluster, publish)

    # --raw: each payload's bytes unchanged, then a newline separating it from the next.
    assert okb(cluster, "sub", "binsub.a", "--count", "2", "--raw") == BINARY + b"\ntext\n"
    first = json.loads(okb(cluster, "sub", "binsub.a", "--count", "1", "--json"))
    assert first["data"] == BINARY_B64
    assert REPLACEMENT in okb(cluster, "sub", "binsub.a", "--count", "1")

    okb(cluster, "consumer", "add", "BINSUB", "reader")
    fetched = json.loads(okb(cluster, "consumer", "next", "BINSUB", "reader", "--count", "2",
                             "--json"))  # fmt: skip
    assert [m["data"] for m in fetched] == [BINARY_B64, "text"]
    okb(cluster, "consumer", "add", "BINSUB", "viewer")
    assert REPLACEMENT in okb(cluster, "consumer", "next", "BINSUB", "viewer")
    assert REPLACEMENT in okb(cluster, "stream", "get", "BINSUB", "1")
    okb(cluster, "stream", "rm", "BINSUB", "-f")


# -- the helpers, without a cluster ----------------------------------------------------------


@given(st.binary(max_size=64))
def test_render_data_passes_any_bytes_without_placeholders_unchanged(data: bytes) -> None:
    payload = data.replace(b"{", b"")
    assert render_data(payload, 1) == payload
    assert render_data(payload + b"{{Count}}" + payload, 7) == payload + b"7" + payload


@given(st.binary(max_size=64))
def test_arg_bytes_gives_back_the_argv_bytes(raw: bytes) -> None:
    assert arg_bytes(os.fsdecode(raw), "DATA") == raw


def test_arg_bytes_refuses_a_lone_surrogate_as_a_usage_error() -> None:
    with pytest.raises(click.BadParameter, match="not text"):
        arg_bytes("\ud800", "DATA")
