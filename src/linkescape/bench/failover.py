"""The failover benchmark: ``linkescape bench --faults cut,blackhole``.

On a testbed (``hosts`` network namespaces x ``rails`` veth rails shaped to
``rate`` with tbf) one rank per host runs a saturating all_reduce
(:mod:`linkescape.bench.failover_worker`: ``depth`` asynchronous all_reduces of
``size`` bytes always in flight, every result checked bit for bit). While it
runs, ``count`` faults of each kind hit the primary rail (rail 0) of one host
after another (host ``i % hosts``): fault, hold, restore, wait for failback,
settle, next. Measured:

* **detection**: fault timestamp (what ``Testbed.cut``/``blackhole`` return) ->
  first ``failover`` event of the faulty host's rank (*local*) and of every
  other rank for its link to the faulty rank (*peer side*, one sample per
  fault and peer; *all peers* = the last of them per fault).
* **throughput restored**: from the bridge-side veth counters in the root
  namespace (bytes each host's NIC really put on the wire after tbf, sampled
  every ``sample_ms``): the faulty host's egress over all rails in windows of
  ``window_ms``; first window after the fault whose rate is >= 90 % (and 50 %)
  of the reference, reported from the fault and from the local detection. The
  reference is ``min(rail rate, p90 of the pre-fault windows)``: what the
  wire carries when busy (a ring all_reduce has short bubbles between steps,
  so the pre-fault *mean* is below the line rate).
* **failback**: restore timestamp -> ``failback`` events, and -> the first
  window with >= 90 % of the reference on rail 0 again.
* **overhead**: healthy busbw with the backup rails (``LINKESCAPE_RAILS`` =
  every rail) vs one rail (``r0``), alternating runs.
* **correctness**: wrong elements, errors, hangs, and link events that no
  fault explains (false trips).
* **MPTCP**: a plain MPTCP bulk transfer between two hosts of a 2-host
  testbed with the same rails, the primary rail of the sender cut; time until
  half (and 90 %) of the rate is back on the other rail. linkescape is run
  through the same cuts on the same testbed for a like-for-like comparison.

Everything runs in throwaway testbeds (:func:`temporary_testbed`) and every
process is stopped in ``finally`` blocks.
"""

from __future__ import annotations

import json
import os
import platform
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

FAULT_KINDS = ("cut", "blackhole")

#: targets, milliseconds (the benchmark reports them; tests never assert them)
TARGETS = {
    "cut": {"local_p99": 5.0, "peer_p99": 10.0},
    "blackhole": {"local_p99": 300.0, "peer_p99": 300.0},
    "restore_after_detect": 50.0,
    "overhead_pct": 1.0,
}

Log = Callable[[str], None]

#: the outage-equivalent is the traffic missing in this long after a fault, in
#: milliseconds at the pre-fault mean rate (a fault is held at least this long)
LOST_SPAN_S = 1.0


# ------------------------------------------------------------------ helpers
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


def _ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else x * 1000.0


# --------------------------------------------------------------- counters
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


class Sampler:
    """A separate process reading the bridge-side veth counters of every host NIC.

    The root-namespace veth ``PREFIX-{i}s{r}`` *receives* what host ``i`` sends
    on rail ``r`` and *transmits* what it receives, so rx_bytes there is host
    egress after the shaper; a cut (veth down) or a blackhole (egress hook,
    before the qdisc) stops it at once.
    """

    def __init__(self, tb, workdir: str, interval: float = 0.005, watch: bool = True) -> None:
        self.path = os.path.join(workdir, "counters.txt")
        self.keys: List[Tuple] = []
        files = []
        for i in range(tb.hosts):
            for r in range(tb.rails):
                for direction, stat in (("tx", "rx_bytes"), ("rx", "tx_bytes")):
                    self.keys.append((i, r, direction))
                    files.append(f"/sys/class/net/{tb.root_veth(i, r)}/statistics/{stat}")
        watches = [a for i in range(tb.hosts) for a in ("--watch", tb.netns(i))] if watch else []
        self.proc = subprocess.Popen([sys.executable, "-m", "linkescape.bench.failover_worker", "sample",
                                      "--out", self.path, "--interval", str(interval), *watches, *files],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # after its netlink sockets are subscribed
        if "ready" not in line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"the counter sampler did not start: {line!r} {err}")

    def kernel_events(self) -> List[dict]:
        """Carrier and nftables changes inside the hosts, time stamped on arrival."""
        out = []
        try:
            with open(self.path + ".nl") as fh:
                for line in fh:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
        except FileNotFoundError:
            pass
        return out

    def stop(self) -> Counters:
        self.close()
        return Counters.load(self.path, self.keys)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ------------------------------------------------------------------ ranks
