"""raftstream: a replicated stream store in the family of NATS JetStream.

The package root stays light: importing ``raftstream.engine`` or ``raftstream.raft`` must not
pull in grpc or asyncio, so the client SDK's names are loaded lazily on first use (module
``__getattr__``): ``raftstream.connect`` imports ``raftstream.client`` (and grpc) only when
it is first touched.

    import raftstream

    async with await raftstream.connect(["127.0.0.1:7101"], timeout=5.0) as rs:
        await rs.add_stream(name="ORDERS", subjects=["orders.>"], num_replicas=3)
        ack = await rs.publish("orders.new", b"hello")

gRPC's C core reads its environment once, when grpc is first imported, so importing
raftstream sets two variables first, each only when the environment does not set it
already (it cannot once grpc was imported before raftstream):

- ``GRPC_VERBOSITY=ERROR``: the core logs to stderr on its own, INFO lines included
  (``Got goaway`` each time a server closes a connection a client holds open); set it to
  ``INFO`` or ``DEBUG`` to see the core's own lines.
- ``GRPC_EXPERIMENTS`` (``GRPC_EXPERIMENTS_DEFAULT``), with grpcio 1.85 only: its client
  and listener I/O on the core's older engine (iomgr) rather than the EventEngine ones it
  uses by default, which cost each call more CPU and thread hand-offs (measured:
  docs/configuration.md, "gRPC's I/O engine"). Other grpcio versions are left alone (the
  names may differ there); set ``GRPC_EXPERIMENTS`` (even to an empty string) to choose.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from typing import TYPE_CHECKING, Any

from raftstream.errors import Code, RaftStreamError

GRPC_EXPERIMENTS_DEFAULT = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)
GRPC_EXPERIMENTS_TESTED = (1, 85)  # the grpcio (major, minor) that default was measured on


def _grpcio_version() -> tuple[int, int] | None:
    """grpcio's (major, minor), read without importing grpc (importlib.metadata takes tens
    of milliseconds; this file, a fraction of one); None when unknown."""
    try:
        spec = importlib.util.find_spec("grpc")
        if spec is None or spec.origin is None:
            return None
        path = os.path.join(os.path.dirname(spec.origin), "_grpcio_metadata.py")
        with open(path, encoding="utf-8") as f:
            found = re.search(r"(\d+)\.(\d+)", f.read())
    except (OSError, ImportError, ValueError):
        return None
    return (int(found[1]), int(found[2])) if found else None


# Before anything imports grpc (module docstring); raftstream.errors does not.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
if "GRPC_EXPERIMENTS" not in os.environ and _grpcio_version() == GRPC_EXPERIMENTS_TESTED:
    os.environ["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS_DEFAULT

if TYPE_CHECKING:
    from raftstream._push import PushSubscription
    from raftstream.client import Client, connect
    from raftstream.config import (
        AckPolicy,
        ConsumerConfig,
        DeliverPolicy,
        DiscardPolicy,
        Placement,
        ReplayPolicy,
        RetentionPolicy,
        StorageType,
        StreamConfig,
        SubjectTransform,
    )
    from raftstream.kv import KeyValue, KeyValueEntry, KeyValueOp, KeyValueStatus, KeyWatcher
    from raftstream.models import (
        ClusterInfo,
        ConsumerInfo,
        MsgMetadata,
        PubAck,
        RawStreamMsg,
        StreamInfo,
        StreamState,
    )
    from raftstream.msg import Msg
    from raftstream.ordered import OrderedSubscription
    from raftstream.pull import PullSubscription

__all__ = [
    "AckPolicy",
    "Client",
    "ClusterInfo",
    "Code",
    "ConsumerConfig",
    "ConsumerInfo",
    "DeliverPolicy",
    "DiscardPolicy",
    "KeyValue",
    "KeyValueEntry",
    "KeyValueOp",
    "KeyValueStatus",
    "KeyWatcher",
    "Msg",
    "MsgMetadata",
    "OrderedSubscription",
    "Placement",
    "PubAck",
    "PullSubscription",
    "PushSubscription",
    "RaftStreamError",
    "RawStreamMsg",
    "ReplayPolicy",
    "RetentionPolicy",
    "StorageType",
    "StreamConfig",
    "StreamInfo",
    "StreamState",
    "SubjectTransform",
    "connect",
]

# name -> the module that defines it, imported on first access.
_LAZY = {
    "connect": "raftstream.client",
    "Client": "raftstream.client",
    "AckPolicy": "raftstream.config",
    "ConsumerConfig": "raftstream.config",
    "DeliverPolicy": "raftstream.config",
    "DiscardPolicy": "raftstream.config",
    "Placement": "raftstream.config",
    "ReplayPolicy": "raftstream.config",
    "RetentionPolicy": "raftstream.config",
    "StorageType": "raftstream.config",
    "StreamConfig": "raftstream.config",
    "SubjectTransform": "raftstream.config",
    "ClusterInfo": "raftstream.models",
    "ConsumerInfo": "raftstream.models",
    "MsgMetadata": "raftstream.models",
    "PubAck": "raftstream.models",
    "RawStreamMsg": "raftstream.models",
    "StreamInfo": "raftstream.models",
    "StreamState": "raftstream.models",
    "Msg": "raftstream.msg",
    "PullSubscription": "raftstream.pull",
    "PushSubscription": "raftstream._push",
    "OrderedSubscription": "raftstream.ordered",
    "KeyValue": "raftstream.kv",
    "KeyValueEntry": "raftstream.kv",
    "KeyValueOp": "raftstream.kv",
    "KeyValueStatus": "raftstream.kv",
    "KeyWatcher": "raftstream.kv",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raftstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
