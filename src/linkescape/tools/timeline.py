"""Faults in an event trail, their timing, and the timeline picture.

Shared by the demo (which knows when it injected each fault) and
``linkescape report`` (which finds the faults in any job's trail).

A *fault* here is anything with ``host``, ``rail``, ``ts`` (when it was in
effect, or first detected), optionally ``issued``, ``restore_issued`` and
``restored`` (when the rail was back). :func:`fault_timing` measures it
against the ranks' events; :func:`infer_faults` builds such faults from a
trail alone: the ``link_down`` events of one rail that share a host form one
fault; the faulty host is the one whose own carrier went (``carrier``), or
whose peers were told so (``peer_carrier``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import extras

DETECT_EVENTS = ("link_down", "failover")
#: an event more than this long after a fault is not counted as its detection
DETECT_WINDOW = 10.0
#: link_down events of one rail this close together, sharing a host, are one fault
JOIN_WINDOW = 5.0
#: a fault on the same host and rail again this soon after the rail came back is a flap
FLAP_WINDOW = 3.0
#: a time that was never measured, in the demo's words
NOT_SEEN = "not seen"


def _get(f: Any, name: str):
    return f.get(name) if isinstance(f, dict) else getattr(f, name, None)


def related(ev: Dict[str, Any], host: int, rail: int) -> bool:
    """Is this event about (host, rail): the host's own links on the rail, or its peers' links to it?"""
    if ev.get("rank") != host and ev.get("peer") != host:
        return False
    kind = ev.get("event")
    if kind == "failover":
        return ev.get("from_rail") == rail
    if kind == "failback":
        return ev.get("rail") == rail
    if kind in ("link_down", "link_up"):
        return ev.get("rail") == rail
    return kind in ("no_path", "peer_lost")


def fault_timing(fault: Any, events: Sequence[Dict[str, Any]], until: Optional[float] = None) -> Dict[str, Any]:
    """Detection (fault -> first link_down/failover on any rank) and recovery
    (repair -> failback) of one fault, from the ranks' events."""
    host, rail = _get(fault, "host"), _get(fault, "rail")
    issued, ts = _get(fault, "issued"), _get(fault, "ts")
    r_issued, restored = _get(fault, "restore_issued"), _get(fault, "restored")
    out: Dict[str, Any] = {"detection_ms": None, "detection_raw_ms": None, "detected_by": None,
                           "recovery_ms": None, "recovered_by": None, "all_back_ms": None, "link_downs": 0,
                           "failovers": 0, "failbacks": 0, "no_path": 0, "peer_lost": 0}
    if ts is None:
        return out
    start = issued if issued is not None else ts
    end = until if until is not None else float("inf")
    mine = sorted((e for e in events if related(e, host, rail) and start <= e.get("ts", 0.0) < end),
                  key=lambda e: e["ts"])
    for e in mine:
        key = {"link_down": "link_downs", "failover": "failovers", "failback": "failbacks"}.get(e["event"],
                                                                                               e["event"])
        if key in out:
            out[key] += 1
    det = next((e for e in mine if e["event"] in DETECT_EVENTS and e["ts"] - ts <= DETECT_WINDOW), None)
    if det is not None:
        # A carrier event can be stamped before the command that applied the
        # fault has returned (ts is taken after it): detection is then < 1 ms.
        out["detection_raw_ms"] = (det["ts"] - ts) * 1000.0
        out["detection_ms"] = max(0.0, out["detection_raw_ms"])
        out["detected_by"] = {k: det.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause")}
    if restored is not None:
        back = [e for e in mine if e["event"] == "failback" and e["ts"] >= (r_issued or restored)]
        if back:
            out["recovery_ms"] = max(0.0, (back[0]["ts"] - restored) * 1000.0)
            out["recovered_by"] = {k: back[0].get(k) for k in ("ts", "rank", "event", "peer", "rail")}
            # every pair that moved away is back: the last failback of that burst
            moved = {(e["rank"], e["peer"]) for e in mine if e["event"] == "failover"}
            last = {}
            for e in back:
                last[(e["rank"], e["peer"])] = e["ts"]
            if moved and moved <= set(last):
                out["all_back_ms"] = max(0.0, (max(last[p] for p in moved) - restored) * 1000.0)
    return out


# ------------------------------------------------------------------ faults found in a trail
def _host_of(downs: Sequence[Dict[str, Any]], candidates: set) -> Optional[int]:
    for e in downs:
        if e.get("cause") == "carrier":
            return e.get("rank")
        if e.get("cause") == "peer_carrier":
            return e.get("peer")
    return min(candidates) if len(candidates) == 1 else None


def infer_faults(events: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Faults (host, rail, ts = first detection, restored = rail back) found in an event trail."""
    evs = sorted((e for e in events if e.get("ts") is not None), key=lambda e: e["ts"])
    episodes: List[Dict[str, Any]] = []
    for e in evs:
        if e.get("event") != "link_down" or e.get("rail") is None or e.get("peer") is None:
            continue
        pair = {e["rank"], e["peer"]}
        ep = next((x for x in reversed(episodes) if x["rail"] == e["rail"] and e["ts"] - x["ts"] <= JOIN_WINDOW
                   and (x["restored"] is None or x["restored"] > e["ts"]) and x["candidates"] & pair), None)
        if ep is None:
            ep = {"rail": e["rail"], "ts": e["ts"], "candidates": set(pair), "downs": [], "restored": None}
            episodes.append(ep)
        ep["candidates"] &= pair
        ep["downs"].append(e)
        # the rail is back once every link that went down is up again
        ep["open"] = ep.get("open", set()) | {(e["rank"], e["peer"])}
        _close_when_up(ep, evs)
    faults: List[Dict[str, Any]] = []
    for ep in episodes:
        host = _host_of(ep["downs"], ep["candidates"])
        causes = sorted({d.get("cause") for d in ep["downs"] if d.get("cause")})
        f = {"host": host, "hosts": sorted(ep["candidates"]), "rail": ep["rail"], "ts": ep["ts"], "issued": None,
             "restore_issued": None, "restored": ep["restored"], "causes": causes, "kind": _kind(causes),
             "transitions": [(ep["ts"], "down")] + ([(ep["restored"], "up")] if ep["restored"] else [])}
        prev = faults[-1] if faults else None
        if (prev is not None and prev["host"] == host and prev["rail"] == f["rail"] and prev["restored"] is not None
                and f["ts"] - prev["restored"] <= FLAP_WINDOW):
            prev["kind"] = "flap"
            prev["restored"] = f["restored"]
            prev["transitions"] += f["transitions"]
            prev["causes"] = sorted(set(prev["causes"]) | set(causes))
            continue
        faults.append(f)
    for f in faults:
        f["label"] = f"{f['kind']} h{f['host'] if f['host'] is not None else '/'.join(map(str, f['hosts']))} r{f['rail']}"
    return faults


def _close_when_up(ep: Dict[str, Any], evs: Sequence[Dict[str, Any]]) -> None:
    """Set ``restored`` to the time the last of the episode's links came up (or None)."""
    pending = set(ep["open"])
    last = None
    for e in evs:
        if e["ts"] < ep["ts"] or e.get("event") != "link_up" or e.get("rail") != ep["rail"]:
            continue
        key = (e.get("rank"), e.get("peer"))
        if key in pending:
            pending.discard(key)
            last = e["ts"]
            if not pending:
                break
    ep["restored"] = last if not pending else None


def _kind(causes: Sequence[str]) -> str:
    if "carrier" in causes or "peer_carrier" in causes:
        return "carrier"
    if "timeout" in causes:
        return "silent"
    return causes[0] if causes else "link"


def fault_rows(faults: Sequence[Dict[str, Any]], events: Sequence[Dict[str, Any]],
               t0: float) -> List[Dict[str, Any]]:
    """One row per fault: detection, failover, rail back, failback (the report's table)."""
    rows = []
    for i, f in enumerate(faults):
        nxt = faults[i + 1]["ts"] if i + 1 < len(faults) and faults[i + 1]["rail"] == f["rail"] else None
        timing = fault_timing(f, events, until=nxt)
        host, rail, ts = f["host"], f["rail"], f["ts"]
        hosts = [host] if host is not None else f.get("hosts") or []
        fo = sorted(e["ts"] for e in events if e.get("event") == "failover" and e.get("from_rail") == rail
                    and (e.get("rank") in hosts or e.get("peer") in hosts) and ts <= e["ts"] < (nxt or float("inf")))
        row = {"fault": f.get("label"), "kind": f.get("kind"), "host": host, "rail": rail,
               "causes": f.get("causes"), "detected_at": ts, "detected_s": ts - t0,
               "detected_by": timing["detected_by"],
               "failover_ms": (fo[0] - ts) * 1000.0 if fo else None,
               "all_failed_over_ms": (fo[-1] - ts) * 1000.0 if fo else None,
               "back_on_rail_s": None if f.get("restored") is None else f["restored"] - t0,
               "down_ms": None if f.get("restored") is None else (f["restored"] - ts) * 1000.0,
               "failback_ms": timing["recovery_ms"], "all_back_ms": timing["all_back_ms"],
               "failovers": timing["failovers"], "failbacks": timing["failbacks"],
               "no_path": timing["no_path"], "peer_lost": timing["peer_lost"],
               "transitions": [(t - t0, s) for t, s in f.get("transitions") or []]}
        rows.append(row)
    return rows


def routed_lanes(events: Sequence[Dict[str, Any]], ranks: int, rails: int, t0: float,
                 t_end: float) -> List[Dict[str, Any]]:
    """Per rank, per rail: how many peers' traffic the rail carries over time
    (from failover/failback/no_path; every peer starts on rail 0)."""
    lanes = []
    for r in range(ranks):
        route: Dict[int, Optional[int]] = {p: 0 for p in range(ranks) if p != r}
        pts: List[Tuple[float, List[int]]] = [(0.0, _count(route, rails))]
        for e in events:
            if e.get("rank") != r or e.get("peer") not in route:
                continue
            if e.get("event") in ("failover", "failback"):
                route[e["peer"]] = e.get("rail")
            elif e.get("event") in ("no_path", "peer_lost"):
                route[e["peer"]] = None
            else:
                continue
            pts.append((e["ts"] - t0, _count(route, rails)))
        pts.append((t_end, pts[-1][1]))
        series = []
        for k in range(rails):
            xs, ys = [], []
            for (t, c), (t2, _) in zip(pts, pts[1:] + [pts[-1]]):
                xs += [t, t2]
                ys += [c[k], c[k]]
            series.append((f"rail {k}", xs, ys))
        lanes.append({"label": f"h{r}", "ylabel": f"h{r}\npeers routed", "series": series})
    return lanes


def _count(route: Dict[int, Optional[int]], rails: int) -> List[int]:
    c = [0] * rails
    for v in route.values():
        if v is not None and 0 <= v < rails:
            c[v] += 1
    return c


def format_ms(v: Optional[float], missing: str = "-") -> str:
    """Milliseconds for people: ``< 1 ms``, one decimal below 10 ms, whole ones above; ``missing`` for None."""
    if v is None:
        return missing
    return "< 1 ms" if v < 1 else f"{v:.1f} ms" if v < 10 else f"{v:,.0f} ms"


FAULT_COLORS = {"cut": "red", "carrier": "red", "blackhole": "purple", "silent": "purple", "flap": "darkorange"}
RAIL_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]


def draw_timeline(path: str, lanes: Sequence[Dict[str, Any]], faults: Sequence[Dict[str, Any]], *,
                  title: str, xlabel: str, t_end: float, top: Optional[Dict[str, Any]] = None,
                  events: Optional[Sequence[Tuple[float, int, str]]] = None, pad: float = 0.5) -> str:
    """The timeline picture: an upper panel (``top``: a curve such as the loss,
    or the ``events`` as a raster of (t, rank, event)), one lane per host with
    its per-rail series, faults marked (dashed: in effect, dotted green: rail back)."""
    matplotlib = extras.module("matplotlib", "plot", "the timeline picture")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(lanes)
    fig, axes = plt.subplots(n + 1, 1, figsize=(12, 2.0 + 1.7 * n), sharex=True,
                             gridspec_kw={"height_ratios": [1.2] + [1] * n})
    axes = list(axes) if n else [axes]
    ax0 = axes[0]
    if top is not None:
        ax0.plot(top["xs"], top["ys"], color="black", lw=1.2, label=top.get("label"))
        ax0.set_ylabel(top.get("ylabel", ""))
        if top.get("label"):
            ax0.legend(loc="upper right", fontsize=8)
    elif events:
        marks = {"link_down": ("v", "red"), "failover": (">", "tab:orange"), "link_up": ("^", "green"),
                 "failback": ("<", "tab:blue"), "no_path": ("x", "black"), "peer_lost": ("X", "black")}
        for kind, (m, c) in marks.items():
            pts = [(t, r) for t, r, k in events if k == kind]
            if pts:
                ax0.scatter([p[0] for p in pts], [p[1] for p in pts], marker=m, color=c, s=18, label=kind)
        ax0.set_ylabel("events\nby rank")
        ranks = sorted({r for _, r, _ in events})
        ax0.set_yticks(ranks)
        ax0.set_ylim(-0.5, max(ranks) + 1.2)  # headroom for the fault labels
        ax0.legend(loc="upper left", bbox_to_anchor=(1.002, 1.0), fontsize=7, borderaxespad=0)
    ax0.set_title(title, fontsize=11)
    ax0.grid(alpha=0.3)
    for h, lane in enumerate(lanes):
        ax = axes[h + 1]
        for k, (label, xs, ys) in enumerate(lane["series"]):
            ax.plot(xs, ys, color=RAIL_COLORS[k % len(RAIL_COLORS)], lw=1.0, label=label)
        ax.set_ylabel(lane.get("ylabel", lane.get("label", "")), fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if h == 0 and lane["series"]:
            ax.legend(loc="upper right", fontsize=8, ncol=len(lane["series"]))
    for f in faults:
        if f.get("at_s") is None:
            continue
        c = FAULT_COLORS.get(f.get("kind"), "red")
        a = f["at_s"]
        b = f.get("restored_at_s") if f.get("restored_at_s") is not None else a
        for ax in axes:
            ax.axvline(a, color=c, ls="--", lw=0.9)
            if f.get("restored_at_s") is not None:
                ax.axvline(b, color="green", ls=":", lw=0.9)
        host = f.get("host")
        host_ax = axes[host + 1] if host is not None and host + 1 < len(axes) else None
        if host_ax is not None:
            if f.get("kind") == "flap" and f.get("transitions"):
                downs = [t for t, s in f["transitions"] if s == "down"]
                ups = [t for t, s in f["transitions"] if s == "up"]
                for d, u in zip(downs, ups):
                    host_ax.axvspan(d, u, color=c, alpha=0.25, lw=0)
            else:
                host_ax.axvspan(a, b, color=c, alpha=0.15, lw=0)
            txt = f.get("note") or (f"{f.get('kind')} r{f.get('rail')}\ndetect {format_ms(f.get('detection_ms'), NOT_SEEN)}\n"
                                    f"back {format_ms(f.get('recovery_ms'), NOT_SEEN)}")
            host_ax.text(a, 0.97, " " + txt.replace("\n", "\n "), transform=host_ax.get_xaxis_transform(),
                         va="top", ha="left", fontsize=7, color=c,
                         bbox=dict(facecolor="white", alpha=0.7, lw=0, pad=1))
        where = f"h{host}" if host is not None else "h?"
        ax0.text(a, 0.97, f" {f.get('kind')} {where} r{f.get('rail')}", transform=ax0.get_xaxis_transform(),
                 va="top", ha="left", fontsize=8, color=c, bbox=dict(facecolor="white", alpha=0.7, lw=0, pad=1))
    axes[-1].set_xlim(-pad, t_end + pad)
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["related", "fault_timing", "infer_faults", "fault_rows", "routed_lanes", "draw_timeline", "format_ms",
           "DETECT_EVENTS", "DETECT_WINDOW", "NOT_SEEN"]
