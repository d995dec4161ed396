"""The demo's traffic counters: every host NIC's transmitted bytes on one clock.

On a testbed :class:`NetnsTxSampler` reads each host's ``/proc/PID/net/dev``
through a placeholder process inside the host; emulated,
:class:`FileTxSampler` collects the per-rail byte counts the ranks write.
:func:`rates_from` turns the last samples into Mbit/s per host and rail.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import List, Optional, Sequence, Tuple

from ..testbed.job import Tail

#: seconds between two samples
SAMPLE_INTERVAL = 0.05


class NetnsTxSampler(threading.Thread):
    """Samples every host NIC's tx_bytes every 50 ms, from the root namespace.

    A placeholder process (``sleep``) is started inside each host; the
    kernel shows that process's network namespace in ``/proc/PID/net/dev``,
    so the controller reads every host's counters without forking a process
    per sample.
    """

    def __init__(self, tb, interval: float = SAMPLE_INTERVAL) -> None:
        super().__init__(name="demo-tx-sampler", daemon=True)
        self.tb = tb
        self.interval = interval
        self.nics = tb.rail_nics
        self.holders = [tb.popen(i, ["sleep", "100000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        for i in range(tb.hosts)]
        self.samples: List[Tuple[float, List[List[int]]]] = []  # (t, [host][rail] tx bytes)
        self._stop_ev = threading.Event()
        self.lock = threading.Lock()

    def _read(self, pid: int) -> List[int]:
        with open(f"/proc/{pid}/net/dev") as f:
            rows = f.read().splitlines()[2:]
        tx = {}
        for row in rows:
            name, _, rest = row.partition(":")
            cols = rest.split()
            if len(cols) >= 9:
                tx[name.strip()] = int(cols[8])
        return [tx.get(n, 0) for n in self.nics]

    def sample(self) -> None:
        t = time.time()
        vals = [self._read(p.pid) for p in self.holders]
        with self.lock:
            self.samples.append((t, vals))

    def run(self) -> None:
        time.sleep(0.05)  # let `ip netns exec` become `sleep` inside the namespace
        nxt = time.monotonic()
        while not self._stop_ev.is_set():
            try:
                self.sample()
            except (OSError, ValueError):
                pass
            nxt += self.interval
            self._stop_ev.wait(max(0.0, nxt - time.monotonic()))

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(2.0)
        for p in self.holders:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(2.0)
                except subprocess.TimeoutExpired:
                    p.kill()

    def series(self) -> List[Tuple[float, List[List[int]]]]:
        with self.lock:
            return list(self.samples)


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


__all__ = ["NetnsTxSampler", "FileTxSampler", "rates_from", "SAMPLE_INTERVAL"]
