"""The job's rate while a rail is down (issue 12) or a pair is relayed (issue 16):
``linkescape bench --faults ... --rate-phases``.

One job per policy on one testbed: every rank all_reduces ``size`` bytes in a
loop (``depth`` 1), and rank 0's completed operations per second are
measured over ``phase_s`` in phases of the same run: *healthy*; *during*
each fault (cut: host 1 rail 0, blackhole: host 2 rail 0, flap: host 3
rail 0; *relayed*: a cross, host 1 losing rail 0 and host 2 rail 1 at once,
so that they share no rail and a third host relays their traffic), counted
from ``settle_s`` after it took effect; and *after the repairs*
(``failback_s`` after the last one, so traffic is back on rail 0). The faults
are one scripted shared schedule (:mod:`linkescape.faults`) played through the
testbed injector, one fault at a time. For every fault phase the longest
stall of any rank once the fault began (the longest time between two of its
completions, from the last one before the fault to ``failback_s`` after the
repair) is reported too; the issue-16 targets of the relayed phase: >= 0.5x
healthy under either policy, no stall over 1.5 s.

Each phase is reported as ops/s (completions in the window / its length),
the median of its ``sub_s`` windows (robust to one scheduling hiccup on a
loaded machine), and both as a ratio to the healthy phase. The issue's
targets: with ``active-backup`` >= 0.95x healthy; with ``stripe`` >= 0.9x of
what the surviving rails carry ((rails - 1) / rails of healthy when one
host lost one of its rails: its NIC bounds a ring all_reduce).
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...faults.measure import first_event
from .analysis import ops_rate
from .job import FailoverJob
from .settings import TARGETS, Log, PhaseSettings, cc_env, policy_env


def phase_plan(ps: PhaseSettings) -> Tuple[Any, List[Dict[str, Any]]]:
    """The shared schedule of the faults, and the phases as offsets from its start.

    Returns ``(schedule, phases)``; each phase ``{"name", "kind", "fault", "host", "rail", "from", "to"}``
    (the fault phases' windows are re-anchored to the fault's applied time by :func:`measure_phases`)."""
    from ...faults import scripted

    P, S, F = ps.phase_s, ps.settle_s, ps.failback_s
    phases: List[Dict[str, Any]] = [{"name": "healthy", "kind": None, "fault": None, "from": 0.0, "to": P}]
    faults = []
    t = P + 0.5
    for i, kind in enumerate(ps.faults):
        host = ps.fault_host(kind)
        hold = S + P
        d: Dict[str, Any] = {"id": i, "kind": kind, "host": host, "rail": ps.fault_rail, "at": round(t, 3),
                             "hold": round(hold, 3)}
        if kind == "flap":
            cycles = max(1, int(round(hold / ps.flap_period_s)))
            d.update(period=ps.flap_period_s, hold=round(cycles * ps.flap_period_s, 3), mode="cut")
        if kind == "cross":
            d = {"id": i, "kind": "cross", "targets": [list(x) for x in ps.cross_targets()], "mode": "cut",
                 "at": round(t, 3), "hold": round(hold, 3)}
        faults.append(d)
        phases.append({"name": "relayed" if kind == "cross" else kind, "kind": kind, "fault": i, "host": host,
                       "rail": ps.fault_rail if kind != "cross" else 0,
                       "targets": [list(x) for x in ps.cross_targets()] if kind == "cross" else [[host, ps.fault_rail]],
                       "from": t + S, "to": t + d["hold"]})
        t += d["hold"] + F
    phases.append({"name": "after the repairs", "kind": None, "fault": None, "from": t, "to": t + P})
    sched = scripted(faults, hosts=ps.hosts, rails=ps.rails, duration=t + P) if faults else None
    return sched, phases


def window_rates(dones: Sequence[dict], t0: float, t1: float, sub: float) -> Dict[str, Any]:
    """Rank 0's ops/s in ``[t0, t1]``: the count over the length, and the median of ``sub``-second windows
    (each (n - 1) / (last - first) of its completions, so that ~16 ops in a window do not round to 1/16)."""
    ts = np.array(sorted(d["t"] for d in dones), float)
    n = int(((ts >= t0) & (ts < t1)).sum())
    length = max(t1 - t0, 1e-9)
    subs = []
    k = int(length // sub) if sub > 0 else 0
    for j in range(k):
        a = t0 + j * sub
        rate = ops_rate(dones, a, a + sub)
        if rate is not None:
            subs.append(rate)
    return {"t0": t0, "t1": t1, "ops": n, "ops_per_s": n / length,
            "median_ops_per_s": float(np.median(subs)) if subs else None, "windows_ops_per_s": subs}


def measure_phases(phases: Sequence[Dict[str, Any]], t0: float, runner_log: Sequence[Dict[str, Any]],
                   dones: Sequence[dict], ps: PhaseSettings) -> List[Dict[str, Any]]:
    """Every phase's window (wall times; fault phases from the fault's applied time) and its rates."""
    applied: Dict[int, float] = {}
    repaired: Dict[int, float] = {}
    for rec in runner_log:
        if rec.get("ts") is None:
            continue
        if rec["action"] == "apply":
            applied.setdefault(rec["fault"], rec["ts"])
        else:
            repaired[rec["fault"]] = max(repaired.get(rec["fault"], 0.0), rec["ts"])
    last_repair = max(repaired.values()) if repaired else None
    out = []
    for ph in phases:
        a, b = t0 + ph["from"], t0 + ph["to"]
        if ph["fault"] is not None and ph["fault"] in applied:
            a = applied[ph["fault"]] + ps.settle_s
            b = min(repaired.get(ph["fault"], b), a + ps.phase_s)
        elif ph["name"] == "after the repairs" and last_repair is not None:
            a = max(a, last_repair + ps.failback_s)
            b = a + ps.phase_s
        row = dict(ph)
        row["applied"] = applied.get(ph["fault"]) if ph["fault"] is not None else None
        row["repaired"] = repaired.get(ph["fault"]) if ph["fault"] is not None else None
        row.update(window_rates(dones, a, b, ps.sub_s))
        out.append(row)
    healthy = out[0]
    for row in out:
        for key in ("ops_per_s", "median_ops_per_s"):
            ref, val = healthy.get(key), row.get(key)
            row[key.replace("ops_per_s", "ratio")] = val / ref if ref and val is not None else None
    return out


def longest_stall(dones: Sequence[dict], t0: float, t1: float) -> Optional[Dict[str, float]]:
    """The longest time between two consecutive completions of one rank over ``[t0, t1]``, counting from
    its last completion before ``t0`` (an operation in flight when the fault began waits from there):
    ``{"stall_s", "after"}`` (the completion it followed), or None without completions."""
    ts = sorted(d["t"] for d in dones)
    before = [t for t in ts if t < t0]
    inside = [t for t in ts if t0 <= t <= t1]
    seq = before[-1:] + inside
    if not seq:
        return None
    if len(seq) == 1:  # nothing completed in the window after the last one before it
        return {"stall_s": t1 - seq[0], "after": seq[0]}
    gaps = [(b - a, a) for a, b in zip(seq, seq[1:])]
    if inside and t1 - inside[-1] > max(g for g, _ in gaps):  # still waiting at the end of the window
        gaps.append((t1 - inside[-1], inside[-1]))
    g, a = max(gaps)
    return {"stall_s": g, "after": a}


def capacity(policy: Optional[str], rails: int) -> float:
    """What the job can do with one rail of one host down, as a share of healthy: active-backup keeps an
    idle backup as fast as the primary (1.0); stripe loses that NIC's share ((rails - 1) / rails)."""
    return (rails - 1) / rails if policy == "stripe" else 1.0


