"""The engine's timer rounds on a fake clock: a deadline a peer asks for between
two rounds (``PeerEnv.soon``) bounds the next poll and starts a round when due;
no fixed tick."""

from __future__ import annotations

import pytest

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.core import Engine
from linkescape.engine.peer import INF


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
    assert engine.env.wake_at == INF  # taken up by the round ...
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
