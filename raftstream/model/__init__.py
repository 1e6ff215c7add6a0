"""The model the client and the node share: what a stream or consumer config's fields may
hold (JetStream's names and values), imported by the SDK (``raftstream.config``), the engine
(``engine/stream_config.py``, ``engine/consumer_config.py``, ``engine/store.py``) and the node
alike, so that there is one definition of each. A leaf: it imports nothing of raftstream
(contract ``leaf``, docs/architecture.md).

``Placement`` is one class for both. The SDK's stream and consumer config types and the
engine's stay two classes on purpose: the SDK's take
seconds and build a request (nats.py's shape), the engine's hold nanoseconds and validate
what the node stores; both read their fields' kinds and limits from here.
"""

from raftstream.model.placement import Placement
from raftstream.model.policies import (
    INT64_MAX,
    NS_PER_S,
    UNLIMITED,
    AckPolicy,
    DeliverPolicy,
    DiscardPolicy,
    ReplayPolicy,
    RetentionPolicy,
    StorageType,
)

__all__ = [
    "INT64_MAX",
    "NS_PER_S",
    "UNLIMITED",
    "AckPolicy",
    "DeliverPolicy",
    "DiscardPolicy",
    "Placement",
    "ReplayPolicy",
    "RetentionPolicy",
    "StorageType",
]
