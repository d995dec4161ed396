"""The engine's time. Every timer of the engine (silence checks, heartbeats,
hold-downs, back-offs, grey-failure windows, operation deadlines) reads a
clock object instead of the system clock, so their logic can be driven in
tests by a clock that moves only when told (as trio's ``MockClock``).
"""

from __future__ import annotations

import time


class Clock:
    """Monotonic seconds (``now``) and wall seconds (``wall``), for events.
    (The system's own functions, called directly: the data path reads the
    clock a few times per operation.)"""

    __slots__ = ()

    now = staticmethod(time.monotonic)
    wall = staticmethod(time.time)


#: the clock of every engine unless a test gives another
SYSTEM = Clock()


class FakeClock(Clock):
    """A clock that moves only when told: ``advance(seconds)`` or ``advance_ms(ms)``."""

    __slots__ = ("t", "_wall0")

    def __init__(self, start: float = 1000.0, wall: float = 1.7e9) -> None:
        self.t = start
        self._wall0 = wall - start

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self._wall0 + self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t

    def advance_ms(self, ms: float) -> float:
        return self.advance(ms / 1000.0)


__all__ = ["Clock", "SYSTEM", "FakeClock"]
