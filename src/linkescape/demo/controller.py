"""The demo's controller: testbed (or loopback), training runs, faults, sampling.

One demo is two runs of the same training job (:mod:`linkescape.demo.train`):

* the *faulty* run, during which a cable is cut (host 1 rail 0), an optic
  blackholed (host 2 rail 0) and a link flapped (host 3 rail 0), each
  repaired before the next, while every host NIC's transmit counter is
  sampled every 50 ms and the ranks' event trails are tailed;
* the *reference* run, with no faults, to compare the per-step losses and
  the final parameters bit for bit.

On a testbed (root, network namespaces) the faults are real: veth carrier
loss, nftables drop tables. Without one, the ranks run on loopback rails and
the faults are emulated inside the processes (:mod:`linkescape.demo.emulated`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .. import faults as _faults
from ..events import expand_path
from .model import DEFAULT_SIZE

#: the faulty run lasts at least this long (the steps are paced otherwise), so
#: that three faults, each with its repair and failback, fit in it
MIN_FAULT_WINDOW = 16.0
SAMPLE_INTERVAL = 0.05
#: the demo's silent-loss timeout (the torch backend's default is 3 s)


@dataclass
class DemoOptions:
    out: str = "./linkescape-demo"
    steps: int = 200
    hosts: int = 4
    rails: int = 2
    rate: str = "1gbit"
    emulate: bool = False
    reference: bool = True
    quiet: bool = False
    model_size: str = DEFAULT_SIZE
    seed: int = 1234
    live: Optional[bool] = None  # None: a rich Live display when stdout is a terminal


class DemoError(RuntimeError):
    pass


class TestbedUnavailable(DemoError):
    """No testbed could be built here; the demo falls back to emulated faults."""

    __test__ = False


# ------------------------------------------------------------------ tailing files
class Tail:
    """New complete JSON lines of a file that another process appends to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pos = 0
        self.buf = b""

    def read(self) -> List[Dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        return out


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    return Tail(path).read()


# ------------------------------------------------------------------ fault plan
@dataclass
class Fault:
    """One fault of the demo and what became of it."""

    kind: str  # cut | blackhole | flap
    host: int
    rail: int
    start_at: float  # planned offset from training start, seconds
    hold: float  # seconds down (cut, blackhole); for flap the total flapping time
    period: float = 0.0  # flap only
    count: int = 0  # flap only
    issued: Optional[float] = None  # wall time the command was issued
    ts: Optional[float] = None  # wall time the fault was in effect
    restore_issued: Optional[float] = None
    restored: Optional[float] = None  # wall time the link was repaired (flap: the last up)
    transitions: List[Tuple[float, str]] = field(default_factory=list)  # (ts, "down"/"up")
    error: Optional[str] = None

    @property
    def label(self) -> str:
        what = {"cut": "cable cut", "blackhole": "optic blackholed", "flap": "link flapping"}[self.kind]
        return f"{what}: host {self.host} rail {self.rail}"

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "rail": self.rail, "label": self.label,
                "planned_offset_s": round(self.start_at, 3), "hold_s": round(self.hold, 3),
                "period_s": self.period or None, "count": self.count or None,
                "issued": self.issued, "ts": self.ts, "restore_issued": self.restore_issued,
                "restored": self.restored, "transitions": [[t, s] for t, s in self.transitions],
                "error": self.error}


def plan_faults(duration: float, hosts: int, rails: int) -> List[Fault]:
    """Three faults spread over a run of ``duration`` seconds, one after the other.

    Each is repaired with time left for its failback (hold-down 1 s) before
    the next begins: cut at 10 %, repaired at 25 %; blackhole at 37 %,
    repaired at 52 %; flapping from 64 % for three periods.
    """
    seg = duration / 10.0

    def host(k: int) -> int:
        return 1 + (k % (hosts - 1)) if hosts > 1 else 0

    period = max(0.6, min(1.2, seg * 0.5))
    return [
        Fault("cut", host(0), 0, 1.0 * seg, 1.5 * seg),
        Fault("blackhole", host(1), 0, 3.7 * seg, 1.5 * seg),
        Fault("flap", host(2), 0, 6.4 * seg, 3 * period, period=period, count=3),
    ]


