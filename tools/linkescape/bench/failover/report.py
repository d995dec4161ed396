"""The failover benchmark's verdict (targets met or MISSED, never enforced) and its text report."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .settings import TARGETS


def verdict(result: dict) -> Dict[str, Any]:
    """Which targets were met (None: not measured)."""
    out: Dict[str, Any] = {}
    for kind, s in result.get("series", {}).items():
        t = TARGETS.get(kind, {})
        sm = s["summary"]
        # the peers whose link carries the job's data, and apart those whose link is idle (see TARGETS)
        data = sm.get("detect_peer_data_ms") or sm["detect_peer_ms"]
        idle = sm.get("detect_peer_idle_ms") or {"p99": None, "missing": 0}
        loc, peer = sm["detect_local_ms"]["p99"], data["p99"]
        miss_l, miss_p = sm["detect_local_ms"]["missing"], data["missing"]
        out[f"{kind}_local_p99"] = None if loc is None else bool(loc <= t["local_p99"] and not miss_l)
        # (every sample missing is a miss, not "not measured")
        out[f"{kind}_peer_p99"] = None if peer is None and not miss_p else bool(
            peer is not None and peer <= t["peer_p99"] and not miss_p)
        if idle["p99"] is not None or idle["missing"]:
            out[f"{kind}_peer_idle_p99"] = bool(idle["p99"] is not None and idle["p99"] <= t["peer_idle_p99"]
                                                and not idle["missing"])
        r = sm["restore90_after_detect_ms"]
        out[f"{kind}_restore_p99"] = None if r["p99"] is None else bool(
            r["p99"] <= TARGETS["restore_after_detect"] and not r["missing"])
        out[f"{kind}_correct"] = s["wrong"] == 0 and s["hangs"] == 0 and not s["errors"]
        out[f"{kind}_no_false_trips"] = not s["unexplained_events"]
    ov = result.get("overhead")
    if ov and ov.get("overhead_pct_pairs") is not None:
        # paired (adjacent, alternating) runs cancel most of the machine's drift
        out["overhead"] = ov["overhead_pct_pairs"] <= TARGETS["overhead_pct"]
    for policy, r in ((result.get("rates") or {}).get("policies") or {}).items():
        for row in r["phases"]:
            if "met" in row:
                out[f"rate_{policy}_{row['kind']}"] = row["met"]
            if "stall_met" in row:
                out[f"stall_{policy}_{row['kind']}"] = row["stall_met"]
    return out


def _fmt(x: Optional[float], unit: str = "", nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}{unit}"


def format_report(result: dict) -> str:
    """The human-readable report of :func:`run_failover_bench`."""
    st = result["settings"]
    if not result.get("series") and result.get("rates"):
        from .rates import format_rates

        return "\n".join(["# linkescape failover benchmark: the job's rate while a rail is down",
                          f"# kernel {result.get('kernel')}, {result.get('cpus')} CPUs, library settings "
                          f"{result.get('config')}", "", format_rates(result["rates"]), "",
                          f"# {result.get('duration_s', 0):.0f} s"])
    lines = [f"# linkescape failover benchmark: {st['hosts']} hosts x {st['rails']} rails at {st['rate']}, "
             f"all_reduce {st['size']} B x {st['depth']} in flight, congestion control {result.get('congestion')}",
             f"# kernel {result.get('kernel')}, {result.get('cpus')} CPUs, library settings {result.get('config')}",
             "# times in ms: median / p99 / max (n, missing)", ""]
    for kind, s in result.get("series", {}).items():
        lines += _series_lines(kind, s)
    if result.get("overhead"):
        lines += _overhead_lines(result["overhead"])
    for cc, m in (result.get("mptcp") or {}).items():
        lines += _mptcp_lines(cc, m)
    if result.get("rates"):
        from .rates import format_rates

        lines.append(format_rates(result["rates"]))
        lines.append("")
    v = result.get("verdict", {})
    if v:
        lines.append("## targets: " + ", ".join(f"{k}={'met' if x else ('-' if x is None else 'MISSED')}"
                                                for k, x in v.items()))
    lines.append(f"# {result.get('duration_s', 0):.0f} s")
    return "\n".join(lines)


def _row(name: str, s: dict, target: Optional[float] = None) -> str:
    """One summary as ``median / p99 / max (n, missing)``, with its target when it has one."""
    miss = f", {s['missing']} missing" if s["missing"] else ""
    tgt = ""
    if target is not None and s["p99"] is not None:
        tgt = f"   target p99 <= {target:g}: {'met' if s['p99'] <= target and not s['missing'] else 'MISSED'}"
    return (f"  {name:44s} {_fmt(s['median']):>8} / {_fmt(s['p99']):>8} / {_fmt(s['max']):>8}"
            f"  (n={s['n']}{miss}){tgt}")


#: the rows of a fault series: (label, summary key, the target's key in TARGETS[kind], or a global target)
_SERIES_ROWS = (("detection, local (fault ts -> failover)", "detect_local_ms", "local_p99"),
                ("detection, peer side (per peer, from fault ts)", "detect_peer_ms", None),
                ("  peers whose link carries data", "detect_peer_data_ms", "peer_p99"),
                ("  peers whose link is idle", "detect_peer_idle_ms", "peer_idle_p99"),
                ("detection, last peer (from fault ts)", "detect_peer_all_ms", None),
                ("detection, local (from kernel event)", "detect_local_kernel_ms", "local_p99"),
                ("detection, peer side (from kernel event)", "detect_peer_kernel_ms", None),
                ("detection, peer side minus local", "peer_minus_local_ms", None),
                ("throughput >= 90% after local detection", "restore90_after_detect_ms", "restore_after_detect"),
                ("throughput >= 90% after the last rank detected", "restore90_after_last_detect_ms", None),
                ("throughput >= 90% after the fault", "restore90_from_fault_ms", None),
                ("throughput >= 50% after the fault", "restore50_from_fault_ms", None),
                ("outage-equivalent (first 1 s)", "lost_ms", None),
                ("restore -> link_up (local)", "link_up_ms", None),
                ("restore -> failback (local)", "failback_local_ms", None),
                ("restore -> failback (per peer)", "failback_peer_ms", None),
                ("restore -> >= 90% on the primary rail", "failback_tput_ms", None))


def _series_lines(kind: str, s: dict) -> List[str]:
    """A fault series: every summary row, link_down causes, correctness, false trips and stalls."""
    sm = s["summary"]
    t = TARGETS.get(kind, {})
    lines = [f"## {kind}: {s['faults']} faults, reference rate {_fmt(sm['ref_gbps']['median'], ' Gbit/s', 3)} "
             f"(pre-fault mean {_fmt(sm['baseline_gbps']['median'], ' Gbit/s', 3)})"]
    for label, key, target in _SERIES_ROWS:
        lines.append(_row(label, sm[key], t.get(target) if target in t else TARGETS.get(target)))
    if sm.get("carrier_to_link_down_ms", {}).get("n"):
        lines.append(_row("local carrier event -> link_down (kernel)", sm["carrier_to_link_down_ms"]))
    if sm.get("rate_ratio", {}).get("n"):
        rr = sm["rate_ratio"]
        lines.append(f"  {'job rate during the fault / before (rank 0)':44s} {_fmt(rr['median'], 'x', 2):>8} median"
                     f" (min {_fmt(rr['min'], 'x', 2)}, n={rr['n']}; before "
                     f"{_fmt(sm['rate_before_ops']['median'], ' ops/s', 2)}, during "
                     f"{_fmt(sm['rate_during_ops']['median'], ' ops/s', 2)})")
    lines.append(_row("fault command duration (ts - start)", sm["cmd_ms"]))
    lines.append(_row("kernel event minus fault ts", sm["kernel_minus_ts_ms"]))
    causes: Dict[str, Dict[str, int]] = {}
    for f in s["per_fault"]:
        for side, cs in f["causes"].items():
            for c, n in cs.items():
                causes.setdefault(side, {}).setdefault(c, 0)
                causes[side][c] += n
    lines.append(f"  link_down causes: {causes}")
    lines.append(f"  wrong elements {s['wrong']}, errors {len(s['errors'])}, hangs {s['hangs']}, "
                 f"iterations {s['iters']}, unexplained link events (false trips) "
                 f"{len(s['unexplained_events'])}, repaired rail down again after restore "
                 f"{len(s.get('restore_churn', []))}")
    for e in s["unexplained_events"][:5]:
        lines.append(f"    unexplained: {e}")
    if s["stalls"] or s["no_baseline"]:
        lines.append(f"  STALLS (no host sent anything for >= 200 ms): {len(s['stalls'])}, "
                     f"{s['stall_seconds']:.1f} s in all; faults without a busy baseline: {s['no_baseline']}")
        for x in s["stalls"][:8]:
            lines.append(f"    stall {x['seconds'] * 1e3:.0f} ms, {x['where']}")
    for e in s["errors"][:3]:
        lines.append(f"    error: rank {e.get('rank')}: {e.get('error')}")
    lines.append("")
    return lines


def _overhead_lines(ov: dict) -> List[str]:
    """Healthy busbw with every rail against rail 0 alone."""
    lines = ["## healthy busbw (Gbit/s), alternating runs"]
    for label, key in (("with backup rails: ", "backup_gbps"), ("rail 0 only:       ", "single_gbps")):
        lines.append(f"  {label}median {_fmt(ov[key]['median'], '', 3)} (min {_fmt(ov[key]['min'], '', 3)}, "
                     f"max {_fmt(ov[key]['max'], '', 3)}, n={ov[key]['n']})")
    pct, pairs = ov.get("overhead_pct"), ov.get("overhead_pct_pairs")
    if pairs is not None:
        pr = ov["pair_ratio"]
        lines.append(f"  overhead {pairs:+.2f}% (median of the paired ratios backup/single; ratios "
                     f"{_fmt(pr['min'], '', 3)}..{_fmt(pr['max'], '', 3)}), {pct:+.2f}% (ratio of medians); "
                     f"target <= {TARGETS['overhead_pct']:g}%: "
                     f"{'met' if pairs <= TARGETS['overhead_pct'] else 'MISSED'}")
    lines.append(f"  wrong {ov['wrong']}, hangs {ov['hangs']}, errors {len(ov['errors'])}")
    lines.append("")
    return lines


def _mptcp_lines(cc: str, m: dict) -> List[str]:
    """MPTCP against linkescape through the same cuts."""
    ms, ls = m["mptcp"]["summary"], m["linkescape"]
    return [f"## MPTCP vs linkescape, 2 hosts, cut of the primary rail, congestion control {cc}",
            _row("MPTCP: half rate back on rail 1", ms["half_ms"]),
            _row("MPTCP: 90% rate back on rail 1", ms["restore90_from_fault_ms"]),
            _row("MPTCP: outage-equivalent (first 1 s)", ms["lost_ms"]),
            f"  MPTCP: rate before {_fmt(ms['baseline_gbps']['median'], '', 3)}, 1.5-2.5 s after the "
            f"cut {_fmt(ms['rate_after_gbps']['median'], '', 3)} Gbit/s (medians)",
            _row("linkescape: half rate back", ls["half_ms"]),
            _row("linkescape: 90% rate back", ls["restore90_from_fault_ms"]),
            _row("linkescape: outage-equivalent (first 1 s)", ls["lost_ms"]),
            f"  linkescape: wrong {ls['wrong']}, hangs {ls['hangs']}, errors {len(ls['errors'])}", ""]


def ok(result: dict) -> bool:
    """No wrong result, no error, no hang anywhere in the run."""
    parts = list(result.get("series", {}).values())
    bad = sum(s["wrong"] + s["hangs"] + len(s["errors"]) for s in parts)
    ov = result.get("overhead")
    if ov:
        bad += ov["wrong"] + ov["hangs"] + len(ov["errors"])
    for m in (result.get("mptcp") or {}).values():
        le = m["linkescape"]
        bad += le["wrong"] + le["hangs"] + len(le["errors"])
    for r in (result.get("rates") or {}).get("policies", {}).values():
        bad += r["wrong"] + r["hangs"] + len(r["errors"]) + len(r["injection_errors"])
    return bad == 0


__all__ = ["format_report", "verdict", "ok"]
