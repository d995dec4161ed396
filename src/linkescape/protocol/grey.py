"""Grey failure: a link that keeps its carrier but loses packets or crawls
(sans I/O: kernel counters and time are passed in).

Rules:
- A link's goodput is the bytes the peer's kernel acknowledged per second of
  the time the link was busy (the kernel's ``busy_time``: data outstanding),
  so an idle or application-limited link is never slow, and time the peer's
  window was closed (a slow reader, alive) does not count.
- Each rail has a healthy reference: the goodput its links reached when
  busy, rising at once to a better sample and decaying slowly.
- A link is *degraded* when, for ``window`` seconds, its goodput stays below
  ``ratio`` times the reference while the kernel retransmits (a share
  ``min_loss`` of what it sent: loss, not a busy CPU) and its rail as a whole
  is below it too (sharing a healthy NIC with other links is not grey).
- A link that failed silently or degraded is held out of service, once it is
  back, until it has been clean (no retransmission of what it carries:
  heartbeats) for a hold-down that doubles with every trip that comes soon
  (``settle``) after the rail was back in service (capped; forgotten after
  ``forget`` quiet seconds), so a lossy rail never flaps. A rail that was
  simply blackholed and repaired is clean at once: its hold is the ordinary
  fail-back hold-down, however often that happens.
"""

from __future__ import annotations

import collections
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
    data_segs: int = 0  # segments with data sent (retransmissions included)


class Window:
    """What one link (or a whole rail) did between two samples."""

    __slots__ = ("dt", "busy", "acked", "sent", "retrans")

    def __init__(self, dt: float, busy: float, acked: int, sent: int, retrans: int) -> None:
        self.dt = dt
        self.busy = busy        # seconds with data outstanding, the peer's window open
        self.acked = acked
        self.sent = sent
        self.retrans = retrans

    @property
    def rate(self) -> float:
        return self.acked / self.busy if self.busy > 0 else 0.0

    @property
    def loss(self) -> float:
        return self.retrans / self.sent if self.sent > 0 else 0.0

    @classmethod
    def total(cls, windows) -> Optional["Window"]:
        """A rail's window from its links' (busy: the longest of them)."""
        ws = list(windows)
        if not ws:
            return None
        return cls(max(w.dt for w in ws), max(w.busy for w in ws), sum(w.acked for w in ws),
                   sum(w.sent for w in ws), sum(w.retrans for w in ws))


class RailRate:
    """The healthy goodput of one rail (bytes per busy second), and the
    rail's recent windows (every link's together)."""

    def __init__(self, decay_per_s: float = 0.02, keep: float = 2.0) -> None:
        self.reference = 0.0
        self.samples = 0
        self.decay_per_s = decay_per_s
        self.keep = keep
        self.recent: "collections.deque[Window]" = collections.deque()

    def update(self, rate: float, dt: float) -> None:
        if rate >= self.reference:
            self.reference = rate
        else:
            self.reference = max(rate, self.reference * (1.0 - self.decay_per_s * dt))
        self.samples += 1

    def observe(self, total: Optional[Window]) -> None:
        """The rail's window of this round (all its links together)."""
        if total is not None:
            _push(self.recent, total, self.keep)


def _push(recent, w: Window, keep: float) -> None:
    recent.append(w)
    total = 0.0
    for x in recent:
        total += x.dt
    while len(recent) > 1 and total - recent[0].dt >= keep:
        total -= recent.popleft().dt


def _span(recent, seconds: float) -> Optional[Window]:
    """The newest windows covering ``seconds``, as one (None: not yet covered)."""
    picked, span = [], 0.0
    for w in reversed(recent):
        picked.append(w)
        span += w.dt
        if span >= seconds - 1e-6:
            return Window(span, sum(x.busy for x in picked), sum(x.acked for x in picked),
                          sum(x.sent for x in picked), sum(x.retrans for x in picked))
    return None


