"""Analysing a failover fault series: detection, throughput, failback, the job's rate, stalls, false trips.

Input: the raw dict of :func:`.series.run_fault_series` (faults with their
times, the ranks' event trails and completions, the sampled NIC counters
and kernel events). Output: per-fault numbers and their summaries (ms,
median / p99); :mod:`.report` prints them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ...faults.measure import first_event, summarize
from ...testbed.counters import Counters, kernel_time
from ...testbed.netns import rate_bps as parse_rate
from .settings import LOST_SPAN_S, Settings
from ...tools.timeline import ms

#: (summary key, per-fault key, whether the per-fault value is a dict per peer)
SUMMARY = (("detect_local_ms", "local_ms", False), ("detect_local_kernel_ms", "local_kernel_ms", False),
           ("detect_local_from_cmd_ms", "local_cmd_ms", False), ("detect_local_all_peers_ms", "local_all_ms", False),
           ("detect_peer_ms", "peer_ms", True), ("detect_peer_kernel_ms", "peer_kernel_ms", True),
           ("detect_peer_all_ms", "peer_all_ms", False), ("peer_minus_local_ms", "peer_minus_local_ms", True),
           ("detect_peer_data_ms", "peer_data_ms", True), ("detect_peer_idle_ms", "peer_idle_ms", True),
           ("restore90_after_detect_ms", "restore90_after_detect_ms", False),
           ("restore90_after_last_detect_ms", "restore90_after_last_detect_ms", False),
           ("restore90_from_fault_ms", "restore90_from_fault_ms", False),
           ("restore50_from_fault_ms", "restore50_from_fault_ms", False), ("lost_ms", "lost_ms", False),
           ("failback_local_ms", "failback_local_ms", False), ("failback_peer_ms", "failback_peer_ms", True),
           ("failback_all_ms", "failback_all_ms", False), ("failback_tput_ms", "failback_tput_ms", False),
           ("link_up_ms", "link_up_ms", False), ("cmd_ms", "cmd_ms", False),
           ("kernel_minus_ts_ms", "kernel_minus_ts_ms", False), ("baseline_gbps", "baseline_gbps", False),
           ("ref_gbps", "ref_gbps", False), ("carrier_to_link_down_ms", "carrier_to_link_down_ms", False),
           ("rate_before_ops", "rate_before_ops", False), ("rate_during_ops", "rate_during_ops", False),
           ("rate_ratio", "rate_ratio", False))
#: a pair exchanges the job's data when its bytes over the run (both directions, every rail) are at
#: least this share of the busiest pair's; the others carry probes, heartbeats and a final barrier
DATA_SHARE = 0.01
#: per-fault values that need a busy baseline before the fault
_NEEDS_BASELINE = ("restore", "lost", "failback_tput")
_EVENT_KEYS = ("ts", "rank", "event", "peer", "rail", "cause", "detail")
Explained = Set[Tuple[int, int]]  # (rank, index in events[rank]) of link events some fault explains


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


class _Fault:
    """One fault of a series and its times: the command, its effect, the kernel's, the repair."""

    def __init__(self, raw: dict, k: int) -> None:
        f = raw["faults"][k]
        self.index, self.rank, self.host = f["index"], f["rank"], f["host"]
        self.t_cmd, self.t_fault = f["t_cmd"], f["t_fault"]
        self.t_rcmd, self.t_restore = f["t_restore_cmd"], f["t_restore"]
        faults = raw["faults"]
        self.t_next = faults[k + 1]["t_cmd"] if k + 1 < len(faults) else raw["t_end"]
        netns = raw["netns"][self.rank] if raw.get("netns") else None
        kernel, nic, kind = raw.get("kernel_events") or [], raw.get("nic", "r0"), raw["kind"]
        self.t_k = kernel_time(kernel, netns, nic, kind, True, self.t_cmd, self.t_fault + 0.5) if netns else None
        self.t_kr = kernel_time(kernel, netns, nic, kind, False, self.t_rcmd, self.t_restore + 0.5) \
            if netns else None
        # Both the command's return and the sampler's receipt of the kernel event come
        # after the fault took effect: the earlier of the two is the tighter bound.
        self.t_eff = min(self.t_fault, self.t_k) if self.t_k is not None else self.t_fault
        self.t_reff = min(self.t_restore, self.t_kr) if self.t_kr is not None else self.t_restore
        self.others = [p for p in range(raw["world"]) if p != self.rank]
        self.t_det: Optional[float] = None  # the faulty rank's first failover (set by _detection)