def judge(rows: List[Dict[str, Any]], policy: Optional[str], rails: int) -> None:
    """Each fault phase against the issue's target (reported, never enforced): issue 12's rates for a rail
    down; issue 16's for the relayed phase (>= 0.5x healthy under either policy, and no stall > 1.5 s)."""
    for row in rows:
        if row["kind"] is None or row.get("ratio") is None:
            continue
        relayed = row["kind"] == "cross"
        cap = 1.0 if relayed else capacity(policy, rails)
        target = (TARGETS["rate_relayed"] if relayed else
                  TARGETS["rate_stripe"] if policy == "stripe" else TARGETS["rate_active_backup"])
        row["capacity"] = cap
        row["vs_capacity"] = row["ratio"] / cap
        row["target"] = target
        row["met"] = row["vs_capacity"] >= target
        if relayed and row.get("stall_s") is not None:
            row["stall_target_s"] = TARGETS["stall_s"]
            row["stall_met"] = row["stall_s"] <= TARGETS["stall_s"]


def fault_events(job: FailoverJob, row: Dict[str, Any]) -> Dict[str, Any]:
    """Detection and failback of one fault phase, from the faulty rank's trail; for a cross, the relay of
    its pair (the faulty rank's ``relay_on`` for the other host: when, via whom; its ``relay_off``)."""
    rank = row["host"]  # one rank per host, in host order
    out: Dict[str, Any] = {}
    if row.get("applied") is None:
        return out
    evs = job.events(rank)
    det = first_event(evs, "failover", row["applied"] - 0.05, row.get("repaired") or 1e18)
    out["detect_ms"] = None if det is None else (det["ts"] - row["applied"]) * 1e3
    out["detect_cause"] = None if det is None else det.get("cause")
    if row["kind"] == "cross":
        other = next(h for h, _ in row["targets"] if h != rank)
        on = first_event(evs, "relay_on", row["applied"] - 0.05, row.get("repaired") or 1e18, peer=other)
        out["relay_ms"] = None if on is None else (on["ts"] - row["applied"]) * 1e3
        out["via"] = None if on is None else on.get("via")
        out["relay_ons"] = sum(1 for e in evs if e.get("event") == "relay_on" and e.get("peer") == other
                               and e["ts"] >= row["applied"] - 0.05)
        if row.get("repaired") is not None:
            off = first_event(evs, "relay_off", row["repaired"] - 0.05, 1e18, peer=other)
            out["direct_ms"] = None if off is None else (off["ts"] - row["repaired"]) * 1e3
            out["relay_off_cause"] = None if off is None else off.get("cause")
        return out
    if row.get("repaired") is not None:
        fb = first_event(evs, "failback", row["repaired"], 1e18)
        out["failback_ms"] = None if fb is None else (fb["ts"] - row["repaired"]) * 1e3
    return out


