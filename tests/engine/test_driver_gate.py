"""The progress thread of a rank at the start-up barrier waits at a gate: it starts the rank's
other threads (the beacon and recovery) and drives nothing until the barrier is passed, so a rank
that arrived early takes no CPU from the ranks still starting. A close while it waits ends it."""

from __future__ import annotations

import threading

from linkescape.config import Config
from linkescape.engine.clock import FakeClock
from linkescape.engine.core import Engine
from linkescape.engine.driver import Driver


def _driver():
    return Driver(Engine(0, 2, 1, Config(), clock=FakeClock()))


def test_a_gated_progress_thread_starts_the_others_only_once_the_gate_opens():
    driver = _driver()
    started = threading.Event()
    try:
        driver.start_background(also=[started.set], gated=True)
        assert not started.wait(0.3)  # at the barrier: nothing started
        assert driver._thread.is_alive()
        driver.open_gate()
        assert started.wait(5.0)
    finally:
        driver.close(graceful=False)
    assert not driver._thread.is_alive()


def test_an_ungated_progress_thread_starts_the_others_at_once():
    driver = _driver()
    started = threading.Event()
    try:
        driver.start_background(also=[started.set])
        assert started.wait(5.0)
    finally:
        driver.close(graceful=False)


def test_a_close_at_the_gate_ends_the_thread_without_starting_the_others():
    driver = _driver()
    started = threading.Event()
    driver.start_background(also=[started.set], gated=True)
    driver.close(graceful=False)  # a start-up barrier that failed
    assert not driver._thread.is_alive()
    assert not started.is_set()
