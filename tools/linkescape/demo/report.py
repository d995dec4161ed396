"""The demo's report: steps lost, fault detection and recovery times, the
relays (which pair went through which host, from when, for how long), the
bit-for-bit comparison with the fault-free run, and the timeline picture.

Written as ``report.json`` (for machines), ``report.md`` (for people) and
``timeline.png`` in the output directory.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..common import jsonl
from ..common.private import redact_env
from ..tools.timeline import (DETECT_EVENTS, NOT_SEEN, draw_timeline, fault_timing, format_ms, ms,  # noqa: F401
                              related, relay_intervals, relay_pairs)


# ------------------------------------------------------------------ events
def read_events(run_dir: str) -> List[Dict[str, Any]]:
    from ..common.events import read_events as _read

    out: List[Dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "events", "rank*.jsonl"))):
        out += _read(path)
    return sorted(out, key=lambda e: e.get("ts", 0.0))


def read_steps(run_dir: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(start records, step records) of a run's steps.jsonl."""
    starts, steps = [], []
    for r in jsonl.read(os.path.join(run_dir, "steps.jsonl")):
        (starts if "start" in r else steps).append(r)
    return starts, steps


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _errors(run_dir: str) -> List[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "error-rank*.txt"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
        last = text.splitlines()[-1] if text else ""
        out.append(f"{os.path.basename(path)}: {last}")
    return out


def _params_equal(a_dir: str, b_dir: str) -> Optional[bool]:
    try:
        import numpy as np

        with np.load(os.path.join(a_dir, "params.npz")) as a, np.load(os.path.join(b_dir, "params.npz")) as b:
            if sorted(a.files) != sorted(b.files):
                return False
            return all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
                       for k in a.files)
    except (OSError, ValueError, KeyError):
        return None


# ------------------------------------------------------------------ the report
EMULATED_NOTE = ("EMULATED faults: {reason}. The ranks ran as local processes on loopback rails {rails}, and "
                 "each fault was injected inside the process of the rank that owns the rail (its links on "
                 "that rail taken down through the library's engine, as when the kernel reports a carrier "
                 "loss; a blackhole as a silent timeout). No packet was really lost, and the detection "
                 "times below measure the injection, not real fault detection. Run as root for real faults.")


def build_report(opts, info: Dict[str, Any], runs: Sequence[Any], started: float) -> Dict[str, Any]:
    by_name = {r.name: r for r in runs}
    faulty = by_name.get("faulty")
    ref = by_name.get("reference")
    rep = _header(opts, info)
    issues: List[str] = []
    events: List[Dict[str, Any]] = []
    if faulty is not None:
        events = _faulty_run(rep, opts, faulty, issues)
    else:
        rep["steps_lost"] = opts.steps
        rep["training_ok"] = False
        rep["faults"] = []
    if ref is not None and faulty is not None:
        _comparison(rep, opts, faulty, ref, issues)
    else:
        rep["bit_identical"] = None
        rep["comparison"] = None
    if events:
        _traffic_back(rep, events, issues, faulty.dir)
    rep["issues"] = issues
    rep["runtime_s"] = round(time.time() - started, 1)
    return rep


def _header(opts, info: Dict[str, Any]) -> Dict[str, Any]:
    """What ran: mode, testbed, model, and the library settings of the runs."""
    rep: Dict[str, Any] = {
        "title": "linkescape demo: training through NIC, cable and optic failures",
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "mode": info["mode"],
        "emulated": info["mode"] == "emulated",
        "testbed": info.get("testbed"),
        "model_size": opts.model_size,
        "seed": opts.seed,
        "steps": opts.steps,
        "out_dir": os.path.abspath(opts.out),
    }
    if info["mode"] == "emulated":
        rep["note"] = EMULATED_NOTE.format(reason=info.get("emulated_reason") or "--emulate",
                                           rails=",".join(info["testbed"].get("rail_addresses", [])))
    from ..common.config import Config
    from .controller import job_env

    # the ranks inherit this process's environment, then the job's own variables
    env = {k: v for k, v in {**os.environ, **job_env(opts.out)}.items()
           if k.startswith("LINKESCAPE_") and k not in ("LINKESCAPE_EVENTS", "LINKESCAPE_RAILS")}
    cfg = Config.from_env(env)
    rep["library_settings"] = {"env": redact_env(env), "silent_timeout_ms": round(cfg.silent_timeout * 1000),
                               "failback_holddown_ms": round(cfg.failback_holddown * 1000),
                               "heartbeat_ms": round(cfg.heartbeat_interval * 1000),
                               "no_path_timeout_s": cfg.no_path_timeout}
    return rep


