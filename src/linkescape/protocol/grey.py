"""Grey failure: a link that keeps its carrier but loses packets or crawls
(sans I/O: kernel counters and time are passed in).

Rules:
- A link's goodput is the bytes the peer's kernel acknowledged per second of
  the time the link was busy (the kernel's ``busy_time``: data outstanding),
  so an idle or application-limited link is never slow, and time the peer's
  window was closed (a slow reader, alive) does not count.
- Each rail has a healthy reference: the goodput its links reached when
  busy, rising at once to a better sample and decaying slowly.
- A link is *degraded* when, for ``window`` seconds of busy sampling, its
  goodput stays below ``ratio`` times the reference while the kernel
  retransmits (a share ``min_loss`` of what it sent): loss, not a busy CPU.
- A link that failed silently or degraded is held out of service, once it is
  back, until it has been clean (no retransmission of what it carries:
  heartbeats) for a hold-down that doubles with every trip of the same link
  (capped; forgotten after ``forget`` quiet seconds), so a lossy rail never
  flaps. A rail that was simply blackholed and repaired is clean at once:
  its hold is the ordinary fail-back hold-down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TcpSample:
    """Cumulative kernel counters of one connection at one time."""

    now: float
    acked: int          # bytes acknowledged by the peer
    busy_us: int        # time with data outstanding
    rwnd_us: int        # of which limited by the peer's window
    sent: int           # bytes sent (retransmissions included)
    retrans: int        # bytes retransmitted
    retrans_segs: int   # segments retransmitted (heartbeats too)


class RailRate:
    """The healthy goodput of one rail (bytes per busy second)."""

    def __init__(self, decay_per_s: float = 0.02) -> None:
        self.reference = 0.0
        self.good_time = 0.0
        self.decay_per_s = decay_per_s

    def update(self, rate: float, dt: float) -> None:
        if rate >= self.reference:
            self.reference = rate
        else:
            self.reference = max(rate, self.reference * (1.0 - self.decay_per_s * dt))
        self.good_time += dt


class GreyDetector:
    def __init__(self, rail: RailRate, *, window: float = 1.0, ratio: float = 0.5, min_busy: float = 0.5,
                 min_loss: float = 0.01, warmup: float = 1.0) -> None:
        self.rail = rail
        self.window = window
        self.ratio = ratio
        self.min_busy = min_busy
        self.min_loss = min_loss
        self.warmup = warmup
        self.last: Optional[TcpSample] = None
        #: seconds of consecutive bad busy sampling
        self.bad = 0.0
        self.last_rate: Optional[float] = None

    def sample(self, s: TcpSample) -> bool:
        """Feed one sample; True when the link has just become degraded."""
        last, self.last = self.last, s
        if last is None:
            return False
        dt = s.now - last.now
        if dt <= 0:
            return False
        busy = (s.busy_us - last.busy_us) - (s.rwnd_us - last.rwnd_us)
        if busy < self.min_busy * dt * 1e6:
            return False  # mostly idle, or the reader is slow: says nothing about the path
        rate = (s.acked - last.acked) / (busy / 1e6)
        self.last_rate = rate
        sent = s.sent - last.sent
        loss = (s.retrans - last.retrans) / sent if sent > 0 else 0.0
        ref = self.rail.reference
        if self.rail.good_time < self.warmup or rate >= self.ratio * ref:
            self.bad = 0.0
            if rate >= 0.7 * ref or self.rail.good_time < self.warmup:
                self.rail.update(rate, dt)
            return False
        if loss < self.min_loss:
            return False  # slow without loss: contention or CPU, not a grey link
        self.bad += dt
        return self.bad >= self.window


class Hold:
    """A degraded link's time out of service."""

    def __init__(self, base: float = 1.0, cap: float = 60.0, forget: float = 300.0) -> None:
        self.base = base
        self.cap = cap
        self.forget = forget
        self.trips = 0
        self.last_trip: Optional[float] = None
        self.clean_since: Optional[float] = None
        self.held = False
        self._retrans: Optional[int] = None

    @property
    def length(self) -> float:
        return min(self.cap, self.base * (2 ** max(self.trips - 1, 0)))

    def trip(self, now: float) -> None:
        if self.last_trip is not None and now - self.last_trip > self.forget:
            self.trips = 0
        self.last_trip = now
        self.trips += 1
        self.held = True
        self.clean_since = now
        self._retrans = None

    def sample(self, now: float, retrans_segs: int) -> bool:
        """While held: True when the link has been clean for the hold-down."""
        if not self.held:
            return False
        if self._retrans is not None and retrans_segs != self._retrans:
            self.clean_since = now  # still losing: start again
        self._retrans = retrans_segs
        if self.clean_since is not None and now - self.clean_since >= self.length:
            self.held = False
            return True
        return False

    def new_link(self, now: float) -> None:
        """A fresh connection on the rail: its counters start again."""
        self._retrans = None
        if self.held:
            self.clean_since = now


__all__ = ["TcpSample", "RailRate", "GreyDetector", "Hold"]