class EventTail:
    """Reads new lines of one rank's events file as they are appended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.partial = b""
        self.events: List[dict] = []

    def poll(self) -> List[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        new = []
        for line in lines:
            try:
                new.append(json.loads(line))
            except ValueError:
                continue
        self.events.extend(new)
        return new


class RankJob:
    """One failover_worker rank per testbed host; follows their JSON lines."""

    def __init__(self, tb, *, size: int, depth: int, rails: Optional[str] = None, env: Optional[Dict] = None,
                 duration: float = 3600.0, hosts: Optional[Sequence[int]] = None) -> None:
        self.tb = tb
        self.hosts = list(hosts) if hosts is not None else list(range(tb.hosts))
        self.world = len(self.hosts)
        self.dir = tempfile.mkdtemp(prefix="linkescape-fo-")
        os.chmod(self.dir, 0o777)
        self.stop_file = os.path.join(self.dir, "stop")
        self.events_tmpl = os.path.join(self.dir, "events-{rank}.jsonl")
        self.tails = [EventTail(self.events_tmpl.replace("{rank}", str(r))) for r in range(self.world)]
        self.records: List[List[dict]] = [[] for _ in range(self.world)]
        self.stderr: List[List[str]] = [[] for _ in range(self.world)]
        self.lines: "queue.Queue[dict]" = queue.Queue()
        self.procs: List[subprocess.Popen] = []
        self.count = max(1, size // 4)
        self.nbytes = self.count * 4
        self.threads: List[threading.Thread] = []
        rails = rails or ",".join(tb.rail_nics)
        self.rails = rails
        for rank, host in enumerate(self.hosts):
            e = dict(os.environ)
            e.update({"LINKESCAPE_RAILS": rails, "LINKESCAPE_EVENTS": self.events_tmpl, "PYTHONUNBUFFERED": "1",
                      "LINKESCAPE_TIMEOUT": "60"})
            e.update(env or {})
            argv = [sys.executable, "-m", "linkescape.bench.failover_worker", "rank", "--rank", str(rank),
                    "--world", str(self.world), "--store", os.path.join(self.dir, "store"), "--count",
                    str(self.count), "--depth", str(depth), "--duration", str(duration),
                    "--stop-file", self.stop_file]
            proc = tb.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
            self.procs.append(proc)
            for target in (self._pump, self._pump_err):
                th = threading.Thread(target=target, args=(rank, proc), daemon=True)
                th.start()
                self.threads.append(th)

    def _pump(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            rec["rank"] = rank
            self.records[rank].append(rec)
            self.lines.put(rec)

    def _pump_err(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stderr:
            self.stderr[rank].append(line)
            del self.stderr[rank][:-200]

    def dones(self, rank: int) -> List[dict]:
        return [r for r in list(self.records[rank]) if r.get("event") == "done"]

    def wait(self, pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.02) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout:.0f}s; stderr tails: "
                                   f"{[''.join(s[-5:]) for s in self.stderr]}")
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a rank exited while waiting for {what}; stderr tails: "
                                   f"{[''.join(s[-20:]) for s in self.stderr]}")
            time.sleep(poll)

    def wait_ready(self, iters: int = 2, timeout: float = 120.0) -> None:
        self.wait(lambda: all(len(self.dones(r)) >= iters for r in range(self.world)), timeout,
                  f"{iters} all_reduces on every rank")

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.procs)

    def poll_events(self) -> None:
        for tail in self.tails:
            tail.poll()

    def events(self, rank: int) -> List[dict]:
        self.tails[rank].poll()
        return self.tails[rank].events

    def finish(self, timeout: float = 120.0) -> List[dict]:
        """Ask every rank to stop (together), wait for ``exit`` records; a rank
        that does not exit in time is reported hung and killed."""
        with open(self.stop_file, "w"):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(any(r.get("event") == "exit" for r in self.records[k]) for k in range(self.world)):
                break
            if all(p.poll() is not None for p in self.procs):
                time.sleep(0.2)  # let the pumps drain
                break
            time.sleep(0.05)
        exits = []
        for rank, proc in enumerate(self.procs):
            ex = next((r for r in self.records[rank] if r.get("event") == "exit"), None)
            if ex is None:
                hung = proc.poll() is None
                if hung:
                    proc.send_signal(signal.SIGUSR1)  # Python stacks of every thread, on stderr
                ex = {"event": "exit", "rank": rank, "hung": hung, "wrong": None, "iters": len(self.dones(rank)),
                      "error": "hung" if hung else f"died (exit {proc.returncode})"}
            exits.append(ex)
        if any(e.get("hung") for e in exits):
            time.sleep(1.0)
        for ex in exits:
            if ex.get("error"):
                ex["stderr"] = "".join(self.stderr[ex["rank"]][-40:])
        self.poll_events()
        return exits

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- settings
@dataclass
class Settings:
    faults: Tuple[str, ...] = FAULT_KINDS
    count: int = 20
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    size: int = 16 << 20
    depth: int = 3
    fault_rail: int = 0
    baseline_s: float = 1.0          #: steady traffic on the primary before each fault
    hold_s: float = 1.0              #: a fault lasts at least this long ...
    after_detect_s: float = 0.5      #: ... and this long after the last rank detected it
    detect_timeout_s: float = 5.0
    failback_timeout_s: float = 8.0
    window_ms: float = 20.0
    sample_ms: float = 5.0
    overhead_repeats: int = 3
    overhead_seconds: float = 6.0
    mptcp: bool = True
    mptcp_trials: int = 5
    mptcp_congestions: Tuple[Optional[str], ...] = (None,)
    congestion: Optional[str] = None  #: TCP congestion control of the main runs (None: the namespaces' default)
    env: Dict[str, str] = field(default_factory=dict)

    @property
    def window(self) -> float:
        return self.window_ms / 1000.0


def _cc_env(cc: Optional[str]) -> Dict[str, str]:
    return {"LINKESCAPE_TCP_CONGESTION": cc} if cc else {}


def namespace_congestion(tb, host: int = 0) -> str:
    proc = tb.exec(host, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def _apply_fault(tb, kind: str, host: int, rail: int) -> float:
    """Make one fault through the shared testbed injector (:mod:`linkescape.faults`)."""
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; expected one of {FAULT_KINDS}")
    from ..faults import TestbedInjector

    return TestbedInjector(tb).apply(kind, host, rail)


def _repair_fault(tb, kind: str, host: int, rail: int) -> float:
    from ..faults import TestbedInjector

    return TestbedInjector(tb).repair(kind, host, rail)


# ------------------------------------------------------------- fault series
def _first(events: Sequence[dict], event: str, t0: float, t1: float, peer: Optional[int] = None) -> Optional[dict]:
    for e in events:
        if e.get("event") == event and t0 <= e["ts"] < t1 and (peer is None or e.get("peer") == peer):
            return e
    return None


def run_fault_series(tb, kind: str, st: Settings, log: Log, count: Optional[int] = None,
                     hosts: Optional[Sequence[int]] = None, env: Optional[Dict[str, str]] = None) -> dict:
    """``count`` faults of ``kind`` on the primary rail of host ``i % hosts``,
    under a saturating all_reduce; returns the raw per-fault timeline and the
    job's exits, events and counters (see :func:`analyze_series`)."""
    count = st.count if count is None else count
    job = RankJob(tb, size=st.size, depth=st.depth, env={**st.env, **(env or {})}, hosts=hosts)
    world = job.world
    sampler: Optional[Sampler] = None
    faults: List[dict] = []
    counters = None
    kernel: List[dict] = []
    exits: List[dict] = []
    try:
        sampler = Sampler(tb, job.dir, st.sample_ms / 1000.0)
        job.wait_ready()
        time.sleep(st.baseline_s)
        for i in range(count):
            if not job.alive():
                log(f"  {kind}: a rank exited; stopping the series after {i} faults")
                break
            rank = i % world
            host = job.hosts[rank]
            t_cmd = time.time()
            t_fault = _apply_fault(tb, kind, host, st.fault_rail)
            rec = {"kind": kind, "index": i, "host": host, "rank": rank, "rail": st.fault_rail,
                   "t_cmd": t_cmd, "t_fault": t_fault}
            # Hold: until every pair that involves the faulty rank failed over (or timeout),
            # at least hold_s, and after_detect_s after the last detection.
            others = [p for p in range(world) if p != rank]
            deadline = t_fault + st.detect_timeout_s
            last_det = None
            while time.time() < deadline:
                job.poll_events()
                loc = [_first(job.tails[rank].events, "failover", t_cmd, 1e18, peer=p) for p in others]
                rem = [_first(job.tails[p].events, "failover", t_cmd, 1e18, peer=rank) for p in others]
                if all(loc) and all(rem):
                    last_det = max(e["ts"] for e in loc + rem)
                    break
                time.sleep(0.02)
            until = max(t_fault + st.hold_s, (last_det or time.time()) + st.after_detect_s)
            time.sleep(max(0.0, until - time.time()))
            rec["t_restore_cmd"] = time.time()
            rec["t_restore"] = _repair_fault(tb, kind, host, st.fault_rail)
            # Failback: every pair that failed over is back on the primary.
            deadline = rec["t_restore"] + st.failback_timeout_s
            while time.time() < deadline:
                job.poll_events()
                loc = [_first(job.tails[rank].events, "failback", rec["t_restore_cmd"], 1e18, peer=p) for p in others]
                rem = [_first(job.tails[p].events, "failback", rec["t_restore_cmd"], 1e18, peer=rank) for p in others]
                if all(loc) and all(rem):
                    break
                time.sleep(0.02)
            faults.append(rec)
            # Settle on the primary before the next fault (also the failback's throughput window).
            time.sleep(st.baseline_s)
            det = _first(job.tails[rank].events, "failover", t_cmd, 1e18)
            fb = _first(job.tails[rank].events, "failback", rec["t_restore_cmd"], 1e18)
            det_txt = "-" if det is None else "%.1f ms" % ((det["ts"] - t_fault) * 1e3)
            fb_txt = "-" if fb is None else "%.0f ms" % ((fb["ts"] - rec["t_restore"]) * 1e3)
            log(f"  {kind} {i + 1}/{count} host {host}: local failover {det_txt}, failback {fb_txt}")
        rec_end = time.time()
        exits = job.finish()
        if sampler is not None:
            counters = sampler.stop()
            kernel = sampler.kernel_events()
        events = {r: list(job.events(r)) for r in range(world)}
        dones = {r: job.dones(r) for r in range(world)}
    finally:
        if sampler is not None:
            sampler.close()
        job.close()
    return {"kind": kind, "faults": faults, "exits": exits, "events": events, "dones": dones,
            "counters": counters, "kernel_events": kernel, "world": world, "hosts": job.hosts,
            "netns": [tb.netns(h) for h in job.hosts], "nic": tb.nic(st.fault_rail), "nbytes": job.nbytes,
            "t_end": rec_end}


