"""Grey failure, sans I/O: goodput from kernel counters, the rail's healthy
reference, the trip, and the hold-down that keeps a lossy rail from flapping."""

from __future__ import annotations

from linkescape.protocol.grey import GreyDetector, Hold, RailRate, TcpSample, Window

MB = 1_000_000


class Link:
    """Synthesizes cumulative counters: ``rate`` bytes per busy second."""

    def __init__(self) -> None:
        self.t = 0.0
        self.acked = self.busy = self.rwnd = self.sent = self.retrans = self.segs = 0

    def step(self, dt: float, rate: float, busy: float = 1.0, loss: float = 0.0, rwnd: float = 0.0) -> TcpSample:
        self.t += dt
        busy_us = int(dt * busy * 1e6)
        self.busy += busy_us
        self.rwnd += int(dt * rwnd * 1e6)
        acked = int(rate * (busy_us - dt * rwnd * 1e6) / 1e6)
        self.acked += acked
        sent = int(acked / (1 - loss)) if loss < 1 else acked
        self.sent += sent
        self.retrans += sent - acked
        self.segs += (sent - acked) // 1448
        return TcpSample(self.t, self.acked, self.busy, self.rwnd, self.sent, self.retrans, self.segs)


def _run(det, link, seconds, rail_rate=None, **kw):
    """Sample every 100 ms; ``rail_rate``: the rail's total goodput in the
    window (None: this link is the rail's only busy one)."""
    tripped = []
    for _ in range(int(seconds / 0.1)):
        s = link.step(0.1, **kw)
        w = det.measure(s)
        if w is None:
            continue
        if rail_rate is not None:
            det.rail.observe(Window(w.dt, w.busy, int(rail_rate * w.busy), w.sent, w.retrans))
        if det.judge(w, s.now):
            tripped.append(link.t)
    return tripped


def test_a_lossy_link_trips_after_one_second_below_half():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    assert _run(det, link, 3, rate=110 * MB) == []
    assert rail.reference > 100 * MB
    tripped = _run(det, link, 3, rate=5 * MB, loss=0.2)
    # the goodput of the last second as a whole fell below half: within about a second
    assert tripped and 0.5 <= tripped[0] - 3.0 <= 1.25


def test_a_lucky_window_does_not_hide_a_lossy_link():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    _run(det, link, 3, rate=110 * MB)
    tripped = []
    for i in range(40):  # mostly collapsed, one good 100 ms in four
        good = i % 4 == 0
        s = link.step(0.1, rate=(100 if good else 2) * MB, loss=0.2)  # the loss is there all along
        w = det.measure(s)
        if w is not None and det.judge(w, s.now):
            tripped.append(link.t)
    assert tripped and tripped[0] - 3.0 <= 1.3


def test_bursty_traffic_still_trips_within_the_window():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    _run(det, link, 3, rate=110 * MB, busy=0.3)
    tripped = _run(det, link, 4, rate=5 * MB, loss=0.2, busy=0.3)  # busy a third of the time
    assert tripped and tripped[0] - 3.0 <= 1.3


def test_a_link_that_only_shares_a_healthy_nic_is_not_grey():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    _run(det, link, 3, rate=110 * MB, rail_rate=110 * MB)
    # a third of the NIC each, with drops at the shaper: the rail as a whole is fine
    assert _run(det, link, 5, rate=37 * MB, loss=0.02, rail_rate=105 * MB) == []


def test_slow_without_loss_is_contention_not_grey():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    _run(det, link, 3, rate=110 * MB)
    assert _run(det, link, 5, rate=40 * MB) == []


def test_idle_or_slow_reader_says_nothing():
    rail = RailRate()
    det, link = GreyDetector(rail), Link()
    _run(det, link, 3, rate=110 * MB)
    assert _run(det, link, 5, rate=1 * MB, busy=0.1, loss=0.3) == []  # application-limited (10 % busy)
    assert _run(det, link, 5, rate=110 * MB, rwnd=0.9, loss=0.3) == []  # the peer's window is closed


def test_no_trip_before_a_reference_exists():
    det, link = GreyDetector(RailRate()), Link()
    assert _run(det, link, 5, rate=5 * MB, loss=0.2) == []


def test_the_reference_is_shared_by_a_rail_and_decays_slowly():
    rail = RailRate()
    _run(GreyDetector(rail), Link(), 3, rate=110 * MB)
    fresh = GreyDetector(rail)  # a re-dialed link on the same rail
    tripped = _run(fresh, Link(), 3, rate=5 * MB, loss=0.2)
    assert tripped
    assert rail.reference > 100 * MB  # bad samples never drag it down


def test_hold_ends_only_after_a_clean_hold_down_that_doubles():
    hold = Hold(base=3.0, cap=60.0, forget=300.0)
    hold.trip(0.0)
    assert hold.length == 3.0
    segs = 0
    sent = 0
    t = 0.0
    while t < 10.0:  # still losing: never released
        t += 0.1
        segs += 1
        sent += 8
        assert not hold.sample(t, segs, sent)
    released = None
    while t < 20.0:  # clean from now on
        t += 0.1
        sent += 8
        if hold.sample(t, segs, sent):
            released = t
            break
    assert released is not None and 2.9 <= released - 10.0 <= 3.3
    hold.trip(released + 2.0)  # failed again soon after it was back: flapping
    assert hold.length == 6.0 and hold.held
    for _ in range(8):
        hold.trip(released + 3.0)
    assert hold.length == 60.0
    hold.trip(400.0)  # long quiet: forgotten
    assert hold.length == 3.0


def test_a_hold_is_not_released_on_a_connection_it_never_watched():
    """The chaos soak that failed on 2026-12-03: a re-dialed link on the held
    rail, first looked at a second later, must not count that second as clean."""
    hold = Hold(base=1.0)
    hold.trip(0.0)
    hold.new_link(0.05)
    assert not hold.sample(1.2, 7, 500)  # the first look: a baseline, not a verdict
    assert not hold.sample(1.7, 7, 560)
    assert hold.sample(2.2, 7, 560)  # clean for the hold-down since the first look, 60 segments


def test_a_hold_needs_enough_heartbeats_to_call_a_rail_clean():
    """Few segments without a retransmission say little: at 18.8 % loss, 20 of
    them get through clean 1.5 % of the time."""
    hold = Hold(base=1.0, min_segments=60)
    hold.trip(0.0)
    assert not hold.sample(0.1, 3, 100)
    assert not hold.sample(1.5, 3, 120)  # 1.4 s clean, but 20 segments only
    assert not hold.sample(3.0, 3, 159)
    assert hold.sample(3.1, 3, 160)


def test_a_rail_that_served_cleanly_after_its_hold_starts_again_from_the_base():
    """Repeated faults of a rail that each time came back and carried traffic
    (a blackhole repaired every few seconds) are new faults, not a flapping
    rail: their hold-downs do not grow; one that fails soon after it is back does."""
    hold = Hold(base=1.0, cap=60.0, forget=300.0, settle=5.0)
    t = 0.0
    for _ in range(10):
        hold.trip(t)
        assert hold.length == 1.0
        assert hold.sample(t + 0.05, 0, 0) is False  # the first look
        assert hold.sample(t + 0.5, 0, 40) is False  # not clean for a hold-down yet
        t += 1.1
        assert hold.sample(t, 0, 80) is True  # clean for the hold-down: back in service
        t += 6.0  # served cleanly past the settle time
    hold.trip(t)
    hold.sample(t, 0, 0)
    t += 1.05
    assert hold.sample(t, 0, 80)
    hold.trip(t + 1.0)  # failed again 1 s after it was back
    assert hold.length == 2.0
