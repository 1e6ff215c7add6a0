"""raftstream: a replicated stream store in the family of NATS JetStream.

The package root stays light: importing ``raftstream.engine`` or ``raftstream.raft`` must not
pull in grpc or asyncio, so the client SDK's names are loaded lazily on first use (module
``__getattr__``): ``raftstream.connect`` imports ``raftstream.client`` (and grpc) only when
it is first touched.

    import raftstream

    async with await raftstream.connect(["127.0.0.1:7101"], timeout=5.0) as rs:
        await rs.add_stream(name="ORDERS", subjects=["orders.>"], num_replicas=3)
        ack = await rs.publish("orders.new", b"hello")

Importing raftstream changes no process-wide state: no environment variable, logging
configuration or event-loop policy. raftstream's own programs (the command line, the node,
the benchmarks) apply their gRPC settings in their entry points; an application may do the
same with ``raftstream.grpcenv.apply_defaults()`` before it imports grpc.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raftstream.errors import Code, RaftStreamError

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