# ------------------------------------------------------------------ fault injectors
# The shared fault schedule and injectors (linkescape.faults): real faults on
# the testbed, or Communicator.inject_fault inside the ranks (emulated).
Injector = _faults.Injector


def TestbedInjector(tb) -> _faults.Injector:  # noqa: N802 - kept as the demo's name for it
    return _faults.TestbedInjector(tb)


def EmulatedInjector(control_dir: str) -> _faults.Injector:  # noqa: N802
    from .emulated import FaultClient

    return _faults.EmulatedInjector(FaultClient(control_dir).apply)


def schedule_of(faults: Sequence[Fault], duration: float, hosts: int, rails: int) -> "_faults.Schedule":
    """The demo's plan as a shared fault schedule (offsets from training start)."""
    script = []
    for i, f in enumerate(faults):
        d = {"id": i, "kind": f.kind, "host": f.host, "rail": f.rail, "at": f.start_at, "hold": f.hold}
        if f.kind == "flap":
            d.update(period=f.period, hold=f.period * f.count, mode="cut")
        script.append(d)
    end = max([duration] + [f.start_at + (f.period * f.count if f.kind == "flap" else f.hold) for f in faults])
    return _faults.scripted(script, hosts=hosts, rails=rails, duration=end)


class FaultRunner(threading.Thread):
    """Plays the fault plan once training has started; always leaves every rail repaired."""

    def __init__(self, injector: Injector, state: "LiveState", hosts: int, rails: int,
                 min_duration: float, stop: threading.Event) -> None:
        super().__init__(name="demo-faults", daemon=True)
        self.injector = injector
        self.state = state
        self.hosts = hosts
        self.rails = rails
        self.min_duration = min_duration
        self.stop_ev = stop
        self.faults: List[Fault] = []
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the controller
            self.error = exc
            self.state.note(f"fault injection failed: {exc}", style="bold red")

    def _run(self) -> None:
        t0 = self.state.wait_training_start(self.stop_ev)
        if t0 is None:
            return
        duration = self.state.estimate_duration(self.min_duration, self.stop_ev)
        if duration is None:
            return
        self.faults = plan_faults(duration, self.hosts, self.rails)
        self.state.set_faults(self.faults, duration)
        runner = _faults.ScheduleRunner(schedule_of(self.faults, duration, self.hosts, self.rails), self.injector,
                                        on_step=self._on_step)
        runner.start(t0)
        try:
            while runner.running:
                if self.stop_ev.wait(0.05):
                    break
        finally:
            runner.stop()  # repairs whatever is still down
            for f in self.faults:
                self.state.set_rail(f.host, f.rail, "up")
        if runner.error is not None:
            raise runner.error

    def _on_step(self, rec: Dict[str, Any]) -> None:
        f = self.faults[rec["fault"]]
        ts = rec["ts"]
        issued = rec["planned"] + (rec.get("late") or 0.0) if rec.get("planned") else ts  # when the command began
        if rec["action"] == "apply":
            if f.issued is None:
                f.issued, f.ts = issued, ts
                if f.kind == "flap":
                    self.state.fault_line(ts, f"FLAP host {f.host} rail {f.rail} ({f.count} x {f.period:.2f}s)")
            f.transitions.append((ts, "down"))
            if f.kind == "flap":
                self.state.set_rail(f.host, f.rail, "FLAPPING (down)")
            else:
                self.state.set_rail(f.host, f.rail, "CUT" if f.kind == "cut" else "BLACKHOLED")
                self.state.fault_line(ts, f"{f.kind.upper()} host {f.host} rail {f.rail}")
            return
        f.restore_issued, f.restored = issued, ts
        f.transitions.append((ts, "up"))
        last = sum(1 for t in f.transitions if t[1] == "up") >= (f.count if f.kind == "flap" else 1)
        if f.kind == "flap":
            self.state.set_rail(f.host, f.rail, "up" if last else "FLAPPING (up)")
            if last:
                self.state.fault_line(ts, f"FLAP host {f.host} rail {f.rail} over, link up")
        else:
            self.state.set_rail(f.host, f.rail, "up")
            self.state.fault_line(ts, f"RESTORE host {f.host} rail {f.rail}")


