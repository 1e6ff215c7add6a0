"""The "forgotten node" refusal: a node that starts without Raft data asks its peers
whether they saw it running before, and refuses to start if one did (it lost its data).

See ``cluster/repair/known_peers.py``: every node records the peers it saw running with Raft data.
A node that lost its data and started empty would otherwise vote and acknowledge from an
empty log its peers may count; it must rejoin with ``--join`` (``cluster/repair/repair.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import grpc

from raftstream.cluster.config import NodeConfig
from raftstream.cluster.node.peers import PEER_PROBE_TIMEOUT_S
from raftstream.cluster.services.node import asker_standing, probe_metadata
from raftstream.errors import DataLossError
from raftstream.proto import node_pb2_grpc as npbg
from raftstream.raft.transport.tls import PeerTls

__all__ = ["FRESH_ASK_EVERY_S", "FRESH_WAIT_LOG_S", "ForgottenCheck"]

log = logging.getLogger(__name__)

FRESH_ASK_EVERY_S = 0.1  # a node without Raft data asks its peers this often (known_peers)
FRESH_WAIT_LOG_S = 10.0  # and says it is waiting this often


class ForgottenCheck:
    """Asks ``peers`` (name -> address, this node excluded) whether they saw this node
    running (``run``). One use; owned by the node's event loop."""

    def __init__(self, *, config: NodeConfig, peers: Mapping[str, str], tls: PeerTls | None):
        self._config = config
        self._peers = dict(peers)
        self._creds = tls.channel_credentials() if tls is not None else None
        self._metadata = probe_metadata(config.auth)

    async def run(self) -> None:
        """Ask the peers until one says it saw this node (``DataLossError``: it lost its
        data; rejoin with ``--join``), or one runs a cluster this node did not found
        (``DataLossError``: a node added to a running cluster starts with ``--join``), or
        enough have answered that, with this node, they make a majority (returns: a node
        that cannot reach that many could not take part anyway)."""
        needed = (len(self._peers) + 1) // 2  # answers that make a majority with this node
        names = list(self._peers)
        waiting_since = time.monotonic()
        while True:
            answers = await asyncio.gather(*(self._ask(self._peers[n]) for n in names))
            known = [n for n, a in zip(names, answers, strict=True) if a and a[0]]
            if known:
                raise self._lost(known)
            outside = [n for n, a in zip(names, answers, strict=True) if a and a[1]]
            if outside:
                raise self._outsider(outside)
            if sum(a is not None for a in answers) >= needed:
                return
            if time.monotonic() - waiting_since > FRESH_WAIT_LOG_S:
                waiting_since = time.monotonic()
                log.warning(
                    "no Raft data here: waiting for %d of the peers to say whether they"
                    " saw this node before (one that lost its data must rejoin with"
                    " --join)",
                    needed,
                )
            await asyncio.sleep(FRESH_ASK_EVERY_S)

    async def _ask(self, addr: str) -> tuple[bool, bool] | None:
        # A channel per question: a shared one would back off for a second after a
        # peer that is still starting refused the connection.
        async with (
            grpc.aio.insecure_channel(addr)
            if self._creds is None
            else grpc.aio.secure_channel(addr, self._creds)
        ) as ch:
            return await asker_standing(
                npbg.NodeServiceStub(ch),
                asker=self._config.name,
                metadata=self._metadata,
                timeout_s=PEER_PROBE_TIMEOUT_S,
            )

    def _outsider(self, outside: list[str]) -> DataLossError:
        name = self._config.name
        return DataLossError(
            f"{', '.join(outside)} {'runs' if len(outside) == 1 else 'run'} a"
            f" cluster that this node ({name}) did not found: a node"
            " added to a running cluster starts empty with --join, once"
            f" `raftstream cluster peer-add {name} --address"
            f" {self._config.advertise}` added it (docs/operations.md)"
        )

    def _lost(self, known: list[str]) -> DataLossError:
        raft_dir = Path(self._config.data) / "raft"
        return DataLossError(
            f"{raft_dir} holds no Raft data, but {', '.join(known)} saw this node"
            f" ({self._config.name}) running before: it lost its data. Start it with --join to"
            " rejoin the cluster as a new member (docs/operations.md), or remove every node's"
            " data to start a new cluster"
        )
