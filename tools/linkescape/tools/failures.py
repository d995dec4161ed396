"""Faults: drawn from the model's rates, or read from an operator's failure log.

A fault takes one rail of ``span`` consecutive hosts from ``host`` on (``rail``), or every
rail of them (``rail`` None), at ``t`` hours into the run, until ``repair`` hours later.
``kind`` is a network cause (nic, cable, optic, switch) or ``other`` (not the network:
it interrupts the job whatever the library does).

The log is CSV with a header naming the columns cause, start, repair time, host, rail
(spelling and order free: ``repair_hours``, ``Repair time``, ``mttr`` all name the repair).
``start``: hours since the run began, or a date and time (then hours since the earliest);
``repair``: hours, or a number with a unit (``90s``, ``30min``, ``4h``, ``1d``) or ``H:MM[:SS]``;
``host``: a number or a name; ``rail``: a number, a name ending in one (``eth1``), or empty /
``all`` / ``*`` for every rail. Causes are recognised by words: NIC / network interface, cable /
link / optic / transceiver, switch / ToR / leaf; anything else is ``other``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from ..common.errors import UsageError
from .model import CAUSES, SimParams


@dataclass(frozen=True)
class Failure:
    t: float
    host: int
    kind: str
    rail: Optional[int] = 0
    repair: float = 0.0
    span: int = 1

    @property
    def network(self) -> bool:
        return self.kind in CAUSES

    def hosts(self) -> range:
        return range(self.host, self.host + self.span)


def repair_draws(p: SimParams, cause: str, k: int, rng) -> List[float]:
    """``k`` repair times from the cause's mix (:meth:`SimParams.repair_mix`)."""
    mix = p.repair_mix(cause)
    if len(mix) == 1 and not mix[0][2]:
        return [mix[0][1]] * k
    u = rng.random(k)
    out = []
    for x in u:
        acc = 0.0
        for share, hours, expo in mix:
            acc += share
            if x < acc or (share, hours, expo) == mix[-1]:
                out.append(float(rng.exponential(hours)) if expo and hours > 0 else hours)
                break
    return out


def draw_faults(p: SimParams, rng) -> List[Failure]:
    """One schedule of faults over the run, sorted by time."""
    T = p.hours
    out: List[Failure] = []
    for cause in CAUSES:
        k = int(rng.poisson(p.events_per_hour(cause) * T))
        span = p.span if cause == "switch" else 1
        times = rng.uniform(0.0, T, k)
        hosts = rng.integers(0, p.hosts - span + 1, k)
        rails = rng.integers(0, p.rails, k)
        whole = rng.random(k) < p.whole_host_share
        every = p.fabric.scope(cause) == "host"
        reps = repair_draws(p, cause, k, rng)
        for t, h, r, w, rep in zip(times, hosts, rails, whole, reps):
            out.append(Failure(float(t), int(h), cause, None if (every or w) else int(r), float(rep), span))
    k = int(rng.poisson(p.events_per_hour("other") * T))
    for t, h in zip(rng.uniform(0.0, T, k), rng.integers(0, p.hosts, k)):
        out.append(Failure(float(t), int(h), "other", None, 0.0))
    out.sort(key=lambda f: f.t)
    return out


# ------------------------------------------------------------------ the operator's log
_COLUMNS = {
    "cause": ("cause", "kind", "type", "category", "reason", "component"),
    "start": ("start", "start_time", "start_hours", "start_h", "time", "t", "at", "timestamp", "begin",
              "started", "start_s", "start_seconds"),
    "repair": ("repair", "repair_time", "repair_hours", "repair_h", "mttr", "duration", "repair_s",
               "repair_seconds", "repaired_after", "time_to_repair"),
    "host": ("host", "hostname", "node", "server", "host_id"),
    "rail": ("rail", "nic", "port", "interface", "rail_id", "iface"),
}
_UNITS = {"s": 1 / 3600, "sec": 1 / 3600, "secs": 1 / 3600, "second": 1 / 3600, "seconds": 1 / 3600,
          "m": 1 / 60, "min": 1 / 60, "mins": 1 / 60, "minute": 1 / 60, "minutes": 1 / 60,
          "h": 1.0, "hr": 1.0, "hrs": 1.0, "hour": 1.0, "hours": 1.0, "d": 24.0, "day": 24.0, "days": 24.0}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")


def classify(cause: str) -> str:
    c = cause.strip().lower()
    if re.search(r"\bnic\b|network interface|\bhca\b|adapter", c):
        return "nic"
    if re.search(r"switch|\btor\b|\bleaf\b|\bspine\b", c):
        return "switch"
    if re.search(r"optic|transceiver|module", c):
        return "optic"
    if re.search(r"cable|\blink\b|fiber|fibre|\bdac\b|\baoc\b", c):
        return "cable"
    return "other"


def _duration(text: str, unit: float, what: str) -> float:
    s = text.strip().lower()
    if not s:
        return 0.0
    m = re.fullmatch(r"(\d+):(\d{1,2})(?::(\d{1,2}(?:\.\d*)?))?", s)
    if m:
        return int(m.group(1)) + int(m.group(2)) / 60 + float(m.group(3) or 0) / 3600
    m = re.fullmatch(r"([-+]?\d*\.?\d+(?:e[-+]?\d+)?)\s*([a-z]*)", s)
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        raise UsageError(f"{what}: cannot read {text!r} as a duration (hours, or 90s, 30min, 4h, 1d, H:MM)")
    return float(m.group(1)) * (_UNITS[m.group(2)] if m.group(2) else unit)


def _when(text: str, unit: float) -> Tuple[Optional[float], Optional[_dt.datetime]]:
    try:
        return _duration(text, unit, "start"), None
    except UsageError:
        pass
    try:
        return None, _dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("/", "-"))
    except ValueError:
        raise UsageError(f"start: cannot read {text!r} as hours or a date and time") from None


