"""Rewrapping a gRPC method handler, for the node's server interceptors.

A ``grpc.aio`` server interceptor that changes how a call runs must return a new method
handler of the same kind (unary-unary, unary-stream, stream-unary, stream-stream) around the
original behaviour. The auth, input-limit and latency interceptors all do that; this is the
one place that knows the four kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

__all__ = ["Wrap", "rewrap"]

Wrap = Callable[[Any], Any]  # behaviour -> behaviour of the same kind

_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def rewrap(
    handler: Any,
    *,
    unary_unary: Wrap | None = None,
    unary_stream: Wrap | None = None,
    stream_unary: Wrap | None = None,
    stream_stream: Wrap | None = None,
    request_deserializer: Wrap | None = None,
) -> Any:
    """``handler`` with its behaviour passed through the wrapper given for its kind (and its
    request deserializer through ``request_deserializer``); ``handler`` itself when no
    wrapper is given for its kind."""
    wraps = {
        "unary_unary": unary_unary,
        "unary_stream": unary_stream,
        "stream_unary": stream_unary,
        "stream_stream": stream_stream,
    }
    for attr, make in _KINDS:
        behavior = getattr(handler, attr)
        if behavior is None:
            continue
        wrap = wraps[attr]
        if wrap is None:
            return handler
        deserializer = handler.request_deserializer
        if request_deserializer is not None:
            deserializer = request_deserializer(deserializer)
        return make(
            wrap(behavior),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler
