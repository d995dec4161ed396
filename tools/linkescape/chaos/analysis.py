"""What a chaos run found: stalls against their bounds, detection latency, false trips.

Definitions (the report repeats them):

* **step**: one unit of the workload on one rank (one op, a burst, a ring, a
  barrier, or the all_reduce of the stop flag after every 4th step), from its
  first call (``t0``) to its last completion (``t1``).
* **normal time** of a step: the median duration of *quiet* steps of the same
  class (step kind, operations, size within a factor of 2) -- steps with no
  fault within 0.5 s and no repair in the 3 s before them -- or the time its
  bytes take on one rail at the line rate, whichever is longer.
* **start** of a step on a rank: its first call, or the latest first call of
  the ranks it cannot complete without (``waits`` in the step's record: every
  rank for a symmetric collective, the root for the others of a rooted one, the
  sender in a ring), whichever is later (and no later than its end). Until then
  the rank waits for a rank that is still busy with its own work (checking a
  4 MB result took one rank 270 ms on 2 shared cores while the others waited
  in the next step), not for the library: a late rank's own step shows any stall
  of the library that made it late.
* **stall** of a step: its end minus its start, minus its normal time: how long
  it was outstanding beyond normal. The *longest stall* is the largest over
  every rank and step.
* **bounds** (issue 7), per step, from the cluster's path state while it ran
  (computed from the faults as really applied, see
  :func:`~linkescape.faults.schedule.path_timeline`):

  - *path left* (every pair of hosts kept a clean rail): the stall must not
    exceed 100 ms plus the detection time of every fault that began during the
    step, and what was left at its start of the detection of faults that began
    before it: cut/flap by carrier ``CUT_DETECT`` s, blackhole by silence
    (silent timeout + one heartbeat + a 10 ms tick), lossy by grey-failure
    detection ``LOSSY_DETECT`` s. With no fault at all: 100 ms. A link idle
    when its NIC was blackholed is found only once it is used (no link is
    heartbeated for nothing: issue 22), so while some link of a blackholed NIC
    is still up at both ends (:func:`nic_in_use`), a step may take a whole
    silent detection from its own start (seed 1, 60 s: a pair idle 300 ms
    into a blackhole of one of its NICs, then found 200 ms after its first
    send, while the others of that NIC had been left at once).
  - *lossy path left*: a lossy NIC was in use (some link of it was up at both
    ends: not yet left, or re-opened while the NIC was still lossy) while every pair kept a clean rail: TCP itself
    stalls on the lossy path until the library leaves it, so the bound is
    100 ms + ``LOSSY_DETECT`` (+ the detection of other faults).
  - *relayable* (some pair had no rail in common, but a third host could
    relay for every such pair: each of the two kept a clean rail and another
    host had every rail clean, repaired at least ``RELAY_SETTLE`` s ago; see
    :func:`~linkescape.faults.schedule.relay_possible`): the library must go
    on through the relay, so the stall must not exceed 100 ms + the detection
    time (as for *path left*) + ``RELAY_SETUP`` (1 s: the relay is tried
    within a timer round of the no-path and confirmed by the first frame back).
    Also for steps that start within 1.5 s after such a stretch
    (*after_relayable*).
  - *no path* (some pair had no usable rail and no relay) or *degraded* (its
    only rails were lossy): the step must end at most 1.5 s (+ its normal
    time, + the detection of faults that began after the path returned) after
    every pair has a clean rail again (or a relay). A step that ends while the
    outage lasts meets its bound.

* **noise**: the *baseline* steps (no fault within 0.5 s, or after a repair
  that the library did nothing about) show what the machine does on its own;
  on 2 cores with 4 ranks they stall for up to ~100 ms by scheduling alone.
  A judged step violates its bound only when its stall exceeds the bound plus
  the run's noise allowance: the ``1 - 1/N`` quantile of the same run's
  baseline stalls for N judged steps (what scheduling alone reaches about once
  among them; at least the p99, at most the maximum), once ``MIN_BASELINE``
  baseline steps measure it. The *warm-up* (steps that start before a part's
  plan begins, while the ranks' first steps share the cores with the
  controller's set-up: a scatter of seed 233 took 0.9 s then) is neither
  judged nor baseline. The allowance, the baseline's p50/p99/max, and the
  raw count of steps beyond the bound alone are all in the result.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..faults.measure import first_event, summarize
from ..faults.schedule import (Schedule, _pair_state, _pieces, path_timeline, relay_possible,
                               unrelayable_stretches)

CUT_DETECT = 0.010  # "a few ms" for a carrier loss, with slack for this loaded machine's scheduling
#: grey failure (issue 7): goodput below half the healthy rate for 1 s, sampled every 100 ms, so a lossy
#: rail is found degraded 1.0-1.5 s after it turned lossy (or earlier, by silence)
LOSSY_DETECT = 1.5
STALL_SLACK = 0.100  # issue 7: detection time + 100 ms
#: the run's own noise (the p99 of its baseline stalls) is added to every bound once this many baseline
#: steps measure it; with fewer, the bounds are judged as they are
MIN_BASELINE = 50
NOISE_PERCENTILE = 99.0
NO_PATH_RESUME = 1.5  # issue 7: at most 1.5 s after a path returns
#: issue 16: a pair with no common rail goes on through a relay within this of the no-path (tried within a
#: timer round, confirmed by the first frame back through it)
RELAY_SETUP = 1.0
#: a host counts as a relay only this long after its last repair (its links re-dialed: back-off <= 0.5 s)
RELAY_SETTLE = 1.0
TICK = 0.010  # the engine's timer tick
QUIET_BEFORE_REPAIR = 3.0  # failback (hold-down 1 s + re-dial) happens within this after a repair
DOWN_EVENTS = ("link_down", "failover")

Interval = Tuple[float, float, int, int, str]


def detect_time(mechanism: str, silent: float, heartbeat: float) -> float:
    """How long the library may take to notice a fault made by ``mechanism``: a carrier loss at once, a
    blackhole by silence (silent timeout + a heartbeat + a tick), a lossy rail by its goodput."""
    if mechanism == "cut":
        return CUT_DETECT
    if mechanism == "lossy":
        return LOSSY_DETECT
    return silent + heartbeat + TICK


# ------------------------------------------------------------ normal times
def wire_bytes(kind: str, nbytes: int, world: int) -> float:
    """Bytes the busiest rank puts on one rail for one op of ``nbytes`` (its largest buffer)."""
    n = world
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n * nbytes
    if kind in ("broadcast", "reduce"):
        return math.ceil(math.log2(n)) * nbytes
    if kind == "ring":
        return float(nbytes)
    return 0.0


def _class(rec: Mapping[str, Any]) -> Tuple:
    total = sum(b for _, _, b in rec["ops"])
    bucket = int(math.log2(max(total, 1)))
    names = tuple(sorted(o for o, _, _ in rec["ops"])) if rec["kind"] == "op" else ()
    return (rec["kind"], names, bucket)


class Spans:
    """Fast "does any interval overlap [a, b]" over many intervals (sorted starts, running max of ends)."""

    def __init__(self, ivs: Iterable[Tuple[float, float]]) -> None:
        pairs = sorted((float(a), float(b)) for a, b in ivs)
        self.starts = np.array([a for a, _ in pairs])
        self.max_end = np.maximum.accumulate(np.array([b for _, b in pairs])) if pairs else np.zeros(0)
        self.ends = np.sort(np.array([b for _, b in pairs]))

    def overlaps(self, a: float, b: float) -> bool:
        i = int(np.searchsorted(self.starts, b, side="left"))
        return i > 0 and self.max_end[i - 1] > a

    def ends_within(self, a: float, b: float) -> bool:
        i = int(np.searchsorted(self.ends, a, side="left"))
        return i < len(self.ends) and self.ends[i] <= b


def normal_times(steps: Mapping[int, Sequence[Mapping[str, Any]]], intervals: Sequence[Interval], world: int,
                 rate_bps: float) -> Dict[Tuple, float]:
    """Median duration of quiet steps per class."""
    spans = Spans((iv[0], iv[1]) for iv in intervals)
    by_class: Dict[Tuple, List[float]] = {}
    for recs in steps.values():
        for rec in recs:
            t0, t1 = rec.get("start", rec["t0"]), rec["t1"]
            if spans.overlaps(t0 - 0.5, t1 + 0.5) or spans.ends_within(t0 - QUIET_BEFORE_REPAIR, t1):
                continue
            by_class.setdefault(_class(rec), []).append(t1 - t0)
    return {c: float(np.median(v)) for c, v in by_class.items() if len(v) >= 3}


def normal_of(rec: Mapping[str, Any], normals: Mapping[Tuple, float], world: int, rate_bps: float) -> float:
    wire = sum(wire_bytes(o, b, world) for o, _, b in rec["ops"]) * 8.0 / rate_bps
    return max(wire, normals.get(_class(rec), 0.0))


# ------------------------------------------------------------ stalls and bounds
def fault_onsets(runner_log: Sequence[Mapping[str, Any]]) -> List[Tuple[float, str, int]]:
    """(ts, mechanism, fault id) of every change that took a NIC down or made it lossy."""
    return sorted((r["ts"], r["mechanism"], r["fault"]) for r in runner_log
                  if r["action"] == "apply" and r.get("ts") is not None and not r.get("error"))


def with_starts(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> Dict[int, List[Dict[str, Any]]]:
    """The steps, each with its ``start`` (see the module doc): the latest first call among the
    rank's own and those of the ranks in its ``waits`` (a record without ``waits``: its own)."""
    def parts(recs):  # (part, where, record): a run of several parts starts each with step 0 again
        part, last = 0, -1
        for rec in recs:
            where = 2 * rec["k"] + (rec["kind"] == "stop")  # (the stop flag's all_reduce follows its step)
            if where <= last:
                part += 1
            last = where
            yield part, where, rec

    called: Dict[Tuple[int, int, int], float] = {(part, rank, where): rec["t0"] for rank, recs in steps.items()
                                                 for part, where, rec in parts(recs)}
    out: Dict[int, List[Dict[str, Any]]] = {}
    for rank, recs in steps.items():
        mine = out[rank] = []
        for part, where, rec in parts(recs):
            t0 = rec["t0"]
            start = max([t0] + [called[(part, w, where)] for w in rec.get("waits") or () if (part, w, where) in called])
            mine.append({**rec, "start": min(start, rec["t1"])})
    return out