def data_pairs(pair_bytes: Optional[Dict[int, Dict[int, int]]], world: int) -> Optional[Set[frozenset]]:
    """The pairs of ranks that exchange the job's data, measured: each rank's bytes to and from each peer
    at the end of the run (the larger of the two ends' counts), at least :data:`DATA_SHARE` of the busiest
    pair's. None when no rank reported them (then every pair counts as carrying data)."""
    if not pair_bytes or not any(pair_bytes.get(r) for r in range(world)):
        return None
    both: Dict[frozenset, int] = {}
    for r in range(world):
        for p, b in (pair_bytes.get(r) or {}).items():
            key = frozenset((r, int(p)))
            both[key] = max(both.get(key, 0), int(b))
    top = max(both.values(), default=0)
    return {k for k, b in both.items() if top and b >= DATA_SHARE * top}


def analyze_series(raw: dict, st: Settings) -> dict:
    """Per-fault detection, throughput and failback numbers, and their summaries."""
    kind, world, faults = raw["kind"], raw["world"], raw["faults"]
    pairs = data_pairs(raw.get("pair_bytes"), world)
    events: Dict[int, List[dict]] = raw["events"]
    ctr: Optional[Counters] = raw["counters"]
    rail_bps = parse_rate(st.rate)
    per_fault = []
    explained: Explained = set()
    for k in range(len(faults)):
        f = _Fault(raw, k)
        out: Dict[str, Any] = {"index": f.index, "host": f.host, "rank": f.rank, "kind": kind,
                               "t_fault": f.t_fault, "cmd_ms": (f.t_fault - f.t_cmd) * 1e3,
                               "kernel_minus_ts_ms": None if f.t_k is None else (f.t_k - f.t_fault) * 1e3,
                               "restore_cmd_ms": (f.t_restore - f.t_rcmd) * 1e3}
        out.update(_detection(events, f, kind, st))
        # The job's rate: rank 0's completions per second during the fault against the baseline before it.
        out.update(fault_rate(raw.get("dones", {}).get(0, []), f.t_cmd - st.baseline_s, f.t_cmd,
                              f.t_eff + st.rate_settle_s, f.t_rcmd))
        out.update(_peer_detection(events, f, out["local_ms"], pairs))
        out.update(_causes(events, f, world, st.fault_rail, explained))
        out.update(_failback(events, f))
        out["ref_gbps"] = None
        if ctr is not None and ctr.covers(f.t_cmd - st.baseline_s, f.t_next):
            out.update(_throughput(ctr, f, st, rail_bps, out["peer_all_ms"]))
        per_fault.append(out)
    exits = raw["exits"]
    return {"kind": kind, "faults": len(per_fault), "per_fault": per_fault, "summary": _summary(per_fault),
            "no_baseline": sum(1 for f in per_fault if f.get("no_baseline")), **_stalls(raw, st, ctr, rail_bps),
            "wrong": sum(int(e.get("wrong") or 0) for e in exits),
            "wrong_iters": sum(1 for r in raw["dones"].values() for d in r if d.get("wrong")),
            "errors": [e for e in exits if e.get("error")], "hangs": sum(1 for e in exits if e.get("hung")),
            "iters": {r: len(d) for r, d in raw["dones"].items()},
            "unexplained_events": _unexplained(events, world, explained), "nbytes": raw["nbytes"], "world": world,
            "restore_churn": [c for f in per_fault for c in f["restore_churn"]]}


def _detection(events: Dict[int, List[dict]], f: _Fault, kind: str, st: Settings) -> Dict[str, Any]:
    """The faulty rank's own detection: its first failover to each peer, its first link_down on the rail."""
    loc = [first_event(events[f.rank], "failover", f.t_cmd, f.t_rcmd, peer=p) for p in f.others]
    loc_t = [e["ts"] for e in loc if e]
    f.t_det = min(loc_t) if loc_t else None
    out: Dict[str, Any] = {"local_ms": ms(f.t_det - f.t_fault) if loc_t else None,
                           "local_kernel_ms": ms(f.t_det - f.t_eff) if loc_t else None,
                           "local_cmd_ms": ms(f.t_det - f.t_cmd) if loc_t else None,
                           "local_all_ms": ms(max(loc_t) - f.t_fault) if len(loc_t) == len(f.others) else None}
    # The rank's own carrier event -> its first link_down on the rail (issue 12): the kernel's
    # carrier loss as the sampler heard it, for the faults that have one (cut, flap).
    down = first_event(events[f.rank], "link_down", f.t_cmd, f.t_rcmd, rail=st.fault_rail)
    out["carrier_to_link_down_ms"] = (ms(down["ts"] - f.t_k) if down is not None and f.t_k is not None
                                      and kind in ("cut", "flap") else None)
    out["link_down_cause"] = None if down is None else down.get("cause")
    return out


