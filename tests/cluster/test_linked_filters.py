"""The meta leader proposes a consumer whose filter only a mirror's or a sourced stream's
stored subjects match (LOG_FEATURE_LINKED_FILTERS) only once every node reads it: a node of
an earlier version would refuse it when applying, and its meta state would differ."""

from __future__ import annotations

from types import MethodType, SimpleNamespace
from typing import Any

import pytest

from raftstream.cluster.meta.descriptions import LOG_FEATURE_LINKED_FILTERS, LOG_FEATURES
from raftstream.cluster.services.consumers import ConsumerServicer
from raftstream.cluster.services.context import ServiceContext
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.stream_config import StreamConfig, StreamSource
from raftstream.errors import PreconditionError


def _servicer(stream: StreamConfig, features: dict[str, frozenset[str] | None]) -> Any:
    """A servicer on node n1 whose peers described themselves with ``features`` (None: not
    heard from)."""
    described = {n: SimpleNamespace(log_features=f) for n, f in features.items() if f is not None}
    ctx = SimpleNamespace(
        node_id="n1",
        stream=lambda account, name: SimpleNamespace(config=stream),
        peers=SimpleNamespace(descriptions=lambda: described),
        meta=SimpleNamespace(state=SimpleNamespace(removed_peers=frozenset())),
        nodes=SimpleNamespace(names=lambda: ["n1", *features]),
    )
    ctx.nodes_not_reading = MethodType(ServiceContext.nodes_not_reading, ctx)
    return ConsumerServicer(ctx)  # type: ignore[arg-type]


MIRROR = StreamConfig(name="M", mirror=StreamSource(name="O"))
SOURCED = StreamConfig(name="S", subjects=("own.>",), sources=(StreamSource(name="O"),))
OLD = LOG_FEATURES - {LOG_FEATURE_LINKED_FILTERS}


@pytest.mark.parametrize("stream", [MIRROR, SOURCED])
def test_a_filter_on_linked_subjects_waits_for_every_node_to_read_it(stream: StreamConfig) -> None:
    cfg = ConsumerConfig(durable_name="C", filter_subject="orders.x")
    _servicer(stream, {"n2": LOG_FEATURES, "n3": LOG_FEATURES})._filters_readable("A", "S", cfg)
    for n3 in (OLD, None):  # an earlier version, or not heard from yet
        with pytest.raises(PreconditionError) as refused:
            _servicer(stream, {"n2": LOG_FEATURES, "n3": n3})._filters_readable("A", "S", cfg)
        assert "n3 runs a version that refuses filters" in str(refused.value)
        assert refused.value.details["field"] == "filter_subject"


def test_filters_the_earlier_rule_takes_need_nothing() -> None:
    old = {"n2": OLD, "n3": None}
    for stream, cfg in [
        (SOURCED, ConsumerConfig(durable_name="C", filter_subject="own.x")),
        (MIRROR, ConsumerConfig(durable_name="C")),  # no filter
        (StreamConfig(name="P", subjects=("p.>",)), ConsumerConfig(durable_name="C")),
    ]:
        _servicer(stream, old)._filters_readable("A", "S", cfg)