# ------------------------------------------------------------------ NIC counters
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


# ------------------------------------------------------------------ live state
class LiveState:
    """What the display shows; fed by the tailers, the fault runner and the sampler."""

    def __init__(self, hosts: int, rails: int, steps: int, title: str, run_name: str) -> None:
        self.hosts = hosts
        self.rails = rails
        self.steps_total = steps
        self.title = title
        self.run_name = run_name
        self.lock = threading.RLock()
        self.t_start: Optional[float] = None
        self.steps: List[Dict[str, Any]] = []
        self.rail_state: Dict[Tuple[int, int], str] = {(h, r): "up" for h in range(hosts) for r in range(rails)}
        # (rank, peer) -> rail carrying the traffic (None: no path)
        self.active: Dict[Tuple[int, int], Optional[int]] = {(a, b): 0 for a in range(hosts) for b in range(hosts)
                                                              if a != b}
        self.events: List[Dict[str, Any]] = []
        self.lines: List[Tuple[float, str, str]] = []  # (ts, text, style) for the event pane / plain output
        self.faults: List[Fault] = []
        self.planned_duration: Optional[float] = None
        self.rates: Optional[List[List[float]]] = None  # Mbit/s per host and rail, once sampled
        self.listeners: List[Callable[[float, str, str], None]] = []
        self.finished = False

    # -- training progress
    def on_steps(self, records: List[Dict[str, Any]]) -> None:
        with self.lock:
            for r in records:
                if "start" in r:
                    self.t_start = float(r["start"])
                elif "step" in r:
                    self.steps.append(r)

    def wait_training_start(self, stop: threading.Event) -> Optional[float]:
        while not stop.is_set():
            with self.lock:
                if self.t_start is not None:
                    return self.t_start
            stop.wait(0.05)
        return None

    def estimate_duration(self, min_duration: float, stop: threading.Event) -> Optional[float]:
        """How long training will last: from the first steps (after warm-up), at least ``min_duration``."""
        deadline = time.time() + 4.0
        while not stop.is_set():
            with self.lock:
                dts = [s["dt"] for s in self.steps[1:4]]
                done = len(self.steps) >= min(4, self.steps_total) or time.time() > deadline
            if done:
                per = statistics.median(dts) if dts else 0.0
                return max(min_duration, per * self.steps_total)
            stop.wait(0.05)
        return None

    # -- faults and rails
    def set_faults(self, faults: List[Fault], duration: float) -> None:
        with self.lock:
            self.faults = faults
            self.planned_duration = duration

    def set_rail(self, host: int, rail: int, state: str) -> None:
        with self.lock:
            self.rail_state[(host, rail)] = state

    def fault_line(self, ts: float, text: str) -> None:
        repaired = text.startswith("RESTORE") or text.endswith("link up")
        self.note(text, ts=ts, style="bold green" if repaired else "bold red")

    def note(self, text: str, ts: Optional[float] = None, style: str = "") -> None:
        ts = time.time() if ts is None else ts
        with self.lock:
            self.lines.append((ts, text, style))
            listeners = list(self.listeners)
        for fn in listeners:
            fn(ts, text, style)

    # -- events
    def on_events(self, records: List[Dict[str, Any]]) -> None:
        for r in sorted(records, key=lambda r: r.get("ts", 0.0)):
            ev, rank, peer, rail = r.get("event"), r.get("rank"), r.get("peer"), r.get("rail")
            with self.lock:
                self.events.append(r)
                if ev in ("failover", "failback") and (rank, peer) in self.active:
                    self.active[(rank, peer)] = rail
                elif ev == "no_path" and (rank, peer) in self.active:
                    self.active[(rank, peer)] = None
            cause = f" cause={r['cause']}" if r.get("cause") else ""
            frm = f" from rail {r['from_rail']}" if r.get("from_rail") is not None else ""
            style = {"link_down": "yellow", "failover": "magenta", "link_up": "cyan", "failback": "green",
                     "no_path": "bold red", "peer_lost": "bold red"}.get(ev, "")
            self.note(f"rank {rank}: {ev:<9} peer {peer} rail {rail}{frm}{cause}", ts=r.get("ts"), style=style)

    def traffic_on(self, host: int) -> str:
        """Which rail carries this host's traffic to each peer: ``r0: all`` or ``r0: h2 h3 | r1: h1``."""
        with self.lock:
            by_peer = {p: self.active[(host, p)] for p in range(self.hosts) if p != host}
        if not by_peer:
            return "-"
        groups: Dict[Optional[int], List[int]] = {}
        for p, r in by_peer.items():
            groups.setdefault(r, []).append(p)
        if len(groups) == 1:
            r = next(iter(groups))
            return "no path" if r is None else f"r{r}: all"
        return " | ".join(("no path" if r is None else f"r{r}") + ": " + " ".join(f"h{p}" for p in peers)
                          for r, peers in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))

    def set_rates(self, rates: List[List[float]]) -> None:
        with self.lock:
            self.rates = rates


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