def stalls(job: FailoverJob, rows: List[Dict[str, Any]], world: int, failback_s: float) -> None:
    """Per phase, the longest stall of any rank: a fault phase from the fault to ``failback_s`` after its
    repair (what the fault cost, set-up and return included), the healthy phase over its window (the
    machine's own)."""
    dones = {r: job.dones(r) for r in range(world)}
    for row in rows:
        if row["kind"] is None and row["name"] != "healthy":
            continue
        if row["kind"] is None:
            a, b = row["t0"], row["t1"]
        elif row.get("applied") is not None:
            a = row["applied"]
            b = (row.get("repaired") or row["t1"]) + failback_s
        else:
            continue
        worst = None
        for r, d in dones.items():
            s = longest_stall(d, a, b)
            if s is not None and (worst is None or s["stall_s"] > worst[1]["stall_s"]):
                worst = (r, s)
        if worst is not None:
            row["stall_s"], row["stall_rank"], row["stall_after"] = worst[1]["stall_s"], worst[0], worst[1]["after"]


def run_policy(tb, ps: PhaseSettings, policy: Optional[str], log: Log) -> Dict[str, Any]:
    """One job under ``policy`` through the phases; raw windows, rates, exits."""
    from ...faults import ScheduleRunner, TestbedInjector

    sched, phases = phase_plan(ps)
    duration = phases[-1]["to"] + 60.0
    env = {**ps.env, **policy_env(policy), **cc_env(ps.congestion)}
    job = FailoverJob(tb, size=ps.size, depth=ps.depth, env=env, duration=duration)
    runner = None
    try:
        job.wait_ready(iters=3)
        time.sleep(1.0)  # past the first operations' slow start
        t0 = time.time()
        if sched is not None:
            runner = ScheduleRunner(sched, TestbedInjector(tb)).start(t0)
        for ph in phases:
            while time.time() < t0 + ph["to"] and job.alive():
                time.sleep(0.1)
            if not job.alive():
                log(f"  {policy or 'default policy'}: a rank exited during {ph['name']}")
                break
            log(f"  {policy or 'default policy'}: {ph['name']} over")
        if runner is not None:
            runner.join(30.0)
            runner.stop()
            # a late repair moves the last window: run on until it is over
            repairs = [r["ts"] for r in runner.log if r["action"] == "repair" and r.get("ts")]
            end = (max(repairs) if repairs else 0.0) + ps.failback_s + ps.phase_s + 0.2
            while time.time() < end and job.alive():
                time.sleep(0.1)
        t_end = time.time()
        exits = job.finish()
        dones = job.dones(0)
        rows = measure_phases(phases, t0, runner.log if runner else [], dones, ps)
        for row in rows:
            if row["kind"] is not None:
                row.update(fault_events(job, row))
        stalls(job, rows, ps.hosts, ps.failback_s)
        judge(rows, policy, ps.rails)
    finally:
        if runner is not None:
            runner.stop()
        job.close()
    return {"policy": policy or "default", "phases": rows, "exits": exits, "t0": t0, "t_end": t_end,
            "wrong": sum(int(e.get("wrong") or 0) for e in exits),
            "errors": [e for e in exits if e.get("error")], "hangs": sum(1 for e in exits if e.get("hung")),
            "injection_errors": [r for r in (runner.log if runner else []) if r.get("error")],
            "iters": len(dones)}


