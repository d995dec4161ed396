"""Verdicts on a peer with no path (engine/liveness.py), on a fake clock: a record in the store that
stopped changing is not enough to call the peer gone; its listeners are knocked on first. A
listener that accepts the knock belongs to a process that exists (starved of CPU, its beacon thread
too: seen at 64 ranks on 2 cores), which is waited for, up to ``HUNG_FACTOR`` times the peer-lost
timeout; one that does not answer, or refuses, is a gone process or host."""

from __future__ import annotations

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.liveness import HUNG_FACTOR, KNOCK_GIVE_UP, KNOCK_WAIT, PROBE, Gone, Liveness

PLT = 2.0


class _Beacon:
    """The store's view, set by the test: the peer's record refreshing or not, the store answering or not."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.refreshing = True
        self.answering = True
        self.changed = clock.now()
        self.watched = set()

    def watch(self, peer: int) -> None:
        self.watched.add(peer)

    def unwatch(self, peer: int) -> None:
        self.watched.discard(peer)

    def stale_after(self, stale_after: float) -> float:
        return max(stale_after, 2.5)

    def record_age(self, peer: int, now: float):
        if not self.answering:
            return None
        if self.refreshing:
            self.changed = now
        return now - self.changed


class _Peer:
    def __init__(self, rank: int, no_path_since: float) -> None:
        self.rank = rank
        self.lost = None
        self.no_path_since = no_path_since
        self.eof_since = None


def _rig():
    clock = FakeClock()
    beacon = _Beacon(clock)
    lv = Liveness(0, 2, Config(peer_lost_timeout=PLT), clock, beacon)
    return clock, beacon, lv, _Peer(3, clock.now())


def _run(clock, lv, peer, seconds, answer=None):
    """Timer rounds every 10 ms for ``seconds``; the verdicts seen (``answer(now)`` answers each knock)."""
    seen = []
    end = clock.now() + seconds
    while clock.now() < end:
        v = lv.check(peer, clock.now())
        if v is not None:
            seen.append((round(clock.now() - 1000.0, 2), v))
            if v is PROBE and answer is not None:
                answer(clock.now())
            if isinstance(v, Gone):
                return seen
        clock.advance(0.01)
    return seen


def test_a_stopped_record_is_not_gone_before_a_knock_finds_nobody():
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False  # the host went off with the path

    def nobody(now):  # each knock's connects find nobody (their deadline passes)
        lv.listener_probed(peer, 0, refused=False, answered=False)

    seen = _run(clock, lv, peer, 10.0, nobody)
    # the knock starts KNOCK_WAIT before the record counts as stopped (2.5 s), so that nobody's answer
    # is known by then: the verdict comes no later than the record's staleness alone would give it
    assert seen[0][1] is PROBE and 2.5 - KNOCK_WAIT <= seen[0][0] <= 2.5 - KNOCK_WAIT + 0.02, seen
    gone = [v for _t, v in seen if isinstance(v, Gone)]
    assert len(gone) == 1 and gone[0].cause == "timeout" and gone[0].error.peer == 3
    assert 2.5 <= seen[-1][0] <= 2.55, seen
    assert "do not answer" in str(gone[0].error)


def test_a_process_whose_listener_answers_is_waited_for_and_its_record_moving_again_clears_it():
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False

    def answer(now):
        lv.listener_probed(peer, 1, refused=False, answered=True)

    seen = _run(clock, lv, peer, 5.0, answer)
    assert not any(isinstance(v, Gone) for _t, v in seen), seen
    knocks = [t for t, v in seen if v is PROBE]
    assert len(knocks) >= 5 and all(b - a >= 0.49 for a, b in zip(knocks, knocks[1:])), knocks
    beacon.refreshing = True  # it ran again and refreshed its record
    assert lv.check(peer, clock.now()) is None and peer.rank not in lv.knocks
    beacon.refreshing = False  # stopped again later: knocked on afresh, not judged on the old knocks
    seen = _run(clock, lv, peer, 2.0)
    assert seen and seen[0][1] is PROBE and not any(isinstance(v, Gone) for _t, v in seen), seen


def test_a_process_that_answers_but_never_refreshes_its_record_hangs_and_is_gone():
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False

    def answer(now):
        lv.listener_probed(peer, 0, refused=False, answered=True)

    seen = _run(clock, lv, peer, 3 * HUNG_FACTOR * PLT, answer)
    first = seen[0][0]
    assert isinstance(seen[-1][1], Gone), seen[-3:]
    assert HUNG_FACTOR * PLT < seen[-1][0] - first <= HUNG_FACTOR * PLT + 0.05, (first, seen[-1])
    assert "hangs" in str(seen[-1][1].error)


def test_a_listener_that_stops_answering_is_gone_within_a_knock():
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False
    answering = {"on": True}

    def answer(now):
        lv.listener_probed(peer, 0, refused=False, answered=answering["on"])

    seen = _run(clock, lv, peer, 3.0, answer)
    assert not any(isinstance(v, Gone) for _t, v in seen)
    answering["on"] = False  # the host went off
    t0 = clock.now()
    seen = _run(clock, lv, peer, 5.0, answer)
    assert isinstance(seen[-1][1], Gone)
    assert clock.now() - t0 < 1.0 + KNOCK_WAIT + 0.05  # the last answer goes stale, then one knock's wait


def test_a_knock_refused_on_every_rail_is_gone_at_once():
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False
    clock.advance(2.5 - KNOCK_WAIT + 0.01)
    assert lv.check(peer, clock.now()) is PROBE
    assert lv.listener_probed(peer, 0, refused=True) is None
    v = lv.listener_probed(peer, 1, refused=True)
    assert isinstance(v, Gone) and v.cause == "socket_error"


def test_a_store_that_does_not_answer_is_no_evidence_and_nothing_is_knocked():
    clock, beacon, lv, peer = _rig()
    beacon.answering = False
    assert _run(clock, lv, peer, 5.0) == []


def test_a_knock_that_could_not_be_made_is_waited_for_then_the_store_decides():
    """No knock's result comes (every probe slot busy at scale, or our own rails all down): the
    verdict waits for one, and gives up on it KNOCK_GIVE_UP after asking (the store alone decides)."""
    clock, beacon, lv, peer = _rig()
    beacon.refreshing = False
    seen = _run(clock, lv, peer, 10.0)
    first = seen[0][0]
    assert seen[0][1] is PROBE and isinstance(seen[-1][1], Gone), seen
    assert KNOCK_GIVE_UP < seen[-1][0] - first <= KNOCK_GIVE_UP + 0.05, seen