def kernel_time(kernel: Sequence[dict], netns: str, nic: str, kind: str, down: bool, t0: float,
                t1: float) -> Optional[float]:
    """When the sampler heard the kernel apply a fault (``down``) or its repair, within ``[t0, t1]``:
    carrier loss/return of ``nic`` for a cut, the drop table's chains appearing/going for a blackhole."""
    table = f"le_bh_{nic}"
    for e in kernel:
        if e.get("netns") != netns or not (t0 <= e["t"] <= t1):
            continue
        if kind == "cut" and e["what"] == "carrier" and e["name"] == nic and e["up"] is (not down):
            return e["t"]
        if kind == "blackhole" and e["name"] == table and e["what"] == ("newchain" if down else "delchain"):
            return e["t"]
    return None


def find_stalls(ctr: Optional[Counters], hosts: Sequence[int], rail_bps: float, t0: float, t1: float,
                step: float = 0.05, min_s: float = 0.2) -> List[Tuple[float, float]]:
    """Intervals of at least ``min_s`` in ``[t0, t1]`` in which no host sent anything
    (< 1 % of one rail's rate on all rails together): the whole job stood still."""
    if ctr is None or not len(ctr.t):
        return []
    rails = sorted({k[1] for k in ctr.cols})
    tot = np.zeros_like(ctr.t)
    for h in hosts:
        tot = tot + ctr.series(h, rails, "tx")
    starts = np.arange(max(t0, ctr.t[0]), min(t1, ctr.t[-1]) - step, step)
    if not len(starts):
        return []
    idle = ctr.rates(tot, starts, step) < 0.01 * rail_bps
    out = []
    i = 0
    while i < len(starts):
        if idle[i]:
            j = i
            while j + 1 < len(starts) and idle[j + 1]:
                j += 1
            a, b = float(starts[i]), float(starts[j] + step)
            if b - a >= min_s:
                out.append((a, b))
            i = j + 1
        else:
            i += 1
    return out