class Monitor(threading.Thread):
    """Tails the step and event files, refreshes rates; drives the display."""

    def __init__(self, state: LiveState, steps_path: str, event_paths: Sequence[str],
                 sampler=None, on_tick: Optional[Callable[[], None]] = None, interval: float = 0.1) -> None:
        super().__init__(name="demo-monitor", daemon=True)
        self.state = state
        self.steps_tail = Tail(steps_path)
        self.event_tails = [Tail(p) for p in event_paths]
        self.sampler = sampler
        self.on_tick = on_tick
        self.interval = interval
        self._stop_ev = threading.Event()

    def poll(self) -> None:
        self.state.on_steps(self.steps_tail.read())
        evs: List[Dict[str, Any]] = []
        for t in self.event_tails:
            evs += t.read()
        if evs:
            self.state.on_events(evs)
        if self.sampler is not None:
            r = rates_from(self.sampler.series()[-20:])
            if r is not None:
                self.state.set_rates(r)
        if self.on_tick is not None:
            self.on_tick()

    def run(self) -> None:
        while not self._stop_ev.wait(self.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - the display must not kill the demo
                pass

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(2.0)
        self.poll()


# ------------------------------------------------------------------ running the job
@dataclass
class RunResult:
    name: str
    dir: str
    rc: Optional[int] = None
    wall_s: float = 0.0
    error: Optional[str] = None
    faults: List[Fault] = field(default_factory=list)
    samples: List[Tuple[float, List[List[int]]]] = field(default_factory=list)
    planned_duration: Optional[float] = None
    fault_error: Optional[str] = None


def _prepare_run_dir(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.join(path, "events"), exist_ok=True)


def job_env(run_dir: str) -> Dict[str, str]:
    env = {"LINKESCAPE_EVENTS": os.path.join(os.path.abspath(run_dir), "events", "rank{rank}.jsonl"),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    # the library's default silent timeout applies
    return env


def train_args(opts: DemoOptions, run_dir: str, min_duration: float = 0.0) -> List[str]:
    args = ["-m", "linkescape.demo.train", "--out", os.path.abspath(run_dir), "--steps", str(opts.steps),
            "--model-size", opts.model_size, "--seed", str(opts.seed)]
    if min_duration:
        args += ["--min-duration", f"{min_duration:g}"]
    return args


def run_timeout(opts: DemoOptions) -> float:
    return 180.0 + 3.0 * opts.steps


def _run_job(start_job: Callable[[], int], state: LiveState, run: RunResult, sampler, injector: Optional[Injector],
             opts: DemoOptions, display, min_duration: float) -> RunResult:
    """Run one training job with monitor, sampler and (optionally) the fault runner around it."""
    stop = threading.Event()
    events = [expand_path(os.path.join(run.dir, "events", "rank{rank}.jsonl"), r) for r in range(opts.hosts)]
    monitor = Monitor(state, os.path.join(run.dir, "steps.jsonl"), events, sampler=sampler,
                      on_tick=display.refresh if display is not None else None)
    faults = FaultRunner(injector, state, opts.hosts, opts.rails, min_duration, stop) if injector else None
    t0 = time.time()
    if sampler is not None:
        sampler.start()
    monitor.start()
    if faults is not None:
        faults.start()
    try:
        run.rc = start_job()
    finally:
        stop.set()
        if faults is not None:
            faults.join(15.0)
            run.faults = faults.faults
            run.fault_error = None if faults.error is None else f"{type(faults.error).__name__}: {faults.error}"
            run.planned_duration = state.planned_duration
        if sampler is not None:
            sampler.stop()
            run.samples = sampler.series()
        monitor.stop()
        run.wall_s = time.time() - t0
        with state.lock:
            state.finished = True
        if display is not None:
            display.refresh()
    return run


# -- testbed
def testbed_runs(opts: DemoOptions, display_factory) -> Tuple[Dict[str, Any], List[RunResult]]:
    from ..testbed.launch import launch
    from ..testbed.netns import TestbedError, make_temporary, release

    if opts.rails < 2:
        raise DemoError("the demo needs at least 2 rails: a rail that fails needs a backup")
    results: List[RunResult] = []
    try:
        tb = make_temporary(opts.hosts, opts.rails, rate=opts.rate, prefix="demo")
    except TestbedError as exc:
        raise TestbedUnavailable(f"cannot build a testbed: {exc}") from exc
    try:
        info = {"mode": "testbed", "testbed": {"name": tb.name, "hosts": tb.hosts, "rails": tb.rails,
                                               "rate": tb.rate}}
        plan = [("faulty", True)] + ([("reference", False)] if opts.reference else [])
        for k, (name, faulty) in enumerate(plan):
            run_dir = os.path.join(opts.out, name)
            _prepare_run_dir(run_dir)
            run = RunResult(name, run_dir)
            title = (f"linkescape demo: {tb.hosts} hosts x {tb.rails} rails at {tb.rate or 'unshaped'} "
                     f"(testbed {tb.name})")
            state = LiveState(tb.hosts, tb.rails, opts.steps, title, name)
            display = display_factory(state)
            min_duration = MIN_FAULT_WINDOW if faulty else 0.0
            log_path = os.path.join(run_dir, "train.log")

            def job(run_dir=run_dir, k=k, min_duration=min_duration, log_path=log_path) -> int:
                with open(log_path, "w") as log:
                    return launch(tb, train_args(opts, run_dir, min_duration), env=job_env(run_dir),
                                  master_port=29500 + k, timeout=run_timeout(opts), grace=10.0, stdout=log)

            sampler = NetnsTxSampler(tb) if faulty else None
            injector = TestbedInjector(tb) if faulty else None
            with display:
                _run_job(job, state, run, sampler, injector, opts, display, min_duration)
            results.append(run)
            if run.rc != 0 and faulty:
                break  # no point in a reference for a run that failed
    finally:
        release(tb)  # always torn down: failure, Ctrl-C (KeyboardInterrupt) or success
    return info, results


# -- emulated (loopback)
def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local_job(argv: List[str], world: int, env: Dict[str, str], log_path: str, timeout: float) -> int:
    """``world`` ranks as local processes with torchrun's environment; worst exit status."""
    port = _free_port()
    procs: List[subprocess.Popen] = []
    log = open(log_path, "w")
    try:
        for rank in range(world):
            e = dict(os.environ)
            e.update(env)
            e.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                      "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                      "GROUP_RANK": "0"})
            procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        failed_at: Optional[float] = None
        while True:
            states = [p.poll() for p in procs]
            if None not in states:
                break
            now = time.monotonic()
            if failed_at is None and any(rc not in (None, 0) for rc in states):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + 10.0):
                _kill(procs)
                return 124 if now > deadline else max(rc or 0 for rc in states)
            time.sleep(0.05)
        return max(128 - rc if rc < 0 else rc for rc in states)
    finally:
        _kill(procs)
        log.close()


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        if not alive:
            return
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + 3.0
        while time.monotonic() < end and any(p.poll() is None for p in alive):
            time.sleep(0.05)


def emulated_runs(opts: DemoOptions, display_factory, reason: str) -> Tuple[Dict[str, Any], List[RunResult]]:
    if opts.rails < 2:
        raise DemoError("the demo needs at least 2 rails: a rail that fails needs a backup")
    if opts.rails > 250:
        raise DemoError("emulated mode has at most 250 loopback rails")
    rails = ",".join(f"127.0.0.{r + 1}" for r in range(opts.rails))
    info = {"mode": "emulated", "emulated_reason": reason,
            "testbed": {"name": None, "hosts": opts.hosts, "rails": opts.rails, "rate": None,
                        "rail_addresses": rails.split(",")}}
    results: List[RunResult] = []
    plan = [("faulty", True)] + ([("reference", False)] if opts.reference else [])
    for name, faulty in plan:
        run_dir = os.path.join(opts.out, name)
        _prepare_run_dir(run_dir)
        run = RunResult(name, run_dir)
        title = (f"linkescape demo (EMULATED faults): {opts.hosts} ranks x {opts.rails} loopback rails "
                 f"({rails})")
        state = LiveState(opts.hosts, opts.rails, opts.steps, title, name)
        display = display_factory(state)
        min_duration = MIN_FAULT_WINDOW if faulty else 0.0
        argv = train_args(opts, run_dir, min_duration)
        env = job_env(run_dir)
        env["LINKESCAPE_RAILS"] = rails
        sampler = injector = None
        if faulty:
            control = os.path.join(os.path.abspath(run_dir), "control")
            os.makedirs(control, exist_ok=True)
            rail_bytes = os.path.join(os.path.abspath(run_dir), "rails", "rank{rank}.jsonl")
            os.makedirs(os.path.dirname(rail_bytes), exist_ok=True)
            argv += ["--control", control, "--rail-bytes", rail_bytes]
            injector = EmulatedInjector(control)
            sampler = FileTxSampler([rail_bytes.replace("{rank}", str(r)) for r in range(opts.hosts)], opts.rails)

        def job(argv=argv, env=env, run_dir=run_dir) -> int:
            return _local_job(argv, opts.hosts, env, os.path.join(run_dir, "train.log"), run_timeout(opts))

        with display:
            _run_job(job, state, run, sampler, injector, opts, display, min_duration)
        results.append(run)
        if run.rc != 0 and faulty:
            break
    return info, results


def testbed_unavailable() -> Optional[str]:
    """Why no testbed can be built here (None when it probably can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "not running as root (the testbed needs CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    if shutil.which("nft") is None:
        return "nftables ('nft') is not installed (blackhole faults need it)"
    return None


__all__ = ["DemoOptions", "DemoError", "plan_faults", "Fault", "LiveState", "RunResult", "testbed_runs",
           "emulated_runs", "testbed_unavailable", "TestbedUnavailable", "Tail", "read_jsonl", "MIN_FAULT_WINDOW"]
