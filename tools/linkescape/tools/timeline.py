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

A *relay* (two ranks with no rail in common going on through a third) is a
``relay_on`` .. ``relay_off`` stretch of one rank's trail for one peer:
:func:`relay_intervals` finds them, :func:`relay_pairs` merges the two ends of
each pair, and the picture draws each as a band in the lanes of the pair's
hosts, naming the rank in between.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..common import extras

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


def fault_timing(fault: Any, events: Sequence[Dict[str, Any]], until: Optional[float] = None,
                 back_until: Optional[float] = None) -> Dict[str, Any]:
    """Detection (fault -> first link_down/failover on any rank) and recovery
    (repair -> failback) of one fault, from the ranks' events.

    ``until``: when the next fault began; its detection, failovers and links
    down are counted up to there. A failback belongs to the latest repair
    before it (a repaired rail comes back after a hold-down, which may end
    after the next fault began): this fault's failbacks are looked for from
    its repair to ``back_until``, the next fault's repair (default: none)."""
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
        key = {"link_down": "link_downs", "failover": "failovers"}.get(e["event"], e["event"])
        if key in out:  # (failbacks are counted below, from the repair on)
            out[key] += 1
    det = next((e for e in mine if e["event"] in DETECT_EVENTS and e["ts"] - ts <= DETECT_WINDOW), None)
    if det is not None:
        # A carrier event can be stamped before the command that applied the
        # fault has returned (ts is taken after it): detection is then < 1 ms.
        out["detection_raw_ms"] = (det["ts"] - ts) * 1000.0
        out["detection_ms"] = max(0.0, out["detection_raw_ms"])
        out["detected_by"] = {k: det.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause")}
    if restored is not None:
        b0, b1 = r_issued or restored, back_until if back_until is not None else float("inf")
        back = sorted((e for e in events if e.get("event") == "failback" and related(e, host, rail)
                       and b0 <= e.get("ts", 0.0) < b1), key=lambda e: e["ts"])
        out["failbacks"] = len(back)
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
        same = i + 1 < len(faults) and faults[i + 1]["rail"] == f["rail"]
        nxt = faults[i + 1]["ts"] if same else None
        timing = fault_timing(f, events, until=nxt, back_until=faults[i + 1].get("restored") if same else None)
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
    (from failover/failback/no_path; every peer starts on rail 0), and, when the
    rank had any, how many peers it reached through a relay (``relay_on`` ..
    ``relay_off``). A relay that ends because a rail is back (``path_back``)
    hands the peer to the primary rail, rail 0: the event does not say which
    rail took the traffic, and the primary is the one the policy picks first."""
    lanes = []
    for r in range(ranks):
        route: Dict[int, Any] = {p: 0 for p in range(ranks) if p != r}
        pts: List[Tuple[float, List[int]]] = [(0.0, _count(route, rails))]
        relayed = False
        for e in events:
            if e.get("rank") != r or e.get("peer") not in route:
                continue
            kind = e.get("event")
            if kind in ("failover", "failback"):
                route[e["peer"]] = e.get("rail")
            elif kind in ("no_path", "peer_lost"):
                if route[e["peer"]] == "relay" and kind == "no_path":
                    continue  # the relay still carries it until relay_off says otherwise
                route[e["peer"]] = None
            elif kind == "relay_on":
                route[e["peer"]] = "relay"
                relayed = True
            elif kind == "relay_off":
                route[e["peer"]] = 0 if e.get("cause") == "path_back" else None
            else:
                continue
            pts.append((e["ts"] - t0, _count(route, rails)))
        pts.append((t_end, pts[-1][1]))
        series = []
        for k in range(rails + (1 if relayed else 0)):
            xs, ys = [], []
            for (t, c), (t2, _) in zip(pts, pts[1:] + [pts[-1]]):
                xs += [t, t2]
                ys += [c[k], c[k]]
            series.append((f"rail {k}" if k < rails else "via a relay", xs, ys))
        lanes.append({"label": f"h{r}", "ylabel": f"h{r}\npeers routed", "series": series})
    return lanes


def _count(route: Dict[int, Any], rails: int) -> List[int]:
    """Peers per rail, then (last) peers through a relay."""
    c = [0] * (rails + 1)
    for v in route.values():
        if v == "relay":
            c[rails] += 1
        elif isinstance(v, int) and 0 <= v < rails:
            c[v] += 1
    return c


# ------------------------------------------------------------------ relays
RELAY_EVENTS = ("relay_on", "relay_off")


def relay_intervals(events: Sequence[Dict[str, Any]], t_end: Optional[float] = None) -> List[Dict[str, Any]]:
    """Every relayed stretch of a trail (events of any ranks, each with ``rank``): per rank and peer from
    ``relay_on`` to the next ``relay_off`` of that pair: ``{"rank", "peer", "via", "t_on", "t_off", "cause",
    "bytes", "seconds"}``; ``t_off`` None (and ``seconds`` up to ``t_end``, or None) while it lasts."""
    out: List[Dict[str, Any]] = []
    opened: Dict[Tuple[Any, Any], Dict[str, Any]] = {}
    for e in sorted((e for e in events if e.get("event") in RELAY_EVENTS and e.get("ts") is not None),
                    key=lambda e: e["ts"]):
        key = (e.get("rank"), e.get("peer"))
        if e["event"] == "relay_on":
            if key in opened:  # on again without an off (another via): the first ended there
                out.append({**opened.pop(key), "t_off": e["ts"], "cause": None, "bytes": None})
            opened[key] = {"rank": e.get("rank"), "peer": e.get("peer"), "via": e.get("via"), "t_on": e["ts"]}
        elif key in opened:
            out.append({**opened.pop(key), "t_off": e["ts"], "cause": e.get("cause"), "bytes": e.get("bytes")})
    out += [{**rec, "t_off": None, "cause": None, "bytes": None} for rec in opened.values()]
    for rec in out:
        end = rec["t_off"] if rec["t_off"] is not None else t_end
        rec["seconds"] = None if end is None else end - rec["t_on"]
    return sorted(out, key=lambda r: (r["t_on"], str(r["rank"]), str(r["peer"])))


def relay_pairs(intervals: Sequence[Dict[str, Any]], t_end: Optional[float] = None) -> List[Dict[str, Any]]:
    """The relayed stretches of each pair of ranks, both ends merged: ``{"pair": [a, b], "via": [...],
    "t_on", "t_off" (None while it lasts), "seconds" (the union of both ends' stretches), "relays"
    (stretches), "causes" (of the relay_offs), "bytes"}``; one row per overlapping run of stretches."""
    by_pair: Dict[Tuple[int, int], List[Dict[str, Any]]] = {}
    for r in intervals:
        if r.get("rank") is None or r.get("peer") is None:
            continue
        by_pair.setdefault(tuple(sorted((int(r["rank"]), int(r["peer"])))), []).append(r)
    rows = []
    for pair, recs in sorted(by_pair.items()):
        recs = sorted(recs, key=lambda r: r["t_on"])
        group: List[Dict[str, Any]] = []
        end: Optional[float] = None

        def close(group: List[Dict[str, Any]]) -> None:
            offs = [r["t_off"] for r in group]
            t_off = None if any(o is None for o in offs) else max(offs)
            spans = [(r["t_on"], r["t_off"] if r["t_off"] is not None else (t_end if t_end is not None else r["t_on"]))
                     for r in group]
            rows.append({"pair": list(pair), "via": sorted({r["via"] for r in group if r.get("via") is not None}),
                         "t_on": group[0]["t_on"], "t_off": t_off, "seconds": union_seconds(spans),
                         "relays": len(group),
                         "causes": sorted({str(r["cause"]) for r in group if r.get("cause")}),
                         "bytes": sum(int(r.get("bytes") or 0) for r in group)})

        for r in recs:
            r_end = r["t_off"] if r["t_off"] is not None else float("inf")
            if group and end is not None and r["t_on"] > end + 0.5:  # a gap: another relayed stretch
                close(group)
                group, end = [], None
            group.append(r)
            end = r_end if end is None else max(end, r_end)
        if group:
            close(group)
    return sorted(rows, key=lambda r: r["t_on"])


def union_seconds(spans: Sequence[Tuple[float, float]]) -> float:
    """How long the union of ``(start, end)`` spans lasts."""
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def ms(seconds: Optional[float]) -> Optional[float]:
    """Seconds to milliseconds; None stays None."""
    return None if seconds is None else seconds * 1000.0


def format_ms(v: Optional[float], missing: str = "-", whole: bool = False) -> str:
    """Milliseconds for people: ``< 1 ms``, one decimal below 10 ms, whole ones above (``whole``:
    whole ones throughout, as the chaos report writes them); ``missing`` for None or infinite."""
    if v is None or v in (float("inf"), float("-inf")):
        return missing
    if whole:
        return f"{v:.0f} ms"
    return "< 1 ms" if v < 1 else f"{v:.1f} ms" if v < 10 else f"{v:,.0f} ms"


FAULT_COLORS = {"cut": "red", "carrier": "red", "blackhole": "purple", "silent": "purple", "flap": "darkorange",
                "cross": "saddlebrown"}
RAIL_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]


def draw_timeline(path: str, lanes: Sequence[Dict[str, Any]], faults: Sequence[Dict[str, Any]], *,
                  title: str, xlabel: str, t_end: float, top: Optional[Dict[str, Any]] = None,
                  events: Optional[Sequence[Tuple[float, int, str]]] = None, pad: float = 0.5,
                  relays: Optional[Sequence[Dict[str, Any]]] = None) -> str:
    """The timeline picture: an upper panel (``top``: a curve such as the loss,
    or the ``events`` as a raster of (t, rank, event)), one lane per host with
    its per-rail series, faults marked (dashed: in effect, dotted green: rail back).
    ``relays``: ``{"pair": [a, b], "via": [c, ...], "t0", "t1"}`` (seconds on the
    picture's axis; ``t1`` None: to the end), each a teal band along the bottom
    of the lanes of hosts a and b ("relay to hB via hC") and of the relaying host."""
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
                 "failback": ("<", "tab:blue"), "no_path": ("x", "black"), "peer_lost": ("X", "black"),
                 "relay_on": ("D", "teal"), "relay_off": ("d", "gray")}
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
        top_text = f.get("top_text", f" {f.get('kind')} {where} r{f.get('rail')}")
        if top_text:  # a fault of several NICs (a cross) labels the top panel once
            ax0.text(a, 0.97, top_text, transform=ax0.get_xaxis_transform(),
                     va="top", ha="left", fontsize=8, color=c, bbox=dict(facecolor="white", alpha=0.7, lw=0, pad=1))
    _draw_relays(axes, relays or (), t_end)
    axes[-1].set_xlim(-pad, t_end + pad)
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


RELAY_COLOR = "teal"


def _draw_relays(axes, relays: Sequence[Dict[str, Any]], t_end: float) -> None:
    """Each relayed stretch as a band along the bottom of its hosts' lanes, labelled once."""
    for k, r in enumerate(relays):
        a, b = (list(r.get("pair") or []) + [None, None])[:2]
        via = list(r.get("via") or [])
        t0, t1 = r["t0"], r["t1"] if r.get("t1") is not None else t_end
        through = "/".join(f"h{v}" for v in via) or "?"
        for host, text in ((a, f"relay to h{b} via {through}"), (b, f"relay to h{a} via {through}")):
            if host is None or not 0 <= host + 1 < len(axes):
                continue
            ax = axes[host + 1]
            ax.axvspan(t0, t1, ymin=0.0, ymax=0.14, color=RELAY_COLOR, alpha=0.45, lw=0)
            ax.text(t0, 0.16, f" {text} ({t1 - t0:.1f} s)", transform=ax.get_xaxis_transform(), va="bottom",
                    ha="left", fontsize=7, color=RELAY_COLOR, bbox=dict(facecolor="white", alpha=0.7, lw=0, pad=1))
        for v in via:
            if 0 <= v + 1 < len(axes):
                ax = axes[v + 1]
                ax.axvspan(t0, t1, ymin=0.0, ymax=0.07, color=RELAY_COLOR, alpha=0.25, lw=0, hatch="//")
                ax.text(t0, 0.08, f" relaying h{a}-h{b}", transform=ax.get_xaxis_transform(), va="bottom",
                        ha="left", fontsize=6, color=RELAY_COLOR)
        axes[0].axvspan(t0, t1, ymin=0.0, ymax=0.04, color=RELAY_COLOR, alpha=0.5, lw=0,
                        label="relayed" if k == 0 else None)


__all__ = ["related", "fault_timing", "infer_faults", "fault_rows", "routed_lanes", "draw_timeline", "format_ms",
           "relay_intervals", "relay_pairs", "union_seconds", "DETECT_EVENTS", "DETECT_WINDOW", "NOT_SEEN",
           "RELAY_EVENTS"]