def stalls(steps: Mapping[int, Sequence[Mapping[str, Any]]], intervals: Sequence[Interval],
           runner_log: Sequence[Mapping[str, Any]], schedule: Schedule, *, world: int, rate_bps: float,
           silent: float, heartbeat: float, t_end: float, tcp: Sequence[Sequence[Any]] = (),
           events: Optional[Mapping[int, Sequence[Mapping[str, Any]]]] = None,
           warm_up: Sequence[Tuple[float, float]] = ()) -> Dict[str, Any]:
    """Every step's stall, its condition and bound; the longest stall and every violation.
    ``warm_up``: (from, to) stretches, each a part's start until its plan's offset 0: steps that
    start then are neither judged nor the baseline (``warm_up``)."""
    steps = with_starts(steps)
    normals = normal_times(steps, intervals, world, rate_bps)
    timeline = [p for p in path_timeline(intervals, schedule.hosts, schedule.rails, t_end=t_end, relay=True,
                                         settle=RELAY_SETTLE) if p[2] != "clean"]
    onsets = fault_onsets(runner_log)
    ctx = _Context(timeline, onsets, Spans((iv[0], iv[1]) for iv in intervals), silent, heartbeat)
    ctx.returns = Spans((e["ts"], e["ts"]) for evs in (events or {}).values() for e in evs
                        if e.get("event") in ("failback", "link_up"))
    ctx.lossy = Spans(lossy_in_use(intervals, events or {}, world))
    ctx.silent = Spans(nic_in_use(intervals, events or {}, world, "blackhole"))
    spans = fault_spans(runner_log)
    rows: List[Dict[str, Any]] = []
    for rank, recs in steps.items():
        for rec in recs:
            row = _judge(rank, rec, normals, ctx, world, rate_bps)
            if any(a <= row["start"] < b for a, b in warm_up):
                row.update(condition="warm_up", bound=None, violation=False)
            rows.append(row)
    noise = baseline_noise(rows, sum(1 for r in rows if judged(r["condition"]) and r.get("bound") is not None))
    for r in rows:
        if r.get("bound") is None:
            continue
        r["beyond_bound"] = r["stall"] > r["bound"]
        if judged(r["condition"]):
            r["allowance"] = noise["allowance_s"]
            r["violation"] = r["stall"] > r["bound"] + noise["allowance_s"]
    rows.sort(key=lambda r: -r["stall"])
    for r in rows[:50] + [x for x in rows if x["violation"]][:50]:
        r["faults"] = labels(schedule, spans, r["t0"], r["t1"])
        if tcp:
            r["tcp"] = tcp_between(tcp, r["t0"], r["t1"])
    by_cond: Dict[str, Dict[str, Any]] = {}
    for r in rows:
        c = by_cond.setdefault(r["condition"], {"steps": 0, "violations": 0, "longest_stall_s": 0.0})
        c["steps"] += 1
        c["violations"] += int(r["violation"])
        c["longest_stall_s"] = max(c["longest_stall_s"], r["stall"])
    viol = [r for r in rows if r["violation"] and judged(r["condition"])]
    viol.sort(key=lambda r: -(r["stall"] - r["bound"] - r.get("allowance", 0.0)))
    raw = [r for r in rows if r.get("beyond_bound") and judged(r["condition"])]
    base = [r for r in rows if baseline(r["condition"])]
    judged_rows = [r for r in rows if judged(r["condition"])]
    return {"longest": judged_rows[0] if judged_rows else None, "baseline_longest": base[0] if base else None,
            "baseline_over_100ms": sum(1 for r in base if r["violation"]),
            "violations": viol[:50], "violation_count": len(viol),
            "beyond_bound_count": len(raw), "noise": noise,
            "by_condition": by_cond, "normals": len(normals), "top": rows[:10],
            "gaps": _completion_gaps(steps)}


def baseline_noise(rows: Sequence[Mapping[str, Any]], judged_steps: int = 0) -> Dict[str, Any]:
    """The run's own stalls where no fault acts (the baseline): on a shared, oversubscribed machine
    (4 ranks on 2 cores here) steps stall for scheduling alone. A bound cannot be judged below that.

    Among ``judged_steps`` steps, scheduling alone reaches the ``1 - 1/judged_steps`` quantile of the
    noise about once, so that quantile of the baseline stalls (at least their p99, at most their
    maximum) is added to every bound; a p99 alone would fail about 1 % of the judged steps on noise.
    With fewer than :data:`MIN_BASELINE` baseline steps nothing is added."""
    stalls = np.array([r["stall"] for r in rows if baseline(r["condition"])], float)
    q = max(NOISE_PERCENTILE, 100.0 * (1.0 - 1.0 / judged_steps)) if judged_steps else NOISE_PERCENTILE
    out: Dict[str, Any] = {"baseline_steps": int(stalls.size), "judged_steps": judged_steps,
                           "min_baseline": MIN_BASELINE, "percentile": q, "allowance_s": 0.0}
    if stalls.size:
        out.update(p50_s=float(np.median(stalls)), p99_s=float(np.percentile(stalls, 99.0)),
                   max_s=float(stalls.max()))
        if stalls.size >= MIN_BASELINE:
            out["allowance_s"] = float(np.percentile(stalls, q))
    return out