def _peer_detection(events: Dict[int, List[dict]], f: _Fault, local_ms: Optional[float],
                    pairs: Optional[Set[frozenset]] = None) -> Dict[str, Any]:
    """Every peer's first failover away from the faulty rank; split by whether the pair exchanges the
    job's data (``pairs``: see :func:`data_pairs`; None: all do)."""
    peer_ms, peer_k = {}, {}
    for p in f.others:
        e = first_event(events[p], "failover", f.t_cmd, f.t_rcmd, peer=f.rank)
        peer_ms[p] = ms(e["ts"] - f.t_fault) if e else None
        peer_k[p] = ms(e["ts"] - f.t_eff) if e else None
    vals = list(peer_ms.values())
    data = {p for p in f.others if pairs is None or frozenset((f.rank, p)) in pairs}
    return {"peer_ms": peer_ms, "peer_kernel_ms": peer_k,
            "peer_data_ms": {p: v for p, v in peer_ms.items() if p in data},
            "peer_idle_ms": {p: v for p, v in peer_ms.items() if p not in data},
            "peer_all_ms": max(vals) if vals and all(v is not None for v in vals) else None,
            "peer_minus_local_ms": {p: (v - local_ms) for p, v in peer_ms.items()
                                    if v is not None and local_ms is not None}}


def _causes(events: Dict[int, List[dict]], f: _Fault, world: int, frail: int, explained: Explained) -> Dict[str, Any]:
    """The causes of the link_downs the fault made, and the repaired rail's links going down again
    after the restore; every event of the faulty rank's links that the fault explains goes into ``explained``."""
    causes: Dict[str, Dict[str, int]] = {}
    churn: List[dict] = []
    for r in range(world):
        for j, e in enumerate(events[r]):
            ev, ts = e.get("event"), e["ts"]
            if not (f.t_cmd - 0.001 <= ts < f.t_next) or not (r == f.rank or e.get("peer") == f.rank):
                continue
            if ev == "link_down" and e.get("rail") == frail and ts < f.t_rcmd + 0.05:
                side = "local" if r == f.rank else "peer"
                causes.setdefault(side, {}).setdefault(e.get("cause"), 0)
                causes[side][e.get("cause")] += 1
                explained.add((r, j))
            elif ev == "failover" and e.get("from_rail") == frail and ts < f.t_rcmd + 0.05:
                explained.add((r, j))
            elif ev in ("link_up", "failback") and ts >= f.t_rcmd - 0.001:
                explained.add((r, j))
            elif ev in ("link_down", "failover") and ts >= f.t_rcmd - 0.001 and (
                    e.get("rail") == frail or e.get("from_rail") == frail):
                # The repaired rail's links went down again after the restore (a
                # replaced or half-open connection, a trip during the hold-down):
                # part of this fault's recovery, not a false trip; it delays failback.
                churn.append({k: e.get(k) for k in _EVENT_KEYS})
                explained.add((r, j))
    return {"causes": causes, "restore_churn": churn}


def _failback(events: Dict[int, List[dict]], f: _Fault) -> Dict[str, Any]:
    """From the repair to each side's first failback, and to the rail's first link_up."""
    fbl = [first_event(events[f.rank], "failback", f.t_rcmd, f.t_next, peer=p) for p in f.others]
    fbl_t = [e["ts"] for e in fbl if e]
    fbp = {}
    for p in f.others:
        e = first_event(events[p], "failback", f.t_rcmd, f.t_next, peer=f.rank)
        fbp[p] = ms(e["ts"] - f.t_restore) if e else None
    allfb = fbl_t + [v / 1e3 + f.t_restore for v in fbp.values() if v is not None]
    ups = [e["ts"] for e in events[f.rank] if e.get("event") == "link_up" and f.t_rcmd <= e["ts"] < f.t_next]
    return {"failback_local_ms": ms(min(fbl_t) - f.t_restore) if fbl_t else None, "failback_peer_ms": fbp,
            "failback_all_ms": ms(max(allfb) - f.t_restore) if len(allfb) == 2 * len(f.others) else None,
            "link_up_ms": ms(min(ups) - f.t_restore) if ups else None,
            "restore_kernel_minus_ts_ms": None if f.t_kr is None else (f.t_kr - f.t_restore) * 1e3}


def lost_ms(ctr: Counters, tot: np.ndarray, t_eff: float, t_end: float, mean: float) -> Optional[float]:
    """The outage in equivalent milliseconds at the pre-fault ``mean`` rate, over the first ``LOST_SPAN_S``."""
    span = min(LOST_SPAN_S, t_end - t_eff)
    got = (np.interp(t_eff + span, ctr.t, tot) - np.interp(t_eff, ctr.t, tot)) * 8.0
    return max(0.0, span - got / mean) * 1e3 if mean > 0 else None


