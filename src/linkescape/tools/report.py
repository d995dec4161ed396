"""``linkescape report events-*.jsonl [--png PATH] [--json]``: the faults in any job's event trail.

One row per fault found in the trail (see ``tools.timeline.infer_faults``):
when it was detected and by whom, how long until traffic moved (failover),
until the rail was back (``link_up``), and until traffic moved back
(``failback``). ``--png`` draws the demo's timeline from the trail alone: per
host and rail, how many peers' traffic the rail carries, with every event.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Dict, List, Sequence

from ..errors import UsageError
from ..events import read_events
from .timeline import draw_timeline, fault_rows, format_ms, infer_faults, routed_lanes


def read_trails(paths: Sequence[str]) -> List[Dict[str, Any]]:
    """Events of every file (a directory: its ``*.jsonl``), oldest first."""
    files: List[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "*.jsonl")))
        elif any(c in p for c in "*?["):
            files += sorted(glob.glob(p))
        else:
            files.append(p)
    if not files:
        raise UsageError("no event trail given (events-*.jsonl files or a directory of them)")
    out: List[Dict[str, Any]] = []
    for f in files:
        try:
            out += [e for e in read_events(f) if isinstance(e, dict) and "ts" in e and "event" in e]
        except OSError as exc:
            raise UsageError(f"cannot read {f}: {exc}") from None
    return sorted(out, key=lambda e: e["ts"])


def build(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    if not events:
        return {"t0": None, "ranks": 0, "rails": 0, "events": 0, "events_by_kind": {}, "faults": []}
    t0 = events[0]["ts"]
    ranks = 1 + max(max(int(e.get("rank") or 0), int(e["peer"]) if isinstance(e.get("peer"), int) else 0)
                    for e in events)
    rails = 1 + max([int(e["rail"]) for e in events if isinstance(e.get("rail"), int) and e["rail"] >= 0]
                    + [int(e["from_rail"]) for e in events if isinstance(e.get("from_rail"), int)] + [0])
    faults = infer_faults(events)
    rows = fault_rows(faults, events, t0)
    kinds: Dict[str, int] = {}
    for e in events:
        kinds[e["event"]] = kinds.get(e["event"], 0) + 1
    return {"t0": t0, "duration_s": events[-1]["ts"] - t0, "ranks": ranks, "rails": rails, "events": len(events),
            "events_by_kind": dict(sorted(kinds.items())), "faults": rows}


def table(rep: Dict[str, Any]):
    from rich.table import Table

    t = Table(title=f"{len(rep['faults'])} faults in {rep['events']} events of {rep['ranks']} ranks "
                    f"({rep.get('duration_s') or 0:.1f} s)", title_justify="left")
    for col, just in (("fault", "left"), ("detected at", "right"), ("detected by", "left"),
                      ("failover after", "right"), ("all failed over", "right"), ("rail back after", "right"),
                      ("failback after", "right"), ("all back", "right"), ("failovers / failbacks", "right")):
        t.add_column(col, justify=just)
    for r in rep["faults"]:
        det = r.get("detected_by") or {}
        t.add_row(r["fault"], f"{r['detected_s']:.3f} s",
                  f"rank {det.get('rank')} {det.get('event')} ({det.get('cause')})" if det else "-",
                  *(format_ms(r[k]) for k in ("failover_ms", "all_failed_over_ms", "down_ms", "failback_ms",
                                              "all_back_ms")), f"{r['failovers']} / {r['failbacks']}"
                  + (f"  no_path {r['no_path']}" if r["no_path"] else "") + (
                      f"  peer_lost {r['peer_lost']}" if r["peer_lost"] else ""))
    return t


def plot(path: str, rep: Dict[str, Any], events: List[Dict[str, Any]]) -> str:
    t0 = rep["t0"] or 0.0
    t_end = rep.get("duration_s") or 1.0
    lanes = routed_lanes(events, rep["ranks"], max(1, rep["rails"]), t0, t_end)
    faults = [{"kind": r["kind"], "host": r["host"], "rail": r["rail"], "at_s": r["detected_s"],
               "restored_at_s": r["back_on_rail_s"], "transitions": r["transitions"],
               "note": f"{r['kind']} r{r['rail']}\nfailover {format_ms(r['failover_ms'])}\n"
                       f"failback {format_ms(r['failback_ms'])}"}
              for r in rep["faults"]]
    raster = [(e["ts"] - t0, int(e.get("rank") or 0), e["event"]) for e in events]
    return draw_timeline(path, lanes, faults, events=raster, t_end=t_end, pad=max(0.05, 0.03 * t_end),
                         title=f"linkescape event trail: {rep['ranks']} ranks x {rep['rails']} rails, "
                               f"{len(rep['faults'])} faults (lanes: how many peers' traffic each rail carries)",
                         xlabel="seconds since the first event (dashed: detected, dotted green: rail back; "
                                "failover: from detection, failback: from the rail back)")


__all__ = ["read_trails", "build", "table", "plot"]