def lossy_in_use(intervals: Sequence[Interval], events: Mapping[int, Sequence[Mapping[str, Any]]],
                 world: int) -> List[Tuple[float, float]]:
    """The stretches in which a lossy NIC (as applied) still carried traffic (:func:`nic_in_use`): TCP
    crawls on a link re-opened while the NIC is still lossy (after a cut of it, say) until the library
    leaves it once more."""
    return nic_in_use(intervals, events, world, "lossy")


def nic_in_use(intervals: Sequence[Interval], events: Mapping[int, Sequence[Mapping[str, Any]]],
               world: int, mechanism: str) -> List[Tuple[float, float]]:
    """The stretches in which a NIC that ``mechanism`` (as applied) made lossy or silent still had a link
    the library had not left: some link of it (host h to another rank, on its rail; hosts are ranks) was
    up at both ends. A link is left from a ``link_down`` at either end until that end's next ``link_up``."""
    trail: Dict[Tuple[int, int, int], Tuple[List[float], List[bool]]] = {}
    for rank, evs in events.items():
        for e in evs:
            if e.get("event") in ("link_down", "link_up") and e.get("ts") is not None:
                ts, down = trail.setdefault((int(rank), int(e.get("peer", -1)), int(e.get("rail", -1))), ([], []))
                ts.append(float(e["ts"]))
                down.append(e["event"] == "link_down")
    for ts, down in trail.values():
        order = sorted(range(len(ts)), key=ts.__getitem__)
        ts[:], down[:] = [ts[i] for i in order], [down[i] for i in order]

    def left(rank: int, peer: int, rail: int, t0: float, t1: float) -> List[Tuple[float, float]]:
        ts, down = trail.get((rank, peer, rail), ([], []))
        i = int(np.searchsorted(ts, t0, side="right"))
        out, since = [], (t0 if i and down[i - 1] else None)
        for t, d in zip(ts[i:], down[i:]):
            if t >= t1:
                break
            if d and since is None:
                since = t
            elif not d and since is not None:
                out.append((since, t))
                since = None
        if since is not None:
            out.append((since, t1))
        return out

    out: List[Tuple[float, float]] = []
    for t0, t1, h, r, mech in intervals:
        if mech != mechanism:
            continue
        for p in range(world):
            if p == h:
                continue
            gaps = sorted(left(h, p, r, t0 - 0.05, t1) + left(p, h, r, t0 - 0.05, t1))
            at = t0
            for a, b in gaps:
                if a > at:
                    out.append((at, a))
                at = max(at, b)
            if at < t1:
                out.append((at, t1))
    return out


