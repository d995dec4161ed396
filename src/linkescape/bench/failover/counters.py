"""What the failover benchmark measures with: sampled byte counters, kernel event times, summaries.

* :class:`Counters`: the cumulative tx/rx byte counters of every host NIC, as
  the sampler process (:mod:`.sampler`) wrote them, with rates over windows.
* :func:`kernel_time`: when the sampler heard the kernel apply a fault.
* :func:`summarize`: n, median, p99, min, max, mean of a list with gaps.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

import numpy as np

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
               "kibit": 1024.0, "mibit": 1024.0 ** 2, "gibit": 1024.0 ** 3}


def parse_rate(rate: str) -> float:
    """A tc rate (``1gbit``, ``100mbit``, ``125mbps``) in bits per second."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", rate or "")
    if not m:
        raise ValueError(f"rate {rate!r}: expected a tc rate such as 1gbit")
    unit = m.group(2).lower() or "bit"
    if unit not in _RATE_UNITS:
        raise ValueError(f"rate {rate!r}: unknown unit {unit!r}")
    return float(m.group(1)) * _RATE_UNITS[unit]


def summarize(values: Iterable[Optional[float]]) -> Dict[str, Any]:
    """n, median, p99, min, max of the non-missing values (same unit); ``missing`` counts Nones."""
    vals = list(values)
    got = np.array([v for v in vals if v is not None], dtype=float)
    out: Dict[str, Any] = {"n": int(got.size), "missing": len(vals) - int(got.size)}
    if got.size:
        out.update(median=float(np.median(got)), p99=float(np.percentile(got, 99)),
                   min=float(got.min()), max=float(got.max()), mean=float(got.mean()))
    else:
        out.update(median=None, p99=None, min=None, max=None, mean=None)
    return out


def ms(x: Optional[float]) -> Optional[float]:
    """Seconds to milliseconds, None stays None."""
    return None if x is None else x * 1000.0


class Counters:
    """Sampled cumulative byte counters: ``t`` (unix seconds) and one column per key."""

    def __init__(self, t: np.ndarray, cols: Dict[Tuple, np.ndarray]) -> None:
        self.t = t
        self.cols = cols

    @classmethod
    def load(cls, path: str, keys: Sequence[Tuple]) -> "Counters":
        rows = []
        with open(path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == len(keys) + 1:
                    try:
                        rows.append([float(x) for x in parts])
                    except ValueError:
                        continue
        a = np.array(rows, dtype=float).reshape(-1, len(keys) + 1)
        if len(a):
            ok = np.all(a[:, 1:] >= 0, axis=1)  # -1: the device was gone (teardown)
            a = a[ok]
        return cls(a[:, 0], {k: a[:, i + 1] for i, k in enumerate(keys)})

    def series(self, host: int, rails: Sequence[int], direction: str = "tx") -> np.ndarray:
        """Cumulative bytes of ``host`` over ``rails``; tx = what the host sent."""
        out = np.zeros_like(self.t)
        for r in rails:
            out = out + self.cols[(host, r, direction)]
        return out

    def rates(self, c: np.ndarray, starts: np.ndarray, window: float) -> np.ndarray:
        """Bits per second in ``[s, s + window]`` for every start ``s`` (linear interpolation)."""
        return (np.interp(starts + window, self.t, c) - np.interp(starts, self.t, c)) * 8.0 / window

    def starts(self, t0: float, t1: float) -> np.ndarray:
        """Sample times in ``[t0, t1]`` (window starts at the resolution of the sampling)."""
        return self.t[(self.t >= t0) & (self.t <= t1)]

    def first_at_or_above(self, c: np.ndarray, t0: float, t1: float, threshold: float,
                          window: float) -> Optional[float]:
        """Start of the first window in ``[t0, t1]`` whose rate is >= ``threshold``, or None."""
        s = np.concatenate(([t0], self.starts(t0, t1)))
        if not len(s):
            return None
        r = self.rates(c, s, window)
        hit = np.nonzero(r >= threshold)[0]
        return float(s[hit[0]]) if len(hit) else None

    def covers(self, t0: float, t1: float) -> bool:
        return bool(len(self.t)) and self.t[0] <= t0 and self.t[-1] >= t1


def kernel_time(kernel: Sequence[dict], netns: str, nic: str, kind: str, down: bool, t0: float,
                t1: float) -> Optional[float]:
    """When the sampler heard the kernel apply a fault (``down``) or its repair, within ``[t0, t1]``:
    carrier loss/return of ``nic`` for a cut or a flap, the drop table's chains appearing/going for a blackhole."""
    table = f"le_bh_{nic}"
    for e in kernel:
        if e.get("netns") != netns or not (t0 <= e["t"] <= t1):
            continue
        if kind in ("cut", "flap") and e["what"] == "carrier" and e["name"] == nic and e["up"] is (not down):
            return e["t"]
        if kind == "blackhole" and e["name"] == table and e["what"] == ("newchain" if down else "delchain"):
            return e["t"]
    return None


__all__ = ["Counters", "parse_rate", "summarize", "kernel_time", "ms"]
