"""The probe budget: idle and backup links are checked in turn, a fixed
number a second per rank, whatever the number of peers.

A link that carries an operation's traffic is watched all the time (its
bytes wait for the peer kernel's acknowledgement; see ``PeerChannel.tick``).
A link that carries nothing has nothing to be acknowledged, so silent loss
cannot show on it: a probe gives it something (one heartbeat frame), and the
silence check watches it until the peer's kernel acknowledged it.

Cost: ``rate`` probes a second per rank (each one frame out, one frame in at
the peer), and never more than one a second per link: with L links each is
probed every ``max(1, L / rate)`` seconds. A dead idle link is found within
that period, or as soon as it carries anything (then within the silent
timeout), whichever comes first.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

#: no link is probed more often than this (seconds)
MIN_PERIOD = 1.0


class ProbeBudget:
    def __init__(self, peers: List[int], nrails: int, rate: float) -> None:
        self.peers = list(peers)
        self.nrails = nrails
        self.count = len(self.peers) * nrails
        self.interval = max(1.0 / rate, MIN_PERIOD / self.count) if self.count else float("inf")
        self.next_at = 0.0 if self.count else float("inf")
        self._i = 0

    def due(self, now: float) -> Optional[Tuple[int, int]]:
        """The (peer, rail) to probe now, or None when none is due."""
        if now < self.next_at:
            return None
        # late by more than one interval (an operation kept the timers busy):
        # the budget does not pile up
        nxt = self.next_at + self.interval
        self.next_at = nxt if nxt > now else now + self.interval
        i = self._i
        self._i = (i + 1) % self.count
        # rail-major order: consecutive probes go to different peers
        return self.peers[i % len(self.peers)], (i // len(self.peers)) % self.nrails


__all__ = ["ProbeBudget", "MIN_PERIOD"]