class _Context:
    """The path outages and fault onsets of a run, searchable by time."""

    def __init__(self, timeline, onsets, spans: Spans, silent: float, heartbeat: float) -> None:
        self.timeline = timeline  # disjoint, sorted (t0, t1, state) that are not clean
        self.t_starts = np.array([p[0] for p in timeline])
        self.t_ends = np.array([p[1] for p in timeline])
        self.on_ts = np.array([o[0] for o in onsets])
        self.on_det = np.array([detect_time(o[1], silent, heartbeat) for o in onsets])
        self.on_lossy = np.array([o[1] == "lossy" for o in onsets], bool)
        self.spans = spans
        self.max_det = max([silent + heartbeat + TICK, CUT_DETECT, LOSSY_DETECT])
        self.returns = Spans(())  # failback and link_up events
        self.lossy = Spans(())  # when a lossy NIC still carried traffic (:func:`lossy_in_use`)
        self.silent = Spans(())  # when a blackholed NIC still had a link not left (:func:`nic_in_use`)
        self.silent_det = detect_time("blackhole", silent, heartbeat)

    def outages(self, a: float, b: float) -> List[Tuple[float, float, str]]:
        lo = int(np.searchsorted(self.t_ends, a, side="right"))
        hi = int(np.searchsorted(self.t_starts, b, side="left"))
        return self.timeline[lo:hi]

    def detection_in(self, a: float, b: float, lead: bool) -> float:
        """Sum of the detection times of the faults that began in [a, b], and (with ``lead``) what is
        left at ``a`` of the detection of those that began before it."""
        lo = int(np.searchsorted(self.on_ts, a - (self.max_det if lead else 0.0), side="left"))
        hi = int(np.searchsorted(self.on_ts, b, side="right"))
        ts, det = self.on_ts[lo:hi], self.on_det[lo:hi]
        if not lead:
            return float(det[ts >= a].sum())
        left = np.where(ts >= a, det, ts + det - a)
        return float(left[left > 0].sum())

    def lossy_undetected(self, a: float, b: float) -> bool:
        """A lossy NIC carried traffic during [a, b] before the library had left it on every link."""
        return self.lossy.overlaps(a, b)


def _judge(rank: int, rec: Mapping[str, Any], normals, ctx: _Context, world, rate_bps) -> Dict[str, Any]:
    # (from the step's start: the last call it waits for; its bound and faults from then on too)
    called, t0, t1 = rec["t0"], rec.get("start", rec["t0"]), rec["t1"]
    normal = normal_of(rec, normals, world, rate_bps)
    stall = max(0.0, (t1 - t0) - normal)
    row: Dict[str, Any] = {"rank": rank, "k": rec["k"], "kind": rec["kind"], "ops": [o for o, _, _ in rec["ops"]],
                           "bytes": sum(b for _, _, b in rec["ops"]), "t0": called, "start": t0, "t1": t1,
                           "waited": t0 - called, "duration": t1 - called, "normal": normal, "stall": stall,
                           "measured": stall}
    det = ctx.detection_in(t0, t1, lead=True)
    lossy = ctx.lossy_undetected(t0, t1)
    if lossy:
        # TCP itself stalls on a lossy path until the library leaves it: the grey-failure detection time
        # (counted once, from the step's start), not the silent timeout.
        lead_lossy = ctx.detection_in(t0, t1, lead=True) - _lossy_part(ctx, t0, t1)
        det = lead_lossy + LOSSY_DETECT
    if ctx.silent.overlaps(t0, t1):
        # a link of a blackholed NIC not yet left: if it was idle, its detection starts with this step
        det = max(det, ctx.silent_det)
    bound = STALL_SLACK + det
    # An outage during the step, or one that ended less than NO_PATH_RESUME before it (the library
    # may still be re-opening links), allows the step to end up to 1.5 s after the path came back.
    near = ctx.outages(t0 - NO_PATH_RESUME, t1)
    bad = [p for p in near if p[2] != "relayable"]
    relayed = [p for p in near if p[2] == "relayable"]
    if bad:
        t_back = max(p[1] for p in bad)
        worst = "no_path" if any(p[2] == "no_path" for p in bad) else "degraded"
        if t_back >= t1:
            row.update(condition=f"during_{worst}", bound=None, violation=False)
            return row
        during = any(p[0] < t1 and p[1] > t0 for p in bad)
        row["path_back"] = t_back
        row["condition"] = worst if during else f"after_{worst}"
        bound = max(bound, (t_back - t0) + NO_PATH_RESUME + ctx.detection_in(t_back, t1, lead=False))
    elif relayed:
        # no common rail for some pair, but a relay for each: detection + relay set-up, no waiting
        during = any(p[0] < t1 and p[1] > t0 for p in relayed)
        row["condition"] = "relayable" if during else "after_relayable"
        bound += RELAY_SETUP
    elif lossy:
        row["condition"] = "lossy_path_left"
    elif det or ctx.spans.overlaps(t0, t1):
        row["condition"] = "path_left"
    elif ctx.spans.ends_within(t0 - QUIET_BEFORE_REPAIR, t1):
        # A repair in the 3 s before: judged when the library moved traffic back (failback or a link
        # re-opened) during the step; otherwise nothing of the library changed, like a quiet step.
        row["condition"] = "failback" if ctx.returns.ends_within(t0 - 0.2, t1) else "after_repair"
    else:
        row["condition"] = "no_fault"
    row["bound"] = bound
    row["violation"] = stall > bound
    return row


