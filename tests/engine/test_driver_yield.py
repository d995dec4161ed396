"""A caller whose core is shared with the rank it waits for polls with ``sched_yield`` in between
for a bounded time, then blocks (engine/driver.py; Communicator._spin_budget says when). Counted
in the driver's rounds and yields on a scripted engine, not timed."""

from __future__ import annotations

import types

import pytest

import linkescape.engine.driver as driver_mod
from linkescape.communicator import Communicator
from linkescape.config import Config
from linkescape.engine.driver import Driver


class _Io:
    def wake(self) -> None:
        pass


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t


class _Engine:
    """Each zero-timeout round takes 10 us of the fake clock; a blocking round sleeps its whole
    timeout. The op is done at the round ``done_at`` (None: never)."""

    def __init__(self, done_at=None) -> None:
        self.io = _Io()
        self.clock = _Clock()
        self.next_timer = float("inf")
        self.closed = False
        self.rounds = []  # the timeouts of the rounds, in order
        self.done_at = done_at
        self.op = None

    def progress_once(self, timeout: float) -> None:
        self.rounds.append(timeout)
        self.clock.t += timeout if timeout > 0 else 10e-6
        if self.done_at is not None and len(self.rounds) >= self.done_at:
            self.op.done = self.op.finished = True

    def start_locked(self, op) -> None:
        pass

    def async_work(self) -> bool:
        return False


class _Op:
    def __init__(self, deadline: float) -> None:
        self.done = self.finished = False
        self.deadline = deadline
        self.settle_until = None


@pytest.fixture
def yields(monkeypatch):
    count = []
    monkeypatch.setattr(driver_mod.os, "sched_yield", lambda: count.append(1))
    return count


def _driver(engine, spin=0.0, yield_for=0.0, deadline=60.0):
    engine.op = op = _Op(engine.clock.now() + deadline)
    d = Driver(engine)
    d.spin, d.yield_for = spin, yield_for
    return d, op


def test_a_reply_within_the_yield_budget_is_taken_without_blocking(yields):
    engine = _Engine(done_at=5)
    d, op = _driver(engine, yield_for=200e-6)
    d.run(op)
    assert op.done
    assert engine.rounds == [0.0] * 5  # never a blocking poll
    assert len(yields) == 5  # the core handed over before each look


def test_past_the_budget_the_caller_blocks_and_yields_again_after_each_wake_up(yields):
    """Nothing arrives: 20 looks (200 us of 10 us rounds), then one blocking poll for the time
    left, and so on: the yielding is bounded, never a busy loop for the whole wait."""
    engine = _Engine(done_at=None)
    d, op = _driver(engine, yield_for=200e-6)
    assert d.wait(op, timeout=0.05) is False
    blocking = [t for t in engine.rounds if t > 0]
    assert blocking and len(engine.rounds) - len(blocking) == len(yields)
    # each blocking poll follows at most one budget's looks
    run = 0
    for t in engine.rounds:
        if t > 0:
            assert run <= 20, engine.rounds
            run = 0
        else:
            run += 1
    # the wait ran to its timeout mostly asleep: one blocking poll took the rest of it
    assert max(blocking) > 0.04


def test_no_yield_budget_blocks_at_once(yields):
    engine = _Engine(done_at=2)
    d, op = _driver(engine)
    d.run(op)
    assert engine.rounds[0] > 0 and not yields


def test_a_thread_waiting_for_the_lock_ends_the_yielding(yields):
    engine = _Engine(done_at=None)
    d, op = _driver(engine, yield_for=1.0)  # (a budget that would outlast the test)
    let_in = []
    d._let_in = lambda: (let_in.append(len(engine.rounds)), setattr(d, "_waiters", 0),
                         setattr(engine, "done_at", len(engine.rounds) + 1))

    def progress_once(timeout, _orig=engine.progress_once):
        _orig(timeout)
        if len(engine.rounds) == 3:
            d._waiters = 1  # another thread asks for the lock during the yielding

    engine.progress_once = progress_once
    d.run(op)
    assert let_in == [3], let_in  # let in right after the round in which it asked


def _budget(monkeypatch, local: int, cores: int, **cfg):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    me = types.SimpleNamespace(config=Config(**cfg), rail_addrs=["10.0.0.1"],
                               peer_addresses={r: [("10.0.0.1", 1)] for r in range(1, local)})
    me.peer_addresses[local] = [("10.0.0.2", 1)]  # a rank on another host does not count
    return Communicator._spin_budget(me)


@pytest.mark.parametrize("local,cores,want", [
    (2, 2, (50e-6, 0.0)),  # a core each: busy-poll
    (3, 2, (0.0, 200e-6)),  # two ranks share a core: yield
    (4, 2, (0.0, 200e-6)),
    (5, 2, (0.0, 0.0)),  # more: a yield mostly goes to another rank that only polls
    (16, 2, (0.0, 0.0)),
    (8, 8, (50e-6, 0.0)),
])
def test_spin_and_yield_budgets_follow_the_ranks_per_core(monkeypatch, local, cores, want):
    assert _budget(monkeypatch, local, cores) == pytest.approx(want)


def test_the_budgets_can_be_set(monkeypatch):
    assert _budget(monkeypatch, 4, 2, spin_us=0.0, yield_us=0.0) == (0.0, 0.0)
    assert _budget(monkeypatch, 2, 2, yield_us=30.0) == pytest.approx((50e-6, 30e-6))
    monkeypatch.setenv("LINKESCAPE_YIELD_US", "0")
    assert Config.from_env().yield_us == 0.0
