"""The demo's faults: the plan (a cut, a blackhole, a flap, one after the other) and who plays it.

:func:`plan_faults` spreads three faults over the training run;
:func:`schedule_of` turns them into a shared scripted schedule
(:mod:`linkescape.faults`), which :class:`FaultRunner` plays through an
injector once training has started: the testbed's (real faults) or the
emulated one (``Communicator.inject_fault`` in the ranks, through the
control directory of :mod:`.emulated`). What happened to each fault is kept
on its :class:`Fault` and shown through the :class:`~.live.LiveState`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .. import faults as _faults

if TYPE_CHECKING:  # pragma: no cover
    from .live import LiveState


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


__all__ = ["Fault", "plan_faults", "schedule_of", "FaultRunner", "Injector", "TestbedInjector", "EmulatedInjector"]
