"""A plan of timed faults and repairs: random (seeded) or scripted, overlapping allowed.

A :class:`Schedule` is a list of :class:`Fault` s, each with its start (``at``,
seconds from the schedule's start), how long it lasts (``hold``), and the
(host, rail) NICs it takes down. The kinds:

==========  ======================================================================
``cut``      one NIC loses carrier (cable pulled, optic dead)
``blackhole`` one NIC silently drops everything; carrier stays up
``lossy``    one NIC drops ``loss`` percent of its packets at random; carrier stays up
``flap``     one NIC goes down for ``period / 2`` and up for ``period / 2``, over ``hold`` s
``isolate``  every rail of one host goes down (``mode`` cut or blackhole): no path to it
``cross``    two hosts lose different rails, so they share none: no path between them
==========  ======================================================================

Each kind is made of three *mechanisms* that an injector knows how to apply
and repair one at a time: ``cut``, ``blackhole`` and ``lossy``.
:meth:`Schedule.steps` expands the plan into the timed apply/repair steps of
those mechanisms, which :class:`~linkescape.faults.runner.ScheduleRunner` plays.
Faults may overlap, also on one NIC: mechanisms compose (a cut and blackholed
NIC carries nothing until both are repaired), so nothing in a plan can undo
another fault's effect early.

:func:`random_schedule` draws a plan from a seed and nothing else (Python's
``random.Random``), so the seed reproduces it; :meth:`Schedule.to_json` and
:meth:`Schedule.from_json` store and replay it exactly (a scripted plan).


:func:`path_timeline` says, for any set of down intervals (planned or as
applied), when every pair of hosts had a clean rail in common, when some pair
had only lossy ones, and when some pair had none; with ``relay=True`` it also
tells a no-path that a third host could bridge (``relayable``: every pair
without a rail in common has a clean rail each, and some other host has every
rail clean) from one that must be waited out. :func:`unrelayable_stretches`
gives, per pair, the stretches with no path and no relay (what the ranks'
no-path deadline must outlast).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..common.errors import UsageError

KINDS = ("cut", "blackhole", "flap", "isolate", "cross", "lossy")
MECHANISMS = ("cut", "blackhole", "lossy")
#: the ways a NIC can be taken fully down by isolate, cross and flap
DOWN_MODES = ("cut", "blackhole")
LOSS_RANGE = (1.0, 20.0)  # percent, the default of lossy faults
ISOLATE_BOUND = 3.0  # seconds: isolate and cross last less than this by default


class ScheduleError(UsageError):
    """A fault plan (scripted or its parameters) is invalid."""


class UnsupportedFault(ScheduleError):
    """The injector cannot make this kind of fault (e.g. ``lossy`` without a testbed)."""


Target = Tuple[int, int]  # (host, rail)


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``kind`` on ``targets`` from ``at`` for ``hold`` seconds."""

    id: int
    kind: str
    at: float
    hold: float
    targets: Tuple[Target, ...]
    mode: str = "cut"  # the mechanism that takes the targets down (lossy: "lossy")
    loss: Optional[float] = None  # lossy: percent of packets dropped
    period: Optional[float] = None  # flap: seconds per down + up cycle

    @property
    def end(self) -> float:
        return self.at + self.hold

    @property
    def hosts(self) -> Tuple[int, ...]:
        return tuple(sorted({h for h, _ in self.targets}))

    @property
    def label(self) -> str:
        where = ", ".join(f"h{h}r{r}" for h, r in self.targets)
        extra = ""
        if self.kind == "lossy" and self.loss is not None:
            extra = f" {self.loss:g}%"
        elif self.kind == "flap" and self.period is not None:
            extra = f" period {self.period:.2f}s"
        how = f" ({self.mode})" if self.kind in ("isolate", "cross", "flap") else ""
        return f"#{self.id} {self.kind}{how}{extra} {where} at {self.at:.2f}s for {self.hold:.2f}s"

    def intervals(self) -> List[Tuple[float, float, int, int, str]]:
        """Planned ``(t0, t1, host, rail, mechanism)`` of every down (or lossy) stretch."""
        if self.kind == "flap":
            cycles = max(1, int(round(self.hold / self.period)))
            half = self.period / 2.0
            return [(self.at + c * self.period, self.at + c * self.period + half, h, r, self.mode)
                    for c in range(cycles) for h, r in self.targets]
        return [(self.at, self.end, h, r, self.mode) for h, r in self.targets]

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"id": self.id, "kind": self.kind, "at": round(self.at, 6),
                             "hold": round(self.hold, 6), "targets": [list(t) for t in self.targets],
                             "mode": self.mode}
        if self.loss is not None:
            d["loss"] = self.loss
        if self.period is not None:
            d["period"] = round(self.period, 6)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], default_id: int = 0) -> "Fault":
        try:
            kind = str(d["kind"])
            targets = d.get("targets")
            if targets is None:  # the short form of one-NIC faults: {"host": 1, "rail": 0}
                targets = [[d["host"], d["rail"]]]
            mode = d.get("mode") or {"lossy": "lossy", "blackhole": "blackhole"}.get(kind, "cut")
            return cls(id=int(d.get("id", default_id)), kind=kind, at=float(d["at"]), hold=float(d["hold"]),
                       targets=tuple((int(h), int(r)) for h, r in targets), mode=str(mode),
                       loss=None if d.get("loss") is None else float(d["loss"]),
                       period=None if d.get("period") is None else float(d["period"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"fault {dict(d)!r}: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Step:
    """One timed action of a mechanism on one NIC: what the runner plays."""

    t: float
    action: str  # apply | repair
    mechanism: str  # cut | blackhole | lossy
    host: int
    rail: int
    fault: int  # the Fault's id
    loss: Optional[float] = None


@dataclass
class Schedule:
    """Faults on a cluster of ``hosts`` x ``rails``, over ``duration`` seconds."""

    faults: List[Fault]
    duration: float
    hosts: int
    rails: int
    seed: Optional[int] = None
    params: Dict[str, Any] = field(default_factory=dict)  # how a random plan was drawn

    def __post_init__(self) -> None:
        self.faults = sorted(self.faults, key=lambda f: (f.at, f.id))
        self.validate()

    # ------------------------------------------------------------ checks
    def validate(self) -> None:
        if not (self.hosts >= 1 and self.rails >= 1):
            raise ScheduleError(f"a schedule needs hosts and rails, got {self.hosts} x {self.rails}")
        if not (math.isfinite(self.duration) and self.duration > 0):
            raise ScheduleError(f"duration must be positive, got {self.duration}")
        ids = [f.id for f in self.faults]
        if len(set(ids)) != len(ids):
            raise ScheduleError("fault ids must be unique")
        for f in self.faults:
            self._check(f)

    def _check(self, f: Fault) -> None:
        bad = lambda why: ScheduleError(f"fault {f.to_dict()}: {why}")  # noqa: E731
        if f.kind not in KINDS:
            raise bad(f"unknown kind; expected one of {KINDS}")
        if not (f.at >= 0 and f.hold > 0 and math.isfinite(f.end)):
            raise bad("needs at >= 0 and hold > 0")
        if f.end > self.duration + 1e-9:
            raise bad(f"ends at {f.end:.3f}s, after the schedule ({self.duration:.3f}s)")
        if not f.targets:
            raise bad("no targets")
        for h, r in f.targets:
            if not (0 <= h < self.hosts and 0 <= r < self.rails):
                raise bad(f"target h{h}r{r} is not in {self.hosts} hosts x {self.rails} rails")
        if len(set(f.targets)) != len(f.targets):
            raise bad("a target appears twice")
        one_nic = ("cut", "blackhole", "lossy", "flap")
        if f.kind in one_nic and len(f.targets) != 1:
            raise bad(f"{f.kind} takes exactly one (host, rail)")
        expected_mode = {"cut": ("cut",), "blackhole": ("blackhole",), "lossy": ("lossy",)}.get(f.kind, DOWN_MODES)
        if f.mode not in expected_mode:
            raise bad(f"mode must be one of {expected_mode}")
        if f.kind == "lossy" and not (f.loss is not None and 0 < f.loss <= 100):
            raise bad("lossy needs loss in (0, 100] percent")
        if f.kind == "flap" and not (f.period is not None and 0 < f.period <= f.hold):
            raise bad("flap needs 0 < period <= hold")
        if f.kind == "isolate":
            (host,) = f.hosts if len(f.hosts) == 1 else (None,)
            if host is None or {r for _, r in f.targets} != set(range(self.rails)):
                raise bad("isolate takes every rail of one host")
        if f.kind == "cross":
            if len(f.hosts) != 2:
                raise bad("cross takes two hosts")
            a, b = f.hosts
            ra = {r for h, r in f.targets if h == a}
            rb = {r for h, r in f.targets if h == b}
            if ra & rb or ra | rb != set(range(self.rails)):
                raise bad("cross: the two hosts lose different rails that together are all of them")

    # ------------------------------------------------------------ views
    def steps(self) -> List[Step]:
        """Every apply and repair, in time order (at equal times repairs first, then by fault)."""
        out = []
        for f in self.faults:
            for t0, t1, h, r, mech in f.intervals():
                loss = f.loss if mech == "lossy" else None
                out.append(Step(t0, "apply", mech, h, r, f.id, loss))
                out.append(Step(t1, "repair", mech, h, r, f.id, loss))
        return sorted(out, key=lambda s: (s.t, s.action != "repair", s.fault, s.host, s.rail))

    def intervals(self) -> List[Tuple[float, float, int, int, str]]:
        """Planned down stretches of every fault."""
        return [iv for f in self.faults for iv in f.intervals()]

    def active_at(self, t: float) -> List[Fault]:
        return [f for f in self.faults if f.at <= t < f.end]

    def by_id(self, fid: int) -> Fault:
        for f in self.faults:
            if f.id == fid:
                return f
        raise KeyError(fid)

    def counts(self) -> Dict[str, int]:
        out = {k: 0 for k in KINDS}
        for f in self.faults:
            out[f.kind] += 1
        return {k: v for k, v in out.items() if v}

    def window(self, t0: float, t1: float) -> "Schedule":
        """The faults that start in ``[t0, t1)``, shifted to start ``t0`` = 0 (to replay a stretch).
        Parts (``params["parts"]``, see :meth:`parts`) are cut and shifted the same way."""
        faults = [Fault(**{**f.__dict__, "at": f.at - t0}) for f in self.faults if t0 <= f.at < t1]
        end = max([t1 - t0] + [f.end for f in faults])
        params: Dict[str, Any] = {**self.params, "window": [t0, t1]}
        if self.params.get("parts"):
            parts = []
            for p in self.params["parts"]:
                a, b = max(float(p["from"]), t0) - t0, min(float(p["to"]), t1) - t0
                if b > a:
                    ends = [f.end for f in faults if a <= f.at < b]
                    parts.append({**p, "from": round(a, 6), "to": round(max([b] + ends), 6)})
            params["parts"] = parts
        return Schedule(faults, end, self.hosts, self.rails, seed=self.seed, params=params)

    def parts(self) -> List[Dict[str, Any]]:
        """The stretches the plan is played in, each by ranks of its own (``params["parts"]``:
        ``{"from", "to", "policy", "seed"}``, no fault crossing a boundary); one part when none is given."""
        got = self.params.get("parts")
        if not got:
            return [{"from": 0.0, "to": self.duration, "policy": None, "seed": self.seed}]
        return [dict(p) for p in got]

    def part_schedule(self, part: Mapping[str, Any]) -> "Schedule":
        """The faults of one part (offsets unchanged: the part is played from offset ``part["from"]``)."""
        a, b = float(part["from"]), float(part["to"])
        return Schedule([f for f in self.faults if a <= f.at < b], b, self.hosts, self.rails, seed=self.seed,
                        params={**self.params, "part": dict(part)})

    # ------------------------------------------------------------ storing
    def to_dict(self) -> Dict[str, Any]:
        return {"seed": self.seed, "duration": self.duration, "hosts": self.hosts, "rails": self.rails,
                "params": dict(self.params), "counts": self.counts(),
                "faults": [f.to_dict() for f in self.faults]}

    def to_json(self, indent: Optional[int] = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Schedule":
        try:
            faults = [Fault.from_dict(f, i) for i, f in enumerate(d["faults"])]
            return cls(faults, float(d["duration"]), int(d["hosts"]), int(d["rails"]),
                       seed=d.get("seed"), params=dict(d.get("params") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise ScheduleError(f"not a fault schedule: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ScheduleError(f"not a fault schedule: {exc}") from None

    @classmethod
    def load(cls, path: str) -> "Schedule":
        with open(path, encoding="utf-8") as fh:
            return cls.from_json(fh.read())

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json() + "\n")


def scripted(faults: Sequence[Mapping[str, Any]], hosts: int, rails: int,
             duration: Optional[float] = None) -> Schedule:
    """A schedule from fault dicts (``{"kind": "cut", "host": 1, "rail": 0, "at": 2, "hold": 1}`` ...).

    ``duration`` defaults to the end of the last fault.
    """
    parsed = [Fault.from_dict(f, i) for i, f in enumerate(faults)]
    end = max([f.end for f in parsed] + [0.0])
    return Schedule(parsed, duration if duration is not None else max(end, 1e-3), hosts, rails,
                    params={"scripted": True})


# ------------------------------------------------------------ random plans
def random_schedule(seed: int, duration: float, hosts: int, rails: int, *,
                    kinds: Sequence[str] = KINDS, interval: float = 1.0, warmup: float = 2.0,
                    tail: float = 3.0, max_active: int = 3, hold: Tuple[float, float] = (0.5, 4.0),
                    isolate_bound: float = ISOLATE_BOUND, loss: Tuple[float, float] = LOSS_RANGE,
                    flap_period: Tuple[float, float] = (0.2, 1.0),
                    flap_cycles: Tuple[int, int] = (2, 5),
                    cross_hold: Optional[Tuple[float, float]] = None) -> Schedule:
    """Faults at random: a new one every ``interval`` s on average (exponential gaps).

    Nothing starts in the first ``warmup`` s; everything is repaired ``tail`` s
    before the end. A fault that would make more than ``max_active`` overlap is
    skipped (its draw is still consumed, so the rest of the plan does not
    change). ``isolate`` and ``cross`` last less than ``isolate_bound``;
    with ``cross_hold`` = (min, max) a ``cross`` lasts between those instead
    (a relay bridges it, so it may outlast the no-path deadline), and a cross
    never starts while another is on (two crosses leave no host that every
    rail reaches, so nothing could relay either pair). The same
    arguments always give the same plan, and ``cross_hold`` changes only the
    holds of the crosses' draws (which, being longer, may leave out later faults that would overlap
    more than ``max_active``).
    """
    kinds = tuple(kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ScheduleError(f"unknown fault kinds {unknown}; expected some of {KINDS}")
    if "cross" in kinds and (hosts < 2 or rails < 2):
        raise ScheduleError("cross needs at least 2 hosts and 2 rails")
    if interval <= 0 or max_active < 1 or not (0 < hold[0] <= hold[1]) or isolate_bound <= 0.1:
        raise ScheduleError("interval, max_active, hold and isolate_bound must be positive")
    if not (0 < loss[0] <= loss[1] <= 100):
        raise ScheduleError(f"loss range {loss} must be within (0, 100] percent")
    if cross_hold is not None and not (0 < cross_hold[0] <= cross_hold[1]):
        raise ScheduleError(f"cross_hold {cross_hold} must be 0 < MIN <= MAX")
    rng = random.Random(seed)
    last_end = duration - tail
    faults: List[Fault] = []
    t = warmup
    while True:
        t += rng.expovariate(1.0 / interval)
        kind = rng.choice(kinds)
        draw = _draw(rng, kind, hosts, rails, hold, isolate_bound, loss, flap_period, flap_cycles, cross_hold)
        if t + draw["hold"] > last_end:
            if t + hold[0] > last_end:
                break
            continue  # this one would not be repaired in time; a shorter one may still fit
        if sum(1 for f in faults if f.at <= t < f.end) >= max_active:
            continue
        if cross_hold is not None and kind == "cross" and any(f.kind == "cross" and f.at <= t < f.end
                                                              for f in faults):
            continue  # two long crosses at once leave no host with every rail: nothing could relay
        faults.append(Fault(id=len(faults), kind=kind, at=round(t, 3), **draw))
    params = {"kinds": list(kinds), "interval": interval, "warmup": warmup, "tail": tail, "max_active": max_active,
              "hold": list(hold), "isolate_bound": isolate_bound, "loss": list(loss),
              "flap_period": list(flap_period), "flap_cycles": list(flap_cycles)}
    if cross_hold is not None:
        params["cross_hold"] = list(cross_hold)
    return Schedule(faults, duration, hosts, rails, seed=seed, params=params)


def concatenate(parts: Sequence[Tuple[Schedule, Mapping[str, Any]]]) -> Schedule:
    """One plan of several played one after the other: each ``(schedule, info)`` is shifted to start where
    the one before ended, its faults renumbered; ``params["parts"]`` says where each part is (``from``,
    ``to``) with its ``info`` (e.g. the ranks' policy). No fault crosses a part's boundary, so the ranks
    can be restarted between parts."""
    if not parts:
        raise ScheduleError("no parts to concatenate")
    first = parts[0][0]
    faults: List[Fault] = []
    meta: List[Dict[str, Any]] = []
    t = 0.0
    for sched, info in parts:
        if (sched.hosts, sched.rails) != (first.hosts, first.rails):
            raise ScheduleError("the parts of a plan must have the same hosts and rails")
        for f in sched.faults:
            faults.append(Fault(**{**f.__dict__, "id": len(faults), "at": round(f.at + t, 6)}))
        meta.append({**dict(info), "from": round(t, 6), "to": round(t + sched.duration, 6), "seed": sched.seed})
        t += sched.duration
    params = {k: v for k, v in first.params.items() if k not in ("parts", "window")}
    params["parts"] = meta
    return Schedule(faults, t, first.hosts, first.rails, seed=first.seed, params=params)


def _draw(rng: random.Random, kind: str, hosts: int, rails: int, hold: Tuple[float, float], bound: float,
          loss: Tuple[float, float], flap_period: Tuple[float, float],
          flap_cycles: Tuple[int, int], cross_hold: Optional[Tuple[float, float]] = None) -> Dict[str, Any]:
    host = rng.randrange(hosts)
    rail = rng.randrange(rails)
    span = round(rng.uniform(*hold), 3)
    if kind in ("cut", "blackhole"):
        return {"hold": span, "targets": ((host, rail),), "mode": kind}
    if kind == "lossy":
        return {"hold": span, "targets": ((host, rail),), "mode": "lossy",
                "loss": round(rng.uniform(*loss), 1)}
    if kind == "flap":
        period = round(rng.uniform(*flap_period), 3)
        cycles = rng.randint(*flap_cycles)
        mode = "cut" if rng.random() < 0.75 else "blackhole"
        return {"hold": round(period * cycles, 3), "targets": ((host, rail),), "mode": mode, "period": period}
    mode = rng.choice(DOWN_MODES)
    span = round(rng.uniform(min(0.5, bound / 2), bound * 0.999), 3)  # strictly less than the bound
    if kind == "isolate":
        return {"hold": span, "targets": tuple((host, r) for r in range(rails)), "mode": mode}
    other = rng.choice([h for h in range(hosts) if h != host])
    lose = set(rng.sample(range(rails), rng.randint(1, rails - 1)))
    targets = tuple(sorted([(host, r) for r in lose] + [(other, r) for r in range(rails) if r not in lose]))
    if cross_hold is not None:
        # the same draws as without it (so the rest of the plan stays), the hold scaled into cross_hold
        frac = (span - min(0.5, bound / 2)) / max(bound * 0.999 - min(0.5, bound / 2), 1e-9)
        span = round(cross_hold[0] + min(max(frac, 0.0), 1.0) * (cross_hold[1] - cross_hold[0]), 3)
    return {"hold": span, "targets": targets, "mode": mode}


# ------------------------------------------------------------ paths
def path_timeline(intervals: Iterable[Tuple[float, float, int, int, str]], hosts: int, rails: int,
                  t_end: Optional[float] = None, relay: bool = False,
                  settle: float = 0.0) -> List[Tuple[float, float, str]]:
    """``(t0, t1, state)`` pieces: ``clean`` when every pair of hosts shares a rail that is up and
    not lossy on both ends, ``degraded`` when some pair shares only lossy rails, ``no_path``
    when some pair shares no usable rail at all. With ``relay``, a no-path that a third host can
    bridge is ``relayable`` (see :func:`relay_possible`): ``no_path`` is then only what no relay
    helps, and a stretch with both a degraded pair and a relayable one is ``degraded``. A rail
    repaired less than ``settle`` s ago carries a pair's own traffic but no relay yet (its links
    are being re-opened). Pieces between changes; adjacent equal states merge."""
    out: List[Tuple[float, float, str]] = []
    for a, b, down in _pieces(intervals, t_end, settle if relay else 0.0):
        state = _cluster_state(down, hosts, rails, relay)
        if out and out[-1][2] == state and abs(out[-1][1] - a) < 1e-12:
            out[-1] = (out[-1][0], b, state)
        else:
            out.append((a, b, state))
    return out


def _pieces(intervals: Iterable[Tuple[float, float, int, int, str]], t_end: Optional[float], settle: float = 0.0):
    """``(a, b, {(host, rail): mechanisms})`` between every change of the intervals; a NIC repaired less
    than ``settle`` s before holds the pseudo-mechanism ``settling``. A sweep over the sorted changes, so
    an hour of faults costs seconds, not minutes."""
    ivs = [iv for iv in intervals if iv[1] > iv[0]]
    if settle > 0:
        ivs += [(t1, t1 + settle, h, r, "settling") for t0, t1, h, r, m in ivs]
    edges = sorted({t for iv in ivs for t in iv[:2]} | ({t_end} if t_end is not None else set()))
    starts = sorted(ivs, key=lambda iv: iv[0])
    ends = sorted(ivs, key=lambda iv: iv[1])
    active: Dict[Tuple[int, int, str], int] = {}
    i = j = 0
    for a, b in zip(edges, edges[1:]):
        # in effect on [a, b): began at or before a, ends after a (no change falls strictly inside)
        while i < len(starts) and starts[i][0] <= a:
            key = (starts[i][2], starts[i][3], starts[i][4])
            active[key] = active.get(key, 0) + 1
            i += 1
        while j < len(ends) and ends[j][1] <= a:
            key = (ends[j][2], ends[j][3], ends[j][4])
            active[key] -= 1
            if not active[key]:
                del active[key]
            j += 1
        down: Dict[Target, set] = {}
        for (h, r, mech) in active:
            down.setdefault((h, r), set()).add(mech)
        yield a, b, down


def _rail_state(down: Mapping[Target, set], h: int, r: int) -> str:
    """``down``, ``lossy``, ``settling`` (repaired a moment ago: usable, links re-opening) or ``up``."""
    m = down.get((h, r), set())
    if m & {"cut", "blackhole"}:
        return "down"
    if "lossy" in m:
        return "lossy"
    return "settling" if m else "up"


def _pair_state(down: Mapping[Target, set], a: int, b: int, rails: int) -> str:
    """``clean``, ``degraded`` (only lossy rails in common) or ``no_path`` for one pair of hosts."""
    ok = ("up", "settling")
    states = [(_rail_state(down, a, r), _rail_state(down, b, r)) for r in range(rails)]
    if any(x in ok and y in ok for x, y in states):
        return "clean"
    if any("down" not in (x, y) for x, y in states):
        return "degraded"
    return "no_path"


def relay_possible(down: Mapping[Target, set], a: int, b: int, hosts: int, rails: int) -> bool:
    """Could a third host bridge hosts ``a`` and ``b``: each of them keeps a clean rail (not settling), and
    some other host has every rail clean (so it reaches both, whatever rail each kept)?"""
    if not any(_rail_state(down, a, r) == "up" for r in range(rails)):
        return False
    if not any(_rail_state(down, b, r) == "up" for r in range(rails)):
        return False
    return any(all(_rail_state(down, c, r) == "up" for r in range(rails))
               for c in range(hosts) if c not in (a, b))


def _cluster_state(down: Mapping[Target, set], hosts: int, rails: int, relay: bool = False) -> str:
    worst = "clean"
    for a in range(hosts):
        for b in range(a + 1, hosts):
            st = _pair_state(down, a, b, rails)
            if st == "clean":
                continue
            if st == "degraded":
                worst = "degraded"
            elif relay and relay_possible(down, a, b, hosts, rails):
                worst = "relayable" if worst == "clean" else worst
            else:
                return "no_path"
    return worst


def unrelayable_stretches(intervals: Iterable[Tuple[float, float, int, int, str]], hosts: int, rails: int,
                          t_end: Optional[float] = None,
                          settle: float = 0.0) -> Dict[Tuple[int, int], List[Tuple[float, float]]]:
    """Per pair of hosts, the stretches in which it has no usable rail in common and no third host could
    relay for it (merged when adjacent): how long its ranks must wait for a repair, at most, under
    these faults. What a no-path deadline must outlast for the job to live through them."""
    out: Dict[Tuple[int, int], List[Tuple[float, float]]] = {}
    for a_t, b_t, down in _pieces(intervals, t_end, settle):
        for a in range(hosts):
            for b in range(a + 1, hosts):
                if _pair_state(down, a, b, rails) != "no_path" or relay_possible(down, a, b, hosts, rails):
                    continue
                lst = out.setdefault((a, b), [])
                if lst and abs(lst[-1][1] - a_t) < 1e-9:
                    lst[-1] = (lst[-1][0], b_t)
                else:
                    lst.append((a_t, b_t))
    return out


__all__ = ["Fault", "Schedule", "Step", "ScheduleError", "UnsupportedFault", "random_schedule", "scripted",
           "concatenate", "path_timeline", "relay_possible", "unrelayable_stretches", "KINDS", "MECHANISMS",
           "DOWN_MODES", "ISOLATE_BOUND"]