def _faulty_run(rep: Dict[str, Any], opts, faulty, issues: List[str]) -> List[Dict[str, Any]]:
    """The faulty run: steps lost, exceptions, its faults and their timing; returns its events."""
    starts, steps = read_steps(faulty.dir)
    final = _read_json(os.path.join(faulty.dir, "final.json"))
    errors = _errors(faulty.dir)
    recorded = sorted({s["step"] for s in steps})
    events = read_events(faulty.dir)
    t_start = starts[0]["start"] if starts else None
    rep["params"] = (final or {}).get("params") or (starts[0].get("params") if starts else None)
    rep["faulty_run"] = {
        "exit_status": faulty.rc, "wall_s": round(faulty.wall_s, 2), "steps_recorded": len(recorded),
        "restarts": max(0, len(starts) - 1), "exceptions": errors, "final": final,
        "training_s": round(steps[-1]["t"] - t_start, 2) if steps and t_start else None,
        "mean_step_s": round(sum(s["dt"] for s in steps[1:]) / max(1, len(steps) - 1), 4) if steps else None,
        "paced_min_duration_s": starts[0].get("min_duration") if starts else None,
        "paused_s": (final or {}).get("paused_s"),
        "planned_fault_window_s": faulty.planned_duration,
        "fault_injection_error": faulty.fault_error,
        "events": len(events),
        "events_by_kind": {k: sum(1 for e in events if e.get("event") == k)
                           for k in sorted({e.get("event") for e in events})},
    }
    rep["steps_lost"] = opts.steps - len(recorded)
    rep["training_ok"] = (faulty.rc == 0 and not errors and len(starts) == 1 and rep["steps_lost"] == 0
                          and bool(final) and final.get("ranks_agree") is True)
    if rep["steps_lost"]:
        issues.append(f"{rep['steps_lost']} training steps lost in the faulty run")
    if faulty.rc != 0:
        issues.append(f"the faulty run exited with status {faulty.rc} (see {faulty.dir}/train.log)")
    if errors:
        issues.append("exceptions in the faulty run: " + "; ".join(errors))
    if final and final.get("ranks_agree") is False:
        issues.append("the ranks ended the faulty run with different parameters")
    if faulty.fault_error:
        issues.append(f"fault injection failed: {faulty.fault_error}")
    rep["faults"] = _fault_rows(list(faulty.faults), events, t_start, issues)
    _longest_steps(rep["faults"], list(faulty.faults), steps)
    planned = len(getattr(opts, "faults", ("cut", "blackhole", "flap")))
    if "cross" in getattr(opts, "faults", ()) and (opts.hosts < 3 or opts.rails < 2):
        planned -= 1
        issues.append("no cross fault: it needs 3 hosts (one to relay) and 2 rails")
    if len(faulty.faults) < planned:
        issues.append(f"only {len(faulty.faults)} of {planned} faults were injected (training ended first?)")
    rep["relays"], rep["relay_events"] = _relays(events, t_start, steps[-1]["t"] if steps else None)
    return events


def _longest_steps(rows: List[Dict[str, Any]], fl: List[Any], steps: List[Dict[str, Any]]) -> None:
    """Per fault, the longest training step (its own time, pauses for pacing excluded) that overlapped it,
    from the fault to 1 s after its repair: a fault the library escapes costs a step nothing like a wait."""
    for row, f in zip(rows, fl):
        if f.ts is None:
            continue
        end = (f.restored if f.restored is not None else float("inf")) + 1.0
        dts = [s["dt"] for s in steps if s["t"] >= f.ts and s["t"] - s["dt"] <= end]
        row["longest_step_s"] = round(max(dts), 3) if dts else None
        row["steps_during"] = len(dts)


