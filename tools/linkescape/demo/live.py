"""What the demo shows while it runs: :class:`LiveState`, fed by :class:`Monitor` and :class:`FaultRunner`.

The monitor tails the training steps and every rank's event trail and
refreshes the NIC rates; the fault runner plays the fault plan and adds the
faults and rail states. The display (:mod:`.display`) and the plain output
read the state.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: F401

from ..faults import ScheduleRunner
from ..common.jsonl import Tail
from .faultplan import CROSS_HOLD, KINDS, Injector, PlayedFault, plan_faults, schedule_of
from .sampling import rates_from


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
        # (rank, peer) -> rail carrying the traffic (None: no path; "via C": through rank C)
        self.active: Dict[Tuple[int, int], Any] = {(a, b): 0 for a in range(hosts) for b in range(hosts) if a != b}
        self.events: List[Dict[str, Any]] = []
        self.lines: List[Tuple[float, str, str]] = []  # (ts, text, style) for the event pane / plain output
        self.faults: List[PlayedFault] = []
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
    def set_faults(self, faults: List[PlayedFault], duration: float) -> None:
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
                key = (rank, peer)
                if key in self.active:
                    if ev in ("failover", "failback"):
                        self.active[key] = rail
                    elif ev == "no_path" and not str(self.active[key]).startswith("via"):
                        self.active[key] = None
                    elif ev == "relay_on":
                        self.active[key] = f"via h{r.get('via')}"
                    elif ev == "relay_off":
                        # back to a direct rail (the event does not say which; the primary is picked first)
                        self.active[key] = 0 if r.get("cause") == "path_back" else None
            cause = f" cause={r['cause']}" if r.get("cause") else ""
            frm = f" from rail {r['from_rail']}" if r.get("from_rail") is not None else ""
            style = {"link_down": "yellow", "failover": "magenta", "link_up": "cyan", "failback": "green",
                     "no_path": "bold red", "peer_lost": "bold red", "relay_on": "bold cyan",
                     "relay_off": "cyan"}.get(ev, "")
            if ev in ("relay_on", "relay_off"):
                self.note(f"rank {rank}: {ev:<9} peer {peer} via rank {r.get('via')}{cause}", ts=r.get("ts"),
                          style=style)
                continue
            self.note(f"rank {rank}: {ev:<9} peer {peer} rail {rail}{frm}{cause}", ts=r.get("ts"), style=style)

    def traffic_on(self, host: int) -> str:
        """Which rail carries this host's traffic to each peer: ``r0: all`` or ``r0: h2 h3 | r1: h1``."""
        with self.lock:
            by_peer = {p: self.active[(host, p)] for p in range(self.hosts) if p != host}
        if not by_peer:
            return "-"
        groups: Dict[Any, List[int]] = {}
        for p, r in by_peer.items():
            groups.setdefault(r, []).append(p)

        def name(r: Any) -> str:
            return "no path" if r is None else (r if isinstance(r, str) else f"r{r}")

        if len(groups) == 1:
            r = next(iter(groups))
            return name(r) + ("" if r is None else ": all")
        order = lambda kv: (kv[0] is None, isinstance(kv[0], str), str(kv[0]))  # noqa: E731
        return " | ".join(name(r) + ": " + " ".join(f"h{p}" for p in peers)
                          for r, peers in sorted(groups.items(), key=order))

    def set_rates(self, rates: List[List[float]]) -> None:
        with self.lock:
            self.rates = rates


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


class FaultRunner(threading.Thread):
    """Plays the fault plan once training has started; always leaves every rail repaired."""

    def __init__(self, injector: Injector, state: LiveState, hosts: int, rails: int,
                 min_duration: float, stop: threading.Event, kinds=KINDS, cross_hold: float = CROSS_HOLD) -> None:
        super().__init__(name="demo-faults", daemon=True)
        self.injector = injector
        self.state = state
        self.hosts = hosts
        self.rails = rails
        self.kinds = tuple(kinds)
        self.cross_hold = cross_hold
        self.min_duration = min_duration
        self.stop_ev = stop
        self.faults: List[PlayedFault] = []
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
        self.faults = plan_faults(duration, self.hosts, self.rails, self.kinds, self.cross_hold)
        self.state.set_faults(self.faults, duration)
        runner = ScheduleRunner(schedule_of(self.faults, duration, self.hosts, self.rails), self.injector,
                                        on_step=self._on_step)
        runner.start(t0)
        try:
            while runner.running:
                if self.stop_ev.wait(0.05):
                    break
        finally:
            runner.stop()  # repairs whatever is still down
            for f in self.faults:
                for h, r in f.targets:
                    self.state.set_rail(h, r, "up")
        if runner.error is not None:
            raise runner.error

    def _on_step(self, rec: Dict[str, Any]) -> None:
        f = self.faults[rec["fault"]]
        ts = rec["ts"]
        issued = rec["planned"] + (rec.get("late") or 0.0) if rec.get("planned") else ts  # when the command began
        if f.kind == "cross":
            self._on_cross_step(f, rec, ts, issued)
            return
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

    def _on_cross_step(self, f: PlayedFault, rec: Dict[str, Any], ts: float, issued: float) -> None:
        """A cross takes several NICs down at once: in effect once the last is down, repaired once the last
        is back (each NIC's own change is a line of its own)."""
        host, rail = rec["host"], rec["rail"]
        n = len(f.targets)
        if rec["action"] == "apply":
            if f.issued is None:
                f.issued, f.ts = issued, ts  # in effect from its first NIC; no common rail from its last
                where = " + ".join(f"host {h} rail {r}" for h, r in f.targets)
                self.state.fault_line(ts, f"CROSS {where}: no rail in common ({f.hold:.0f} s)")
            f.transitions.append((ts, "down"))
            self.state.set_rail(host, rail, "CUT (cross)" if f.plan.mode == "cut" else "BLACKHOLED (cross)")
            return
        if f.restore_issued is None:
            f.restore_issued = issued
        f.transitions.append((ts, "up"))
        self.state.set_rail(host, rail, "up")
        self.state.fault_line(ts, f"RESTORE host {host} rail {rail}")
        if sum(1 for _, s in f.transitions if s == "up") == n:
            f.restored = ts


__all__ = ["LiveState", "Monitor", "FaultRunner"]
