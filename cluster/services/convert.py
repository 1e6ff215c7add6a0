"""Engine and cluster values to ``raftstream.v1`` messages (one direction: the server's).

Configs travel as JetStream JSON (``to_dict``), as the proto's conventions say. Requests
are parsed here too (``parse_json``): a malformed document is INVALID_ARGUMENT naming
``config_json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from raftstream.cluster.meta.assignments import ConsumerAssignment, StreamAssignment
from raftstream.engine.consumer import ConsumerInfo
from raftstream.engine.consumer_config import ConsumerConfig
from raftstream.engine.consumer_pull import Delivery, PullStatus
from raftstream.engine.store import StoredMsg, StreamState
from raftstream.errors import InvalidArgumentError
from raftstream.proto import raftstream_pb2 as pb

__all__ = [
    "add_bounded",
    "consumer_info_pb",
    "delivery_pb",
    "fill_delivery",
    "group_info_pb",
    "parse_json",
    "pull_status_pb",
    "stored_msg_pb",
    "stream_info_pb",
    "stream_state_pb",
]


# How deep a config document may nest (objects and arrays): a stream config's deepest legal
# part (sources[].subject_transforms[] objects) is 4 levels; deeper is refused, so no later
# step (parsing, copying, encoding a meta entry) recurses without bound (issue 39, finding 9).
CONFIG_JSON_DEPTH_MAX = 32


def parse_json(text: str, field: str = "config_json") -> dict[str, Any]:
    """A JSON object; INVALID_ARGUMENT naming ``field`` when the text is not one or nests
    deeper than ``CONFIG_JSON_DEPTH_MAX`` (never a RecursionError: that was INTERNAL)."""
    try:
        raw = json.loads(text)
    except RecursionError:
        raise _too_deep(field) from None
    except ValueError as exc:
        raise InvalidArgumentError(field, f"is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidArgumentError(field, "must be a JSON object")
    if _depth_over(raw, CONFIG_JSON_DEPTH_MAX):
        raise _too_deep(field)
    return raw


def _too_deep(field: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        field, f"must nest at most {CONFIG_JSON_DEPTH_MAX} levels (config_json_depth_max)"
    )


def _depth_over(value: Any, depth_max: int) -> bool:
    """Whether ``value`` nests objects or arrays deeper than ``depth_max`` (iterative)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > depth_max:
            return True
        if isinstance(v, dict):
            stack.extend((c, depth + 1) for c in v.values() if isinstance(c, dict | list))
        elif isinstance(v, list):
            stack.extend((c, depth + 1) for c in v if isinstance(c, dict | list))
    return False


def group_info_pb(
    group: str,
    *,
    leader: str | None,
    term: int = 0,
    commit: int = 0,
    replicas: list[pb.ReplicaInfo] | None = None,
) -> pb.GroupInfo:
    return pb.GroupInfo(
        name=group, leader=leader or "", term=term, commit_index=commit, replicas=replicas or []
    )


def stream_state_pb(
    st: StreamState,
    *,
    consumers: int,
    subjects: Mapping[str, int] | None = None,
    deleted: Sequence[int] = (),
) -> pb.StreamState:
    """``subjects`` and ``deleted`` only when the request asked for them."""
    out = pb.StreamState(
        messages=st.msgs,
        bytes=st.bytes,
        first_seq=st.first_seq,
        first_ts_ns=st.first_ts,
        last_seq=st.last_seq,
        last_ts_ns=st.last_ts,
        num_deleted=st.num_deleted,
        num_subjects=st.num_subjects,
        consumer_count=consumers,
    )
    if subjects:
        out.subjects.update(subjects)
    if deleted:
        out.deleted.extend(deleted)
    return out


