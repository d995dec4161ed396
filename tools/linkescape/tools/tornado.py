"""What escape saves across each assumed input's range (the tornado chart of ``linkescape simulate --plot``).

Each row moves one input from the low to the high end of its range, every other input at its
default, and takes escape's savings against restart from the closed form (``linkescape cost``; the
simulation agrees with it within its interval, docs/operations.md). The rows are the inputs the model
assumes, and the two rates that rest on few published events (their Jeffreys 95 % intervals).
Measured inputs (the failover stall, the policies' and the relay's rates) are not in it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

from .cost import savings
from .model import SimParams
from .stats import rate_interval

#: input -> (low, high, why this range); the ranges are assumptions too
RANGES: Dict[str, Tuple[Any, Any, str]] = {
    "coverage": ("tor", "rail-optimized", "fabric: Llama 3's (as we read it) to one leaf switch per rail"),
    "switch_share": (0.0, 1.0, "switches in 'switch/cable': none to all"),
    "restart_hours": (0.05, 0.5, "restart: 3 to 30 min"),
    "checkpoint_write_s": (1.0, 60.0, "checkpoint stall: 1 s to 1 min"),
    "repair_switch_hours": (2.0, 24.0, "switch swap: 2 h to a day"),
    "repair_cable_hours": (2.0, 24.0, "cable swap: 2 h to a day"),
    "repair_nic_hours": (4.0, 72.0, "NIC swap: 4 h to 3 days"),
    "flap_share": (0.0, 0.5, "faults that end by themselves: none to half"),
    "flap_s": (5.0, 120.0, "a flap's mean: 5 s to 2 min"),
    "reboot_share": (0.0, 0.5, "faults a reboot ends: none to half"),
    "reboot_s": (60.0, 900.0, "a reboot's mean: 1 to 15 min"),
    "whole_host_share": (0.0, 0.2, "one-rail faults that take every rail: none to a fifth"),
    "comm_share": (0.1, 0.6, "network-bound share of a step"),
    "yuan_per_gpu_hour": (5.0, 20.0, "price of a GPU-hour"),
}
#: the published counts' uncertainty: a multiplier of the derived rate
COUNTS = {"nic_rate": "nic", "switch_cable_rate": "network"}


def _scaled(p: SimParams, name: str, mult: float) -> SimParams:
    if name == "nic_rate":
        return replace(p, nic_per_day=p.rate("nic") * mult)
    return replace(p, cable_per_day=p.rate("cable") * mult, switch_per_day=p.rate("switch") * mult,
                   optic_per_day=p.rate("optic") * mult)


def tornado(p: Optional[SimParams] = None) -> Dict[str, Any]:
    """The base savings and one row per input, the widest swing first."""
    p = p or SimParams()
    base = savings(p)
    rows: List[Dict[str, Any]] = []
    for name, (lo, hi, why) in RANGES.items():
        rows.append({"input": name, "kind": "assumed", "default": getattr(p, name), "low": lo, "high": hi,
                     "why": why, "saved_low": savings(replace(p, **{name: lo})),
                     "saved_high": savings(replace(p, **{name: hi}))})
    counts = p.source_counts()
    for name, key in COUNTS.items():
        lo, hi = rate_interval(counts[key])
        rows.append({"input": name, "kind": "published", "default": 1.0, "low": lo, "high": hi,
                     "why": f"{counts[key]:.0f} events: Jeffreys 95 % interval of the rate (x)",
                     "saved_low": savings(_scaled(p, name, lo)), "saved_high": savings(_scaled(p, name, hi))})
    for r in rows:
        r["swing"] = abs(r["saved_high"] - r["saved_low"])
    rows.sort(key=lambda r: r["swing"], reverse=True)
    return {"base": base, "rows": rows}


def label(r: Dict[str, Any]) -> str:
    from .sweep import flag_name

    return f"{r['input'].replace('_', '-')} (x)" if r["kind"] == "published" else flag_name(r["input"])


def value(r: Dict[str, Any], end: str) -> str:
    v = r[end]
    return v if isinstance(v, str) else f"{v:.2f}" if r["kind"] == "published" else f"{v:g}"


def tornado_text(d: Dict[str, Any]) -> str:
    L = [f"escape's savings per run at the defaults: {d['base']:,.0f} yuan (closed form); each input from low to high:",
         f"{'input':26}{'low':>16}{'high':>16}{'saved at low':>16}{'saved at high':>16}"]
    for r in d["rows"]:
        L.append(f"{label(r):26}{value(r, 'low'):>16}{value(r, 'high'):>16}{r['saved_low']:>16,.0f}"
                 f"{r['saved_high']:>16,.0f}")
    return "\n".join(L) + "\n"


__all__ = ["RANGES", "COUNTS", "tornado", "tornado_text", "label", "value"]
