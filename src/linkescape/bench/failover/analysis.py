"""Analysing a failover fault series: detection, throughput, failback, the job's rate, stalls, false trips.

Input: the raw dict of :func:`.series.run_fault_series` (faults with their
times, the ranks' event trails and completions, the sampled NIC counters
and kernel events). Output: per-fault numbers and their summaries (ms,
median / p99); :mod:`.report` prints them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .counters import Counters, kernel_time, ms, parse_rate, summarize
from .settings import LOST_SPAN_S, Settings


def first_event(events: Sequence[dict], event: str, t0: float, t1: float, peer: Optional[int] = None,
                rail: Optional[int] = None) -> Optional[dict]:
    """The first ``event`` in ``[t0, t1)`` (with ``peer``/``rail``: of that peer, on that rail)."""
    for e in events:
        if (e.get("event") == event and t0 <= e["ts"] < t1 and (peer is None or e.get("peer") == peer)
                and (rail is None or e.get("rail") == rail)):
            return e
    return None


def ops_rate(dones: Sequence[dict], t0: float, t1: float) -> Optional[float]:
    """Completed operations per second in ``[t0, t1]``: (n - 1) / (last - first) over the completions
    inside it, which does not round to whole operations per window (None under 3 completions)."""
    ts = sorted(d["t"] for d in dones if t0 <= d["t"] <= t1)
    if len(ts) < 3 or ts[-1] <= ts[0]:
        return None
    return (len(ts) - 1) / (ts[-1] - ts[0])


def fault_rate(dones: Sequence[dict], b0: float, b1: float, f0: float, f1: float) -> Dict[str, Optional[float]]:
    """Rate before (``[b0, b1]``) and during (``[f0, f1]``) a fault, and their ratio."""
    before, during = ops_rate(dones, b0, b1), ops_rate(dones, f0, f1)
    return {"rate_before_ops": before, "rate_during_ops": during,
            "rate_ratio": during / before if before and during is not None else None}


def find_stalls(ctr: Optional[Counters], hosts: Sequence[int], rail_bps: float, t0: float, t1: float,
                step: float = 0.05, min_s: float = 0.2) -> List[Tuple[float, float]]:
    """Intervals of at least ``min_s`` in ``[t0, t1]`` in which no host sent anything
    (< 1 % of one rail's rate on all rails together): the whole job stood still."""
    if ctr is None or not len(ctr.t):
        return []
    rails = sorted({k[1] for k in ctr.cols})
    tot = np.zeros_like(ctr.t)
    for h in hosts:
        tot = tot + ctr.series(h, rails, "tx")
    starts = np.arange(max(t0, ctr.t[0]), min(t1, ctr.t[-1]) - step, step)
    if not len(starts):
        return []
    idle = ctr.rates(tot, starts, step) < 0.01 * rail_bps
    out = []
    i = 0
    while i < len(starts):
        if idle[i]:
            j = i
            while j + 1 < len(starts) and idle[j + 1]:
                j += 1
            a, b = float(starts[i]), float(starts[j] + step)
            if b - a >= min_s:
                out.append((a, b))
            i = j + 1
        else:
            i += 1
    return out


def analyze_series(raw: dict, st: Settings) -> dict:
    """Per-fault detection, throughput and failback numbers, and their summaries."""
    kind, world, faults = raw["kind"], raw["world"], raw["faults"]
    events: Dict[int, List[dict]] = raw["events"]
    ctr: Optional[Counters] = raw["counters"]
    kernel = raw.get("kernel_events") or []
    hosts = raw["hosts"]
    rail_bps = parse_rate(st.rate)
    w = st.window
    frail = st.fault_rail
    per_fault = []
    explained = set()  # (rank, index in events[rank]) of link events some fault explains
    for k, f in enumerate(faults):
        rank, host = f["rank"], f["host"]
        t_cmd, t_fault = f["t_cmd"], f["t_fault"]
        t_rcmd, t_restore = f["t_restore_cmd"], f["t_restore"]
        t_next = faults[k + 1]["t_cmd"] if k + 1 < len(faults) else raw["t_end"]
        netns = raw["netns"][rank] if raw.get("netns") else None
        t_k = kernel_time(kernel, netns, raw.get("nic", "r0"), kind, True, t_cmd, t_fault + 0.5) if netns else None
        t_kr = kernel_time(kernel, netns, raw.get("nic", "r0"), kind, False, t_rcmd, t_restore + 0.5) \
            if netns else None
        # Both the command's return and the sampler's receipt of the kernel event come
        # after the fault took effect: the earlier of the two is the tighter bound.
        t_eff = min(t_fault, t_k) if t_k is not None else t_fault
        others = [p for p in range(world) if p != rank]
        out: Dict[str, Any] = {"index": f["index"], "host": host, "rank": rank, "kind": kind,
                               "t_fault": t_fault, "cmd_ms": (t_fault - t_cmd) * 1e3,
                               "kernel_minus_ts_ms": None if t_k is None else (t_k - t_fault) * 1e3,
                               "restore_cmd_ms": (t_restore - t_rcmd) * 1e3}
        loc = [first_event(events[rank], "failover", t_cmd, t_rcmd, peer=p) for p in others]
        loc_t = [e["ts"] for e in loc if e]
        t_det = min(loc_t) if loc_t else None
        out["local_ms"] = ms(t_det - t_fault) if loc_t else None
        out["local_kernel_ms"] = ms(t_det - t_eff) if loc_t else None
        out["local_cmd_ms"] = ms(t_det - t_cmd) if loc_t else None
        out["local_all_ms"] = ms(max(loc_t) - t_fault) if len(loc_t) == len(others) else None
        # The rank's own carrier event -> its first link_down on the rail (issue 12): the kernel's
        # carrier loss as the sampler heard it, for the faults that have one (cut, flap).
        down = first_event(events[rank], "link_down", t_cmd, t_rcmd, rail=frail)
        out["carrier_to_link_down_ms"] = (ms(down["ts"] - t_k) if down is not None and t_k is not None
                                          and kind in ("cut", "flap") else None)
        out["link_down_cause"] = None if down is None else down.get("cause")
        # The job's rate: rank 0's completions per second during the fault against the baseline before it.
        out.update(fault_rate(raw.get("dones", {}).get(0, []), t_cmd - st.baseline_s, t_cmd,
                              t_eff + st.rate_settle_s, t_rcmd))
        peer_ms, peer_k = {}, {}
        for p in others:
            e = first_event(events[p], "failover", t_cmd, t_rcmd, peer=rank)
            peer_ms[p] = ms(e["ts"] - t_fault) if e else None
            peer_k[p] = ms(e["ts"] - t_eff) if e else None
        out["peer_ms"] = peer_ms
        out["peer_kernel_ms"] = peer_k
        vals = list(peer_ms.values())
        out["peer_all_ms"] = max(vals) if vals and all(v is not None for v in vals) else None
        out["peer_minus_local_ms"] = {p: (v - out["local_ms"]) for p, v in peer_ms.items()
                                      if v is not None and out["local_ms"] is not None}
        causes: Dict[str, Dict[str, int]] = {}
        churn: List[dict] = []
        for r in range(world):
            for j, e in enumerate(events[r]):
                ev, ts = e.get("event"), e["ts"]
                if not (t_cmd - 0.001 <= ts < t_next) or not (r == rank or e.get("peer") == rank):
                    continue
                if ev == "link_down" and e.get("rail") == frail and ts < t_rcmd + 0.05:
                    side = "local" if r == rank else "peer"
                    causes.setdefault(side, {}).setdefault(e.get("cause"), 0)
                    causes[side][e.get("cause")] += 1
                    explained.add((r, j))
                elif ev == "failover" and e.get("from_rail") == frail and ts < t_rcmd + 0.05:
                    explained.add((r, j))
                elif ev in ("link_up", "failback") and ts >= t_rcmd - 0.001:
                    explained.add((r, j))
                elif ev in ("link_down", "failover") and ts >= t_rcmd - 0.001 and (
                        e.get("rail") == frail or e.get("from_rail") == frail):
                    # The repaired rail's links went down again after the restore (a
                    # replaced or half-open connection, a trip during the hold-down):
                    # part of this fault's recovery, not a false trip; it delays failback.
                    churn.append({k: e.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause", "detail")})
                    explained.add((r, j))
        out["causes"] = causes
        out["restore_churn"] = churn
        t_reff = min(t_restore, t_kr) if t_kr is not None else t_restore
        fbl = [first_event(events[rank], "failback", t_rcmd, t_next, peer=p) for p in others]
        fbl_t = [e["ts"] for e in fbl if e]
        out["failback_local_ms"] = ms(min(fbl_t) - t_restore) if fbl_t else None
        fbp = {}
        for p in others:
            e = first_event(events[p], "failback", t_rcmd, t_next, peer=rank)
            fbp[p] = ms(e["ts"] - t_restore) if e else None
        out["failback_peer_ms"] = fbp
        allfb = fbl_t + [v / 1e3 + t_restore for v in fbp.values() if v is not None]
        out["failback_all_ms"] = ms(max(allfb) - t_restore) if len(allfb) == 2 * len(others) else None
        ups = [e["ts"] for e in events[rank] if e.get("event") == "link_up" and t_rcmd <= e["ts"] < t_next]
        out["link_up_ms"] = ms(min(ups) - t_restore) if ups else None
        out["restore_kernel_minus_ts_ms"] = None if t_kr is None else (t_kr - t_restore) * 1e3
        # Throughput of the faulty host (its egress on every rail).
        out["ref_gbps"] = None
        if ctr is not None and ctr.covers(t_cmd - st.baseline_s, t_next):
            rails = sorted({key[1] for key in ctr.cols})
            tot = ctr.series(host, rails, "tx")
            prim = ctr.series(host, [frail], "tx")
            b0, b1 = t_cmd - st.baseline_s + 0.1, t_cmd - w - 0.002
            bstarts = ctr.starts(b0, b1)
            brates = ctr.rates(tot, bstarts, w) if len(bstarts) else np.array([])
            if len(brates):
                busy = float(np.percentile(brates, 90))
                mean = float(ctr.rates(tot, np.array([b0]), b1 + w - b0)[0])
                out["baseline_gbps"] = mean / 1e9
                out["baseline_busy_gbps"] = busy / 1e9
                out["baseline_primary_share"] = float(
                    ctr.rates(prim, np.array([b0]), b1 + w - b0)[0] / mean) if mean > 0 else None
            if len(brates) and busy >= 0.25 * rail_bps:
                ref = min(rail_bps, busy)
                out["ref_gbps"] = ref / 1e9
                t90 = ctr.first_at_or_above(tot, t_eff, t_rcmd - w, 0.9 * ref, w)
                t50 = ctr.first_at_or_above(tot, t_eff, t_rcmd - w, 0.5 * ref, w)
                out["restore90_from_fault_ms"] = ms(t90 - t_eff) if t90 is not None else None
                out["restore50_from_fault_ms"] = ms(t50 - t_eff) if t50 is not None else None
                out["restore90_after_detect_ms"] = (ms(t90 - t_det) if t90 is not None and t_det is not None
                                                    else None)
                t_last = (t_fault + out["peer_all_ms"] / 1e3 if out["peer_all_ms"] is not None else None)
                if t_last is not None and t_det is not None:
                    t_last = max(t_last, t_det)
                out["restore90_after_last_detect_ms"] = (ms(t90 - t_last) if t90 is not None and t_last is not None
                                                         else None)
                # Outage in equivalent milliseconds at the pre-fault mean rate, first LOST_SPAN_S.
                span = min(LOST_SPAN_S, t_rcmd - t_eff)
                got = (np.interp(t_eff + span, ctr.t, tot) - np.interp(t_eff, ctr.t, tot)) * 8.0
                out["lost_ms"] = max(0.0, span - got / mean) * 1e3 if mean > 0 else None
                fb90 = ctr.first_at_or_above(prim, t_reff, t_next - w, 0.9 * ref, w)
                out["failback_tput_ms"] = ms(fb90 - t_restore) if fb90 is not None else None
            else:
                out["no_baseline"] = True  # the job was (nearly) idle before this fault: see stalls
        per_fault.append(out)

    def col(name):
        return [f.get(name) for f in per_fault if not f.get("no_baseline") or not name.startswith(
            ("restore", "lost", "failback_tput"))]

    def flat(name):
        return [v for f in per_fault for v in f[name].values()]

    unexplained = []
    for r in range(world):
        for j, e in enumerate(events[r]):
            if (r, j) not in explained and e.get("event") in ("link_down", "failover", "no_path", "peer_lost"):
                unexplained.append({k: e.get(k) for k in ("ts", "rank", "event", "peer", "rail", "cause", "detail")})
    t_first = faults[0]["t_cmd"] - st.baseline_s if faults else raw["t_end"]
    stalls = []
    for a, b in find_stalls(ctr, hosts, rail_bps, t_first, raw["t_end"]):
        after = [f for f in faults if f["t_cmd"] <= a]
        where = "before the first fault"
        if after:
            f = after[-1]
            where = (f"during fault {f['index']} (host {f['host']})" if a < f["t_restore_cmd"]
                     else f"{(a - f['t_restore']) * 1e3:.0f} ms after restoring fault {f['index']} (host {f['host']})")
        stalls.append({"start": a, "end": b, "seconds": b - a, "where": where})
    exits = raw["exits"]
    wrong = sum(int(e.get("wrong") or 0) for e in exits)
    wrong_iters = sum(1 for r in raw["dones"].values() for d in r if d.get("wrong"))
    iters = {r: len(d) for r, d in raw["dones"].items()}
    summary = {
        "detect_local_ms": summarize(col("local_ms")),
        "detect_local_kernel_ms": summarize(col("local_kernel_ms")),
        "detect_local_from_cmd_ms": summarize(col("local_cmd_ms")),
        "detect_local_all_peers_ms": summarize(col("local_all_ms")),
        "detect_peer_ms": summarize(flat("peer_ms")),
        "detect_peer_kernel_ms": summarize(flat("peer_kernel_ms")),
        "detect_peer_all_ms": summarize(col("peer_all_ms")),
        "peer_minus_local_ms": summarize(flat("peer_minus_local_ms")),
        "restore90_after_detect_ms": summarize(col("restore90_after_detect_ms")),
        "restore90_after_last_detect_ms": summarize(col("restore90_after_last_detect_ms")),
        "restore90_from_fault_ms": summarize(col("restore90_from_fault_ms")),
        "restore50_from_fault_ms": summarize(col("restore50_from_fault_ms")),
        "lost_ms": summarize(col("lost_ms")),
        "failback_local_ms": summarize(col("failback_local_ms")),
        "failback_peer_ms": summarize(flat("failback_peer_ms")),
        "failback_all_ms": summarize(col("failback_all_ms")),
        "failback_tput_ms": summarize(col("failback_tput_ms")),
        "link_up_ms": summarize(col("link_up_ms")),
        "cmd_ms": summarize(col("cmd_ms")),
        "kernel_minus_ts_ms": summarize(col("kernel_minus_ts_ms")),
        "baseline_gbps": summarize(col("baseline_gbps")),
        "ref_gbps": summarize(col("ref_gbps")),
        "carrier_to_link_down_ms": summarize(col("carrier_to_link_down_ms")),
        "rate_before_ops": summarize(col("rate_before_ops")),
        "rate_during_ops": summarize(col("rate_during_ops")),
        "rate_ratio": summarize(col("rate_ratio")),
    }
    return {"kind": kind, "faults": len(per_fault), "per_fault": per_fault, "summary": summary,
            "no_baseline": sum(1 for f in per_fault if f.get("no_baseline")),
            "stalls": stalls, "stall_seconds": sum(x["seconds"] for x in stalls),
            "wrong": wrong, "wrong_iters": wrong_iters,
            "errors": [e for e in exits if e.get("error")], "hangs": sum(1 for e in exits if e.get("hung")),
            "iters": iters, "unexplained_events": unexplained, "nbytes": raw["nbytes"], "world": world,
            "restore_churn": [c for f in per_fault for c in f["restore_churn"]]}


def busbw_from_dones(dones: Sequence[dict], nbytes: int, world: int, skip_s: float = 1.0) -> Optional[float]:
    """Bus bandwidth (bits/s) of an all_reduce from one rank's completion times,
    skipping the first ``skip_s`` seconds."""
    ts = sorted(d["t"] for d in dones)
    if len(ts) < 3:
        return None
    ts = [t for t in ts if t >= ts[0] + skip_s] or ts
    if len(ts) < 3:
        return None
    per_iter = (ts[-1] - ts[0]) / (len(ts) - 1)
    return 2.0 * (world - 1) / world * nbytes * 8.0 / per_iter


