"""Link states and the failover policy, sans I/O (time is passed in).

Rules:
- A link is one TCP connection to one peer on one rail. Its state is one of
  CONNECTING, UP, DOWN, PROBING; transitions live in ``_TRANSITIONS`` and an
  event with no entry for the current state is ignored on purpose only when it
  is listed in ``_IGNORED``; anything else is a bug and raises.
- Traffic to a peer goes on its *active* link: the primary rail when it is UP
  and has been UP for the hold-down time, otherwise the lowest UP rail. With
  the ``stripe`` policy every eligible link carries frames.
- A link that went DOWN is retried without limit, the back-off doubling up to
  a cap; a link that comes back is eligible again only after the hold-down, so
  a flapping rail cannot cause a storm of switches.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


class State(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    DOWN = "down"
    PROBING = "probing"


class Ev(enum.Enum):
    CONNECTED = "connected"
    CARRIER_DOWN = "carrier"          # our NIC lost carrier
    PEER_CARRIER_DOWN = "peer_carrier"  # the peer told us its NIC lost carrier
    SOCKET_ERROR = "socket_error"
    TIMEOUT = "timeout"               # silence: heartbeats or acks overdue
    PROTOCOL_ERROR = "protocol_error"  # the link carried nonsense
    DEGRADED = "degraded"             # carrier up, goodput below half of healthy
    PROBE = "probe"                   # start reconnecting
    PROBE_FAILED = "probe_failed"


_DOWN_EVENTS = (Ev.CARRIER_DOWN, Ev.PEER_CARRIER_DOWN, Ev.SOCKET_ERROR, Ev.TIMEOUT, Ev.PROTOCOL_ERROR,
                Ev.DEGRADED)

_TRANSITIONS: Dict[Tuple[State, Ev], State] = {
    (State.CONNECTING, Ev.CONNECTED): State.UP,
    (State.PROBING, Ev.CONNECTED): State.UP,
    (State.PROBING, Ev.PROBE_FAILED): State.DOWN,
    (State.DOWN, Ev.PROBE): State.PROBING,
    (State.DOWN, Ev.CONNECTED): State.UP,  # the peer reconnected first
}
for _ev in _DOWN_EVENTS:
    _TRANSITIONS[(State.UP, _ev)] = State.DOWN
    _TRANSITIONS[(State.CONNECTING, _ev)] = State.DOWN
    _TRANSITIONS[(State.PROBING, _ev)] = State.DOWN

_IGNORED = {(State.DOWN, ev) for ev in _DOWN_EVENTS} | {
    (State.UP, Ev.PROBE), (State.PROBING, Ev.PROBE), (State.UP, Ev.PROBE_FAILED),
    (State.DOWN, Ev.PROBE_FAILED), (State.UP, Ev.CONNECTED),
}


class TransitionError(RuntimeError):
    pass


@dataclass
class LinkStatus:
    rail: int
    state: State = State.CONNECTING
    since: float = 0.0
    up_since: Optional[float] = None
    down_cause: Optional[Ev] = None
    failures: int = 0
    next_probe: float = 0.0
    backoff: float = 0.0

    def await_first(self, now: float) -> None:
        """Not opened yet (a backup opened after start-up): down, to be
        dialed at once, without counting as a failure."""
        self.state = State.DOWN
        self.since = now
        self.next_probe = now
        self.backoff = 0.0

    @property
    def never_up(self) -> bool:
        return self.up_since is None and self.failures == 0

    def apply(self, ev: Ev, now: float, *, backoff_min: float = 0.05, backoff_max: float = 1.0) -> bool:
        """Apply an event; returns True when the state changed."""
        key = (self.state, ev)
        new = _TRANSITIONS.get(key)
        if new is None:
            if key in _IGNORED:
                return False
            raise TransitionError(f"link on rail {self.rail}: {ev.value} in state {self.state.value}")
        if new is State.DOWN and self.state is not State.PROBING:
            self.failures += 1
            self.down_cause = ev
            self.backoff = backoff_min
            self.next_probe = now + backoff_min
        elif new is State.DOWN:  # a failed probe: back off
            self.backoff = min(max(self.backoff * 2, backoff_min), backoff_max)
            self.next_probe = now + self.backoff
        if new is State.UP:
            self.up_since = now
            self.down_cause = None
        self.state = new
        self.since = now
        return True


@dataclass
class PathPolicy:
    """Chooses the link(s) that carry a peer's traffic."""

    primary: int = 0
    holddown: float = 1.0
    stripe: bool = False

    def eligible(self, link: LinkStatus, now: float) -> bool:
        if link.state is not State.UP:
            return False
        if link.failures == 0:
            return True
        return link.up_since is not None and now - link.up_since >= self.holddown

    def choose(self, links: Sequence[LinkStatus], now: float, avoid: int = 0) -> List[int]:
        """Rails to send on, best first; empty when no path is left.
        ``avoid``: a bitmask of rails held out (degraded), used only when no
        other rail is up."""
        up = [l.rail for l in links if l.state is State.UP]
        if not up:
            return []
        clean = [r for r in up if not avoid >> r & 1]
        ready = [l.rail for l in links if self.eligible(l, now) and not avoid >> l.rail & 1]
        if self.stripe:
            return ready or (clean or up)[:1]
        if self.primary in ready:
            return [self.primary]
        # A recovering primary still in hold-down is used only as a last resort.
        others = [r for r in ready if r != self.primary]
        if others:
            return [others[0]]
        return (clean or up)[:1]


__all__ = ["State", "Ev", "LinkStatus", "PathPolicy", "TransitionError"]
