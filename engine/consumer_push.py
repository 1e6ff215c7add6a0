"""The push delivery plan: flow control, idle heartbeats, rate limit and original replay.

A push consumer's leader asks ``Consumer.push_step(now_ns)`` what to send next; this module
holds the leader-local bookkeeping behind the answer (not replicated: a new leader starts a
fresh plan, as a JetStream consumer leader does). With flow control, once a window of
messages or bytes has gone out the plan asks the client to answer a flow-control request and
stalls until it does; heartbeats go out after ``idle_heartbeat`` of silence and carry the last
consumer and stream sequences, plus the outstanding flow-control request when stalled so a
client that missed it can answer. Nothing reads the clock: ``now_ns`` comes from the caller.

Flow-control tokens are unique across plans (JetStream's reply subjects are, too): a new
leader, a rebuilt leader copy or a config update starts a fresh plan whose count starts
again at 1, so a token is ``<prefix>.<epoch>.<count>``, the epoch being the leader's time
(hex ns) of the plan's first request. Clients answer each token once (the SDK once per call,
older SDKs once per subscription); a plan that asked with a token a client had answered
already, before a failover (``$JS.FC.S.c.1`` again), was never answered and stalled for good.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftstream.engine.consumer_config import ConsumerConfig, ReplayPolicy
from raftstream.engine.consumer_pull import Delivery
from raftstream.errors import invariant

__all__ = [
    "FLOW_WINDOW_BYTES",
    "FLOW_WINDOW_MSGS",
    "Heartbeat",
    "PushPlanner",
    "PushStep",
    "new_planner",
]

FLOW_WINDOW_MSGS = 512
FLOW_WINDOW_BYTES = 4 * 1024 * 1024
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """An idle heartbeat (``100 Idle Heartbeat``): ``Nats-Last-Consumer``/``-Stream`` values
    and, when stalled, the flow-control request to answer (``Nats-Consumer-Stalled``)."""

    last_consumer_seq: int
    last_stream_seq: int
    stalled: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PushStep:
    """What to send now, in order: deliveries, then a flow-control request, then a heartbeat.

    ``wake_at_ns``: call ``push_step`` again by then even if nothing happens (0: only when a
    message is stored, an ack arrives or flow control is answered).
    """

    deliveries: tuple[Delivery, ...] = ()
    flow_control: str | None = None
    heartbeat: Heartbeat | None = None
    wake_at_ns: int = 0


class PushPlanner:
    """Leader-local push pacing for one consumer. Not thread-safe; owned by the leader."""

    def __init__(
        self,
        *,
        fc_prefix: str,
        idle_heartbeat_ns: int,
        flow_control: bool,
        rate_limit_bps: int,
        replay_original: bool,
        flow_window_msgs: int = FLOW_WINDOW_MSGS,
        flow_window_bytes: int = FLOW_WINDOW_BYTES,
    ) -> None:
        invariant(flow_window_msgs > 0 and flow_window_bytes > 0, "flow windows are positive")
        self._fc_prefix = fc_prefix
        self._hb_ns = idle_heartbeat_ns
        self._fc = flow_control
        self._bps = rate_limit_bps
        self._replay = replay_original
        self._window_msgs = flow_window_msgs
        self._window_bytes = flow_window_bytes
        self.stalled: str | None = None
        self._fc_count = 0
        self._fc_epoch: int | None = None  # the leader's time of this plan's first request
        self._since_fc_msgs = 0
        self._since_fc_bytes = 0
        self._last_sent_ns: int | None = None
        self._next_send_ns = 0
        self._replay_anchor: tuple[int, int] | None = None  # (now_ns, msg ts) of the first

    def blocked_until(self, now_ns: int) -> int | None:
        """None when a message may go now; else when one may (0: not before an FC answer)."""
        if self.stalled is not None:
            return 0
        if self._next_send_ns > now_ns:
            return self._next_send_ns
        return None

    def replay_at(self, msg_ts_ns: int, now_ns: int) -> int:
        """With replay_policy original: the time a message stored at ``msg_ts_ns`` may go."""
        if not self._replay:
            return now_ns
        if self._replay_anchor is None:
            self._replay_anchor = (now_ns, msg_ts_ns)
        anchor_now, anchor_ts = self._replay_anchor
        return anchor_now + max(0, msg_ts_ns - anchor_ts)

    def sent(self, size_bytes: int, now_ns: int) -> None:
        """Record one message sent: rate limit and flow-control window advance."""
        self._last_sent_ns = now_ns
        if self._bps:
            # rate_limit_bps is bits per second; the next message waits for this one's bits.
            self._next_send_ns = now_ns + (size_bytes * 8 * NS_PER_S) // self._bps
        self._since_fc_msgs += 1
        self._since_fc_bytes += size_bytes

    def flow_control_due(self) -> str | None:
        """A new flow-control request when the window is used up (the plan then stalls)."""
        if not self._fc or self.stalled is not None:
            return None
        if self._since_fc_msgs < self._window_msgs and self._since_fc_bytes < self._window_bytes:
            return None
        if self._fc_epoch is None:
            invariant(self._last_sent_ns is not None, "a window fills only by sending")
            self._fc_epoch = self._last_sent_ns
        self._fc_count += 1
        # Unique across plans, not only within one (module docstring): another plan of
        # this consumer (another leader, or this one's after a rebuild) asks from its own
        # first request's time on.
        self.stalled = f"{self._fc_prefix}.{self._fc_epoch:x}.{self._fc_count}"
        self._since_fc_msgs = 0
        self._since_fc_bytes = 0
        return self.stalled

    def answer(self, reply: str) -> bool:
        """The client answered flow-control request ``reply``; True when that unstalls.

        Answers to older or unknown requests are ignored (clients may answer twice).
        """
        if self.stalled is None or reply != self.stalled:
            return False
        self.stalled = None
        return True

    def heartbeat_due(self, now_ns: int, last_cseq: int, last_sseq: int) -> Heartbeat | None:
        """A heartbeat when ``idle_heartbeat`` passed since anything was sent."""
        if not self._hb_ns:
            return None
        if self._last_sent_ns is None:
            self._last_sent_ns = now_ns  # the plan starts idle: first beat one interval on
            return None
        if now_ns - self._last_sent_ns < self._hb_ns:
            return None
        self._last_sent_ns = now_ns
        return Heartbeat(
            last_consumer_seq=last_cseq, last_stream_seq=last_sseq, stalled=self.stalled
        )

    def next_heartbeat_ns(self) -> int:
        if not self._hb_ns or self._last_sent_ns is None:
            return 0
        return self._last_sent_ns + self._hb_ns


def new_planner(
    stream: str, consumer: str, config: ConsumerConfig, flow_window_msgs: int
) -> PushPlanner:
    """A fresh plan for ``consumer`` of ``stream`` under ``config`` (a new leader, a config
    update, a lost leadership each start one)."""
    return PushPlanner(
        fc_prefix=f"$JS.FC.{stream}.{consumer}",
        idle_heartbeat_ns=config.idle_heartbeat,
        flow_control=config.flow_control,
        rate_limit_bps=config.rate_limit_bps,
        replay_original=config.replay_policy is ReplayPolicy.ORIGINAL,
        flow_window_msgs=flow_window_msgs,
    )