def _lossy_part(ctx: _Context, a: float, b: float) -> float:
    """The part of :meth:`_Context.detection_in` (with lead) that lossy onsets contribute."""
    lo = int(np.searchsorted(ctx.on_ts, a - ctx.max_det, side="left"))
    hi = int(np.searchsorted(ctx.on_ts, b, side="right"))
    ts, det = ctx.on_ts[lo:hi], ctx.on_det[lo:hi]
    lossy = ctx.on_lossy[lo:hi]
    left = np.where(ts >= a, det, ts + det - a)
    return float(left[(left > 0) & lossy].sum())


def tcp_between(tcp: Sequence[Sequence[Any]], a: float, b: float) -> Dict[str, int]:
    """TCP retransmission counters summed over ranks from the last sample before ``a`` to the first after ``b``."""
    if not tcp:
        return {}
    before = [row for row in tcp if row[0] <= a]
    after = [row for row in tcp if row[0] >= b]
    lo = before[-1] if before else tcp[0]
    hi = after[0] if after else tcp[-1]
    out: Dict[str, int] = {}
    for x, y in zip(lo[1], hi[1]):
        if not x or not y:
            continue
        for key in y:
            out[key] = out.get(key, 0) + y[key] - x.get(key, 0)
    return out


#: ``no_fault`` steps (no fault within 0.5 s, no repair in the 3 s before) and ``after_repair`` ones
#: (a repair in the 3 s before, but no failback or re-opened link during the step)
BASELINE = ("no_fault", "after_repair")


def judged(condition: str) -> bool:
    """Whether a step of this condition counts for the verdict: every condition a fault made (not the
    baseline, and not the ``warm_up`` before a part's plan begins)."""
    return condition not in BASELINE and condition != "warm_up"


def baseline(condition: str) -> bool:
    """Whether a step of this condition shows the machine's own noise (see :func:`baseline_noise`)."""
    return condition in BASELINE


# ------------------------------------------------------------ relays
def relay_intervals(events: Mapping[int, Sequence[Mapping[str, Any]]],
                    t_end: float) -> List[Dict[str, Any]]:
    """Every relayed stretch of the trails (per rank): :func:`linkescape.tools.timeline.relay_intervals`."""
    from ..tools.timeline import relay_intervals as stretches

    return stretches([{**e, "rank": rank} for rank, evs in events.items() for e in evs], t_end)


def relays(events: Mapping[int, Sequence[Mapping[str, Any]]], intervals: Sequence[Interval],
           runner_log: Sequence[Mapping[str, Any]], schedule: Schedule, *, t_start: float,
           t_end: float) -> Dict[str, Any]:
    """What the relays did: ``relay_on``/``relay_off`` counts (by cause), pairs relayed, the time relayed
    (per pair of hosts, both directions merged), through which ranks, and per cross fault how long after
    it took effect its pair was relayed (set-up), when a relay was possible then. Also the time in which
    some pair had no path but a relay was possible (``relayable_s``), and the longest stretch a pair had
    neither (``longest_unrelayable_s``: what the no-path deadline must outlast)."""
    ivs = relay_intervals(events, t_end)
    on = sum(1 for evs in events.values() for e in evs if e.get("event") == "relay_on")
    off: Dict[str, int] = {}
    for evs in events.values():
        for e in evs:
            if e.get("event") == "relay_off":
                off[str(e.get("cause"))] = off.get(str(e.get("cause")), 0) + 1
    by_pair: Dict[Tuple[int, int], List[Tuple[float, float]]] = {}
    via: Dict[str, int] = {}
    from ..tools.timeline import union_seconds

    for r in ivs:
        key = tuple(sorted((int(r["rank"]), int(r["peer"]))))
        by_pair.setdefault(key, []).append((r["t_on"], r["t_off"] if r["t_off"] is not None else t_end))
        via[str(r["via"])] = via.get(str(r["via"]), 0) + 1
    pair_s = {f"{a}-{b}": union_seconds(sp) for (a, b), sp in sorted(by_pair.items())}  # both ends merged
    timeline = path_timeline(intervals, schedule.hosts, schedule.rails, t_end=t_end, relay=True, settle=RELAY_SETTLE)
    relayable_s = sum(b - a for a, b, st in timeline if st == "relayable")
    stretches = unrelayable_stretches(intervals, schedule.hosts, schedule.rails, t_end=t_end)
    longest = max(((b - a, p) for p, sp in stretches.items() for a, b in sp), default=(0.0, None))
    setups: List[Optional[float]] = []
    samples = []
    pieces = list(_pieces(intervals, t_end, RELAY_SETTLE))
    applied: Dict[int, float] = {}
    for rec in runner_log:
        if rec.get("action") == "apply" and rec.get("ts") is not None and not rec.get("error"):
            applied.setdefault(int(rec["fault"]), rec["ts"])
    for fid, ts in sorted(applied.items(), key=lambda kv: kv[1]):
        f = schedule.by_id(fid)
        if f.kind != "cross":
            continue
        a, b = f.hosts
        # looked at once a relay should be up (or half-way through a shorter cross)
        look = ts + min(RELAY_SETUP, f.hold / 2.0)
        possible = _pair_relayable(pieces, schedule, a, b, look)
        mine = [r for r in ivs if {int(r["rank"]), int(r["peer"])} == {a, b}]
        first = min((r["t_on"] for r in mine if ts - 0.05 <= r["t_on"] <= ts + f.hold + 1.0), default=None)
        setup = None if first is None else first - ts
        # a pair still relayed from an earlier fault (a flap: the relay hands back only after the
        # rails' hold-down) when the cross comes, and still then: relayed at once (CI's make test,
        # 2026-12-07: relay_after_refusals.json's cross met the relay of the flaps before it)
        if any(r["t_on"] < ts - 0.05 and (r["t_off"] is None or r["t_off"] >= look) for r in mine):
            setup = 0.0
        # a cross shorter than its detection (a blackhole's silence) and the set-up may end unrelayed
        long_enough = f.hold >= RELAY_SETUP + detect_time(f.mode, 0.25, 0.05)
        if possible and long_enough:
            setups.append(setup)
        samples.append({"fault": fid, "hosts": [a, b], "ts": ts, "hold_s": f.hold, "relay_possible": possible,
                        "long_enough": long_enough, "relay_on_s": setup})
    s = _summary(setups)
    return {"relay_on": on, "relay_off": dict(sorted(off.items())), "pairs": len(by_pair),
            "relayed_s": sum(pair_s.values()), "relayed_s_by_pair": pair_s,
            "longest_s": max((r["seconds"] for r in ivs), default=0.0), "via": dict(sorted(via.items())),
            "relayable_s": relayable_s, "longest_unrelayable_s": longest[0],
            "longest_unrelayable_pair": None if longest[1] is None else list(longest[1]),
            "cross_setup": s, "cross_samples": samples, "intervals": ivs[:200]}