def analyze_series(raw: dict, st: Settings) -> dict:
    """Per-fault detection, throughput and failback numbers, and their summaries."""
    kind, world, faults = raw["kind"], raw["world"], raw["faults"]
    events: Dict[int, List[dict]] = raw["events"]
    ctr: Optional[Counters] = raw["counters"]
    kernel = raw.get("kernel_events") or []
    hosts = raw["hosts"]
    rail_bps = parse_rate(st.rate)
    w = st.window
    frail = st.fault_rail
    per_fault = []
    explained = set()  # (rank, index in events[rank]) of link events some fault explains
    for k, f in enumerate(faults):
        rank, host = f["rank"], f["host"]
        t_cmd, t_fault = f["t_cmd"], f["t_fault"]
        t_rcmd, t_restore = f["t_restore_cmd"], f["t_restore"]
        t_next = faults[k + 1]["t_cmd"] if k + 1 < len(faults) else raw["t_end"]
        netns = raw["netns"][rank] if raw.get("netns") else None
        t_k = kernel_time(kernel, netns, raw.get("nic", "r0"), kind, True, t_cmd, t_fault + 0.5) if netns else None
        t_kr = kernel_time(kernel, netns, raw.get("nic", "r0"), kind, False, t_rcmd, t_restore + 0.5) \
            if netns else None
        # Both the command's return and the sampler's receipt of the kernel event come
        # after the fault took effect: the earlier of the two is the tighter bound.
        t_eff = min(t_fault, t_k) if t_k is not None else t_fault
        others = [p for p in range(world) if p != rank]
        out: Dict[str, Any] = {"index": f["index"], "host": host, "rank": rank, "kind": kind,
                               "t_fault": t_fault, "cmd_ms": (t_fault - t_cmd) * 1e3,
                               "kernel_minus_ts_ms": None if t_k is None else (t_k - t_fault) * 1e3,
                               "restore_cmd_ms": (t_restore - t_rcmd) * 1e3}
        loc = [_first(events[rank], "failover", t_cmd, t_rcmd, peer=p) for p in others]
        loc_t = [e["ts"] for e in loc if e]
        t_det = min(loc_t) if loc_t else None
        out["local_ms"] = _ms(t_det - t_fault) if loc_t else None
        out["local_kernel_ms"] = _ms(t_det - t_eff) if loc_t else None
        out["local_cmd_ms"] = _ms(t_det - t_cmd) if loc_t else None
        out["local_all_ms"] = _ms(max(loc_t) - t_fault) if len(loc_t) == len(others) else None
        peer_ms, peer_k = {}, {}
        for p in others:
            e = _first(events[p], "failover", t_cmd, t_rcmd, peer=rank)
            peer_ms[p] = _ms(e["ts"] - t_fault) if e else None
            peer_k[p] = _ms(e["ts"] - t_eff) if e else None
        out["peer_ms"] = peer_ms
        out["peer_kernel_ms"] = peer_k
        vals = list(peer_ms.values())
        out["peer_all_ms"] = max(vals) if vals and all(v is not None for v in vals) else None
        out["peer_minus_local_ms"] = {p: (v - out["local_ms"]) for p, v in peer_ms.items()
                                      if v is not None and out["local_ms"] is not None}
        causes: Dict[str, Dict[str, int]] = {}
        churn: List[dict] = []
        for r in range(world):
            for j, e in enumerate(events[r]):
                ev, ts = e.get("event"), e["ts"]
                if not (t_cmd - 0.001 <= ts < t_next) or not (r == rank or e.get("peer") == rank):
                    continue
                if ev == "link_down" and e.get("rail") == frail and ts < t_rcmd + 0.05:
                    side = "local" if r == rank else "peer"
                    causes.setdefault(side, {}).setdefault(e.get("cause"), 0)
                    causes[side][e.get("cause")] += 1
                    explained.add((r, j))
                elif ev == "failover" and e.get("from_rail") == frail and ts < t_rcmd + 0.05:
                    explained.add((r, j))
                elif ev in ("link_up", "failback") and ts >= t_rcmd - 0.001:
                    explained.add((r, j))
                elif ev in ("link_down", "failover") and ts >= t_rcmd - 0.001 and (
                        e.get("rail") == frail or e.get("from_rail") == frail):
                    # The repaired rail's links went down again after the restore (a
                    # replaced or half-open connection, a trip during the hold-down):
                    # part of this fault's recovery, not a false trip; it delays failback.
                    churn.append({k: e.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause", "detail")})
                    explained.add((r, j))
        out["causes"] = causes
        out["restore_churn"] = churn
        t_reff = min(t_restore, t_kr) if t_kr is not None else t_restore
        fbl = [_first(events[rank], "failback", t_rcmd, t_next, peer=p) for p in others]
        fbl_t = [e["ts"] for e in fbl if e]
        out["failback_local_ms"] = _ms(min(fbl_t) - t_restore) if fbl_t else None
        fbp = {}
        for p in others:
            e = _first(events[p], "failback", t_rcmd, t_next, peer=rank)
            fbp[p] = _ms(e["ts"] - t_restore) if e else None
        out["failback_peer_ms"] = fbp
        allfb = fbl_t + [v / 1e3 + t_restore for v in fbp.values() if v is not None]
        out["failback_all_ms"] = _ms(max(allfb) - t_restore) if len(allfb) == 2 * len(others) else None
        ups = [e["ts"] for e in events[rank] if e.get("event") == "link_up" and t_rcmd <= e["ts"] < t_next]
        out["link_up_ms"] = _ms(min(ups) - t_restore) if ups else None
        out["restore_kernel_minus_ts_ms"] = None if t_kr is None else (t_kr - t_restore) * 1e3
        # Throughput of the faulty host (its egress on every rail).
        out["ref_gbps"] = None
        if ctr is not None and ctr.covers(t_cmd - st.baseline_s, t_next):
            rails = sorted({key[1] for key in ctr.cols})
            tot = ctr.series(host, rails, "tx")
            prim = ctr.series(host, [frail], "tx")
            b0, b1 = t_cmd - st.baseline_s + 0.1, t_cmd - w - 0.002
            bstarts = ctr.starts(b0, b1)
            brates = ctr.rates(tot, bstarts, w) if len(bstarts) else np.array([])
            if len(brates):
                busy = float(np.percentile(brates, 90))
                mean = float(ctr.rates(tot, np.array([b0]), b1 + w - b0)[0])
                out["baseline_gbps"] = mean / 1e9
                out["baseline_busy_gbps"] = busy / 1e9
                out["baseline_primary_share"] = float(
                    ctr.rates(prim, np.array([b0]), b1 + w - b0)[0] / mean) if mean > 0 else None
            if len(brates) and busy >= 0.25 * rail_bps:
                ref = min(rail_bps, busy)
                out["ref_gbps"] = ref / 1e9
                t90 = ctr.first_at_or_above(tot, t_eff, t_rcmd - w, 0.9 * ref, w)
                t50 = ctr.first_at_or_above(tot, t_eff, t_rcmd - w, 0.5 * ref, w)
                out["restore90_from_fault_ms"] = _ms(t90 - t_eff) if t90 is not None else None
                out["restore50_from_fault_ms"] = _ms(t50 - t_eff) if t50 is not None else None
                out["restore90_after_detect_ms"] = (_ms(t90 - t_det) if t90 is not None and t_det is not None
                                                    else None)
                t_last = (t_fault + out["peer_all_ms"] / 1e3 if out["peer_all_ms"] is not None else None)
                if t_last is not None and t_det is not None:
                    t_last = max(t_last, t_det)
                out["restore90_after_last_detect_ms"] = (_ms(t90 - t_last) if t90 is not None and t_last is not None
                                                         else None)
                # Outage in equivalent milliseconds at the pre-fault mean rate, first LOST_SPAN_S.
                span = min(LOST_SPAN_S, t_rcmd - t_eff)
                got = (np.interp(t_eff + span, ctr.t, tot) - np.interp(t_eff, ctr.t, tot)) * 8.0
                out["lost_ms"] = max(0.0, span - got / mean) * 1e3 if mean > 0 else None
                fb90 = ctr.first_at_or_above(prim, t_reff, t_next - w, 0.9 * ref, w)
                out["failback_tput_ms"] = _ms(fb90 - t_restore) if fb90 is not None else None
            else:
                out["no_baseline"] = True  # the job was (nearly) idle before this fault: see stalls
        per_fault.append(out)

    def col(name):
        return [f.get(name) for f in per_fault if not f.get("no_baseline") or not name.startswith(
            ("restore", "lost", "failback_tput"))]

    def flat(name):
        return [v for f in per_fault for v in f[name].values()]

    unexplained = []
    for r in range(world):
        for j, e in enumerate(events[r]):
            if (r, j) not in explained and e.get("event") in ("link_down", "failover", "no_path", "peer_lost"):
                unexplained.append({k: e.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause", "detail")})
    t_first = faults[0]["t_cmd"] - st.baseline_s if faults else raw["t_end"]
    stalls = []
    for a, b in find_stalls(ctr, hosts, rail_bps, t_first, raw["t_end"]):
        after = [f for f in faults if f["t_cmd"] <= a]
        where = "before the first fault"
        if after:
            f = after[-1]
            where = (f"during fault {f['index']} (host {f['host']})" if a < f["t_restore_cmd"]
                     else f"{(a - f['t_restore']) * 1e3:.0f} ms after restoring fault {f['index']} (host {f['host']})")
        stalls.append({"start": a, "end": b, "seconds": b - a, "where": where})
    exits = raw["exits"]
    wrong = sum(int(e.get("wrong") or 0) for e in exits)
    wrong_iters = sum(1 for r in raw["dones"].values() for d in r if d.get("wrong"))
    iters = {r: len(d) for r, d in raw["dones"].items()}
    summary = {
        "detect_local_ms": summarize(col("local_ms")),
        "detect_local_kernel_ms": summarize(col("local_kernel_ms")),
        "detect_local_from_cmd_ms": summarize(col("local_cmd_ms")),
        "detect_local_all_peers_ms": summarize(col("local_all_ms")),
        "detect_peer_ms": summarize(flat("peer_ms")),
        "detect_peer_kernel_ms": summarize(flat("peer_kernel_ms")),
        "detect_peer_all_ms": summarize(col("peer_all_ms")),
        "peer_minus_local_ms": summarize(flat("peer_minus_local_ms")),
        "restore90_after_detect_ms": summarize(col("restore90_after_detect_ms")),
        "restore90_after_last_detect_ms": summarize(col("restore90_after_last_detect_ms")),
        "restore90_from_fault_ms": summarize(col("restore90_from_fault_ms")),
        "restore50_from_fault_ms": summarize(col("restore50_from_fault_ms")),
        "lost_ms": summarize(col("lost_ms")),
        "failback_local_ms": summarize(col("failback_local_ms")),
        "failback_peer_ms": summarize(flat("failback_peer_ms")),
        "failback_all_ms": summarize(col("failback_all_ms")),
        "failback_tput_ms": summarize(col("failback_tput_ms")),
        "link_up_ms": summarize(col("link_up_ms")),
        "cmd_ms": summarize(col("cmd_ms")),
        "kernel_minus_ts_ms": summarize(col("kernel_minus_ts_ms")),
        "baseline_gbps": summarize(col("baseline_gbps")),
        "ref_gbps": summarize(col("ref_gbps")),
    }
    return {"kind": kind, "faults": len(per_fault), "per_fault": per_fault, "summary": summary,
            "no_baseline": sum(1 for f in per_fault if f.get("no_baseline")),
            "stalls": stalls, "stall_seconds": sum(x["seconds"] for x in stalls),
            "wrong": wrong, "wrong_iters": wrong_iters,
            "errors": [e for e in exits if e.get("error")], "hangs": sum(1 for e in exits if e.get("hung")),
            "iters": iters, "unexplained_events": unexplained, "nbytes": raw["nbytes"], "world": world,
            "restore_churn": [c for f in per_fault for c in f["restore_churn"]]}


# ------------------------------------------------------------------ overhead
def busbw_from_dones(dones: Sequence[dict], nbytes: int, world: int, skip_s: float = 1.0) -> Optional[float]:
    """Bus bandwidth (bits/s) of an all_reduce from one rank's completion times,
    skipping the first ``skip_s`` seconds."""
    ts = sorted(d["t"] for d in dones)
    if len(ts) < 3:
        return None
    ts = [t for t in ts if t >= ts[0] + skip_s] or ts
    if len(ts) < 3:
        return None
    per_iter = (ts[-1] - ts[0]) / (len(ts) - 1)
    return 2.0 * (world - 1) / world * nbytes * 8.0 / per_iter


def run_overhead(tb, st: Settings, log: Log, env: Optional[Dict[str, str]] = None) -> dict:
    """Healthy busbw with every rail (backup links, heartbeats, carrier watch)
    vs one rail, in alternating runs."""
    runs = []
    for k in range(st.overhead_repeats):
        order = ("backup", "single") if k % 2 == 0 else ("single", "backup")
        for variant in order:
            rails = ",".join(tb.rail_nics) if variant == "backup" else tb.nic(0)
            job = RankJob(tb, size=st.size, depth=st.depth, rails=rails, env={**st.env, **(env or {})},
                          duration=st.overhead_seconds + 1.0)
            try:
                job.wait_ready(iters=1)
                time.sleep(st.overhead_seconds)
                exits = job.finish()
                bw = busbw_from_dones(job.dones(0), job.nbytes, job.world)
            finally:
                job.close()
            wrong = sum(int(e.get("wrong") or 0) for e in exits)
            runs.append({"repeat": k, "variant": variant, "rails": rails, "busbw_gbps": None if bw is None else bw / 1e9,
                         "wrong": wrong, "errors": [e.get("error") for e in exits if e.get("error")],
                         "hangs": sum(1 for e in exits if e.get("hung"))})
            log(f"  overhead {k + 1}/{st.overhead_repeats} {variant:6s} rails={rails}: busbw "
                f"{'-' if bw is None else f'{bw / 1e9:.3f} Gbit/s'}")
    b = [r["busbw_gbps"] for r in runs if r["variant"] == "backup" and r["busbw_gbps"]]
    s = [r["busbw_gbps"] for r in runs if r["variant"] == "single" and r["busbw_gbps"]]
    ratios = []
    for k in range(st.overhead_repeats):
        pair = {r["variant"]: r["busbw_gbps"] for r in runs if r["repeat"] == k}
        if pair.get("backup") and pair.get("single"):
            ratios.append(pair["backup"] / pair["single"])
    out = {"runs": runs, "backup_gbps": summarize(b), "single_gbps": summarize(s),
           "pair_ratio": summarize(ratios)}
    if b and s:
        out["overhead_pct"] = (1.0 - float(np.median(b)) / float(np.median(s))) * 100.0
        out["overhead_pct_pairs"] = (1.0 - float(np.median(ratios))) * 100.0 if ratios else None
    out["wrong"] = sum(r["wrong"] for r in runs)
    out["hangs"] = sum(r["hangs"] for r in runs)
    out["errors"] = [e for r in runs for e in r["errors"]]
    return out


# --------------------------------------------------------------------- MPTCP
def run_mptcp_series(tb, st: Settings, cc: Optional[str], log: Log, trials: int) -> dict:
    """A plain MPTCP bulk transfer host 1 -> host 0; cut host 1's primary rail
    ``trials`` times (a new connection each time)."""
    from .mptcp import setup_mptcp

    setup = setup_mptcp(tb, server=0, client=1, backup_rail=1)
    workdir = tempfile.mkdtemp(prefix="linkescape-mptcp-")
    port = 5201
    w = st.window
    rail_bps = parse_rate(st.rate)
    sampler = Sampler(tb, workdir, st.sample_ms / 1000.0)
    cc_args = ["--cc", cc] if cc else []
    server = tb.popen(0, [sys.executable, "-m", "linkescape.bench.mptcp", "server", "--port", str(port), *cc_args],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    trials_out = []
    try:
        line = server.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"MPTCP server did not start: {line!r} {server.stderr.read() if server.poll() else ''}")
        for k in range(trials):
            stop = os.path.join(workdir, f"stop{k}")
            client = tb.popen(1, [sys.executable, "-m", "linkescape.bench.mptcp", "client", "--connect",
                                  f"{tb.host_addr(0, 0)}:{port}", "--duration", "30", "--stop-file", stop, *cc_args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                first = client.stdout.readline().strip()
                time.sleep(st.baseline_s + 1.0)  # slow start over, backup subflows joined
                t_cmd = time.time()
                t_fault = _apply_fault(tb, "cut", 1, 0)
                time.sleep(3.0)
                t_rcmd = time.time()
                t_restore = _repair_fault(tb, "cut", 1, 0)
                time.sleep(0.3)
            finally:
                with open(stop, "w"):
                    pass
                try:
                    out, err = client.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    client.kill()
                    out, err = client.communicate()
            trials_out.append({"t_cmd": t_cmd, "t_fault": t_fault, "t_restore_cmd": t_rcmd, "t_restore": t_restore,
                               "client": first, "client_rc": client.returncode, "client_err": err[-500:]})
            time.sleep(0.5)
        counters = sampler.stop()
        kernel = sampler.kernel_events()
    finally:
        sampler.close()
        server.kill()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    per = []
    for tr in trials_out:
        t_rcmd = tr["t_restore_cmd"]
        t_k = kernel_time(kernel, tb.netns(1), tb.nic(0), "cut", True, tr["t_cmd"], tr["t_fault"] + 0.5)
        t_fault = min(tr["t_fault"], t_k) if t_k is not None else tr["t_fault"]
        tot = counters.series(1, list(range(tb.rails)), "tx")
        bup = counters.series(1, [1], "tx")
        b0, b1 = t_fault - st.baseline_s, t_fault - w - 0.002
        mean = float(counters.rates(tot, np.array([b0]), b1 + w - b0)[0])
        ref = min(rail_bps, mean)
        t50 = counters.first_at_or_above(bup, t_fault, t_rcmd - w, 0.5 * ref, w)
        t90 = counters.first_at_or_above(bup, t_fault, t_rcmd - w, 0.9 * ref, w)
        after = counters.rates(tot, np.array([t_fault + 1.5]), 1.0)[0]
        span = min(LOST_SPAN_S, t_rcmd - t_fault)
        got = (np.interp(t_fault + span, counters.t, tot) - np.interp(t_fault, counters.t, tot)) * 8.0
        per.append({"baseline_gbps": mean / 1e9, "half_ms": _ms(t50 - t_fault) if t50 else None,
                    "restore90_from_fault_ms": _ms(t90 - t_fault) if t90 else None,
                    "rate_after_gbps": after / 1e9, "lost_ms": max(0.0, span - got / mean) * 1e3 if mean else None,
                    "client": tr["client"], "client_rc": tr["client_rc"],
                    "cmd_ms": (t_fault - tr["t_cmd"]) * 1e3})
        log(f"  mptcp cc={cc or 'default'}: baseline {mean / 1e9:.3f} Gbit/s, half rate back after "
            f"{'-' if t50 is None else f'{(t50 - t_fault) * 1e3:.0f} ms'}, 90% after "
            f"{'-' if t90 is None else f'{(t90 - t_fault) * 1e3:.0f} ms'}, rate 1.5-2.5 s after the cut "
            f"{after / 1e9:.3f} Gbit/s")
    return {"setup": setup["commands"], "trials": per,
            "summary": {"half_ms": summarize(p["half_ms"] for p in per),
                        "restore90_from_fault_ms": summarize(p["restore90_from_fault_ms"] for p in per),
                        "rate_after_gbps": summarize(p["rate_after_gbps"] for p in per),
                        "baseline_gbps": summarize(p["baseline_gbps"] for p in per),
                        "lost_ms": summarize(p["lost_ms"] for p in per)}}


def run_mptcp_comparison(st: Settings, log: Log) -> dict:
    """MPTCP and linkescape through the same cuts, on the same 2-host testbed, per congestion control."""
    from ..testbed.netns import temporary_testbed

    out = {}
    for cc in st.mptcp_congestions:
        with temporary_testbed(2, st.rails, rate=st.rate, prefix="fm") as tb:
            used = cc or namespace_congestion(tb)
            log(f"MPTCP vs linkescape, 2 hosts x {st.rails} rails at {st.rate}, congestion control {used}")
            mp = run_mptcp_series(tb, st, cc, log, st.mptcp_trials)
            raw = run_fault_series(tb, "cut", st, log, count=st.mptcp_trials, hosts=[0, 1], env=_cc_env(cc))
            # like MPTCP: cut the sender's... every host in turn is cut; report the same metric
            le = analyze_series(raw, st)
            out[used] = {"mptcp": mp, "linkescape": {
                "half_ms": le["summary"]["restore50_from_fault_ms"],
                "restore90_from_fault_ms": le["summary"]["restore90_from_fault_ms"],
                "lost_ms": le["summary"]["lost_ms"],
                "detect_local_ms": le["summary"]["detect_local_ms"],
                "wrong": le["wrong"], "hangs": le["hangs"], "errors": le["errors"],
                "per_fault": le["per_fault"]}}
    return out


# ---------------------------------------------------------------- the bench
def run_failover_bench(faults: Sequence[str] = FAULT_KINDS, count: int = 20, hosts: int = 4, rails: int = 2,
                       rate: str = "1gbit", size: int = 16 << 20, json_path: Optional[str] = None,
                       log: Optional[Log] = None, **options: Any) -> dict:
    """Run the failover benchmark; returns the result dict (also written to ``json_path``).

    ``options`` are other :class:`Settings` fields: ``depth``, ``overhead_repeats``,
    ``overhead_seconds`` (0 repeats: skip), ``mptcp`` (False: skip), ``mptcp_trials``,
    ``mptcp_congestions`` (e.g. ``(None, "cubic")``), ``congestion``, ``env``, ...
    """
    from ..testbed.netns import require_root, temporary_testbed

    require_root("the failover benchmark")
    log = log or (lambda s: print(s, flush=True))
    kinds = tuple(faults)
    for k in kinds:
        if k not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {k!r}; expected some of {FAULT_KINDS}")
    if "blackhole" in kinds:
        from ..testbed.netns import require_nft

        require_nft()
    if rails < 2:
        raise ValueError("the failover benchmark needs at least 2 rails")
    if hosts < 2:
        raise ValueError("the failover benchmark needs at least 2 hosts")
    st = Settings(faults=kinds, count=count, hosts=hosts, rails=rails, rate=rate, size=size, **options)
    t_start = time.time()
    result: Dict[str, Any] = {
        "bench": "failover", "settings": {k: v for k, v in st.__dict__.items()},
        "command": None, "host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
        "started": t_start, "targets": TARGETS, "series": {}, "overhead": None, "mptcp": None,
    }
    env = _cc_env(st.congestion)
    with temporary_testbed(hosts, rails, rate=rate, prefix="fo") as tb:
        result["congestion"] = st.congestion or namespace_congestion(tb)
        result["config"] = _library_defaults({**st.env, **env})
        log(f"failover bench: {hosts} hosts x {rails} rails at {rate}, all_reduce of {size} B x {st.depth} "
            f"in flight, {count} faults of each of {','.join(kinds)} on rail {st.fault_rail}, "
            f"congestion control {result['congestion']}")
        for kind in kinds:
            raw = run_fault_series(tb, kind, st, log, env=env)
            result["series"][kind] = analyze_series(raw, st)
        if st.overhead_repeats > 0:
            log("healthy busbw: every rail (backup links) vs rail 0 only, alternating")
            result["overhead"] = run_overhead(tb, st, log, env=env)
    if st.mptcp:
        result["mptcp"] = run_mptcp_comparison(st, log)
    result["duration_s"] = time.time() - t_start
    result["verdict"] = verdict(result)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return result


def _library_defaults(env: Dict[str, str]) -> Dict[str, Any]:
    from ..config import Config

    merged = dict(os.environ)
    merged.update(env)
    cfg = Config.from_env({k: v for k, v in merged.items() if k.startswith("LINKESCAPE_")
                           and k not in ("LINKESCAPE_RAILS", "LINKESCAPE_EVENTS")})
    return {"heartbeat_ms": cfg.heartbeat_interval * 1e3, "silent_timeout_ms": cfg.silent_timeout * 1e3,
            "failback_holddown_ms": cfg.failback_holddown * 1e3, "reconnect_max_ms": cfg.reconnect_max * 1e3,
            "policy": cfg.policy, "chunk_bytes": cfg.chunk_bytes, "tcp_congestion": cfg.tcp_congestion,
            "op_timeout_s": 60.0}


def verdict(result: dict) -> Dict[str, Any]:
    """Which targets were met (None: not measured)."""
    out: Dict[str, Any] = {}
    for kind, s in result.get("series", {}).items():
        t = TARGETS.get(kind, {})
        sm = s["summary"]
        loc, peer = sm["detect_local_ms"]["p99"], sm["detect_peer_ms"]["p99"]
        miss_l, miss_p = sm["detect_local_ms"]["missing"], sm["detect_peer_ms"]["missing"]
        out[f"{kind}_local_p99"] = None if loc is None else bool(loc <= t["local_p99"] and not miss_l)
        out[f"{kind}_peer_p99"] = None if peer is None else bool(peer <= t["peer_p99"] and not miss_p)
        r = sm["restore90_after_detect_ms"]
        out[f"{kind}_restore_p99"] = None if r["p99"] is None else bool(
            r["p99"] <= TARGETS["restore_after_detect"] and not r["missing"])
        out[f"{kind}_correct"] = s["wrong"] == 0 and s["hangs"] == 0 and not s["errors"]
        out[f"{kind}_no_false_trips"] = not s["unexplained_events"]
    ov = result.get("overhead")
    if ov and ov.get("overhead_pct_pairs") is not None:
        # paired (adjacent, alternating) runs cancel most of the machine's drift
        out["overhead"] = ov["overhead_pct_pairs"] <= TARGETS["overhead_pct"]
    return out


# ------------------------------------------------------------------ report
def _fmt(x: Optional[float], unit: str = "", nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}{unit}"


def format_report(result: dict) -> str:
    """The human-readable report of :func:`run_failover_bench`."""
    st = result["settings"]
    lines = [f"# linkescape failover benchmark: {st['hosts']} hosts x {st['rails']} rails at {st['rate']}, "
             f"all_reduce {st['size']} B x {st['depth']} in flight, congestion control {result.get('congestion')}",
             f"# kernel {result.get('kernel')}, {result.get('cpus')} CPUs, library settings {result.get('config')}",
             "# times in ms: median / p99 / max (n, missing)", ""]

    def row(name: str, s: dict, target: Optional[float] = None) -> str:
        miss = f", {s['missing']} missing" if s["missing"] else ""
        tgt = ""
        if target is not None and s["p99"] is not None:
            tgt = f"   target p99 <= {target:g}: {'met' if s['p99'] <= target and not s['missing'] else 'MISSED'}"
        return (f"  {name:44s} {_fmt(s['median']):>8} / {_fmt(s['p99']):>8} / {_fmt(s['max']):>8}"
                f"  (n={s['n']}{miss}){tgt}")

    for kind, s in result.get("series", {}).items():
        sm = s["summary"]
        t = TARGETS.get(kind, {})
        lines.append(f"## {kind}: {s['faults']} faults, reference rate {_fmt(sm['ref_gbps']['median'], ' Gbit/s', 3)} "
                     f"(pre-fault mean {_fmt(sm['baseline_gbps']['median'], ' Gbit/s', 3)})")
        lines.append(row("detection, local (fault ts -> failover)", sm["detect_local_ms"], t.get("local_p99")))
        lines.append(row("detection, peer side (per peer, from fault ts)", sm["detect_peer_ms"], t.get("peer_p99")))
        lines.append(row("detection, last peer (from fault ts)", sm["detect_peer_all_ms"]))
        lines.append(row("detection, local (from kernel event)", sm["detect_local_kernel_ms"], t.get("local_p99")))
        lines.append(row("detection, peer side (from kernel event)", sm["detect_peer_kernel_ms"], t.get("peer_p99")))
        lines.append(row("detection, peer side minus local", sm["peer_minus_local_ms"]))
        lines.append(row("throughput >= 90% after local detection", sm["restore90_after_detect_ms"],
                         TARGETS["restore_after_detect"]))
        lines.append(row("throughput >= 90% after the last rank detected", sm["restore90_after_last_detect_ms"]))
        lines.append(row("throughput >= 90% after the fault", sm["restore90_from_fault_ms"]))
        lines.append(row("throughput >= 50% after the fault", sm["restore50_from_fault_ms"]))
        lines.append(row("outage-equivalent (first 1 s)", sm["lost_ms"]))
        lines.append(row("restore -> link_up (local)", sm["link_up_ms"]))
        lines.append(row("restore -> failback (local)", sm["failback_local_ms"]))
        lines.append(row("restore -> failback (per peer)", sm["failback_peer_ms"]))
        lines.append(row("restore -> >= 90% on the primary rail", sm["failback_tput_ms"]))
        lines.append(row("fault command duration (ts - start)", sm["cmd_ms"]))
        lines.append(row("kernel event minus fault ts", sm["kernel_minus_ts_ms"]))
        causes: Dict[str, Dict[str, int]] = {}
        for f in s["per_fault"]:
            for side, cs in f["causes"].items():
                for c, n in cs.items():
                    causes.setdefault(side, {}).setdefault(c, 0)
                    causes[side][c] += n
        lines.append(f"  link_down causes: {causes}")
        lines.append(f"  wrong elements {s['wrong']}, errors {len(s['errors'])}, hangs {s['hangs']}, "
                     f"iterations {s['iters']}, unexplained link events (false trips) "
                     f"{len(s['unexplained_events'])}, repaired rail down again after restore "
                     f"{len(s.get('restore_churn', []))}")
        for e in s["unexplained_events"][:5]:
            lines.append(f"    unexplained: {e}")
        if s["stalls"] or s["no_baseline"]:
            lines.append(f"  STALLS (no host sent anything for >= 200 ms): {len(s['stalls'])}, "
                         f"{s['stall_seconds']:.1f} s in all; faults without a busy baseline: {s['no_baseline']}")
            for x in s["stalls"][:8]:
                lines.append(f"    stall {x['seconds'] * 1e3:.0f} ms, {x['where']}")
        for e in s["errors"][:3]:
            lines.append(f"    error: rank {e.get('rank')}: {e.get('error')}")
        lines.append("")
    ov = result.get("overhead")
    if ov:
        lines.append("## healthy busbw (Gbit/s), alternating runs")
        lines.append(f"  with backup rails: median {_fmt(ov['backup_gbps']['median'], '', 3)} "
                     f"(min {_fmt(ov['backup_gbps']['min'], '', 3)}, max {_fmt(ov['backup_gbps']['max'], '', 3)}, "
                     f"n={ov['backup_gbps']['n']})")
        lines.append(f"  rail 0 only:       median {_fmt(ov['single_gbps']['median'], '', 3)} "
                     f"(min {_fmt(ov['single_gbps']['min'], '', 3)}, max {_fmt(ov['single_gbps']['max'], '', 3)}, "
                     f"n={ov['single_gbps']['n']})")
        pct, pairs = ov.get("overhead_pct"), ov.get("overhead_pct_pairs")
        if pairs is not None:
            pr = ov["pair_ratio"]
            lines.append(f"  overhead {pairs:+.2f}% (median of the paired ratios backup/single; ratios "
                         f"{_fmt(pr['min'], '', 3)}..{_fmt(pr['max'], '', 3)}), {pct:+.2f}% (ratio of medians); "
                         f"target <= {TARGETS['overhead_pct']:g}%: "
                         f"{'met' if pairs <= TARGETS['overhead_pct'] else 'MISSED'}")
        lines.append(f"  wrong {ov['wrong']}, hangs {ov['hangs']}, errors {len(ov['errors'])}")
        lines.append("")
    mp = result.get("mptcp")
    if mp:
        for cc, m in mp.items():
            lines.append(f"## MPTCP vs linkescape, 2 hosts, cut of the primary rail, congestion control {cc}")
            ms, ls = m["mptcp"]["summary"], m["linkescape"]
            lines.append(row("MPTCP: half rate back on rail 1", ms["half_ms"]))
            lines.append(row("MPTCP: 90% rate back on rail 1", ms["restore90_from_fault_ms"]))
            lines.append(row("MPTCP: outage-equivalent (first 1 s)", ms["lost_ms"]))
            lines.append(f"  MPTCP: rate before {_fmt(ms['baseline_gbps']['median'], '', 3)}, 1.5-2.5 s after the "
                         f"cut {_fmt(ms['rate_after_gbps']['median'], '', 3)} Gbit/s (medians)")
            lines.append(row("linkescape: half rate back", ls["half_ms"]))
            lines.append(row("linkescape: 90% rate back", ls["restore90_from_fault_ms"]))
            lines.append(row("linkescape: outage-equivalent (first 1 s)", ls["lost_ms"]))
            lines.append(f"  linkescape: wrong {ls['wrong']}, hangs {ls['hangs']}, errors {len(ls['errors'])}")
            lines.append("")
    v = result.get("verdict", {})
    if v:
        lines.append("## targets: " + ", ".join(f"{k}={'met' if x else ('-' if x is None else 'MISSED')}"
                                                for k, x in v.items()))
    lines.append(f"# {result.get('duration_s', 0):.0f} s")
    return "\n".join(lines)


def ok(result: dict) -> bool:
    """No wrong result, no error, no hang anywhere in the run."""
    parts = list(result.get("series", {}).values())
    bad = sum(s["wrong"] + s["hangs"] + len(s["errors"]) for s in parts)
    ov = result.get("overhead")
    if ov:
        bad += ov["wrong"] + ov["hangs"] + len(ov["errors"])
    for m in (result.get("mptcp") or {}).values():
        le = m["linkescape"]
        bad += le["wrong"] + le["hangs"] + len(le["errors"])
    return bad == 0


# --------------------------------------------------------------------- CLI
def _click():
    import click

    return click


def add_failover_options(cmd):
    """Add the failover benchmark's options to a click command (``linkescape bench``).

    Adds ``--fault-count``, ``--hosts``, ``--rate``, ``--fault-size``, ``--fault-depth``,
    ``--overhead-repeats``, ``--overhead-seconds``, ``--mptcp/--no-mptcp``,
    ``--mptcp-trials``, ``--mptcp-cc``, ``--congestion``. The rail count comes from
    ``linkescape bench``'s own ``--rails`` (see :func:`rails_count`), and ``--faults``
    and ``--json`` are ``linkescape bench``'s. Pass the parameters on to
    :func:`run_failover_cli`.
    """
    click = _click()
    opts = [
        click.option("--fault-count", type=int, default=20, show_default=True,
                     help="failover bench: faults of each kind"),
        click.option("--hosts", type=int, default=4, show_default=True, help="failover bench: testbed hosts"),
        click.option("--rate", default="1gbit", show_default=True, help="failover bench: tc rate of every rail"),
        click.option("--fault-size", default="16M", show_default=True,
                     help="failover bench: bytes per all_reduce (K/M/G suffixes)"),
        click.option("--fault-depth", type=int, default=3, show_default=True,
                     help="failover bench: all_reduces kept in flight"),
        click.option("--overhead-repeats", type=int, default=3, show_default=True,
                     help="failover bench: alternating healthy runs with/without backup rails (0: skip)"),
        click.option("--overhead-seconds", type=float, default=6.0, show_default=True,
                     help="failover bench: seconds per healthy run"),
        click.option("--mptcp/--no-mptcp", default=True, show_default=True,
                     help="failover bench: compare with an MPTCP bulk transfer"),
        click.option("--mptcp-trials", type=int, default=5, show_default=True,
                     help="failover bench: cuts of the MPTCP (and linkescape) 2-host comparison"),
        click.option("--mptcp-cc", default="", help="failover bench: congestion controls of the MPTCP comparison, "
                                                    "e.g. bbr,cubic (default: the namespaces' default)"),
        click.option("--congestion", default="", help="failover bench: TCP congestion control of linkescape "
                                                      "(per socket; default: the namespaces' default)"),
    ]
    for opt in reversed(opts):
        cmd = opt(cmd)
    return cmd


def rails_count(rails: Any, default: int = 2) -> int:
    """``linkescape bench --rails``: a number is the testbed's rail count; anything else
    (the addresses of a normal bench) means the default."""
    try:
        return int(str(rails).strip())
    except (TypeError, ValueError):
        return default


def _size(text: str) -> int:
    from ..config import _size as parse_size

    return parse_size(str(text), "--fault-size")


def run_failover_cli(faults: str, rails: Any = 2, json_path: Optional[str] = None, *, fault_count: int = 20,
                     hosts: int = 4, rate: str = "1gbit", fault_size: Any = "16M", fault_depth: int = 3,
                     overhead_repeats: int = 3, overhead_seconds: float = 6.0, mptcp: bool = True,
                     mptcp_trials: int = 5, mptcp_cc: str = "", congestion: str = "", echo: Optional[Log] = None,
                     **_ignored: Any) -> dict:
    """What ``linkescape bench --faults KINDS ...`` does: run, print the report,
    fail (ClickException) on wrong results, errors or hangs."""
    click = _click()
    echo = echo or click.echo
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip())
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad or not kinds:
        raise click.BadParameter(f"{faults!r}: expected a comma list of {', '.join(FAULT_KINDS)}",
                                 param_hint="'--faults'")
    ccs = tuple(c.strip() for c in mptcp_cc.split(",") if c.strip()) or (None,)
    try:
        result = run_failover_bench(kinds, count=fault_count, hosts=hosts, rails=rails_count(rails), rate=rate,
                                    size=_size(fault_size), json_path=json_path, log=echo, depth=fault_depth,
                                    overhead_repeats=overhead_repeats, overhead_seconds=overhead_seconds,
                                    mptcp=mptcp, mptcp_trials=mptcp_trials, mptcp_congestions=ccs,
                                    congestion=congestion or None)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    except Exception as exc:  # TestbedError and friends
        if type(exc).__name__.endswith("Error"):
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
        raise
    result["command"] = " ".join(shlex.quote(a) for a in sys.argv)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    echo("")
    echo(format_report(result))
    if not ok(result):
        raise click.ClickException("wrong results, errors or hangs during the failover benchmark (see above)")
    return result


def _make_command():
    click = _click()

    @click.command("failover", context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--faults", default="cut,blackhole", show_default=True, help="fault kinds: cut, blackhole")
    @click.option("--rails", default="2", show_default=True, help="testbed rails")
    @click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
                  help="write the whole result (every fault) here")
    @add_failover_options
    def failover(faults: str, rails: str, json_path: Optional[str], **kw: Any) -> None:
        """Failover benchmark on a throwaway testbed (needs root): detection latency,
        time to full throughput, failback, overhead of the backup rails, MPTCP for comparison."""
        run_failover_cli(faults, rails, json_path, **kw)

    return failover


try:
    failover = _make_command()
except ImportError:  # pragma: no cover - click is a dependency
    failover = None


def main(argv: Optional[Sequence[str]] = None) -> None:
    failover.main(args=list(argv) if argv is not None else None, prog_name="linkescape-failover")


if __name__ == "__main__":
    main()


__all__ = ["run_failover_bench", "format_report", "add_failover_options", "run_failover_cli", "failover",
           "rails_count", "parse_rate", "summarize", "Counters", "busbw_from_dones", "verdict", "ok", "TARGETS"]