def _unit_of(header: str) -> float:
    h = _norm(header)
    return 1 / 3600 if h.endswith(("_s", "seconds", "secs")) else 1 / 60 if h.endswith(("_min", "minutes")) else 1.0


def _columns(header: List[str]) -> Dict[str, int]:
    idx: Dict[str, int] = {}
    names = [_norm(h) for h in header]
    for key, aliases in _COLUMNS.items():
        for i, n in enumerate(names):
            if n in aliases and i not in idx.values():
                idx[key] = i
                break
    missing = [k for k in ("cause", "start", "host") if k not in idx]
    if missing:
        raise UsageError(f"failure log: no column for {', '.join(missing)} (header: {', '.join(header)}); "
                         "expected cause, start, repair time, host, rail")
    return idx


def _index(value: str, seen: Dict[str, int]) -> int:
    v = value.strip()
    if re.fullmatch(r"\d+", v):
        return int(v)
    return seen.setdefault(v, len(seen))


def _rail(value: str, rails: Dict[str, int]) -> Optional[int]:
    v = value.strip().lower()
    if v in ("", "all", "*", "-", "any", "none", "every", "host"):
        return None
    m = re.search(r"(\d+)$", v)
    return int(m.group(1)) if m else rails.setdefault(v, len(rails))


def read_failure_log(path: str) -> Tuple[List[Failure], Dict[str, Any]]:
    """The faults of an operator's CSV log, and what was read (rows, causes, hosts, span)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r) and not r[0].startswith("#")]
    except OSError as exc:
        raise UsageError(f"failure log: {exc}") from None
    if len(rows) < 2:
        raise UsageError(f"failure log {path}: a header and at least one row are needed")
    header, body = rows[0], rows[1:]
    col = _columns(header)
    s_unit = _unit_of(header[col["start"]])
    r_unit = _unit_of(header[col["repair"]]) if "repair" in col else 1.0
    hosts: Dict[str, int] = {}
    rails: Dict[str, int] = {}
    raw = []
    for n, row in enumerate(body, 2):
        cell = lambda k: row[col[k]] if k in col and col[k] < len(row) else ""  # noqa: E731
        try:
            rel, stamp = _when(cell("start"), s_unit)
            rep = _duration(cell("repair"), r_unit, "repair")
        except UsageError as exc:
            raise UsageError(f"failure log line {n}: {exc}") from None
        raw.append((rel, stamp, classify(cell("cause")), _index(cell("host"), hosts), _rail(cell("rail"), rails), rep,
                    cell("cause").strip()))
    stamps = [s for _, s, *_ in raw if s is not None]
    if stamps and len(stamps) != len(raw):
        raise UsageError("failure log: start is a date on some rows and a number on others")
    t0 = min(stamps) if stamps else None
    faults = []
    for rel, stamp, kind, host, rail, rep, _ in raw:
        t = rel if stamp is None else (stamp - t0).total_seconds() / 3600.0
        faults.append(Failure(float(t), host, kind, None if kind == "other" else rail, rep if kind != "other" else 0.0))
    faults.sort(key=lambda f: f.t)
    info = {"path": path, "rows": len(faults), "hosts": 1 + max(f.host for f in faults),
            "max_rail": max((f.rail for f in faults if f.rail is not None), default=-1),
            "by_cause": {k: sum(1 for f in faults if f.kind == k) for k in (*CAUSES, "other")},
            "last_hours": max(f.t + f.repair for f in faults), "dated": bool(stamps)}
    return faults, info


def fit_to_log(p: SimParams, faults: List[Failure], info: Dict[str, Any], days_given: bool) -> SimParams:
    """The inputs a replay runs on: the cluster grown to the log's hosts, the run as long as the
    log unless ``--days`` was given, and (unless one was given) the Young/Daly interval for the
    log's own mean time between faults."""
    if info["max_rail"] >= p.rails:
        raise UsageError(f"failure log: rail {info['max_rail']} but --rails {p.rails}")
    gpus = max(p.gpus, info["hosts"] * p.gpus_per_host)
    days = p.days if days_given else max(1.0, math.ceil(info["last_hours"] / 24.0))
    q = replace(p, gpus=gpus, days=float(days))
    if p.checkpoint_hours is None:
        n = sum(1 for f in faults if f.t < q.hours)
        info["mtbf_hours"] = mtbf = q.hours / n if n else q.hours
        q = replace(q, checkpoint_hours=max(math.sqrt(2.0 * q.write_hours * mtbf), 1e-4))
    return q


def rates_of_log(p: SimParams, faults: List[Failure]) -> SimParams:
    """The model's inputs at the log's own rates (per component and day), for its closed form:
    every fault of one rail as the log has it, the others as faults of every rail."""
    net = [f for f in faults if f.network and f.t < p.hours]
    count = {c: sum(1 for f in net if f.kind == c) for c in CAUSES}
    per = {c: count[c] / (p.components(c) * p.days) for c in CAUSES}
    other = sum(1 for f in faults if f.kind == "other" and f.t < p.hours) / (p.gpus * p.days)
    whole = sum(1 for f in net if f.rail is None) / len(net) if net else 0.0
    return replace(p, coverage="rail-optimized", whole_host_share=whole, flap_share=0.0, reboot_share=0.0,
                   nic_per_day=per["nic"],
                   cable_per_day=per["cable"], optic_per_day=per["optic"], switch_per_day=per["switch"],
                   other_per_gpu_day=other, hosts_per_switch=1)


__all__ = ["Failure", "draw_faults", "repair_draws", "read_failure_log", "fit_to_log", "rates_of_log", "classify"]