def _pair_relayable(pieces, schedule: Schedule, a: int, b: int, t: float) -> bool:
    """At time ``t`` (``pieces`` of :func:`~linkescape.faults.schedule._pieces`): has pair (a, b) no rail
    in common while a relay is possible for it?"""
    import bisect

    i = bisect.bisect_right([p[0] for p in pieces], t) - 1
    if i < 0 or t >= pieces[i][1]:
        return False
    down = pieces[i][2]
    return _pair_state(down, a, b, schedule.rails) == "no_path" and relay_possible(down, a, b, schedule.hosts,
                                                                                   schedule.rails)


def fault_spans(runner_log: Sequence[Mapping[str, Any]]) -> Dict[int, Tuple[float, float]]:
    """Per fault id: wall time of its first change and of its last repair, as applied."""
    out: Dict[int, List[float]] = {}
    for r in runner_log:
        if r.get("ts") is None:
            continue
        span = out.setdefault(int(r["fault"]), [r["ts"], r["ts"]])
        span[0], span[1] = min(span[0], r["ts"]), max(span[1], r["ts"])
    return {k: (v[0], v[1]) for k, v in out.items()}


def labels(schedule: Schedule, spans: Mapping[int, Tuple[float, float]], a: float, b: float) -> List[str]:
    """Labels of the faults that were in effect at some time in ``[a, b]`` (wall times, as applied)."""
    return [schedule.by_id(fid).label for fid, (t0, t1) in sorted(spans.items(), key=lambda kv: kv[1])
            if t0 < b and t1 > a]


def _completion_gaps(steps: Mapping[int, Sequence[Mapping[str, Any]]]) -> Dict[int, Dict[str, float]]:
    """The longest time between two consecutive completions, per rank (the simplest stall measure)."""
    out = {}
    for rank, recs in steps.items():
        t = sorted(r["t1"] for r in recs)
        if len(t) >= 2:
            g = np.diff(t)
            i = int(np.argmax(g))
            out[rank] = {"longest_s": float(g[i]), "after": float(t[i])}
    return out