def run_rate_phases(ps: PhaseSettings, log: Log) -> Dict[str, Any]:
    """Every policy through the phases on one throwaway testbed."""
    from ...testbed.netns import temporary_testbed

    out: Dict[str, Any] = {"settings": {k: v for k, v in ps.__dict__.items()}, "policies": {}}
    with temporary_testbed(ps.hosts, ps.rails, rate=ps.rate, prefix="fr") as tb:
        for policy in ps.policies:
            log(f"rate phases, policy {policy or 'default'}: {ps.hosts} hosts x {ps.rails} rails at {ps.rate}, "
                f"all_reduce of {ps.size} B in a loop, {ps.phase_s:g} s per phase")
            res = run_policy(tb, ps, policy, log)
            out["policies"][res["policy"]] = res
    return out


def rates_ok(res: Dict[str, Any]) -> bool:
    """No wrong result, error, hang or failed injection in any policy's run."""
    return all(r["wrong"] == 0 and not r["errors"] and r["hangs"] == 0 and not r["injection_errors"]
               for r in res.get("policies", {}).values())


def format_rates(res: Dict[str, Any]) -> str:
    ps = res["settings"]
    lines = [f"## the job's rate (rank 0, all_reduce of {ps['size']} B in a loop, {ps['phase_s']:g} s per phase, "
             f"{ps['hosts']} hosts x {ps['rails']} rails at {ps['rate']})"]
    for policy, r in res["policies"].items():
        cells = []
        for row in r["phases"]:
            rate = row["ops_per_s"]
            text = f"{row['name']} {rate:.1f} ops/s"
            if row["kind"] is not None or row["name"] != "healthy":
                text += f" ({_x(row.get('ratio'))}, median of {ps['sub_s']:g} s windows {_x(row.get('median_ratio'))})"
            if "met" in row:
                text += (f" vs capacity {row['vs_capacity']:.2f} target >= {row['target']:g}: "
                         f"{'met' if row['met'] else 'MISSED'}")
            cells.append(text)
        lines.append(f"  {policy}: " + "; ".join(cells))
        for row in r["phases"]:
            stall = (f"; longest stall of any rank {'since the fault' if row['kind'] else 'in the phase'} "
                     f"{_f(None if row.get('stall_s') is None else row['stall_s'] * 1e3)} ms (rank "
                     f"{row.get('stall_rank')})" if row.get("stall_s") is not None else "")
            if "stall_met" in row:
                stall += f", target <= {row['stall_target_s']:g} s: {'met' if row['stall_met'] else 'MISSED'}"
            if row["kind"] == "cross":
                where = " + ".join(f"host {h} rail {rl}" for h, rl in row["targets"])
                lines.append(f"    relayed ({where}: no rail in common): detected {_f(row.get('detect_ms'))} ms "
                             f"({row.get('detect_cause')}), relayed after {_f(row.get('relay_ms'))} ms via rank "
                             f"{row.get('via')} ({row.get('relay_ons', 0)} relay_on), direct again "
                             f"{_f(row.get('direct_ms'))} ms after the repair ({row.get('relay_off_cause')})"
                             + stall)
            elif row["kind"] is not None:
                lines.append(f"    {row['kind']} host {row['host']} rail {row['rail']}: detected "
                             f"{_f(row.get('detect_ms'))} ms ({row.get('detect_cause')}), failback "
                             f"{_f(row.get('failback_ms'))} ms after the repair" + stall)
            elif stall:
                lines.append(f"    {row['name']}{stall}")
        lines.append(f"    wrong {r['wrong']}, errors {len(r['errors'])}, hangs {r['hangs']}, "
                     f"injection errors {len(r['injection_errors'])}, rank 0 iterations {r['iters']}")
    return "\n".join(lines)


def _x(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _f(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.1f}"


__all__ = ["run_rate_phases", "run_policy", "phase_plan", "measure_phases", "window_rates", "capacity",
           "longest_stall", "format_rates", "rates_ok"]
