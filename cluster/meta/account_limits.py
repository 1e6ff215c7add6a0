"""Account limits (issue 10): the meta leader's check that a stream or consumer fits its
account's ``[auth.accounts.<name>]`` limits, before it proposes.

Counted over the account's streams and consumers in the meta state (``cluster/meta/state.py``);
storage counts ``max_bytes`` reservations times replicas, per storage type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raftstream.cluster.security.auth_values import AccountLimits
from raftstream.engine.stream_config import StorageType, StreamConfig
from raftstream.errors import InvalidArgumentError, LimitError

if TYPE_CHECKING:
    from raftstream.cluster.meta.state import MetaState

__all__ = ["check_account_limits"]


def check_account_limits(
    state: MetaState,
    account: str,
    limits: AccountLimits,
    *,
    stream: StreamConfig | None = None,
    new_consumer: bool = False,
) -> None:
    """Refuse, with ``LimitError`` naming the limit, a stream ``stream`` (new or updated) or
    a new consumer that would take ``account`` past ``limits``, counted over every stream and
    consumer of the account in the cluster (this replica's state: the meta leader's, which
    is the one that calls this before proposing).

    Storage counts reservations, as JetStream does: each stream reserves ``max_bytes`` times
    its replicas in its storage type, so a stream must set ``max_bytes`` when the account
    limits that storage (``InvalidArgumentError`` otherwise). Reserving up front makes the
    limit a promise the account cannot outgrow later, without summing live usage across
    replicas on every publish."""
    own = [sa for sa in state.all_streams() if sa.account == account]
    if stream is not None:
        existing = next((sa for sa in own if sa.name == stream.name), None)
        full = limits.max_streams is not None and len(own) + 1 > limits.max_streams
        if existing is None and full:
            raise LimitError(
                f"account {account!r} reached max_streams ({limits.max_streams})",
                limit="max_streams",
            )
        _check_storage(account, limits, stream, [sa.config for sa in own if sa.name != stream.name])
    if new_consumer and limits.max_consumers is not None:
        count = sum(len(state.consumers_of(account, sa.name)) for sa in own)
        if count + 1 > limits.max_consumers:
            raise LimitError(
                f"account {account!r} reached max_consumers ({limits.max_consumers})",
                limit="max_consumers",
            )


def _check_storage(
    account: str, limits: AccountLimits, cfg: StreamConfig, others: list[StreamConfig]
) -> None:
    memory = cfg.storage == StorageType.MEMORY
    limit_bytes = limits.max_memory_bytes if memory else limits.max_file_bytes
    if limit_bytes is None:
        return
    name = "max_memory_bytes" if memory else "max_file_bytes"
    if cfg.max_bytes <= 0:
        raise InvalidArgumentError(
            "max_bytes", f"must be set: account {account!r} has a {name} limit"
        )
    reserved = sum(
        c.max_bytes * max(1, c.num_replicas)
        for c in others
        if c.storage == cfg.storage and c.max_bytes > 0
    )
    wanted = cfg.max_bytes * max(1, cfg.num_replicas)
    if reserved + wanted > limit_bytes:
        raise LimitError(
            f"account {account!r} would reserve {reserved + wanted} bytes of {cfg.storage} "
            f"storage, over {name} ({limit_bytes})",
            limit=name,
        )
