"""The demo's traffic counters: every host NIC's transmitted bytes on one clock.

On a testbed :func:`testbed_sampler` is the testbed's NIC sampler
(:class:`linkescape.testbed.counters.NicSampler`); emulated,
:class:`FileTxSampler` collects the per-rail byte counts the ranks write.
:func:`rates_from` turns the last samples into Mbit/s per host and rail.
"""

from __future__ import annotations

import threading
import time
from typing import List, Optional, Sequence, Tuple

from ..common.jsonl import Tail
from ..testbed.counters import NicSampler

#: seconds between two samples
SAMPLE_INTERVAL = 0.05


def testbed_sampler(tb, interval: float = SAMPLE_INTERVAL) -> NicSampler:
    """Every host NIC's transmitted bytes every ``interval`` s (the testbed's sampler, followed live)."""
    return NicSampler(tb, interval=interval, watch=False, directions=("tx",), flush=interval)


class FileTxSampler(threading.Thread):
    """Emulated mode: the ranks write their bytes per rail; collect them on one clock."""

    def __init__(self, paths: Sequence[str], rails: int, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(name="demo-tx-files", daemon=True)
        self.tails = [Tail(p) for p in paths]
        self.latest = [[0] * rails for _ in paths]
        self.interval = interval
        self.samples: List[Tuple[float, List[List[int]]]] = []
        self._stop_ev = threading.Event()
        self.lock = threading.Lock()

    def sample(self) -> None:
        for i, tail in enumerate(self.tails):
            for rec in tail.read():
                self.latest[i] = list(rec["tx"])
        with self.lock:
            self.samples.append((time.time(), [list(v) for v in self.latest]))

    def run(self) -> None:
        while not self._stop_ev.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(2.0)
        self.sample()

    def series(self) -> List[Tuple[float, List[List[int]]]]:
        with self.lock:
            return list(self.samples)


def rates_from(samples: List[Tuple[float, List[List[int]]]], window: float = 0.25) -> Optional[List[List[float]]]:
    """Mbit/s per host and rail over the last ``window`` seconds of samples."""
    if len(samples) < 2:
        return None
    t1, v1 = samples[-1]
    j = len(samples) - 2
    while j > 0 and t1 - samples[j][0] < window:
        j -= 1
    t0, v0 = samples[j]
    dt = max(t1 - t0, 1e-6)
    return [[max(0.0, (b - a) * 8 / dt / 1e6) for a, b in zip(h0, h1)] for h0, h1 in zip(v0, v1)]


__all__ = ["testbed_sampler", "FileTxSampler", "rates_from", "SAMPLE_INTERVAL"]
