"""SIGTERM ends a client command as Ctrl-C does (docs/cli.md, "Exit codes"), against the
shared real 3-node cluster.

A user review: ``raftstream sub 'q.x'`` stopped by SIGTERM (systemd, ``timeout``,
kubernetes) died at once and left its ephemeral consumer behind until its inactive
threshold, although the docs say it is "deleted when the command ends" (Ctrl-C deleted it).
Pinned, with real ``raftstream`` processes: after SIGTERM (exit 143, ``terminated``) as
after Ctrl-C (exit 130, ``interrupted``), ``sub`` leaves no consumer and ``kv watch`` no
consumer on its bucket's stream. In process: ``bench`` removes its stream when cancelled
(what both signals do), also while the stream was being created.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import IO, Any

import pytest

from raftstream.cli import bench as cli_bench

from .runner import RAFTSTREAM, cli_env, ok

# A shell without job control starts background jobs with SIGINT ignored, and the command
# would inherit that (a CI runner may): Ctrl-C is the default for it. Set by a Python that
# then execs the command, not by a preexec_fn, which would fork this process, whose gRPC
# runs: grpcio then aborts children (tooling/localcluster.py, die_with_launcher).
DEFAULT_SIGINT_THEN_EXEC = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)
LINE_WAIT_S = 30  # safety nets against hangs, not timed assertions
EXIT_WAIT_S = 30
SIGNALS = [
    pytest.param(signal.SIGTERM, 143, "terminated", id="SIGTERM"),
    pytest.param(signal.SIGINT, 130, "interrupted", id="SIGINT"),
]


@contextmanager
def command(cluster: Any, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``raftstream ARGS`` running in the background; killed if the test left it running."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DEFAULT_SIGINT_THEN_EXEC, str(RAFTSTREAM), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(cluster),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def first_line(out: IO[str] | None) -> str:
    assert out is not None
    ready, _, _ = select.select([out], [], [], LINE_WAIT_S)
    assert ready, f"no output within {LINE_WAIT_S} s"
    return out.readline()


def stop(proc: subprocess.Popen[str], sig: int) -> tuple[int, str]:
    """Send ``sig``; the exit code and stderr once the command ended."""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=EXIT_WAIT_S)
    return proc.returncode, err


def consumers(cluster: Any, stream: str) -> list[str]:
    return list(json.loads(ok(cluster, "consumer", "ls", stream, "--names", "--json")))


@pytest.mark.integration
@pytest.mark.parametrize(("sig", "code", "word"), SIGNALS)
def test_sub_deletes_its_ephemeral_consumer(cluster: Any, sig: int, code: int, word: str) -> None:
    stream = f"SIG{sig}"
    ok(cluster, "stream", "add", stream, "--subjects", f"sig{sig}.>", "--replicas", "3")
    ok(cluster, "pub", f"sig{sig}.x", "hello", "--quiet")
    with command(cluster, "sub", f"sig{sig}.x", "--raw") as proc:
        assert first_line(proc.stdout).strip() == "hello"  # its consumer is there
        assert len(consumers(cluster, stream)) == 1
        rc, err = stop(proc, sig)
    assert rc == code and err.strip().splitlines()[-1] == word, (rc, err)
    assert consumers(cluster, stream) == []  # not left to its 60 s inactive threshold
    ok(cluster, "stream", "rm", stream, "-f")


@pytest.mark.integration
def test_kv_watch_deletes_its_consumer_on_sigterm(cluster: Any) -> None:
    ok(cluster, "kv", "add", "SIGKV", "--replicas", "3")
    ok(cluster, "kv", "put", "SIGKV", "k", "v")
    with command(cluster, "kv", "watch", "SIGKV") as proc:
        assert "PUT SIGKV > k revision 1: v" in first_line(proc.stdout)
        assert len(consumers(cluster, "KV_SIGKV")) == 1
        rc, err = stop(proc, signal.SIGTERM)
    assert rc == 143 and err.strip().splitlines()[-1] == "terminated", (rc, err)
    assert consumers(cluster, "KV_SIGKV") == []
    ok(cluster, "kv", "rm", "SIGKV", "-f")


@pytest.mark.integration
def test_sigterm_while_sub_connects_exits_143(cluster: Any, free_dead_addr: str) -> None:
    """Before anything is made (no server answers yet): it still ends at once, as Ctrl-C."""
    with command(cluster, "sub", "x.y", "-s", free_dead_addr, "--timeout", "30") as proc:
        time.sleep(1)  # connecting: retrying the dead address
        rc, err = stop(proc, signal.SIGTERM)
    assert rc == 143 and err.strip().splitlines()[-1] == "terminated", (rc, err)


# -- bench: its stream goes on a cancel, in process (no node) ------------------------------------


class _Bench:
    """The client calls ``cli_bench._run`` makes; ``add_stream`` never answers when
    ``hang_add`` (cancelled while the stream was being made), else the run never ends."""

    def __init__(self, *, hang_add: bool, subjects: list[str]) -> None:
        self.hang_add = hang_add
        self.subjects = subjects
        self.calls: list[str] = []

    async def add_stream(self, **_: Any) -> None:
        self.calls.append("add_stream")
        if self.hang_add:
            await asyncio.Event().wait()

    async def stream_info(self, name: str) -> Any:
        self.calls.append("stream_info")
        return SimpleNamespace(config=SimpleNamespace(subjects=self.subjects, num_replicas=3))

    async def delete_stream(self, name: str) -> None:
        self.calls.append(f"delete_stream {name}")


def _cancelled_run(monkeypatch: pytest.MonkeyPatch, client: _Bench, *, keep: bool) -> None:
    async def forever(*_: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(cli_bench, "_bench", forever)
    spec = cli_bench.BenchSpec(
        subject="b.x", stream="BENCH", msgs=1, size=1, pubs=1, subs=0, replicas=3, sync=False,
        keep=keep,
    )  # fmt: skip

    async def main() -> None:
        task = asyncio.ensure_future(cli_bench._run(client, None, spec, "pub"))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        task.cancel()  # what Ctrl-C and SIGTERM do (cli_common.run)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


@pytest.mark.parametrize("hang_add", [False, True], ids=["running", "creating"])
def test_bench_removes_its_stream_when_cancelled(
    monkeypatch: pytest.MonkeyPatch, hang_add: bool
) -> None:
    """Also when cancelled while add_stream was under way: the stream may exist then (a
    SIGTERM right after it appeared left it behind)."""
    client = _Bench(hang_add=hang_add, subjects=["b.x"])
    _cancelled_run(monkeypatch, client, keep=False)
    assert client.calls[-1] == "delete_stream BENCH"


def test_bench_cancelled_while_creating_leaves_another_stream_of_that_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One add_stream would have refused (other subjects) is not the bench's to remove."""
    client = _Bench(hang_add=True, subjects=["orders.>"])
    _cancelled_run(monkeypatch, client, keep=False)
    assert client.calls == ["add_stream", "stream_info"]


def test_bench_keep_keeps_the_stream_when_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    for hang_add in (False, True):
        client = _Bench(hang_add=hang_add, subjects=["b.x"])
        _cancelled_run(monkeypatch, client, keep=True)
        assert client.calls == ["add_stream"]