def _relays(events: List[Dict[str, Any]], t_start: Optional[float],
            t_end: Optional[float]) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
    """Every relayed pair of the run (both ends merged), times from the start of training."""
    t0 = t_start or 0.0
    rows = []
    for p in relay_pairs(relay_intervals(events, t_end), t_end):
        rows.append({"pair": p["pair"], "via": p["via"], "on_s": round(p["t_on"] - t0, 3),
                     "off_s": None if p["t_off"] is None else round(p["t_off"] - t0, 3),
                     "relayed_ms": None if p["seconds"] is None else round(p["seconds"] * 1000.0, 1),
                     "ended_by": p["causes"], "relays": p["relays"], "bytes": p["bytes"]})
    counts = {k: sum(1 for e in events if e.get("event") == k) for k in ("relay_on", "relay_off")}
    return rows, counts


def cross_timing(fault: Any, events: Sequence[Dict[str, Any]], until: Optional[float] = None) -> Dict[str, Any]:
    """A cross (two hosts without a rail in common): detection (first link_down/failover of a NIC of it),
    the relay (no common rail -> first relay_on of the pair, via whom, how long relayed) and the return
    to a direct rail (repair -> relay_off, cause path_back, of the pair)."""
    targets = list(fault.targets)
    pair = set(fault.hosts)
    start = fault.issued if fault.issued is not None else fault.ts
    end = until if until is not None else float("inf")
    out: Dict[str, Any] = {"detection_ms": None, "detection_raw_ms": None, "detected_by": None,
                           "recovery_ms": None, "recovered_by": None, "all_back_ms": None, "link_downs": 0,
                           "failovers": 0, "failbacks": 0, "no_path": 0, "peer_lost": 0, "relay_ms": None,
                           "relayed_ms": None, "via": [], "relay_on": 0, "relay_off": 0, "relays": []}
    if fault.ts is None:
        return out
    mine = sorted((e for e in events if start <= e.get("ts", 0.0) < end
                   and any(related(e, h, r) for h, r in targets)), key=lambda e: e["ts"])
    for e in mine:
        key = {"link_down": "link_downs", "failover": "failovers", "failback": "failbacks"}.get(e["event"], e["event"])
        if key in out and key not in ("relay_on", "relay_off"):
            out[key] += 1
    det = next((e for e in mine if e["event"] in DETECT_EVENTS), None)
    if det is not None:
        out["detection_raw_ms"] = (det["ts"] - fault.ts) * 1000.0
        out["detection_ms"] = max(0.0, out["detection_raw_ms"])
        out["detected_by"] = {k: det.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause")}
    evs = [e for e in events if e.get("event") in ("relay_on", "relay_off") and start <= e.get("ts", 0.0) < end
           and {e.get("rank"), e.get("peer")} == pair]
    out["relay_on"] = sum(1 for e in evs if e["event"] == "relay_on")
    out["relay_off"] = sum(1 for e in evs if e["event"] == "relay_off")
    downs = sorted(t for t, st in fault.transitions if st == "down")
    no_common = downs[len(targets) - 1] if len(downs) >= len(targets) else fault.ts
    ivs = relay_intervals(evs, end if until is not None else None)
    if ivs:
        out["relay_ms"] = max(0.0, (ivs[0]["t_on"] - no_common) * 1000.0)
        out["via"] = sorted({r["via"] for r in ivs if r.get("via") is not None})
        pairs = relay_pairs(ivs, fault.restored)
        out["relayed_ms"] = sum(p["seconds"] or 0.0 for p in pairs) * 1000.0
        out["relays"] = [{"rank": r["rank"], "peer": r["peer"], "via": r["via"], "on": r["t_on"], "off": r["t_off"],
                          "cause": r["cause"], "bytes": r.get("bytes")} for r in ivs]
    if fault.restored is not None:
        back = [e for e in evs if e["event"] == "relay_off" and e.get("cause") == "path_back"
                and e["ts"] >= (fault.restore_issued or fault.restored)]
        if back:
            out["recovery_ms"] = max(0.0, (back[0]["ts"] - fault.restored) * 1000.0)
            out["recovered_by"] = {k: back[0].get(k) for k in ("ts", "rank", "event", "peer", "via", "cause")}
            last = {}
            for e in back:
                last[e["rank"]] = e["ts"]
            if set(last) >= pair:
                out["all_back_ms"] = max(0.0, (max(last.values()) - fault.restored) * 1000.0)
    return out


def _fault_rows(fl: List[Any], events: List[Dict[str, Any]], t_start: Optional[float],
            issues: List[str]) -> List[Dict[str, Any]]:
    """One row per fault: the plan, what became of it, its detection and recovery (a cross: its relay)."""
    faults = []
    for i, f in enumerate(fl):
        nxt = fl[i + 1].issued if i + 1 < len(fl) and fl[i + 1].issued else None
        # (a failback belongs to the latest repair before it: this fault's are looked for up to the next repair)
        nxt_back = next((t for t in (g.restore_issued or g.restored for g in fl[i + 1:]) if t), None)
        d = f.to_dict()
        if f.kind == "cross":
            d.update(_cross_row(f, events, nxt, t_start, issues))
            faults.append(d)
            continue
        timing = fault_timing(f, events, until=nxt, back_until=nxt_back)
        d.update(timing)
        if t_start is not None:
            d["at_s"] = None if f.ts is None else round(f.ts - t_start, 3)
            d["restored_at_s"] = None if f.restored is None else round(f.restored - t_start, 3)
        if f.ts is not None and f.issued is not None:
            d["fault_ts_uncertainty_ms"] = round((f.ts - f.issued) * 1000.0, 2)
        if f.ts is not None and timing["detection_ms"] is None:
            issues.append(f"{f.label}: no rank reported it (no link_down/failover event)")
        if f.restored is not None and timing["recovery_ms"] is None:
            issues.append(f"{f.label}: traffic never moved back after the repair (no failback event)")
        if timing["no_path"] or timing["peer_lost"]:
            issues.append(f"{f.label}: {timing['no_path']} no_path / {timing['peer_lost']} peer_lost events")
        faults.append(d)
    return faults


def _cross_row(f: Any, events: List[Dict[str, Any]], nxt: Optional[float], t_start: Optional[float],
               issues: List[str]) -> Dict[str, Any]:
    """A cross fault's row and the issues it shows: never relayed, never back to direct, a peer lost."""
    timing = cross_timing(f, events, until=nxt)
    d: Dict[str, Any] = dict(timing)
    if t_start is not None:
        d["at_s"] = None if f.ts is None else round(f.ts - t_start, 3)
        d["restored_at_s"] = None if f.restored is None else round(f.restored - t_start, 3)
        for r in d["relays"]:
            r["on_s"] = round(r["on"] - t_start, 3)
            r["off_s"] = None if r["off"] is None else round(r["off"] - t_start, 3)
    if f.ts is not None and f.issued is not None:
        d["fault_ts_uncertainty_ms"] = round((f.ts - f.issued) * 1000.0, 2)
    if f.ts is not None and timing["detection_ms"] is None:
        issues.append(f"{f.label}: no rank reported it (no link_down/failover event)")
    if f.ts is not None and not timing["relay_on"]:
        issues.append(f"{f.label}: the pair was never relayed (no relay_on event)")
    if f.restored is not None and timing["relay_on"] and timing["recovery_ms"] is None:
        issues.append(f"{f.label}: the pair never went back to a direct rail after the repair (no relay_off "
                      f"path_back)")
    if timing["peer_lost"]:
        issues.append(f"{f.label}: {timing['peer_lost']} peer_lost events")
    return d


def _comparison(rep: Dict[str, Any], opts, faulty, ref, issues: List[str]) -> None:
    """The faulty run against the fault-free one: losses and parameters, bit for bit."""
    _, fsteps = read_steps(faulty.dir)
    rstarts, rsteps = read_steps(ref.dir)
    ffinal = _read_json(os.path.join(faulty.dir, "final.json")) or {}
    rfinal = _read_json(os.path.join(ref.dir, "final.json")) or {}
    fsteps, rsteps_sorted = sorted(fsteps, key=lambda s: s["step"]), sorted(rsteps, key=lambda s: s["step"])
    fl_hex, rl_hex = [s["loss_hex"] for s in fsteps], [s["loss_hex"] for s in rsteps_sorted]
    div = next((i for i, (a, b) in enumerate(zip(fl_hex, rl_hex)) if a != b), None)
    losses_same = fl_hex == rl_hex and len(fl_hex) == opts.steps
    hash_same = bool(ffinal.get("params_sha256")) and ffinal.get("params_sha256") == rfinal.get("params_sha256")
    arrays_same = _params_equal(faulty.dir, ref.dir)
    ref_events = read_events(ref.dir)
    r_train = (round(rsteps[-1]["t"] - rstarts[0]["start"], 2) if rsteps and rstarts else None)
    rep["reference_run"] = {"exit_status": ref.rc, "wall_s": round(ref.wall_s, 2), "training_s": r_train,
                            "steps_recorded": len(rsteps), "exceptions": _errors(ref.dir),
                            "final": rfinal or None, "events": len(ref_events)}
    rep["comparison"] = {
        "losses_identical": losses_same, "first_divergent_step": div,
        "params_sha256_faulty": ffinal.get("params_sha256"),
        "params_sha256_reference": rfinal.get("params_sha256"),
        "params_hash_identical": hash_same, "params_arrays_identical": arrays_same,
        "max_abs_loss_diff": max((abs(a["loss"] - b["loss"]) for a, b in zip(fsteps, rsteps_sorted)), default=None),
    }
    rep["bit_identical"] = bool(losses_same and hash_same and arrays_same)
    if not rep["bit_identical"]:
        issues.append("the faulty run is not bit-identical to the fault-free reference "
                      f"(first divergent step {div}, params hash identical: {hash_same})")
    if ref_events:
        kinds = sorted({e['event'] for e in ref_events})
        issues.append(f"{len(ref_events)} link events ({', '.join(kinds)}) in the fault-free reference run")
    if ref.rc != 0:
        issues.append(f"the reference run exited with status {ref.rc} (see {ref.dir}/train.log)")


def _traffic_back(rep: Dict[str, Any], events: List[Dict[str, Any]], issues: List[str],
                  run_dir: Optional[str] = None) -> None:
    """Is every pair's traffic back on rail 0 (and none relayed) at the end? From the ranks' own routes at the
    end of training (``routes-rank*.json``) when they wrote them, else from the events."""
    routes = _read_routes(run_dir) if run_dir else None
    if routes:
        off = sorted(f"{r}->{p}: " + (f"via rank {v['via']}" if v.get("via") is not None
                                      else f"rail {v.get('primary')}")
                     for r, rr in routes.items() for p, v in rr.get("peers", {}).items()
                     if v.get("via") is not None or v.get("primary") != 0)
        rep["routes_at_end"] = {str(r): rr.get("peers") for r, rr in routes.items()}
        rep["relayed_at_end"] = sorted(f"{r}->{p}" for r, rr in routes.items() for p, v in rr.get("peers", {}).items()
                                       if v.get("via") is not None)
    else:
        active: Dict[Tuple[int, int], Any] = {}
        for e in events:
            key = (e.get("rank"), e.get("peer"))
            if e.get("event") in ("failover", "failback"):
                active[key] = e["rail"]
            elif e.get("event") == "no_path" and not str(active.get(key)).startswith("via"):
                active[key] = None
            elif e.get("event") == "relay_on":
                active[key] = f"via {e.get('via')}"
            elif e.get("event") == "relay_off":
                active[key] = 0 if e.get("cause") == "path_back" else None  # the primary is picked first
        off = sorted(f"{a}->{b}: " + (r if isinstance(r, str) else f"rail {r}")
                     for (a, b), r in active.items() if r != 0)
    rep["all_traffic_back_on_rail0"] = not off
    if off:
        issues.append("traffic still off the primary rail at the end: " + ", ".join(off))


def _read_routes(run_dir: str) -> Optional[Dict[int, Dict[str, Any]]]:
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "routes-rank*.json"))):
        d = _read_json(path)
        if d and not d.get("error"):
            out[int(d["rank"])] = d
    return out or None


