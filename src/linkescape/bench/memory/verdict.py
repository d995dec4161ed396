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


def judge(fresh: Sequence[Dict[str, Any]], control: Sequence[Dict[str, Any]], step_bytes: int) -> Dict[str, Any]:
    """The verdict of a case from each rank's fitted ``fresh`` and ``control`` series (same rank order)."""
    allow = allowance(step_bytes)
    ranks: List[Dict[str, Any]] = []
    for r, (f, c) in enumerate(zip(fresh, control)):
        excess_rise = f["rise"] - c["rise"]
        excess_band = f["band"] - c["band"]
        ranks.append({"rank": r, "fresh": f, "control": c, "excess_rise": excess_rise, "excess_band": excess_band,
                      "flat": excess_rise <= allow and excess_band <= allow})
    worst = max(ranks, key=lambda d: max(d["excess_rise"], d["excess_band"]))
    return {"flat": all(d["flat"] for d in ranks), "allowance": allow, "worst_rank": worst["rank"], "ranks": ranks}


def judge_series(fresh: Sequence[Dict[str, Sequence[int]]], control: Sequence[Dict[str, Sequence[int]]],
                 step_bytes: int) -> Dict[str, Any]:
    """:func:`judge` on raw series (``{"ops": [...], "rss": [...]}`` per rank)."""
    return judge([fit(s["ops"], s["rss"]) for s in fresh], [fit(s["ops"], s["rss"]) for s in control], step_bytes)


def mib(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


__all__ = ["fit", "judge", "judge_series", "allowance", "BASE_ALLOWANCE", "MiB", "mib"]
