"""``raftstream cluster peer-remove --forget`` says what it did, and warns when the meta group
is left with fewer than three voters (it then tolerates no failed one). The node's side is
tested in tests/cluster/test_node_add.py; here the client is a stand-in."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from raftstream.cli import cluster as cli_cluster
from raftstream.cli.app import cli


class _Client:
    def __init__(self, forgotten: bool, voters: int) -> None:
        self.forgotten = forgotten
        self.voters = voters
        self.asked: dict[str, Any] = {}

    async def remove_peer(self, peer: str, **kw: Any) -> bool:
        self.asked = {"peer": peer, **kw}
        return self.forgotten

    async def cluster_info(self) -> Any:
        nodes = [SimpleNamespace(voter=i < self.voters) for i in range(4)]
        return SimpleNamespace(nodes=nodes)


@pytest.mark.parametrize(
    ("forgotten", "voters", "said", "warned"),
    [
        (True, 2, "Forgot node n3", "the meta group has 2 voters now"),
        (True, 3, "Forgot node n3", None),
        (False, 4, "Node n3 was forgotten already", None),
    ],
)
def test_forget_says_what_it_did_and_warns_of_too_few_voters(
    monkeypatch: pytest.MonkeyPatch, forgotten: bool, voters: int, said: str, warned: str | None
) -> None:
    client = _Client(forgotten, voters)
    monkeypatch.setattr(cli_cluster, "run", lambda conn, body: asyncio.run(body(client)))
    res = CliRunner().invoke(cli, ["cluster", "peer-remove", "n3", "--forget", "-f"])
    assert res.exit_code == 0, res.output
    assert client.asked == {"peer": "n3", "refuse_online": True, "forget": True}
    assert said in res.stdout
    if warned is None:
        assert "Warning" not in res.stderr
    else:
        assert warned in res.stderr and "peer-add NAME --address" in res.stderr