# ------------------------------------------------------------------ markdown
def _n(v: Optional[int]) -> str:
    return "?" if v is None else f"{v:,}"


def to_markdown(rep: Dict[str, Any]) -> str:
    L: List[str] = []
    for part in (_md_setup, _md_training, _md_faults, _md_verdict):
        L += part(rep) + [""]
    return "\n".join(L)


def _md_setup(rep: Dict[str, Any]) -> List[str]:
    L: List[str] = [f"# {rep['title']}", ""]
    tb = rep.get("testbed") or {}
    if rep["mode"] == "testbed":
        L.append(f"Testbed `{tb.get('name')}`: {tb.get('hosts')} hosts (network namespaces) x {tb.get('rails')} "
                 f"rails, each rail shaped to {tb.get('rate') or 'no limit'}; one rank per host; DDP over the "
                 f"`linkescape` backend, model `{rep['model_size']}` ({_n(rep.get('params'))} parameters), "
                 f"{rep['steps']} steps, seed {rep['seed']}.")
    else:
        L.append(f"**{rep['note']}**")
        L.append("")
        L.append(f"{tb.get('hosts')} ranks x {tb.get('rails')} rails; DDP over the `linkescape` backend, model "
                 f"`{rep['model_size']}` ({_n(rep.get('params'))} parameters), {rep['steps']} steps, "
                 f"seed {rep['seed']}.")
    ls = rep.get("library_settings") or {}
    if ls:
        L.append("")
        L.append(f"Library settings: silent-loss timeout {ls['silent_timeout_ms']} ms, "
                 f"heartbeat {ls['heartbeat_ms']} ms, failback hold-down {ls['failback_holddown_ms']} ms"
                 + (f", no-path deadline {ls['no_path_timeout_s']:g} s" if ls.get("no_path_timeout_s") else "")
                 + " (LINKESCAPE_SILENT_TIMEOUT_MS, LINKESCAPE_HEARTBEAT_MS, LINKESCAPE_FAILBACK_HOLDDOWN_MS"
                 + (", LINKESCAPE_NO_PATH_TIMEOUT" if ls.get("no_path_timeout_s") else "") + ").")
    return L


