"""What a testbed's NICs carried, and when the kernel applied a fault: the sampler's handle and its data.

* :class:`NicSampler` starts the sampler process (:mod:`.sampler`) on the
  bridge-side veth of every host NIC: ``tx`` is what the host sent on a rail
  (after its shaper), ``rx`` what it received. :meth:`NicSampler.series`
  follows the samples live; :meth:`NicSampler.stop` gives all of them.
* :class:`Counters`: the sampled cumulative byte counters, with rates over windows.
* :func:`kernel_time`: when the sampler heard the kernel apply a fault (carrier, nftables).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..common import jsonl

Key = Tuple[int, int, str]  # host, rail, "tx" | "rx"
Sample = Tuple[float, List[List[int]]]  # wall time, [host][rail] bytes


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
                row = _row(line, len(keys))
                if row is not None:
                    rows.append(row)
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


def _row(line: str, width: int) -> Optional[List[float]]:
    """``t v1 v2 ...`` of one sample line, or None (a torn or foreign line)."""
    parts = line.split()
    if len(parts) != width + 1:
        return None
    try:
        return [float(x) for x in parts]
    except ValueError:
        return None


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


class NicSampler:
    """The sampler process over every host NIC of ``tb``: ``NicSampler(tb, ...).start()``, then
    :meth:`series` (live), :meth:`stop` (every sample, as :class:`Counters`) and :meth:`kernel_events`.

    The root-namespace veth ``PREFIX-{i}s{r}`` *receives* what host ``i`` sends
    on rail ``r`` and *transmits* what it receives, so rx_bytes there is host
    egress after the shaper; a cut (veth down) or a blackhole (egress hook,
    before the qdisc) stops it at once. Without ``workdir`` its files live in
    a temporary directory, removed by :meth:`stop`.
    """

    def __init__(self, tb, workdir: Optional[str] = None, interval: float = 0.005, *, watch: bool = True,
                 directions: Sequence[str] = ("tx", "rx"), flush: Optional[float] = None) -> None:
        self._tmp = None if workdir else tempfile.mkdtemp(prefix="linkescape-nics-")
        self.path = os.path.join(workdir or self._tmp, "counters.txt")
        self.hosts, self.rails = tb.hosts, tb.rails
        self.keys: List[Key] = []
        self.files: List[str] = []
        stat = {"tx": "rx_bytes", "rx": "tx_bytes"}  # seen from the bridge side
        for i in range(tb.hosts):
            for r in range(tb.rails):
                for direction in directions:
                    self.keys.append((i, r, direction))
                    self.files.append(f"/sys/class/net/{tb.root_veth(i, r)}/statistics/{stat[direction]}")
        self.argv = [sys.executable, "-m", "linkescape.testbed.sampler", "--out", self.path,
                     "--interval", str(interval)]
        self.argv += ["--flush", str(flush)] if flush is not None else []
        self.argv += [a for i in range(tb.hosts) for a in ("--watch", tb.netns(i))] if watch else []
        self.proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()  # series() may be asked from another thread than stop()
        self._pos = 0
        self._buf = ""
        self._samples: List[List[float]] = []  # t, then one value per key
        self._kernel: Optional[List[dict]] = None

    def start(self) -> "NicSampler":
        self.proc = subprocess.Popen(self.argv + self.files, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # after its netlink sockets are subscribed
        if "ready" not in line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"the counter sampler did not start: {line!r} {err}")
        return self

    def series(self, direction: str = "tx") -> List[Sample]:
        """Every sample written so far: ``(t, [host][rail] bytes)`` in ``direction``."""
        self._follow()
        cols = [[self.keys.index((i, r, direction)) for r in range(self.rails)] for i in range(self.hosts)]
        with self._lock:
            rows = list(self._samples)
        return [(row[0], [[int(row[1 + c]) for c in host] for host in cols]) for row in rows]

    def _follow(self) -> None:
        with self._lock:
            try:
                with open(self.path) as fh:
                    fh.seek(self._pos)
                    data = fh.read()
            except FileNotFoundError:
                return
            self._pos += len(data)
            *lines, self._buf = (self._buf + data).split("\n")
            for line in lines:
                row = _row(line, len(self.keys))
                if row is not None and min(row[1:], default=0) >= 0:  # -1: the device was gone
                    self._samples.append(row)

    def kernel_events(self) -> List[dict]:
        """Carrier and nftables changes inside the hosts, time stamped on arrival."""
        return self._kernel if self._kernel is not None else jsonl.read(self.path + ".nl")

    def stop(self) -> Counters:
        """Stop the process; every sample (temporary files are read, then removed)."""
        self.close()
        counters = Counters.load(self.path, self.keys)
        if self._tmp is not None:
            self._follow()
            self._kernel = self.kernel_events()
            shutil.rmtree(self._tmp, ignore_errors=True)
        return counters

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


__all__ = ["NicSampler", "Counters", "kernel_time"]
