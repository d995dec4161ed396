"""The demo's faults: the plan (a cut, a blackhole, a flap, one after the other) and its injectors.

:func:`plan_faults` spreads three faults over the training run, each a
fault of the shared schedule (:class:`linkescape.faults.Fault`) kept on a
:class:`PlayedFault` with what became of it; :func:`schedule_of` makes them
one scripted schedule, which :class:`~.live.FaultRunner` plays through an
injector once training has started: the testbed's (real faults) or the
emulated one (``Communicator.inject_fault`` in the ranks, through the
control directory of :mod:`.emulated`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import faults as _faults

_WHAT = {"cut": "cable cut", "blackhole": "optic blackholed", "flap": "link flapping"}


# ------------------------------------------------------------------ fault plan
@dataclass
class PlayedFault:
    """One fault of the demo's plan (one NIC: a cut, a blackhole or a flap) and what became of it."""

    plan: _faults.Fault
    issued: Optional[float] = None  # wall time the command was issued
    ts: Optional[float] = None  # wall time the fault was in effect
    restore_issued: Optional[float] = None
    restored: Optional[float] = None  # wall time the link was repaired (flap: the last up)
    transitions: List[Tuple[float, str]] = field(default_factory=list)  # (ts, "down"/"up")
    error: Optional[str] = None

    @classmethod
    def planned(cls, fid: int, kind: str, host: int, rail: int, at: float, hold: float,
                period: Optional[float] = None) -> "PlayedFault":
        """``kind`` on (``host``, ``rail``) from ``at`` (seconds after training start) for ``hold``
        seconds; a flap goes down and up every ``period`` over its ``hold``."""
        mode = "blackhole" if kind == "blackhole" else "cut"
        return cls(_faults.Fault(fid, kind, at, hold, ((host, rail),), mode=mode, period=period))

    kind = property(lambda self: self.plan.kind)
    host = property(lambda self: self.plan.targets[0][0])
    rail = property(lambda self: self.plan.targets[0][1])
    start_at = property(lambda self: self.plan.at, doc="planned offset from training start, seconds")
    hold = property(lambda self: self.plan.hold, doc="seconds down (cut, blackhole); a flap's whole time")
    period = property(lambda self: self.plan.period or 0.0, doc="a flap's down + up cycle, seconds")
    count = property(lambda self: int(round(self.hold / self.period)) if self.period else 0, doc="a flap's cycles")

    @property
    def label(self) -> str:
        return f"{_WHAT[self.kind]}: host {self.host} rail {self.rail}"

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "rail": self.rail, "label": self.label,
                "planned_offset_s": round(self.start_at, 3), "hold_s": round(self.hold, 3),
                "period_s": self.period or None, "count": self.count or None,
                "issued": self.issued, "ts": self.ts, "restore_issued": self.restore_issued,
                "restored": self.restored, "transitions": [[t, s] for t, s in self.transitions],
                "error": self.error}


def plan_faults(duration: float, hosts: int, rails: int) -> List[PlayedFault]:
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
        PlayedFault.planned(0, "cut", host(0), 0, 1.0 * seg, 1.5 * seg),
        PlayedFault.planned(1, "blackhole", host(1), 0, 3.7 * seg, 1.5 * seg),
        PlayedFault.planned(2, "flap", host(2), 0, 6.4 * seg, 3 * period, period=period),
    ]


def schedule_of(faults: Sequence[PlayedFault], duration: float, hosts: int, rails: int) -> "_faults.Schedule":
    """The demo's plan as a shared fault schedule (offsets from training start)."""
    end = max([duration] + [f.plan.end for f in faults])
    return _faults.Schedule([f.plan for f in faults], end, hosts, rails, params={"scripted": True})


# ------------------------------------------------------------------ fault injectors
# The shared fault schedule and injectors (linkescape.faults): real faults on
# the testbed, or Communicator.inject_fault inside the ranks (emulated).
Injector = _faults.Injector


def TestbedInjector(tb) -> _faults.Injector:  # noqa: N802 - kept as the demo's name for it
    return _faults.TestbedInjector(tb)


def EmulatedInjector(control_dir: str) -> _faults.Injector:  # noqa: N802
    from .emulated import FaultClient

    return _faults.EmulatedInjector(FaultClient(control_dir).apply)


__all__ = ["PlayedFault", "plan_faults", "schedule_of", "Injector", "TestbedInjector", "EmulatedInjector"]