def _md_training(rep: Dict[str, Any]) -> List[str]:
    fr = rep.get("faulty_run") or {}
    L = ["## Training", ""]
    lost = rep["steps_lost"]
    L.append(f"- **Training steps lost: {lost}** ({fr.get('steps_recorded', 0)}/{rep['steps']} steps recorded, "
             f"{fr.get('restarts', 0)} restarts, {len(fr.get('exceptions') or [])} exceptions, exit status "
             f"{fr.get('exit_status')}).")
    if fr.get("training_s") is not None:
        paced = fr.get("paced_min_duration_s")
        paused = fr.get("paused_s") or 0.0
        r_train = (rep.get("reference_run") or {}).get("training_s")
        L.append(f"- Training took {fr['training_s']} s, {fr.get('mean_step_s')} s per step"
                 + (f" (the fault-free run: {r_train} s)" if r_train else "")
                 + (f" (steps paced, {paused:.1f} s of pauses in all, so that the run lasts {paced:g} s and "
                    f"every fault fits; the numbers are unchanged)" if paced and paused > 0.05 else "") + ".")
    bi = rep.get("bit_identical")
    cmp_ = rep.get("comparison")
    if bi is None:
        L.append("- Fault-free comparison: skipped (`--no-reference`).")
    else:
        losses = ("identical" if cmp_["losses_identical"]
                  else f"differ from step {cmp_['first_divergent_step']}")
        L.append(f"- **Bit-identical to the fault-free run: {'yes' if bi else 'NO'}** (per-step losses {losses}"
                 f"; parameters SHA-256 `{(cmp_['params_sha256_faulty'] or '?')[:16]}...` vs "
                 f"`{(cmp_['params_sha256_reference'] or '?')[:16]}...`).")
    final = fr.get("final") or {}
    if final:
        L.append(f"- All {final.get('world_size')} ranks ended with the same parameters: "
                 f"{'yes' if final.get('ranks_agree') else 'NO'}.")
    return L