class GreyDetector:
    """One link's verdict, from windows of its kernel counters.

    Every 100 ms the last 0.3 s are judged: busy for at least ``min_busy`` of
    the time (an idle or application-limited link says nothing), goodput
    below ``ratio`` times the rail's reference while the kernel retransmitted
    (``min_loss`` of what it sent), and the rail as a whole below that too (a
    link that merely shares a healthy NIC with others is not grey). The link
    is degraded once that verdict has stood for ``window`` seconds.
    """

    def __init__(self, rail: RailRate, *, window: float = 1.0, ratio: float = 0.5, min_busy: float = 0.2,
                 min_loss: float = 0.01, warmup: int = 5) -> None:
        self.rail = rail
        self.window = window
        self.ratio = ratio
        self.min_busy = min_busy
        self.min_loss = min_loss
        self.warmup = warmup
        self.last: Optional[TcpSample] = None
        self.recent: "collections.deque[Window]" = collections.deque()
        self.last_rate: Optional[float] = None
        #: seconds each verdict looks back (a lucky 100 ms does not reset the streak)
        self.smooth = 0.3
        self.bad_since: Optional[float] = None

    def measure(self, s: TcpSample) -> Optional[Window]:
        """The window since the last sample (None for the first one)."""
        last, self.last = self.last, s
        if last is None or s.now <= last.now:
            return None
        busy = ((s.busy_us - last.busy_us) - (s.rwnd_us - last.rwnd_us)) / 1e6
        return Window(s.now - last.now, max(busy, 0.0), s.acked - last.acked, s.sent - last.sent,
                      s.retrans - last.retrans)

    def judge(self, w: Window, now: float) -> bool:
        """True when the link has just become degraded (the rail's own
        windows, fed by ``RailRate.observe``, excuse a link that only shares
        a healthy NIC)."""
        _push(self.recent, w, 2 * self.window)
        ref = self.rail.reference
        busy = w.busy >= self.min_busy * w.dt
        if busy and (self.rail.samples < self.warmup or w.rate >= 0.7 * ref):
            self.rail.update(w.rate, w.dt)  # a healthy window: the reference follows
        if self.rail.samples < self.warmup:
            return False
        mine = _span(self.recent, self.smooth)
        if mine is None or mine.busy < self.min_busy * mine.dt:
            return False  # says nothing: the verdict so far stands
        self.last_rate = mine.rate
        bad = mine.rate < self.ratio * ref and mine.loss >= self.min_loss
        if bad:
            whole = _span(self.rail.recent, self.smooth)
            if whole is not None and whole.busy >= self.min_busy * whole.dt and whole.rate >= self.ratio * ref:
                bad = False  # the NIC as a whole is fine: this link only shares it
        if not bad:
            self.bad_since = None
            return False
        if self.bad_since is None:
            self.bad_since = now - mine.dt
        if now - self.bad_since < self.window:
            return False
        self.recent.clear()
        self.bad_since = None
        return True

    def sample(self, s: TcpSample, rail: Optional[Window] = None) -> bool:
        """``measure`` and ``judge`` in one call (tests)."""
        w = self.measure(s)
        if w is None:
            return False
        if rail is not None:
            self.rail.observe(rail)
        return self.judge(w, s.now)


class Hold:
    """A degraded link's time out of service.

    The rail is clean again once its link has been watched for the hold-down
    without a retransmission, and at least ``min_segments`` segments went out
    meanwhile (its heartbeats). Both count from a look at the link's counters:
    a connection first looked at a second after it opened proves nothing about
    that second. The evidence: the chance that a rail losing a share ``p`` of
    its packets looks clean is (1 - p) ** min_segments. With the 20
    heartbeats a second of an ordinary link that was 1.5 % at the 18.8 % loss
    of a chaos soak that failed back onto a lossy rail (2026-12-03); held links
    beat four times as often (``paths.HELD_BEATS``), and 60 segments make it 4e-6
    at 18.8 %, 2e-3 at 10 % (less loss than that hardly slows a TCP flow;
    what still trips the detector fails again and holds twice as long)."""

    def __init__(self, base: float = 1.0, cap: float = 60.0, forget: float = 300.0, settle: float = 5.0,
                 min_segments: int = 60) -> None:
        self.base = base
        self.cap = cap
        self.forget = forget
        #: back in service this long (and at least one hold-down) without a
        #: trip: the next trip starts again from ``base`` (it was a new fault,
        #: not the same rail flapping)
        self.settle = settle
        self.min_segments = min_segments
        self.trips = 0
        self.last_trip: Optional[float] = None
        self.released_at: Optional[float] = None
        self.clean_since: Optional[float] = None
        self.held = False
        self._retrans: Optional[int] = None
        self._segs0 = 0

    @property
    def length(self) -> float:
        return min(self.cap, self.base * (2 ** max(self.trips - 1, 0)))

    def trip(self, now: float) -> None:
        if self.last_trip is not None and now - self.last_trip > self.forget:
            self.trips = 0
        elif self.released_at is not None and now - self.released_at >= max(self.settle, self.length):
            self.trips = 0
        self.released_at = None
        self.last_trip = now
        self.trips += 1
        self.held = True
        self.clean_since = None
        self._retrans = None

    def sample(self, now: float, retrans_segs: int, data_segs: int) -> bool:
        """While held: True when the link has been clean for the hold-down
        (``retrans_segs``, ``data_segs``: the connection's cumulative counters)."""
        if not self.held:
            return False
        if self._retrans is None or retrans_segs != self._retrans:
            # the first look at this connection, or it lost since the last: clean from here
            self._retrans = retrans_segs
            self._segs0 = data_segs
            self.clean_since = now
            return False
        if now - self.clean_since >= self.length and data_segs - self._segs0 >= self.min_segments:
            self.held = False
            self.released_at = now
            return True
        return False

    def new_link(self, now: float) -> None:
        """A fresh connection on the rail: its counters start again."""
        self._retrans = None
        self.clean_since = None


__all__ = ["TcpSample", "Window", "RailRate", "GreyDetector", "Hold"]