def stream_info_pb(
    sa: StreamAssignment,
    state: pb.StreamState | None,
    cluster: pb.GroupInfo,
    links: tuple[pb.StreamSourceInfo | None, list[pb.StreamSourceInfo]] | None = None,
) -> pb.StreamInfo:
    """``state`` None: no replica answered with it (left unset: the SDK's ``state_known``
    is False). ``links``: the mirror's and sources' state (``StreamGroup.source_infos``),
    known only where the stream's leader answers."""
    out = pb.StreamInfo(
        config_json=json.dumps(sa.config.to_dict()), cluster=cluster, created_ns=sa.created_ns
    )
    if state is not None:
        out.state.CopyFrom(state)
    if links is not None:
        mirror, sources = links
        if mirror is not None:
            out.mirror.CopyFrom(mirror)
        out.sources.extend(sources)
    return out


def consumer_info_pb(
    ca: ConsumerAssignment,
    info: ConsumerInfo | None,
    cluster: pb.GroupInfo,
    config: ConsumerConfig | None = None,
    *,
    now_ns: int,
) -> pb.ConsumerInfo:
    """``info`` (state) with ``config`` (``now_ns``: the node's time, for the pause of a
    consumer whose state is not known here): the config the stream group applied, which the
    state goes with (None: the meta state's, ``ca.config``). A config update reaches the
    group after the meta state, so the two differ for a moment: the info says which one
    its state follows (``_sequenced_info`` waits on it)."""
    out = pb.ConsumerInfo(
        stream=ca.stream,
        name=ca.name,
        created_ns=ca.created_ns,
        config_json=json.dumps((config or ca.config).to_dict()),
        cluster=cluster,
    )
    if info is not None:
        out.delivered.CopyFrom(
            pb.SequenceInfo(
                consumer_seq=info.delivered.consumer_seq,
                stream_seq=info.delivered.stream_seq,
                last_active_ns=info.delivered.last_active_ns,
            )
        )
        out.ack_floor.CopyFrom(
            pb.SequenceInfo(
                consumer_seq=info.ack_floor.consumer_seq,
                stream_seq=info.ack_floor.stream_seq,
                last_active_ns=info.ack_floor.last_active_ns,
            )
        )
        out.num_ack_pending = info.num_ack_pending
        out.num_redelivered = info.num_redelivered
        out.num_waiting = info.num_waiting
        out.num_pending = info.num_pending
        out.paused = info.paused
        out.pause_remaining_ns = info.pause_remaining_ns
    else:  # the definition alone: its pause is committed, so every replica will apply it
        out.paused = ca.config.pause_until > now_ns
        out.pause_remaining_ns = max(0, ca.config.pause_until - now_ns)
    return out


def stored_msg_pb(m: StoredMsg) -> pb.Msg:
    return pb.Msg(subject=m.subject, seq=m.seq, ts_ns=m.ts, headers=dict(m.headers), data=m.data)


def delivery_pb(d: Delivery) -> pb.Msg:
    out = pb.Msg()
    fill_delivery(out, d)
    return out


def add_bounded(
    msgs: RepeatedCompositeFieldContainer[pb.Msg], d: Delivery, size_bytes: int, bound_bytes: int
) -> int:
    """Append ``d`` to a response's ``msgs`` (filled in place) holding ``size_bytes``, unless
    that takes it past ``bound_bytes`` (one largest message: ``Limits.message_bytes_max``)
    while it holds others: then nothing is added and -1 returned (``d``
    starts the next response). Returns the response's new size. Every response then fits
    ``limits.grpc_message_bytes_max``."""
    m = msgs.add()
    fill_delivery(m, d)
    new_size = size_bytes + m.ByteSize()
    if new_size > bound_bytes and len(msgs) > 1:
        del msgs[-1]
        return -1
    return new_size


def fill_delivery(out: pb.Msg, d: Delivery) -> None:
    """Set the fields of ``out`` from ``d`` (no headers map touched when it has none)."""
    m = d.msg
    out.subject = m.subject
    out.seq = m.seq
    out.ts_ns = m.ts
    out.data = d.data
    out.reply = d.reply
    headers = d.headers
    if headers:
        out.headers.update(headers)


def pull_status_pb(s: PullStatus) -> pb.PullStatus:
    return pb.PullStatus(
        code=int(s.code),
        description=s.description,
        pending_msgs=s.pending_msgs,
        pending_bytes=s.pending_bytes,
        last_consumer_seq=s.last_consumer_seq,
        last_stream_seq=s.last_stream_seq,
    )