def _md_faults(rep: Dict[str, Any]) -> List[str]:
    fr = rep.get("faulty_run") or {}
    L = ["## Faults", ""]
    L.append("| fault | at | detected after | first detected by | repaired at | back on rail 0 after "
             "| all pairs back after | failovers / failbacks |")
    L.append("|---|---|---|---|---|---|---|---|")
    for f in rep.get("faults", []):
        det = f.get("detected_by") or {}
        by = (f"rank {det.get('rank')} {det.get('event')} ({det.get('cause')})" if det else "-")
        at = "-" if f.get("at_s") is None else f"{f['at_s']:.2f} s"
        rat = "-" if f.get("restored_at_s") is None else f"{f['restored_at_s']:.2f} s"
        det_ms, back, all_back = (format_ms(f[k], NOT_SEEN) for k in ("detection_ms", "recovery_ms", "all_back_ms"))
        if f["kind"] == "cross":
            back, all_back = f"{back} (direct again)", f"{all_back} (direct again)"
        L.append(f"| {f['label']} | {at} | {det_ms} | {by} | {rat} | {back} | {all_back} | "
                 f"{f['failovers']} / {f['failbacks']} |")
    L.append("")
    L.append("Detection: from the moment the fault was in effect (the command that applied it returned) to the "
             "first `link_down` or `failover` event on any rank. Back on rail 0: from the repair to the first "
             "`failback` (the library holds a repaired rail down for its hold-down, 1 s by default, so a "
             "flapping link cannot cause a storm of switches); for a cross, to the pair's `relay_off` (cause "
             "`path_back`): its traffic is on a direct rail again. Times are relative to the start of training.")
    L += _md_relays(rep)
    if fr.get("events_by_kind"):
        L.append("")
        L.append("Events in the faulty run: " + ", ".join(f"{k} {v}" for k, v in fr["events_by_kind"].items()) + ".")
    if rep.get("timeline_png"):
        L.append("")
        L.append(f"![timeline]({os.path.basename(rep['timeline_png'])})")
        L.append("")
        L.append(f"Timeline: `{rep['timeline_png']}`")
    return L


