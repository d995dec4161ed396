"""The demo's faults: the plan (a cut, a blackhole, a flap, then a cross, one after the other) and its injectors.

:func:`plan_faults` spreads the single-NIC faults over the training run and
puts a *cross* after them (two hosts lose different rails at the same time,
so they share none and a third host relays their traffic) for ``cross_hold``
seconds (10 s), each a fault of the shared schedule
(:class:`linkescape.faults.Fault`) kept on a :class:`PlayedFault` with what
became of it; :func:`schedule_of` makes them one scripted schedule, which
:class:`~.live.FaultRunner` plays through an injector once training has
started: the testbed's (real faults) or the emulated one
(``Communicator.inject_fault`` in the ranks, through the control directory
of :mod:`.emulated`). :func:`fault_window` is how long training must last for
the plan to fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import faults as _faults

_WHAT = {"cut": "cable cut", "blackhole": "optic blackholed", "flap": "link flapping"}
#: the demo's faults, in the order they are played
KINDS = ("cut", "blackhole", "flap", "cross")
#: how long the cross lasts by default (issue 16: "about 10 s")
CROSS_HOLD = 10.0
#: after the cross's repair: the re-dial, the 1 s hold-down, and traffic back on a direct rail
CROSS_TAIL = 5.0
#: before a cross that comes first: training under way
CROSS_LEAD = 2.0
#: the single-NIC faults, each with its repair and failback, fit in this
SINGLES_WINDOW = 16.0


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

    @classmethod
    def planned_cross(cls, fid: int, a: int, b: int, at: float, hold: float, rails: int = 2,
                      mode: str = "cut") -> "PlayedFault":
        """Host ``a`` loses rail 0, host ``b`` every other rail, at once, for ``hold`` seconds: they share
        no rail, and a third host relays for them."""
        targets = ((a, 0),) + tuple((b, r) for r in range(1, rails))
        return cls(_faults.Fault(fid, "cross", at, hold, targets, mode=mode))

    kind = property(lambda self: self.plan.kind)
    targets = property(lambda self: tuple(self.plan.targets), doc="(host, rail) NICs the fault takes down")
    hosts = property(lambda self: self.plan.hosts)
    host = property(lambda self: self.plan.targets[0][0])
    rail = property(lambda self: self.plan.targets[0][1])
    start_at = property(lambda self: self.plan.at, doc="planned offset from training start, seconds")
    hold = property(lambda self: self.plan.hold, doc="seconds down (cut, blackhole); a flap's whole time")
    period = property(lambda self: self.plan.period or 0.0, doc="a flap's down + up cycle, seconds")
    count = property(lambda self: int(round(self.hold / self.period)) if self.period else 0, doc="a flap's cycles")

    @property
    def label(self) -> str:
        if self.kind == "cross":
            where = " + ".join(f"host {h} rail {r}" for h, r in self.targets)
            return f"cross (no rail in common): {where}"
        return f"{_WHAT[self.kind]}: host {self.host} rail {self.rail}"

    def to_dict(self) -> Dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "rail": self.rail, "label": self.label,
                "targets": [list(t) for t in self.targets],
                "planned_offset_s": round(self.start_at, 3), "hold_s": round(self.hold, 3),
                "period_s": self.period or None, "count": self.count or None,
                "issued": self.issued, "ts": self.ts, "restore_issued": self.restore_issued,
                "restored": self.restored, "transitions": [[t, s] for t, s in self.transitions],
                "error": self.error}


def plan_faults(duration: float, hosts: int, rails: int, kinds: Sequence[str] = KINDS,
                cross_hold: float = CROSS_HOLD) -> List[PlayedFault]:
    """The faults of ``kinds`` spread over a run of ``duration`` seconds, one after the other.

    The single-NIC faults take the first part (all of the run without a
    cross): each is repaired with time left for its failback (hold-down 1 s)
    before the next begins: the first at 10 % of that part, repaired at 25 %;
    the second at 37 %, repaired at 52 %; the third from 64 % (a flap: three
    periods). A cross (hosts 1 and 2, rails 0 and 1) comes last, held
    ``cross_hold`` seconds, with ``CROSS_TAIL`` s after its repair for the
    pair to return to a direct rail. A cross needs 3 hosts (one to relay) and
    2 rails; with fewer it is left out.
    """
    singles = [k for k in kinds if k != "cross"]
    cross = "cross" in kinds and hosts >= 3 and rails >= 2
    span = duration - (cross_hold + CROSS_TAIL if cross else 0.0)
    seg = span / 10.0

    def host(k: int) -> int:
        return 1 + (k % (hosts - 1)) if hosts > 1 else 0

    period = max(0.6, min(1.2, seg * 0.5))
    out: List[PlayedFault] = []
    for i, kind in enumerate(singles):
        at = (1.0 + 2.7 * i) * seg
        if kind == "flap":
            out.append(PlayedFault.planned(len(out), "flap", host(i), 0, at, 3 * period, period=period))
        else:
            out.append(PlayedFault.planned(len(out), kind, host(i), 0, at, 1.5 * seg))
    if cross:
        at = span if singles else CROSS_LEAD
        out.append(PlayedFault.planned_cross(len(out), 1, 2, at, cross_hold, rails))
    return out


def fault_window(kinds: Sequence[str] = KINDS, cross_hold: float = CROSS_HOLD, hosts: int = 4,
                 rails: int = 2) -> float:
    """How long training must last (at least) for the plan of ``kinds`` to fit, repairs and failbacks too."""
    singles = [k for k in kinds if k != "cross"]
    cross = "cross" in kinds and hosts >= 3 and rails >= 2
    return ((SINGLES_WINDOW if singles else CROSS_LEAD) if singles or cross else 0.0) + (
        cross_hold + CROSS_TAIL if cross else 0.0)


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


__all__ = ["PlayedFault", "plan_faults", "fault_window", "schedule_of", "Injector", "TestbedInjector",
           "EmulatedInjector", "KINDS", "CROSS_HOLD"]
