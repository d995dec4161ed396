"""The no-path wait (``LINKESCAPE_NO_PATH_TIMEOUT``) against a restart: ``linkescape cost --break-even``.

When some pair of hosts has no path (a host cut off from every rail), the job either waits for the
repair or gives up and restarts from its checkpoint. Waiting through a repair of ``r`` hours costs
``r`` of the whole job; restarting costs ``C``, the work since the last checkpoint and the restart
(``hours_per_interruption`` under restart). So waiting pays for a repair shorter than ``C`` and
loses for a longer one: ``C`` is the break-even repair time. For an exponential repair time of mean
``m`` (a flap, a reboot) the same holds at every moment of the wait (it has no memory): waiting
pays while ``m < C``. A fixed hardware repair of hours never pays for itself.

The right wait therefore depends on the mix of repair times (:meth:`SimParams.repair_mix`): long
enough to outlast most of what ends by itself, short of what needs a hand. The sweep gives the
savings (closed form) at each candidate wait; the default of ``LINKESCAPE_NO_PATH_TIMEOUT`` is the
candidate that saves most at the model's defaults (a test holds config.py to it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Dict, List, Sequence

from .baselines import modes
from .cost import WAITS, best_wait, closed_form, mode_ettr
from .model import CAUSES, SimParams


def restart_cost_hours(p: SimParams) -> float:
    """What one interruption costs under restart: the work since the last checkpoint and the restart."""
    r = mode_ettr(p, modes(p)["restart"])
    return r["lost_per_interruption"] + r["restart"]


def repair_rows(p: SimParams) -> List[Dict[str, Any]]:
    """Each kind of repair the model knows, with what waiting it out costs against a restart."""
    c = restart_cost_hours(p)
    rows = [{"kind": "flap", "repair_s": p.flap_s, "share": p.flap_share, "exponential": True},
            {"kind": "reboot", "repair_s": p.reboot_s, "share": p.reboot_share, "exponential": True}]
    hw = 1.0 - p.flap_share - p.reboot_share
    for cause in CAUSES:
        rows.append({"kind": f"{cause} swap", "repair_s": p.repair_hours(cause) * 3600.0, "share": hw,
                     "exponential": False})
    for r in rows:
        r["restart_s"] = c * 3600.0
        r["verdict"] = "wait" if r["repair_s"] < r["restart_s"] else "restart"
        r["saved_by_waiting_s"] = r["restart_s"] - r["repair_s"]
    return rows


def wait_sweep(p: SimParams, waits: Sequence[float] = WAITS) -> List[Dict[str, Any]]:
    """The closed form at each wait: escape's savings against restart, its waits and interruptions."""
    out = []
    for w in waits:
        cf = closed_form(replace(p, no_path_s=float(w)))
        e = cf["escape"]
        out.append({"wait_s": float(w), "yuan_saved": cf["saved"]["escape"]["yuan_saved"], "ettr": e["ettr"],
                    "wait_hours": e["wait_hours"], "interruptions": e["interruptions"]})
    return out


def optimum(p: SimParams, top: float = 3600.0, step: float = 5.0) -> Dict[str, float]:
    """The wait that saves most on a fine grid (the savings are flat near it)."""
    n = int(top / step)
    rows = wait_sweep(p, [i * step for i in range(n + 1)])
    best = max(rows, key=lambda r: r["yuan_saved"])
    near = [r["wait_s"] for r in rows if r["yuan_saved"] >= best["yuan_saved"] - 0.01 * abs(best["yuan_saved"])]
    return {"wait_s": best["wait_s"], "yuan_saved": best["yuan_saved"], "within_1pct_lo": min(near),
            "within_1pct_hi": max(near)}


def still_out(p: SimParams, wait_s: float, cause: str = "switch") -> Dict[str, float]:
    """Of the outages still going after ``wait_s``: the share that are hardware swaps, and the chance
    per second that one ends (the mix's hazard; waiting pays while it is above 1 / restart cost)."""
    left, ending = 0.0, 0.0
    swaps = 0.0
    for share, hours, expo in p.repair_mix(cause):
        s = hours * 3600.0
        if expo:
            alive = share * math.exp(-wait_s / s) if s > 0 else 0.0
            left += alive
            ending += alive / s if s > 0 else 0.0
        elif s > wait_s:
            left += share
            swaps += share
    return {"swap_share": swaps / left if left else 0.0, "hazard_per_s": ending / left if left else 0.0}


def break_even(p: SimParams, waits: Sequence[float] = WAITS) -> Dict[str, Any]:
    sweep = wait_sweep(p, waits)
    best = max(sweep, key=lambda r: r["yuan_saved"])
    return {"restart_cost_s": restart_cost_hours(p) * 3600.0, "repairs": repair_rows(p), "waits": sweep,
            "best_wait_s": best["wait_s"], "best_yuan_saved": best["yuan_saved"], "optimum": optimum(p),
            "current_wait_s": p.no_path_s, "at_best": still_out(p, best["wait_s"]),
            "at_start": still_out(p, 0.0)}


def break_even_text(d: Dict[str, Any]) -> str:
    c = d["restart_cost_s"]
    L = [f"The no-path wait against a restart: a restart costs {c:,.0f} s of the whole job (the work since the "
         "checkpoint and the restart), so waiting pays for a repair shorter than that.", "",
         f"{'repair':14}{'share':>7}{'time':>12}{'wait it out':>13}{'restart':>10}  if the job knew it"]
    for r in d["repairs"]:
        t = r["repair_s"]
        time_s = f"{t:,.0f} s" if t < 3600 else f"{t / 3600:g} h"
        mean = " mean" if r["exponential"] else ""
        L.append(f"{r['kind']:14}{r['share']:>7.0%}{time_s + mean:>12}{t:>12,.0f}s{c:>9,.0f}s  {r['verdict']}")
    L += ["", f"{'wait (s)':>9}{'saved vs restart':>18}{'ETTR':>8}{'h waited':>10}{'interruptions':>15}"]
    for r in d["waits"]:
        mark = "  <- best" if r["wait_s"] == d["best_wait_s"] else ("  <- now" if r["wait_s"] == d["current_wait_s"]
                                                                     else "")
        L.append(f"{r['wait_s']:>9g}{r['yuan_saved']:>18,.0f}{r['ettr']:>8.4f}{r['wait_hours']:>10.2f}"
                 f"{r['interruptions']:>15.1f}{mark}")
    o, a0, ab = d["optimum"], d["at_start"], d["at_best"]
    L += ["", "A job does not know which kind of repair it waits for: waiting pays while an outage still going "
              f"ends at more than one per restart cost ({c:,.0f} s). At the fault it ends at "
              f"{a0['hazard_per_s'] * c:.1f} per {c:,.0f} s ({a0['swap_share']:.0%} of the outages are swaps); after "
              f"{d['best_wait_s']:g} s at {ab['hazard_per_s'] * c:.2f} ({ab['swap_share']:.0%} of those still going "
              "are swaps)."]
    L += ["", f"best of these: {d['best_wait_s']:g} s ({d['best_yuan_saved']:,.0f} yuan per run); on a 5 s grid "
              f"{o['wait_s']:g} s, and every wait from {o['within_1pct_lo']:g} to {o['within_1pct_hi']:g} s saves "
              "within 1 % of it. LINKESCAPE_NO_PATH_TIMEOUT's default is the best of these at the model's defaults."]
    return "\n".join(L) + "\n"


__all__ = ["WAITS", "restart_cost_hours", "repair_rows", "wait_sweep", "best_wait", "optimum", "still_out",
           "break_even",
           "break_even_text"]
