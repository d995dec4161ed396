"""The engine's timer rounds on a fake clock: a deadline a peer asks for between
two rounds (``PeerEnv.soon``) bounds the next poll and starts a round when due;
no fixed tick."""

from __future__ import annotations

import pytest

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.core import Engine
from linkescape.engine.env import INF


@pytest.fixture
def engine():
    eng = Engine(0, 2, 1, Config(), clock=FakeClock())
    polls = []

    def poll(timeout):
        polls.append(timeout)
        return []
    eng.io.poll = poll
    eng.polls = polls
    yield eng
    eng.close_io()


def test_a_deadline_asked_for_before_the_poll_bounds_its_sleep(engine):
    """An op posted before a poll sent bytes (their silence check is due in 200 ms):
    the poll sleeps no longer, whatever the timers said before."""
    now = engine.clock.now()
    engine.next_timer = now + 5.0
    engine.env.soon(now + 0.2)
    engine.progress_once(1.0)
    assert engine.polls[-1] == pytest.approx(0.2)
    assert engine.env.wakeup.at == INF  # taken up by the round ...
    assert engine.next_timer == pytest.approx(now + 0.2)  # ... as the next timer round


def test_a_deadline_already_due_runs_the_timers_in_this_round(engine):
    now = engine.clock.now()
    engine.next_timer = now + 5.0
    rounds = []
    engine._timers = lambda t: rounds.append(t)
    engine.env.soon(0.0)
    engine.progress_once(1.0)
    assert engine.polls[-1] <= 0.0  # (IoSet.poll takes it as 0: no sleep)
    assert rounds == [now]


def test_no_round_without_a_deadline(engine):
    """Nothing asked for and nothing due: the poll sleeps as long as it was told and no
    timer round runs (a hot peer alone no longer means a round every 40 ms)."""
    now = engine.clock.now()
    engine.next_timer = now + 5.0
    engine.hot.add(engine.peers[1])
    rounds = []
    engine._timers = lambda t: rounds.append(t)
    engine.progress_once(1.0)
    assert engine.polls[-1] == 1.0
    assert rounds == []
    assert engine.next_timer == now + 5.0


def _driver_with_wakes(engine):
    from linkescape.engine.driver import Driver
    driver = Driver(engine)
    wakes = []
    engine.io.wake = lambda: wakes.append(engine.clock.now())
    return driver, wakes


def test_a_round_under_locked_that_moves_the_deadline_sooner_wakes_the_sleeping_progress_thread(engine):
    """The progress thread sleeps in its idle poll until the next timer (5 s here); a thread that
    makes a round under ``locked()`` (a frame parked: its stash is due in 5 ms) and so moves the
    deadline sooner must wake it, or the frame waits for the old deadline (the round took up the
    asked deadline, so ``timers_wanted()`` alone said nothing: CI, 2 of 8 parked frames not stashed)."""
    driver, wakes = _driver_with_wakes(engine)
    now = engine.clock.now()
    engine.next_timer = now + 5.0
    driver._idle_until = engine.next_timer  # asleep until then

    def park():
        engine.env.soon(now + 0.005)
        engine.progress_once(0.0)
    driver.call(park)
    assert engine.next_timer == pytest.approx(now + 0.005)
    assert not engine.timers_wanted()  # taken up by the round ...
    assert wakes, "the sleeping progress thread was not woken"  # ... so only the moved deadline says it


def test_a_round_that_leaves_the_deadline_where_the_sleeper_has_it_wakes_nobody(engine):
    driver, wakes = _driver_with_wakes(engine)
    now = engine.clock.now()
    engine.next_timer = now + 0.5
    driver._idle_until = now + 0.5
    driver.call(lambda: engine.progress_once(0.0))
    assert not wakes
    driver._idle_until = 0.0  # the progress thread is not in its idle poll: nothing to wake
    engine.next_timer = now + 0.5

    def sooner():
        engine.env.soon(now + 0.1)
        engine.progress_once(0.0)
    driver.call(sooner)
    assert engine.next_timer == pytest.approx(now + 0.1) and not wakes


def test_the_last_caller_to_stop_driving_wakes_a_progress_thread_asleep_past_its_deadlines(engine):
    """The progress thread entered its idle poll (until 5 s) before a caller started driving
    (an uncontended lock wakes nobody); the caller's rounds left a deadline in 40 ms (an ack
    owed): when it stops driving, the sleeper is woken to run it. Not while another still drives,
    nor when the sleeper's own deadline comes first."""
    driver, wakes = _driver_with_wakes(engine)
    now = engine.clock.now()
    driver._idle_until = now + 5.0
    driver._drivers = 2
    engine.next_timer = now + 0.04
    driver._driver_done()
    assert not wakes  # another caller still drives (and runs the timers)
    driver._driver_done()
    assert len(wakes) == 1
    driver._drivers = 1
    engine.next_timer = now + 6.0
    driver._driver_done()
    assert len(wakes) == 1