# ------------------------------------------------------------ detection
def detection(runner_log: Sequence[Mapping[str, Any]], intervals: Sequence[Interval],
              events: Mapping[int, Sequence[Mapping[str, Any]]], schedule: Schedule,
              rank_of_host: Mapping[int, int]) -> Dict[str, Any]:
    """Fault time -> first ``link_down``/``failover`` on the affected links, by fault kind.

    Per (fault, target NIC) whose rail was clean on that host before: *local* is
    the first such event of the host's rank on that rail; *peer* the first of
    each other rank whose own NIC on that rail was clean, for its link to the
    host on that rail. A flap counts its first down. Misses are counted (a 1 %
    lossy rail may never be noticed, by design)."""
    ivs = sorted(intervals)
    per_kind: Dict[str, Dict[str, List[Optional[float]]]] = {}
    samples = []
    seen = set()
    for rec in runner_log:
        if rec["action"] != "apply" or rec.get("error") or rec.get("ts") is None:
            continue
        key = (rec["fault"], rec["host"], rec["rail"])
        if key in seen:
            continue  # a flap's later cycles
        seen.add(key)
        ts, h, r = rec["ts"], rec["host"], rec["rail"]
        if _down_before(ivs, h, r, ts):
            continue
        fault = schedule.by_id(rec["fault"])
        kind = fault.kind
        end = ts + fault.hold + 1.0
        d = per_kind.setdefault(kind, {"local": [], "peer": []})
        me = rank_of_host.get(h)
        loc = _first_event(events.get(me, []), ts - 0.05, end, rail=r)
        d["local"].append(None if loc is None else loc - ts)
        peers = {}
        for host, rank in rank_of_host.items():
            if host == h or _down_before(ivs, host, r, ts):
                continue
            got = _first_event(events.get(rank, []), ts - 0.05, end, rail=r, peer=me)
            peers[rank] = None if got is None else got - ts
            d["peer"].append(peers[rank])
        samples.append({"fault": rec["fault"], "kind": kind, "host": h, "rail": r, "ts": ts,
                        "local_s": d["local"][-1], "peer_s": peers})
    out: Dict[str, Any] = {kind: {side: _summary(vals) for side, vals in d.items()} for kind, d in per_kind.items()}
    return {"by_kind": out, "samples": samples}


def _down_before(ivs: Sequence[Interval], h: int, r: int, ts: float) -> bool:
    return any(iv[2] == h and iv[3] == r and iv[0] < ts - 1e-6 and iv[1] > ts - 1.0 for iv in ivs)


def _first_event(evs: Sequence[Mapping[str, Any]], a: float, b: float, *, rail: int,
                 peer: Optional[int] = None) -> Optional[float]:
    e = first_event(evs, DOWN_EVENTS, a, b, rail=rail, peer=peer, closed=True)
    return None if e is None else float(e["ts"])


def _summary(vals: Iterable[Optional[float]]) -> Dict[str, Any]:
    """Seconds as milliseconds: n, missed, and (when any) median, p99 and max."""
    s = summarize(None if v is None else v * 1000.0 for v in vals)
    out: Dict[str, Any] = {"n": s["n"], "missed": s["missing"]}
    if s["n"]:
        out.update(median_ms=s["median"], p99_ms=s["p99"], max_ms=s["max"])
    return out


# ------------------------------------------------------------ false trips
def false_trips(events: Mapping[int, Sequence[Mapping[str, Any]]], intervals: Sequence[Interval],
                host_of_rank: Mapping[int, int], *, window: float = 1.0) -> Dict[str, Any]:
    """``link_down`` events on links whose two NICs had no fault then (within ``window`` s before)."""
    ivs = sorted(intervals)
    trips, after_repair = [], []
    for rank, evs in events.items():
        for e in evs:
            if e.get("event") != "link_down" or e.get("rail") is None or e.get("peer") is None:
                continue
            ts, r = e["ts"], e["rail"]
            ends = [host_of_rank.get(rank), host_of_rank.get(e["peer"])]
            near = [iv for iv in ivs if iv[3] == r and iv[2] in ends and iv[0] <= ts + 0.05 and iv[1] >= ts - window]
            if near:
                continue
            recent = [iv for iv in ivs if iv[3] == r and iv[2] in ends and ts - 5.0 <= iv[1] < ts - window]
            (after_repair if recent else trips).append({k: e.get(k) for k in ("ts", "rank", "peer", "rail", "cause",
                                                                             "reason", "detail") if k in e})
    return {"count": len(trips), "examples": trips[:20], "after_repair": len(after_repair),
            "after_repair_examples": after_repair[:10]}


def event_counts(events: Mapping[int, Sequence[Mapping[str, Any]]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for evs in events.values():
        for e in evs:
            key = f"{e.get('event')}/{e.get('cause')}" if e.get("cause") else str(e.get("event"))
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


__all__ = ["stalls", "detection", "false_trips", "event_counts", "normal_times", "wire_bytes", "detect_time",
           "baseline_noise", "lossy_in_use", "relays", "relay_intervals", "STALL_SLACK", "NO_PATH_RESUME",
           "CUT_DETECT", "LOSSY_DETECT", "MIN_BASELINE", "RELAY_SETUP", "RELAY_SETTLE"]
