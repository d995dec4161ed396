"""What "flat" means: a run's RSS samples against its control's.

Each rank samples its resident memory (RSS) every ``every`` operations from
the end of the warm-up to the end. Per rank and per run:

* ``slope``: the least-squares slope of RSS over operations, bytes per 1000
  operations; ``rise`` = slope x the measured span: how much the fitted line
  climbs over the run;
* ``climb``: the most RSS ever rose above an earlier sample (the highest
  sample minus the lowest one before it). A slope alone misses memory that
  piles up and is then let go at once (objects freed only by Python's cycle
  collector make a saw tooth whose fitted slope is near zero); the climb does
  not. Unlike the band (the highest sample minus the lowest, also reported),
  it does not count a fall: a rank whose first sample after the warm-up is
  its highest and that then settles lower has not grown.

The allocator's noise is what the control shows (the same calls, the same
values, on buffers allocated once), plus what fresh buffers may legitimately
cost: the allocator keeps some freed memory at the top of its heap instead of
handing it back (glibc trims beyond twice its mmap threshold, which grows up
to 32 MiB), so the **allowance** is 8 MiB plus twice the bytes one step
allocates afresh (one call; ``depth`` calls when they are in flight
together).

A rank is **flat** when ``rise(fresh) - rise(control) <= allowance`` and
``climb(fresh) <= climb(control) + allowance``; a case is flat when every rank
is. The report keeps the worst rank's numbers.

The torch cases also have a **reference**: the same calls on the same fresh
tensors through torch's Gloo (loopback, no cuts). A reused buffer shows what
the allocator does when nothing is allocated; fresh torch tensors bring noise
of their own, under either library (glibc serves each from holes that its
moving mmap threshold and the tensors' small objects leave): in the torch rows
of 2026-12-03, Gloo's fresh runs had bands of 0-96 MiB and rises of up to
88 MiB over 2,500 calls. A torch case that is not flat by its control is
**as gloo** when its worst rank's rise and climb exceed the reference's worst
rank's by at most the same allowance; such a case counts as flat, and the
table says which it was (``flat_own``: by the control alone).
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
    """Slope (bytes per 1000 operations), rise over the span, climb, band, first and last sample of one rank's
    series."""
    x = np.asarray(ops, dtype=float)
    y = np.asarray(rss, dtype=float)
    if len(x) < 3 or x[-1] <= x[0]:
        raise ValueError(f"a series needs 3 samples or more over a span, got {len(x)}")
    slope = float(np.polyfit(x, y, 1)[0])  # bytes per operation
    span = float(x[-1] - x[0])
    climb = float(np.max(y - np.minimum.accumulate(y)))
    return {"slope_per_1k": slope * 1000.0, "rise": slope * span, "climb": climb, "band": float(y.max() - y.min()),
            "warm": float(y[0]), "end": float(y[-1]), "peak": float(y.max()), "span": span, "samples": len(x)}


def judge(fresh: Sequence[Dict[str, Any]], control: Sequence[Dict[str, Any]], step_bytes: int,
          reference: Optional[Sequence[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The verdict of a case from each rank's fitted ``fresh`` and ``control`` series (same rank order),
    and the ``reference`` (the same fresh buffers on Gloo) where there is one."""
    allow = allowance(step_bytes)
    ranks: List[Dict[str, Any]] = []
    for r, (f, c) in enumerate(zip(fresh, control)):
        excess_rise = f["rise"] - c["rise"]
        excess_climb = f["climb"] - c["climb"]
        own = excess_rise <= allow and excess_climb <= allow
        d = {"rank": r, "fresh": f, "control": c, "excess_rise": excess_rise, "excess_climb": excess_climb,
             "excess_band": f["band"] - c["band"], "flat_own": own}
        if reference is not None:
            d["reference"] = reference[r]
        ranks.append(d)
    worst = max(ranks, key=lambda d: max(d["excess_rise"], d["excess_climb"]))
    flat_own = all(d["flat_own"] for d in ranks)
    out = {"flat": flat_own, "flat_own": flat_own, "allowance": allow, "worst_rank": worst["rank"], "ranks": ranks}
    if reference is not None:
        # allocator noise is random per rank and run: the worst rank of each, side by side
        rise = max(f["rise"] for f in fresh) - max(g["rise"] for g in reference)
        climb = max(f["climb"] for f in fresh) - max(g["climb"] for g in reference)
        out.update(over_reference_rise=rise, over_reference_climb=climb,
                   as_reference=rise <= allow and climb <= allow)
        out["flat"] = flat_own or out["as_reference"]
    return out


def judge_series(fresh: Sequence[Dict[str, Sequence[int]]], control: Sequence[Dict[str, Sequence[int]]],
                 step_bytes: int, reference: Optional[Sequence[Dict[str, Sequence[int]]]] = None) -> Dict[str, Any]:
    """:func:`judge` on raw series (``{"ops": [...], "rss": [...]}`` per rank)."""
    return judge([fit(s["ops"], s["rss"]) for s in fresh], [fit(s["ops"], s["rss"]) for s in control], step_bytes,
                 None if reference is None else [fit(s["ops"], s["rss"]) for s in reference])


def mib(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / MiB:.1f}"


__all__ = ["fit", "judge", "judge_series", "allowance", "BASE_ALLOWANCE", "MiB", "mib"]
