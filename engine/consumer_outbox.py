"""The leader's op outbox: the ops a consumer applied, in order, kept for replication.

Part of ``Consumer`` (``consumer.py``), which applies each op before it puts it here; the
caller takes the ops (``take``) and replicates them. Threading: as the consumer, one thread.
"""

from __future__ import annotations

from raftstream.engine.consumer_state import ConsumerOp, Deliver
from raftstream.errors import invariant

__all__ = ["OUTBOX_OPS_MAX", "OpOutbox"]

OUTBOX_OPS_MAX = 65536


class OpOutbox:
    """Applied ops waiting to be taken, at most ``OUTBOX_OPS_MAX`` (``InvariantError``
    beyond: a caller that never takes them is a bug). Consecutive deliveries at one instant
    merge into one ``Deliver`` op."""

    def __init__(self) -> None:
        self._ops: list[ConsumerOp] = []
        # The Deliver op being built at the end of the outbox: (now_ns, its sequences).
        self._deliver_run: tuple[int, list[int]] | None = None

    def put(self, op: ConsumerOp) -> None:
        """Keep ``op`` (already applied) after every op put before it."""
        if isinstance(op, Deliver):
            # Consecutive deliveries at one instant merge into one op: applying
            # Deliver(a, b) is by construction the same as Deliver(a) then Deliver(b). The
            # run is a list until taken (one op per batch, not one rebuilt per message).
            run = self._deliver_run
            if run is not None and run[0] == op.now_ns:
                run[1].extend(op.stream_seqs)
                return
            self._close_deliver_run()
            self._deliver_run = (op.now_ns, list(op.stream_seqs))
            return
        self._close_deliver_run()
        self._append(op)

    def take(self) -> list[ConsumerOp]:
        """The ops put since the last call, in order; the caller owns the list."""
        self._close_deliver_run()
        out, self._ops = self._ops, []
        return out

    def _close_deliver_run(self) -> None:
        """Put the Deliver op being built, if any, in the outbox (keeping op order)."""
        run = self._deliver_run
        if run is not None:
            self._deliver_run = None
            self._append(Deliver(stream_seqs=tuple(run[1]), now_ns=run[0]))

    def _append(self, op: ConsumerOp) -> None:
        invariant(len(self._ops) < OUTBOX_OPS_MAX, "consumer op outbox overflow")
        self._ops.append(op)
