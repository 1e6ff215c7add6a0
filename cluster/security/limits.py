"""Hostile input: the node's checks of every client request, its gRPC options and deadlines.

Why one place: a request must be refused before it does any work (a rejection changes
nothing), and the rules for names, subjects, sizes and numbers must be the same on every
RPC. ``check_request`` runs on every unary request and on the first message of ``Consume``
(from ``LimitsInterceptor``, before the servicer sees the call); the per-item checks
(``check_publish``, ``check_ack``) run inside ``PublishStream``/``AckStream``/``Consume``,
where one bad item is that item's error and the call goes on.

Every refusal is an ``InvalidArgumentError`` (INVALID_ARGUMENT: a malformed field, a number
out of its range) or a ``LimitError`` (RESOURCE_EXHAUSTED: a payload or headers above the
node's limits), naming the field and the rule (``field``/``rule`` in the error details).
Error texts never carry a payload or a header value, and quote a name or subject only
through ``sanitize`` (a short, escaped prefix): a client's data must not land in logs.

Deadlines: every unary and server-streaming call of the client API runs under a deadline:
the client's, capped at ``limits.call_timeout_max_ms``; a call without one gets
``limits.request_timeout_ms`` (``Fetch``, a long poll: ``call_timeout_max_ms``). The cap is
enforced here (DEADLINE_EXCEEDED when it passes) and visible to the servicers through
``capped_time_left``, so the work inside (forwards, proposals, pull expiry) ends before it.
Bidirectional streams (``PublishStream``, ``AckStream``, ``Consume``) are sessions: they
are bounded by their windows (``publish_async_pending_max``, acks in flight, flow control)
rather than by a deadline. How many streaming calls (those and ``Fetch``) a node has open at
once is bounded by ``limits.streaming_calls_max``: one more is RESOURCE_EXHAUSTED. Every
list is paged (``cluster/meta/results.py`` LIST_LIMIT_MAX).

The limits themselves are ``[limits]`` of the node config (``cluster/config.py``); their
documentation, with defaults, units and errors, is docs/limits.md.

Where each part lives: the field rules (names, subjects, publishes, acks) in
``cluster/security/limits_fields.py``; the bounds on definitions and counts in
``cluster/security/limits_admission.py``; the per-RPC table (``check_request``) in
``cluster/security/limits_requests.py``; the interceptor, deadlines and gRPC options in
``cluster/security/limits_interceptor.py``. This module re-exports their public names.
"""

from __future__ import annotations

from raftstream.cluster.security.limits_admission import (
    CONSUMER_FILTER_SUBJECTS_MAX,
    STREAM_SUBJECTS_MAX,
    SUBJECTS_DETAIL_MAX,
    bound_consumer,
    check_cluster_limits,
    check_consumer_filter_count,
    check_consumer_limits,
    check_stream_subject_count,
    check_subjects_detail,
)
from raftstream.cluster.security.limits_fields import (
    INT64_MAX,
    NAME_BYTES_MAX,
    TOKEN_BYTES_MAX,
    check_ack,
    check_ack_run,
    check_config_name,
    check_name,
    check_publish,
    sanitize,
)
from raftstream.cluster.security.limits_interceptor import (
    LimitsInterceptor,
    capped_time_left,
    server_options,
)
from raftstream.cluster.security.limits_requests import PULL_HEARTBEAT_MIN_NS, check_request

__all__ = [
    "CONSUMER_FILTER_SUBJECTS_MAX",
    "INT64_MAX",
    "NAME_BYTES_MAX",
    "PULL_HEARTBEAT_MIN_NS",
    "STREAM_SUBJECTS_MAX",
    "SUBJECTS_DETAIL_MAX",
    "TOKEN_BYTES_MAX",
    "LimitsInterceptor",
    "bound_consumer",
    "capped_time_left",
    "check_ack",
    "check_ack_run",
    "check_cluster_limits",
    "check_config_name",
    "check_consumer_filter_count",
    "check_consumer_limits",
    "check_name",
    "check_publish",
    "check_request",
    "check_stream_subject_count",
    "check_subjects_detail",
    "sanitize",
    "server_options",
]