def _md_relays(rep: Dict[str, Any]) -> List[str]:
    """The cross faults' relays: which pair went through which host, from when, for how long."""
    crosses = [f for f in rep.get("faults", []) if f.get("kind") == "cross"]
    relays = rep.get("relays") or []
    if not crosses and not relays:
        return []
    L = ["", "### Relays", ""]
    for f in crosses:
        via = ", ".join(f"host {v}" for v in f.get("via") or []) or "-"
        L.append(f"- **{f['label']}**: hosts {' and '.join(str(h) for h in sorted({t[0] for t in f['targets']}))} "
                 f"shared no rail for {f['hold_s']:g} s; their traffic went through **{via}** "
                 f"{format_ms(f.get('relay_ms'), NOT_SEEN)} after they lost their last common rail, was relayed "
                 f"for {format_ms(f.get('relayed_ms'), NOT_SEEN)}, and went back to a direct rail "
                 f"{format_ms(f.get('recovery_ms'), NOT_SEEN)} after the repair "
                 f"({f.get('relay_on', 0)} relay_on / {f.get('relay_off', 0)} relay_off events); the longest "
                 f"training step meanwhile took {format_ms(ms(f.get('longest_step_s')), NOT_SEEN)}.")
    if relays:
        L.append("")
        L.append("| pair | via | relayed at | until | for | ended by | bytes through the relay |")
        L.append("|---|---|---|---|---|---|---|")
        for r in relays:
            until = "end of training" if r["off_s"] is None else f"{r['off_s']:.2f} s"
            L.append(f"| host {r['pair'][0]} - host {r['pair'][1]} | "
                     f"{', '.join(f'host {v}' for v in r['via']) or '-'} | {r['on_s']:.2f} s | {until} | "
                     f"{format_ms(r['relayed_ms'], NOT_SEEN)} | {', '.join(r['ended_by']) or '-'} | "
                     f"{r['bytes']:,} |")
    L.append("")
    L.append("A relay: two hosts with no rail in common (a cross) go on through a third host that reaches both; "
             "`relay_on` when the first frame comes back through it, `relay_off` (`path_back`) once a direct "
             "rail is back and past its hold-down.")
    return L


def _md_verdict(rep: Dict[str, Any]) -> List[str]:
    L = ["## Verdict", ""]
    if rep.get("issues"):
        for i in rep["issues"]:
            L.append(f"- {i}")
    else:
        L.append("- No issue: every step trained, every fault was detected and repaired, and the result is "
                 "bit-identical to the fault-free run." if rep.get("bit_identical") else "- No issue found.")
    L.append("")
    L.append(f"Demo runtime: {rep['runtime_s']} s.")
    return L


