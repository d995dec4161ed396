"""What "flat" means: a run's RSS samples against its control's.

Each rank samples its resident memory (RSS) every ``every`` operations from
the end of the warm-up to the end. Per rank and per run:

* ``slope``: the least-squares slope of RSS over operations, bytes per 1000
  operations; ``rise`` = slope x the measured span: how much the fitted line
  climbs over the run;
* ``band``: the highest sample minus the lowest. A slope alone misses memory
  that piles up and is then let go at once (objects freed only by Python's
  cycle collector make a saw tooth whose fitted slope is near zero), the
  band does not.

The allocator's noise is what the control shows (the same calls, the same
values, on buffers allocated once), plus what fresh buffers may legitimately
cost: the allocator keeps some freed memory at the top of its heap instead of
handing it back (glibc trims beyond twice its mmap threshold, which grows up
to 32 MiB), so the **allowance** is 8 MiB plus twice the bytes one step
allocates afresh (one call; ``depth`` calls when they are in flight
together).

A rank is **flat** when ``rise(fresh) - rise(control) <= allowance`` and
``band(fresh) <= band(control) + allowance``; a case is flat when every rank
is. The report keeps the worst rank's numbers.

The torch cases also have a **reference**: the same calls on the same fresh
tensors through torch's Gloo. A reused buffer shows what the allocator does
when nothing is allocated; fresh torch tensors bring their own noise (glibc
serves each from holes its threshold and the tensors' small objects leave:
2 ranks, 10,000 all_reduces of fresh 4 MiB tensors, RSS after warm-up moved
within 276-293 MiB on linkescape and 278-298 MiB on Gloo). A torch rank that
is not flat by its control is **as gloo** when its rise and band exceed the
reference's by at most ``BASE_ALLOWANCE`` plus one step's fresh bytes; such a
case counts as flat and the table says which it was (``flat_own``: by the
control alone).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

MiB = 1 << 20
#: what an allocator keeps whatever the buffers (bytes)
BASE_ALLOWANCE = 8 * MiB


def allowance(step_bytes: int) -> int:
    return BASE_ALLOWANCE + 2 * int(step_bytes)


def fit(ops: Sequence[int], rss: Sequence[int]) -> Dict[str, float]:
    """Slope (bytes per 1000 operations), rise over the span, band, first and last sample of one rank's series."""
    x = np.asarray(ops, dtype=float)
    y = np.asarray(rss, dtype=float)
    if len(x) < 3 or x[-1] <= x[0]:
        raise ValueError(f"a series needs 3 samples or more over a span, got {len(x)}")
    slope = float(np.polyfit(x, y, 1)[0])  # bytes per operation
    span = float(x[-1] - x[0])
    return {"slope_per_1k": slope * 1000.0, "rise": slope * span, "band": float(y.max() - y.min()),
            "warm": float(y[0]), "end": float(y[-1]), "peak": float(y.max()), "span": span, "samples": len(x)}


def reference_allowance(step_bytes: int) -> int:
    """How far a run may exceed the reference run of the same fresh buffers on Gloo."""
    return BASE_ALLOWANCE + int(step_bytes)


def judge(fresh: Sequence[Dict[str, Any]], control: Sequence[Dict[str, Any]], step_bytes: int,
          reference: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The verdict of a case from each rank's fitted ``fresh`` and ``control`` series (same rank order),
    and the ``reference`` (the same fresh buffers on Gloo) where there is one."""
    allow = allowance(step_bytes)
    ref_allow = reference_allowance(step_bytes)
    ranks: List[Dict[str, Any]] = []
    for r, (f, c) in enumerate(zip(fresh, control)):
        excess_rise = f["rise"] - c["rise"]
        excess_band = f["band"] - c["band"]
        own = excess_rise <= allow and excess_band <= allow
        d = {"rank": r, "fresh": f, "control": c, "excess_rise": excess_rise, "excess_band": excess_band,
             "flat_own": own, "flat": own}
        if reference is not None:
            g = reference[r]
            d["reference"] = g
            d["over_reference_rise"] = f["rise"] - g["rise"]
            d["over_reference_band"] = f["band"] - g["band"]
            d["as_reference"] = d["over_reference_rise"] <= ref_allow and d["over_reference_band"] <= ref_allow
            d["flat"] = own or d["as_reference"]
        ranks.append(d)
    worst = max(ranks, key=lambda d: max(d["excess_rise"], d["excess_band"]))
    return {"flat": all(d["flat"] for d in ranks), "flat_own": all(d["flat_own"] for d in ranks),
            "allowance": allow, "reference_allowance": ref_allow if reference is not None else None,
            "worst_rank": worst["rank"], "ranks": ranks}


def judge_series(fresh: Sequence[Dict[str, Sequence[int]]], control: Sequence[Dict[str, Sequence[int]]],
                 step_bytes: int, reference: Optional[Sequence[Dict[str, Sequence[int]]]] = None) -> Dict[str, Any]:
    """:func:`judge` on raw series (``{"ops": [...], "rss": [...]}`` per rank)."""
    return judge([fit(s["ops"], s["rss"]) for s in fresh], [fit(s["ops"], s["rss"]) for s in control], step_bytes,
                 None if reference is None else [fit(s["ops"], s["rss"]) for s in reference])


def mib(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


__all__ = ["fit", "judge", "judge_series", "allowance", "reference_allowance", "BASE_ALLOWANCE", "MiB", "mib"]
