"""``linkescape report events-*.jsonl [--png PATH] [--json]``: the faults in any job's event trail.

One row per fault found in the trail (see ``tools.timeline.infer_faults``):
when it was detected and by whom, how long until traffic moved (failover),
until the rail was back (``link_up``), and until traffic moved back
(``failback``). One row per relayed pair (``relay_on`` .. ``relay_off``: two
ranks with no rail in common going on through a third): through which rank,
from when, for how long, how it ended. ``--png`` draws the demo's timeline
from the trail alone: per host and rail, how many peers' traffic the rail
carries (and how many go through a relay), every event, and each relayed
pair as a band.
"""

from __future__ import annotations

import glob
import os
from typing import Any, Dict, List, Sequence

from ..common.errors import UsageError
from ..common.events import read_events
from .timeline import draw_timeline, fault_rows, format_ms, infer_faults, relay_intervals, relay_pairs, routed_lanes


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


def relay_rows(events: List[Dict[str, Any]], t0: float, t_end: float) -> List[Dict[str, Any]]:
    """One row per relayed pair of ranks (both ends merged): via, from, to, how long, how it ended."""
    rows = []
    for p in relay_pairs(relay_intervals(events, t_end), t_end):
        rows.append({"pair": p["pair"], "via": p["via"], "on_s": p["t_on"] - t0,
                     "off_s": None if p["t_off"] is None else p["t_off"] - t0, "seconds": p["seconds"],
                     "relays": p["relays"], "causes": p["causes"], "bytes": p["bytes"]})
    return rows


def build(events: List[Dict[str, Any]]) -> Dict[str, Any]:
    if not events:
        return {"t0": None, "ranks": 0, "rails": 0, "events": 0, "events_by_kind": {}, "faults": [], "relays": []}
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
    t_end = events[-1]["ts"]
    return {"t0": t0, "duration_s": t_end - t0, "ranks": ranks, "rails": rails, "events": len(events),
            "events_by_kind": dict(sorted(kinds.items())), "faults": rows,
            "relays": relay_rows(events, t0, t_end),
            "relay_intervals": [{**r, "on_s": r["t_on"] - t0, "off_s": None if r["t_off"] is None else r["t_off"] - t0}
                                for r in relay_intervals(events, t_end)]}


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


def relay_table(rep: Dict[str, Any]):
    """The relayed pairs: None when the trail has none."""
    from rich.table import Table

    if not rep.get("relays"):
        return None
    t = Table(title=f"{len(rep['relays'])} relayed pair(s) (no rail in common: traffic through a third rank)",
              title_justify="left")
    for col, just in (("pair", "left"), ("via", "left"), ("relayed at", "right"), ("until", "right"),
                      ("for", "right"), ("ended by", "left"), ("relay_on (both ends)", "right"),
                      ("bytes through the relay", "right")):
        t.add_column(col, justify=just)
    for r in rep["relays"]:
        t.add_row(f"h{r['pair'][0]} - h{r['pair'][1]}", ", ".join(f"rank {v}" for v in r["via"]) or "-",
                  f"{r['on_s']:.3f} s", "still relayed" if r["off_s"] is None else f"{r['off_s']:.3f} s",
                  format_ms(None if r["seconds"] is None else r["seconds"] * 1000.0),
                  ", ".join(r["causes"]) or "-", str(r["relays"]), f"{r['bytes']:,}")
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
    relays = [{"pair": r["pair"], "via": r["via"], "t0": r["on_s"], "t1": r["off_s"]} for r in rep.get("relays") or []]
    return draw_timeline(path, lanes, faults, events=raster, t_end=t_end, pad=max(0.05, 0.03 * t_end), relays=relays,
                         title=f"linkescape event trail: {rep['ranks']} ranks x {rep['rails']} rails, "
                               f"{len(rep['faults'])} faults (lanes: how many peers' traffic each rail carries)",
                         xlabel="seconds since the first event (dashed: detected, dotted green: rail back; "
                                "failover: from detection, failback: from the rail back; teal band: relayed)")


__all__ = ["read_trails", "build", "table", "relay_table", "relay_rows", "plot"]