def _throughput(ctr: Counters, f: _Fault, st: Settings, rail_bps: float,
                peer_all_ms: Optional[float]) -> Dict[str, Any]:
    """The faulty host's egress on every rail: its baseline, how soon it is back (90 %, 50 %), the
    outage, and how soon the primary rail carries 90 % after the repair."""
    w, frail = st.window, st.fault_rail
    out: Dict[str, Any] = {}
    rails = sorted({key[1] for key in ctr.cols})
    tot = ctr.series(f.host, rails, "tx")
    prim = ctr.series(f.host, [frail], "tx")
    b0, b1 = f.t_cmd - st.baseline_s + 0.1, f.t_cmd - w - 0.002
    bstarts = ctr.starts(b0, b1)
    brates = ctr.rates(tot, bstarts, w) if len(bstarts) else np.array([])
    if len(brates):
        busy = float(np.percentile(brates, 90))
        mean = float(ctr.rates(tot, np.array([b0]), b1 + w - b0)[0])
        out["baseline_gbps"] = mean / 1e9
        out["baseline_busy_gbps"] = busy / 1e9
        out["baseline_primary_share"] = float(
            ctr.rates(prim, np.array([b0]), b1 + w - b0)[0] / mean) if mean > 0 else None
    if not (len(brates) and busy >= 0.25 * rail_bps):
        out["no_baseline"] = True  # the job was (nearly) idle before this fault: see stalls
        return out
    ref = min(rail_bps, busy)
    out["ref_gbps"] = ref / 1e9
    t90 = ctr.first_at_or_above(tot, f.t_eff, f.t_rcmd - w, 0.9 * ref, w)
    t50 = ctr.first_at_or_above(tot, f.t_eff, f.t_rcmd - w, 0.5 * ref, w)
    out["restore90_from_fault_ms"] = ms(t90 - f.t_eff) if t90 is not None else None
    out["restore50_from_fault_ms"] = ms(t50 - f.t_eff) if t50 is not None else None
    out["restore90_after_detect_ms"] = (ms(t90 - f.t_det) if t90 is not None and f.t_det is not None else None)
    t_last = (f.t_fault + peer_all_ms / 1e3 if peer_all_ms is not None else None)
    if t_last is not None and f.t_det is not None:
        t_last = max(t_last, f.t_det)
    out["restore90_after_last_detect_ms"] = (ms(t90 - t_last) if t90 is not None and t_last is not None else None)
    out["lost_ms"] = lost_ms(ctr, tot, f.t_eff, f.t_rcmd, mean)
    fb90 = ctr.first_at_or_above(prim, f.t_reff, f.t_next - w, 0.9 * ref, w)
    out["failback_tput_ms"] = ms(fb90 - f.t_restore) if fb90 is not None else None
    return out


def _summary(per_fault: List[Dict[str, Any]]) -> Dict[str, Any]:
    """:data:`SUMMARY` over the faults (throughput values only of the faults with a busy baseline)."""
    def col(name):
        return [f.get(name) for f in per_fault if not f.get("no_baseline") or not name.startswith(_NEEDS_BASELINE)]

    def flat(name):
        return [v for f in per_fault for v in f[name].values()]

    return {key: summarize(flat(name) if per_peer else col(name)) for key, name, per_peer in SUMMARY}


def _unexplained(events: Dict[int, List[dict]], world: int, explained: Explained) -> List[dict]:
    """Link events no fault explains: false trips."""
    return [{k: e.get(k) for k in _EVENT_KEYS} for r in range(world) for j, e in enumerate(events[r])
            if (r, j) not in explained and e.get("event") in ("link_down", "failover", "no_path", "peer_lost")]


def _stalls(raw: dict, st: Settings, ctr: Optional[Counters], rail_bps: float) -> Dict[str, Any]:
    """Stretches in which the whole job stood still, each placed against the faults."""
    faults = raw["faults"]
    t_first = faults[0]["t_cmd"] - st.baseline_s if faults else raw["t_end"]
    stalls = []
    for a, b in find_stalls(ctr, raw["hosts"], rail_bps, t_first, raw["t_end"]):
        after = [f for f in faults if f["t_cmd"] <= a]
        where = "before the first fault"
        if after:
            f = after[-1]
            where = (f"during fault {f['index']} (host {f['host']})" if a < f["t_restore_cmd"]
                     else f"{(a - f['t_restore']) * 1e3:.0f} ms after restoring fault {f['index']} (host {f['host']})")
        stalls.append({"start": a, "end": b, "seconds": b - a, "where": where})
    return {"stalls": stalls, "stall_seconds": sum(x["seconds"] for x in stalls)}


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


