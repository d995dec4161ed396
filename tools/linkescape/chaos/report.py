"""The chaos report: what ran, what broke, whether every bound held (dict for JSON, text for people)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..common import jsonl
from ..faults import Schedule
from ..tools.timeline import format_ms, ms
from . import analysis, workload

DEFINITIONS = {
    "step": "one unit of the workload on one rank (an op, an async burst, a send/recv ring, a barrier, or the "
            "all_reduce of the stop flag after every 4th step), from its first call to its last completion",
    "normal": "median time from start to end of quiet steps of the same class (kind, ops, size within 2x; no "
              "fault within 0.5 s, no repair in the 3 s before), or its bytes at the line rate on one rail, "
              "whichever is longer",
    "start": "a step's first call, or the latest first call of the ranks it cannot complete without (every rank "
             "for a symmetric collective or a barrier and for a rooted one's root, the root for its other ranks, "
             "the sender in a ring: 'waits' in ops-R.jsonl), whichever is later, and no later than its end",
    "stall": "a step's end minus its start, minus its normal time",
    "bound_path_left": "every pair of hosts kept a clean rail: stall <= 100 ms + the detection time of each fault "
                       "that began during the step, + what was left at the step's start of the detection of faults "
                       f"begun before it (cut/flap: {analysis.CUT_DETECT * 1000:.0f} ms; blackhole: silent timeout + "
                       f"heartbeat + 10 ms; lossy: {analysis.LOSSY_DETECT:g} s, the grey-failure detection); "
                       "while a blackholed NIC still has a link up at both ends, a whole blackhole detection from the "
                       "step's start (an idle link is found only once used); no fault: 100 ms",
    "bound_lossy_path_left": "a lossy NIC was still in use (some link of it up at both ends: not yet left, or re-opened "
                             "while still lossy) while every pair kept a "
                             f"clean rail: stall <= 100 ms + {analysis.LOSSY_DETECT:g} s (+ other detections): TCP "
                             "stalls on a lossy path until the library leaves it",
    "bound_no_path": "some pair had no usable rail and no relay (no_path) or only lossy ones (degraded): the step "
                     "ends at most 1.5 s + its normal time (+ detection of faults begun after) after every pair has a "
                     "clean rail (or a relay) again; a step that ends during the outage meets its bound",
    "bound_relayable": "some pair had no rail in common but a relay was possible for every such pair (each kept a "
                       "clean rail and a third host had every rail clean, repaired at least "
                       f"{analysis.RELAY_SETTLE:g} s before): stall <= 100 ms + detection (as for path left) + "
                       f"{analysis.RELAY_SETUP:g} s of relay set-up; also for steps starting within 1.5 s after",
    "relays": "relay_on -> relay_off per rank and peer from the event trails; time relayed per pair of hosts "
              "(both directions merged); cross set-up: the cross fault applied -> the pair's first relay_on, for "
              "crosses a relay could bridge",
    "resources": "every rank's RSS, open fds and OS threads read from /proc every few seconds; slope per hour "
                 "after warm-up, per part (new processes): RSS's by least squares through each minute's lowest "
                 "sample, fds' and threads' the median slope between every two samples (Theil-Sen); judged flat "
                 "only for parts of 10 min or more",
    "warm_up": "steps that start before a part's plan begins (its ranks' first steps, beside the controller's "
               "set-up) are neither judged nor the baseline",
    "noise": "a judged step violates its bound when its stall exceeds the bound + the run's noise allowance: the "
             "1 - 1/N quantile (N judged steps; at least p99, at most the maximum) of the same run's baseline "
             f"stalls (no fault near; counted once {analysis.MIN_BASELINE} baseline steps measure it), what "
             "scheduling alone reaches about once among N steps on a shared machine; steps beyond the bound alone "
             "are counted too (beyond_bound_count)",
    "detection": "fault applied (the ip/nft command returned) -> first link_down/failover event on that rail, "
                 "local = the faulty host's rank, peer = every other rank, for its link to the faulty host",
    "hung": "a step outstanding longer than --hang (default 60 s), or a rank that did not exit after the stop",
}


def collect(*, opts, schedule, parts, cfg, rdir: str, events_tmpl: str, t_start: float,
            t_end: float) -> Dict[str, Any]:
    """Everything a report needs, as plain data (saved as ``run.json``; steps, events and resource samples stay
    in their files). ``parts``: what each part played (its ``ranks``, ``runner``, times and troubles)."""
    log: List[Dict[str, Any]] = []
    intervals: List[List[Any]] = []
    fault_times: Dict[str, Any] = {}
    states: List[Dict[str, Any]] = []
    meta: List[Dict[str, Any]] = []
    t0 = None
    for p in parts:
        runner, ranks = p.get("runner"), p.get("ranks")
        if runner is not None:
            log += list(runner.log)
            intervals += [list(iv) for iv in runner.intervals(now=p.get("t_end") or t_end)]
            fault_times.update({str(k): v for k, v in runner.fault_times().items()})
            t0 = runner.t0 if t0 is None else t0
        if ranks is not None:
            states += [{"rank": st.rank, "host": st.host, "part": p.get("part"), "policy": p.get("policy"),
                        "t_from": p.get("t_start"), "t_to": p.get("t_end"),
                        "exit": st.exit, "hung": st.hung, "returncode": st.returncode, "progress": st.progress,
                        "resources": st.resources, "mismatches": st.mismatches,
                        "stderr_tail": ranks.stderr_tail(st.rank, 3000) if st.exit is None or st.exit.get("error")
                        else ""} for st in ranks.states]
        meta.append({"part": p.get("part"), "policy": p.get("policy"), "seed": p.get("seed"), "from": p["from"],
                     "to": p["to"], "t_start": p.get("t_start"), "t_end": p.get("t_end"),
                     "t0": runner.t0 if runner is not None else None, "hung_during": p.get("hung_during"),
                     "setup_error": p.get("setup_error")})
    hung = "; ".join(f"part {m['part']}: {m['hung_during']}" if m["part"] else m["hung_during"]
                     for m in meta if m["hung_during"]) or None
    setup = "; ".join(f"part {m['part']}: {m['setup_error']}" if m["part"] else m["setup_error"]
                      for m in meta if m["setup_error"]) or None
    return {
        "seed": schedule.seed, "run_dir": rdir, "hosts": opts.hosts, "rails": opts.rails, "rate": opts.rate,
        "events_tmpl": events_tmpl, "t_start": t_start, "t_end": t_end, "t0": t0,
        "hung_during": hung, "setup_error": setup,
        "config": {"silent_timeout_ms": cfg.silent_timeout * 1000, "heartbeat_ms": cfg.heartbeat_interval * 1000,
                   "failback_holddown_ms": cfg.failback_holddown * 1000, "op_timeout_s": opts.op_timeout,
                   "no_path_timeout_s": cfg.no_path_timeout,
                   "policies": [m["policy"] or cfg.policy for m in meta]},
        "log": log, "fault_times": fault_times, "intervals": intervals,
        "ranks": states or None, "parts": meta,
    }


def load_run(rdir: str) -> Tuple[Dict[str, Any], Schedule]:
    """The ``run.json`` and schedule of a run directory (to report on it again)."""
    with open(os.path.join(rdir, "run.json")) as fh:
        data = json.load(fh)
    return data, Schedule.load(os.path.join(rdir, "schedule.json"))


def build_report(data: Mapping[str, Any], schedule: Schedule) -> Dict[str, Any]:
    """The report of a run (see :data:`DEFINITIONS`); ``report["exit_code"]`` is 0 only when all held."""
    from ..common.events import expand_path
    from ..testbed.netns import rate_bps as parse_rate

    rate_bps = parse_rate(data["rate"]) if data.get("rate") else 10e9  # unshaped veth: about 10 Gbit/s here
    world = data["hosts"]
    cfg = data["config"]
    rdir = data["run_dir"]
    rep: Dict[str, Any] = {"seed": schedule.seed, "run_dir": rdir, "hosts": world, "rails": data["rails"],
                           "rate": data.get("rate"), "duration_s": schedule.duration,
                           "wall_s": data["t_end"] - data["t_start"], "definitions": DEFINITIONS,
                           "schedule": schedule.to_dict(), "config": cfg}
    reasons: List[str] = []
    if data.get("setup_error"):
        reasons.append(f"setup: {data['setup_error']}")
    log = data["log"]
    rep["faults"] = _faults(data, schedule, reasons)
    if data.get("ranks") is None:
        rep["verdict"] = {"pass": False, "reasons": reasons or ["no ranks ran"]}
        rep["exit_code"] = 1
        return rep
    states = data["ranks"]
    steps = {st["rank"]: jsonl.read(os.path.join(rdir, f"ops-{st['rank']}.jsonl")) for st in states}
    events = {st["rank"]: jsonl.read(expand_path(data["events_tmpl"], st["rank"])) for st in states}
    intervals = [tuple(iv) for iv in data["intervals"]]
    t_end = data["t_end"]
    t_ref = data.get("t0") or data["t_start"]
    rep.update(_operations(states, steps, reasons))
    rep.update(_errors_and_hangs(data, schedule, t_ref, reasons))
    # -- stalls and bounds
    st = analysis.stalls(steps, intervals, log, schedule, world=world, rate_bps=rate_bps,
                         silent=cfg["silent_timeout_ms"] / 1000.0, heartbeat=cfg["heartbeat_ms"] / 1000.0, t_end=t_end,
                         tcp=data.get("tcp") or (), events=events, warm_up=warm_up(data))
    rep["tcp"] = analysis.tcp_between(data.get("tcp") or (), data["t_start"], t_end)
    rep["stalls"] = st
    if st["violation_count"]:
        reasons.append(f"{st['violation_count']} step(s) stalled beyond their bound + the run's noise "
                       f"({st['noise']['allowance_s'] * 1000:.0f} ms)")
    det = analysis.detection(log, intervals, events, schedule, {h: h for h in range(world)})
    rep["detection"] = det["by_kind"]
    rep["detection_samples"] = det["samples"]
    rep["library"] = data.get("library")
    rep["machine"] = data.get("machine")
    rep["false_trips"] = analysis.false_trips(events, intervals, {r: r for r in range(world)})
    rep["events"] = analysis.event_counts(events)
    rep["relays"] = analysis.relays(events, intervals, log, schedule, t_start=data["t_start"], t_end=t_end)
    _relay_verdict(rep["relays"], data, reasons)
    rep["resources"] = _resources_per_rank(states)
    rep.update(_resource_trends(data, reasons))
    rep["parts"] = _parts(data, st, rep)
    rep["no_path"] = data.get("no_path") or {"deadline_s": cfg.get("no_path_timeout_s")}
    rep["t0"] = t_ref
    rep["verdict"] = {"pass": not reasons, "reasons": reasons}
    rep["exit_code"] = 0 if not reasons else 1
    return rep


def _faults(data: Mapping[str, Any], schedule: Schedule, reasons: List[str]) -> Dict[str, Any]:
    """The faults planned and applied, and any injection error."""
    log = data["log"]
    applied: Dict[str, int] = {}
    for fid in data["fault_times"]:
        k = schedule.by_id(int(fid)).kind
        applied[k] = applied.get(k, 0) + 1
    out = {"planned": schedule.counts(), "applied": applied, "total_applied": len(data["fault_times"]),
           "injection_errors": [r for r in log if r.get("error")][:20],
           "max_late_ms": max([1000 * (r.get("late") or 0) for r in log] + [0.0])}
    if out["injection_errors"]:
        reasons.append(f"{len(out['injection_errors'])} fault injection error(s)")
    return out


def _operations(states: List[Mapping[str, Any]], steps: Mapping[int, List[Dict[str, Any]]],
                reasons: List[str]) -> Dict[str, Any]:
    """The operations every rank verified, and the wrong results."""
    verified: Dict[str, int] = {n: 0 for n in workload.OPERATIONS}
    per_rank: Dict[int, int] = {}
    several = len({st.get("part") for st in states}) > 1
    for st in states:
        counts = (st.get("exit") or {}).get("counts")
        if not counts:
            recs = steps.get(st["rank"], [])
            if several:  # a part that ended without its counts: its own steps (they are in its time)
                recs = [r for r in recs if st.get("t_from", -1e18) <= r["t0"] <= st.get("t_to", 1e18)]
            counts = _count_ops(recs)
        per_rank[st["rank"]] = per_rank.get(st["rank"], 0) + sum(counts.values())
        for k, v in counts.items():
            verified[k] = verified.get(k, 0) + v
    wrong = sum(rec.get("wrong", 0) for recs in steps.values() for rec in recs)
    mism = [m for st in states for m in st["mismatches"]]
    if wrong:
        reasons.append(f"{wrong} wrong element(s) in {len(mism)} result(s)")
    return {"operations": {"verified_by_kind": verified, "verified": sum(verified.values()), "per_rank": per_rank,
                           "steps_per_rank": {r: sum(1 for x in v if x.get("kind") != "stop")
                                              for r, v in steps.items()}},
            "wrong": {"elements": wrong, "results": len(mism), "examples": mism[:20]}}


def _errors_and_hangs(data: Mapping[str, Any], schedule: Schedule, t_ref: float,
                      reasons: List[str]) -> Dict[str, Any]:
    """The ranks that failed (with the faults active then) and those that hung or died."""
    errors, hung = [], []
    spans = analysis.fault_spans(data["log"])
    for st in data["ranks"]:
        ex = st.get("exit")
        if ex and ex.get("error"):
            e = dict(ex["error"])
            e["rank"] = st["rank"]
            e.pop("traceback", None)
            e["t_rel"] = None if e.get("t") is None else round(e["t"] - t_ref, 3)
            e["faults_active"] = analysis.labels(schedule, spans, e["t"] - 5.0, e["t"]) if e.get("t") else []
            e["stderr_tail"] = st.get("stderr_tail", "")
            errors.append(e)
        elif ex is None:
            hung.append({"rank": st["rank"], "hung": st["hung"], "returncode": st["returncode"],
                         "last_progress": st["progress"], "stderr_tail": st.get("stderr_tail", "")})
    if errors:
        reasons.append(f"{len(errors)} rank(s) failed: " + "; ".join(f"rank {e['rank']} {e['type']}" for e in errors))
    if hung or data.get("hung_during"):
        reasons.append(f"{len(hung)} rank(s) hung or died"
                       + (f" ({data['hung_during']})" if data.get("hung_during") else ""))
    return {"errors": errors, "hung": hung, "hung_during": data.get("hung_during")}


def _resources_per_rank(states: List[Mapping[str, Any]]) -> Dict[int, Dict[str, Any]]:
    """start / warm / end / closed per rank (the first part's), and with several parts each part's too."""
    out: Dict[int, Dict[str, Any]] = {}
    several = len({st.get("part") for st in states}) > 1
    for st in states:
        res = out.setdefault(st["rank"], dict(st["resources"]))
        if several:
            res.setdefault("parts", []).append({"part": st.get("part"), "policy": st.get("policy"),
                                                **st["resources"]})
    return out


def _resource_trends(data: Mapping[str, Any], reasons: List[str]) -> Dict[str, Any]:
    """The resource samples' trends (``resource_trends``) and the verdict on them."""
    from . import resources

    samples = resources.load(data["run_dir"])
    parts = data.get("parts") or [{"part": None, "policy": None}]
    tr = resources.trends(samples, parts)
    if tr["reasons"]:
        reasons.append("resources not flat: " + "; ".join(tr["reasons"][:4]))
    return {"resource_trends": tr, "resource_samples": len(samples), "heap": resources.heap(data["run_dir"])}


def _relay_verdict(rel: Mapping[str, Any], data: Mapping[str, Any], reasons: List[str]) -> None:
    """A pair that had a relay to go on through must not be lost: LinkFailure while relayable is a failure
    (it already is, as an error); here only what the trail says of the relays' own health."""
    lost = [s for s in rel.get("cross_samples", []) if s["relay_possible"] and s["relay_on_s"] is None
            and s["hold_s"] > (data.get("no_path") or {}).get("deadline_s", 1e18)]
    if lost:
        reasons.append(f"{len(lost)} cross fault(s) held longer than the no-path deadline and never relayed")


def _parts(data: Mapping[str, Any], st: Mapping[str, Any], rep: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Per part: its policy, wall times, faults applied, operations verified and steps beyond their bound."""
    out = []
    meta = data.get("parts") or []
    for m in meta:
        a, b = m.get("t_start") or 0.0, m.get("t_end") or 1e18
        faults = [int(fid) for fid, ft in data["fault_times"].items() if ft.get("start") and a <= ft["start"] <= b]
        kinds: Dict[str, int] = {}
        for fid in faults:
            k = rep["schedule"]["faults"][_index(rep["schedule"], fid)]["kind"]
            kinds[k] = kinds.get(k, 0) + 1
        verified = sum(sum(((s.get("exit") or {}).get("counts") or {}).values()) for s in data.get("ranks") or []
                       if s.get("part") == m.get("part"))
        viol = sum(1 for v in st.get("violations", []) if a <= v["t0"] <= b)
        out.append({**m, "faults": kinds, "operations_verified": verified, "violations_listed": viol})
    return out


def _index(sched: Mapping[str, Any], fid: int) -> int:
    for i, f in enumerate(sched["faults"]):
        if f["id"] == fid:
            return i
    raise KeyError(fid)


def write_plots(rep: Mapping[str, Any], paths: List[str]) -> None:
    """The RSS picture (``rss.png``) beside the report; a missing matplotlib is said in the report."""
    from . import resources

    samples = resources.load(rep["run_dir"])
    if not samples:
        return
    title = (f"linkescape chaos: seed {rep['seed']}, {rep['hosts']} hosts x {rep['rails']} rails, "
             f"{rep['duration_s'] / 60:.0f} min of faults, RSS / fds / threads per rank")
    try:
        rep["rss_png"] = resources.plot(paths, samples, rep.get("resource_trends") or {}, title)
    except Exception as exc:  # noqa: BLE001 - the report is worth more than its picture
        rep["rss_png"] = []
        rep["rss_png_error"] = f"{type(exc).__name__}: {exc}"


def warm_up(data: Mapping[str, Any]) -> List[Tuple[float, float]]:
    """Each part's warm-up: from its start (its ranks ready to run) until its plan's offset 0."""
    out = []
    for part in data.get("parts") or ():
        if part.get("t_start") is not None and part.get("t0") is not None:
            out.append((part["t_start"], part["t0"] + float(part.get("from") or 0.0)))
    return out


def _count_ops(recs) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for rec in recs:
        if rec.get("kind") == "stop":
            continue  # (the stop flag's all_reduce is judged, not counted as a verified operation)
        for name, _, _ in rec.get("ops", []):
            for n in (("send", "recv") if name == "ring" else (name,)):
                out[n] = out.get(n, 0) + 1
    return out


# ------------------------------------------------------------ text
def _ms(x: Optional[float]) -> str:
    """Seconds as whole milliseconds (the chaos report's unit); ``-`` for none or infinite."""
    return format_ms(ms(x), whole=True)


def format_report(rep: Dict[str, Any]) -> str:
    L: List[str] = []
    add = L.append
    add(f"linkescape chaos report: seed {rep['seed']}, {rep['hosts']} hosts x {rep['rails']} rails at "
        f"{rep['rate'] or 'unshaped'}, {rep['duration_s']:.0f} s of faults ({rep['wall_s']:.0f} s wall)")
    add(f"  run directory: {rep['run_dir']}  (schedule.json replays it: linkescape chaos --schedule ...)")
    lib = rep.get("library") or {}
    if lib:
        add(f"  library: {lib.get('version')} at {lib.get('commit') or '?'}"
            + (f" + uncommitted changes in {', '.join(lib['dirty'][:6])}" if lib.get("dirty") else ""))
    m = rep.get("machine") or {}
    if m:
        add(f"  machine: {m.get('cpus')} CPUs, load average {m['load_start'][0]:.1f} at the start, "
            f"{m['load_end'][0]:.1f} at the end (stalls include any CPU contention)")
    f = rep["faults"]
    add("faults by kind (applied / planned): " + ", ".join(
        f"{k} {f['applied'].get(k, 0)}/{v}" for k, v in f["planned"].items()) + f"; {f['total_applied']} in all, "
        f"injection up to {f['max_late_ms']:.0f} ms late")
    for e in f["injection_errors"][:5]:
        add(f"  injection error: fault #{e['fault']} {e['action']} {e['mechanism']} h{e['host']}r{e['rail']}: "
            f"{e['error']}")
    if "operations" in rep:
        o = rep["operations"]
        add(f"operations verified: {o['verified']} (" + ", ".join(
            f"{k} {v}" for k, v in o["verified_by_kind"].items() if v) + ")")
        w = rep["wrong"]
        add(f"wrong results: {w['results']} ({w['elements']} elements)")
        for m in w["examples"][:5]:
            add(f"  rank {m.get('rank', '?')} step {m['k']} {m['op']} {m['dtype']} x{m['count']}: {m['wrong']} wrong, "
                f"first at {m.get('first')}: got {m.get('got')} want {m.get('want')}")
        add(f"errors: {len(rep['errors'])}")
        for e in rep["errors"]:
            add(f"  rank {e['rank']} at {e.get('t_rel')} s, step {e.get('step')}: {e['type']}: {e['message'][:300]}")
            if e.get("faults_active"):
                add(f"    faults in the 5 s before: {'; '.join(e['faults_active'][:6])}")
        add(f"hung ranks: {len(rep['hung'])}" + (f" ({rep['hung_during']})" if rep.get("hung_during") else ""))
        for h in rep["hung"]:
            add(f"  rank {h['rank']}: last progress {h['last_progress']}")
        _stalls(rep["stalls"], add, rep.get("t0") or 0.0)
        add("detection latency (fault -> first link_down/failover on that rail), median / p99 / max, n, missed:")
        for kind, d in rep["detection"].items():
            parts = []
            for side in ("local", "peer"):
                s = d.get(side, {})
                if s.get("n"):
                    parts.append(f"{side} {s['median_ms']:.0f} / {s['p99_ms']:.0f} / {s['max_ms']:.0f} ms "
                                 f"(n {s['n']}, missed {s['missed']})")
                else:
                    parts.append(f"{side} - (missed {s.get('missed', 0)})")
            add(f"  {kind:<9} " + "; ".join(parts))
        ft = rep["false_trips"]
        add(f"false trips (link_down with no fault on either end within 1 s): {ft['count']}; "
            f"links down again 1-5 s after a repair: {ft['after_repair']}")
        for e in ft["examples"][:5]:
            add(f"  {e}")
        add("events: " + ", ".join(f"{k} {v}" for k, v in rep["events"].items()))
        _relays(rep.get("relays"), rep.get("no_path"), add)
        if rep.get("tcp"):
            add("TCP in the hosts over the run: " + ", ".join(f"{k} {v}" for k, v in rep["tcp"].items())
                + " (rto: retransmission timeouts, tlp: tail-loss probes)")
        add("resources per rank (fds / OS threads / RSS MB): start -> warm -> end -> after close")
        for r, res in rep["resources"].items():
            for label, one in ([(f"part {x.get('part')} ({x.get('policy') or 'default'})", x)
                                for x in res["parts"]] if res.get("parts") else [("", res)]):
                cells = [f"{one[a].get('fds')}/{one[a].get('threads')}/{one[a].get('rss_mb')}" if a in one else "-"
                         for a in ("start", "warm", "end", "closed")]
                left = one.get("closed", {}).get("leftover_threads")
                add(f"  rank {r}{' ' + label if label else ''}: " + " -> ".join(cells)
                    + (f"  threads left after close: {left}" if left else ""))
        _trends(rep.get("resource_trends"), rep.get("rss_png"), add)
        _heap(rep.get("heap"), add)
        for part in rep.get("parts") or []:
            if part.get("part") is None:
                continue
            add(f"part {part['part']}: policy {part.get('policy') or 'default'}, "
                f"{(part.get('t_end') or 0) - (part.get('t_start') or 0):.0f} s wall, faults "
                + (", ".join(f"{k} {v}" for k, v in part["faults"].items()) or "none")
                + f", {part['operations_verified']} operations verified"
                + (f"; {part['setup_error']}" if part.get("setup_error") else "")
                + (f"; {part['hung_during']}" if part.get("hung_during") else ""))
    v = rep["verdict"]
    add(("PASS" if v["pass"] else "FAIL") + ("" if v["pass"] else ": " + "; ".join(v["reasons"])))
    return "\n".join(L)


def _relays(rel: Optional[Mapping[str, Any]], no_path: Optional[Mapping[str, Any]], add) -> None:
    if not rel:
        return
    off = ", ".join(f"{k} {v}" for k, v in rel["relay_off"].items()) or "none"
    add(f"relays: relay_on {rel['relay_on']}, relay_off {sum(rel['relay_off'].values())} ({off}); "
        f"{rel['pairs']} pair(s) relayed for {rel['relayed_s']:.1f} s in all (longest {rel['longest_s']:.1f} s)"
        + (", via " + ", ".join(f"rank {k} x{v}" for k, v in rel["via"].items()) if rel["via"] else "")
        + f"; a relay was possible (some pair had no common rail, a third host could bridge it) for "
        f"{rel['relayable_s']:.1f} s; longest stretch of a pair with neither: {rel['longest_unrelayable_s']:.1f} s")
    cs = rel.get("cross_setup") or {}
    samples = rel.get("cross_samples") or []
    if samples:
        possible = sum(1 for x in samples if x["relay_possible"])
        timing = (f"{cs['median_ms']:.0f} / {cs['p99_ms']:.0f} / {cs['max_ms']:.0f} ms (median / p99 / max, n "
                  f"{cs['n']}, never relayed {cs['missed']})" if cs.get("n")
                  else f"- (never relayed {cs.get('missed', 0)})")
        add(f"  cross faults: {len(samples)}, {possible} with a relay possible; cross -> relay_on {timing} (crosses "
            f"longer than detection + relay set-up)")
    if no_path and no_path.get("set"):
        add(f"  no-path deadline of the ranks {no_path['deadline_s']:g} s: {no_path.get('crosses_longer', 0)} of "
            f"{no_path.get('crosses', 0)} cross faults lasted longer (only a relay lets their pair go on)")


def _trends(tr: Optional[Mapping[str, Any]], pngs, add) -> None:
    if not tr or not tr.get("parts"):
        return
    from . import resources
    iv = tr.get("interval_s")
    win = tr.get("floor_window_s") or 60
    cwin = tr.get("count_window_s") or resources.COUNT_WINDOW_S
    add(f"resources over time (sampled every {iv:.0f} s; slope per hour after warm-up, RSS MB / fds / threads: "
        f"judged = RSS through its floor (each {win:.0f} s's lowest sample), fds and threads' robust (median "
        f"pairwise) slope through each {cwin:.0f} s's ceiling (highest sample) [least squares through every "
        f"sample]):" if iv else
        "resources over time (slope per hour after warm-up, RSS MB / fds / threads, judged [every sample]):")
    for p in tr["parts"]:
        head = f"  part {p['part']} ({p.get('policy') or 'default'})" if p.get("part") else "  every rank"
        cells = []
        for r, row in p["ranks"].items():
            keys = ("rss_mb", "fds", "threads")
            fl = [resources.judged_line(row, k) for k in keys]
            vals = [row.get(k) for k in keys]
            cells.append(f"rank {r} " + " / ".join("-" if v is None else f"{v['per_hour']:+.1f}" for v in fl)
                         + " [" + " / ".join("-" if v is None else f"{v['per_hour']:+.1f}" for v in vals) + "]"
                         + (f" (RSS floor {fl[0]['first']:.0f} -> {fl[0]['last']:.0f} MB, samples {vals[0]['min']:.0f}"
                            f"-{vals[0]['max']:.0f})" if fl[0] and vals[0] else ""))
        add(f"{head}: " + "; ".join(cells) + ("" if p["judged"] else "  (not judged: shorter than "
                                                                        f"{tr['judge_min_s'] / 60:.0f} min)"))
    if tr.get("flat") is not None:
        lim = tr["limits_per_hour"]
        add(f"  flat (RSS's floor <= {lim['rss_mb']:g} MB/h, fds and threads' ceilings <= {lim['fds']:g}/h): "
            + ("yes" if tr["flat"] else "NO: " + "; ".join(tr["reasons"][:6])))
    if pngs:
        add(f"  picture: {pngs[0]}")


def _heap(heap: Optional[Mapping[Any, Any]], add) -> None:
    """The heap's account per rank and process: Python's blocks, glibc's lowest bytes in use."""
    if not heap:
        return
    cells = []
    for rank, rows in sorted(heap.items(), key=lambda kv: int(kv[0])):
        for row in rows:
            b = row["py_blocks"]
            low = row.get("in_use_mb_low")
            cells.append(f"rank {rank} blocks {b[0]} -> {b[1]}" + (f", in use {low[0]} -> {low[1]} MB" if low else ""))
    if cells:
        add("  heap after the first minute (Python's allocated blocks first -> last; glibc's lowest bytes in use, "
            "first half -> second half): " + "; ".join(cells))


def _stalls(st: Dict[str, Any], add, t0: float) -> None:
    lo = st.get("longest")
    if lo:
        add(f"longest stall: {_ms(lo['stall'])} on rank {lo['rank']} step {lo['k']} ({lo['kind']} "
            f"{'+'.join(lo['ops'])}, {lo['bytes']} B) at {lo['t0'] - t0:.2f} s: took {_ms(lo['duration'])}, "
            f"normal {_ms(lo['normal'])}; condition {lo['condition']}, bound {_ms(lo['bound'])}"
            + (" (beyond)" if lo["violation"] else " (within)"))
        for label in lo.get("faults", [])[:8]:
            add(f"    during: {label}")
    nz = st.get("noise") or {}
    if nz:
        add(f"noise of this run (baseline steps: {nz['baseline_steps']}): stall p50 {_ms(nz.get('p50_s'))}, "
            f"p99 {_ms(nz.get('p99_s'))}, max {_ms(nz.get('max_s'))}; allowance added to every bound: "
            f"{_ms(nz['allowance_s'])} (the p{nz['percentile']:.2f} for {nz.get('judged_steps', 0)} judged steps)"
            + ("" if nz["baseline_steps"] >= nz["min_baseline"] else
                                           f" (fewer than {nz['min_baseline']} baseline steps: none)"))
        add(f"steps beyond their bound alone: {st.get('beyond_bound_count', 0)}; beyond bound + noise: "
            f"{st['violation_count']}")
    add("stalls by condition (steps, violations, longest stall): " + "; ".join(
        f"{c} {d['steps']}/{d['violations']}/{_ms(d['longest_stall_s'])}" for c, d in st["by_condition"].items()))
    seen = set()
    for v in st["violations"]:
        if (v["k"], v["kind"]) in seen:
            continue  # the same step on the other ranks
        seen.add((v["k"], v["kind"]))
        if len(seen) > 10:
            break
        rto = v.get("tcp", {}).get("rto")
        add(f"  beyond bound: step {v['k']} on rank {v['rank']} ({v['kind']} {'+'.join(v['ops'])}) "
            f"{v['condition']} at {v['t0'] - t0:.2f} s: stall {_ms(v['stall'])} > bound {_ms(v['bound'])}"
            f" + noise {_ms(v.get('allowance', 0.0))}"
            + (f"; TCP RTOs then: {rto}" if rto is not None else "")
            + (f"; {'; '.join(v.get('faults', [])[:3])}" if v.get("faults") else ""))
    b = st.get("baseline_longest")
    if b:
        add(f"baseline (not judged: no fault within 0.5 s, and no repair in the 3 s before or no failback or "
            f"link re-opened during the step): longest stall "
            f"{_ms(b['stall'])} (step {b['k']} {b['kind']} at {b['t0'] - t0:.2f} s"
            + (f", TCP RTOs then: {b['tcp'].get('rto')}" if b.get("tcp") else "")
            + f"); {st['baseline_over_100ms']} step(s) over 100 ms")
    gaps = st.get("gaps", {})
    if gaps:
        add("longest time between two completions per rank: " + ", ".join(
            f"rank {r} {_ms(g['longest_s'])}" for r, g in gaps.items()))


__all__ = ["collect", "build_report", "load_run", "format_report", "write_plots", "DEFINITIONS"]