# ------------------------------------------------------------------ timeline picture
def plot_timeline(path: str, rep: Dict[str, Any], run) -> Optional[str]:
    """Throughput per host and rail over time, faults marked; the loss curve on top."""
    starts, steps = read_steps(run.dir)
    t0 = starts[0]["start"] if starts else (run.samples[0][0] if run.samples else time.time())
    rep_t0 = starts[0]["start"] if starts else 0.0  # what the report's times are relative to
    hosts = (rep.get("testbed") or {}).get("hosts") or (len(run.samples[0][1]) if run.samples else 1)
    rails = (rep.get("testbed") or {}).get("rails") or 2
    ref_note = ""
    if rep.get("bit_identical") is not None:
        ref_note = ("  |  bit-identical to the fault-free run" if rep["bit_identical"]
                    else "  |  NOT bit-identical to the fault-free run")
    mode = "EMULATED faults (loopback)" if rep.get("emulated") else (
        f"testbed, {rails} rails x {(rep.get('testbed') or {}).get('rate') or 'unshaped'}")
    samples = run.samples
    unit = "Mbit/s sent" if rep.get("emulated") else "Mbit/s tx"
    lanes = []
    ts = [s[0] for s in samples]
    for h in range(hosts):
        series = []
        for r in range(rails):
            xs, ys = [], []
            k = 4  # ~200 ms window
            for i in range(k, len(samples)) if len(samples) >= 2 else ():
                dt = ts[i] - ts[i - k]
                if dt <= 0:
                    continue
                db = samples[i][1][h][r] - samples[i - k][1][h][r]
                ys.append(max(0.0, db / dt) * 8 / 1e6)
                xs.append((ts[i] + ts[i - k]) / 2 - t0)
            series.append((f"rail {r} (r{r})", xs, ys))
        lanes.append({"label": f"h{h}", "ylabel": f"h{h}\n{unit}", "series": series})
    faults = []
    for f in rep.get("faults", []):
        if f.get("kind") == "cross":  # one mark per NIC of it, in its host's lane
            label = " cross " + " + ".join(f"h{h} r{r}" for h, r in f.get("targets") or [])
            for k, (h, r) in enumerate(f.get("targets") or []):
                faults.append({**f, "host": h, "rail": r, "transitions": [], "top_text": label if k == 0 else "",
                               "note": f"cross r{r}\ndetect {format_ms(f.get('detection_ms'), NOT_SEEN)}\n"
                                       f"relayed after {format_ms(f.get('relay_ms'), NOT_SEEN)}"})
            continue
        faults.append({**f, "transitions": [(t - t0, s) for t, s in f.get("transitions") or []]})
    relays = [{"pair": r["pair"], "via": r["via"], "t0": r["on_s"] + (rep_t0 - t0),
               "t1": None if r["off_s"] is None else r["off_s"] + (rep_t0 - t0)} for r in rep.get("relays") or []]
    t_end = steps[-1]["t"] - t0 if steps else (samples[-1][0] - t0 if samples else 1.0)
    source = ("bytes the library wrote per rail (loopback has no NIC per rail)" if rep.get("emulated")
              else "tx_bytes of every host NIC, sampled every 50 ms")
    top = {"xs": [s["t"] - t0 for s in steps], "ys": [s["loss"] for s in steps], "label": "loss (faulty run)",
           "ylabel": "loss"}
    return draw_timeline(path, lanes, faults, top=top, t_end=t_end, relays=relays,
                         title=f"linkescape demo: {mode}  |  steps lost: {rep.get('steps_lost')}{ref_note}",
                         xlabel=f"seconds since training start (dashed: fault, dotted green: repair, teal band: "
                                f"relayed through another host)\ntraffic: {source}")


def write_report(rep: Dict[str, Any], out_dir: str) -> Tuple[str, str]:
    jpath = os.path.join(out_dir, "report.json")
    mpath = os.path.join(out_dir, "report.md")
    with open(jpath + ".tmp", "w") as f:
        json.dump(rep, f, indent=2, default=str)
    os.replace(jpath + ".tmp", jpath)
    with open(mpath, "w") as f:
        f.write(to_markdown(rep))
    return jpath, mpath


__all__ = ["build_report", "fault_timing", "cross_timing", "plot_timeline", "to_markdown", "write_report",
           "read_events", "read_steps", "related"]
